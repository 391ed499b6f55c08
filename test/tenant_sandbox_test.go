package test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/test/harness"
)

// TestSQLCannotLeaveItsFile sends, through a real edge to a real object
// host, every way we know for SQL to reach beyond its own database file:
// other files (ATTACH, VACUUM INTO, load_extension, the CLI's fileio
// functions, temp_store_directory), raw pages (sqlite_dbpage, dbstat,
// writable_schema), the connection's own settings, temporary schema,
// virtual table modules D1 does not offer, and the reserved _cf_ names.
// Each is refused with a D1-style SQL error (400/7500 unless noted), no
// file appears where the SQL pointed, and the database is unchanged.
func TestSQLCannotLeaveItsFile(t *testing.T) {
	c := harness.NewE2ECluster(t)
	acct, bearer := c.SetupAccount(t, "paid")
	d := createDB(t, c.EdgeURL[0], acct, bearer, "sandbox")
	q := c.EdgeURL[0] + "/client/v4/accounts/" + acct + "/d1/database/" + d.UUID + "/query"
	a := harness.Call(t, "POST", q, bearer, map[string]any{"batch": []any{
		map[string]any{"sql": "CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)"},
		map[string]any{"sql": "INSERT INTO t VALUES (1, 'keep')"},
		map[string]any{"sql": "CREATE VIRTUAL TABLE docs USING fts5(body)"},
	}})
	require.Equal(t, 200, a.Status, "%s", a.Raw)

	outside := t.TempDir()
	target := filepath.Join(outside, "stolen.db")
	cases := []struct {
		name, sql string
		code      int // 0: 7500
	}{
		{"attach", "ATTACH DATABASE '" + target + "' AS x", 0},
		{"attach-memory", "ATTACH ':memory:' AS m", 0},
		{"attach-uri", "ATTACH 'file:" + target + "?mode=rwc' AS x", 0},
		{"detach", "DETACH DATABASE main", 0},
		{"vacuum", "VACUUM", 0},
		{"vacuum-into", "VACUUM INTO '" + target + "'", 0},
		{"vacuum-main-into", "VACUUM main INTO '" + target + "'", 0},
		{"load-extension", "SELECT load_extension('/tmp/evil.so')", 0},
		{"load-extension-entry", "SELECT load_extension('libc.so.6', 'system')", 0},
		{"readfile", "SELECT readfile('/etc/passwd')", 0},
		{"writefile", "SELECT writefile('" + target + "', 'x')", 0},
		{"edit", "SELECT edit('x', 'vi')", 0},
		{"fsdir", "SELECT * FROM fsdir('/')", 0},
		{"sqlite-dbpage", "SELECT * FROM sqlite_dbpage", 0},
		{"sqlite-dbpage-write", "INSERT INTO sqlite_dbpage VALUES (1, zeroblob(4096))", 0},
		{"dbstat", "SELECT * FROM dbstat", 0},
		{"writable-schema", "PRAGMA writable_schema = ON", 0},
		{"writable-schema-write", "UPDATE sqlite_schema SET sql = 'CREATE TABLE t(x)' WHERE name = 't'", 0},
		{"temp-store-directory", "PRAGMA temp_store_directory = '" + outside + "'", 0},
		{"data-store-directory", "PRAGMA data_store_directory = '" + outside + "'", 0},
		{"temp-store-memory", "PRAGMA temp_store = MEMORY", 0},
		{"mmap-size", "PRAGMA mmap_size = 1073741824", 0},
		{"cache-size", "PRAGMA cache_size = -4000000", 0},
		{"hard-heap-limit", "PRAGMA hard_heap_limit = 1", 0},
		{"soft-heap-limit", "PRAGMA soft_heap_limit = 1", 0},
		{"threads", "PRAGMA threads = 8", 0},
		{"journal-mode", "PRAGMA journal_mode = DELETE", 0},
		{"locking-mode", "PRAGMA locking_mode = EXCLUSIVE", 0},
		{"synchronous", "PRAGMA synchronous = OFF", 0},
		{"max-page-count", "PRAGMA max_page_count = 1000000000", 0},
		{"page-size", "PRAGMA page_size = 65536", 0},
		{"query-only", "PRAGMA query_only = 0", 0},
		{"trusted-schema", "PRAGMA trusted_schema = ON", 0},
		{"recursive-triggers", "PRAGMA recursive_triggers = ON", 0},
		{"database-list", "PRAGMA database_list", 0},
		{"database-list-tvf", "SELECT * FROM pragma_database_list", 0},
		{"compile-options", "PRAGMA compile_options", 0},
		{"temp-table", "CREATE TEMP TABLE tt (x)", 0},
		{"temp-view", "CREATE TEMP VIEW tv AS SELECT 1", 0},
		{"temp-trigger", "CREATE TEMP TRIGGER tr AFTER INSERT ON t BEGIN SELECT 1; END", 0},
		{"rtree", "CREATE VIRTUAL TABLE r USING rtree(id, x0, x1)", 0},
		{"fts4", "CREATE VIRTUAL TABLE f4 USING fts4(body)", 0},
		{"fts5-shadow-write", "INSERT INTO docs_data VALUES (10, x'00')", 0},
		{"fts5-shadow-config", "UPDATE docs_config SET v = 0", 0},
		{"cf-table", "CREATE TABLE _cf_KV (k, v)", 0},
		{"cf-table-case", "CREATE TABLE _CF_kv (k, v)", 0},
		{"cf-rename", "ALTER TABLE t RENAME TO _cf_t", 0},
		{"cf-index", "CREATE INDEX _cf_i ON t (v)", 0},
		{"cf-view", "CREATE VIEW _cf_v AS SELECT 1", 0},
		{"cf-read", "SELECT * FROM _cf_METADATA", 0},
		{"shoal-table", "CREATE TABLE _shoal_meta (x)", 0},
		{"sqlite-sequence-write", "INSERT INTO sqlite_sequence VALUES ('t', 99)", 0},
		{"sqlite-stat-write", "CREATE TABLE sqlite_stat1 (tbl, idx, stat)", 0},
		{"begin", "BEGIN TRANSACTION", 0},
		{"savepoint", "SAVEPOINT s1", 0},
		{"commit", "COMMIT", 0},
		{"sqlite-version", "SELECT sqlite_version()", 0},
		{"sqlite-offset", "SELECT sqlite_offset(v) FROM t", 0},
	}
	for _, tc := range cases {
		a := harness.Call(t, "POST", q, bearer, map[string]any{"sql": tc.sql})
		want := tc.code
		if want == 0 {
			want = 7500
		}
		if !assert.Equal(t, 400, a.Status, "%s: %s → %s", tc.name, tc.sql, a.Raw) {
			continue
		}
		assert.Equal(t, want, a.Code(), "%s: %s", tc.name, a.Raw)
		msg := a.Errors[0].Message
		assert.NotContains(t, msg, outside, "%s: the message echoes no path", tc.name)
		assert.False(t, strings.Contains(msg, "/dbs/") || strings.Contains(msg, ".db"), "%s: the message names no file: %s", tc.name, msg)
	}
	_, err := os.Stat(target)
	assert.True(t, errors.Is(err, os.ErrNotExist), "nothing was written outside the database: %v", err)
	entries, err := os.ReadDir(outside)
	require.NoError(t, err)
	assert.Empty(t, entries)

	// Unchanged: the row, the schema, the settings that matter.
	a = harness.Call(t, "POST", q, bearer, map[string]any{"sql": "SELECT v FROM t WHERE id = 1"})
	require.Equal(t, 200, a.Status, "%s", a.Raw)
	assert.Contains(t, string(a.Result), `"v":"keep"`)
	a = harness.Call(t, "POST", q, bearer, map[string]any{"sql": "SELECT name FROM sqlite_schema WHERE name LIKE '\\_cf\\_%' ESCAPE '\\' OR name LIKE 'sqlite_stat%' OR name IN ('tt','tv','r','f4')"})
	require.Equal(t, 200, a.Status, "%s", a.Raw)
	assert.Contains(t, string(a.Result), `"results":[]`)
	// What stays allowed (D1 allows it): reading the schema, table_info,
	// foreign-key pragmas, FTS5 through its own table.
	for _, sql := range []string{
		"SELECT name FROM sqlite_schema", "PRAGMA table_info(t)", "PRAGMA foreign_keys = ON", "PRAGMA defer_foreign_keys = ON",
		"INSERT INTO docs (body) VALUES ('hello')", "SELECT * FROM docs WHERE docs MATCH 'hello'",
	} {
		a = harness.Call(t, "POST", q, bearer, map[string]any{"sql": sql})
		assert.Equal(t, 200, a.Status, "%s: %s", sql, a.Raw)
	}
	t.Logf("%d ways out refused", len(cases))
}
