package objecthost

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	v4 "github.com/shoaldb/shoal/internal/v4"
	"github.com/shoaldb/shoal/objecthost/sqlexec"
	"github.com/shoaldb/shoal/raftmeta/fsm"
)

const hbInterval = 10 * time.Second

// beat advances the clock past every database's next heartbeat (interval +
// jitter ≤ 1.1 interval) and runs one pass.
func (th *testHost) beat() HeartbeatReport {
	th.clock.Advance(hbInterval + hbInterval/10 + time.Millisecond)
	return th.RunHeartbeats(context.Background())
}

func hbHost(t *testing.T, mod func(*Config)) *testHost {
	return newTestHost(t, func(c *Config) {
		c.HeartbeatInterval = hbInterval
		c.CreationGrace = 30 * time.Second
		if mod != nil {
			mod(c)
		}
	})
}

func TestHeartbeatKillsOrphanAfterGrace(t *testing.T) {
	th := hbHost(t, nil)
	ctx := context.Background()
	orphan, known := newDB("a"), newDB("a")
	th.mustInit(t, orphan)
	th.mustInit(t, known)
	th.cat.set(known.uuid, "a", fsm.StateActive, 0)

	// Within the grace period the unknown database lives (its catalog write
	// may still be in flight).
	rep := th.beat() // t = 11 s
	assert.Equal(t, 2, rep.Sent)
	assert.Zero(t, rep.OrphansKilled)
	_, err := th.Query(ctx, orphan.obj, orphan.id(), q("SELECT 1"))
	require.NoError(t, err)

	th.beat()       // 22 s
	rep = th.beat() // 33 s: past the 30 s grace
	assert.Equal(t, 1, rep.OrphansKilled)
	_, err = th.Query(ctx, orphan.obj, orphan.id(), q("SELECT 1"))
	assert.ErrorIs(t, err, ErrDeleted)
	_, err = th.Query(ctx, known.obj, known.id(), q("SELECT 1"))
	assert.NoError(t, err, "a database the catalog knows lives on")

	// Deleted objects stop heartbeating.
	rep = th.beat()
	assert.Equal(t, 1, rep.Sent)

	th.reopen(t)
	info, err := th.Info(ctx, orphan.obj)
	require.NoError(t, err)
	assert.Equal(t, StateDeleted, info.State, "the orphan's death is durable")
}

func TestHeartbeatCatalogDeletedMarksDeleted(t *testing.T) {
	th := hbHost(t, nil)
	ctx := context.Background()
	d := newDB("a")
	th.mustInit(t, d)
	_, err := th.Confirm(ctx, d.obj, 1)
	require.NoError(t, err)
	th.cat.set(d.uuid, "a", fsm.StateActive, 1)
	rep := th.beat()
	assert.Zero(t, rep.Deleted)

	// The delete's best-effort call to the object was lost; the heartbeat
	// learns it.
	th.cat.set(d.uuid, "a", fsm.StateDeleted, 2)
	rep = th.beat()
	assert.Equal(t, 1, rep.Deleted)
	_, err = th.Query(ctx, d.obj, d.id(), q("SELECT 1"))
	assert.ErrorIs(t, err, ErrDeleted)
	r, ok := th.sink.LastRoute(d.uuid)
	require.True(t, ok)
	assert.Equal(t, StateDeleted, r.State)
}

func TestHeartbeatRepairsRoutes(t *testing.T) {
	th := hbHost(t, nil)
	ctx := context.Background()
	d := newDB("a")
	th.mustInit(t, d)
	// The create's confirm never arrived; the catalog row exists.
	th.cat.set(d.uuid, "a", fsm.StateActive, 5)
	rep := th.beat()
	assert.Equal(t, 1, rep.RoutesRepaired)
	r, ok := th.sink.LastRoute(d.uuid)
	require.True(t, ok)
	assert.Equal(t, Route{DatabaseUUID: d.uuid, ObjectID: d.obj, HostAddress: "127.0.0.1:1", AccountID: "a", State: StateActive, Generation: 5}, r)
	info, err := th.Info(ctx, d.obj)
	require.NoError(t, err)
	assert.True(t, info.Confirmed)
	assert.EqualValues(t, 5, info.RoutingGeneration)

	// Confirmed and current: nothing to repair.
	n := len(th.sink.Routes())
	rep = th.beat()
	assert.Zero(t, rep.RoutesRepaired)
	assert.Len(t, th.sink.Routes(), n)

	// A newer generation in the catalog is republished.
	th.cat.set(d.uuid, "a", fsm.StateActive, 6)
	rep = th.beat()
	assert.Equal(t, 1, rep.RoutesRepaired)
	r, _ = th.sink.LastRoute(d.uuid)
	assert.EqualValues(t, 6, r.Generation)

	// A failed publication (confirm succeeded locally) is retried by the
	// next heartbeat.
	d2 := newDB("a")
	th.mustInit(t, d2)
	th.cat.set(d2.uuid, "a", fsm.StateActive, 1)
	th.sink.FailRoutes(1)
	_, err = th.Confirm(ctx, d2.obj, 1)
	require.NoError(t, err)
	_, ok = th.sink.LastRoute(d2.uuid)
	require.False(t, ok)
	th.beat()
	_, ok = th.sink.LastRoute(d2.uuid)
	assert.True(t, ok, "route published by the heartbeat after a failed publication")
}

