package edge

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/internal/d1body"
)

// FuzzQueryBody: parseQueryBody never panics, and whatever it accepts is a
// body the object host can decode into one or more statements within limits,
// whose SQL holds no NUL (SQLite would stop there) and which decodes to
// exactly what was sent (d1body.CheckText).
func FuzzQueryBody(f *testing.F) {
	for _, s := range []string{
		`{"sql":"SELECT 1"}`, `{"sql":"SELECT ?","params":[1,"a",null,true,[1,2]]}`,
		`{"batch":[{"sql":"SELECT 1"},{"sql":"SELECT ?","params":["x"]}]}`, `{"sql":1}`, `{}`, `[]`, `null`,
		`{"sql":"x","params":{}}`, `{"batch":[]}`, `{"sql":"x"} {}`,
		`{"sql":"SELECT 1;\u0000SELECT 2"}`, `{"batch":[{"sql":"x\u0000"}]}`, "{\"sql\":\"\xff\"}",
		`{"sql":"SELECT ?","params":["\u0000"]}`, `{"sql":"\ud800"}`,
	} {
		f.Add([]byte(s))
	}
	var l Limits
	l.defaults()
	f.Fuzz(func(t *testing.T, b []byte) {
		q, err := parseQueryBody(b, l)
		if err != nil {
			var ve *validationError
			require.ErrorAs(t, err, &ve)
			require.True(t, ve.status == 400 || ve.status == 413)
			return
		}
		var again QueryBody
		require.NoError(t, json.Unmarshal(b, &again))
		require.Nil(t, d1body.CheckText(b), "accepted %q", b)
		n := len(q.Batch)
		if q.Batch == nil {
			n = 1
			require.NotNil(t, q.SQL)
			require.LessOrEqual(t, len(*q.SQL), l.MaxSQLBytes)
			require.LessOrEqual(t, len(q.Params), l.MaxParams)
			require.Nil(t, d1body.CheckString(*q.SQL), "accepted SQL %q", *q.SQL)
		}
		require.GreaterOrEqual(t, n, 1)
		for _, st := range q.Batch {
			require.NotNil(t, st.SQL)
			require.LessOrEqual(t, len(st.Params), l.MaxParams)
			require.Nil(t, d1body.CheckString(*st.SQL), "accepted SQL %q", *st.SQL)
		}
	})
}

// FuzzCreateBody: parseCreateBody never panics and accepted names follow
// D1's rules.
func FuzzCreateBody(f *testing.F) {
	for _, s := range []string{`{"name":"db"}`, `{"name":"db","primary_location_hint":"weur"}`,
		`{"name":"db","jurisdiction":"eu"}`, `{"name":""}`, `{"name":"A"}`, `{"nam":"x"}`, `{"name":1}`} {
		f.Add([]byte(s))
	}
	var l Limits
	l.defaults()
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := parseCreateBody(b, l)
		if err != nil {
			return
		}
		require.NotNil(t, c.Name)
		require.NotEmpty(t, *c.Name)
		require.LessOrEqual(t, len(*c.Name), l.MaxNameBytes)
		for _, r := range *c.Name {
			require.True(t, (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') || r == '-' || r == '_', "name %q", *c.Name)
		}
	})
}

