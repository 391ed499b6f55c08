package objecthost

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	v4 "github.com/shoaldb/shoal/internal/v4"
	"github.com/shoaldb/shoal/objecthost/history"
)

// TestTimeTravelHTTP: bookmarks and restores through the host's HTTP API
// (real HTTP on loopback, real SQLite files, a directory archive): restore
// to a bookmark, undo it with the previous bookmark, restore by timestamp,
// survive a host restart, D1-style errors for bad input and the restore
// rate limit.
func TestTimeTravelHTTP(t *testing.T) {
	archive := t.TempDir()
	th := newTestHost(t, func(c *Config) {
		store, err := history.NewDirStore(archive)
		require.NoError(t, err)
		c.History = &HistoryConfig{Store: store, Shipper: history.ShipperOptions{MaxLag: 100 * time.Millisecond}, MaxRestores: 3}
	})
	srv := serve(t, th)
	c := srv.Client()
	d := newDB("acct")
	th.mustInit(t, d)
	base := "/v1/objects/" + d.obj
	q := func(sql string) json.RawMessage {
		t.Helper()
		status, env := call(t, c, srv, "POST", base+"/query", &d, map[string]any{"sql": sql})
		require.Equal(t, http.StatusOK, status, "%s: %+v", sql, env)
		return env.Result
	}
	rows := func() string {
		var res []struct {
			Results []map[string]any `json:"results"`
		}
		require.NoError(t, json.Unmarshal(q("SELECT id, v, r FROM t ORDER BY id"), &res))
		b, _ := json.Marshal(res[0].Results)
		return string(b)
	}
	bookmark := func(query string) string {
		t.Helper()
		status, env := call(t, c, srv, "GET", base+"/time_travel/bookmark"+query, &d, nil)
		require.Equal(t, http.StatusOK, status, "%+v", env)
		var r BookmarkResult
		require.NoError(t, json.Unmarshal(env.Result, &r))
		return r.Bookmark
	}
	restore := func(query string) RestoreResult {
		t.Helper()
		status, env := call(t, c, srv, "POST", base+"/time_travel/restore"+query, &d, nil)
		require.Equal(t, http.StatusOK, status, "%+v", env)
		var r RestoreResult
		require.NoError(t, json.Unmarshal(env.Result, &r))
		return r
	}

	q("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT, r INTEGER DEFAULT (random()))")
	q("INSERT INTO t(v) VALUES ('one'), ('two')")
	state1, b1 := rows(), bookmark("")
	th.clock.Advance(time.Minute)
	t1 := th.clock.Now()
	th.clock.Advance(time.Minute)
	q("DELETE FROM t WHERE v = 'one'")
	q("INSERT INTO t(v) VALUES ('three')")
	state2, b2 := rows(), bookmark("")
	assert.Less(t, b1, b2)
	assert.Regexp(t, `^[0-9a-f]{8}-[0-9a-f]{8}-[0-9a-f]{8}-[0-9a-f]{64}$`, b2)
	assert.Equal(t, b1, bookmark(fmt.Sprintf("?timestamp=%d", t1.Unix())), "a timestamp's bookmark is the last commit before it")

	r := restore("?bookmark=" + b1)
	assert.Equal(t, b2, r.PreviousBookmark)
	assert.NotEmpty(t, r.Message)
	assert.Equal(t, state1, rows(), "restored")
	assert.Equal(t, r.Bookmark, bookmark(""))

	r2 := restore("?bookmark=" + r.PreviousBookmark)
	assert.Equal(t, state2, rows(), "undone")

	// By timestamp (ISO-8601, as wrangler sends it).
	th.clock.Advance(time.Minute)
	restore("?timestamp=" + t1.Format(time.RFC3339))
	assert.Equal(t, state1, rows())

	// The 4th restore in 10 minutes is refused (D1: 10 per 10 minutes; 3
	// here). The window is in memory: a host restart resets it.
	status, env := call(t, c, srv, "POST", base+"/time_travel/restore?bookmark="+b1, &d, nil)
	assert.Equal(t, http.StatusTooManyRequests, status)
	assert.Equal(t, v4.CodeRateLimited, errCode(env), "%+v", env)
	assert.Equal(t, state1, rows())

	// A host restart keeps history and the database.
	th.reopen(t)
	srv2 := serve(t, th)
	srv, c = srv2, srv2.Client()
	assert.Equal(t, state1, rows())
	q("INSERT INTO t(v) VALUES ('after restart')")

	// Errors: D1 style, nothing changed.
	for _, tc := range []struct {
		query  string
		status int
		code   int
	}{
		{"?bookmark=nonsense", http.StatusBadRequest, v4.CodeInvalidRequest},
		{"?bookmark=" + strings.Replace(b1, "0", "1", 1), http.StatusBadRequest, v4.CodeInvalidRequest},
		{"", http.StatusBadRequest, v4.CodeInvalidRequest},
		{"?timestamp=yesterday", http.StatusBadRequest, v4.CodeInvalidRequest},
		{fmt.Sprintf("?timestamp=%d", th.clock.Now().Add(-40*24*time.Hour).Unix()), http.StatusBadRequest, v4.CodeInvalidRequest},
	} {
		status, env := call(t, c, srv, "POST", base+"/time_travel/restore"+tc.query, &d, nil)
		assert.Equal(t, tc.status, status, tc.query)
		assert.Equal(t, tc.code, errCode(env), "%s: %+v", tc.query, env)
	}
	other := d
	other.uuid = "00000000-0000-0000-0000-000000000000"
	status, env = call(t, c, srv, "POST", base+"/time_travel/restore?bookmark="+b1, &other, nil)
	assert.Equal(t, http.StatusMisdirectedRequest, status)
	assert.Equal(t, v4.CodeWrongHost, errCode(env))
	assert.Contains(t, rows(), "after restart", "refused restores changed nothing")
	_ = r2

	// The archive holds every generation, verified end to end.
	store, err := history.NewDirStore(archive)
	require.NoError(t, err)
	require.NoError(t, th.Close())
	vs, err := history.NewArchive(store).Verify(t.Context(), d.uuid)
	require.NoError(t, err)
	assert.Equal(t, 4, vs.Generations, "the first and one per restore")
}

