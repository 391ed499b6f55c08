package edge

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/internal/d1body"
)

// TestNULAndInvalidUTF8AreRefused: a NUL in SQL (escaped or raw), invalid
// UTF-8 or an unpaired surrogate escape anywhere, and any of them in a name,
// is a 400/7400 that says what and where — on the bearer, raw and binding
// paths — and nothing reaches a host or the catalog. SQLite stops at a NUL,
// so forwarding such SQL would run a truncated request and answer success.
func TestNULAndInvalidUTF8AreRefused(t *testing.T) {
	e := newEnv(t)
	d := e.create(acctA, tokA, "db1")
	a := e.call("POST", dbPath(acctA)+"/"+d.UUID+"/binding", tokA, nil)
	require.Equal(t, 200, a.Status, "%s", a.Raw)
	var m mintResult
	require.NoError(t, json.Unmarshal(a.Result, &m))
	qp := dbPath(acctA) + "/" + d.UUID
	cases := []struct {
		name, method, path, auth, body string
		want                           string // in the message
	}{
		{"escaped NUL in sql", "POST", qp + "/query", tokA,
			`{"sql":"INSERT INTO t VALUES(1); \u0000 INSERT INTO t VALUES(2); SELECT 2"}`,
			"Invalid property: sql => contains a NUL character (U+0000) at byte offset 25: SQLite would ignore everything after it"},
		{"escaped NUL in sql, raw", "POST", qp + "/raw", tokA, `{"sql":"SELECT 1\u0000"}`, "sql => contains a NUL character (U+0000) at byte offset 8"},
		{"escaped NUL with params", "POST", qp + "/query", tokA, `{"sql":"SELECT ?\u0000","params":[1]}`, "sql => contains a NUL character"},
		{"raw NUL in sql", "POST", qp + "/query", tokA, "{\"sql\":\"SELECT 1;\x00SELECT 2\"}",
			"malformed JSON body: a NUL character (U+0000) at byte offset 17: JSON text cannot hold a raw NUL byte"},
		{"escaped NUL in a batch element", "POST", qp + "/query", tokA,
			`{"batch":[{"sql":"SELECT 1"},{"sql":"SELECT 2;\u0000DELETE FROM t"}]}`,
			"Invalid property: batch[1].sql => contains a NUL character (U+0000) at byte offset 9"},
		{"raw NUL in a batch element", "POST", qp + "/query", tokA, "{\"batch\":[{\"sql\":\"SELECT 1\x00\"}]}", "a NUL character (U+0000) at byte offset 26"},
		{"invalid UTF-8 in sql", "POST", qp + "/query", tokA, "{\"sql\":\"SELECT '\xff'\"}",
			"malformed JSON body: invalid UTF-8 at byte offset 16: the body must be UTF-8"},
		{"invalid UTF-8 in a batch element", "POST", qp + "/query", tokA, "{\"batch\":[{\"sql\":\"SELECT '\xc3'\"}]}", "invalid UTF-8 at byte offset 26"},
		{"invalid UTF-8 in a param", "POST", qp + "/query", tokA, "{\"sql\":\"SELECT ?\",\"params\":[\"\xe9t\xe9\"]}", "invalid UTF-8 at byte offset 29"},
		{"unpaired surrogate in sql", "POST", qp + "/query", tokA, `{"sql":"SELECT '\ud800'"}`, "an unpaired UTF-16 surrogate escape at byte offset 16"},
		{"binding token, escaped NUL", "POST", "/client/v4/bound/query", "Binding " + m.Token, `{"sql":"SELECT 1;\u0000SELECT 2"}`, "sql => contains a NUL character (U+0000) at byte offset 9"},
		{"binding token, raw NUL", "POST", "/client/v4/bound/raw", "Binding " + m.Token, "{\"sql\":\"SELECT 1;\x00\"}", "a NUL character (U+0000) at byte offset 17"},
		{"binding token, invalid UTF-8", "POST", qp + "/query", "Binding " + m.Token, "{\"sql\":\"SELECT '\xff'\"}", "invalid UTF-8 at byte offset 16"},
		{"escaped NUL in a name", "POST", dbPath(acctA), tokA, `{"name":"db\u0000x"}`,
			"Invalid property: name => use lowercase letters, digits, '-' and '_' (starting with a letter or digit); byte offset 2 is a NUL character (U+0000)"},
		{"raw NUL in a name", "POST", dbPath(acctA), tokA, "{\"name\":\"db\x00x\"}", "a NUL character (U+0000) at byte offset 11"},
		{"invalid UTF-8 in a name", "POST", dbPath(acctA), tokA, "{\"name\":\"db\xff\"}", "invalid UTF-8 at byte offset 11"},
		{"valid UTF-8 in a name", "POST", dbPath(acctA), tokA, `{"name":"dbé"}`, "byte offset 2 is not ASCII"},
		{"NUL in the list filter", "GET", dbPath(acctA) + "?name=db%00", tokA, "", "Invalid property: name => contains a NUL character (U+0000) at byte offset 2"},
		{"invalid UTF-8 in the list filter", "GET", dbPath(acctA) + "?name=%ff", tokA, "", "Invalid property: name => contains invalid UTF-8 at byte offset 0"},
		{"invalid UTF-8 in a control body", "POST", qp + "/binding", tokA, "{\"ttl_seconds\":1}\xff", "invalid UTF-8 at byte offset 17"},
	}
	queries := func() int64 { return e.hosts[0].queries.Load() + e.hosts[1].queries.Load() }
	before, creates := queries(), e.cat.count("CreateDatabase")
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var body any
			if c.body != "" {
				body = c.body
			}
			a := e.call(c.method, c.path, c.auth, body)
			assert.Equal(t, 400, a.Status, "%s", a.Raw)
			assert.Equal(t, 7400, a.code(), "%s", a.Raw)
			assert.False(t, a.Success)
			if assert.Len(t, a.Errors, 1) {
				assert.Contains(t, a.Errors[0].Message, c.want)
			}
		})
	}
	assert.Equal(t, before, queries(), "no refused query reaches a host")
	assert.Equal(t, creates, e.cat.count("CreateDatabase"), "no refused name reaches the catalog")
}

