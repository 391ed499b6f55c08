package snapshot

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/pipeline/chlocal"
	"github.com/shoaldb/shoal/raftmeta"
	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// stubCatalog has no databases and no accounts.
type stubCatalog struct{}

func (stubCatalog) DatabaseStoragePage(context.Context, string, int, raftmeta.ReadOptions) (fsm.DatabaseStoragePage, error) {
	return fsm.DatabaseStoragePage{}, nil
}

func (stubCatalog) AccountStoragePage(context.Context, string, int, raftmeta.ReadOptions) (fsm.AccountStoragePage, error) {
	return fsm.AccountStoragePage{}, nil
}

func sizeA(i int) int64 { return int64(i%997)*4096 + 8192 }
func sizeB(i int) int64 { return int64(i%13)*1_000_003 + 1 }

// One pass stores exactly the catalog's figures; the same bucket again
// stores nothing new; a second pass of the bucket (two snapshotters) and a
// replay of the first pass's inserts (an insert that landed and was
// retried) store duplicates that no read counts.
func TestPassStoresCatalogFigures(t *testing.T) {
	ch := requireCH(t)
	h := openHistory(t, ch)
	cat := startCatalog(t)
	ctx := context.Background()
	uuids := cat.populate(t, 7, 3_000)
	cat.setSizes(t, uuids, 1, sizeA)
	tr := cat.truth(t)
	require.Equal(t, 3_000, tr.count)

	s := newSnapshotter(t, cat, h, func(c *Config) { c.PageSize = 700; c.BatchRows = 1_000 })
	p, ran, err := s.RunOnce(ctx)
	require.NoError(t, err)
	require.True(t, ran)
	assert.Equal(t, 3_000, p.Databases)
	assert.Equal(t, 8, p.Accounts) // 7 + the empty one
	assert.Equal(t, tr.total, p.SizeBytes)
	assert.Equal(t, s.bucket(time.Now()), p.SnapshotTime)
	n1 := requireMatches(t, h, tr, time.Now())
	assert.Equal(t, uint64(1), n1.Passes)
	assert.Equal(t, n1.Distinct+1, n1.Stored, "rows and one marker, nothing twice")
	st := s.Stats()
	assert.Equal(t, uint64(1), st.Passes)
	assert.Equal(t, n1.Stored, st.Rows)
	assert.Equal(t, uint64(5+1), st.Pages, "five database pages of 700, one account page")
	assert.Equal(t, p.SnapshotTime.Unix(), st.LastSuccess)

	// The bucket is taken: a second call does nothing.
	_, ran, err = s.RunOnce(ctx)
	require.NoError(t, err)
	assert.False(t, ran)
	assert.Equal(t, n1, requireMatches(t, h, tr, time.Now()))

	// A second snapshotter running the same bucket anyway (both started
	// before either finished): a whole second pass, read as one.
	s2 := newSnapshotter(t, cat, h, nil)
	p2, err := s2.pass(ctx, p.SnapshotTime)
	require.NoError(t, err)
	assert.NotEqual(t, p.ID, p2.ID)
	n2 := requireMatches(t, h, tr, time.Now())
	assert.Equal(t, uint64(2), n2.Passes)
	assert.Equal(t, 2*n1.Stored, n2.Stored)

	// Every insert of a pass sent again with its pass ID (what a retried
	// insert whose first attempt had landed does): exact duplicates.
	r, err := s2.read(ctx, p.SnapshotTime)
	require.NoError(t, err)
	require.NoError(t, s2.insert(ctx, p.SnapshotTime, p2.ID, r, time.Now()))
	n3 := requireMatches(t, h, tr, time.Now())
	assert.Equal(t, 3*n1.Stored, n3.Stored, "stored three times")
	assert.Equal(t, n1.Distinct, n3.Distinct, "counted once")
}

