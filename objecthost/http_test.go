package objecthost

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/internal/binding"
	v4 "github.com/shoaldb/shoal/internal/v4"
)

func serve(t *testing.T, th *testHost) *httptest.Server {
	srv := httptest.NewServer(th.Handler())
	t.Cleanup(srv.Close)
	return srv
}

func TestHTTPLifecycle(t *testing.T) {
	th := newTestHost(t, nil)
	srv := serve(t, th)
	c := srv.Client()
	d := newDB("acct")
	base := "/v1/objects/" + d.obj

	status, env := call(t, c, srv, "GET", base, nil, nil)
	assert.Equal(t, http.StatusNotFound, status)
	assert.Equal(t, v4.CodeNotFound, errCode(env))

	status, env = call(t, c, srv, "POST", base+"/init", nil, map[string]any{
		"database_uuid": d.uuid, "account_id": d.account, "name": "mydb", "region": "WEUR",
		"routing_generation": 1, "options": map[string]any{"heartbeat_interval_ms": 60000},
	})
	require.Equal(t, http.StatusOK, status, env)
	var info ObjectInfo
	require.NoError(t, json.Unmarshal(env.Result, &info))
	assert.Equal(t, ObjectInfo{ObjectID: d.obj, DatabaseUUID: d.uuid, AccountID: d.account, Name: "mydb", State: "active",
		CreatedAt: th.clock.Now().Format(time.RFC3339Nano), RoutingGeneration: 1}, info)

	status, env = call(t, c, srv, "POST", base+"/init", nil, map[string]any{"database_uuid": uuid.NewString(), "account_id": d.account})
	assert.Equal(t, http.StatusConflict, status)
	assert.Equal(t, CodeConflict, errCode(env))

	status, env = call(t, c, srv, "POST", base+"/init", nil, "{not json")
	assert.Equal(t, http.StatusBadRequest, status)
	assert.Equal(t, v4.CodeInvalidRequest, errCode(env))

	status, env = call(t, c, srv, "POST", base+"/confirm", &d, map[string]any{"routing_generation": 2})
	require.Equal(t, http.StatusOK, status, env)
	require.NoError(t, json.Unmarshal(env.Result, &info))
	assert.True(t, info.Confirmed)
	assert.EqualValues(t, 2, info.RoutingGeneration)

	status, env = call(t, c, srv, "POST", base+"/query", &d, map[string]any{"sql": "CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT)"})
	require.Equal(t, http.StatusOK, status, env)
	status, env = call(t, c, srv, "GET", base, &d, nil)
	require.Equal(t, http.StatusOK, status)
	require.NoError(t, json.Unmarshal(env.Result, &info))
	assert.EqualValues(t, 1, info.NumTables)
	assert.Positive(t, info.FileSize)

	other := d
	other.account = "intruder"
	status, env = call(t, c, srv, "POST", base+"/delete", &other, map[string]any{"routing_generation": 3})
	assert.Equal(t, http.StatusMisdirectedRequest, status)
	assert.Equal(t, v4.CodeWrongHost, errCode(env))

	status, env = call(t, c, srv, "POST", base+"/delete", &d, map[string]any{"routing_generation": 3})
	require.Equal(t, http.StatusOK, status)
	require.NoError(t, json.Unmarshal(env.Result, &info))
	assert.Equal(t, StateDeleted, info.State)

	status, env = call(t, c, srv, "POST", base+"/query", &d, map[string]any{"sql": "SELECT 1"})
	assert.Equal(t, http.StatusGone, status)
	assert.Equal(t, v4.CodeDatabaseDeleted, errCode(env))
	assert.Equal(t, "database deleted", env.Errors[0].Message)

	status, _ = call(t, c, srv, "GET", "/healthz", nil, nil)
	assert.Equal(t, http.StatusOK, status)
	resp, err := c.Get(srv.URL + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	assert.Contains(t, string(body), `shoal_objecthost_queries_total{outcome="deleted"} 1`)
	assert.Contains(t, string(body), `shoal_objecthost_lifecycle_total{op="init"} 1`)
}

// d1Result is one entry of D1's result array as clients decode it.
type d1Result struct {
	Results json.RawMessage `json:"results"`
	Success bool            `json:"success"`
	Meta    map[string]any  `json:"meta"`
}

func TestHTTPQueryEndToEnd(t *testing.T) {
	th := newTestHost(t, nil)
	srv := serve(t, th)
	c := srv.Client()
	d := newDB("acct")
	th.mustInit(t, d)
	base := "/v1/objects/" + d.obj

	status, env := call(t, c, srv, "POST", base+"/query", &d, map[string]any{"batch": []map[string]any{
		{"sql": "CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT, big INTEGER)"},
		{"sql": "INSERT INTO users (name, big) VALUES (?, ?), (?, ?)", "params": []any{"ada", 9007199254740993, "bob", 1}},
	}})
	require.Equal(t, http.StatusOK, status, env)
	var res []d1Result
	require.NoError(t, json.Unmarshal(env.Result, &res))
	require.Len(t, res, 2)
	assert.True(t, res[1].Success)
	assert.EqualValues(t, 2, res[1].Meta["changes"])
	assert.EqualValues(t, 2, res[1].Meta["last_row_id"])
	assert.Equal(t, true, res[1].Meta["changed_db"])
	assert.Equal(t, "WEUR", res[1].Meta["served_by_region"])
	for _, k := range []string{"duration", "size_after", "rows_read", "rows_written", "served_by_primary", "timings"} {
		assert.Contains(t, res[1].Meta, k)
	}

	status, env = call(t, c, srv, "POST", base+"/query", &d, map[string]any{"sql": "SELECT name, big FROM users WHERE id = ?", "params": []any{1}})
	require.Equal(t, http.StatusOK, status, env)
	require.NoError(t, json.Unmarshal(env.Result, &res))
	assert.JSONEq(t, `[{"name":"ada","big":9007199254740993}]`, string(res[0].Results), "integers beyond 2^53 stay exact")
	assert.EqualValues(t, 1, res[0].Meta["rows_read"])

	status, env = call(t, c, srv, "POST", base+"/raw", &d, map[string]any{"sql": "SELECT id, name FROM users ORDER BY id"})
	require.Equal(t, http.StatusOK, status, env)
	require.NoError(t, json.Unmarshal(env.Result, &res))
	assert.JSONEq(t, `{"columns":["id","name"],"rows":[[1,"ada"],[2,"bob"]]}`, string(res[0].Results))

	cases := []struct {
		name   string
		body   any
		status int
		code   int
	}{
		{"sql error", map[string]any{"sql": "SELECT * FROM nope"}, 400, v4.CodeSQL},
		{"malformed body", "{", 400, v4.CodeInvalidRequest},
		{"no sql", map[string]any{}, 400, v4.CodeInvalidRequest},
		{"transaction refused", map[string]any{"sql": "BEGIN TRANSACTION"}, 400, v4.CodeSQL},
		{"too many params", map[string]any{"sql": "SELECT ?", "params": make([]any, 101)}, 413, v4.CodeTooLarge},
		{"statement too large", map[string]any{"sql": "SELECT '" + strings.Repeat("x", 100_001) + "'"}, 413, v4.CodeTooLarge},
	}
	for _, tc := range cases {
		status, env := call(t, c, srv, "POST", base+"/query", &d, tc.body)
		assert.Equal(t, tc.status, status, tc.name)
		assert.Equal(t, tc.code, errCode(env), "%s: %v", tc.name, env.Errors)
		assert.False(t, env.Success, tc.name)
	}
	// A failed batch rolled back: still two users.
	status, env = call(t, c, srv, "POST", base+"/query", &d, map[string]any{"batch": []map[string]any{
		{"sql": "INSERT INTO users (name) VALUES ('carol')"}, {"sql": "SELECT * FROM nope"},
	}})
	assert.Equal(t, 400, status)
	status, env = call(t, c, srv, "POST", base+"/query", &d, map[string]any{"sql": "SELECT count(*) AS n FROM users"})
	require.Equal(t, 200, status)
	require.NoError(t, json.Unmarshal(env.Result, &res))
	assert.JSONEq(t, `[{"n":2}]`, string(res[0].Results))

	// Wrong or missing identity headers: 421.
	status, env = call(t, c, srv, "POST", base+"/query", nil, map[string]any{"sql": "SELECT 1"})
	assert.Equal(t, http.StatusMisdirectedRequest, status)
	assert.Equal(t, v4.CodeWrongHost, errCode(env))
	// Never-initialised object: 404 7404.
	status, env = call(t, c, srv, "POST", "/v1/objects/"+newObjectID()+"/query", &d, map[string]any{"sql": "SELECT 1"})
	assert.Equal(t, http.StatusNotFound, status)
	assert.Equal(t, v4.CodeNotFound, errCode(env))
	assert.Equal(t, "database not found", env.Errors[0].Message)

	// Account row limit flag: 429 7505 until it expires.
	th.SetAccountLimited(d.account, th.clock.Now().Add(time.Hour))
	status, env = call(t, c, srv, "POST", base+"/query", &d, map[string]any{"sql": "SELECT 1"})
	assert.Equal(t, http.StatusTooManyRequests, status)
	assert.Equal(t, v4.CodeRowLimit, errCode(env))
	th.clock.Advance(time.Hour)
	status, _ = call(t, c, srv, "POST", base+"/query", &d, map[string]any{"sql": "SELECT 1"})
	assert.Equal(t, http.StatusOK, status)
}

func TestHTTPBoundQuery(t *testing.T) {
	key := []byte(strings.Repeat("k", 32))
	ring, err := binding.NewKeyring(key)
	require.NoError(t, err)
	th := newTestHost(t, func(c *Config) { c.Bindings = ring })
	srv := serve(t, th)
	d := newDB("acct")
	th.mustInit(t, d)
	_, err = th.Confirm(context.Background(), d.obj, 4)
	require.NoError(t, err)

	sign := func(c binding.Claims) string {
		tok, err := ring.Sign(c)
		require.NoError(t, err)
		return tok
	}
	good := binding.Claims{DatabaseUUID: d.uuid, ObjectID: d.obj, AccountID: d.account, HostAddress: "h:1", Generation: 4, ExpiresAt: th.clock.Now().Add(time.Minute).Unix(),
		TokenID: binding.NewTokenID(), Parent: strings.Repeat("ab", 32)}
	do := func(tok string) (int, envelope) {
		req, err := http.NewRequest("POST", srv.URL+"/v1/bound/query", strings.NewReader(`{"sql":"SELECT 42 AS x"}`))
		require.NoError(t, err)
		if tok != "" {
			binding.SetHeader(req.Header, tok)
		}
		resp, err := srv.Client().Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		var env envelope
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&env))
		return resp.StatusCode, env
	}
	status, env := do(sign(good))
	require.Equal(t, 200, status, env)
	assert.Contains(t, string(env.Result), `"x":42`)

	status, env = do("")
	assert.Equal(t, 401, status)
	status, _ = do(sign(good) + "x")
	assert.Equal(t, 401, status, "bad signature")
	expired := good
	expired.ExpiresAt = th.clock.Now().Unix()
	status, _ = do(sign(expired))
	assert.Equal(t, 401, status, "expired")
	stale := good
	stale.Generation = 3
	status, env = do(sign(stale))
	assert.Equal(t, 421, status, "generation mismatch")
	assert.Equal(t, v4.CodeWrongHost, errCode(env))
	wrongDB := good
	wrongDB.DatabaseUUID = uuid.NewString()
	status, _ = do(sign(wrongDB))
	assert.Equal(t, 421, status, "object holds another database")

	// Revocation through the internal API: one token, then every token
	// minted below the new epoch. The identity headers must match.
	revoke := func(body string, hdr *db) (int, envelope) {
		return call(t, srv.Client(), srv, "POST", "/v1/objects/"+d.obj+"/bindings/revoke", hdr, body)
	}
	other := newDB("other")
	status, _ = revoke(`{"token_id":"`+good.TokenID+`","until":`+strconv.FormatInt(good.ExpiresAt, 10)+`}`, &other)
	assert.Equal(t, 421, status, "another database's identity cannot revoke")
	status, env = revoke(`{"token_id":"not-a-token-id"}`, &d)
	assert.Equal(t, 400, status, "%+v", env)
	status, env = revoke(`{"token_id":"`+good.TokenID+`","until":`+strconv.FormatInt(good.ExpiresAt, 10)+`}`, &d)
	require.Equal(t, 200, status, "%+v", env)
	assert.JSONEq(t, `{"epoch":0,"revoked":1}`, string(env.Result))
	status, env = do(sign(good))
	assert.Equal(t, 401, status, "a revoked token")
	assert.Equal(t, v4.CodeUnauthorized, errCode(env))
	assert.Equal(t, "binding token revoked", env.Errors[0].Message)
	sibling := good
	sibling.TokenID = binding.NewTokenID()
	status, _ = do(sign(sibling))
	assert.Equal(t, 200, status, "another token of the same database still works")
	status, env = revoke(`{"all":true}`, &d)
	require.Equal(t, 200, status, "%+v", env)
	assert.JSONEq(t, `{"epoch":1,"revoked":0}`, string(env.Result))
	status, _ = do(sign(sibling))
	assert.Equal(t, 401, status, "revoke all refuses tokens of the old epoch")
	st, err := th.BindingState(d.obj, d.id())
	require.NoError(t, err)
	fresh := good
	fresh.TokenID, fresh.Epoch = binding.NewTokenID(), st.Epoch
	status, _ = do(sign(fresh))
	assert.Equal(t, 200, status, "a token minted at the new epoch works")
	// The revocation is durable: a restarted host still refuses.
	th.reopen(t)
	srv = serve(t, th)
	status, _ = do(sign(sibling))
	assert.Equal(t, 401, status, "revocations survive a restart")
	status, _ = do(sign(fresh))
	assert.Equal(t, 200, status)

	_, err = th.Delete(context.Background(), d.obj, 5)
	require.NoError(t, err)
	status, env = do(sign(fresh))
	assert.Equal(t, 410, status, "a live token cannot reach a deleted database")
	assert.Equal(t, v4.CodeDatabaseDeleted, errCode(env))
}

