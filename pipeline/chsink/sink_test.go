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
	time.Sleep(2 * time.Second) // fault duration: the real broker stays down a while
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

// TestSchemaMigratesOldRequests: a database created by the two-table
// schema (requests without shape columns, query_insights) is brought to
// the current one by EnsureSchema, old rows keep counting for billing,
// and new events are served by TopShapes.
func TestSchemaMigratesOldRequests(t *testing.T) {
	ch := requireCH(t)
	st := openStore(t, ch)
	ctx := context.Background()
	db := st.Database()
	require.NoError(t, st.Conn().Exec(ctx, "DROP TABLE "+db+".requests"))
	require.NoError(t, st.Conn().Exec(ctx, `CREATE TABLE `+db+`.requests (
    day Date, account_id String, database_uuid String, host String, event_producer String, event_seq UInt64,
    window_start_ms Int64, window_end_ms Int64, queries Int64, errors Int64, rows_read Int64, rows_written Int64, duration_us Int64
) ENGINE = ReplacingMergeTree() PARTITION BY toYYYYMM(day) ORDER BY (day, account_id, database_uuid, event_producer, event_seq)`))
	b, err := st.Conn().PrepareBatch(ctx, "INSERT INTO "+db+".requests (day, account_id, database_uuid, host, event_producer, event_seq, "+
		"window_start_ms, window_end_ms, queries, errors, rows_read, rows_written, duration_us)")
	require.NoError(t, err)
	start := time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC)
	require.NoError(t, b.Append(Day(start.UnixMilli()), "acct-m", "db-m", "h", "h@1/usage", uint64(1),
		start.UnixMilli(), start.UnixMilli()+1000, int64(2), int64(0), int64(10), int64(1), int64(30)))
	require.NoError(t, b.Send())

	require.NoError(t, st.EnsureSchema(ctx))
	require.NoError(t, st.EnsureSchema(ctx), "idempotent once migrated")
	ev := event.Usage{V: 1, EventID: event.ID{Producer: "h@1/usage", Seq: 2}, Host: "h", AccountID: "acct-m", DatabaseUUID: "db-m",
		Shape: "SELECT 1", ShapeHash: 77, WindowStart: start.UnixMilli() + 1000, WindowEnd: start.UnixMilli() + 2000,
		Queries: 3, RowsRead: 5, RowsWritten: 0, DurationUs: 40, MaxDuration: 20}
	require.NoError(t, st.Insert(ctx, []event.Usage{ev}))
	tot, err := st.TotalsForAccountDay(ctx, "acct-m", start)
	require.NoError(t, err)
	assert.Equal(t, Totals{Events: 2, Queries: 5, RowsRead: 15, RowsWritten: 1, DurationUs: 70}, tot)
	top, err := st.TopShapes(ctx, "acct-m", "db-m", start, ByCount, 10)
	require.NoError(t, err)
	assert.Equal(t, []ShapeStats{{ShapeHash: 77, Shape: "SELECT 1", Queries: 3, RowsRead: 5, DurationUs: 40, MaxDurationUs: 20}}, top,
		"the pre-migration row has no shape")
}

func TestRecentIDs(t *testing.T) {
	r := newRecentIDs(3) // rounded up to a window of 64 sequences per producer
	id := func(p string, s uint64) event.ID { return event.ID{Producer: p, Seq: s} }
	assert.False(t, r.seen(id("a", 1)))
	r.add(id("a", 1))
	r.add(id("b", 1))
	r.add(id("a", 2))
	assert.True(t, r.seen(id("a", 1)))
	assert.True(t, r.seen(id("b", 1)))
	assert.False(t, r.seen(id("b", 2)))
	assert.False(t, r.seen(id("c", 1)))
	r.add(id("a", 65)) // a/1 is now outside a's window (the 64 sequences up to 65)
	assert.False(t, r.seen(id("a", 1)))
	assert.True(t, r.seen(id("a", 2)))
	assert.False(t, r.seen(id("a", 3)), "a skipped sequence is not seen")
	assert.True(t, r.seen(id("a", 65)))
	r.add(id("a", 65)) // re-adding does not move the window
	assert.True(t, r.seen(id("a", 2)))
	assert.True(t, r.seen(id("b", 1)), "producers have windows of their own")
	r.add(id("a", 1)) // older than the window: not remembered
	assert.False(t, r.seen(id("a", 1)))
	r.add(id("a", 1000)) // a jump past the window forgets all of it
	assert.False(t, r.seen(id("a", 65)))
	assert.True(t, r.seen(id("a", 1000)))
	assert.False(t, r.seen(id("a", 1000-64)), "a slot reused by the slide was cleared")
	r.add(id("a", 999)) // in order or not
	assert.True(t, r.seen(id("a", 999)))
	r.clear()
	assert.False(t, r.seen(id("a", 1000)))
	assert.False(t, r.seen(id("b", 1)))
	var nilR *recentIDs
	assert.False(t, nilR.seen(id("a", 1)))
	nilR.add(id("a", 1))
	nilR.clear()

	// Runs of one producer and alternation give the same answers.
	r2 := newRecentIDs(100)
	for i := uint64(0); i < 20; i++ {
		r2.add(id("p"+strconv.Itoa(int(i%3)), i))
	}
	for i := uint64(0); i < 20; i++ {
		assert.True(t, r2.seen(id("p"+strconv.Itoa(int(i%3)), i)))
		assert.False(t, r2.seen(id("p"+strconv.Itoa(int((i+1)%3)), i)))
	}
	// More producers than it keeps: the least recently used is forgotten,
	// never confused with another.
	r3 := newRecentIDs(64)
	for p := 0; p <= maxProducers; p++ {
		r3.add(id("q"+strconv.Itoa(p), 5))
	}
	assert.False(t, r3.seen(id("q0", 5)))
	assert.True(t, r3.seen(id("q"+strconv.Itoa(maxProducers), 5)))
	assert.True(t, r3.seen(id("q1", 5)))
	assert.Len(t, r3.producers, maxProducers)

	// Against a plain set of every ID added, random IDs in a sliding
	// range: whatever it says is seen was added (exactness), and within
	// the window everything added is seen.
	rng := rand.New(rand.NewPCG(5, 5))
	r4 := newRecentIDs(256)
	added := map[event.ID]bool{}
	var hi [4]uint64
	for i := 0; i < 20_000; i++ {
		p := rng.IntN(4)
		s := uint64(i/4) + uint64(rng.IntN(300))
		e := id("r"+strconv.Itoa(p), s)
		if rng.IntN(3) == 0 {
			r4.add(e)
			added[e] = true
			hi[p] = max(hi[p], s)
		}
		if r4.seen(e) {
			assert.True(t, added[e], "seen but never added: %v", e)
		} else if added[e] && hi[p]-s < 256 {
			t.Fatalf("added within the window but not seen: %v (hi %d)", e, hi[p])
		}
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
