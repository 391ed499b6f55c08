package edge

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	v4 "github.com/shoaldb/shoal/internal/v4"
)

var leanDateRE = regexp.MustCompile(`\r\nDate: [^\r]*\r\n`)

// rawAnswer sends req on a fresh connection and returns the raw answer
// (Date blanked): the server's bytes until it has answered and the client
// half-closed.
func rawAnswer(t *testing.T, addr, req string) string {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.SetDeadline(time.Now().Add(20*time.Second)))
	var got strings.Builder
	br := bufio.NewReader(io.TeeReader(c, &got))
	_, err = io.WriteString(c, req)
	require.NoError(t, err)
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = c.(*net.TCPConn).CloseWrite()
	_, _ = io.Copy(io.Discard, br)
	return leanDateRE.ReplaceAllString(got.String(), "\r\nDate: X\r\n")
}

func serveV4(t *testing.T, s *v4.Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(func() { _ = s.Close() })
	return ln.Addr().String()
}

// The edge's query routes (bearer and binding token) answer the same
// bytes (Date aside) on the lean path as through net/http, for successes
// and every refusal, and are served lean.
func TestLeanQueryMatchesNetHTTP(t *testing.T) {
	e := newEnv(t, func(o *Options) { o.Limits.MaxBodyBytes = 4096 })
	d := e.create(acctA, tokA, "lean")
	plain := serveV4(t, v4.NewServer(e.srv, v4.ServerOptions{}))
	leanSrv := v4.NewServer(e.srv, v4.ServerOptions{Lean: e.srv.LeanRoute})
	lean := serveV4(t, leanSrv)

	q := dbPath(acctA) + "/" + d.UUID + "/query"
	minted := e.call("POST", dbPath(acctA)+"/"+d.UUID+"/binding", tokA, nil)
	require.Equal(t, 200, minted.Status, "%s", minted.Raw)
	var m mintResult
	require.NoError(t, json.Unmarshal(minted.Result, &m))
	bindingAuth := "Authorization: Binding " + m.Token
	req := func(path, auth, body string, extra ...string) string {
		h := "Host: edge.example\r\nContent-Type: application/json\r\nX-Request-Id: lean-1\r\nUser-Agent: test\r\n"
		if auth != "" {
			h += "Authorization: Bearer " + auth + "\r\n"
		}
		for _, x := range extra {
			h += x + "\r\n"
		}
		return "POST " + path + " HTTP/1.1\r\n" + h + fmt.Sprintf("Content-Length: %d\r\n\r\n", len(body)) + body
	}
	sel := `{"sql":"SELECT 1"}`
	for _, tc := range []struct {
		name, req string
		status    int
	}{
		{"query", req(q, tokA, sel), 200},
		{"raw", req(dbPath(acctA)+"/"+d.UUID+"/raw", tokA, sel), 200},
		{"batch", req(q, tokA, `{"batch":[{"sql":"SELECT 1"},{"sql":"SELECT 2"}]}`), 200},
		{"array body", req(q, tokA, `[{"sql":"SELECT 1"}]`), 400},
		{"no request id", strings.Replace(req(q, tokA, sel), "X-Request-Id: lean-1", "X-Request-Id: lean-2", 1), 200},
		{"D1 error", req(q, tokA, `{"sql":"`+failingSQL+`"}`), 400},
		{"no token", req(q, "", sel), 401},
		{"unknown token", req(q, "not-a-token", sel), 401},
		{"other account", req(dbPath(acctB)+"/"+d.UUID+"/query", tokA, sel), 403},
		{"unknown database", req(dbPath(acctA)+"/01890000-0000-7000-8000-000000000000/query", tokA, sel), 404},
		{"bad database id", req(dbPath(acctA)+"/not-a-uuid/query", tokA, sel), 400},
		{"oversized body", req(q, tokA, `{"sql":"SELECT '`+strings.Repeat("a", 5000)+`'"}`), 413},
		{"malformed JSON", req(q, tokA, `{"sql":`), 400},
		{"empty body", req(q, tokA, ""), 400},
		{"binding token on the query route", req(q, "", sel, bindingAuth), 200},
		{"bound query", req("/client/v4/bound/query", "", sel, bindingAuth), 200},
		{"bound raw", req("/client/v4/bound/raw", "", sel, bindingAuth), 200},
		{"bound, bad token", req("/client/v4/bound/query", "", sel, "Authorization: Binding v2.AAAA"), 401},
		{"bound, no token", req("/client/v4/bound/query", "", sel), 401},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before, _ := leanSrv.LeanStats()
			want := rawAnswer(t, plain, tc.req)
			got := rawAnswer(t, lean, tc.req)
			assert.Equal(t, want, got)
			assert.True(t, strings.HasPrefix(got, fmt.Sprintf("HTTP/1.1 %d ", tc.status)), "%q", got)
			after, _ := leanSrv.LeanStats()
			assert.Equal(t, before+1, after, "not served on the lean path")
		})
	}
	// A query route with a query string is lean too (the other routes:
	// TestLeanControlPlaneMatchesNetHTTP).
	before, handedBefore := leanSrv.LeanStats()
	withQuery := req(q+"?x=1", tokA, sel)
	assert.Equal(t, rawAnswer(t, plain, withQuery), rawAnswer(t, lean, withQuery))
	served, handed := leanSrv.LeanStats()
	assert.Equal(t, before+1, served)
	assert.Equal(t, handedBefore, handed)
}