// The query path writes its envelope by hand: the bytes must be what
// v4.WriteResult writes for the same results.
func TestQueryEnvelopeBytes(t *testing.T) {
	th := newTestHost(t, nil)
	d := newDB("acct")
	th.mustInit(t, d)
	ctx := context.Background()
	_, err := th.Query(ctx, d.obj, d.id(), q("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT, b BLOB, f REAL); INSERT INTO t VALUES (1, '<a&b>\"é', x'0102', 0.5), (2, NULL, NULL, 1e-9)"))
	require.NoError(t, err)
	big := "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM r WHERE i < 5000) SELECT i, '<pad>' AS p FROM r"
	for _, tc := range []struct {
		raw, encode bool
		sql         string
	}{
		{false, false, "SELECT * FROM t ORDER BY id; SELECT count(*) FROM t"},
		{true, false, "SELECT * FROM t ORDER BY id; SELECT count(*) FROM t"},
		{false, true, "SELECT * FROM t ORDER BY id; SELECT count(*) FROM t"},
		{true, true, "SELECT * FROM t ORDER BY id; SELECT count(*) FROM t"},
		// Encoded results over 64 KiB are written in parts, not copied.
		{false, true, "SELECT 1 AS one; " + big + "; SELECT 2 AS two"},
		{true, true, big},
	} {
		req := q(tc.sql)
		req.Raw, req.Encode = tc.raw, tc.encode
		res, err := th.Query(ctx, d.obj, d.id(), req)
		require.NoError(t, err)
		want := httptest.NewRecorder()
		v4.WriteResult(want, res)
		got := httptest.NewRecorder()
		buf := make([]byte, 0, 8)
		writeResults(got, res, &buf)
		assert.Equal(t, want.Body.String(), got.Body.String())
		assert.Equal(t, want.Code, got.Code)
		assert.Equal(t, want.Header().Get("Content-Type"), got.Header().Get("Content-Type"))
		assert.Equal(t, strconv.Itoa(got.Body.Len()), got.Header().Get("Content-Length"))
	}
}

