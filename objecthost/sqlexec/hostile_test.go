package sqlexec

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	v4 "github.com/shoaldb/shoal/internal/v4"
)

// hostileFiles are paths the corpus tries to create or reach.
var hostileFiles = []string{
	"/tmp/shoal-hostile-vacuum.db",
	"/tmp/shoal-hostile-attach.db",
	"/tmp/shoal-hostile-writefile",
}

func readCorpus(t *testing.T) []string {
	t.Helper()
	f, err := os.Open("testdata/hostile.sql")
	require.NoError(t, err)
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "--") {
			continue
		}
		out = append(out, line)
	}
	require.NoError(t, sc.Err())
	require.Greater(t, len(out), 50)
	return out
}

// fingerprint is the database's logical content (schema and every row of
// every table, read by the host's own connection) plus its directory's
// file names.
func fingerprint(t *testing.T, path string) string {
	t.Helper()
	h := hostConn(t, path)
	rows, err := h.Query("SELECT type, name, tbl_name, coalesce(sql, '') FROM sqlite_schema ORDER BY name")
	require.NoError(t, err)
	var parts, tables []string
	for rows.Next() {
		var typ, name, tbl, sqlText string
		require.NoError(t, rows.Scan(&typ, &name, &tbl, &sqlText))
		parts = append(parts, typ+"|"+name+"|"+tbl+"|"+sqlText)
		if typ == "table" && !strings.HasPrefix(name, "ftsv") {
			tables = append(tables, name)
		}
	}
	require.NoError(t, rows.Close())
	for _, tab := range tables {
		r, err := h.Query(`SELECT * FROM "` + tab + `"`)
		require.NoError(t, err)
		cols, _ := r.Columns()
		for r.Next() {
			vals := make([]any, len(cols))
			ptrs := make([]any, len(cols))
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			require.NoError(t, r.Scan(ptrs...))
			parts = append(parts, tab+":"+fmtVals(vals))
		}
		require.NoError(t, r.Close())
	}
	var fts string
	require.NoError(t, h.QueryRow("SELECT group_concat(x, ',') FROM ftsv WHERE ftsv MATCH 'hello'").Scan(&fts))
	parts = append(parts, "fts:"+fts)
	var ic string
	require.NoError(t, h.QueryRow("PRAGMA integrity_check").Scan(&ic))
	parts = append(parts, "integrity:"+ic)
	entries, err := os.ReadDir(filepath.Dir(path))
	require.NoError(t, err)
	for _, e := range entries {
		n := e.Name()
		if strings.HasSuffix(n, "-wal") || strings.HasSuffix(n, "-shm") {
			continue // present or not depending on the host connection
		}
		parts = append(parts, "file:"+n)
	}
	sort.Strings(parts)
	sum := sha256.Sum256([]byte(strings.Join(parts, "\n")))
	return hex.EncodeToString(sum[:])
}

func fmtVals(vals []any) string {
	var sb strings.Builder
	for _, v := range vals {
		if b, ok := v.([]byte); ok {
			v = hex.EncodeToString(b)
		}
		fmt.Fprintf(&sb, "%q|", fmt.Sprint(v))
	}
	return sb.String()
}

func TestHostileCorpus(t *testing.T) {
	for _, p := range hostileFiles {
		_ = os.Remove(p)
	}
	db, path := openTest(t, Options{})
	run(t, db,
		stmt("CREATE TABLE victim(a INTEGER PRIMARY KEY AUTOINCREMENT, b)"),
		stmt("INSERT INTO victim(b) VALUES ('keep')"),
		stmt("CREATE VIRTUAL TABLE ftsv USING fts5(x)"),
		stmt("INSERT INTO ftsv VALUES ('hello world')"),
	)
	// The host's own reserved table, created outside sqlexec.
	_, err := hostConn(t, path).Exec("CREATE TABLE _shoal_meta(k TEXT PRIMARY KEY, v TEXT); INSERT INTO _shoal_meta VALUES ('owner', 'acct-1')")
	require.NoError(t, err)
	before := fingerprint(t, path)

	for _, line := range readCorpus(t) {
		res, err := db.Execute(context.Background(), Request{Statements: []Statement{{SQL: line}}})
		if !assert.Error(t, err, "not refused: %s (results %v)", line, res) {
			continue
		}
		var e *Error
		require.True(t, errors.As(err, &e), "%s: %v", line, err)
		assert.NotEmpty(t, e.Message)
		assert.NotContains(t, e.Message, filepath.Dir(path), "error leaks the file's path")
		assert.Contains(t, []int{v4.CodeSQL, v4.CodeInvalidRequest}, e.Code, "%s: %s", line, e.Message)
		t.Logf("%-60.60s -> %s", line, e.Message)
	}

	assert.Equal(t, before, fingerprint(t, path), "the database or its directory changed")
	for _, p := range hostileFiles {
		_, err := os.Stat(p)
		assert.True(t, errors.Is(err, os.ErrNotExist), "%s was created", p)
	}
	// And the database still works.
	assert.Equal(t, int64(1), count(t, db, "victim"))
}

