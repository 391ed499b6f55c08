package objecthost

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/objecthost/history"
	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// flakyStore fails Get while failGets is set: an archive that cannot be
// read in the middle of an init's restore.
type flakyStore struct {
	history.Store
	failGets atomic.Bool
	failPuts atomic.Bool
}

func (s *flakyStore) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	if s.failPuts.Load() {
		return errors.New("store unreachable")
	}
	return s.Store.Put(ctx, key, r, size)
}

func (s *flakyStore) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	if s.failGets.Load() {
		return nil, errors.New("store unreachable")
	}
	return s.Store.Get(ctx, key)
}

func historyHost(t *testing.T, store history.Store) *testHost {
	return hbHost(t, func(c *Config) {
		c.History = &HistoryConfig{Store: store, Shipper: history.ShipperOptions{MaxLag: 50 * time.Millisecond}}
	})
}

// rowsOf is the table t of d, as JSON.
func (th *testHost) rowsOf(t *testing.T, d db) string {
	t.Helper()
	res, err := th.Query(context.Background(), d.obj, d.id(), q("SELECT id, v, r FROM t ORDER BY id"))
	require.NoError(t, err)
	b, err := json.Marshal(res[0].Results)
	require.NoError(t, err)
	return string(b)
}

func (th *testHost) exec(t *testing.T, d db, sql string) {
	t.Helper()
	_, err := th.Query(context.Background(), d.obj, d.id(), q(sql))
	require.NoError(t, err, sql)
}

// archivedUpTo waits until the archive holds d's current bookmark.
func (th *testHost) archivedUpTo(t *testing.T, d db) string {
	t.Helper()
	b, err := th.Bookmark(context.Background(), d.obj, "", 0)
	require.NoError(t, err)
	p, err := history.ParseBookmark(d.uuid, history.Bookmark(b.Bookmark))
	require.NoError(t, err)
	require.NoError(t, th.hist.waitArchived(context.Background(), d.uuid, p))
	return b.Bookmark
}

