package pipeline

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/shoaldb/shoal/pipeline/event"
)

// BenchmarkProducerThroughput publishes b.N 200-byte records to a real
// broker over loopback TCP and waits for every acknowledgement: records/s
// end to end through the producer (go test -bench ProducerThroughput).
// The loop paces itself below MaxBufferedBytes — a caller faster than the
// broker would spill, which BenchmarkPublishSpilling measures — so this is
// the direct path's throughput.
func BenchmarkProducerThroughput(b *testing.B) {
	br := startBrokerB(b)
	ensureTopicsB(b, br)
	p, err := New(Config{Brokers: []string{br}, SpillDir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close(context.Background())
	value := make([]byte, 200)
	keys := make([][]byte, 1000)
	for i := range keys {
		keys[i] = []byte("acct-" + strconv.Itoa(i))
	}
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for i := range b.N {
		if i%1024 == 0 {
			for p.directBytes.Load() > p.cfg.MaxBufferedBytes/2 {
				time.Sleep(100 * time.Microsecond) // backpressure: the benchmark waits for the buffer to drain
			}
		}
		p.Publish(event.TopicUsage, keys[i%len(keys)], value)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := p.Flush(ctx); err != nil {
		b.Fatal(err, p.Stats())
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "records/s")
	if st := p.Stats(); st.Dropped > 0 || st.SpilledRecords > 0 {
		b.Fatalf("dropped %d, spilled %d", st.Dropped, st.SpilledRecords)
	}
}

// BenchmarkPublishSpilling is the cost of Publish while the broker is down
// and records go to the spill (the query path's worst case).
func BenchmarkPublishSpilling(b *testing.B) {
	p, err := New(Config{Brokers: []string{"127.0.0.1:1"}, SpillDir: b.TempDir(), MaxBufferedBytes: 1})
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		p.Close(ctx)
	}()
	value := make([]byte, 200)
	key := []byte("acct-1")
	p.Publish(event.TopicUsage, key, value) // the one record in the client
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		p.Publish(event.TopicUsage, key, value)
	}
	b.StopTimer()
	st := p.Stats()
	b.ReportMetric(float64(st.DroppedBy[dropSpillSlow]+st.DroppedBy[dropSpillFull])/float64(b.N), "dropped/op")
	b.ReportMetric(float64(st.SpilledRecords)/float64(b.N), "spilled/op")
}

// BenchmarkUsageRecordParallel is the query-path cost of pre-aggregation.
func BenchmarkUsageRecordParallel(b *testing.B) {
	a := NewUsageAggregator(&recPub{}, NewSequencer("h@1"), UsageConfig{})
	defer a.Close()
	dbs := make([]string, 1024)
	for i := range dbs {
		dbs[i] = "00000000-0000-7000-8000-" + strconv.Itoa(100000000000+i)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			a.Record("acct", dbs[i%len(dbs)], uint64(i%8), "SELECT 1", 1, 0, time.Microsecond, false)
			i++
		}
	})
}
