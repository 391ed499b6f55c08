package pipeline

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/shoaldb/shoal/pipeline/event"
)

type usageTotals struct {
	queries, errors, rowsRead, rowsWritten, durUs int64
}

func decodeUsage(t *testing.T, recs []pubRec) []event.Usage {
	t.Helper()
	out := make([]event.Usage, 0, len(recs))
	for _, r := range recs {
		require.Equal(t, event.TopicUsage, r.topic)
		var u event.Usage
		require.NoError(t, event.Decode(r.value, &u))
		require.Equal(t, u.AccountID, r.key, "usage is keyed by account")
		out = append(out, u)
	}
	return out
}

// One window: one event per (account, database, shape) with the exact sums,
// max duration, the window's bounds and a fresh event ID each.
func TestUsageAggregatorOneWindow(t *testing.T) {
	clk := newFakeClock()
	pub := &recPub{}
	a := NewUsageAggregator(pub, NewSequencer("h@1"), UsageConfig{Host: "h", Clock: clk})
	defer a.Close()
	t0 := clk.Now()
	a.Record("acc1", "db1", 7, "SELECT * FROM t WHERE id = ?", 1, 0, 2*time.Millisecond, false)
	a.Record("acc1", "db1", 7, "SELECT * FROM t WHERE id = ?", 3, 0, 5*time.Millisecond, true)
	a.Record("acc1", "db1", 8, "INSERT INTO t VALUES (?)", 0, 2, time.Millisecond, false)
	a.Record("acc2", "db2", 7, "SELECT * FROM t WHERE id = ?", 10, 0, 1500*time.Microsecond, false)
	clk.Advance(time.Second) // the window loop flushes on this tick
	var recs []pubRec
	require.Eventually(t, func() bool { recs = append(recs, pub.take()...); return len(recs) == 3 },
		5*time.Second, time.Millisecond)
	got := decodeUsage(t, recs)
	byKey := map[[3]any]event.Usage{}
	ids := map[event.ID]bool{}
	for _, u := range got {
		byKey[[3]any{u.AccountID, u.DatabaseUUID, u.ShapeHash}] = u
		ids[u.EventID] = true
		assert.Equal(t, event.Version, u.V)
		assert.Equal(t, "h", u.Host)
		assert.Equal(t, t0.UnixMilli(), u.WindowStart)
		assert.Equal(t, t0.Add(time.Second).UnixMilli(), u.WindowEnd)
		assert.Equal(t, "h@1", u.EventID.Producer)
	}
	assert.Len(t, ids, 3, "fresh event IDs")
	sel := byKey[[3]any{"acc1", "db1", uint64(7)}]
	assert.Equal(t, event.Usage{V: 1, EventID: sel.EventID, Host: "h", AccountID: "acc1", DatabaseUUID: "db1",
		Shape: "SELECT * FROM t WHERE id = ?", ShapeHash: 7, WindowStart: sel.WindowStart, WindowEnd: sel.WindowEnd,
		Queries: 2, Errors: 1, RowsRead: 4, RowsWritten: 0, DurationUs: 7000, MaxDuration: 5000}, sel)
	ins := byKey[[3]any{"acc1", "db1", uint64(8)}]
	assert.EqualValues(t, 2, ins.RowsWritten)
	assert.EqualValues(t, 1, ins.Queries)
	assert.EqualValues(t, 1500, byKey[[3]any{"acc2", "db2", uint64(7)}].DurationUs)
}