// TestInitRestoreFromArchive: an init with RestoreFrom makes the new
// object the archived state of another database (a fork) at a bookmark or
// at its last archived commit, leaves the source untouched, gives the new
// object a history of its own, refuses a source with no archive unless
// EmptyIfNone, and resumes after a failed restore on the retry of the same
// init (real SQLite files, a directory archive).
func TestInitRestoreFromArchive(t *testing.T) {
	ctx := context.Background()
	dir, err := history.NewDirStore(t.TempDir())
	require.NoError(t, err)
	store := &flakyStore{Store: dir}
	th := historyHost(t, store)

	src := newDB("acct")
	th.mustInit(t, src)
	th.exec(t, src, "CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT, r INTEGER DEFAULT (random()), b BLOB DEFAULT (randomblob(300)))")
	th.exec(t, src, "INSERT INTO t(v) VALUES ('one'), ('two')")
	rows1 := th.rowsOf(t, src)
	b1 := th.archivedUpTo(t, src)
	th.clock.Advance(time.Second)
	th.exec(t, src, "DELETE FROM t WHERE v = 'one'")
	th.exec(t, src, "INSERT INTO t(v) VALUES ('three')")
	rows2 := th.rowsOf(t, src)
	require.NotEqual(t, rows1, rows2)

	// Fork at b1.
	fork := newDB("acct")
	req := fork.init()
	req.RestoreFrom = &RestoreSource{DatabaseUUID: src.uuid, Bookmark: b1}
	info, err := th.Init(ctx, fork.obj, req)
	require.NoError(t, err)
	assert.Equal(t, fork.uuid, info.DatabaseUUID)
	assert.Equal(t, int64(1), info.NumTables)
	assert.Equal(t, rows1, th.rowsOf(t, fork), "the fork is the source at the bookmark")
	assert.Equal(t, rows2, th.rowsOf(t, src), "the source is untouched")
	again, err := th.Init(ctx, fork.obj, req)
	require.NoError(t, err, "the retry of a finished init answers it again")
	assert.Equal(t, info.ObjectID, again.ObjectID)

	// The fork has its own history: write, bookmark, restore to its base.
	base := th.archivedUpTo(t, fork)
	th.clock.Advance(time.Second)
	th.exec(t, fork, "INSERT INTO t(v) VALUES ('fork-only')")
	assert.NotEqual(t, rows1, th.rowsOf(t, fork))
	assert.Equal(t, rows2, th.rowsOf(t, src))
	_, err = th.Restore(ctx, fork.obj, base, "", 0)
	require.NoError(t, err)
	assert.Equal(t, rows1, th.rowsOf(t, fork), "restore within the fork's own history")

	// At the source's last archived commit (no bookmark).
	th.archivedUpTo(t, src)
	latest := newDB("acct")
	req = latest.init()
	req.RestoreFrom = &RestoreSource{DatabaseUUID: src.uuid}
	_, err = th.Init(ctx, latest.obj, req)
	require.NoError(t, err)
	assert.Equal(t, rows2, th.rowsOf(t, latest))

	// No archive for the source: refused, unless EmptyIfNone.
	none := newDB("acct")
	req = none.init()
	req.RestoreFrom = &RestoreSource{DatabaseUUID: uuid.NewString()}
	_, err = th.Init(ctx, none.obj, req)
	require.ErrorIs(t, err, ErrInvalid)
	_, err = th.Query(ctx, none.obj, none.id(), q("SELECT 1"))
	require.ErrorIs(t, err, ErrRestoring, "never served empty while its restore is pending")
	empty := newDB("acct")
	req = empty.init()
	req.RestoreFrom = &RestoreSource{DatabaseUUID: uuid.NewString(), EmptyIfNone: true}
	info, err = th.Init(ctx, empty.obj, req)
	require.NoError(t, err)
	assert.Zero(t, info.NumTables)

	// Bad input.
	bad := newDB("acct")
	req = bad.init()
	req.RestoreFrom = &RestoreSource{DatabaseUUID: src.uuid, Bookmark: "00000000-nope"}
	_, err = th.Init(ctx, bad.obj, req)
	require.ErrorIs(t, err, ErrInvalid)
	req.RestoreFrom = &RestoreSource{DatabaseUUID: src.uuid, Bookmark: b1}
	req.RestoreFrom.DatabaseUUID = "NOT-A-UUID"
	_, err = th.Init(ctx, bad.obj, req)
	require.ErrorIs(t, err, ErrInvalid)

	// The archive fails mid-restore: the object exists, is not served,
	// and the retry of the same init (same IDs, after a host restart)
	// resumes the restore.
	flaky := newDB("acct")
	req = flaky.init()
	req.RestoreFrom = &RestoreSource{DatabaseUUID: src.uuid, Bookmark: b1}
	store.failGets.Store(true)
	_, err = th.Init(ctx, flaky.obj, req)
	require.Error(t, err)
	_, err = th.Query(ctx, flaky.obj, flaky.id(), q("SELECT 1"))
	require.ErrorIs(t, err, ErrRestoring)
	th.reopen(t)
	store.failGets.Store(false)
	_, err = th.Init(ctx, flaky.obj, req)
	require.NoError(t, err)
	assert.Equal(t, rows1, th.rowsOf(t, flaky))
	assert.Equal(t, rows2, th.rowsOf(t, src))
}

// TestInitRestoreFromNeedsHistory: a host without an archive refuses.
func TestInitRestoreFromNeedsHistory(t *testing.T) {
	th := hbHost(t, nil)
	d := newDB("acct")
	req := d.init()
	req.RestoreFrom = &RestoreSource{DatabaseUUID: uuid.NewString()}
	_, err := th.Init(context.Background(), d.obj, req)
	require.ErrorIs(t, err, ErrInvalid)
	_, _, err = th.lookup(d.obj)
	require.ErrorIs(t, err, ErrNotFound, "nothing was written")
}