func TestTransactionStatementsUseD1Message(t *testing.T) {
	db, _ := openTest(t, Options{})
	for _, sql := range []string{"BEGIN", "BEGIN TRANSACTION", "COMMIT", "END", "ROLLBACK", "SAVEPOINT s", "RELEASE s", "ROLLBACK TO s"} {
		e := runErr(t, db, stmt(sql))
		assert.Equal(t, v4.CodeTransactionDenied, e.Code, sql)
		assert.Equal(t, TransactionMessage, e.Message, sql)
	}
}

func TestAllowedPragmasAndFeatures(t *testing.T) {
	db, _ := openTest(t, Options{})
	run(t, db, stmt("CREATE TABLE p(id INTEGER PRIMARY KEY, name TEXT)"),
		stmt("CREATE TABLE c(id INTEGER PRIMARY KEY, p INTEGER REFERENCES p(id))"),
		stmt("CREATE INDEX c_p ON c(p)"))
	for _, sql := range []string{
		"PRAGMA table_info(p)", "PRAGMA table_xinfo(p)", "PRAGMA table_list", "PRAGMA index_list(c)",
		"PRAGMA index_info(c_p)", "PRAGMA index_xinfo(c_p)", "PRAGMA foreign_key_list(c)",
		"PRAGMA foreign_key_check", "PRAGMA quick_check",
		"PRAGMA foreign_keys", "PRAGMA defer_foreign_keys = ON", "PRAGMA optimize",
		"SELECT name FROM pragma_table_info('p')", "SELECT * FROM sqlite_master",
		"ANALYZE", "ANALYZE c", "SELECT * FROM sqlite_stat1",
	} {
		_, err := db.Execute(context.Background(), Request{Statements: []Statement{stmt(sql)}})
		assert.NoError(t, err, sql)
	}
	// Foreign keys are enforced (D1 default).
	e := runErr(t, db, stmt("INSERT INTO c(p) VALUES (42)"))
	assert.Contains(t, e.Message, "FOREIGN KEY constraint failed")
	// defer_foreign_keys lets a request fix things up before it commits.
	run(t, db, stmt("PRAGMA defer_foreign_keys = ON"), stmt("INSERT INTO c(id, p) VALUES (1, 7)"), stmt("INSERT INTO p(id) VALUES (7)"))
	// FTS5 and math functions are compiled in.
	run(t, db, stmt("CREATE VIRTUAL TABLE docs USING fts5(body)"), stmt("INSERT INTO docs VALUES ('the quick brown fox')"))
	assert.Equal(t, "the quick brown fox", scalar(t, db, "SELECT body FROM docs WHERE docs MATCH 'quick'"))
	assert.Equal(t, 3.0, scalar(t, db, "SELECT sqrt(9)"))
	// AUTOINCREMENT works (SQLite maintains sqlite_sequence itself).
	run(t, db, stmt("CREATE TABLE ai(id INTEGER PRIMARY KEY AUTOINCREMENT, v)"), stmt("INSERT INTO ai(v) VALUES (1)"))
	run(t, db, stmt("DROP TABLE ai"))
}

// VACUUM INTO attaches its target internally. Requests always run inside a
// transaction, where SQLite refuses VACUUM; this checks the second line of
// defence on a connection in autocommit mode: the authorizer and
// SQLITE_LIMIT_ATTACHED=0 still refuse it and no file appears.
func TestVacuumIntoRefusedOutsideTransaction(t *testing.T) {
	db, path := openTest(t, Options{})
	run(t, db, stmt("CREATE TABLE t(a)"), stmt("INSERT INTO t VALUES (1)"))
	var gen atomic.Uint64
	var size atomic.Int64
	c, err := openConn(path, true, DefaultLimits(), &gen, &size, new(atomic.Int64))
	require.NoError(t, err)
	defer c.close()
	target := filepath.Join(t.TempDir(), "copy.db")
	for _, sql := range []string{"VACUUM INTO '" + target + "'", "ATTACH '" + target + "' AS x"} {
		cs, err := c.prepare(sql, 0)
		if err == nil {
			_, _, err = c.stepAll(cs, false, 0, &reqState{})
			c.release(sql, cs)
		}
		require.Error(t, err, sql)
		t.Logf("%s -> %v", sql, err)
		_, statErr := os.Stat(target)
		assert.True(t, errors.Is(statErr, os.ErrNotExist), "%s created %s", sql, target)
	}
}
