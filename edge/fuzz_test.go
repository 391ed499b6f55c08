package edge

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

// FuzzQueryBody: parseQueryBody never panics, and whatever it accepts is a
// body the object host can decode into one or more statements within limits.
func FuzzQueryBody(f *testing.F) {
	for _, s := range []string{
		`{"sql":"SELECT 1"}`, `{"sql":"SELECT ?","params":[1,"a",null,true,[1,2]]}`,
		`{"batch":[{"sql":"SELECT 1"},{"sql":"SELECT ?","params":["x"]}]}`, `{"sql":1}`, `{}`, `[]`, `null`,
		`{"sql":"x","params":{}}`, `{"batch":[]}`, `{"sql":"x"} {}`,
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
		n := len(q.Batch)
		if q.Batch == nil {
			n = 1
			require.NotNil(t, q.SQL)
			require.LessOrEqual(t, len(*q.SQL), l.MaxSQLBytes)
			require.LessOrEqual(t, len(q.Params), l.MaxParams)
		}
		require.GreaterOrEqual(t, n, 1)
		for _, st := range q.Batch {
			require.NotNil(t, st.SQL)
			require.LessOrEqual(t, len(st.Params), l.MaxParams)
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