func TestQueryRouteMatchesRouterPattern(t *testing.T) {
	for path, want := range map[string]struct {
		id  string
		raw bool
		ok  bool
	}{
		"/v1/objects/abc/query":      {"abc", false, true},
		"/v1/objects/abc/raw":        {"abc", true, true},
		"/v1/objects//query":         {},
		"/v1/objects/a/b/query":      {},
		"/v1/objects/../query":       {},
		"/v1/objects/./raw":          {},
		"/v1/objects/abc/query/":     {},
		"/v1/objects/abc/export":     {},
		"/v1/bound/query":            {},
		"/v1/objects/query":          {},
		"/v2/objects/abc/query":      {},
		"/v1/objects/abc/queryx":     {},
		"/v1/objects/abc/import/raw": {},
	} {
		id, raw, ok := queryRoute(path)
		assert.Equal(t, want.ok, ok, path)
		assert.Equal(t, want.id, id, path)
		assert.Equal(t, want.raw, raw, path)
	}
	// Paths the fast match leaves alone still reach the router's routes.
	th := newTestHost(t, nil)
	srv := serve(t, th)
	d := newDB("acct")
	th.mustInit(t, d)
	resp, err := srv.Client().Get(srv.URL + "/v1/objects/" + d.obj + "/query")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
	status, env := call(t, srv.Client(), srv, "POST", "/v1/objects/"+d.obj+"/raw", &d, map[string]any{"sql": "SELECT 1 AS one"})
	require.Equal(t, http.StatusOK, status, env)
	assert.JSONEq(t, `[{"columns":["one"],"rows":[[1]]}]`, strings.ReplaceAll(mustResultsOnly(t, env.Result), " ", ""))
}

