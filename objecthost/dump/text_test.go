package dump

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/internal/d1body"
	"github.com/shoaldb/shoal/objecthost/sqlexec"
)

// TestImportRefusesNULAndInvalidUTF8: an import file holding a NUL byte
// (SQLite would stop reading the statement there and run what came before
// it) or bytes that are not UTF-8 is refused with the line and offset, and
// nothing of it is kept — also statements before the bad byte, and also
// when the bad byte is in a comment.
func TestImportRefusesNULAndInvalidUTF8(t *testing.T) {
	const head = "CREATE TABLE a(x);\nINSERT INTO keep VALUES (2);\n" // 2 lines
	const n = int64(len(head))
	cases := []struct {
		name    string
		in      string
		problem d1body.Problem
		line    int
		offset  int64
	}{
		{"NUL between statements", head + "INSERT INTO a VALUES (1);\x00 INSERT INTO a VALUES (2);\n", d1body.NUL, 3, n + 25},
		{"NUL in a literal", head + "\nINSERT INTO a VALUES ('a\x00b');\n", d1body.NUL, 4, n + 1 + 24},
		{"NUL in a comment", head + "-- a\x00b\nINSERT INTO a VALUES (3);\n", d1body.NUL, 3, n + 4},
		{"NUL at the start", "\x00CREATE TABLE a(x);", d1body.NUL, 1, 0},
		{"invalid UTF-8", head + "INSERT INTO a VALUES ('caf\xe9');\n", d1body.InvalidUTF8, 3, n + 26},
		{"invalid UTF-8 in a name", head + "CREATE TABLE \xff(x);\n", d1body.InvalidUTF8, 3, n + 13},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dst := newFile(t, `CREATE TABLE keep(x)`, `INSERT INTO keep VALUES (1)`)
			before := snapshot(t, dst)
			_, err := Import(context.Background(), dst, strings.NewReader(tc.in), ImportOptions{})
			var te *TextError
			require.ErrorAs(t, err, &te)
			assert.Equal(t, tc.problem, te.Problem)
			assert.Equal(t, tc.line, te.Line)
			assert.Equal(t, tc.offset, te.Offset)
			assert.Contains(t, err.Error(), "import refused: ")
			assert.Contains(t, err.Error(), "; nothing was imported")
			var se *StatementError
			assert.False(t, errors.As(err, &se))
			assert.Equal(t, before, snapshot(t, dst), "nothing was imported")
		})
	}
	var te *TextError
	_, err := Import(context.Background(), filepath.Join(t.TempDir(), "x.db"), strings.NewReader("SELECT 1;\n\x00"), ImportOptions{})
	require.ErrorAs(t, err, &te)
	assert.Equal(t, "import refused: a NUL character (U+0000) at line 2 (byte offset 10 of the file): SQL cannot hold NUL (write such values as blob literals, X'00', or CAST(X'..' AS TEXT)); nothing was imported", err.Error())
}

// TestExportOfNULAndInvalidUTF8TextImports: text values holding NUL or
// bytes that are not UTF-8 (legitimate data: a NUL binds as a parameter)
// are exported as CAST(X'..' AS TEXT), so the dump is clean text that the
// import accepts and the values come back exactly.
func TestExportOfNULAndInvalidUTF8TextImports(t *testing.T) {
	src := newFile(t, `CREATE TABLE b(id INTEGER PRIMARY KEY, v TEXT)`)
	db, err := sqlexec.Open(src, sqlexec.Options{ReadConns: -1})
	require.NoError(t, err)
	_, err = db.Execute(context.Background(), sqlexec.Request{Statements: []sqlexec.Statement{
		{SQL: "INSERT INTO b VALUES (1, ?), (2, ?), (3, CAST(X'ff00c3' AS TEXT))", Params: rawParams(`"a\u0000b"`, `"\u0000"`)},
	}})
	require.NoError(t, err)
	require.NoError(t, db.Close())
	out := exportString(t, src, Options{})
	require.Nil(t, d1body.CheckString(out), "the dump is clean text")
	dst := filepath.Join(t.TempDir(), "dst.db")
	_, err = Import(context.Background(), dst, strings.NewReader(out), ImportOptions{})
	require.NoError(t, err)
	require.Equal(t, snapshot(t, src), snapshot(t, dst))
	conn := openDB(dst, false)
	defer conn.Close()
	var h string
	require.NoError(t, conn.QueryRow(`SELECT group_concat(hex(v), ',') FROM b ORDER BY id`).Scan(&h))
	assert.Equal(t, "610062,00,FF00C3", h)
}

func rawParams(vals ...string) []json.RawMessage {
	out := make([]json.RawMessage, len(vals))
	for i, v := range vals {
		out[i] = json.RawMessage(v)
	}
	return out
}
