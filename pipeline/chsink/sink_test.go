package chsink

import (
	"context"
	"math"
	"math/rand/v2"
	"sort"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/shoaldb/shoal/pipeline/chlocal"
	"github.com/shoaldb/shoal/pipeline/event"
)

func TestSinkExactTotals(t *testing.T) {
	ch := requireCH(t)
	st := openStore(t, ch)
	br := startBroker(t, 0, "")
	defer br.Close()
	addr := br.ListenAddrs()[0]

	rng := rand.New(rand.NewPCG(1, 1))
	evs := genEvents(rng, 20_000, "hostA/1", 1, 40)
	tr := truthOf(evs)
	reg := prometheus.NewRegistry()
	s := startSink(t, addr, st, "g-exact", func(c *Config) { c.Registerer = reg })
	produce(t, addr, evs)
	requireExact(t, st, tr, time.Minute, s)

	stt := s.Stats()
	assert.Equal(t, uint64(len(evs)), stt.Consumed)
	assert.Equal(t, uint64(len(evs)), stt.Inserted)
	assert.Zero(t, stt.DuplicatesDropped)
	assert.Greater(t, stt.Batches, uint64(5), "batched by size (MaxBatch 2,000)")
	assert.NotZero(t, stt.LastCommittedMs)

	mfs, err := reg.Gather()
	require.NoError(t, err)
	names := map[string]bool{}
	for _, mf := range mfs {
		names[mf.GetName()] = true
	}
	for _, n := range []string{"shoal_pipeline_chsink_consumed_total", "shoal_pipeline_chsink_inserted_events_total",
		"shoal_pipeline_chsink_duplicates_dropped_total", "shoal_pipeline_chsink_insert_errors_total",
		"shoal_pipeline_chsink_lag_records", "shoal_pipeline_chsink_oldest_pending_age_seconds"} {
		assert.True(t, names[n], "metric %s exported", n)
	}
	require.NoError(t, s.Close())
	mfs, err = reg.Gather()
	require.NoError(t, err)
	assert.Empty(t, mfs, "Close unregisters the metrics")
}

func TestSinkEveryEventTwice(t *testing.T) {
	ch := requireCH(t)
	st := openStore(t, ch)
	br := startBroker(t, 0, "")
	defer br.Close()
	addr := br.ListenAddrs()[0]

	rng := rand.New(rand.NewPCG(2, 2))
	evs := genEvents(rng, 10_000, "hostB/1", 1, 30)
	// Each event twice: once in order, once shuffled and interleaved with
	// a second producer's events, as a spill replay would.
	more := genEvents(rng, 5_000, "hostC/7", 1, 30)
	tr := truthOf(evs, more)
	again := append(append([]event.Usage(nil), evs...), more...)
	rng.Shuffle(len(again), func(i, j int) { again[i], again[j] = again[j], again[i] })

	stopMerges(t, st)
	s := startSink(t, addr, st, "g-twice", nil)
	produce(t, addr, evs)
	produce(t, addr, again)
	produce(t, addr, more)
	requireExact(t, st, tr, time.Minute, s)
	stt := s.Stats()
	assert.Equal(t, uint64(2*len(evs)+2*len(more)), stt.Consumed)
	assert.Equal(t, stt.Consumed, stt.Inserted+stt.DuplicatesDropped)
	assert.NotZero(t, stt.DuplicatesDropped, "this sink saw the repeats")

	// A new group with a dedupe filter off inserts every copy again
	// (four per event of evs, counting the first group's): FINAL still
	// counts each event once.
	s2 := startSink(t, addr, st, "g-twice-second-group", func(c *Config) { c.DedupeWindow = -1 })
	require.Eventually(t, func() bool { return s2.Stats().Consumed == uint64(2*len(evs)+2*len(more)) }, time.Minute, 10*time.Millisecond)
	requireExact(t, st, tr, time.Minute, s2)
	assert.Equal(t, uint64(2*len(evs)+2*len(more)), s2.Stats().Inserted)
	c, err := st.Counts(context.Background(), "requests")
	require.NoError(t, err)
	assert.Equal(t, uint64(len(evs)+len(more)), c.Distinct)
	assert.Greater(t, c.PendingDuplicates(), uint64(len(evs)), "redelivered rows are stored; the reads above dropped them")
}