// A revoked token is refused on the lean path as soon as the edge's token
// check would refuse it (no caching of its own).
func TestLeanQueryRevokedToken(t *testing.T) {
	e := newEnv(t)
	d := e.create(acctA, tokA, "revoked")
	leanSrv := v4.NewServer(e.srv, v4.ServerOptions{Lean: e.srv.LeanRoute})
	lean := serveV4(t, leanSrv)
	req := "POST " + dbPath(acctA) + "/" + d.UUID + "/query HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer " + tokA +
		"\r\nContent-Length: 18\r\n\r\n" + `{"sql":"SELECT 1"}`
	require.True(t, strings.HasPrefix(rawAnswer(t, lean, req), "HTTP/1.1 200 "))
	e.cat.revokeToken(tokA)
	e.clock.Advance(time.Minute) // past the token TTL
	assert.True(t, strings.HasPrefix(rawAnswer(t, lean, req), "HTTP/1.1 401 "))
}

var (
	leanUUIDRE  = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)
	leanTokenRE = regexp.MustCompile(`"(token|token_id|upload_url|signed_url|url|filename)":"[^"]*"`)
)

// leanNormalise blanks what two runs of a stateful request answer
// differently by construction — the fresh UUIDs, minted tokens and signed
// URLs, and the variant marker of the names they created — leaving every
// other byte (status line, header order and values, lengths) to compare.
// Content-Length is untouched: UUIDs and markers keep their length.
func leanNormalise(s string) string {
	s = strings.ReplaceAll(s, "-mixl", "-mixp")
	s = leanUUIDRE.ReplaceAllString(s, "00000000-0000-0000-0000-000000000000")
	return leanTokenRE.ReplaceAllStringFunc(s, func(m string) string {
		k, v, _ := strings.Cut(m, ":")
		return k + ":" + strings.Repeat("x", len(v))
	})
}