// Many goroutines record while windows close underneath them: the sums
// over all windows are exact (nothing lost at a window's cut, nothing
// counted twice), windows are contiguous, and Close flushes the last one.
func TestUsageAggregatorExactAcrossWindows(t *testing.T) {
	clk := newFakeClock()
	pub := &recPub{}
	reg := prometheus.NewRegistry()
	a := NewUsageAggregator(pub, NewSequencer("h@1"), UsageConfig{Host: "h", Clock: clk, Shards: 4, Registerer: reg})
	const workers, perWorker = 8, 20_000
	var wg sync.WaitGroup
	want := map[string]*usageTotals{}
	var wantMu sync.Mutex
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			local := map[string]*usageTotals{}
			for i := range perWorker {
				acct := keyOf((w + i) % 5)
				db := acct + "-db" + keyOf(i%3)
				shape := uint64(i % 4)
				isErr := i%17 == 0
				d := time.Duration(i%100) * time.Microsecond
				a.Record(acct, db, shape, "q", int64(i%7), int64(i%3), d, isErr)
				tot := local[acct]
				if tot == nil {
					tot = &usageTotals{}
					local[acct] = tot
				}
				tot.queries++
				if isErr {
					tot.errors++
				}
				tot.rowsRead += int64(i % 7)
				tot.rowsWritten += int64(i % 3)
				tot.durUs += int64(i % 100)
			}
			wantMu.Lock()
			defer wantMu.Unlock()
			for k, v := range local {
				if want[k] == nil {
					want[k] = &usageTotals{}
				}
				want[k].queries += v.queries
				want[k].errors += v.errors
				want[k].rowsRead += v.rowsRead
				want[k].rowsWritten += v.rowsWritten
				want[k].durUs += v.durUs
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	windows := 0
	for running := true; running; {
		select {
		case <-done:
			running = false
		default:
			clk.Advance(time.Second)
			windows++
		}
	}
	a.Close()
	a.Record("late", "db", 1, "q", 1, 1, 0, false) // after Close: discarded
	all := decodeUsage(t, pub.take())
	got := map[string]*usageTotals{}
	ends := map[int64]int64{} // window start → end
	ids := map[event.ID]bool{}
	for _, u := range all {
		require.False(t, ids[u.EventID], "event ID %v reused", u.EventID)
		ids[u.EventID] = true
		tot := got[u.AccountID]
		if tot == nil {
			tot = &usageTotals{}
			got[u.AccountID] = tot
		}
		tot.queries += u.Queries
		tot.errors += u.Errors
		tot.rowsRead += u.RowsRead
		tot.rowsWritten += u.RowsWritten
		tot.durUs += u.DurationUs
		if e, ok := ends[u.WindowStart]; ok {
			require.Equal(t, e, u.WindowEnd, "one end per window")
		}
		ends[u.WindowStart] = u.WindowEnd
		require.LessOrEqual(t, u.WindowStart, u.WindowEnd)
	}
	assert.Equal(t, want, got)
	assert.NotContains(t, got, "late")
	t.Logf("%d windows closed while recording, %d events for %d records", windows, len(all), workers*perWorker)
	assert.Equal(t, uint64(len(all)), a.events.Load())
	assert.EqualValues(t, 1, a.late.Load())
	mfs, err := reg.Gather()
	require.NoError(t, err)
	assert.Empty(t, mfs, "Close unregisters the metrics")
}

func decodeSizes(t *testing.T, recs []pubRec) map[string]event.Size {
	t.Helper()
	out := map[string]event.Size{}
	for _, r := range recs {
		require.Equal(t, event.TopicStorage, r.topic)
		var s event.Size
		require.NoError(t, event.Decode(r.value, &s))
		require.Equal(t, s.DatabaseUUID, r.key, "sizes are keyed by database")
		_, dup := out[s.DatabaseUUID]
		require.False(t, dup, "one event per database per window")
		out[s.DatabaseUUID] = s
	}
	return out
}

// Per window: the latest (highest seq) size of each database that changed,
// once; unchanged ones are not sent again until the resend interval.
func TestSizeAggregatorLatestChangedOnly(t *testing.T) {
	clk := newFakeClock()
	pub := &recPub{}
	a := NewSizeAggregator(pub, NewSequencer("h@1"), SizeConfig{Host: "h", Clock: clk, ResendInterval: time.Minute})
	a.Record("acc", "db1", 100, 1)
	a.Record("acc", "db1", 300, 3)
	a.Record("acc", "db1", 200, 2) // out of order: ignored
	a.Record("acc", "db2", 50, 1)
	a.Flush()
	got := decodeSizes(t, pub.take())
	require.Len(t, got, 2)
	assert.EqualValues(t, 300, got["db1"].SizeBytes)
	assert.EqualValues(t, 3, got["db1"].Seq)
	assert.EqualValues(t, 50, got["db2"].SizeBytes)
	assert.Equal(t, "acc", got["db1"].AccountID)
	assert.Equal(t, clk.Now().UnixMilli(), got["db1"].Time)
	assert.NotEqual(t, got["db1"].EventID, got["db2"].EventID)

	// Nothing changed: nothing sent. A new seq with the same size is not a
	// change; a new size is.
	a.Flush()
	assert.Empty(t, pub.take())
	a.Record("acc", "db1", 300, 4)
	a.Record("acc", "db2", 60, 2)
	a.Flush()
	got = decodeSizes(t, pub.take())
	require.Len(t, got, 1)
	assert.EqualValues(t, 60, got["db2"].SizeBytes)

	// The window loop does the same on each tick.
	a.Record("acc", "db1", 10, 5)
	clk.Advance(time.Second)
	clk.Advance(time.Second)
	got = decodeSizes(t, pub.take())
	require.Len(t, got, 1)
	assert.EqualValues(t, 10, got["db1"].SizeBytes)

	// A refused event is retried the next window.
	pub.fail = func(string, []byte) bool { return true }
	a.Record("acc", "db2", 70, 3)
	a.Flush()
	pub.fail = nil
	a.Flush()
	got = decodeSizes(t, pub.take())
	require.Len(t, got, 1)
	assert.EqualValues(t, 70, got["db2"].SizeBytes)
	assert.EqualValues(t, 1, a.dropped.Load())

	// Resend: after the interval every known database is sent again.
	clk.Advance(time.Minute)
	clk.Advance(time.Second)
	got = decodeSizes(t, pub.take())
	assert.Len(t, got, 2)

	// Forget: a pending change is still sent, then the database is gone.
	a.Record("acc", "db3", 5, 1)
	a.Forget("db3")
	a.Forget("db1")
	a.Flush()
	got = decodeSizes(t, pub.take())
	assert.Len(t, got, 1)
	assert.EqualValues(t, 5, got["db3"].SizeBytes)
	clk.Advance(time.Minute)
	clk.Advance(time.Second)
	got = decodeSizes(t, pub.take())
	assert.Equal(t, []string{"db2"}, keys(got))

	// Close flushes the last change; later records are discarded.
	a.Record("acc", "db2", 80, 9)
	a.Close()
	a.Record("acc", "db2", 90, 10)
	got = decodeSizes(t, pub.take())
	assert.EqualValues(t, 80, got["db2"].SizeBytes)
	assert.EqualValues(t, 1, a.late.Load())
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// Concurrent sizes with shuffled seqs: each window carries the highest seq
// recorded so far, and the last window the highest of all.
func TestSizeAggregatorConcurrentNeverBackwards(t *testing.T) {
	clk := newFakeClock()
	pub := &recPub{}
	a := NewSizeAggregator(pub, NewSequencer("h@1"), SizeConfig{Clock: clk, ResendInterval: -1})
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 5000 {
				seq := int64(i*8 + w)
				a.Record("acc", keyOf(i%10), seq*10, seq)
			}
		}()
	}
	stop := make(chan struct{})
	flushed := make(chan struct{})
	go func() {
		defer close(flushed)
		for {
			select {
			case <-stop:
				return
			default:
				clk.Advance(time.Second)
			}
		}
	}()
	wg.Wait()
	close(stop)
	<-flushed
	a.Close()
	last := map[string]int64{}
	for _, r := range pub.take() {
		var s event.Size
		require.NoError(t, event.Decode(r.value, &s))
		require.Greater(t, s.Seq, last[s.DatabaseUUID], "a size never goes back to an older seq")
		require.Equal(t, s.Seq*10, s.SizeBytes)
		last[s.DatabaseUUID] = s.Seq
	}
	require.Len(t, last, 10)
	for db, seq := range last {
		// The highest seq recorded for database i%10 == d.
		assert.GreaterOrEqual(t, seq, int64((4990)*8), db)
	}
}

