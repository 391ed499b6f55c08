package validate

import (
	"database/sql"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// UsedBytes is the pages in use of what a killed host left, WAL replayed:
// deleted rows' free pages and the WAL's length are not counted.
func TestUsedBytes(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "a.db")
	db, err := sql.Open("sqlite3", "file:"+p+"?_journal_mode=WAL")
	require.NoError(t, err)
	defer db.Close()
	db.SetMaxOpenConns(1)
	for _, q := range []string{
		"PRAGMA wal_autocheckpoint = 0",
		"CREATE TABLE t (x INTEGER PRIMARY KEY, y)",
		"WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 30) INSERT INTO t (y) SELECT randomblob(3000) FROM n",
		"DELETE FROM t WHERE x > 5",
	} {
		_, err := db.Exec(q)
		require.NoError(t, err, q)
	}
	var want, free int64
	require.NoError(t, db.QueryRow("SELECT (p.page_count - f.freelist_count) * s.page_size, f.freelist_count FROM pragma_page_count() p, pragma_freelist_count() f, pragma_page_size() s").Scan(&want, &free))
	require.Positive(t, free, "the delete left free pages")
	wal, err := os.Stat(p + "-wal")
	require.NoError(t, err)
	require.Positive(t, wal.Size(), "the frames are still in the WAL")

	got, err := UsedBytes(Object{Path: p}) // the WAL copied with the file, as a kill -9 leaves them
	require.NoError(t, err)
	assert.Equal(t, want, got)

	got, err = UsedBytes(Object{Path: filepath.Join(dir, "never-opened.db")})
	require.NoError(t, err)
	assert.Zero(t, got)
}