func mustResultsOnly(t *testing.T, raw json.RawMessage) string {
	var res []struct {
		Results json.RawMessage `json:"results"`
	}
	require.NoError(t, json.Unmarshal(raw, &res))
	out := make([]json.RawMessage, len(res))
	for i, r := range res {
		out[i] = r.Results
	}
	b, err := json.Marshal(out)
	require.NoError(t, err)
	return string(b)
}

// Shoal-Numbers: integers beyond ±2^53 exact by default, as D1 renders
// them (the nearest double) with "js", anything else refused.
func TestQueryNumbersHeader(t *testing.T) {
	th := newTestHost(t, nil)
	srv := serve(t, th)
	d := newDB("acct")
	th.mustInit(t, d)
	post := func(numbers string) (int, string) {
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/objects/"+d.obj+"/query", strings.NewReader(`{"sql":"SELECT 9007199254740993 AS big"}`))
		require.NoError(t, err)
		req.Header.Set(HeaderDatabase, d.uuid)
		req.Header.Set(HeaderAccount, d.account)
		if numbers != "" {
			req.Header.Set(HeaderNumbers, numbers)
		}
		resp, err := srv.Client().Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(b)
	}
	for _, h := range []string{"", "exact"} {
		code, body := post(h)
		require.Equal(t, http.StatusOK, code, body)
		assert.Contains(t, body, `"big":9007199254740993`, "header %q", h)
	}
	code, body := post("js")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `"big":9007199254740992`)
	code, body = post("float")
	assert.Equal(t, http.StatusBadRequest, code, body)
	assert.Contains(t, body, HeaderNumbers)
}
