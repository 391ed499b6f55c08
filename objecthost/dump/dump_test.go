package dump

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/objecthost/sqlexec"
)

func newFile(t *testing.T, stmts ...string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "src.db")
	db := openDB(p, false)
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
	db := openDB(path, false)
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
	require.True(t, strings.HasPrefix(out, Header+"\n"), "D1's export header")
	require.NotContains(t, out, "BEGIN TRANSACTION", "D1's import refuses transaction control")
	require.NotContains(t, out, "COMMIT;")
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
	db := openDB(dst, false)
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
	require.Equal(t, Header+"\n", empty)
}

// The export is one snapshot: writes committed while it runs are not in it.
func TestExportIsSnapshot(t *testing.T) {
	src := newFile(t, `PRAGMA journal_mode=WAL`, `CREATE TABLE t(x)`, `WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM c WHERE i < 20000) INSERT INTO t SELECT i FROM c`)
	w := openDB(src, false)
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

// Hostile statements in an import file are refused by sqlexec's sandbox
// for user SQL (the import has no rules of its own), the import is rolled
// back and nothing outside the database is touched.
func TestImportAuthorizer(t *testing.T) {
	outside := filepath.Join(t.TempDir(), "outside.db")
	for _, q := range []string{
		"ATTACH '" + outside + "' AS x;",
		"VACUUM INTO '" + outside + "';",
		"SELECT load_extension('libm.so');",
		"PRAGMA writable_schema=ON;",
		"PRAGMA journal_mode=DELETE;",
		"PRAGMA max_page_count=1;",
		"CREATE TEMP TABLE t(x);",
		"CREATE TEMP VIEW v AS SELECT 1;",
		"CREATE TABLE _cf_evil(x);",
		"CREATE TABLE _shoal_evil(x);",
		"ALTER TABLE ok RENAME TO _cf_ok;",
		"INSERT INTO sqlite_sequence VALUES ('ok', 5);",
		"UPDATE sqlite_schema SET sql = 'x';",
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
			require.Equal(t, 2, se.Line)
			var sqlErr *sqlexec.Error
			require.ErrorAs(t, err, &sqlErr, "refused by sqlexec")
			require.Equal(t, "", snapshot(t, dst), "rolled back")
			_, statErr := os.Stat(outside)
			require.True(t, os.IsNotExist(statErr), "nothing written outside the database")
		})
	}
}

// rows_written is D1's (rows + index entries), from sqlexec's counters.
func TestImportCountsRowsWritten(t *testing.T) {
	in := "CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT);\nCREATE INDEX t_v ON t(v);\nINSERT INTO t VALUES (1,'a'),(2,'b');\nINSERT INTO t VALUES (3,'c');\n"
	res, err := Import(context.Background(), filepath.Join(t.TempDir(), "w.db"), strings.NewReader(in), ImportOptions{})
	require.NoError(t, err)
	require.Equal(t, int64(4), res.Statements)
	// 3 rows × (table + index), plus D1's schema-table writes: CREATE
	// TABLE 2, CREATE INDEX (on the still empty table) 1.
	require.Equal(t, int64(6+3), res.RowsWritten)
	require.Equal(t, int64(3), res.Changes)
	require.Positive(t, res.SizeAfter)
}

// While an import holds the writer (here: waiting for more input), a user
// write queues and succeeds after the import commits — no busy timeout —
// and reads are served meanwhile from the state before the import.
func TestImportConcurrentWriteWaitsReadsRun(t *testing.T) {
	db, err := sqlexec.Open(filepath.Join(t.TempDir(), "c.db"), sqlexec.Options{})
	require.NoError(t, err)
	defer db.Close()
	exec := func(ctx context.Context, q string) ([]sqlexec.StatementResult, error) {
		return db.Execute(ctx, sqlexec.Request{Statements: []sqlexec.Statement{{SQL: q}}})
	}
	_, err = exec(context.Background(), "CREATE TABLE pre(x); INSERT INTO pre VALUES (1)")
	require.NoError(t, err)

	pr, pw := io.Pipe()
	progressed := make(chan struct{})
	imported := make(chan error, 1)
	go func() {
		once := false
		_, err := ImportDB(context.Background(), db, pr, ImportOptions{ProgressEvery: 2, Progress: func(Progress) {
			if !once {
				once = true
				close(progressed)
			}
		}})
		imported <- err
	}()
	_, err = io.WriteString(pw, "CREATE TABLE imp(x);\nINSERT INTO pre VALUES (2);\nINSERT INTO imp VALUES ('a');\n")
	require.NoError(t, err)
	<-progressed // two statements ran; the import holds the writer, waiting for input

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second) // bounds a hang only
	defer cancel()
	res, err := exec(ctx, "SELECT count(*) AS n FROM pre")
	require.NoError(t, err, "reads run during the import")
	n, _ := res[0].Results.(sqlexec.Rows)[0].Get("n")
	require.EqualValues(t, 1, n, "the import is invisible until it commits")

	wrote := make(chan error, 1)
	go func() {
		_, err := exec(context.Background(), "INSERT INTO imp VALUES ('user')")
		wrote <- err
	}()
	select {
	case err := <-wrote:
		t.Fatalf("the write finished during the import: %v", err)
	default:
	}
	_, err = io.WriteString(pw, "INSERT INTO imp VALUES ('b');\n")
	require.NoError(t, err)
	require.NoError(t, pw.Close())
	require.NoError(t, <-imported)
	require.NoError(t, <-wrote, "the write waited for the import and succeeded")
	res, err = exec(ctx, "SELECT group_concat(x) AS v FROM (SELECT x FROM imp ORDER BY rowid)")
	require.NoError(t, err)
	v, _ := res[0].Results.(sqlexec.Rows)[0].Get("v")
	require.Equal(t, "a,b,user", v)
}

