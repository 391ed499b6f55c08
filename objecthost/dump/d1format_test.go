package dump

import (
	"context"
	"io"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// transactionControl is what D1's import refuses in a dump ("D1 runs your
// SQL in a transaction for you").
var (
	transactionControl = regexp.MustCompile(`(?i)^\s*(BEGIN|COMMIT|END|ROLLBACK|SAVEPOINT|RELEASE)\b`)
	leadingComments    = regexp.MustCompile(`^(\s*--[^\n]*\n)+`)
)

// Every statement of an export, with and without options, is one D1's
// import accepts: no transaction control, and D1's own header first.
func TestExportHasNoTransactionControl(t *testing.T) {
	src := newFile(t, richSchema...)
	for name, o := range map[string]Options{
		"all": {}, "no data": {NoData: true}, "no schema": {NoSchema: true}, "one table": {Tables: []string{"child"}},
	} {
		out := exportString(t, src, o)
		require.True(t, strings.HasPrefix(out, "PRAGMA defer_foreign_keys=TRUE;\n"), "%s: %q", name, out[:min(len(out), 60)])
		sp := NewSplitter(strings.NewReader(out), 64<<20)
		n := 0
		for {
			st, err := sp.Next()
			if err == io.EOF {
				break
			}
			require.NoError(t, err)
			if st.Blank {
				continue
			}
			text := leadingComments.ReplaceAllString(st.Raw, "")
			n++
			// Trigger bodies hold BEGIN … END inside CREATE TRIGGER: only a
			// statement that starts with one is transaction control.
			require.False(t, transactionControl.MatchString(text), "%s: statement %d is transaction control: %s", name, n, text)
		}
		require.Positive(t, n, name)
	}
}

// A dump written the way D1's export writes it (miniflare's dumpSql, the
// same generator as D1's: the header, CREATE TABLE IF NOT EXISTS for
// quoted names, INSERTs without column lists, newlines as
// replace(…,'\n',char(10)), sqlite_sequence wiped and refilled last, then
// indexes, triggers and views) imports into Shoal with every value intact.
func TestImportD1Export(t *testing.T) {
	d1 := strings.Join([]string{
		`PRAGMA defer_foreign_keys=TRUE;`,
		`CREATE TABLE IF NOT EXISTS "teams"(id INTEGER PRIMARY KEY, logo BLOB, score REAL);`,
		`INSERT INTO "teams" VALUES(10,X'cafe',1.5);`,
		`CREATE TABLE users(id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL, team_id INTEGER REFERENCES teams(id));`,
		`INSERT INTO "users" VALUES(1,'ada',11);`,
		`INSERT INTO "users" VALUES(2,replace('two\nlines','\n',char(10)),10);`,
		`INSERT INTO "users" VALUES(5,'it''s',NULL);`,
		`INSERT INTO "teams" VALUES(11,NULL,-2);`,
		`DELETE FROM sqlite_sequence;`,
		`INSERT INTO "sqlite_sequence" VALUES('users',7);`,
		`CREATE INDEX users_team ON users(team_id);`,
		`CREATE VIEW v AS SELECT name FROM users;`,
	}, "\n") + "\n"
	dst := filepath.Join(t.TempDir(), "d1.db")
	res, err := Import(context.Background(), dst, strings.NewReader(d1), ImportOptions{})
	require.NoError(t, err)
	require.Equal(t, int64(1), res.SkippedLines, "the header is the import's own setting")
	require.Equal(t, int64(11), res.Statements)

	db := openDB(dst, false)
	defer db.Close()
	var name string
	require.NoError(t, db.QueryRow(`SELECT name FROM users WHERE id = 2`).Scan(&name))
	require.Equal(t, "two\nlines", name)
	var logo []byte
	var score float64
	require.NoError(t, db.QueryRow(`SELECT logo, score FROM teams WHERE id = 10`).Scan(&logo, &score))
	require.Equal(t, []byte{0xca, 0xfe}, logo)
	require.Equal(t, 1.5, score)
	_, err = db.Exec(`INSERT INTO users(name) VALUES ('next')`)
	require.NoError(t, err)
	var id int64
	require.NoError(t, db.QueryRow(`SELECT id FROM users WHERE name = 'next'`).Scan(&id))
	require.Equal(t, int64(8), id, "the AUTOINCREMENT counter came along")

	// And Shoal's export of it is importable again (into a fresh file).
	again := filepath.Join(t.TempDir(), "again.db")
	_, err = Import(context.Background(), again, strings.NewReader(exportString(t, dst, Options{})), ImportOptions{})
	require.NoError(t, err)
	require.Equal(t, snapshot(t, dst), snapshot(t, again))
}

// Dumps written before the format change (BEGIN TRANSACTION … COMMIT, as
// sqlite3's .dump) still import.
func TestImportOldShoalDump(t *testing.T) {
	old := "PRAGMA foreign_keys=OFF;\nBEGIN TRANSACTION;\nCREATE TABLE t(x);\nINSERT INTO \"t\"(\"x\") VALUES(1);\nCOMMIT;\n"
	dst := filepath.Join(t.TempDir(), "old.db")
	res, err := Import(context.Background(), dst, strings.NewReader(old), ImportOptions{})
	require.NoError(t, err)
	require.Equal(t, int64(3), res.SkippedLines)
}