// An export at a bookmark dumps the database as it was then, from a
// restored copy: the live database is untouched; a malformed bookmark is
// refused at the start, before any download.
func TestExportAtBookmark(t *testing.T) {
	archive := t.TempDir()
	th := newTestHost(t, func(c *Config) {
		store, err := history.NewDirStore(archive)
		require.NoError(t, err)
		c.History = &HistoryConfig{Store: store, Shipper: history.ShipperOptions{MaxLag: 100 * time.Millisecond}}
	})
	srv := serve(t, th)
	c := srv.Client()
	d := newDB("acct")
	th.mustInit(t, d)
	base := "/v1/objects/" + d.obj
	exec := func(sql string) {
		t.Helper()
		status, env := call(t, c, srv, "POST", base+"/query", &d, map[string]any{"sql": sql})
		require.Equal(t, http.StatusOK, status, "%s: %+v", sql, env)
	}
	exec("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)")
	exec("INSERT INTO t VALUES (1, 'then')")
	status, env := call(t, c, srv, "GET", base+"/time_travel/bookmark", &d, nil)
	require.Equal(t, http.StatusOK, status, "%+v", env)
	var bm BookmarkResult
	require.NoError(t, json.Unmarshal(env.Result, &bm))
	exec("UPDATE t SET v = 'now'")
	exec("CREATE TABLE later (x)")

	status, env = call(t, c, srv, "POST", base+"/export", &d, map[string]any{"bookmark": bm.Bookmark, "retention_days": "30"})
	require.Equal(t, http.StatusOK, status, "%+v", env)
	var check ExportCheck
	require.NoError(t, json.Unmarshal(env.Result, &check))
	assert.Equal(t, []string{"t"}, check.Tables, "the tables as of the bookmark")

	download := func(query string) (int, string) {
		req, err := http.NewRequest(http.MethodGet, srv.URL+base+"/export/download"+query, nil)
		require.NoError(t, err)
		req.Header.Set(HeaderDatabase, d.uuid)
		req.Header.Set(HeaderAccount, d.account)
		resp, err := c.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(b)
	}
	code, then := download("?bookmark=" + url.QueryEscape(bm.Bookmark))
	require.Equal(t, http.StatusOK, code, then)
	assert.Contains(t, then, `'then'`)
	assert.NotContains(t, then, `'now'`)
	assert.NotContains(t, then, "later")
	code, now := download("")
	require.Equal(t, http.StatusOK, code, now)
	assert.Contains(t, now, `'now'`, "the live database is untouched")
	assert.Contains(t, now, "later")

	status, env = call(t, c, srv, "POST", base+"/export", &d, map[string]any{"bookmark": "nope"})
	assert.Equal(t, http.StatusBadRequest, status, "%+v", env)
}