// FuzzValidateQueryBody: the allocation-free scan of the query path accepts
// only bodies parseQueryBody accepts, and validateQueryBody gives the same
// verdict as parseQueryBody on every input.
// FuzzForkBody: a fork body either parses into a valid name and at most
// one of bookmark (lowercase hex and '-', bounded) and timestamp, or is a
// 400 validation error.
func FuzzForkBody(f *testing.F) {
	for _, s := range []string{`{"name":"f"}`, `{"name":"f","bookmark":"0006-ab"}`, `{"name":"f","timestamp":"2026-12-01T00:00:00Z"}`,
		`{"name":"f","bookmark":"x","timestamp":"y"}`, `{"name":"f","bookmark":"ZZ"}`, `{"name":"f","primary_location_hint":"mars"}`,
		`{"bookmark":"00"}`, `{"name":"f","bookmark":""}`, `{"name":"f","extra":1}`} {
		f.Add([]byte(s))
	}
	var l Limits
	l.defaults()
	f.Fuzz(func(t *testing.T, b []byte) {
		fb, err := parseForkBody(b, l)
		if err != nil {
			var ve *validationError
			require.ErrorAs(t, err, &ve)
			require.Equal(t, 400, ve.status)
			return
		}
		require.NotNil(t, fb.Name)
		require.NoError(t, checkName(*fb.Name, l))
		require.False(t, fb.Bookmark != nil && fb.Timestamp != nil)
		if fb.Bookmark != nil {
			require.NotEmpty(t, *fb.Bookmark)
			require.LessOrEqual(t, len(*fb.Bookmark), maxBookmarkBytes)
			for _, c := range *fb.Bookmark {
				require.True(t, c == '-' || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'), "bookmark %q", *fb.Bookmark)
			}
		}
	})
}

func FuzzValidateQueryBody(f *testing.F) {
	for _, s := range []string{
		`{"sql":"SELECT 1"}`, `{"sql":"SELECT ?","params":[1,"a",null,true,false,-1.5e+3]}`,
		` { "params" : [ 2 ] , "sql" : "SELECT ?" } `, `{"sql":"SELECT ?","params":[01]}`,
		`{"sql":"SELECT ?","params":[nul]}`, `{"sql":"SELECT ?","params":[1,]}`, `{"sql":"  "}`,
		`{"sql":"x","sql":"y"}`, `{"SQL":"x"}`, `{"sql":"x\n"}`, `{"sql":"x"}x`, `{"sql":"\u00e9"}`,
		`{"sql":"x","params":[[1,2]]}`, `{"batch":[{"sql":"SELECT 1"}]}`, `{"sql":"x","params":[-]}`,
		`{"sql":"a\u0000"}`, "{\"sql\":\"a\x00\"}", "{\"sql\":\"\xc3\"}", `{"sql":"x","params":["\u0000"]}`,
	} {
		f.Add([]byte(s))
	}
	l := Limits{MaxSQLBytes: 16, MaxParams: 3, MaxParamString: 4}
	l.defaults()
	f.Fuzz(func(t *testing.T, b []byte) {
		_, full := parseQueryBody(b, l)
		if validSimpleQuery(b, l) {
			require.NoError(t, full, "fast path accepted %q", b)
			sql, _, _ := d1body.Scan(b, func(int, int, bool) bool { return true })
			require.Nil(t, d1body.CheckString(string(sql)), "fast path accepted SQL %q", sql)
		}
		require.Equal(t, full == nil, validateQueryBody(b, l) == nil)
	})
}

// TestValidateQueryBodyFastPath: the common bodies take the scan (no
// allocation) and the limits hold on it.
func TestValidateQueryBodyFastPath(t *testing.T) {
	var l Limits
	l.defaults()
	for _, b := range []string{`{"sql":"SELECT v FROM kv WHERE id = ?","params":[42]}`,
		`{"params":["a",null,true,1.5],"sql":"SELECT ?"}`, `{"sql":"SELECT 1"}`, `{"sql":"SELECT 1","params":[]}`} {
		body := []byte(b)
		require.True(t, validSimpleQuery(body, l), b)
		require.Zero(t, testing.AllocsPerRun(10, func() { _ = validateQueryBody(body, l) }), b)
	}
	small := Limits{MaxSQLBytes: 5, MaxParams: 1, MaxParamString: 2}
	small.defaults()
	for _, b := range []string{`{"sql":"SELECT 1"}`, `{"sql":"x","params":[1,2]}`, `{"sql":"x","params":["abc"]}`} {
		require.False(t, validSimpleQuery([]byte(b), small), b)
		require.Error(t, validateQueryBody([]byte(b), small), b)
	}
}