// ClickHouse killed (SIGKILL) in the middle of a pass's inserts and
// restarted on its data dir a few seconds later: the pass retries the
// failed insert, completes, and the bucket is exact.
func TestClickHouseKilledMidPass(t *testing.T) {
	requireCH(t)
	dir := t.TempDir()
	ctx := context.Background()
	ch, err := chlocal.Start(ctx, chlocal.Config{DataDir: dir})
	require.NoError(t, err)
	defer func() { _ = ch.Close() }()
	h := openHistory(t, ch)
	cat := startCatalog(t)
	uuids := cat.populate(t, 5, 3_000)
	cat.setSizes(t, uuids, 1, sizeB)
	tr := cat.truth(t)

	var (
		mu       sync.Mutex
		restart  = make(chan *chlocal.Server, 1)
		startErr error
	)
	s := newSnapshotter(t, cat, h, func(c *Config) { c.BatchRows = 500; c.AttemptTimeout = 2 * time.Second })
	s.afterBatch = func(batches int) {
		if batches != 2 {
			return
		}
		require.NoError(t, ch.Kill())
		t.Logf("clickhouse killed after the pass's second insert")
		go func() {
			time.Sleep(3 * time.Second) // fault duration: the real ClickHouse stays down a while
			ch2, err := chlocal.Start(ctx, chlocal.Config{DataDir: dir, TCPPort: ch.TCPPort(), HTTPPort: ch.HTTPPort()})
			mu.Lock()
			startErr = err
			mu.Unlock()
			restart <- ch2
		}()
	}
	t0 := time.Now()
	p, ran, err := s.RunOnce(ctx)
	require.NoError(t, err)
	require.True(t, ran)
	ch2 := <-restart
	mu.Lock()
	require.NoError(t, startErr)
	mu.Unlock()
	defer func() { _ = ch2.Close() }()
	t.Logf("pass completed %s after it started, %d insert errors", time.Since(t0), s.Stats().ErrorsByStage[stageInsert])
	assert.Equal(t, 3_000, p.Databases)
	assert.NotZero(t, s.Stats().ErrorsByStage[stageInsert], "inserts failed while ClickHouse was down")
	n := requireMatches(t, h, tr, time.Now())
	assert.Equal(t, uint64(1), n.Passes)
}

// A restarted snapshotter does not redo a completed bucket; one that died
// mid-pass leaves a partial pass that no read sees, and the bucket is taken
// again whole; buckets nobody could take are counted as missed, and the
// billing reads carry figures across them.
func TestRestartNeitherRedoesNorSkips(t *testing.T) {
	ch := requireCH(t)
	h := openHistory(t, ch)
	cat := startCatalog(t)
	ctx := context.Background()
	uuids := cat.populate(t, 4, 1_200)
	cat.setSizes(t, uuids, 1, sizeA)
	tr1 := cat.truth(t)

	clk := &fakeClock{}
	T := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	withClock := func(c *Config) { c.Now = clk.Now; c.BatchRows = 300 }
	clk.Set(T.Add(10 * time.Minute))
	p, ran, err := newSnapshotter(t, cat, h, withClock).RunOnce(ctx)
	require.NoError(t, err)
	require.True(t, ran)
	require.Equal(t, T, p.SnapshotTime)

	// Restarted within the bucket: nothing to do.
	_, ran, err = newSnapshotter(t, cat, h, withClock).RunOnce(ctx)
	require.NoError(t, err)
	assert.False(t, ran)

	// The next bucket: a snapshotter dies after two inserts.
	clk.Set(T.Add(time.Hour + 5*time.Minute))
	crash, cancel := context.WithCancel(ctx)
	s3 := newSnapshotter(t, cat, h, withClock)
	s3.afterBatch = func(b int) {
		if b == 2 {
			cancel()
		}
	}
	_, _, err = s3.RunOnce(crash)
	require.ErrorIs(t, err, context.Canceled)
	last, ok, err := h.LastCompleted(ctx)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, T, last.SnapshotTime, "the interrupted pass is not complete")

	// The catalog changes; the snapshotter that starts next takes the
	// bucket whole with the new figures, the partial pass's rows ignored.
	cat.setSizes(t, uuids, 2, sizeB)
	tr2 := cat.truth(t)
	p, ran, err = newSnapshotter(t, cat, h, withClock).RunOnce(ctx)
	require.NoError(t, err)
	require.True(t, ran)
	require.Equal(t, T.Add(time.Hour), p.SnapshotTime)
	n := requireMatches(t, h, tr2, T.Add(time.Hour+30*time.Minute))
	assert.Equal(t, n.Distinct+1+600, n.Stored, "the partial pass's 600 rows are stored, not read")
	requireMatches(t, h, tr1, T.Add(59*time.Minute))

	// Down for the whole of bucket T+2h; Run starts in T+3h and takes it at
	// once, counting one missed bucket.
	clk.Set(T.Add(3*time.Hour + time.Minute))
	s5 := newSnapshotter(t, cat, h, withClock)
	done := make(chan error, 1)
	go func() { done <- s5.Run(ctx) }()
	require.Eventually(t, func() bool { return s5.Stats().Passes == 1 }, 30*time.Second, 10*time.Millisecond)
	assert.Equal(t, uint64(1), s5.Stats().MissedBuckets)
	assert.Equal(t, T.Add(3*time.Hour).Unix(), s5.Stats().LastSuccess)
	require.NoError(t, s5.Close())
	require.NoError(t, <-done)

	for acct, want1 := range tr1.accounts {
		hist, err := h.AccountHistory(ctx, acct, T, T.Add(4*time.Hour))
		require.NoError(t, err)
		want2 := tr2.accounts[acct]
		require.Equal(t, []AccountStorage{
			{SnapshotTime: T, AccountID: acct, SizeBytes: want1.SizeBytes, Databases: want1.Databases},
			{SnapshotTime: T.Add(time.Hour), AccountID: acct, SizeBytes: want2.SizeBytes, Databases: want2.Databases},
			{SnapshotTime: T.Add(3 * time.Hour), AccountID: acct, SizeBytes: want2.SizeBytes, Databases: want2.Databases},
		}, hist, acct)
		at, err := h.StorageAt(ctx, acct, T.Add(2*time.Hour+30*time.Minute))
		require.NoError(t, err)
		assert.Equal(t, hist[1], at, "inside the missed bucket: the figures before it")
	}
	_, err = h.StorageAt(ctx, "acct-000", T.Add(-time.Second))
	require.ErrorIs(t, err, ErrNoSnapshot)
}