func TestSinkStoppedAndKilledMidStream(t *testing.T) {
	ch := requireCH(t)
	st := openStore(t, ch)
	br := startBroker(t, 0, "")
	defer br.Close()
	addr := br.ListenAddrs()[0]
	rng := rand.New(rand.NewPCG(3, 3))
	evs := genEvents(rng, 30_000, "hostD/1", 1, 50)
	tr := truthOf(evs)
	produce(t, addr, evs)

	// Sink 1 dies after its third insert, before committing it: the worst
	// moment, its batch is in ClickHouse and will be delivered again.
	stopMerges(t, st)
	var batches atomic.Int32
	s1 := startSink(t, addr, st, "g-kill", func(c *Config) {
		c.afterInsert = func(int) bool { return batches.Add(1) == 3 }
	})
	select {
	case <-s1.Done():
	case <-time.After(time.Minute):
		t.Fatal("sink 1 never reached its failpoint")
	}
	require.NoError(t, s1.Close())
	in1 := s1.Stats().Inserted

	// Sink 2 (same group) is stopped gracefully mid-stream.
	s2 := startSink(t, addr, st, "g-kill", nil)
	require.Eventually(t, func() bool { return s2.Stats().Batches >= 2 }, time.Minute, 10*time.Millisecond)
	require.NoError(t, s2.Close())
	in2 := s2.Stats().Inserted

	// Sink 3 finishes.
	s3 := startSink(t, addr, st, "g-kill", nil)
	requireExact(t, st, tr, time.Minute, s3)
	in3 := s3.Stats().Inserted
	t.Logf("inserted: sink1 %d (crashed before commit), sink2 %d (closed), sink3 %d; events %d", in1, in2, in3, len(evs))
	assert.Greater(t, in1+in2+in3, uint64(len(evs)), "the crashed batch was inserted twice")
	assert.Less(t, in3, uint64(len(evs)), "sink 3 resumed from the committed offsets, not from the start")
	c, err := st.Counts(context.Background(), "requests")
	require.NoError(t, err)
	assert.Equal(t, in1+in2+in3, c.Rows, "every insert is stored (merges stopped)")
	assert.Equal(t, uint64(len(evs)), c.Distinct)
}

// TestSinkClickHouseDown stops ClickHouse mid-stream (gracefully, then in
// a second run with SIGKILL) for a few seconds while records keep arriving,
// and restarts it on the same data dir: totals exact, nothing lost or
// double-counted.
func TestSinkClickHouseDown(t *testing.T) {
	for _, mode := range []string{"sigterm", "sigkill"} {
		t.Run(mode, func(t *testing.T) { testClickHouseDown(t, mode == "sigkill") })
	}
}