// TestHeartbeatRelocatedObjects: what a host does when the catalog names
// another object for one of its databases — retires a superseded object
// (newer generation), kills the leftover of a relocation that never
// committed (unconfirmed, past the grace, fenced), keeps a confirmed object
// the catalog names an older object for (alarm) — and that it learns from
// its registration that it was declared lost.
func TestHeartbeatRelocatedObjects(t *testing.T) {
	ctx := context.Background()
	th := hbHost(t, nil)

	old, left, kept := newDB("a"), newDB("a"), newDB("a")
	for _, d := range []db{old, left, kept} {
		th.mustInit(t, d)
		th.cat.setObject(d.uuid, "a", d.obj, 1)
	}
	rep := th.beat()
	require.Equal(t, 3, rep.RoutesRepaired, "confirmed")

	// old: relocated elsewhere at generation 2.
	th.cat.setObject(old.uuid, "a", newObjectID(), 2)
	// left: an unconfirmed object of a relocation that lost.
	leftReq := left.init()
	leftReq.RoutingGeneration = 2
	leftover := db{obj: newObjectID(), uuid: left.uuid, account: "a"}
	_, err := th.Init(ctx, leftover.obj, leftReq)
	require.NoError(t, err)
	// kept: the catalog went back to an older object.
	th.cat.setObject(kept.uuid, "a", kept.obj, 3)
	rep = th.beat()
	require.Equal(t, 1, rep.Superseded)
	_, err = th.Query(ctx, old.obj, old.id(), q("SELECT 1"))
	require.ErrorIs(t, err, ErrDeleted, "a superseded object serves nothing")
	require.Zero(t, rep.LeftoversKilled, "not past the creation grace yet")
	th.cat.setObject(kept.uuid, "a", newObjectID(), 2)

	th.clock.Advance(th.cfg.CreationGrace)
	rep = th.beat()
	require.Equal(t, 1, rep.LeftoversKilled)
	require.Equal(t, 1, rep.OlderHeld)
	assert.Contains(t, th.cat.fencedObjects, leftover.obj)
	_, err = th.Query(ctx, leftover.obj, leftover.id(), q("SELECT 1"))
	require.ErrorIs(t, err, ErrDeleted)
	_, err = th.Query(ctx, left.obj, left.id(), q("SELECT 1"))
	require.NoError(t, err, "the object the catalog names is untouched")
	_, err = th.Query(ctx, kept.obj, kept.id(), q("SELECT 1"))
	require.NoError(t, err, "a confirmed object is never deleted for an older catalog answer")
	kinds := map[string]bool{}
	for _, a := range th.Alarms() {
		kinds[a.Kind] = true
	}
	assert.True(t, kinds["superseded"])
	assert.True(t, kinds["older_object"])

	// A stale answer that names another object at a newer generation is
	// re-read linearizably: the truth (this object) keeps it.
	th.cat.setObject(kept.uuid, "a", kept.obj, 3)
	th.cat.mu.Lock()
	th.cat.staleUnknown = nil
	th.cat.mu.Unlock()
	rep = th.beat()
	assert.Zero(t, rep.Superseded)

	// Declared lost.
	assert.False(t, th.Status().DeclaredLost)
	th.cat.mu.Lock()
	th.cat.hostState = fsm.HostStateLost
	th.cat.mu.Unlock()
	require.NoError(t, th.Register(ctx))
	assert.True(t, th.Status().DeclaredLost)
}

// TestImportFinalBookmark: with history, an import's final_bookmark is the
// time-travel bookmark right after it (D1's meaning): restoring to it after
// later writes gets the imported state back.
func TestImportFinalBookmark(t *testing.T) {
	dir, err := history.NewDirStore(t.TempDir())
	require.NoError(t, err)
	th := historyHost(t, dir)
	srv := serve(t, th)
	d := newDB("acct")
	th.mustInit(t, d)
	sql := "CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT, r INTEGER);\nINSERT INTO t VALUES (1, 'imported', 7);\n"
	code, env := upload(t, srv, d, "f.sql", sql)
	require.Equal(t, 200, code, "%+v", env)
	code, env = call(t, srv.Client(), srv, "POST", "/v1/objects/"+d.obj+"/import/ingest", &d, map[string]string{"etag": md5hex(sql), "filename": "f.sql"})
	require.Equal(t, 200, code, "%+v", env)
	st := waitImport(t, srv, d, "f.sql")
	require.Equal(t, "complete", st.Status, "%+v", st)
	_, err = history.ParseBookmark(d.uuid, history.Bookmark(st.Result.FinalBookmark))
	require.NoError(t, err, "final_bookmark %q is a bookmark of the database", st.Result.FinalBookmark)
	imported := th.rowsOf(t, d)
	th.clock.Advance(time.Second)
	th.exec(t, d, "DELETE FROM t")
	_, err = th.Restore(context.Background(), d.obj, st.Result.FinalBookmark, "", 0)
	require.NoError(t, err)
	assert.Equal(t, imported, th.rowsOf(t, d))
}
