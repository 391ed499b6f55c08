package sqlexec

import (
	"context"
	"database/sql"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// AppendResults must write exactly what encoding/json writes for the same
// results (the host used to encode them with it), for both result shapes
// and every value type, including escapes, HTML characters, non-ASCII,
// duplicate column names, BLOBs, floats and empty results.
func TestAppendResultsMatchesEncodingJSON(t *testing.T) {
	db, _ := openTest(t, Options{Region: "weur<&>", Host: "host-\"1\""})
	run(t, db, stmt("CREATE TABLE t (i INTEGER, f REAL, s TEXT, b BLOB, n)"))
	run(t, db, stmt("INSERT INTO t VALUES (1, 1.0, 'a<b>&\"\\\n\u2028é', x'00ff10', NULL), (-9007199254740993, 1e-7, '', x'', 1e21)"))
	reqs := []Request{
		{Statements: []Statement{stmt("SELECT * FROM t ORDER BY i")}},
		{Statements: []Statement{stmt("SELECT i AS x, s AS x, f FROM t ORDER BY i")}},
		{Statements: []Statement{stmt("SELECT * FROM t WHERE 0")}},
		{Statements: []Statement{stmt("INSERT INTO t (i) VALUES (?)", 5), stmt("SELECT count(*) AS c, 2.5 AS h FROM t")}},
		{Statements: []Statement{stmt("SELECT * FROM t ORDER BY i")}, Raw: true},
		{Statements: []Statement{stmt("SELECT * FROM t WHERE 0")}, Raw: true},
		{Statements: []Statement{stmt("UPDATE t SET n = 1 WHERE i = 5")}, Raw: true},
	}
	for i, req := range reqs {
		res, err := db.Execute(context.Background(), req)
		require.NoError(t, err)
		want, err := marshalNoEscape(res)
		require.NoError(t, err)
		assert.Equal(t, string(want), string(AppendResults(nil, res)), "request %d", i)
	}
	// Shapes Execute does not produce but a caller may build.
	hand := []StatementResult{
		{Results: Rows(nil), Success: true},
		{Results: (*RawResults)(nil)},
		{Results: nil, Meta: Meta{Duration: 1.5e-7, Timings: Timings{SQLDurationMs: 12345678.25}}},
		{Results: map[string]int{"a": 1}},
	}
	want, err := marshalNoEscape(hand)
	require.NoError(t, err)
	assert.Equal(t, string(want), string(AppendResults(nil, hand)))
	assert.Equal(t, "[]", string(AppendResults(nil, nil)))
}

// parseStrict is ParseBody without the fast path.
func parseStrict(data []byte) (Request, error) {
	return parseBodyDecoder(data)
}

var parseSeeds = []string{
	`{"sql":"SELECT 1"}`,
	` { "sql" : "SELECT ?" , "params" : [ 1 , -2.5e3 , "x" , true , false , null ] } `,
	`{"params":[1],"sql":"SELECT ?"}`,
	`{"sql":"SELECT 1","params":[]}`,
	`{"sql":"é ✓ \u00e9"}`,
	`{"sql":"a\"b"}`,
	`{"sql":"SELECT 1","sql":"SELECT 2"}`,
	`{"SQL":"SELECT 1"}`,
	`{"sql":"SELECT 1","extra":1}`,
	`{"sql":"SELECT ?","params":[01]}`,
	`{"sql":"SELECT ?","params":[1.]}`,
	`{"sql":"SELECT ?","params":[nul]}`,
	`{"sql":"SELECT ?","params":[[1,2]]}`,
	`{"sql":"SELECT ?","params":[1,]}`,
	`{"sql":"SELECT ?","params":null}`,
	`{"sql":null}`,
	`{"sql":"x"}x`,
	`{"sql":"x"`,
	"{\"sql\":\"\xff\"}",
	"{\"sql\":\"a\tb\"}",
	`{"batch":[{"sql":"SELECT 1"}]}`,
	`{}`,
	``,
	`{"sql":"SELECT ?","params":[99999999999999999999]}`,
	`{"sql":"SELECT ?","params":["\u0041"]}`,
	`{"sql":"SELECT ?","params":[1e400]}`,
}

// The fast path must give exactly the decoder's Request whenever it
// accepts a body, and leave every error to the decoder.
func TestParseSimpleAgreesWithDecoder(t *testing.T) {
	accepted := 0
	for _, s := range parseSeeds {
		checkParseAgrees(t, []byte(s))
		if _, ok := parseSimple([]byte(s)); ok {
			accepted++
		}
	}
	assert.GreaterOrEqual(t, accepted, 5, "the fast path takes the common bodies")
}

func checkParseAgrees(t *testing.T, data []byte) {
	req, ok := parseSimple(data)
	if !ok {
		return
	}
	want, err := parseStrict(data)
	require.NoError(t, err, "fast path accepted a body the decoder refuses: %q", data)
	assert.Equal(t, want, req, "body %q", data)
	got, err := ParseBody(data)
	require.NoError(t, err)
	assert.Equal(t, want, got)
}

func FuzzParseSimple(f *testing.F) {
	for _, s := range parseSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) { checkParseAgrees(t, data) })
}