func TestHeartbeatBlockGrowthAppliedAndLifted(t *testing.T) {
	th := hbHost(t, nil)
	ctx := context.Background()
	d := newDB("full")
	th.mustInit(t, d)
	_, err := th.Query(ctx, d.obj, d.id(), q("CREATE TABLE t (x); INSERT INTO t VALUES (1)"))
	require.NoError(t, err)
	th.cat.set(d.uuid, "full", fsm.StateActive, 1)
	th.cat.setAccount(fsm.Account{ID: "full", StorageBytes: 5000, Limits: fsm.Limits{MaxStorageBytes: 5000}})
	th.beat()

	_, err = th.Query(ctx, d.obj, d.id(), q("INSERT INTO t VALUES (randomblob(100000))"))
	var se *sqlexec.Error
	require.ErrorAs(t, err, &se, "writes that grow are blocked")
	assert.Equal(t, v4.CodeStorageLimit, se.Code)
	_, err = th.Query(ctx, d.obj, d.id(), q("SELECT * FROM t"))
	assert.NoError(t, err, "reads still work")
	_, err = th.Query(ctx, d.obj, d.id(), q("DELETE FROM t"))
	assert.NoError(t, err, "deletes still work")

	th.cat.setAccount(fsm.Account{ID: "full", StorageBytes: 4000, Limits: fsm.Limits{MaxStorageBytes: 5000}})
	th.beat()
	_, err = th.Query(ctx, d.obj, d.id(), q("INSERT INTO t VALUES (randomblob(100000))"))
	assert.NoError(t, err, "lifted once the total drops")
}

func TestPerDatabaseSizeLimitFromAccount(t *testing.T) {
	th := hbHost(t, nil)
	ctx := context.Background()
	d := newDB("small")
	th.mustInit(t, d)
	_, err := th.Query(ctx, d.obj, d.id(), q("CREATE TABLE t (x); INSERT INTO t VALUES (randomblob(50000))"))
	require.NoError(t, err)
	th.cat.set(d.uuid, "small", fsm.StateActive, 1)
	th.cat.setAccount(fsm.Account{ID: "small", Limits: fsm.Limits{MaxDatabaseBytes: 40000, MaxStorageBytes: 1 << 30}})
	th.beat()
	_, err = th.Query(ctx, d.obj, d.id(), q("INSERT INTO t VALUES (randomblob(50000))"))
	var se *sqlexec.Error
	require.ErrorAs(t, err, &se, "the database is at the account's per-database limit")
	assert.Equal(t, v4.CodeStorageLimit, se.Code)
	_, err = th.Query(ctx, d.obj, d.id(), q("DELETE FROM t"))
	assert.NoError(t, err)

	other := newDB("small")
	th.mustInit(t, other)
	_, err = th.Query(ctx, other.obj, other.id(), q("CREATE TABLE t (x); INSERT INTO t VALUES (randomblob(1000))"))
	assert.NoError(t, err, "other databases of the account below the limit still grow")
}

func TestHeartbeatBatching(t *testing.T) {
	const n, chunk = 2500, 1000
	th := hbHost(t, func(c *Config) { c.HeartbeatBatch = chunk })
	for i := 0; i < n; i++ {
		th.mustInit(t, newDB("a"))
	}
	rep := th.beat()
	assert.Equal(t, n, rep.Sent)
	assert.Equal(t, (n+chunk-1)/chunk, rep.Calls)
	assert.Equal(t, (n+chunk-1)/chunk, th.cat.callCount())
	for _, s := range th.cat.sizes {
		assert.LessOrEqual(t, s, chunk)
	}
}