// Run on the real clock with a 1 s interval takes bucket after bucket,
// each once, and Close leaves no goroutine behind.
func TestRunTakesEveryBucketOnce(t *testing.T) {
	ch := requireCH(t)
	h := openHistory(t, ch)
	cat := startCatalog(t)
	uuids := cat.populate(t, 3, 60)
	cat.setSizes(t, uuids, 1, sizeA)
	tr := cat.truth(t)
	before := runtime.NumGoroutine()

	s, err := Start(Config{Catalog: cat.client, Conn: h.conn, Database: h.Database(), Interval: time.Second, Logger: quietLogger()})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return s.Stats().Passes >= 3 }, 30*time.Second, 10*time.Millisecond)
	require.NoError(t, s.Close())
	require.NoError(t, s.Close(), "Close twice")
	st := s.Stats()

	ctx := context.Background()
	last, ok, err := h.LastCompleted(ctx)
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, last.SnapshotTime.Unix(), st.LastSuccess)
	// Walk the completed buckets newest first: each has one marker, and
	// there are as many as passes were counted.
	var buckets []string
	for b := last.SnapshotTime; ; {
		n, err := h.CountsAt(ctx, b)
		require.NoError(t, err)
		assert.Equal(t, uint64(1), n.Passes, "bucket %s taken once", b)
		buckets = append(buckets, b.Format(time.TimeOnly))
		if b.Equal(last.SnapshotTime) {
			requireMatches(t, h, tr, b)
		}
		c, ok, err := h.completedAt(ctx, b.Add(-time.Second))
		require.NoError(t, err)
		if !ok {
			break
		}
		b = c.SnapshotTime
	}
	assert.Equal(t, st.Passes, uint64(len(buckets)))
	t.Logf("buckets taken: %v (missed %d)", buckets, st.MissedBuckets)

	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond) // poll interval: goroutines counted until they are gone (deadline above)
	}
	if n := runtime.NumGoroutine(); n > before {
		buf := make([]byte, 1<<20)
		t.Fatalf("%d goroutines after Close, %d before:\n%s", n, before, buf[:runtime.Stack(buf, true)])
	}
}