func testClickHouseDown(t *testing.T, kill bool) {
	requireCH(t)
	dir := t.TempDir()
	ctx := context.Background()
	ch, err := chlocal.Start(ctx, chlocal.Config{DataDir: dir})
	require.NoError(t, err)
	defer func() { _ = ch.Close() }()
	st := openStore(t, ch)
	stopMerges(t, st)
	br := startBroker(t, 0, "")
	defer br.Close()
	addr := br.ListenAddrs()[0]

	rng := rand.New(rand.NewPCG(4, 4))
	evs := genEvents(rng, 30_000, "hostE/1", 1, 40)
	tr := truthOf(evs)
	s := startSink(t, addr, st, "g-chdown-"+strconv.FormatBool(kill), func(c *Config) { c.InsertTimeout = 3 * time.Second })

	produce(t, addr, evs[:10_000])
	require.Eventually(t, func() bool { return s.Stats().Inserted >= 10_000 }, time.Minute, 20*time.Millisecond)

	t0 := time.Now()
	if kill {
		require.NoError(t, ch.Kill())
	} else {
		require.NoError(t, ch.Close())
	}
	t.Logf("clickhouse stopped in %s", time.Since(t0))
	produce(t, addr, evs[10_000:20_000])
	require.Eventually(t, func() bool { return s.Stats().InsertErrors >= 2 }, time.Minute, 20*time.Millisecond)
	time.Sleep(3 * time.Second) // down for a few seconds, more records arriving
	produce(t, addr, evs[20_000:25_000])
	before := s.Stats()
	assert.NotZero(t, before.Lag+int64(before.Consumed-before.Inserted), "work waits while ClickHouse is down")
	assert.NotZero(t, before.OldestPendingMs, "the held batch is visible as pending")

	t.Logf("restarting clickhouse %s after stopping it", time.Since(t0))
	ch2, err := chlocal.Start(ctx, chlocal.Config{DataDir: dir, TCPPort: ch.TCPPort(), HTTPPort: ch.HTTPPort()})
	require.NoError(t, err)
	defer func() { _ = ch2.Close() }()
	produce(t, addr, evs[25_000:])
	t1 := time.Now()
	requireExact(t, st, tr, 2*time.Minute, s)
	t.Logf("exact %s after the restart", time.Since(t1))
	t.Logf("insert errors while down: %d", s.Stats().InsertErrors)
}

func TestSinkBrokerRestart(t *testing.T) {
	ch := requireCH(t)
	st := openStore(t, ch)
	bdir := t.TempDir()
	br := startBroker(t, 0, bdir)
	port := brokerPort(t, br)
	addr := br.ListenAddrs()[0]

	rng := rand.New(rand.NewPCG(5, 5))
	evs := genEvents(rng, 20_000, "hostF/1", 1, 40)
	tr := truthOf(evs)
	s := startSink(t, addr, st, "g-brestart", nil)
	produce(t, addr, evs[:10_000])
	require.Eventually(t, func() bool { return s.Stats().Inserted >= 5_000 }, time.Minute, 10*time.Millisecond)
	br.Close()
	time.Sleep(2 * time.Second)
	br = startBroker(t, port, bdir)
	defer br.Close()
	produce(t, addr, evs[10_000:])
	requireExact(t, st, tr, 2*time.Minute, s)
}

func TestSinkSkipsBadRecords(t *testing.T) {
	ch := requireCH(t)
	st := openStore(t, ch)
	br := startBroker(t, 0, "")
	defer br.Close()
	addr := br.ListenAddrs()[0]
	rng := rand.New(rand.NewPCG(6, 6))
	evs := genEvents(rng, 1_000, "hostG/1", 1, 5)
	tr := truthOf(evs)

	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.DefaultProduceTopic(event.TopicUsage))
	require.NoError(t, err)
	res := cl.ProduceSync(context.Background(),
		&kgo.Record{Key: []byte("acct-000"), Value: []byte("not json")},
		&kgo.Record{Key: []byte("acct-000"), Value: []byte(`{"v":99,"account_id":"acct-000","rows_read":1000000}`)})
	require.NoError(t, res.FirstErr())
	cl.Close()
	produce(t, addr, evs)

	s := startSink(t, addr, st, "g-skip", nil)
	requireExact(t, st, tr, time.Minute, s)
	stt := s.Stats()
	assert.Equal(t, uint64(1), stt.SkippedBy[skipUndecodable])
	assert.Equal(t, uint64(1), stt.SkippedBy[skipNewerVersion])
	assert.Zero(t, stt.Lag, "skipped records are committed past")
}