func TestHeartbeatSpreadsAndReschedules(t *testing.T) {
	th := hbHost(t, nil)
	for i := 0; i < 200; i++ {
		th.mustInit(t, newDB("a"))
	}
	// First beats are spread over one interval by UUID phase: half an
	// interval in, roughly half are due, not all or none.
	th.clock.Advance(hbInterval / 2)
	rep := th.RunHeartbeats(context.Background())
	assert.Greater(t, rep.Sent, 40)
	assert.Less(t, rep.Sent, 160)
	first := rep.Sent
	// Nothing is due twice in a row.
	rep = th.RunHeartbeats(context.Background())
	assert.Zero(t, rep.Sent)
	// By the end of the first interval every other database has beaten
	// once; the early ones are not due again (next = their beat + interval).
	th.clock.Advance(hbInterval/2 + time.Millisecond)
	rep = th.RunHeartbeats(context.Background())
	assert.Equal(t, 200, first+rep.Sent, "every database heartbeats exactly once in its first interval")
}

func TestHeartbeatIntervalsPerDatabaseAndAccount(t *testing.T) {
	th := hbHost(t, nil)
	slow := newDB("a")
	req := slow.init()
	req.Options.HeartbeatIntervalMs = (10 * hbInterval).Milliseconds()
	_, err := th.Init(context.Background(), slow.obj, req)
	require.NoError(t, err)
	off := newDB("a")
	req = off.init()
	req.Options.HeartbeatIntervalMs = -1
	_, err = th.Init(context.Background(), off.obj, req)
	require.NoError(t, err)
	normal := newDB("quiet")
	th.mustInit(t, normal)
	th.cat.set(normal.uuid, "quiet", fsm.StateActive, 1)
	th.cat.setAccount(fsm.Account{ID: "quiet", Limits: fsm.Limits{HeartbeatIntervalMs: -1}})

	for k := 0; k < 11; k++ { // ~121 s: 11 default intervals
		th.beat()
	}
	seen := th.cat.seen()
	assert.Zero(t, seen[off.uuid], "heartbeats disabled for the database")
	assert.Equal(t, 1, seen[normal.uuid], "the account's -1 disabled heartbeats after the first answer")
	assert.GreaterOrEqual(t, seen[slow.uuid], 1, "the slow database beats on its own 100 s interval")
	assert.LessOrEqual(t, seen[slow.uuid], 2)
	d := newDB("a")
	th.mustInit(t, d)
	th.cat.set(d.uuid, "a", fsm.StateActive, 1)
	for k := 0; k < 11; k++ {
		th.beat()
	}
	assert.GreaterOrEqual(t, th.cat.seen()[d.uuid], 10, "a default database beats every interval")
}

func TestHeartbeatCatalogDownRetries(t *testing.T) {
	th := hbHost(t, func(c *Config) { c.HeartbeatRetry = time.Second })
	d := newDB("a")
	th.mustInit(t, d)
	th.cat.mu.Lock()
	th.cat.fail = true
	th.cat.mu.Unlock()
	rep := th.beat()
	assert.Equal(t, 1, rep.Failed)
	_, err := th.Query(context.Background(), d.obj, d.id(), q("SELECT 1"))
	assert.NoError(t, err, "queries do not need the catalog")

	th.cat.mu.Lock()
	th.cat.fail = false
	th.cat.mu.Unlock()
	th.clock.Advance(2 * time.Second)
	rep = th.RunHeartbeats(context.Background())
	assert.Equal(t, 1, rep.Sent, "retried after HeartbeatRetry, not a full interval")
}

func TestRegisterAndReportLoad(t *testing.T) {
	th := newTestHost(t, func(c *Config) { c.Capacity = 100000; c.Jurisdiction = "eu" })
	ctx := context.Background()
	require.NoError(t, th.Register(ctx))
	d := newDB("a")
	th.mustInit(t, d)
	_, err := th.Query(ctx, d.obj, d.id(), q("CREATE TABLE t (x)"))
	require.NoError(t, err)
	require.NoError(t, th.ReportLoad(ctx))
	require.Len(t, th.cat.hosts, 1)
	assert.Equal(t, fsm.RegisterHost{ID: "host-1", Address: "127.0.0.1:1", Region: "WEUR", Jurisdiction: "eu", Capacity: 100000, State: "active"}, th.cat.hosts[0])
	require.Len(t, th.cat.loads, 1)
	assert.EqualValues(t, 1, th.cat.loads[0].Databases)
	assert.Positive(t, th.cat.loads[0].Bytes)
}
