package sqlexec

import (
	"bytes"
	"encoding/json"
	"io"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	v4 "github.com/shoaldb/shoal/internal/v4"
)

func bytesReader(b []byte) io.Reader { return bytes.NewReader(b) }

// marshalNoEscape encodes like a v4 writer that turns off HTML escaping
// (encoding/json re-escapes <, > and & in MarshalJSON output otherwise).
func marshalNoEscape(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimRight(buf.Bytes(), "\n"), nil
}

func TestResultTypesAndOrder(t *testing.T) {
	db, _ := openTest(t, Options{})
	run(t, db, stmt("CREATE TABLE t(z INTEGER, a REAL, m TEXT, b BLOB, n)"))
	run(t, db, stmt("INSERT INTO t VALUES (?, ?, ?, ?, ?)",
		json.RawMessage(`9223372036854775807`), 1.5, "h\u00e9\"llo\n<>", json.RawMessage(`[0,1,255]`), nil))
	res := run(t, db, stmt("SELECT * FROM t"))
	b, err := marshalNoEscape(res[0].Results)
	require.NoError(t, err)
	// Keys keep column order (z before a), the integer is exact, the BLOB is
	// an array of bytes, HTML characters are not escaped.
	assert.Equal(t, `[{"z":9223372036854775807,"a":1.5,"m":"hé\"llo\n<>","b":[0,1,255],"n":null}]`, string(b))

	res, err = db.Execute(t.Context(), Request{Statements: []Statement{stmt("SELECT * FROM t")}, Raw: true})
	require.NoError(t, err)
	b, err = marshalNoEscape(res[0].Results)
	require.NoError(t, err)
	assert.Equal(t, `{"columns":["z","a","m","b","n"],"rows":[[9223372036854775807,1.5,"hé\"llo\n<>",[0,1,255],null]]}`, string(b))
}

func TestDuplicateColumns(t *testing.T) {
	db, _ := openTest(t, Options{})
	res := run(t, db, stmt("SELECT 1 AS a, 2 AS b, 3 AS a"))
	b, _ := json.Marshal(res[0].Results)
	// Object mode: like D1's JavaScript object, one key at its first
	// position holding the last value.
	assert.Equal(t, `[{"a":3,"b":2}]`, string(b))
	res, err := db.Execute(t.Context(), Request{Statements: []Statement{stmt("SELECT 1 AS a, 2 AS b, 3 AS a")}, Raw: true})
	require.NoError(t, err)
	b, _ = json.Marshal(res[0].Results)
	assert.Equal(t, `{"columns":["a","b","a"],"rows":[[1,2,3]]}`, string(b))
}

func TestEmptyResultsAreArrays(t *testing.T) {
	db, _ := openTest(t, Options{})
	run(t, db, stmt("CREATE TABLE t(a)"))
	res := run(t, db, stmt("SELECT * FROM t"))
	b, _ := json.Marshal(res)
	assert.Contains(t, string(b), `"results":[]`)
	res, err := db.Execute(t.Context(), Request{Statements: []Statement{stmt("SELECT * FROM t")}, Raw: true})
	require.NoError(t, err)
	b, _ = json.Marshal(res[0].Results)
	assert.Equal(t, `{"columns":["a"],"rows":[]}`, string(b))
}

func TestFloatsAndNonFinite(t *testing.T) {
	db, _ := openTest(t, Options{})
	res := run(t, db, stmt("SELECT 1.0 AS one, 0.1 AS tenth, 1e300*1e300 AS inf, -1e-7 AS small"))
	b, _ := json.Marshal(res[0].Results)
	assert.Equal(t, `[{"one":1,"tenth":0.1,"inf":null,"small":-1e-7}]`, string(b))
}

func TestParamsBindExactly(t *testing.T) {
	db, _ := openTest(t, Options{})
	cases := []struct {
		param    json.RawMessage
		wantType string
		want     any
	}{
		{json.RawMessage(`null`), "null", nil},
		{json.RawMessage(`true`), "integer", int64(1)},
		{json.RawMessage(`false`), "integer", int64(0)},
		{json.RawMessage(`9007199254740993`), "integer", int64(9007199254740993)}, // 2^53+1: float64 would round it
		{json.RawMessage(`-9223372036854775808`), "integer", int64(math.MinInt64)},
		{json.RawMessage(`2.5`), "real", 2.5},
		{json.RawMessage(`1e3`), "real", 1000.0},
		{json.RawMessage(`"text"`), "text", "text"},
		{json.RawMessage(`"esc\u00e9\"\n"`), "text", "escé\"\n"},
		{json.RawMessage(`""`), "text", ""},
		{json.RawMessage(`[104,105]`), "blob", Blob("hi")},
		{json.RawMessage(`[]`), "blob", Blob{}},
	}
	for _, c := range cases {
		res := run(t, db, stmt("SELECT typeof(?1) AS t, ?1 AS v", c.param))
		row := res[0].Results.(Rows)[0]
		assert.Equal(t, c.wantType, row.Values()[0], "param %s", c.param)
		assert.Equal(t, c.want, row.Values()[1], "param %s", c.param)
	}
}

func TestParamErrors(t *testing.T) {
	db, _ := openTest(t, Options{})
	e := runErr(t, db, stmt("SELECT ?", json.RawMessage(`{"a":1}`)))
	assert.Equal(t, v4.CodeInvalidRequest, e.Code)
	e = runErr(t, db, stmt("SELECT ?", json.RawMessage(`[256]`)))
	assert.Equal(t, v4.CodeInvalidRequest, e.Code)
	e = runErr(t, db, stmt("SELECT ?", 1, 2))
	assert.Equal(t, v4.CodeSQL, e.Code)
	assert.Contains(t, e.Message, "Wrong number of parameter bindings")
	assert.Equal(t, WrongParamsMessage, e.Message, "D1's text")
	// With several statements, params bind to the last one (as on D1);
	// a statement before it may not take any.
	e = runErr(t, db, stmt("SELECT ?; SELECT ?", 1))
	assert.Equal(t, v4.CodeSQL, e.Code)
	assert.Equal(t, MultiParamsMessage, e.Message)
	res := run(t, db, stmt("SELECT 1 AS a; SELECT ? AS b", 7))
	require.Len(t, res, 2)
	assert.Equal(t, []any{int64(7)}, res[1].Results.(Rows)[0].Values())
	// Fewer params than placeholders are refused too (D1 binds exactly).
	e = runErr(t, db, stmt("SELECT ?1 AS a, ?2 AS b", 7))
	assert.Equal(t, WrongParamsMessage, e.Message)
	e = runErr(t, db, stmt("SELECT ? AS a"))
	assert.Equal(t, WrongParamsMessage, e.Message)
}

func TestAppendStringMatchesEncodingJSON(t *testing.T) {
	for _, s := range []string{"", "plain", "quote\"back\\slash", "ctl\x00\x01\x1f\t\r\n", "uni é 日本 😀", "bad\xff\xfeutf8", "\u2028\u2029", "<&>"} {
		got := appendString(nil, s)
		var back string
		require.NoError(t, json.Unmarshal(got, &back), "%q -> %s", s, got)
		want, _ := json.Marshal(s)
		var wantBack string
		require.NoError(t, json.Unmarshal(want, &wantBack))
		assert.Equal(t, wantBack, back, "%q", s)
	}
}