// gatedStore holds every Put while closed (a slow or stalled archive
// store), signalling each Put that starts waiting on entered.
type gatedStore struct {
	history.Store
	open    chan struct{}
	entered chan struct{}
}

func (s *gatedStore) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	select {
	case s.entered <- struct{}{}:
	default:
	}
	select {
	case <-s.open:
	case <-ctx.Done():
		return ctx.Err()
	}
	return s.Store.Put(ctx, key, r, size)
}

// TestQueryDuringRestore: a query that arrives while its database is being
// restored is refused as retryable (503, 7503, "being restored"), not
// answered "internal error" (500, 7000, which tells a client nothing about
// whether its write happened). Found by the robustness suite: register
// writes racing the time-travel generator's restores.
func TestQueryDuringRestore(t *testing.T) {
	dir, err := history.NewDirStore(t.TempDir())
	require.NoError(t, err)
	// Closed from the start: nothing Puts before the restore does.
	store := &gatedStore{Store: dir, open: make(chan struct{}), entered: make(chan struct{}, 1)}
	th := newTestHost(t, func(c *Config) {
		// Nothing ships on its own: the restore's own shipment is the Put
		// the gate holds.
		c.History = &HistoryConfig{Store: store, Shipper: history.ShipperOptions{MaxLag: time.Hour}}
	})
	srv := serve(t, th)
	c := srv.Client()
	d := newDB("acct")
	th.mustInit(t, d)
	base := "/v1/objects/" + d.obj
	status, env := call(t, c, srv, "POST", base+"/query", &d, map[string]any{"sql": "CREATE TABLE t(v INTEGER)"})
	require.Equal(t, http.StatusOK, status, "%+v", env)
	status, env = call(t, c, srv, "GET", base+"/time_travel/bookmark", &d, nil)
	require.Equal(t, http.StatusOK, status, "%+v", env)
	var b BookmarkResult
	require.NoError(t, json.Unmarshal(env.Result, &b))
	status, env = call(t, c, srv, "POST", base+"/query", &d, map[string]any{"sql": "INSERT INTO t VALUES (1)"})
	require.Equal(t, http.StatusOK, status, "%+v", env)

	restored := make(chan int, 1)
	go func() {
		status, _ := call(t, c, srv, "POST", base+"/time_travel/restore?bookmark="+url.QueryEscape(b.Bookmark), &d, nil)
		restored <- status
	}()
	select {
	case <-store.entered: // the restore waits on the store, its database closed
	case <-time.After(10 * time.Second):
		t.Fatal("the restore never reached the store")
	}
	status, env = call(t, c, srv, "POST", base+"/query", &d, map[string]any{"sql": "INSERT INTO t VALUES (2)"})
	assert.Equal(t, http.StatusServiceUnavailable, status, "%+v", env)
	assert.Equal(t, v4.CodeUnavailable, errCode(env), "%+v", env)
	close(store.open)
	assert.Equal(t, http.StatusOK, <-restored)
}

// refusingStore refuses every Put while refuse is set (a store answering
// 503), and passes through otherwise.
type refusingStore struct {
	history.Store
	refuse atomic.Bool
}

func (s *refusingStore) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	if s.refuse.Load() {
		return errors.New("503 SlowDown")
	}
	return s.Store.Put(ctx, key, r, size)
}

