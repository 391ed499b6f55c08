package objecthost

import (
	"github.com/shoaldb/shoal/pipeline"
	"github.com/shoaldb/shoal/pipeline/shape"
)

// PipelineSinks feeds the background plane from the query path: usage into
// the host's UsageAggregator (one event per account, database and query
// shape per window on the `usage` topic) and sizes into its SizeAggregator
// (the latest size per database, highest sequence wins, on `storage`).
// Both aggregators only take a lock of their shard and never wait for the
// broker (pipeline.Producer spills to disk when it is slow or down), so
// the query path never waits on Kafka.
type PipelineSinks struct {
	Usage *pipeline.UsageAggregator
	Sizes *pipeline.SizeAggregator
}

var (
	_ UsageSink = PipelineSinks{}
	_ SizeSink  = PipelineSinks{}
)

// RecordUsage shapes the request's first statement and records its usage.
func (p PipelineSinks) RecordUsage(e UsageEvent) {
	s, h := shape.Of(e.SQL)
	p.Usage.Record(e.AccountID, e.DatabaseUUID, h, s, e.RowsRead, e.RowsWritten, e.Duration, e.Error)
}

// ResendSizes has the aggregator publish every database's latest size at
// its next window, changed or not (sizeResender).
func (p PipelineSinks) ResendSizes() { p.Sizes.ResendAll() }

// RecordSize records the measured size with its sequence; a swept database
// (size 0) is forgotten once its final size is on its way.
func (p PipelineSinks) RecordSize(e SizeEvent) {
	p.Sizes.Record(e.AccountID, e.DatabaseUUID, e.SizeBytes, e.Seq)
	if e.SizeBytes == 0 {
		p.Sizes.Forget(e.DatabaseUUID)
	}
}
