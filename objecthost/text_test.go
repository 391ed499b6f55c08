package objecthost

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/internal/binding"
	v4 "github.com/shoaldb/shoal/internal/v4"
)

// TestHTTPRefusesNULAndInvalidUTF8: the host takes queries straight from
// edges and through binding tokens, so it refuses SQL it would not run
// exactly by itself, whatever the caller checked: a NUL in SQL (escaped or
// raw), invalid UTF-8 or an unpaired surrogate escape anywhere. 400/7400,
// the message says where, and the table is unchanged. A NUL inside a
// parameter is stored and read back exactly.
func TestHTTPRefusesNULAndInvalidUTF8(t *testing.T) {
	ring, err := binding.NewKeyring([]byte(strings.Repeat("k", 32)))
	require.NoError(t, err)
	th := newTestHost(t, func(c *Config) { c.Bindings = ring })
	srv := serve(t, th)
	c := srv.Client()
	d := newDB("acct")
	th.mustInit(t, d)
	_, err = th.Confirm(context.Background(), d.obj, 4)
	require.NoError(t, err)
	tok, err := ring.Sign(binding.Claims{DatabaseUUID: d.uuid, ObjectID: d.obj, AccountID: d.account, HostAddress: "h:1",
		Generation: 4, ExpiresAt: th.clock.Now().Add(time.Hour).Unix(), TokenID: binding.NewTokenID(), Parent: strings.Repeat("ab", 32)})
	require.NoError(t, err)
	base := "/v1/objects/" + d.obj
	status, env := call(t, c, srv, "POST", base+"/query", &d, `{"sql":"CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT); INSERT INTO t VALUES (0, 'zero')"}`)
	require.Equal(t, 200, status, "%+v", env)

	bound := func(path, body string) (int, envelope) {
		req, err := http.NewRequest("POST", srv.URL+path, strings.NewReader(body))
		require.NoError(t, err)
		binding.SetHeader(req.Header, tok)
		resp, err := c.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		var env envelope
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&env))
		return resp.StatusCode, env
	}
	cases := []struct{ name, path, body, want string }{
		{"escaped NUL", base + "/query", `{"sql":"INSERT INTO t VALUES(1, 'a'); \u0000 INSERT INTO t VALUES(2, 'b'); SELECT 2"}`,
			"statement 0: SQL contains a NUL character (U+0000) at byte offset 30"},
		{"escaped NUL, raw", base + "/raw", `{"sql":"DELETE FROM t;\u0000"}`, "statement 0: SQL contains a NUL character (U+0000) at byte offset 14"},
		{"raw NUL", base + "/query", "{\"sql\":\"DELETE FROM t;\x00\"}", "a NUL character (U+0000) at byte offset 22"},
		{"escaped NUL in a batch element", base + "/query", `{"batch":[{"sql":"DELETE FROM t"},{"sql":"SELECT 1\u0000"}]}`,
			"statement 1: SQL contains a NUL character (U+0000) at byte offset 8"},
		{"invalid UTF-8 in sql", base + "/query", "{\"sql\":\"INSERT INTO t VALUES(1, '\xff')\"}", "invalid UTF-8 at byte offset 33"},
		{"invalid UTF-8 in a param", base + "/query", "{\"sql\":\"INSERT INTO t VALUES(1, ?)\",\"params\":[\"\xc3\"]}", "invalid UTF-8 at byte offset 47"},
		{"unpaired surrogate", base + "/query", `{"sql":"INSERT INTO t VALUES(1, '\udbff')"}`, "an unpaired UTF-16 surrogate escape at byte offset 33"},
		{"binding token, escaped NUL", "/v1/bound/query", `{"sql":"DELETE FROM t;\u0000"}`, "statement 0: SQL contains a NUL character"},
		{"binding token, raw NUL", "/v1/bound/raw", "{\"sql\":\"DELETE FROM t;\x00\"}", "a NUL character (U+0000) at byte offset 22"},
		{"binding token, invalid UTF-8", "/v1/bound/query", "{\"sql\":\"DELETE FROM t; SELECT '\xfe'\"}", "invalid UTF-8 at byte offset 31"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var status int
			var env envelope
			if strings.HasPrefix(tc.path, "/v1/bound/") {
				status, env = bound(tc.path, tc.body)
			} else {
				status, env = call(t, c, srv, "POST", tc.path, &d, tc.body)
			}
			assert.Equal(t, http.StatusBadRequest, status)
			assert.Equal(t, v4.CodeInvalidRequest, errCode(env), "%+v", env)
			if assert.Len(t, env.Errors, 1) {
				assert.Contains(t, env.Errors[0].Message, tc.want)
			}
			status, env = call(t, c, srv, "POST", base+"/query", &d, `{"sql":"SELECT group_concat(id || ':' || v) AS rows FROM t"}`)
			require.Equal(t, 200, status)
			assert.Contains(t, string(env.Result), `"rows":"0:zero"`, "nothing was written")
		})
	}

	// NUL inside parameters is data, on the direct and the bound paths.
	status, env = call(t, c, srv, "POST", base+"/query", &d, `{"sql":"INSERT INTO t VALUES (?, ?)","params":[1,"a\u0000b"]}`)
	require.Equal(t, 200, status, "%+v", env)
	status, env = bound("/v1/bound/query", `{"batch":[{"sql":"INSERT INTO t VALUES (?, ?)","params":[2,"\u0000\u0000"]}]}`)
	require.Equal(t, 200, status, "%+v", env)
	status, env = call(t, c, srv, "POST", base+"/query", &d, `{"sql":"SELECT v, hex(v) AS h FROM t WHERE id > 0 ORDER BY id"}`)
	require.Equal(t, 200, status, "%+v", env)
	var res []d1Result
	require.NoError(t, json.Unmarshal(env.Result, &res))
	assert.JSONEq(t, `[{"v":"a\u0000b","h":"610062"},{"v":"\u0000\u0000","h":"0000"}]`, string(res[0].Results))
	var rows []map[string]string
	require.NoError(t, json.Unmarshal(res[0].Results, &rows))
	assert.Equal(t, "a\x00b", rows[0]["v"], "read back exactly")
}

