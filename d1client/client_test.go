package d1client

import (
	"bytes"
	"context"
	"crypto/md5"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// fakeAPI is a minimal D1 API for one account: enough to exercise name
// resolution, error mapping and the export/import polling protocols.
type fakeAPI struct {
	t        *testing.T
	mu       sync.Mutex
	polls    int
	uploaded []byte
	bodies   []map[string]any
	srv      *httptest.Server
}

func ok(w http.ResponseWriter, result any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"success": true, "result": result, "errors": []any{},
		"result_info": map[string]any{"page": 1, "per_page": 1000, "count": 1, "total_count": 1}})
}

func fail(w http.ResponseWriter, status, code int, msg string) {
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"success": false, "result": nil, "errors": []any{map[string]any{"code": code, "message": msg}}})
}

const dbID = "11111111-2222-4333-8444-555555555555"

func newFake(t *testing.T) (*fakeAPI, *Client) {
	f := &fakeAPI{t: t}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f, &Client{BaseURL: f.srv.URL, Token: "tok", AccountID: "acct", PollInterval: 1}
}

func (f *fakeAPI) serve(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if strings.HasPrefix(r.URL.Path, "/dl") {
		_, _ = io.WriteString(w, "PRAGMA foreign_keys=OFF;\nCOMMIT;\n")
		return
	}
	if r.URL.Path == "/up" {
		f.uploaded, _ = io.ReadAll(r.Body)
		ok(w, map[string]any{})
		return
	}
	if r.Header.Get("Authorization") != "Bearer tok" {
		fail(w, 401, 10000, "Authentication error")
		return
	}
	base := "/client/v4/accounts/acct/d1/database"
	var body map[string]any
	if r.Body != nil {
		b, _ := io.ReadAll(r.Body)
		if len(b) > 0 {
			require.NoError(f.t, json.Unmarshal(b, &body))
			f.bodies = append(f.bodies, body)
		}
	}
	switch {
	case r.Method == http.MethodGet && r.URL.Path == base:
		if r.URL.Query().Get("name") == "mydb" {
			ok(w, []any{map[string]any{"uuid": dbID, "name": "mydb"}})
			return
		}
		ok(w, []any{})
	case r.URL.Path == base+"/"+dbID+"/export":
		f.polls++
		if f.polls < 3 {
			ok(w, map[string]any{"type": "export", "status": "active", "at_bookmark": "bm1"})
			return
		}
		ok(w, map[string]any{"type": "export", "status": "complete", "at_bookmark": "bm1",
			"result": map[string]any{"filename": "x.sql", "signed_url": f.srv.URL + "/dl"}})
	case r.URL.Path == base+"/"+dbID+"/import":
		switch body["action"] {
		case "init":
			ok(w, map[string]any{"upload_url": f.srv.URL + "/up", "filename": "f.sql"})
		case "ingest":
			sum := md5.Sum(f.uploaded)
			if body["etag"] != hex.EncodeToString(sum[:]) {
				fail(w, 400, 7400, "etag mismatch")
				return
			}
			ok(w, map[string]any{"type": "import", "status": "active", "at_bookmark": "f.sql"})
		case "poll":
			ok(w, map[string]any{"type": "import", "status": "complete", "at_bookmark": "f.sql",
				"result": map[string]any{"num_queries": 7}})
		}
	case r.URL.Path == base+"/"+dbID+"/query":
		fail(w, 400, 7500, "no such table: x: SQLITE_ERROR")
	case r.URL.Path == base+"/"+dbID+"/raw":
		fail(w, 503, 7503, "Service temporarily unavailable")
	default:
		fail(w, 404, 7404, "The database could not be found")
	}
}

func TestResolveAndErrors(t *testing.T) {
	_, c := newFake(t)
	ctx := context.Background()
	id, err := c.Resolve(ctx, "mydb")
	require.NoError(t, err)
	require.Equal(t, dbID, id)
	id, err = c.Resolve(ctx, strings.ToUpper(dbID))
	require.NoError(t, err)
	require.Equal(t, dbID, id, "a UUID is used as is (canonical lowercase)")
	_, err = c.Resolve(ctx, "other")
	require.ErrorIs(t, err, ErrNotFound)

	_, err = c.Query(ctx, dbID, "SELECT * FROM x", nil)
	var ae *APIError
	require.ErrorAs(t, err, &ae)
	require.Equal(t, 7500, ae.Code)
	require.Equal(t, "no such table: x: SQLITE_ERROR [7500]", ae.Error())
	require.False(t, errors.Is(err, ErrNotFound) || errors.Is(err, ErrAuth) || errors.Is(err, ErrUnavailable))
	_, err = c.Raw(ctx, dbID, "SELECT 1", nil)
	require.ErrorIs(t, err, ErrUnavailable)

	bad := *c
	bad.Token = "wrong"
	_, err = bad.List(ctx, "", nil)
	require.ErrorIs(t, err, ErrAuth)
	down := *c
	down.BaseURL = "http://127.0.0.1:1"
	_, err = down.List(ctx, "", nil)
	require.ErrorIs(t, err, ErrUnavailable)
}

