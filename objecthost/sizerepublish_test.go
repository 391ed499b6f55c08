package objecthost

import (
	"context"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A host killed -9 loses the size events still in memory (its aggregation
// window, the producer's buffer while the broker is away). After the
// restart, a database that is not written again must still have its size
// published: the pass after start records every live database's size once.
// The fresh sink stands for the events the crash lost.
func TestSizesRepublishedAfterRestart(t *testing.T) {
	ctx := context.Background()
	th := hbHost(t, nil)
	live, gone := newDB("acct"), newDB("acct")
	for _, d := range []db{live, gone} {
		th.mustInit(t, d)
		_, err := th.Query(ctx, d.obj, d.id(), q("CREATE TABLE t (x INTEGER PRIMARY KEY, y)"))
		require.NoError(t, err)
		_, err = th.Query(ctx, d.obj, d.id(), q("INSERT INTO t (y) VALUES (1), (2), (3)"))
		require.NoError(t, err)
	}
	sent := th.sink.Sizes()
	_, err := th.Delete(ctx, gone.obj, 0)
	require.NoError(t, err)
	require.NotEmpty(t, sent)
	lastSeq := sent[len(sent)-1].Seq

	th.cat.setObject(live.uuid, "acct", live.obj, 1)
	th.cat.set(gone.uuid, "acct", "deleted", 1)

	// Restart. No query touches the database afterwards.
	require.NoError(t, th.Host.Close())
	th.sink = &MemSink{}
	th.cfg.Usage, th.cfg.Sizes, th.cfg.Routes = th.sink, th.sink, th.sink
	th.open(t)
	require.Empty(t, th.sink.Sizes(), "nothing before the catalog names the object")

	th.beat()
	got := th.sink.Sizes()
	require.Len(t, got, 1, "only the live database's size, once: %+v", got)
	e := got[0]
	assert.Equal(t, live.uuid, e.DatabaseUUID)
	assert.Equal(t, "acct", e.AccountID)
	assert.Equal(t, sent[len(sent)-1].SizeBytes, e.SizeBytes, "the size its last write published: one measure") // live's insert came last but for the delete's 0
	assert.Greater(t, e.Seq, lastSeq, "a fresh sequence: consumers keep the highest")

	th.beat()
	assert.Len(t, th.sink.Sizes(), 1, "once per start, not at every heartbeat")
}

// A host declared lost that comes back holds superseded objects of
// databases relocated elsewhere. Their sizes are stale: republished with a
// fresh sequence they would replace the live object's size in the catalog.
// Only an object the catalog names as its database's active one has its
// size published again.
func TestSizesNotRepublishedForSupersededObjects(t *testing.T) {
	th := hbHost(t, nil)
	moved, stays := newDB("acct"), newDB("acct")
	for _, d := range []db{moved, stays} {
		th.mustInit(t, d)
		th.exec(t, d, "CREATE TABLE t (x INTEGER PRIMARY KEY, y)")
		th.exec(t, d, "INSERT INTO t (y) VALUES (randomblob(3000))")
		th.cat.setObject(d.uuid, "acct", d.obj, 1)
	}
	th.beat()

	// moved is relocated to another host while this one is down.
	th.cat.setObject(moved.uuid, "acct", newObjectID(), 2)
	require.NoError(t, th.Host.Close())
	th.sink = &MemSink{}
	th.cfg.Usage, th.cfg.Sizes, th.cfg.Routes = th.sink, th.sink, th.sink
	th.open(t)

	rep := th.beat()
	require.Equal(t, 1, rep.Superseded)
	var uuids []string
	for _, e := range th.sink.Sizes() {
		if e.SizeBytes > 0 {
			uuids = append(uuids, e.DatabaseUUID)
		}
	}
	assert.Equal(t, []string{stays.uuid}, uuids, "no size of the superseded object (a retire may publish its 0)")
}

// Without a catalog (a host run alone, where no relocation can happen),
// one pass after the start publishes every live database's size.
func TestSizesRepublishedWithoutCatalog(t *testing.T) {
	th := newTestHost(t, func(c *Config) { c.Catalog = nil })
	d := newDB("acct")
	th.mustInit(t, d)
	th.exec(t, d, "CREATE TABLE t (x INTEGER PRIMARY KEY, y)")
	require.NoError(t, th.Host.Close())
	th.sink = &MemSink{}
	th.cfg.Usage, th.cfg.Sizes, th.cfg.Routes = th.sink, th.sink, th.sink
	th.cfg.Manual = false
	th.open(t)
	require.Eventually(t, func() bool { return len(th.sink.Sizes()) == 1 }, time.Minute, 10*time.Millisecond)
	assert.Equal(t, d.uuid, th.sink.Sizes()[0].DatabaseUUID)
}

// A database's size is one measure wherever the host takes it — after a
// write (size_after), at a GET, from the file's header at a start, and by
// opening the database when the header cannot be trusted (a WAL left by a
// crash) — so the catalog's figure never depends on which came last.
// Deleted rows leave free pages, which make the file longer than the pages
// in use: file + WAL would differ.
func TestSizeIsOneMeasure(t *testing.T) {
	ctx := context.Background()
	th := hbHost(t, nil)
	d := newDB("acct")
	th.mustInit(t, d)
	th.exec(t, d, "CREATE TABLE t (x INTEGER PRIMARY KEY, y)")
	th.exec(t, d, "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 40) INSERT INTO t (y) SELECT randomblob(3000) FROM n")
	res, err := th.Query(ctx, d.obj, d.id(), q("DELETE FROM t WHERE x > 10"))
	require.NoError(t, err)
	written := res[0].Meta.SizeAfter
	require.Positive(t, written)
	sent := th.sink.Sizes()
	require.Equal(t, written, sent[len(sent)-1].SizeBytes, "a write publishes its size_after")

	info, err := th.Info(ctx, d.obj)
	require.NoError(t, err)
	assert.Equal(t, written, info.FileSize, "a GET measures the same")
	assert.Len(t, th.sink.Sizes(), len(sent), "and so publishes nothing new")

	// A crash: the file and a WAL holding the latest frames, as a kill -9
	// leaves them. Copied while the host has the database open.
	th.exec(t, d, "UPDATE t SET y = randomblob(10) WHERE x = 1")
	res, err = th.Query(ctx, d.obj, d.id(), q("SELECT 1"))
	require.NoError(t, err)
	info, err = th.Info(ctx, d.obj)
	require.NoError(t, err)
	want := info.FileSize
	path := th.path(d.obj)
	wal, err := os.ReadFile(path + "-wal")
	require.NoError(t, err)
	require.Greater(t, len(wal), 32, "the WAL holds frames")
	file, err := os.ReadFile(path)
	require.NoError(t, err)
	_, trusted := storedUsedBytes(path)
	assert.False(t, trusted, "a WAL with frames: the header is not to be trusted")

	require.NoError(t, th.Host.Close())
	size, ok := storedUsedBytes(path)
	require.True(t, ok, "a clean close leaves a header to trust")
	assert.Equal(t, want, size, "the header gives the measure SQLite gives")

	require.NoError(t, os.WriteFile(path, file, 0o644))
	require.NoError(t, os.WriteFile(path+"-wal", wal, 0o644))
	_ = os.Remove(path + "-shm")
	th.sink = &MemSink{}
	th.cfg.Usage, th.cfg.Sizes, th.cfg.Routes = th.sink, th.sink, th.sink
	th.open(t)
	th.cat.setObject(d.uuid, "acct", d.obj, 1)
	th.beat()
	got := th.sink.Sizes()
	require.NotEmpty(t, got, "the size is published after the crash")
	assert.Equal(t, want, got[len(got)-1].SizeBytes, "measured by opening, WAL replayed: the same measure")
	_ = res
}

func TestStoredUsedBytesRefusesWhatItCannotTrust(t *testing.T) {
	dir := t.TempDir()
	size, ok := storedUsedBytes(dir + "/absent")
	assert.True(t, ok)
	assert.Zero(t, size, "never created: nothing stored")
	require.NoError(t, os.WriteFile(dir+"/empty", nil, 0o644))
	size, ok = storedUsedBytes(dir + "/empty")
	assert.True(t, ok)
	assert.Zero(t, size)
	require.NoError(t, os.WriteFile(dir+"/junk", []byte(strings.Repeat("x", 200)), 0o644))
	_, ok = storedUsedBytes(dir + "/junk")
	assert.False(t, ok, "not a SQLite header")
	require.NoError(t, os.WriteFile(dir+"/short", []byte("SQLite format 3\x00"), 0o644))
	_, ok = storedUsedBytes(dir + "/short")
	assert.False(t, ok, "a truncated header")
}

// A catalog restored from an older backup holds the backup's sizes
// (database_stats went back with everything else), and a host publishes a
// size only when it changes: the restore count a heartbeat answer carries
// growing makes every database the catalog names current publish its size
// again, once, at its next heartbeat. An answer with a lower count (a
// follower behind the restore) changes nothing.
func TestSizesRepublishedAfterCatalogRestore(t *testing.T) {
	var resends atomic.Int32
	th := hbHost(t, func(c *Config) { c.Sizes = resendCounter{c.Sizes.(*MemSink), &resends} })
	d := newDB("acct")
	th.mustInit(t, d)
	th.exec(t, d, "CREATE TABLE t (x INTEGER PRIMARY KEY, y)")
	th.exec(t, d, "INSERT INTO t (y) VALUES (randomblob(3000))")
	th.cat.setObject(d.uuid, "acct", d.obj, 1)
	th.cat.restores = 2 // restored twice before this host started
	th.beat()
	th.beat()
	before := len(th.sink.Sizes())

	require.Zero(t, resends.Load(), "no restore seen yet")
	th.cat.restores = 3 // restored from a backup
	th.beat()
	assert.Equal(t, int32(1), resends.Load(), "a sink that sends only changed sizes is told to resend them")
	got := th.sink.Sizes()[before:]
	require.Len(t, got, 1, "the size published again after the restore: %+v", got)
	assert.Equal(t, d.uuid, got[0].DatabaseUUID)
	last := th.sink.Sizes()[before-1]
	assert.Equal(t, last.SizeBytes, got[0].SizeBytes, "the size the host last measured")
	assert.Greater(t, got[0].Seq, last.Seq, "a fresh sequence: consumers keep the highest")

	th.beat()
	th.cat.restores = 2 // a follower behind the restore answers
	th.beat()
	th.cat.restores = 3
	th.beat()
	assert.Len(t, th.sink.Sizes(), before+1, "once per restore, not at every heartbeat nor on a lagging answer")
	assert.Equal(t, int32(1), resends.Load())
}

// resendCounter is a MemSink that counts ResendSizes (the pipeline
// aggregator's sizeResender).
type resendCounter struct {
	*MemSink
	n *atomic.Int32
}

func (r resendCounter) ResendSizes() { r.n.Add(1) }

// Every database a restarted host holds has its size published again,
// though none is written after the restart: those that heartbeat at their
// first current heartbeat, and those whose heartbeats are disabled (the
// account's HeartbeatIntervalMs -1, copied into the database's options at
// create) by the pass after the start, which asks the catalog once. A
// database the catalog names with another object (relocated) is not
// published. Real SQLite files; the fresh sink stands for the events a
// kill -9 lost.
func TestRestartedHostPublishesEverySize(t *testing.T) {
	ctx := context.Background()
	th := hbHost(t, nil)
	normal, quiet, quietMoved := newDB("acct"), newDB("acct"), newDB("acct")
	for _, d := range []db{normal, quiet, quietMoved} {
		req := d.init()
		if d != normal {
			req.Options.HeartbeatIntervalMs = -1
		}
		_, err := th.Init(ctx, d.obj, req)
		require.NoError(t, err)
		th.exec(t, d, "CREATE TABLE t (x INTEGER PRIMARY KEY, y)")
		th.exec(t, d, "INSERT INTO t (y) VALUES (randomblob(3000))")
		th.cat.setObject(d.uuid, "acct", d.obj, 1)
	}
	th.cat.setObject(quietMoved.uuid, "acct", newObjectID(), 2)

	require.NoError(t, th.Host.Close())
	th.sink = &MemSink{}
	th.cfg.Usage, th.cfg.Sizes, th.cfg.Routes = th.sink, th.sink, th.sink
	th.cfg.Manual = false // the start's background passes run
	th.open(t)
	th.beat()
	published := func() map[string]int64 {
		out := map[string]int64{}
		for _, e := range th.sink.Sizes() {
			out[e.DatabaseUUID] = e.SizeBytes
		}
		return out
	}
	require.Eventually(t, func() bool { return len(published()) >= 2 }, 20*time.Second, 10*time.Millisecond, "sizes published: %v", published())
	got := published()
	assert.Positive(t, got[normal.uuid], "a database with heartbeats")
	assert.Positive(t, got[quiet.uuid], "a database without heartbeats")
	_, moved := got[quietMoved.uuid]
	assert.False(t, moved, "not the size of an object the catalog no longer names")
}
