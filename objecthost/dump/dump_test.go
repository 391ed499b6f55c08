package dump

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func newFile(t *testing.T, stmts ...string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "src.db")
	db := openDB(p, nil, false)
	defer db.Close()
	for _, s := range stmts {
		_, err := db.Exec(s)
		require.NoError(t, err, s)
	}
	return p
}

// snapshot returns a textual image of a database: its schema (type, name,
// sql of user objects) and every user table's rows with typeof() of each
// value, so storage classes are compared too.
func snapshot(t *testing.T, path string) string {
	t.Helper()
	db := openDB(path, nil, false)
	defer db.Close()
	var b strings.Builder
	rows, err := db.Query(`SELECT type, name, sql FROM sqlite_schema WHERE sql IS NOT NULL AND name NOT LIKE 'sqlite\_%' ESCAPE '\' ORDER BY type, name`)
	require.NoError(t, err)
	var tables []string
	for rows.Next() {
		var typ, name, s string
		require.NoError(t, rows.Scan(&typ, &name, &s))
		fmt.Fprintf(&b, "%s %s: %s\n", typ, name, s)
		if typ == "table" {
			tables = append(tables, name)
		}
	}
	require.NoError(t, rows.Err())
	rows.Close()
	for _, tb := range tables {
		cols, err := db.Query("SELECT name FROM pragma_table_xinfo(?) WHERE hidden IN (0,2,3)", tb)
		require.NoError(t, err)
		var sel []string
		for cols.Next() {
			var c string
			require.NoError(t, cols.Scan(&c))
			sel = append(sel, fmt.Sprintf("typeof(%s), quote(%s)", quoteIdent(c), quoteIdent(c)))
		}
		cols.Close()
		n := len(sel) * 2
		ord := make([]string, n)
		for i := range ord {
			ord[i] = fmt.Sprint(i + 1)
		}
		r, err := db.Query("SELECT " + strings.Join(sel, ",") + " FROM " + quoteIdent(tb) + " ORDER BY " + strings.Join(ord, ","))
		require.NoError(t, err)
		vals := make([]any, n)
		ptrs := make([]any, n)
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		for r.Next() {
			require.NoError(t, r.Scan(ptrs...))
			fmt.Fprintf(&b, "%s %v\n", tb, vals)
		}
		require.NoError(t, r.Err())
		r.Close()
	}
	var seq int
	require.NoError(t, db.QueryRow("SELECT count(*) FROM sqlite_schema WHERE name='sqlite_sequence'").Scan(&seq))
	if seq > 0 {
		r, err := db.Query("SELECT name, seq FROM sqlite_sequence ORDER BY name")
		require.NoError(t, err)
		for r.Next() {
			var n string
			var s int64
			require.NoError(t, r.Scan(&n, &s))
			fmt.Fprintf(&b, "seq %s %d\n", n, s)
		}
		r.Close()
	}
	return b.String()
}

var richSchema = []string{
	`CREATE TABLE parent(id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL)`,
	`CREATE TABLE child(id INTEGER PRIMARY KEY, parent_id INTEGER REFERENCES parent(id), note TEXT)`,
	`CREATE TABLE vals(i INTEGER, r REAL, t TEXT, b BLOB, n, d DATETIME, flag BOOLEAN)`,
	`CREATE TABLE gen(a INTEGER, b INTEGER GENERATED ALWAYS AS (a*2) STORED, c INTEGER GENERATED ALWAYS AS (a+1) VIRTUAL)`,
	`CREATE TABLE "we""ird name"("col ""x""" TEXT, [br] INT)`,
	`CREATE TABLE wr(k TEXT PRIMARY KEY, v) WITHOUT ROWID`,
	`CREATE INDEX child_parent ON child(parent_id)`,
	`CREATE UNIQUE INDEX vals_t ON vals(t) WHERE t IS NOT NULL`,
	`CREATE VIEW v_children AS SELECT p.name, c.note FROM parent p JOIN child c ON c.parent_id = p.id`,
	`CREATE TABLE log(msg TEXT)`,
	`CREATE TRIGGER child_ins AFTER INSERT ON child BEGIN INSERT INTO log(msg) VALUES ('child; ' || NEW.id); SELECT CASE WHEN NEW.id < 0 THEN RAISE(ABORT, 'neg') END; END`,
	`CREATE VIRTUAL TABLE docs USING fts5(title, body)`,
	`INSERT INTO parent(name) VALUES ('a'), ('b'), ('c')`,
	`DELETE FROM parent WHERE name = 'c'`,
	`INSERT INTO child VALUES (1, 1, 'x'), (2, 2, NULL), (7, 1, 'it''s; tricky -- not a comment /* nor this */')`,
	`INSERT INTO vals VALUES (9223372036854775807, 0.1, 'héllo 🌊 ünïcode', X'00FF10', NULL, '2024-01-02 03:04:05', 1)`,
	`INSERT INTO vals VALUES (-9223372036854775808, 1e300, '', X'', 3.0, 1700000000, 0)`,
	`INSERT INTO vals VALUES (0, -2.5e-310, 'line1
line2', zeroblob(3), 'text in untyped', NULL, NULL)`,
	`INSERT INTO vals VALUES (42, 1.0, CAST(X'610062' AS TEXT), NULL, X'CAFE', 'x', 'y')`,
	`INSERT INTO vals VALUES (1, 9007199254740993.0, 'big', NULL, 123456789012345678, NULL, NULL)`,
	`INSERT INTO gen(a) VALUES (1), (5)`,
	`INSERT INTO "we""ird name" VALUES ('q"q', 3)`,
	`INSERT INTO wr VALUES ('k1', 1), ('k2', X'01')`,
	`INSERT INTO docs(rowid, title, body) VALUES (10, 'Shoal', 'millions of small databases'), (20, 'SQLite', 'full text search; with fts5')`,
}

