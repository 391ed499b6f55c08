package sqlexec

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestParamsScratch: a connection decodes every request's parameters into
// the same scratch (decodeParams). Each statement of a request binds its
// own values, requests with more, fewer or no parameters follow each
// other on the writer and on a reader, a refused parameter fails only its
// request, and after every request the scratch holds no value (no
// request's strings or blobs stay reachable from the connection).
func TestParamsScratch(t *testing.T) {
	db, _ := openTest(t, Options{ReadConns: 1})
	run(t, db, stmt("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT, b BLOB)"))
	res := run(t, db,
		stmt("INSERT INTO t VALUES (?, ?, NULL)", 1, "one"),
		stmt("INSERT INTO t VALUES (?, ?, ?)", 2, "two", []int{1, 2}),
		stmt("INSERT INTO t VALUES (3, 'three', NULL)"),
		stmt("INSERT INTO t VALUES (?, ?, NULL)", 4, "four"))
	require.Len(t, res, 4)
	for i := 0; i < 3; i++ { // the same SQL twice: the reader serves it once learned read-only
		res = run(t, db, stmt("SELECT v FROM t WHERE k = ?", 2), stmt("SELECT count(*) AS n FROM t"), stmt("SELECT v FROM t WHERE k = ? OR k = ? ORDER BY k", 1, 4))
		require.Len(t, res, 3)
		assert.Equal(t, []map[string]any{{"v": "two"}}, rowsOf(t, res[0]))
		assert.Equal(t, []map[string]any{{"v": "one"}, {"v": "four"}}, rowsOf(t, res[2]))
	}
	e := runErr(t, db, stmt("SELECT ?, ?", 1, map[string]any{"not": "a value"}))
	assert.Equal(t, 0, e.Statement)
	res = run(t, db, stmt("SELECT ? AS s", "after"))
	assert.Equal(t, []map[string]any{{"s": "after"}}, rowsOf(t, res[0]))

	conns := append([]*conn{db.writerConn}, db.readerConns...)
	require.Len(t, conns, 2, "the reader was opened")
	for _, c := range conns {
		for _, p := range c.paramVals[:cap(c.paramVals)] {
			assert.Equal(t, param{}, p, "writer %v", c.writer)
		}
		for _, s := range c.paramSlices[:cap(c.paramSlices)] {
			assert.Nil(t, s, "writer %v", c.writer)
		}
	}
}

// DESIGN.md states the scratch's bound.
func TestParamsScratchAsDocumented(t *testing.T) {
	doc, err := os.ReadFile("DESIGN.md")
	require.NoError(t, err)
	assert.Contains(t, strings.Join(strings.Fields(string(doc)), " "), "room for at most 1,024 values is kept")
	assert.Equal(t, 1024, maxKeptParams)
}