// TestImportRefusesNULAndInvalidUTF8: an uploaded SQL file holding a NUL
// or invalid UTF-8 fails its import with a message that says where, and
// nothing of it is imported (not even the statements before the bad byte).
func TestImportRefusesNULAndInvalidUTF8(t *testing.T) {
	th, srv, d := dumpTestSetup(t)
	mustExec(t, th, d, "CREATE TABLE keep(x); INSERT INTO keep VALUES (1)")
	for i, tc := range []struct{ file, want string }{
		{"CREATE TABLE t(x);\nINSERT INTO keep VALUES (2);\nINSERT INTO keep VALUES (3);\x00 INSERT INTO keep VALUES (4);\n",
			"import refused: a NUL character (U+0000) at line 3 (byte offset 76 of the file)"},
		{"CREATE TABLE t(x);\nINSERT INTO keep VALUES ('caf\xe9');\n", "import refused: invalid UTF-8 at line 2 (byte offset 48 of the file)"},
	} {
		name := []string{"nul.sql", "latin1.sql"}[i]
		code, env := upload(t, srv, d, name, tc.file)
		require.Equal(t, http.StatusOK, code, "%+v", env)
		code, env = call(t, srv.Client(), srv, http.MethodPost, "/v1/objects/"+d.obj+"/import/ingest", &d, map[string]string{"etag": md5hex(tc.file), "filename": name})
		require.Equal(t, http.StatusOK, code, "%+v", env)
		st := waitImport(t, srv, d, name)
		assert.Equal(t, "error", st.Status)
		assert.Contains(t, st.Error, tc.want)
		assert.Contains(t, st.Error, "nothing was imported")
		res := mustExec(t, th, d, "SELECT (SELECT group_concat(x) FROM keep) AS keep, (SELECT count(*) FROM sqlite_schema WHERE name = 't') AS t")
		assert.Equal(t, `[{"keep":"1","t":0}]`, mustJSON(t, res[0].Results), "nothing was imported")
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return string(b)
}
