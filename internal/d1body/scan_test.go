package d1body

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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
		{"{\"sql\":\"\xff\"}", false, "", false, nil},   // invalid UTF-8
		{"{\"sql\":\"a\x00b\"}", false, "", false, nil}, // raw NUL
		{`{"sql":"a\u0000b"}`, false, "", false, nil},   // escaped NUL
		{"{\"sql\":\"x\",\"params\":[\"\xc3\"]}", false, "", false, nil},
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

func TestCheckText(t *testing.T) {
	cases := []struct {
		body    string
		problem Problem // 0: nil
		offset  int
	}{
		{`{"sql":"SELECT 1"}`, 0, 0},
		{`{"sql":"SELECT ?","params":["a\u0000b"]}`, 0, 0},     // decided on the decoded values
		{`{"sql":"\u00e9 \ud83d\ude00 \uFFFD \\ud800"}`, 0, 0}, // a pair, U+FFFD itself, an escaped backslash
		{"{\"sql\":\"é 😀 \uFFFD\"}", 0, 0},
		{"{\"sql\":\"a\x00b\"}", NUL, 9},
		{"{\"sql\":1}\x00", NUL, 9},
		{"{\"sql\":\"\\\x00\"}", NUL, 9}, // after a backslash: still seen
		{"{\"sql\":\"ab\xffc\"}", InvalidUTF8, 10},
		{"{\"sql\":\"\xed\xa0\x80\"}", InvalidUTF8, 8}, // a surrogate encoded in UTF-8
		{"{\"sql\":\"\xc3\"}", InvalidUTF8, 8},         // cut sequence
		{"{\"name\":\"\\\xe9\"}", InvalidUTF8, 10},
		{`{"sql":"x","params":["\ud800"]}`, LoneSurrogate, 22},
		{`{"sql":"\udc00\ud800"}`, LoneSurrogate, 8},
		{`{"sql":"\ud800\ud800\udc00"}`, LoneSurrogate, 8},
		{`{"sql":"\uD83D"}`, LoneSurrogate, 8},
		{`{"\ud800":1}`, LoneSurrogate, 2},
		{`{"sql":"\u12"}`, 0, 0}, // malformed: the decoder's to report
	}
	for _, tc := range cases {
		err := CheckText([]byte(tc.body))
		if tc.problem == 0 {
			assert.Nil(t, err, "%q", tc.body)
			continue
		}
		if assert.NotNil(t, err, "%q", tc.body) {
			assert.Equal(t, tc.problem, err.Problem, "%q", tc.body)
			assert.Equal(t, tc.offset, err.Offset, "%q", tc.body)
		}
	}
	assert.Equal(t, "a NUL character (U+0000) at byte offset 9", CheckText([]byte("{\"sql\":\"a\x00\"}")).Error())
}

func TestCheckString(t *testing.T) {
	assert.Nil(t, CheckString("SELECT 'é', '\uFFFD'"))
	assert.Equal(t, &TextError{Problem: NUL, Offset: 3}, CheckString("abc\x00def"))
	assert.Equal(t, &TextError{Problem: InvalidUTF8, Offset: 1}, CheckString("a\xffb\x00"), "the first problem")
	assert.Equal(t, &TextError{Problem: NUL, Offset: 1}, CheckString("a\x00\xff"), "the first problem")
	assert.Equal(t, &TextError{Problem: InvalidUTF8, Offset: 6}, CheckString("abc\uFFFD\xc3x"), "U+FFFD itself is fine")
}

// FuzzScan: whatever Scan accepts (with literals checked by the callback, as
// callers must) is valid JSON that decodes to the same SQL, and that SQL holds no NUL and is valid UTF-8 (so
// it reaches SQLite exactly as sent); CheckText passes every accepted body.
func FuzzScan(f *testing.F) {
	for _, s := range []string{`{"sql":"SELECT 1"}`, `{"sql":"SELECT ?","params":["a",1,null]}`,
		"{\"sql\":\"a\x00b\"}", `{"sql":"a\u0000b"}`, "{\"sql\":\"\xff\"}", `{"params":[],"sql":"x"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		sql, _, ok := Scan(b, func(start, end int, isString bool) bool { return isString || json.Valid(b[start:end]) })
		if !ok {
			return
		}
		require.Nil(t, CheckString(string(sql)), "accepted SQL %q", sql)
		require.Nil(t, CheckText(b), "accepted body %q", b)
		var v struct {
			SQL string `json:"sql"`
		}
		require.NoError(t, json.Unmarshal(b, &v), "accepted body %q", b)
		require.Equal(t, string(sql), v.SQL)
	})
}

// FuzzCheckText: CheckText flags a JSON string exactly when decoding it
// would not keep its text. The decoder shows a change as a U+FFFD it made
// up: one the input did not spell (as UTF-8, or as an escape).
func FuzzCheckText(f *testing.F) {
	for _, s := range []string{`"a"`, `"\ud800"`, `"\ud83d\ude00"`, "\"\xff\"", `"\ufffd"`, "\"\x00\"", `"\\ud800"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		terr := CheckText(b)
		var s string
		if json.Unmarshal(b, &s) != nil {
			return
		}
		spelled := bytes.Contains(b, []byte("\uFFFD")) || bytes.Contains(bytes.ToLower(b), []byte("fffd"))
		changed := strings.Contains(s, "\uFFFD") && !spelled
		if changed {
			require.NotNil(t, terr, "decoding %q gave %q silently", b, s)
		}
		if terr != nil && !spelled {
			require.True(t, strings.Contains(s, "\uFFFD"), "%q flagged (%v) but decodes exactly to %q", b, terr, s)
		}
	})
}