// Every control-plane route of the edge is served on the lean path too,
// with the bytes net/http writes (Date aside; fresh ids normalised): 200,
// 4xx and 5xx answers of create, get, list (query strings), update,
// delete, bindings, time travel, export and import starts, insights,
// identity, admin, GraphQL and unrouted paths. The streamed routes (dump
// download, import upload) still hand the connection over.
func TestLeanControlPlaneMatchesNetHTTP(t *testing.T) {
	e := newEnv(t, func(o *Options) { o.Limits.MaxBodyBytes = 4096 })
	d := e.create(acctA, tokA, "lean")
	del := map[string]databaseJSON{"p": e.create(acctA, tokA, "del-mixp"), "l": e.create(acctA, tokA, "del-mixl")}
	plain := serveV4(t, v4.NewServer(e.srv, v4.ServerOptions{}))
	leanSrv := v4.NewServer(e.srv, v4.ServerOptions{Lean: e.srv.LeanRoute})
	lean := serveV4(t, leanSrv)

	req := func(method, path, auth, body string, extra ...string) string {
		h := "Host: edge.example\r\nX-Request-Id: mix-1\r\nUser-Agent: test\r\nAccept-Encoding: gzip\r\n"
		if auth != "" {
			h += "Authorization: Bearer " + auth + "\r\n"
		}
		for _, x := range extra {
			h += x + "\r\n"
		}
		if body != "" || method == http.MethodPost || method == http.MethodPut || method == http.MethodPatch {
			h += "Content-Type: application/json\r\n" + fmt.Sprintf("Content-Length: %d\r\n", len(body))
		}
		return method + " " + path + " HTTP/1.1\r\n" + h + "\r\n" + body
	}
	db := dbPath(acctA) + "/" + d.UUID
	unknown := dbPath(acctA) + "/01890000-0000-7000-8000-000000000000"
	bookmark := "00000001-00000000-00000000-" + strings.Repeat("0", 64)
	for _, tc := range []struct {
		name   string
		req    func(v string) string
		status int
		setup  func() func() // optional; returns the undo
	}{
		{"create", func(v string) string { return req("POST", dbPath(acctA), tokA, `{"name":"new-mix`+v+`"}`) }, 200, nil},
		{"create, taken name", func(string) string { return req("POST", dbPath(acctA), tokA, `{"name":"lean"}`) }, 400, nil},
		{"create, bad body", func(string) string { return req("POST", dbPath(acctA), tokA, `{"name":`) }, 400, nil},
		{"create, no token", func(string) string { return req("POST", dbPath(acctA), "", `{"name":"x"}`) }, 401, nil},
		{"create, other account", func(string) string { return req("POST", dbPath(acctB), tokA, `{"name":"x"}`) }, 403, nil},
		{"create, catalog down", func(v string) string { return req("POST", dbPath(acctA), tokA, `{"name":"down-mix`+v+`"}`) }, 503,
			func() func() { e.cat.setDown(true); return func() { e.cat.setDown(false) } }},
		{"get", func(string) string { return req("GET", db, tokA, "") }, 200, nil},
		{"get, unknown", func(string) string { return req("GET", unknown, tokA, "") }, 404, nil},
		{"get, bad id", func(string) string { return req("GET", dbPath(acctA)+"/not-a-uuid", tokA, "") }, 400, nil},
		{"get, bad token", func(string) string { return req("GET", db, "nope", "") }, 401, nil},
		{"list, query string", func(string) string { return req("GET", dbPath(acctA)+"?name=lean&page=1&per_page=10", tokA, "") }, 200, nil},
		{"list, escaped filter", func(string) string { return req("GET", dbPath(acctA)+"?name=le%61n", tokA, "") }, 200, nil},
		{"list, bad page", func(string) string { return req("GET", dbPath(acctA)+"?page=0", tokA, "") }, 400, nil},
		{"list, NUL in the filter", func(string) string { return req("GET", dbPath(acctA)+"?name=db%00", tokA, "") }, 400, nil},
		{"update", func(string) string {
			return req("PATCH", db, tokA, `{"read_replication":{"mode":"disabled"}}`)
		}, 200, nil},
		{"update, bad body", func(string) string { return req("PUT", db, tokA, `[]`) }, 400, nil},
		{"delete", func(v string) string { return req("DELETE", dbPath(acctA)+"/"+del[v].UUID, tokA, "") }, 200, nil},
		{"delete, unknown", func(string) string { return req("DELETE", unknown, tokA, "") }, 404, nil},
		{"mint binding", func(string) string { return req("POST", db+"/binding", tokA, `{}`) }, 200, nil},
		{"revoke bindings", func(string) string { return req("DELETE", db+"/binding", tokA, "") }, 200, nil},
		{"time travel bookmark", func(string) string {
			return req("GET", db+"/time_travel/bookmark?timestamp=2026-11-29T11:00:00Z", tokA, "")
		}, 0, nil},
		{"time travel bookmark, no timestamp", func(string) string {
			return req("GET", db+"/time_travel/bookmark", tokA, "")
		}, 0, nil},
		{"time travel restore", func(string) string {
			return req("POST", db+"/time_travel/restore?bookmark="+bookmark, tokA, "")
		}, 0, nil},
		{"insights", func(string) string { return req("GET", db+"/insights?limit=2", tokA, "") }, 0, nil},
		{"export start", func(string) string { return req("POST", db+"/export", tokA, `{"output_format":"polling"}`) }, 0, nil},
		{"import init", func(string) string {
			return req("POST", db+"/import", tokA, `{"action":"init","etag":"`+etagAB+`"}`)
		}, 0, nil},
		{"user token verify", func(string) string { return req("GET", "/client/v4/user/tokens/verify", tokA, "") }, 401, nil},
		{"account token verify", func(string) string {
			return req("GET", "/client/v4/accounts/"+acctA+"/tokens/verify", tokA, "")
		}, 200, nil},
		{"memberships", func(string) string { return req("GET", "/client/v4/memberships", tokA, "") }, 200, nil},
		{"admin get account", func(string) string { return req("GET", "/admin/v1/accounts/"+acctA, adminTok, "") }, 200, nil},
		{"admin, wrong token", func(string) string { return req("GET", "/admin/v1/accounts/"+acctA, tokA, "") }, 0, nil},
		{"graphql, bad body", func(string) string { return req("POST", "/client/v4/graphql", tokA, `{`) }, 400, nil},
		{"healthz", func(string) string { return req("GET", "/healthz", "", "") }, 200, nil},
		{"no route", func(string) string { return req("GET", "/client/v4/nowhere?x=1", tokA, "") }, 404, nil},
		{"wrong method", func(string) string { return req("PUT", dbPath(acctA), tokA, `{}`) }, 405, nil},
		{"unclean path", func(string) string { return req("GET", "/client/v4//accounts", tokA, "") }, 301, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.setup != nil {
				defer tc.setup()()
			}
			before, handedBefore := leanSrv.LeanStats()
			want := leanNormalise(rawAnswer(t, plain, tc.req("p")))
			got := leanNormalise(rawAnswer(t, lean, tc.req("l")))
			assert.Equal(t, want, got)
			if tc.status != 0 {
				assert.True(t, strings.HasPrefix(got, fmt.Sprintf("HTTP/1.1 %d ", tc.status)), "%q", got)
			}
			after, handed := leanSrv.LeanStats()
			assert.Equal(t, before+1, after, "not served on the lean path")
			assert.Equal(t, handedBefore, handed, "handed over")
		})
	}
	// The streamed routes are net/http's.
	for _, r := range []string{
		req("GET", "/client/v4/shoal/dump/not-a-token", "", ""),
		req("PUT", "/client/v4/shoal/upload/not-a-token", "", "abc"),
	} {
		_, handedBefore := leanSrv.LeanStats()
		assert.Equal(t, rawAnswer(t, plain, r), rawAnswer(t, lean, r))
		_, handed := leanSrv.LeanStats()
		assert.Equal(t, handedBefore+1, handed)
	}
}

