package sqlexec

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	v4 "github.com/shoaldb/shoal/internal/v4"
)

// TestD1Counters pins D1's meta for one request of statements: the
// numbers are miniflare 4.20260426.0's answer for the same batch on a
// fresh database (test/compat runs a wider corpus against miniflare
// itself). It fails loudly when the counters fall back to the
// approximation (shoal_counts_check refused the linked SQLite).
func TestD1Counters(t *testing.T) {
	require.True(t, d1Counts(), "D1's row counters are unavailable: the linked SQLite is not the 3.54.1 whose private layout shim.c mirrors (or was built without -DSQLITE_ENABLE_STMT_SCANSTATUS); rows_read/rows_written are approximations")
	db, _ := openTest(t, Options{})
	type want struct {
		read, written, changes int64
		changed                bool
		lastRowID              int64
	}
	steps := []struct {
		sql string
		want
	}{
		// Schema writes: the sqlite_schema row is inserted, then updated
		// with the table's root page (2 written; the update's seek reads 1).
		{"CREATE TABLE t(id INTEGER PRIMARY KEY, a TEXT, b INTEGER)", want{1, 2, 0, true, 0}},
		// RETURNING reads its rows back from a temporary table.
		{"INSERT INTO t(a, b) VALUES ('a', 1), ('b', 2), ('c', 3), ('d', 4), ('e', 5) RETURNING id", want{10, 5, 5, true, 5}},
		{"UPDATE t SET b = 42 WHERE id = 1", want{1, 1, 1, true, 5}},
		// The scan and the sorter (5 + 5), and the first two appends'
		// SeekEnd; written: the schema row and 5 entries.
		{"CREATE INDEX t_b ON t(b)", want{12, 6, 0, true, 5}},
		// The new index entry and the row; the old entry's delete is not counted.
		{"UPDATE t SET b = 43 WHERE id = 1", want{1, 2, 1, true, 5}},
		// REPLACE over an existing row: its deletion is not a change.
		{"REPLACE INTO t(id, a, b) VALUES (2, 'r', 0)", want{1, 2, 1, true, 2}},
		{"INSERT OR IGNORE INTO t(id, a) VALUES (3, 'dup')", want{1, 0, 0, false, 2}},
		{"INSERT INTO t(id, a, b) VALUES (4, 'u', 0) ON CONFLICT(id) DO UPDATE SET a = 'up'", want{1, 1, 1, true, 2}},
		// Window functions and sorts read every row again from the sorter.
		{"SELECT a, row_number() OVER (ORDER BY b DESC) AS rn FROM t", want{16, 0, 0, false, 2}},
		{"SELECT a FROM t NOT INDEXED ORDER BY a DESC", want{10, 0, 0, false, 2}},
		{"SELECT a FROM t WHERE b = 3", want{2, 0, 0, false, 2}},
		{"SELECT x.a FROM t AS x JOIN t AS y ON y.id = x.id", want{10, 0, 0, false, 2}},
		{"WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 5) SELECT i FROM c", want{6, 0, 0, false, 2}},
		{"CREATE TABLE log(x)", want{1, 2, 0, true, 2}},
		// A trigger's schema row fits in the schema page: nothing D1 calls
		// a change (changed_db false).
		{"CREATE TRIGGER tr AFTER INSERT ON t BEGIN INSERT INTO log VALUES (new.a); END", want{0, 1, 0, false, 2}},
		// The trigger's insert is written and is a change too.
		{"INSERT INTO t(a, b) VALUES ('f', 6)", want{0, 3, 2, true, 6}},
		{"CREATE VIRTUAL TABLE docs USING fts5(title, body)", want{1, 2, 3, true, 10}},
		// FTS5: one write per row; its shadow tables' rows are changes.
		{"INSERT INTO docs(title, body) VALUES ('hello', 'the quick brown fox'), ('bye', 'lazy dog sleeps')", want{0, 2, 6, true, 2}},
		{"SELECT title FROM docs WHERE docs MATCH 'fox'", want{1, 0, 0, false, 2}},
		// DELETE without WHERE clears the table: nothing read.
		{"DELETE FROM log", want{0, 1, 1, true, 2}},
		{"CREATE TABLE IF NOT EXISTS log(x)", want{0, 0, 0, false, 2}},
		{"DROP TABLE log", want{11, 0, 4, true, 2}},
	}
	req := Request{}
	for _, s := range steps {
		req.Statements = append(req.Statements, stmt(s.sql))
	}
	res, err := db.Execute(context.Background(), req)
	require.NoError(t, err)
	require.Len(t, res, len(steps))
	for i, s := range steps {
		m := res[i].Meta
		got := want{m.RowsRead, m.RowsWritten, m.Changes, m.ChangedDB, m.LastRowID}
		assert.Equal(t, s.want, got, s.sql)
	}
	// size_after is the pages in use: a DROP shrinks it (D1), the file
	// keeps its length.
	assert.Less(t, res[len(res)-1].Meta.SizeAfter, res[len(res)-2].Meta.SizeAfter)
	// A read reports the writer's last_insert_rowid, as D1's connection does.
	r := run(t, db, stmt("SELECT count(*) FROM t"))
	assert.Equal(t, int64(2), r[0].Meta.LastRowID)
	assert.False(t, r[0].Meta.ChangedDB)
}