func TestQueries(t *testing.T) {
	ch := requireCH(t)
	st := openStore(t, ch)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(7, 7))
	evs := genEvents(rng, 5_000, "hostH/1", 1, 10)
	// An event without a shape goes to requests only.
	noShape := evs[0]
	noShape.EventID.Seq = 1 << 40
	noShape.Shape, noShape.ShapeHash = "", 0
	evs = append(evs, noShape)
	tr := truthOf(evs)
	stopMerges(t, st)
	require.NoError(t, st.Insert(ctx, evs))
	require.NoError(t, st.Insert(ctx, evs[:2_500]), "a retried partial insert")
	stored, err := st.Counts(ctx, "requests")
	require.NoError(t, err)
	require.Equal(t, uint64(2_500), stored.PendingDuplicates(), "the duplicates are stored: reads must drop them")

	// Per account and day.
	for d, accts := range tr.days {
		day, err := time.Parse("2006-01-02", d)
		require.NoError(t, err)
		for a, want := range accts {
			got, err := st.TotalsForAccountDay(ctx, a, day.Add(13*time.Hour)) // any time in the day
			require.NoError(t, err)
			assert.Equal(t, want, got, "%s %s", a, d)
		}
	}
	none, err := st.TotalsForAccountDay(ctx, "acct-none", time.Now())
	require.NoError(t, err)
	assert.Equal(t, Totals{}, none)

	// HAVING reads > ? OR writes > ?: pick thresholds that split accounts.
	for d, accts := range tr.days {
		day, _ := time.Parse("2006-01-02", d)
		var reads []int64
		for _, v := range accts {
			reads = append(reads, v.RowsRead)
		}
		sort.Slice(reads, func(i, j int) bool { return reads[i] < reads[j] })
		readLimit := reads[len(reads)/2]
		var want []string
		for a, v := range accts {
			if v.RowsRead > readLimit {
				want = append(want, a)
			}
		}
		sort.Strings(want)
		got, err := st.AccountsOver(ctx, day, readLimit, math.MaxInt64)
		require.NoError(t, err)
		var gotIDs []string
		for _, g := range got {
			gotIDs = append(gotIDs, g.AccountID)
			assert.Equal(t, accts[g.AccountID], g.Totals)
		}
		assert.Equal(t, want, gotIDs, "day %s", d)
	}

	// Top shapes of one database, every order, against the truth.
	acct, db := evs[1].AccountID, evs[1].DatabaseUUID
	var shapes []ShapeStats
	for k, v := range tr.shapes {
		if k[0] == acct && k[1] == db {
			shapes = append(shapes, v)
		}
	}
	require.NotEmpty(t, shapes)
	since := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	for order, key := range map[ShapeOrder]func(ShapeStats) float64{
		ByDuration:       func(s ShapeStats) float64 { return float64(s.DurationUs) },
		ByRowsRead:       func(s ShapeStats) float64 { return float64(s.RowsRead) },
		ByRowsWritten:    func(s ShapeStats) float64 { return float64(s.RowsWritten) },
		ByCount:          func(s ShapeStats) float64 { return float64(s.Queries) },
		ByAvgDuration:    func(s ShapeStats) float64 { return float64(s.DurationUs) / float64(s.Queries) },
		ByAvgRowsRead:    func(s ShapeStats) float64 { return float64(s.RowsRead) / float64(s.Queries) },
		ByAvgRowsWritten: func(s ShapeStats) float64 { return float64(s.RowsWritten) / float64(s.Queries) },
	} {
		want := append([]ShapeStats(nil), shapes...)
		sort.SliceStable(want, func(i, j int) bool {
			if key(want[i]) != key(want[j]) {
				return key(want[i]) > key(want[j])
			}
			return want[i].ShapeHash < want[j].ShapeHash
		})
		want = want[:min(3, len(want))]
		got, err := st.TopShapes(ctx, acct, db, since, order, 3)
		require.NoError(t, err)
		assert.Equal(t, want, got, "order %d", order)
	}
	// since excludes older windows.
	late, err := st.TopShapes(ctx, acct, db, time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC), ByCount, 10)
	require.NoError(t, err)
	assert.Empty(t, late)
	_, err = st.TopShapes(ctx, acct, db, since, ShapeOrder(99), 10)
	assert.Error(t, err)

	c, err := st.Counts(ctx, "requests")
	require.NoError(t, err)
	assert.Equal(t, uint64(len(evs)), c.Distinct)
	assert.Equal(t, uint64(len(evs)+2_500), c.Rows)
	ci, err := st.Counts(ctx, "query_insights")
	require.NoError(t, err)
	assert.Equal(t, uint64(len(evs)-1), ci.Distinct, "the shapeless event is not an insight")
}

