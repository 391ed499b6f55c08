package sqlexec

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	v4 "github.com/shoaldb/shoal/internal/v4"
)

// TestExecuteRefusesNULAndInvalidUTF8: SQLite reads SQL only up to its
// first NUL, so "INSERT 1; \0 INSERT 2" would run the first INSERT and
// answer success. Execute refuses such SQL (and SQL that is not UTF-8)
// before anything runs, on the reader and the writer paths, and the table
// is unchanged.
func TestExecuteRefusesNULAndInvalidUTF8(t *testing.T) {
	db, _ := openTest(t, Options{})
	run(t, db, stmt("CREATE TABLE t(x)"), stmt("INSERT INTO t VALUES (0)"))
	cases := []struct {
		name  string
		stmts []Statement
		idx   int
		want  string
	}{
		{"NUL between statements", []Statement{stmt("INSERT INTO t VALUES(1); \x00 INSERT INTO t VALUES(2); SELECT 2")}, 0,
			"statement 0: SQL contains a NUL character (U+0000) at byte offset 25: SQLite would ignore everything after it"},
		{"NUL at the end", []Statement{stmt("INSERT INTO t VALUES(1);\x00")}, 0, "NUL character (U+0000) at byte offset 24"},
		{"NUL at the start", []Statement{stmt("\x00DELETE FROM t")}, 0, "at byte offset 0"},
		{"NUL in a literal", []Statement{stmt("INSERT INTO t VALUES('a\x00b')")}, 0, "at byte offset 23"},
		{"NUL with params", []Statement{stmt("INSERT INTO t VALUES(?)\x00", 1)}, 0, "at byte offset 23"},
		{"NUL in a later batch entry", []Statement{stmt("INSERT INTO t VALUES(1)"), stmt("DELETE FROM t;\x00")}, 1,
			"statement 1: SQL contains a NUL character (U+0000) at byte offset 14"},
		{"NUL in a read", []Statement{stmt("SELECT 1\x00; DELETE FROM t")}, 0, "at byte offset 8"},
		{"invalid UTF-8", []Statement{stmt("INSERT INTO t VALUES('\xff')")}, 0, "statement 0: SQL contains invalid UTF-8 at byte offset 22: SQL must be UTF-8"},
		{"invalid UTF-8 in a later batch entry", []Statement{stmt("INSERT INTO t VALUES(1)"), stmt("INSERT INTO \xc3t VALUES(2)")}, 1, "invalid UTF-8 at byte offset 12"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := runErr(t, db, tc.stmts...)
			assert.Equal(t, v4.CodeInvalidRequest, e.Code)
			assert.Equal(t, tc.idx, e.Statement)
			assert.Contains(t, e.Message, tc.want)
			assert.Equal(t, int64(1), scalar(t, db, "SELECT count(*) FROM t"), "nothing was written")
			assert.Equal(t, int64(0), scalar(t, db, "SELECT x FROM t"))
		})
	}
}

// TestNULInParamsIsStoredExactly: a NUL inside a string parameter is data:
// it is bound (not parsed), stored and read back byte for byte.
func TestNULInParamsIsStoredExactly(t *testing.T) {
	db, _ := openTest(t, Options{})
	run(t, db, stmt("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)"))
	values := []string{"a\x00b", "\x00", "\x00\x00x\x00", "é\x00😀"}
	for i, v := range values {
		req, err := ParseBody(mustJSON(t, map[string]any{"sql": "INSERT INTO t VALUES (?, ?)", "params": []any{i, v}}))
		require.NoError(t, err)
		_, err = db.Execute(context.Background(), req)
		require.NoError(t, err)
	}
	for i, v := range values {
		res := run(t, db, stmt("SELECT v, hex(v) AS h, length(CAST(v AS BLOB)) AS n, v = ? AS same FROM t WHERE id = ?", v, i))
		rows := rowsOf(t, res[0])
		require.Len(t, rows, 1)
		assert.Equal(t, v, rows[0]["v"], "read back exactly")
		assert.Equal(t, strings.ToUpper(hex.EncodeToString([]byte(v))), rows[0]["h"])
		assert.Equal(t, json.Number(strconv.Itoa(len(v))), rows[0]["n"])
		assert.Equal(t, json.Number("1"), rows[0]["same"])
	}
}

