package storage

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// Stats is a snapshot of a Consumer's counters (the same numbers its
// Prometheus metrics export). Every consumed record ends in exactly one of
// Invalid, Superseded, Applied, Stale or Skipped once its batch is written.
type Stats struct {
	Consumed      uint64 // records polled from the topic
	Invalid       uint64 // records that are not valid sizes, skipped (and committed past)
	Superseded    uint64 // sizes dropped within a batch for a newer size of the same database
	Applied       uint64 // sizes the catalog recorded
	Stale         uint64 // sizes the catalog ignored: seq not newer than the stored one (redeliveries, reordering)
	Skipped       uint64 // sizes of databases the catalog does not know or has deleted
	Writes        uint64 // SetDatabaseStats calls acknowledged
	CatalogErrors uint64 // SetDatabaseStats calls that failed (retried with backoff)
	Committed     uint64 // records whose offsets were committed
	CommitErrors  uint64 // offset commits that failed (the records are redelivered)
	// Lag is how many records the owned partitions' high watermarks were
	// ahead of this consumer at their last fetch.
	Lag int64
	// AppliedAge is the age of the oldest size of the last acknowledged
	// write, measured when it was acknowledged (measurement time to catalog).
	AppliedAge time.Duration
}

type counters struct {
	consumed, invalid, superseded         atomic.Uint64
	applied, stale, skipped               atomic.Uint64
	writes, catalogErrors                 atomic.Uint64
	committed, commitErrors               atomic.Uint64
	appliedAgeNs                          atomic.Int64
	batchSize, writeSeconds, attemptCount prometheus.Histogram

	lagMu sync.Mutex
	lag   map[int32]int64 // partition → records behind its high watermark
}

func newCounters() *counters {
	return &counters{
		lag: map[int32]int64{},
		batchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "shoal_storage_consumer_batch_databases",
			Help:    "Sizes per SetDatabaseStats write (after keeping the newest per database).",
			Buckets: prometheus.ExponentialBuckets(1, 4, 8), // 1 … 16384
		}),
		writeSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "shoal_storage_consumer_write_duration_seconds",
			Help:    "Latency of acknowledged SetDatabaseStats writes (one attempt).",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14),
		}),
		attemptCount: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "shoal_storage_consumer_write_attempts",
			Help:    "Attempts per batch until the catalog acknowledged it (1: no retry).",
			Buckets: []float64{1, 2, 4, 8, 16, 64, 256},
		}),
	}
}

func (c *counters) result(r fsm.StatsResult) {
	c.applied.Add(uint64(r.Applied))
	c.stale.Add(uint64(r.Stale))
	c.skipped.Add(uint64(r.Skipped))
	c.writes.Add(1)
}

func (c *counters) setLag(partition int32, lag int64) {
	c.lagMu.Lock()
	c.lag[partition] = max(lag, 0)
	c.lagMu.Unlock()
}

func (c *counters) dropLag(partitions []int32) {
	c.lagMu.Lock()
	for _, p := range partitions {
		delete(c.lag, p)
	}
	c.lagMu.Unlock()
}

func (c *counters) totalLag() int64 {
	c.lagMu.Lock()
	defer c.lagMu.Unlock()
	var n int64
	for _, l := range c.lag {
		n += l
	}
	return n
}

func (c *counters) stats() Stats {
	return Stats{
		Consumed: c.consumed.Load(), Invalid: c.invalid.Load(), Superseded: c.superseded.Load(),
		Applied: c.applied.Load(), Stale: c.stale.Load(), Skipped: c.skipped.Load(),
		Writes: c.writes.Load(), CatalogErrors: c.catalogErrors.Load(),
		Committed: c.committed.Load(), CommitErrors: c.commitErrors.Load(),
		Lag: c.totalLag(), AppliedAge: time.Duration(c.appliedAgeNs.Load()),
	}
}

// collectors builds the consumer's metrics; the counters read the same
// atomics as Stats, so the two never disagree.
func (c *counters) collectors() []prometheus.Collector {
	counter := func(name, help string, f func() uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help},
			func() float64 { return float64(f()) })
	}
	return []prometheus.Collector{
		counter("shoal_storage_consumer_consumed_total", "Size records polled from the storage topic.", c.consumed.Load),
		counter("shoal_storage_consumer_invalid_total", "Records skipped as not valid sizes (undecodable, newer schema, out of range).", c.invalid.Load),
		counter("shoal_storage_consumer_superseded_total", "Sizes dropped within a batch for a newer size of the same database.", c.superseded.Load),
		counter("shoal_storage_consumer_applied_total", "Sizes the catalog recorded.", c.applied.Load),
		counter("shoal_storage_consumer_stale_total", "Sizes the catalog ignored because their seq was not newer (duplicates, reordering, redelivery).", c.stale.Load),
		counter("shoal_storage_consumer_skipped_total", "Sizes of databases the catalog does not know or has deleted.", c.skipped.Load),
		counter("shoal_storage_consumer_writes_total", "SetDatabaseStats writes acknowledged by the catalog.", c.writes.Load),
		counter("shoal_storage_consumer_catalog_errors_total", "SetDatabaseStats writes that failed and were retried.", c.catalogErrors.Load),
		counter("shoal_storage_consumer_committed_total", "Records whose offsets were committed after their write was acknowledged.", c.committed.Load),
		counter("shoal_storage_consumer_commit_errors_total", "Offset commits that failed (the records are redelivered; harmless but duplicate work).", c.commitErrors.Load),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "shoal_storage_consumer_lag_records",
			Help: "Records the owned partitions' high watermarks were ahead of this consumer at their last fetch."},
			func() float64 { return float64(c.totalLag()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "shoal_storage_consumer_applied_age_seconds",
			Help: "Age of the oldest size in the last acknowledged write (measurement to catalog)."},
			func() float64 { return time.Duration(c.appliedAgeNs.Load()).Seconds() }),
		c.batchSize, c.writeSeconds, c.attemptCount,
	}
}
