package edge

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestQueryFastPathMatchesMux: every request answers the same through
// ServeHTTP (hand-matched query routes) as through the mux router alone,
// including paths the hand matcher must leave to mux.
func TestQueryFastPathMatchesMux(t *testing.T) {
	e := newEnv(t)
	d := e.create(acctA, tokA, "fast")
	body := `{"sql":"SELECT 1"}`
	paths := []struct{ method, path string }{
		{"POST", dbPath(acctA) + "/" + d.UUID + "/query"},
		{"POST", dbPath(acctA) + "/" + d.UUID + "/raw"},
		{"POST", dbPath(acctA) + "/" + strings.ToUpper(d.UUID) + "/query"},
		{"POST", dbPath(acctB) + "/" + d.UUID + "/query"},                 // other account's token: 403
		{"POST", dbPath(acctA) + "/not-a-uuid/query"},                     // 400
		{"POST", dbPath(acctA) + "/" + d.UUID + "/query/"},                // no route
		{"POST", dbPath(acctA) + "/" + d.UUID + "/other"},                 // no route
		{"POST", "/client/v4/accounts//d1/database/" + d.UUID + "/query"}, // empty account: mux cleans
		{"POST", "/client/v4/accounts/" + acctA + "/d1/database/../query"},
		{"GET", dbPath(acctA) + "/" + d.UUID + "/query"}, // 405
		{"POST", dbPath(acctA)},                          // create route (name missing: 400)
	}
	for _, p := range paths {
		do := func(h http.Handler) *httptest.ResponseRecorder {
			req := httptest.NewRequest(p.method, p.path, strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+tokA)
			req.Header.Set(HeaderRequestID, "req-1")
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			return rec
		}
		fast, slow := do(e.srv), do(e.srv.router)
		require.Equal(t, slow.Code, fast.Code, "%s %s: %s", p.method, p.path, fast.Body)
		require.Equal(t, slow.Header().Get("Location"), fast.Header().Get("Location"), p.path)
		require.Equal(t, slow.Header().Get(HeaderRequestID), fast.Header().Get(HeaderRequestID), p.path)
	}
	// The hand-matched route is instrumented under the same endpoint name:
	// every query path above was sent once through each handler.
	m := httptest.NewRecorder()
	e.srv.ServeHTTP(m, httptest.NewRequest("GET", "/metrics", nil))
	var got []string
	for _, l := range strings.Split(m.Body.String(), "\n") {
		if strings.HasPrefix(l, `shoal_edge_requests_total{`) && strings.Contains(l, `endpoint="query"`) {
			got = append(got, l)
		}
	}
	require.ElementsMatch(t, []string{`shoal_edge_requests_total{code="",endpoint="query",status="200"} 4`,
		`shoal_edge_requests_total{code="7400",endpoint="query",status="400"} 2`, `shoal_edge_requests_total{code="7403",endpoint="query",status="403"} 2`}, got)
}

// TestMatchQueryPath pins what the hand matcher takes.
func TestMatchQueryPath(t *testing.T) {
	a, d, k, ok := matchQueryPath("/client/v4/accounts/acc/d1/database/id/raw")
	require.True(t, ok)
	require.Equal(t, []string{"acc", "id", "raw"}, []string{a, d, k})
	for _, p := range []string{"/client/v4/accounts/acc/d1/database/id", "/client/v4/accounts/acc/d1/database//query",
		"/client/v4/accounts/./d1/database/id/query", "/client/v4/accounts/acc/d1/database/../query",
		"/client/v4/accounts/acc/x/d1/database/id/query", "/client/v4/accounts/acc/d1/database/id/query/x"} {
		_, _, _, ok := matchQueryPath(p)
		require.False(t, ok, p)
	}
}