// TestArchivedUnconfirmedIs503: with durability = "archived", a write the
// store did not confirm is committed on the host but not acknowledged; the
// answer must say "unavailable, retry" with a 5xx status (503, 7503) — a
// 4xx tells a client its request was refused, i.e. not carried out, which
// is false here (the robustness suite found phantom rows and a
// non-linearizable register from exactly that 400).
func TestArchivedUnconfirmedIs503(t *testing.T) {
	dir, err := history.NewDirStore(t.TempDir())
	require.NoError(t, err)
	store := &refusingStore{Store: dir}
	th := newTestHost(t, func(c *Config) {
		c.History = &HistoryConfig{Store: store, Archived: true, Shipper: history.ShipperOptions{MaxLag: 100 * time.Millisecond, PutTimeout: time.Second}}
	})
	srv := serve(t, th)
	c := srv.Client()
	d := newDB("acct")
	th.mustInit(t, d)
	base := "/v1/objects/" + d.obj
	status, env := call(t, c, srv, "POST", base+"/query", &d, map[string]any{"sql": "CREATE TABLE t(v INTEGER)"})
	require.Equal(t, http.StatusOK, status, "%+v", env)

	store.refuse.Store(true)
	status, env = call(t, c, srv, "POST", base+"/query", &d, map[string]any{"sql": "INSERT INTO t VALUES (1)"})
	assert.Equal(t, http.StatusServiceUnavailable, status, "%+v", env)
	assert.Equal(t, v4.CodeUnavailable, errCode(env), "%+v", env)

	store.refuse.Store(false)
	require.Eventually(t, func() bool {
		status, env = call(t, c, srv, "POST", base+"/query", &d, map[string]any{"sql": "SELECT count(*) AS n FROM t"})
		return status == http.StatusOK
	}, 30*time.Second, 50*time.Millisecond, "%+v", env)
	assert.Contains(t, string(env.Result), `"n":1`, "the unconfirmed write was committed on the host")
}

// TestArchivedServesAfterRestart: an archived host serves its databases
// after a restart (the robustness suite saw every database of an archived
// host answer 7503 forever after one).
func TestArchivedServesAfterRestart(t *testing.T) {
	dir, err := history.NewDirStore(t.TempDir())
	require.NoError(t, err)
	th := newTestHost(t, func(c *Config) {
		c.History = &HistoryConfig{Store: dir, Archived: true, Shipper: history.ShipperOptions{MaxLag: 100 * time.Millisecond, PutTimeout: time.Second}}
	})
	d := newDB("acct")
	th.mustInit(t, d)
	ctx := context.Background()
	_, err = th.Query(ctx, d.obj, d.id(), q("CREATE TABLE t(v INTEGER)"))
	require.NoError(t, err)
	_, err = th.Query(ctx, d.obj, d.id(), q("INSERT INTO t VALUES (1)"))
	require.NoError(t, err)
	th.reopen(t)
	_, err = th.Query(ctx, d.obj, d.id(), q("SELECT count(*) FROM t"))
	require.NoError(t, err, "a read after the restart")
	_, err = th.Query(ctx, d.obj, d.id(), q("INSERT INTO t VALUES (2)"))
	require.NoError(t, err, "a write after the restart")
}

// A restore replaces the file whole: the host publishes the restored
// database's size (the measure a write publishes), or the catalog keeps
// the size from before the restore until the next write.
func TestRestorePublishesSize(t *testing.T) {
	ctx := context.Background()
	th := newTestHost(t, func(c *Config) {
		store, err := history.NewDirStore(t.TempDir())
		require.NoError(t, err)
		c.History = &HistoryConfig{Store: store, Shipper: history.ShipperOptions{MaxLag: 100 * time.Millisecond}}
	})
	d := newDB("acct")
	th.mustInit(t, d)
	th.exec(t, d, "CREATE TABLE t (x INTEGER PRIMARY KEY, y)")
	small, err := th.Info(ctx, d.obj)
	require.NoError(t, err)
	b, err := th.Bookmark(ctx, d.obj, "", 0)
	require.NoError(t, err)
	th.clock.Advance(time.Minute)
	th.exec(t, d, "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 30) INSERT INTO t (y) SELECT randomblob(3000) FROM n")
	sizes := th.sink.Sizes()
	require.Greater(t, sizes[len(sizes)-1].SizeBytes, small.FileSize, "the write grew it")

	_, err = th.Restore(ctx, d.obj, b.Bookmark, "", 0)
	require.NoError(t, err)
	sizes = th.sink.Sizes()
	assert.Equal(t, small.FileSize, sizes[len(sizes)-1].SizeBytes, "the restored size is published")
	info, err := th.Info(ctx, d.obj)
	require.NoError(t, err)
	assert.Equal(t, small.FileSize, info.FileSize, "and is what a GET measures")
}

