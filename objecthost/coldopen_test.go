package objecthost

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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
