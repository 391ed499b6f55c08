package d1body

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestScan(t *testing.T) {
	type param struct {
		v   string
		str bool
	}
	cases := []struct {
		body      string
		ok        bool
		sql       string
		hasParams bool
		params    []param
	}{
		{`{"sql":"SELECT 1"}`, true, "SELECT 1", false, nil},
		{` { "params" : [ "a" , 1.5e3, true,null ,-2 ] , "sql" : "SELECT ?" } `, true, "SELECT ?", true,
			[]param{{`"a"`, true}, {"1.5e3", false}, {"true", false}, {"null", false}, {"-2", false}}},
		{`{"sql":"x","params":[]}`, true, "x", true, nil},
		{`{"sql":"a\"b"}`, false, "", false, nil},             // escapes go to the decoder
		{`{"sql":"x","sql":"y"}`, false, "", false, nil},      // duplicate key
		{`{"sql":"x","batch":[]}`, false, "", false, nil},     // other keys
		{`{"params":[]}`, false, "", false, nil},              // no sql
		{`{"sql":"x"} x`, false, "", false, nil},              // trailing data
		{`{"sql":"x","params":[[1]]}`, false, "", false, nil}, // nested values
		{`{"sql":"x","params":[1,]}`, false, "", false, nil},
		{"{\"sql\":\"\xff\"}", false, "", false, nil}, // invalid UTF-8
		{`{"SQL":"x"}`, false, "", false, nil},
	}
	for _, tc := range cases {
		var got []param
		b := []byte(tc.body)
		sql, hasParams, ok := Scan(b, func(s, e int, str bool) bool {
			got = append(got, param{string(b[s:e]), str})
			return true
		})
		assert.Equal(t, tc.ok, ok, tc.body)
		if tc.ok {
			assert.Equal(t, tc.sql, string(sql), tc.body)
			assert.Equal(t, tc.hasParams, hasParams, tc.body)
			assert.Equal(t, tc.params, got, tc.body)
		}
	}
	_, _, ok := Scan([]byte(`{"sql":"x","params":[1,2]}`), func(int, int, bool) bool { return false })
	assert.False(t, ok, "a param refused by the callback stops the scan")
}