// TestColdReopenSkipsRecovery: a database whose handle was evicted after a
// clean close reopens from the state its capturer left (no staging
// recovery), its history goes on in the same generation without a gap,
// a restart recovers from disk instead (the state is memory only), and a
// restore drops it (the restored area is recovered at the next open).
func TestColdReopenSkipsRecovery(t *testing.T) {
	store, err := history.NewDirStore(t.TempDir())
	require.NoError(t, err)
	th := newTestHost(t, func(c *Config) {
		c.History = &HistoryConfig{Store: store, SweepInterval: -1, Shipper: history.ShipperOptions{MaxLag: 100 * time.Millisecond}}
	})
	ctx := context.Background()
	d := newDB("acct")
	th.mustInit(t, d)
	capOf := func() *history.Capturer {
		th.hist.mu.Lock()
		defer th.hist.mu.Unlock()
		return th.hist.caps[d.obj]
	}
	evict := func() { <-th.handles.evict(d.obj) }
	_, err = th.Query(ctx, d.obj, d.id(), q("CREATE TABLE t(v INTEGER)"))
	require.NoError(t, err)
	require.False(t, capOf().Reopened(), "the first open recovers")
	for i := range 3 {
		evict()
		_, err = th.Query(ctx, d.obj, d.id(), q(fmt.Sprintf("INSERT INTO t VALUES (%d)", i)))
		require.NoError(t, err)
		assert.True(t, capOf().Reopened(), "open %d after a clean close: no recovery", i)
	}
	cur := capOf().Current()
	assert.EqualValues(t, 4, cur.Txid, "one record per commit, same generation")

	// A restart: the state is gone, the first open recovers from disk and
	// proves continuity.
	th.reopen(t)
	_, err = th.Query(ctx, d.obj, d.id(), q("INSERT INTO t VALUES (10)"))
	require.NoError(t, err)
	assert.False(t, capOf().Reopened(), "after a restart: recovered from disk")
	assert.Equal(t, cur.Gen, capOf().Current().Gen)
	assert.Equal(t, cur.Txid+1, capOf().Current().Txid)
	bm, err := th.Bookmark(ctx, d.obj, "", 0)
	require.NoError(t, err)

	// A restore rewrites the area: the next open must not start from a
	// state the restore replaced.
	evict()
	_, err = th.Query(ctx, d.obj, d.id(), q("INSERT INTO t VALUES (11)"))
	require.NoError(t, err)
	_, err = th.Restore(ctx, d.obj, bm.Bookmark, "", 0)
	require.NoError(t, err)
	res, err := th.Query(ctx, d.obj, d.id(), q("SELECT count(*) AS n FROM t"))
	require.NoError(t, err)
	assert.False(t, capOf().Reopened(), "after a restore: recovered from disk")
	assert.Contains(t, fmt.Sprint(res[0].Results), "[4]", "the state at the bookmark: 4 rows")
	_, err = th.Query(ctx, d.obj, d.id(), q("INSERT INTO t VALUES (12)"))
	require.NoError(t, err)
	require.NoError(t, th.Host.Close())
	vs, err := history.NewArchive(store).Verify(ctx, d.uuid)
	require.NoError(t, err, "the archive's chains: no gap, no repeat")
	assert.Equal(t, 2, vs.Generations)
}