// TestNULInParamsIsForwardedExactly: a NUL inside a parameter string is data
// (SQLite stores it), and the body reaches the host byte for byte, on both
// the fast path and the decoder path.
func TestNULInParamsIsForwardedExactly(t *testing.T) {
	e := newEnv(t)
	d := e.create(acctA, tokA, "db1")
	qp := dbPath(acctA) + "/" + d.UUID + "/query"
	for _, body := range []string{
		`{"sql":"INSERT INTO t VALUES(?)","params":["a\u0000b"]}`,
		`{"batch":[{"sql":"INSERT INTO t VALUES(?, ?)","params":["\u0000", "x\u0000\u0000y"]}]}`,
		`{"sql":"SELECT '\uFFFD', ?","params":["\ud83d\ude00"]}`, // U+FFFD spelled out and a surrogate pair are exact
		"{\"sql\":\"SELECT 'é'\"}",
	} {
		a := e.call("POST", qp, tokA, body)
		require.Equal(t, 200, a.Status, "%s: %s", body, a.Raw)
		var got []byte
		for _, h := range e.hosts {
			h.mu.Lock()
			if h.lastQuery != nil {
				got = h.lastQuery
			}
			h.mu.Unlock()
		}
		assert.Equal(t, body, string(got), "forwarded unchanged")
	}
}

// TestQueryBodyTextRules: parseQueryBody and the fast path agree on the text
// rules, and nothing either accepts holds NUL or invalid UTF-8 in SQL.
func TestQueryBodyTextRules(t *testing.T) {
	var l Limits
	l.defaults()
	for _, b := range []string{
		`{"sql":"a\u0000"}`, "{\"sql\":\"a\x00\"}", "{\"sql\":\"\xff\"}", `{"sql":"\udfff"}`,
		`{"batch":[{"sql":"x\u0000"}]}`, "{\"sql\":\"x\",\"params\":[\"\xff\"]}", `{"sql":"x","params":["\ud800"]}`,
	} {
		assert.False(t, validSimpleQuery([]byte(b), l), "%q", b)
		assert.Error(t, validateQueryBody([]byte(b), l), "%q", b)
	}
	for _, b := range []string{`{"sql":"x","params":["\u0000"]}`, `{"sql":"\u00e9\ud83d\ude00"}`} {
		assert.NoError(t, validateQueryBody([]byte(b), l), "%q", b)
	}
	assert.Nil(t, d1body.CheckString("SELECT 1"))
}