// TestD1ErrorTexts: D1's messages for the failures clients match on.
func TestD1ErrorTexts(t *testing.T) {
	db, _ := openTest(t, Options{})
	run(t, db, stmt("CREATE TABLE t(id INTEGER PRIMARY KEY, a TEXT UNIQUE)"), stmt("INSERT INTO t VALUES (1, 'x')"))
	cases := []struct{ sql, msg string }{
		{"SELEC 1", `near "SELEC": syntax error at offset 0: SQLITE_ERROR`},
		{"SELECT a FROM t WHERE a = = 1", `near "=": syntax error at offset 26: SQLITE_ERROR`},
		{"SELECT sqlite_version()", "not authorized to use function: sqlite_version at offset 7: SQLITE_ERROR"},
		{"SELECT 1, log10(100)", "not authorized to use function: log10 at offset 10: SQLITE_ERROR"},
		{"SELECT fts3_tokenizer('simple')", "no such function: fts3_tokenizer at offset 7: SQLITE_ERROR"},
		{"SELECT load_extension('x')", "not authorized: SQLITE_ERROR"},
		{"PRAGMA journal_mode", "not authorized: SQLITE_AUTH"},
		{"CREATE TABLE _cf_x(a)", "not authorized: SQLITE_AUTH"},
		{"CREATE VIRTUAL TABLE r USING rtree(id, a, b)", "not authorized: SQLITE_AUTH"},
		{"INSERT INTO t VALUES (1, 'y')", "UNIQUE constraint failed: t.id: SQLITE_CONSTRAINT (extended: SQLITE_CONSTRAINT_PRIMARYKEY)"},
		{"INSERT INTO t VALUES (2, 'x')", "UNIQUE constraint failed: t.a: SQLITE_CONSTRAINT (extended: SQLITE_CONSTRAINT_UNIQUE)"},
		{"/* only a comment */", NoStatementMessage},
		{";", NoStatementMessage},
		{"-- a comment from the first character", NoStatementMessage},
		{"", NoSQLMessage},
		{" \n\t ", NoSQLMessage},
		{"  -- a comment line D1 filters out", NoSQLMessage},
		{"\n-- one\n  -- two", NoSQLMessage},
		{"SELECT ?; SELECT 2", MultiParamsMessage},
		{"SELECT ?, ?", WrongParamsMessage},
	}
	for _, c := range cases {
		e := runErr(t, db, stmt(c.sql))
		assert.Equal(t, v4.CodeSQL, e.Code, c.sql)
		assert.Equal(t, c.msg, e.Message, c.sql)
	}
	// The sandbox's reason is kept, outside the message.
	e := runErr(t, db, stmt("PRAGMA journal_mode"))
	assert.Contains(t, e.Detail, "journal_mode")
	// jsonb() is allowed (as on D1), and so is sqlite_version() nowhere.
	res := run(t, db, stmt(`SELECT json(jsonb('{"a":1}')) AS j`))
	assert.Equal(t, `{"a":1}`, res[0].Results.(Rows)[0].Values()[0])
	// A batch entry of "--" comment lines is dropped, as D1 drops it.
	res, err := db.Execute(context.Background(), Request{Statements: []Statement{stmt("SELECT 1 AS x"), stmt("  -- nothing")}})
	require.NoError(t, err)
	require.Len(t, res, 1)
	// ... wherever it stands; the others keep their order.
	res, err = db.Execute(context.Background(), Request{Statements: []Statement{stmt("  -- first"), stmt("SELECT 1 AS x"), stmt(" \n -- middle"), stmt("SELECT ? AS y", 2), stmt(" ")}})
	require.NoError(t, err)
	require.Len(t, res, 2)
	assert.Equal(t, []any{int64(1)}, res[0].Results.(Rows)[0].Values())
	assert.Equal(t, []any{int64(2)}, res[1].Results.(Rows)[0].Values())
	// Params bind to the last statement of a string.
	res = run(t, db, stmt("SELECT 1; SELECT ? AS v", 5))
	require.Len(t, res, 2)
	assert.Equal(t, int64(5), res[1].Results.(Rows)[0].Values()[0])
	// The database is untouched by all of the above.
	assert.Equal(t, int64(1), count(t, db, "t"))
}