// End to end through a real broker: aggregator → Producer → kfake over TCP
// → consumer. The consumed usage sums equal what was recorded.
func TestUsageThroughKafkaExact(t *testing.T) {
	b := startBroker(t, "", "")
	ensureTopics(t, b.Addr())
	p := newProducer(t, Config{Brokers: []string{b.Addr()}, SpillDir: t.TempDir()})
	clk := newFakeClock()
	a := NewUsageAggregator(p, NewSequencer("h@1"), UsageConfig{Host: "h", Clock: clk})
	var want int64
	for w := range 20 {
		for i := range 1000 {
			a.Record(keyOf(i%7), keyOf(i%13), uint64(i%3), "q", int64(i), 1, time.Microsecond, false)
			want += int64(i)
		}
		_ = w
		clk.Advance(time.Second)
	}
	a.Close()
	flush(t, p)
	n := p.Stats().Produced
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.Addr()), kgo.ConsumeTopics(event.TopicUsage),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	require.NoError(t, err)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var got, queries int64
	seen := map[event.ID]bool{}
	for uint64(len(seen)) < n {
		fs := cl.PollFetches(ctx)
		require.NoError(t, ctx.Err())
		fs.EachRecord(func(r *kgo.Record) {
			var u event.Usage
			require.NoError(t, event.Decode(r.Value, &u))
			if seen[u.EventID] {
				return
			}
			seen[u.EventID] = true
			got += u.RowsRead
			queries += u.Queries
		})
	}
	assert.Equal(t, want, got)
	assert.EqualValues(t, 20_000, queries)
	t.Logf("20,000 records → %d usage events", n)
}

// ResendAll: the next window publishes every database's latest size,
// unchanged ones included, once; the windows after it only changes again.
func TestSizeAggregatorResendAll(t *testing.T) {
	clk := newFakeClock()
	pub := &recPub{}
	a := NewSizeAggregator(pub, NewSequencer("h@1"), SizeConfig{Host: "h", Clock: clk, ResendInterval: time.Hour})
	a.Record("acc", "db1", 100, 1)
	a.Record("acc", "db2", 50, 1)
	a.Flush()
	require.Len(t, decodeSizes(t, pub.take()), 2)
	a.Flush()
	require.Empty(t, pub.take(), "unchanged: not sent again")

	a.ResendAll()
	a.Flush()
	got := decodeSizes(t, pub.take())
	require.Len(t, got, 2, "every database's latest size, unchanged ones included")
	assert.EqualValues(t, 100, got["db1"].SizeBytes)
	assert.EqualValues(t, 50, got["db2"].SizeBytes)
	a.Flush()
	assert.Empty(t, pub.take(), "once")
}