// The export connection cannot write.
func TestExportConnectionIsReadOnly(t *testing.T) {
	src := newFile(t, `CREATE TABLE t(x)`)
	db := openDB(src, true)
	defer db.Close()
	_, err := db.Exec(`INSERT INTO t VALUES (1)`)
	require.Error(t, err)
	_, err = db.Exec(`PRAGMA query_only=0`)
	if err == nil {
		_, err = db.Exec(`INSERT INTO t VALUES (1)`)
		require.Error(t, err, "mode=ro holds even without query_only")
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

// The output of the real sqlite3 shell's .dump imports (D1 accepts it too),
// and our dump loads into the real shell: both directions of compatibility.
func TestSqlite3ShellCompatibility(t *testing.T) {
	shell, err := exec.LookPath("sqlite3")
	require.NoError(t, err, "the sqlite3 shell is needed: run scripts/deps.sh (make test does)")
	// No virtual tables here: the shell dumps them through writable_schema,
	// which user SQL (and so import) refuses, as D1 does.
	var plain []string
	for _, s := range richSchema {
		if !strings.Contains(s, "docs") {
			plain = append(plain, s)
		}
	}
	src := newFile(t, plain...)
	out, err := exec.Command(shell, src, ".dump").Output()
	require.NoError(t, err)
	dst := filepath.Join(t.TempDir(), "from-shell.db")
	_, err = Import(context.Background(), dst, bytes.NewReader(out), ImportOptions{})
	require.NoError(t, err)
	require.Equal(t, snapshot(t, src), snapshot(t, dst))

	ours := exportString(t, src, Options{})
	viaShell := filepath.Join(t.TempDir(), "via-shell.db")
	cmd := exec.Command(shell, viaShell)
	cmd.Stdin = strings.NewReader(ours)
	b, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", b)
	require.Empty(t, string(b))
	require.Equal(t, snapshot(t, src), snapshot(t, viaShell))
}

// An external-content FTS5 table is rebuilt from its content table after
// the data; a contentless one is schema only.
func TestFTS5ExternalContent(t *testing.T) {
	src := newFile(t,
		`CREATE TABLE posts(id INTEGER PRIMARY KEY, body TEXT)`,
		`CREATE VIRTUAL TABLE posts_fts USING fts5(body, content='posts', content_rowid='id')`,
		`CREATE VIRTUAL TABLE nocontent USING fts5(x, content='')`,
		`INSERT INTO posts VALUES (1, 'hello shoal'), (2, 'sqlite rocks')`,
		`INSERT INTO posts_fts(posts_fts) VALUES ('rebuild')`,
		`INSERT INTO nocontent(rowid, x) VALUES (1, 'gone')`,
	)
	out := exportString(t, src, Options{})
	require.Contains(t, out, `INSERT INTO "posts_fts"("posts_fts") VALUES('rebuild');`)
	require.Contains(t, out, "-- contentless virtual table")
	dst := filepath.Join(t.TempDir(), "fts.db")
	_, err := Import(context.Background(), dst, strings.NewReader(out), ImportOptions{})
	require.NoError(t, err)
	db := openDB(dst, false)
	defer db.Close()
	var id int
	require.NoError(t, db.QueryRow(`SELECT rowid FROM posts_fts WHERE posts_fts MATCH 'rocks'`).Scan(&id))
	require.Equal(t, 2, id)
}
