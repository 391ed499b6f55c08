package edge

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/internal/binding"
	"github.com/shoaldb/shoal/raftmeta/fsm"
)

const (
	acctA, acctB   = "acct-a", "acct-b"
	tokA, tokB     = "token-a-secret", "token-b-secret"
	adminTok       = "admin-secret"
	testBindingKey = "0123456789abcdef0123456789abcdef"
)

type env struct {
	t     *testing.T
	srv   *Server
	ts    *httptest.Server
	cat   *fakeCatalog
	hosts []*fakeHost
	clock *testClock
	keys  *binding.Keyring
}

func newEnv(t *testing.T, mod ...func(*Options)) *env {
	t.Helper()
	keys, err := binding.NewKeyring([]byte(testBindingKey))
	require.NoError(t, err)
	e := &env{t: t, cat: newFakeCatalog(), clock: newTestClock(), keys: keys}
	e.cat.now = e.clock.Now
	for i, region := range []string{"weur", "enam"} {
		h := newFakeHost(t, keys)
		h.now = e.clock.Now
		e.hosts = append(e.hosts, h)
		id := []string{"h1", "h2"}[i]
		e.cat.hosts[id] = fsm.Host{ID: id, Address: h.addr(), Region: region, Capacity: 100, State: "active"}
	}
	e.cat.addAccount(acctA, 100)
	e.cat.addAccount(acctB, 100)
	e.cat.addToken(tokA, acctA, false)
	e.cat.addToken(tokB, acctB, false)
	o := Options{
		Catalog: e.cat, Dir: t.TempDir(), Region: "weur", AdminToken: adminTok, BindingKeys: keys,
		Now: e.clock.Now, CreateBackoff: 1, AccountRate: RateLimit{Rate: 1e6, Burst: 1e6}, DatabaseRate: RateLimit{Rate: 1e6, Burst: 1e6},
	}
	for _, m := range mod {
		m(&o)
	}
	e.srv, err = New(o)
	require.NoError(t, err)
	e.ts = httptest.NewServer(e.srv)
	t.Cleanup(func() {
		e.ts.Close()
		require.NoError(t, e.srv.Close())
	})
	return e
}

type answer struct {
	Status  int
	Header  http.Header
	Result  json.RawMessage `json:"result"`
	Success bool            `json:"success"`
	Errors  []struct {
		Code    int
		Message string
	} `json:"errors"`
	Messages   []any `json:"messages"`
	ResultInfo *struct {
		Page       int   `json:"page"`
		PerPage    int   `json:"per_page"`
		Count      int   `json:"count"`
		TotalCount int64 `json:"total_count"`
	} `json:"result_info"`
	Raw []byte
}

func (a answer) code() int {
	if len(a.Errors) == 0 {
		return 0
	}
	return a.Errors[0].Code
}

// call sends a request with a bearer token (auth "" = none) and decodes the v4 envelope.
func (e *env) call(method, path, auth string, body any) answer {
	e.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		j, err := json.Marshal(b)
		require.NoError(e.t, err)
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequest(method, e.ts.URL+path, rd)
	require.NoError(e.t, err)
	if auth != "" {
		if strings.HasPrefix(auth, "Binding ") {
			req.Header.Set("Authorization", auth)
		} else {
			req.Header.Set("Authorization", "Bearer "+auth)
		}
	}
	resp, err := e.ts.Client().Do(req)
	require.NoError(e.t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(e.t, err)
	var a answer
	require.NoError(e.t, json.Unmarshal(raw, &a), "body: %s", raw)
	a.Status, a.Header, a.Raw = resp.StatusCode, resp.Header, raw
	require.NotNil(e.t, a.Errors, "errors must be an array: %s", raw)
	require.NotNil(e.t, a.Messages, "messages must be an array: %s", raw)
	return a
}

func dbPath(acct string) string { return "/client/v4/accounts/" + acct + "/d1/database" }

// create makes a database and returns its D1 object.
func (e *env) create(acct, tok, name string) databaseJSON {
	e.t.Helper()
	a := e.call("POST", dbPath(acct), tok, map[string]any{"name": name})
	require.Equal(e.t, 200, a.Status, "create: %s", a.Raw)
	var d databaseJSON
	require.NoError(e.t, json.Unmarshal(a.Result, &d))
	return d
}

func (e *env) hostOf(objectID string) *fakeHost {
	for _, h := range e.hosts {
		if h.object(objectID) != nil {
			return h
		}
	}
	return nil
}

func (e *env) catalogDB(id string) fsm.Database {
	e.cat.mu.Lock()
	defer e.cat.mu.Unlock()
	return e.cat.dbs[id]
}

func mustRead(r io.Reader) string {
	b, _ := io.ReadAll(r)
	return string(b)
}