func exportString(t *testing.T, path string, o Options) string {
	t.Helper()
	var buf bytes.Buffer
	require.NoError(t, Export(context.Background(), path, &buf, o, nil))
	return buf.String()
}

func TestRoundTrip(t *testing.T) {
	src := newFile(t, richSchema...)
	out := exportString(t, src, Options{})
	require.True(t, strings.HasPrefix(out, "PRAGMA foreign_keys=OFF;\nBEGIN TRANSACTION;\n"))
	require.True(t, strings.HasSuffix(out, "COMMIT;\n"))
	require.NotContains(t, out, "docs_data", "FTS5 shadow tables are not dumped")
	require.Contains(t, out, "CREATE VIRTUAL TABLE docs USING fts5(title, body);")
	require.Contains(t, out, "9223372036854775807")
	require.Contains(t, out, "-9223372036854775808")

	dst := filepath.Join(t.TempDir(), "dst.db")
	res, err := Import(context.Background(), dst, strings.NewReader(out), ImportOptions{})
	require.NoError(t, err)
	require.Positive(t, res.Statements)
	require.Equal(t, snapshot(t, src), snapshot(t, dst))

	// Exporting the copy gives the same dump: the format is a fixed point.
	require.Equal(t, out, exportString(t, dst, Options{}))

	// The FTS index works in the copy, and the trigger came back.
	db := openDB(dst, nil, false)
	defer db.Close()
	var title string
	require.NoError(t, db.QueryRow(`SELECT title FROM docs WHERE docs MATCH 'search'`).Scan(&title))
	require.Equal(t, "SQLite", title)
	_, err = db.Exec(`INSERT INTO child VALUES (8, 1, 'after')`)
	require.NoError(t, err)
	var n int
	require.NoError(t, db.QueryRow(`SELECT count(*) FROM log WHERE msg = 'child; 8'`).Scan(&n))
	require.Equal(t, 1, n)

}

func TestExportOptions(t *testing.T) {
	src := newFile(t, richSchema...)
	noData := exportString(t, src, Options{NoData: true})
	require.NotContains(t, noData, `INSERT INTO "`)
	require.Contains(t, noData, "CREATE TABLE parent")
	require.Contains(t, noData, "CREATE TRIGGER child_ins")

	noSchema := exportString(t, src, Options{NoSchema: true})
	require.NotContains(t, noSchema, "CREATE ")
	require.Contains(t, noSchema, `INSERT INTO "child"`)

	one := exportString(t, src, Options{Tables: []string{"child"}})
	require.Contains(t, one, "CREATE TABLE child")
	require.Contains(t, one, "CREATE INDEX child_parent")
	require.Contains(t, one, "CREATE TRIGGER child_ins")
	require.NotContains(t, one, "CREATE TABLE parent")
	require.NotContains(t, one, "CREATE VIEW")

	var buf bytes.Buffer
	err := Export(context.Background(), src, &buf, Options{Tables: []string{"nope"}}, nil)
	require.ErrorIs(t, err, ErrNoSuchTable)
}

func TestExportSkipsReservedAndMissingFile(t *testing.T) {
	src := newFile(t, `CREATE TABLE _cf_KV(k, v)`, `CREATE TABLE _shoal_meta(x)`, `CREATE TABLE ok(x)`, `INSERT INTO _cf_KV VALUES (1,2)`)
	out := exportString(t, src, Options{})
	require.NotContains(t, out, "_cf_")
	require.NotContains(t, out, "_shoal_")
	require.Contains(t, out, "CREATE TABLE ok(x);")

	empty := exportString(t, filepath.Join(t.TempDir(), "never-created.db"), Options{})
	require.Equal(t, "PRAGMA foreign_keys=OFF;\nBEGIN TRANSACTION;\nCOMMIT;\n", empty)
}

