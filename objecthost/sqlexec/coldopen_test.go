package sqlexec

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A database under a symbolic link to a directory opens (a data
// directory on another disk): the VFS's xFullPathname no longer walks the
// path with an lstat per component, which refused any symbolic link in
// the path (SQLITE_OPEN_NOFOLLOW); a symbolic link as the database file
// itself is still refused, and relative and unclean paths still open
// (SQLite's own xFullPathname).
func TestOpenPaths(t *testing.T) {
	dir := t.TempDir()
	real := filepath.Join(dir, "real")
	require.NoError(t, os.Mkdir(real, 0o755))
	link := filepath.Join(dir, "link")
	require.NoError(t, os.Symlink(real, link))

	db, err := Open(filepath.Join(link, "a.db"), Options{ReadConns: 1})
	require.NoError(t, err, "a symbolic link among the directories is followed")
	run(t, db, stmt("CREATE TABLE t (v)"), stmt("INSERT INTO t VALUES (1)"))
	require.NoError(t, db.Close())
	_, err = os.Stat(filepath.Join(real, "a.db-wal"))
	require.NoError(t, err, "the WAL is beside the file, through the link")

	require.NoError(t, os.Symlink(filepath.Join(real, "a.db"), filepath.Join(real, "b.db")))
	_, err = Open(filepath.Join(real, "b.db"), Options{ReadConns: 1})
	require.Error(t, err, "a symbolic link as the database file is refused")

	// Unclean and relative names go to SQLite's own xFullPathname.
	for _, p := range []string{real + "/./a.db", real + "//a.db", real + "/../real/a.db"} {
		db, err := Open(p, Options{ReadConns: 1})
		require.NoError(t, err, p)
		res := run(t, db, stmt("SELECT count(*) AS n FROM t"))
		assert.EqualValues(t, 1, res[0].Results.(Rows)[0].Values()[0], p)
		require.NoError(t, db.Close())
	}
	t.Chdir(real)
	db, err = Open("a.db", Options{ReadConns: 1})
	require.NoError(t, err)
	res := run(t, db, stmt("SELECT count(*) AS n FROM t"))
	assert.EqualValues(t, 1, res[0].Results.(Rows)[0].Values()[0])
	require.NoError(t, db.Close())
}

type countingHook struct {
	commits int
	frames  int
}

func (h *countingHook) Committed(w HookConn) error {
	h.commits++
	h.frames = w.WALFrames()
	return nil
}

// Options.CommitHook attaches the hook inside Open, as SetCommitHook
// would: the attach function runs in a write transaction (a checkpoint
// fails there), automatic checkpoints are off from then on (the WAL keeps
// every frame until the hook checkpoints), the hook sees every commit;
// a failing attach fails Open and leaves the file free to open again.
func TestOpenAttachesCommitHook(t *testing.T) {
	path := filepath.Join(t.TempDir(), "h.db")
	h := &countingHook{}
	attached := false
	db, err := Open(path, Options{ReadConns: 1, CommitHook: h, HookAttach: func(w HookConn) error {
		attached = true
		_, _, err := w.Checkpoint()
		assert.Error(t, err, "attach runs inside a write transaction")
		return nil
	}})
	require.NoError(t, err)
	assert.True(t, attached, "attached before Open returned")
	assert.Equal(t, 1, h.commits, "the attach transaction's commit, as after SetCommitHook")
	run(t, db, stmt("CREATE TABLE t (v)"))
	const n = 1200 // past SQLite's automatic checkpoint (1,000 frames)
	for i := range n {
		run(t, db, stmt("INSERT INTO t VALUES (?)", i))
	}
	assert.Equal(t, n+2, h.commits, "every commit seen")
	assert.Greater(t, h.frames, 1000, "no automatic checkpoint while a hook is attached")
	require.ErrorIs(t, db.SetCommitHook(context.Background(), h, nil), ErrHookAttached)
	require.NoError(t, db.Close())

	boom := errors.New("boom")
	_, err = Open(path, Options{ReadConns: 1, CommitHook: h, HookAttach: func(HookConn) error { return boom }})
	require.ErrorIs(t, err, boom)
	db, err = Open(path, Options{ReadConns: 1})
	require.NoError(t, err, "a failed Open released the file")
	res := run(t, db, stmt("SELECT count(*) AS n FROM t"))
	assert.EqualValues(t, n, res[0].Results.(Rows)[0].Values()[0])
	require.NoError(t, db.Close())
}

// sqlexec's process-wide SQLite options apply (vfs.c, shoal_global_config):
// set before SQLite initialized — this test process, like a host, opens
// its first database through sqlexec —, memory statistics are off (no
// mutex per allocation; the heap counter stays 0 after opens and
// queries) and the page cache makes no initial bulk allocation.
func TestGlobalConfig(t *testing.T) {
	db, err := Open(filepath.Join(t.TempDir(), "g.db"), Options{ReadConns: 1})
	require.NoError(t, err)
	run(t, db, stmt("CREATE TABLE t (v)"), stmt("INSERT INTO t VALUES (1)"), stmt("SELECT v FROM t"))
	require.Equal(t, 0, globalConfig(), "sqlite3_config refused: SQLite was initialized before sqlexec's first open")
	assert.Zero(t, memoryUsed(), "memory statistics are off")
	require.NoError(t, db.Close())
}
