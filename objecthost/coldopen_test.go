package objecthost

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/objecthost/history"
)

// A host whose data directory is given relative and through a symbolic
// link (a data directory on another disk) serves its databases, evicted
// and reopened: Open makes the directory absolute, and sqlexec's VFS
// takes a clean absolute path as it is (SQLite's own walk of a relative
// path refused any symbolic link on the way, so every query failed).
func TestRelativeSymlinkedDataDir(t *testing.T) {
	root := t.TempDir()
	require.NoError(t, os.Mkdir(filepath.Join(root, "disk"), 0o755))
	require.NoError(t, os.Symlink(filepath.Join(root, "disk"), filepath.Join(root, "data")))
	t.Chdir(root)
	h, err := Open(Config{ID: "h", Dir: "data/host", Manual: true, MaxOpen: 1})
	require.NoError(t, err)
	defer h.Close()
	ctx := context.Background()
	dbs := []db{newDB("acct"), newDB("acct")}
	for _, d := range dbs {
		_, err := h.Init(ctx, d.obj, d.init())
		require.NoError(t, err)
		_, err = h.Query(ctx, d.obj, d.id(), q("CREATE TABLE t (v); INSERT INTO t VALUES (1)"))
		require.NoError(t, err)
	}
	for range 2 { // each query evicts the other database's handle
		for _, d := range dbs {
			res, err := h.Query(ctx, d.obj, d.id(), q("SELECT count(*) AS n FROM t"))
			require.NoError(t, err)
			assert.Len(t, res, 1)
		}
	}
	_, err = os.Stat(filepath.Join(root, "disk", "host", "index.db"))
	assert.NoError(t, err, "the host's files are on the linked disk")
}

// A shard directory removed while the host runs is made again by the next
// open of a database in it: the host makes each shard directory once per
// process, not at every open, and an open that fails because its
// directory is gone makes it and retries, as the per-open MkdirAll did
// (here the file went with it, so the database opens empty).
func TestShardDirRemovedWhileRunning(t *testing.T) {
	for _, hist := range []bool{false, true} {
		t.Run(map[bool]string{false: "history=off", true: "history=on"}[hist], func(t *testing.T) {
			th := newTestHost(t, func(c *Config) {
				c.MaxOpen = 1
				if hist {
					store, err := history.NewDirStore(t.TempDir())
					require.NoError(t, err)
					c.History = &HistoryConfig{Store: store, SweepInterval: -1}
				}
			})
			ctx := context.Background()
			a, b := newDB("acct"), newDB("acct")
			th.mustInit(t, a)
			th.mustInit(t, b)
			_, err := th.Query(ctx, a.obj, a.id(), q("SELECT 1"))
			require.NoError(t, err)
			_, err = th.Query(ctx, b.obj, b.id(), q("SELECT 1")) // evicts a's handle
			require.NoError(t, err)
			<-th.handles.evict(a.obj)
			require.NoError(t, os.RemoveAll(filepath.Dir(th.path(a.obj))))

			res, err := th.Query(ctx, a.obj, a.id(), q("SELECT 1 AS one"))
			require.NoError(t, err, "the open makes the removed shard directory again")
			assert.Len(t, res, 1)
			_, err = os.Stat(th.path(a.obj))
			assert.NoError(t, err)
		})
	}
}
