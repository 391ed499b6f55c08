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
	// Other routes on a lean listener are net/http's.
	_, handedBefore := leanSrv.LeanStats()
	get := "GET " + dbPath(acctA) + "/" + d.UUID + " HTTP/1.1\r\nHost: edge.example\r\nX-Request-Id: lean-3\r\nAuthorization: Bearer " + tokA + "\r\n\r\n"
	assert.Equal(t, rawAnswer(t, plain, get), rawAnswer(t, lean, get))
	_, handed := leanSrv.LeanStats()
	assert.Equal(t, handedBefore+1, handed)
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