func TestConfigAndBuckets(t *testing.T) {
	conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{"127.0.0.1:1"}}) // never dialled here
	require.NoError(t, err)
	defer conn.Close()
	var cat Catalog = stubCatalog{}
	_, err = New(Config{Conn: conn})
	assert.Error(t, err, "no catalog")
	_, err = New(Config{Catalog: cat})
	assert.Error(t, err, "no ClickHouse")
	for _, bad := range []time.Duration{500 * time.Millisecond, 1500 * time.Millisecond, -time.Hour} {
		_, err := New(Config{Catalog: cat, Conn: conn, Interval: bad})
		assert.Error(t, err, "interval %v", bad)
	}
	s, err := New(Config{Catalog: cat, Conn: conn})
	require.NoError(t, err)
	defer s.Close()
	assert.Equal(t, time.Hour, s.cfg.Interval)
	assert.Equal(t, 10_000, s.cfg.PageSize)
	assert.Equal(t, 50_000, s.cfg.BatchRows)
	assert.Equal(t, raftmeta.Stale, s.cfg.Read.Consistency)
	assert.Equal(t, "shoal", s.History().Database())
	for _, c := range []struct {
		interval time.Duration
		at, want string
	}{
		{time.Hour, "2026-12-01T10:59:59.999Z", "2026-12-01T10:00:00Z"},
		{time.Hour, "2026-12-01T11:00:00Z", "2026-12-01T11:00:00Z"},
		{24 * time.Hour, "2026-12-01T23:30:00+02:00", "2026-12-01T00:00:00Z"},
		{15 * time.Minute, "2026-12-01T10:44:00Z", "2026-12-01T10:30:00Z"},
		{7 * time.Second, "1970-01-01T00:00:20Z", "1970-01-01T00:00:14Z"},
	} {
		s.cfg.Interval = c.interval
		at, err := time.Parse(time.RFC3339Nano, c.at)
		require.NoError(t, err)
		assert.Equal(t, c.want, s.bucket(at).Format(time.RFC3339), fmt.Sprint(c))
	}
}

// ClickHouse down when the snapshotter starts (no table yet): the catalog
// is read within the bucket, the inserts wait, create the table once
// ClickHouse answers, and the bucket is exact.
func TestClickHouseDownAtStart(t *testing.T) {
	requireCH(t)
	dir := t.TempDir()
	ctx := context.Background()
	ch, err := chlocal.Start(ctx, chlocal.Config{DataDir: dir})
	require.NoError(t, err)
	opts := ch.Options()
	tcp, httpPort := ch.TCPPort(), ch.HTTPPort()
	require.NoError(t, ch.Close())
	conn, err := clickhouse.Open(opts)
	require.NoError(t, err)
	defer conn.Close()
	h, err := NewHistory(conn, "t_down_at_start")
	require.NoError(t, err)

	cat := startCatalog(t)
	uuids := cat.populate(t, 3, 500)
	cat.setSizes(t, uuids, 1, sizeA)
	tr := cat.truth(t)
	s, err := Start(Config{Catalog: cat.client, Conn: conn, Database: h.Database(), Logger: quietLogger(),
		RetryMin: 20 * time.Millisecond, RetryMax: 200 * time.Millisecond, AttemptTimeout: 2 * time.Second})
	require.NoError(t, err)
	defer s.Close()
	require.Eventually(t, func() bool { return s.Stats().ErrorsByStage[stageInsert] >= 2 }, 30*time.Second, 10*time.Millisecond)
	assert.Equal(t, uint64(2), s.Stats().Pages, "the catalog was read while ClickHouse was down")
	assert.Zero(t, s.Stats().Passes)

	ch2, err := chlocal.Start(ctx, chlocal.Config{DataDir: dir, TCPPort: tcp, HTTPPort: httpPort})
	require.NoError(t, err)
	defer func() { _ = ch2.Close() }()
	require.Eventually(t, func() bool { return s.Stats().Passes == 1 }, time.Minute, 20*time.Millisecond)
	require.NoError(t, s.Close())
	n := requireMatches(t, h, tr, time.Now())
	assert.Equal(t, uint64(1), n.Passes)
	t.Logf("errors while ClickHouse was down: %v", s.Stats().ErrorsByStage)
}