// TestJSNumbers: D1's rendering of integers beyond 2^53, on request.
func TestJSNumbers(t *testing.T) {
	db, _ := openTest(t, Options{})
	sql := "SELECT 9007199254740993 AS big, -9007199254740993 AS neg, 9223372036854775807 AS mx, 9007199254740992 AS edge, 7 AS small"
	exact := run(t, db, stmt(sql))
	b, err := json.Marshal(exact[0].Results)
	require.NoError(t, err)
	assert.JSONEq(t, `[{"big":9007199254740993,"neg":-9007199254740993,"mx":9223372036854775807,"edge":9007199254740992,"small":7}]`, string(b))
	res, err := db.Execute(context.Background(), Request{Statements: []Statement{stmt(sql)}, JSNumbers: true})
	require.NoError(t, err)
	b = AppendResults(nil, res)
	// Exactly what D1 (miniflare) answers for the same SQL.
	assert.Contains(t, string(b), `"results":[{"big":9007199254740992,"neg":-9007199254740992,"mx":9223372036854776000,"edge":9007199254740992,"small":7}]`)
	// -0.0 renders as 0, as JSON.stringify writes it.
	res = run(t, db, stmt("SELECT -0.0 AS z"))
	assert.Contains(t, string(AppendResults(nil, res)), `[{"z":0}]`)
}

// AUTOINCREMENT's code is added to programs by sqlite3VdbeAddOpList,
// which leaves the instructions' execution counts uninitialised: counts
// must still be exact on a statement's first run, cached runs, and after
// a schema change re-prepares it. Expected: miniflare's answer.
func TestD1CountersAutoincrement(t *testing.T) {
	db, _ := openTest(t, Options{})
	res, err := db.Execute(context.Background(), Request{Statements: []Statement{
		stmt("CREATE TABLE a(id INTEGER PRIMARY KEY AUTOINCREMENT, v)"),
		stmt("INSERT INTO a(v) VALUES (1)"),
		stmt("INSERT INTO a(v) VALUES (2)"),
		stmt("INSERT INTO a(v) VALUES (3), (4)"),
		stmt("ALTER TABLE a ADD COLUMN w"),
		stmt("INSERT INTO a(v) VALUES (2)"),
	}})
	require.NoError(t, err)
	got := make([][3]int64, len(res))
	for i, r := range res {
		got[i] = [3]int64{r.Meta.RowsRead, r.Meta.RowsWritten, r.Meta.Changes}
	}
	assert.Equal(t, [][3]int64{{2, 4, 0}, {1, 2, 1}, {1, 2, 1}, {1, 3, 2}, {4, 1, 0}, {1, 2, 1}}, got)
	for i := 0; i < 20; i++ { // cached, and re-prepared after each DDL
		r := run(t, db, stmt("INSERT INTO a(v) VALUES (9)"))
		require.Equal(t, [2]int64{1, 2}, [2]int64{r[0].Meta.RowsRead, r[0].Meta.RowsWritten}, "run %d", i)
		if i%5 == 0 {
			run(t, db, stmt(fmt.Sprintf("CREATE TABLE other%d(x)", i)))
		}
	}
}

// Read-only statements that fill temporary b-trees (UNION, DISTINCT, IN
// lists, sorters) write nothing.
func TestD1CountersReadOnlyWritesNothing(t *testing.T) {
	db, _ := openTest(t, Options{})
	run(t, db, stmt("CREATE TABLE t(a, b)"), stmt("INSERT INTO t VALUES (1, 2), (3, 4), (1, 2)"))
	for _, sql := range []string{
		"SELECT a FROM t UNION SELECT b FROM t",
		"SELECT DISTINCT a FROM t",
		"SELECT a FROM t WHERE a IN (SELECT b FROM t)",
		"SELECT a FROM t ORDER BY b",
		"SELECT a, count(*) FROM t GROUP BY a",
	} {
		for i := 0; i < 2; i++ { // writer, then a reader
			res := run(t, db, stmt(sql))
			assert.Zero(t, res[0].Meta.RowsWritten, sql)
			assert.Positive(t, res[0].Meta.RowsRead, sql)
		}
	}
}