func TestSchemaIdempotent(t *testing.T) {
	ch := requireCH(t)
	st := openStore(t, ch)
	require.NoError(t, st.EnsureSchema(context.Background()))
	require.NoError(t, st.EnsureSchema(context.Background()))
	_, err := Open(StoreConfig{Options: ch.Options(), Database: "bad-name; DROP"})
	assert.Error(t, err)
}

func TestRecentIDs(t *testing.T) {
	r := newRecentIDs(3)
	id := func(p string, s uint64) event.ID { return event.ID{Producer: p, Seq: s} }
	assert.False(t, r.seen(id("a", 1)))
	r.add(id("a", 1))
	r.add(id("b", 1))
	r.add(id("a", 2))
	assert.True(t, r.seen(id("a", 1)))
	assert.True(t, r.seen(id("b", 1)))
	assert.False(t, r.seen(id("b", 2)))
	r.add(id("a", 3)) // evicts a/1
	assert.False(t, r.seen(id("a", 1)))
	assert.True(t, r.seen(id("a", 3)))
	r.add(id("a", 3)) // re-adding does not evict
	assert.True(t, r.seen(id("b", 1)))
	var nilR *recentIDs
	assert.False(t, nilR.seen(id("a", 1)))
	nilR.add(id("a", 1))

	// An ID that does not fit the packed key is never remembered, so
	// never dropped.
	big := id("a", 1<<seqBits)
	r.add(big)
	assert.False(t, r.seen(big))
	// Runs of one producer and alternation give the same answers.
	r2 := newRecentIDs(100)
	for i := uint64(0); i < 20; i++ {
		r2.add(id("p"+strconv.Itoa(int(i%3)), i))
	}
	for i := uint64(0); i < 20; i++ {
		assert.True(t, r2.seen(id("p"+strconv.Itoa(int(i%3)), i)))
		assert.False(t, r2.seen(id("p"+strconv.Itoa(int((i+1)%3)), i)))
	}
}

// TestGaps: the reconciliation read counts the sequences missing between a
// producer's lowest and highest stored event, once whatever the duplicates.
func TestGaps(t *testing.T) {
	ch := requireCH(t)
	st := openStore(t, ch)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(3, 3))
	whole := genEvents(rng, 1_000, "h1@1/usage", 1, 5)
	holey := genEvents(rng, 1_000, "h2@1/usage", 1, 5)
	var kept []event.Usage
	for i, e := range holey {
		if i == 0 || i == len(holey)-1 || i%100 != 7 { // 10 missing, the ends stored
			kept = append(kept, e)
		}
	}
	stopMerges(t, st)
	require.NoError(t, st.Insert(ctx, whole))
	require.NoError(t, st.Insert(ctx, kept))
	require.NoError(t, st.Insert(ctx, kept[:300]), "duplicates are not gaps")
	gaps, err := st.Gaps(ctx, time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC))
	require.NoError(t, err)
	require.Len(t, gaps, 2)
	assert.Equal(t, ProducerGaps{Producer: "h1@1/usage", MinSeq: 1, MaxSeq: 1000, Stored: 1000}, gaps[0])
	assert.Equal(t, ProducerGaps{Producer: "h2@1/usage", MinSeq: 1, MaxSeq: 1000, Stored: 990, Missing: 10}, gaps[1])
}