// TestParseBodyTextRules: the decoder path refuses NUL in SQL, raw NUL, and
// invalid UTF-8 or unpaired surrogate escapes anywhere (which it would
// otherwise turn into U+FFFD), and accepts NUL in parameters.
func TestParseBodyTextRules(t *testing.T) {
	refused := []struct{ body, want string }{
		{`{"sql":"INSERT INTO t VALUES(1); \u0000 INSERT INTO t VALUES(2); SELECT 2"}`, "statement 0: SQL contains a NUL character (U+0000) at byte offset 25"},
		{`{"batch":[{"sql":"SELECT 1"},{"sql":"SELECT 2\u0000"}]}`, "statement 1: SQL contains a NUL character (U+0000) at byte offset 8"},
		{`{"sql":"SELECT ?\u0000","params":[1]}`, "statement 0: SQL contains a NUL"},
		{"{\"sql\":\"SELECT 1\x00\"}", "invalid request body: a NUL character (U+0000) at byte offset 16"},
		{"{\"sql\":\"SELECT '\xff'\"}", "invalid request body: invalid UTF-8 at byte offset 16: the body must be UTF-8"},
		{"{\"sql\":\"SELECT ?\",\"params\":[\"\xff\"]}", "invalid UTF-8 at byte offset 29"},
		{`{"sql":"SELECT '\ud800'"}`, "an unpaired UTF-16 surrogate escape at byte offset 16"},
		{`{"sql":"SELECT ?","params":["\udc00"]}`, "an unpaired UTF-16 surrogate escape at byte offset 29"},
	}
	for _, tc := range refused {
		_, err := ParseBody([]byte(tc.body))
		var e *Error
		if assert.ErrorAs(t, err, &e, "%q", tc.body) {
			assert.Equal(t, v4.CodeInvalidRequest, e.Code)
			assert.Contains(t, e.Message, tc.want)
		}
	}
	req, err := ParseBody([]byte(`{"sql":"SELECT ?, '\ud83d\ude00', '\ufffd'","params":["a\u0000b"]}`))
	require.NoError(t, err)
	assert.Equal(t, "SELECT ?, '😀', '\uFFFD'", req.Statements[0].SQL)
	p, err := decodeParam(req.Statements[0].Params[0])
	require.NoError(t, err)
	assert.Equal(t, "a\x00b", p.s)
}

// TestExecScriptRefusesNUL: a script statement holding a NUL fails the
// script, which is rolled back whole (imports are all or nothing).
func TestExecScriptRefusesNUL(t *testing.T) {
	db, _ := openTest(t, Options{})
	for _, bad := range []string{"\x00 INSERT INTO s VALUES (2)", "INSERT INTO s VALUES (2);\x00", "INSERT INTO s VALUES ('\xfe')"} {
		_, err := db.ExecScript(context.Background(), lines(
			"CREATE TABLE s(x)",
			"INSERT INTO s VALUES (1)",
			bad,
			"INSERT INTO s VALUES (3)",
		), ScriptOptions{})
		se := scriptErr(t, err)
		assert.Equal(t, 3, se.Statement, "%q", bad)
		var e *Error
		require.ErrorAs(t, err, &e)
		assert.Equal(t, v4.CodeInvalidRequest, e.Code)
		assert.Regexp(t, `^SQL contains (a NUL character \(U\+0000\)|invalid UTF-8) at byte offset \d+`, e.Message)
		assert.Equal(t, int64(0), scalar(t, db, "SELECT count(*) FROM sqlite_schema WHERE name = 's'"), "rolled back: %q", bad)
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return b
}