// Databases open through the unix-excl VFS with a persistent WAL: other
// connections of this process (mattn/go-sqlite3, as the dump package uses)
// still read and write them while a DB is open, in either opening order;
// a closed database leaves an empty -wal and no -shm.
func TestSameProcessConnectionsShareTheFile(t *testing.T) {
	db, path := openTest(t, Options{ReadConns: 1})
	run(t, db, stmt("CREATE TABLE t (v)"), stmt("INSERT INTO t VALUES (1)"))

	other, err := sql.Open("sqlite3", "file:"+path+"?_busy_timeout=5000")
	require.NoError(t, err)
	defer other.Close()
	var n int
	require.NoError(t, other.QueryRow("SELECT count(*) FROM t").Scan(&n))
	assert.Equal(t, 1, n, "sees the DB's committed write")
	_, err = other.Exec("INSERT INTO t VALUES (2)")
	require.NoError(t, err)
	for i := 0; i < 2; i++ { // writer, then a reader once known read-only
		res := run(t, db, stmt("SELECT count(*) AS n FROM t"))
		assert.EqualValues(t, 2, res[0].Results.(Rows)[0].Values()[0])
	}
	require.NoError(t, other.Close())
	require.NoError(t, db.Close())

	fi, err := os.Stat(path + "-wal")
	require.NoError(t, err, "the WAL file is kept")
	assert.Zero(t, fi.Size(), "and checkpointed empty")
	_, err = os.Stat(path + "-shm")
	assert.True(t, os.IsNotExist(err), "no -shm file: the WAL index is in memory")

	// The other connection first, then a DB.
	other, err = sql.Open("sqlite3", "file:"+path+"?_busy_timeout=5000")
	require.NoError(t, err)
	defer other.Close()
	require.NoError(t, other.QueryRow("SELECT count(*) FROM t").Scan(&n))
	db2, err := Open(path, Options{ReadConns: 1})
	require.NoError(t, err)
	defer db2.Close()
	assert.Equal(t, 2, n)
	run(t, db2, stmt("INSERT INTO t VALUES (3)"))
	require.NoError(t, other.QueryRow("SELECT count(*) FROM t").Scan(&n))
	assert.Equal(t, 3, n)
	// The other connection closing last may leave the WAL uncheckpointed;
	// nothing is lost.
	require.NoError(t, db2.Close())
	require.NoError(t, other.Close())
	db3, err := Open(path, Options{ReadConns: 1})
	require.NoError(t, err)
	defer db3.Close()
	res := run(t, db3, stmt("SELECT count(*) AS n FROM t"))
	assert.EqualValues(t, 3, res[0].Results.(Rows)[0].Values()[0])
}