// The export is one snapshot: writes committed while it runs are not in it.
func TestExportIsSnapshot(t *testing.T) {
	src := newFile(t, `PRAGMA journal_mode=WAL`, `CREATE TABLE t(x)`, `WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM c WHERE i < 20000) INSERT INTO t SELECT i FROM c`)
	w := openDB(src, nil, false)
	defer w.Close()
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- Export(context.Background(), src, pw, Options{}, nil); pw.Close() }()
	// Read the first bytes: the export's snapshot is open by then.
	head := make([]byte, 4096)
	_, err := io.ReadFull(pr, head)
	require.NoError(t, err)
	_, err = w.Exec(`INSERT INTO t VALUES (-1)`) // the writer is not blocked
	require.NoError(t, err)
	rest, err := io.ReadAll(pr)
	require.NoError(t, err)
	require.NoError(t, <-done)
	all := string(head) + string(rest)
	require.Equal(t, 20000, strings.Count(all, `INSERT INTO "t"`))
	require.NotContains(t, all, "VALUES(-1)")
}

func TestImportErrorRollsBackEverything(t *testing.T) {
	dst := newFile(t, `CREATE TABLE keep(x)`, `INSERT INTO keep VALUES (1)`)
	before := snapshot(t, dst)
	in := "CREATE TABLE a(x);\nINSERT INTO a VALUES (1);\nINSERT INTO keep VALUES (2);\n\nINSERT INTO nope VALUES (3);\nINSERT INTO a VALUES (4);\n"
	_, err := Import(context.Background(), dst, strings.NewReader(in), ImportOptions{})
	var se *StatementError
	require.ErrorAs(t, err, &se)
	require.Equal(t, int64(4), se.Number)
	require.Equal(t, 5, se.Line)
	require.Contains(t, se.Error(), "no such table: nope")
	require.Contains(t, se.Snippet, "INSERT INTO nope")
	require.Equal(t, before, snapshot(t, dst))
}

func TestImportForeignKeysCheckedAtCommit(t *testing.T) {
	dst := filepath.Join(t.TempDir(), "fk.db")
	// Child rows before parent rows: fine, checked at commit.
	ok := "CREATE TABLE p(id INTEGER PRIMARY KEY);\nCREATE TABLE c(pid REFERENCES p(id));\nINSERT INTO c VALUES (1);\nINSERT INTO p VALUES (1);\n"
	_, err := Import(context.Background(), dst, strings.NewReader(ok), ImportOptions{})
	require.NoError(t, err)
	before := snapshot(t, dst)
	bad := "INSERT INTO c VALUES (99);\n"
	_, err = Import(context.Background(), dst, strings.NewReader(bad), ImportOptions{})
	require.ErrorContains(t, err, "FOREIGN KEY")
	require.Equal(t, before, snapshot(t, dst))
}

func TestImportAuthorizer(t *testing.T) {
	for _, q := range []string{
		"ATTACH 'x.db' AS x;",
		"PRAGMA writable_schema=ON;",
		"PRAGMA journal_mode=DELETE;",
		"CREATE TEMP TABLE t(x);",
		"CREATE TABLE _cf_evil(x);",
		"SAVEPOINT s;",
		"ROLLBACK;",
	} {
		t.Run(q, func(t *testing.T) {
			dst := filepath.Join(t.TempDir(), "a.db")
			_, err := Import(context.Background(), dst, strings.NewReader("CREATE TABLE ok(x);\n"+q), ImportOptions{})
			require.Error(t, err)
			var se *StatementError
			require.ErrorAs(t, err, &se)
			require.Equal(t, int64(2), se.Number)
		})
	}
}

func TestImportSkipsDumpTransactionLines(t *testing.T) {
	// What sqlite3's .dump writes (D1 accepts it).
	in := "PRAGMA foreign_keys=OFF;\nBEGIN TRANSACTION;\nCREATE TABLE t(x);\nINSERT INTO t VALUES(1);\nCOMMIT;\n"
	dst := filepath.Join(t.TempDir(), "d.db")
	res, err := Import(context.Background(), dst, strings.NewReader(in), ImportOptions{})
	require.NoError(t, err)
	require.Equal(t, int64(2), res.Statements)
	require.Equal(t, int64(3), res.SkippedLines)
	require.Equal(t, int64(len(in)), res.Bytes)
}

func TestImportStatementBound(t *testing.T) {
	dst := filepath.Join(t.TempDir(), "b.db")
	in := "CREATE TABLE t(x);\nINSERT INTO t VALUES('" + strings.Repeat("a", 5000) + "');\n"
	_, err := Import(context.Background(), dst, strings.NewReader(in), ImportOptions{MaxStatementBytes: 1000})
	require.ErrorIs(t, err, ErrStatementTooLarge)
}

func TestAppendLiteral(t *testing.T) {
	cases := map[string]any{
		"NULL": nil, "-9223372036854775808": int64(-9223372036854775808), "0.1": 0.1,
		"1.0": 1.0, "1e+300": 1e300, "1e999": inf(1), "X'00ff'": []byte{0, 0xff}, "'it''s'": "it's",
		"CAST(X'610062' AS TEXT)": "a\x00b",
	}
	for want, v := range cases {
		require.Equal(t, want, string(AppendLiteral(nil, v)))
	}
}

func inf(sign int) float64 {
	var z float64
	if sign > 0 {
		return 1 / z
	}
	return -1 / z
}