func TestExportPollsUntilComplete(t *testing.T) {
	f, c := newFake(t)
	var statuses []string
	var buf bytes.Buffer
	n, err := c.Export(context.Background(), dbID, DumpOptions{Tables: []string{"a"}}, &buf, Hooks{Polling: func(s string) { statuses = append(statuses, s) }})
	require.NoError(t, err)
	require.Equal(t, []string{"active", "active", "complete"}, statuses)
	require.Equal(t, int64(buf.Len()), n)
	require.Equal(t, "PRAGMA foreign_keys=OFF;\nCOMMIT;\n", buf.String())
	// First call without a bookmark, the next ones poll with it.
	require.Nil(t, f.bodies[0]["current_bookmark"])
	require.Equal(t, "bm1", f.bodies[1]["current_bookmark"])
	require.Equal(t, "polling", f.bodies[0]["output_format"])
	require.Equal(t, []any{"a"}, f.bodies[0]["dump_options"].(map[string]any)["tables"])
}

func TestImportProtocol(t *testing.T) {
	f, c := newFake(t)
	p := filepath.Join(t.TempDir(), "in.sql")
	content := "CREATE TABLE t(x);\nINSERT INTO t VALUES (1);\n"
	require.NoError(t, os.WriteFile(p, []byte(content), 0o644))
	var sent int64
	st, err := c.Import(context.Background(), dbID, p, Hooks{Transfer: func(n int64) { sent = n }}, nil)
	require.NoError(t, err)
	require.Equal(t, "complete", st.Status)
	require.Equal(t, int64(7), st.Result.NumQueries)
	require.Equal(t, content, string(f.uploaded))
	require.Equal(t, int64(len(content)), sent)
	actions := []any{}
	for _, b := range f.bodies {
		actions = append(actions, b["action"])
	}
	require.Equal(t, []any{"init", "ingest", "poll"}, actions)
}

// Call reaches any v4 endpoint under BaseURL (the admin API uses it) with
// the same envelope handling as the D1 calls.
func TestCallAnyEndpoint(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer tok" {
			fail(w, http.StatusUnauthorized, 10000, "bad token")
			return
		}
		if r.URL.Path == "/admin/v1/accounts" && r.Method == http.MethodPost {
			ok(w, map[string]any{"id": "a1", "max": int64(1) << 62})
			return
		}
		fail(w, http.StatusNotFound, 7404, "no such thing")
	}))
	defer srv.Close()
	c := &Client{BaseURL: srv.URL + "/", Token: "tok"}
	var out struct {
		ID  string `json:"id"`
		Max int64  `json:"max"`
	}
	require.NoError(t, c.Call(context.Background(), http.MethodPost, "/admin/v1/accounts", map[string]any{"name": "x"}, &out))
	require.Equal(t, "a1", out.ID)
	require.Equal(t, int64(1)<<62, out.Max)
	err := c.Call(context.Background(), http.MethodGet, "/admin/v1/nope", nil, nil)
	var ae *APIError
	require.ErrorAs(t, err, &ae)
	require.Equal(t, 7404, ae.Code)
	require.ErrorIs(t, err, ErrNotFound)
	c.Token = "wrong"
	require.ErrorIs(t, c.Call(context.Background(), http.MethodGet, "/admin/v1/accounts", nil, nil), ErrAuth)
}

// SQL that JSON encoding would change (invalid UTF-8 becomes U+FFFD) is
// refused before anything is sent.
func TestQueryRefusesInvalidUTF8BeforeSending(t *testing.T) {
	var hits int
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { hits++; ok(w, []any{}) }))
	defer srv.Close()
	c := &Client{BaseURL: srv.URL, Token: "tok", AccountID: "acct"}
	_, err := c.Query(context.Background(), "u", "SELECT 'caf\xe9'", nil)
	require.ErrorIs(t, err, ErrInvalidText)
	require.Contains(t, err.Error(), "byte offset 11")
	_, err = c.Raw(context.Background(), "u", "SELECT '\xff'", nil)
	require.ErrorIs(t, err, ErrInvalidText)
	require.Zero(t, hits)
}