// A client pool that mixes control-plane calls and queries on one
// keep-alive connection (wrangler, the SDKs, the deploy bench) stays on
// the lean path for all of them: the connection is never handed over.
func TestLeanMixedConnectionStaysLean(t *testing.T) {
	e := newEnv(t)
	leanSrv := v4.NewServer(e.srv, v4.ServerOptions{Lean: e.srv.LeanRoute})
	lean := serveV4(t, leanSrv)
	c := &http.Client{Transport: &http.Transport{MaxConnsPerHost: 1}}
	defer c.CloseIdleConnections()
	do := func(method, path, body string) answer {
		var rd io.Reader
		if body != "" {
			rd = strings.NewReader(body)
		}
		r, err := http.NewRequest(method, "http://"+lean+path, rd)
		require.NoError(t, err)
		r.Header.Set("Authorization", "Bearer "+tokA)
		resp, err := c.Do(r)
		require.NoError(t, err)
		defer resp.Body.Close()
		var a answer
		a.Raw, err = io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.NoError(t, json.Unmarshal(a.Raw, &a), "%s", a.Raw)
		a.Status = resp.StatusCode
		return a
	}
	a := do("POST", dbPath(acctA), `{"name":"mixed"}`)
	require.Equal(t, 200, a.Status, "%s", a.Raw)
	var d databaseJSON
	require.NoError(t, json.Unmarshal(a.Result, &d))
	for range 3 {
		assert.Equal(t, 200, do("GET", dbPath(acctA)+"/"+d.UUID, "").Status)
		assert.Equal(t, 200, do("GET", dbPath(acctA)+"?name=mixed&per_page=5", "").Status)
		assert.Equal(t, 200, do("POST", dbPath(acctA)+"/"+d.UUID+"/query", `{"sql":"SELECT 1"}`).Status)
	}
	served, handed := leanSrv.LeanStats()
	assert.Equal(t, int64(10), served)
	assert.Zero(t, handed, "a control-plane request handed the connection to net/http")
}
