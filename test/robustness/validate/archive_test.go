package validate

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/objecthost/history"
	"github.com/shoaldb/shoal/objecthost/sqlexec"
)

// archivedDB captures a small database into a directory archive the way
// an object host does, closes it cleanly, and returns it as a host object.
func archivedDB(t *testing.T) (Object, *history.Archive, string) {
	dir := t.TempDir()
	storeDir := filepath.Join(dir, "archive")
	store, err := history.NewDirStore(storeDir)
	require.NoError(t, err)
	path := filepath.Join(dir, "host", "x.db")
	require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
	ship := history.NewShipper(store, history.ShipperOptions{})
	c, err := history.NewCapturer("db1", path, history.CaptureOptions{StagingDir: filepath.Join(dir, "host", "history"), OnAppend: ship.Notify})
	require.NoError(t, err)
	db, err := sqlexec.Open(path, sqlexec.Options{})
	require.NoError(t, err)
	require.NoError(t, c.Attach(context.Background(), db))
	ship.Add(c)
	for _, q := range []string{"CREATE TABLE t (v INTEGER PRIMARY KEY, s TEXT)", "INSERT INTO t (v, s) VALUES (1, 'one')", "INSERT INTO t (v, s) VALUES (2, 'two')"} {
		_, err := db.Execute(context.Background(), sqlexec.Request{Statements: []sqlexec.Statement{{SQL: q}}, Raw: true})
		require.NoError(t, err)
	}
	require.NoError(t, c.Flush())
	require.NoError(t, db.Close())
	require.NoError(t, ship.Sync(context.Background(), c))
	require.NoError(t, c.Close())
	return Object{Host: "h1", ObjectID: "x", DatabaseUUID: "db1", State: "active", Path: path}, history.NewArchive(store), storeDir
}

// The archive check must fail on what it exists for: a file holding what
// the archive lacks, and an archive that does not verify.
func TestArchiveCheckCatchesViolations(t *testing.T) {
	ctx := context.Background()
	o, a, storeDir := archivedDB(t)
	res := CheckArchive(ctx, a, o, nil)
	require.NoError(t, res.Err)
	assert.True(t, ArchiveConsistent([]ArchiveCheck{res}).OK(), "a cleanly archived database: %+v", res)
	assert.Positive(t, res.Verify.Records)

	// A commit the archive never saw (written behind the capturer's back).
	db, err := sql.Open("sqlite3", "file:"+o.Path)
	require.NoError(t, err)
	_, err = db.Exec("INSERT INTO t (v, s) VALUES (3, 'not archived')")
	require.NoError(t, err)
	require.NoError(t, db.Close())
	res = CheckArchive(ctx, a, o, nil)
	require.NoError(t, res.Err)
	assert.Contains(t, res.Mismatch, "not archived")
	assert.Len(t, ArchiveConsistent([]ArchiveCheck{res}).Violations, 1)

	// A flipped byte in an archived segment.
	var seg string
	require.NoError(t, filepath.Walk(storeDir, func(p string, info os.FileInfo, err error) error {
		if err == nil && !info.IsDir() && strings.Contains(p, string(filepath.Separator)+"seg"+string(filepath.Separator)) {
			seg = p
		}
		return err
	}))
	require.NotEmpty(t, seg, "an archived segment")
	b, err := os.ReadFile(seg)
	require.NoError(t, err)
	b[len(b)/2] ^= 0xff
	require.NoError(t, os.WriteFile(seg, b, 0o644))
	res = CheckArchive(ctx, a, o, nil)
	assert.ErrorIs(t, res.Err, history.ErrCorrupt)
	assert.Len(t, ArchiveConsistent([]ArchiveCheck{res}).Violations, 1)

	// An object never opened has no file and no history: not checked.
	none := CheckArchive(ctx, a, Object{Host: "h1", ObjectID: "y", DatabaseUUID: "db2", State: "active", Path: filepath.Join(t.TempDir(), "y.db")}, nil)
	assert.True(t, none.NoFile)
	assert.Equal(t, 0, ArchiveConsistent([]ArchiveCheck{none}).Checked)
}

// The archived-durability check at a kill: values read back from the
// archive's newest point; an acknowledged insert missing there, and an
// archive that cannot be read, are violations; an excused kill is not
// checked.
func TestArchivedWritesKept(t *testing.T) {
	_, a, _ := archivedDB(t)
	vals, err := ArchivedValues(context.Background(), a, "db1")
	require.NoError(t, err)
	assert.Equal(t, map[int64]bool{1: true, 2: true}, vals, "the archive's newest point holds both inserts")
	_, err = ArchivedValues(context.Background(), a, "never-archived")
	assert.Error(t, err, "a database with nothing archived")

	kept := ArchivedAtKill{Host: "h2", When: "after kill -9 of h2 at 3s", Acked: map[string][]int64{"db1": {1, 2}}, Values: map[string]map[int64]bool{"db1": vals}}
	r := ArchivedWritesKept([]ArchivedAtKill{kept})
	assert.True(t, r.OK(), "%v", r.Violations)
	assert.Equal(t, 2, r.Checked)

	lost := kept
	lost.Acked = map[string][]int64{"db1": {1, 2, 3}}
	r = ArchivedWritesKept([]ArchivedAtKill{lost})
	require.Len(t, r.Violations, 1)
	assert.Contains(t, r.Violations[0], "1 acknowledged inserts not in the archive (values [3])")

	unreadable := ArchivedAtKill{Host: "h2", When: "w", Acked: map[string][]int64{"db2": {7}}, Errs: map[string]string{"db2": "latest: no snapshot"}}
	r = ArchivedWritesKept([]ArchivedAtKill{unreadable})
	require.Len(t, r.Violations, 1)
	assert.Contains(t, r.Violations[0], "archive unreadable")

	excused := lost
	excused.Excused = "the object store was stopped"
	r = ArchivedWritesKept([]ArchivedAtKill{excused})
	assert.True(t, r.OK())
	assert.Equal(t, 0, r.Checked)
	assert.Contains(t, r.Note, "1 excused")
}
