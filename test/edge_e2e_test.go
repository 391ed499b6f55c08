package test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/edge"
	"github.com/shoaldb/shoal/internal/binding"
	"github.com/shoaldb/shoal/objecthost"
	"github.com/shoaldb/shoal/raftmeta"
)

// e2eCluster is raftmeta ×3, objecthost ×2 and edge ×2 in one process, over
// real loopback TCP, with real Raft (fsync) and real SQLite files.
type e2eCluster struct {
	t        *testing.T
	catCfgs  []raftmeta.Config
	catNodes []*raftmeta.Node
	catAddrs []string
	hosts    []*objecthost.Host
	hostAddr []string
	edges    []*edge.Server
	edgeURL  []string
	keys     *binding.Keyring
	admin    string
}

func e2eListen(t *testing.T) (net.Listener, string) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	return ln, ln.Addr().String()
}

func e2eServe(t *testing.T, ln net.Listener, h http.Handler) {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
}

func freeAddr(t *testing.T) string {
	ln, addr := e2eListen(t)
	require.NoError(t, ln.Close())
	return addr
}

func newE2ECluster(t *testing.T) *e2eCluster {
	c := &e2eCluster{t: t, admin: "e2e-admin-token"}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	for i := 0; i < 3; i++ {
		cfg := raftmeta.Config{ID: fmt.Sprintf("c%d", i), Dir: t.TempDir(), RaftAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
			Logger: quiet, RaftLogOutput: io.Discard, JoinTimeout: 30 * time.Second}
		if i == 0 {
			cfg.Bootstrap = true
		} else {
			cfg.Join = []string{c.catAddrs[0]}
		}
		n, err := raftmeta.NewNode(cfg)
		require.NoError(t, err)
		c.catCfgs = append(c.catCfgs, cfg)
		c.catNodes = append(c.catNodes, n)
		c.catAddrs = append(c.catAddrs, n.HTTPAddr())
		if i == 0 {
			require.Eventually(t, n.IsLeader, 20*time.Second, 20*time.Millisecond)
		}
	}
	t.Cleanup(c.stopCatalog)
	keys, err := binding.KeyringFromSecrets("e2e-binding-secret-0123456789")
	require.NoError(t, err)
	c.keys = keys
	for i, region := range []string{"weur", "enam"} {
		cl, err := raftmeta.NewClient(c.catAddrs)
		require.NoError(t, err)
		ln, addr := e2eListen(t)
		h, err := objecthost.Open(objecthost.Config{ID: fmt.Sprintf("h%d", i), Dir: t.TempDir(), Address: addr,
			Region: region, Capacity: 1000, Catalog: objecthost.RaftmetaCatalog{C: cl}, Bindings: keys, Logger: quiet,
			HeartbeatInterval: 2 * time.Second})
		require.NoError(t, err)
		t.Cleanup(func() { _ = h.Close() })
		e2eServe(t, ln, h.Handler())
		c.hosts = append(c.hosts, h)
		c.hostAddr = append(c.hostAddr, addr)
	}
	for i := 0; i < 2; i++ {
		cl, err := raftmeta.NewClient(c.catAddrs)
		require.NoError(t, err)
		srv, err := edge.New(edge.Options{Catalog: edge.RaftmetaCatalog{C: cl}, Dir: t.TempDir(), Region: "weur",
			AdminToken: c.admin, BindingKeys: keys, Logger: quiet,
			// A short token TTL so the outage phase outlives it: validated
			// tokens must keep working while the catalog is down.
			TokenTTL:    time.Second,
			AccountRate: edge.RateLimit{Rate: 1e6, Burst: 1e6}, DatabaseRate: edge.RateLimit{Rate: 1e6, Burst: 1e6}})
		require.NoError(t, err)
		ln, addr := e2eListen(t)
		e2eServe(t, ln, srv)
		t.Cleanup(func() { _ = srv.Close() })
		c.edges = append(c.edges, srv)
		c.edgeURL = append(c.edgeURL, "http://"+addr)
	}
	// Both hosts registered (they register themselves at start).
	cl, err := raftmeta.NewClient(c.catAddrs)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		hs, err := cl.Hosts(context.Background(), raftmeta.ReadOptions{Consistency: raftmeta.Stale, NoCache: true})
		return err == nil && len(hs) == 2
	}, 30*time.Second, 50*time.Millisecond, "object hosts never registered")
	return c
}

func (c *e2eCluster) stopCatalog() {
	for _, n := range c.catNodes {
		if n != nil {
			_ = n.Close()
		}
	}
}

func (c *e2eCluster) restartCatalog() {
	for i, cfg := range c.catCfgs {
		cfg.RaftAddr, cfg.HTTPAddr = c.catNodes[i].RaftAddr(), c.catAddrs[i]
		cfg.Bootstrap, cfg.Join = false, nil
		var n *raftmeta.Node
		require.Eventually(c.t, func() bool {
			var err error
			n, err = raftmeta.NewNode(cfg)
			return err == nil
		}, 20*time.Second, 100*time.Millisecond)
		c.catNodes[i] = n
	}
}

type e2eAnswer struct {
	status  int
	Result  json.RawMessage `json:"result"`
	Success bool            `json:"success"`
	Errors  []struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"errors"`
	raw []byte
}

var e2eHTTP = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}

func e2eCall(t testing.TB, method, url, auth string, body any) e2eAnswer {
	a, err := e2eTry(method, url, auth, body)
	require.NoError(t, err)
	return a
}

// e2eTry is e2eCall for goroutines other than the test's: it returns what
// went wrong instead of failing the test.
func e2eTry(method, url, auth string, body any) (e2eAnswer, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return e2eAnswer{}, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		return e2eAnswer{}, err
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := e2eHTTP.Do(req)
	if err != nil {
		return e2eAnswer{}, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return e2eAnswer{}, err
	}
	var a e2eAnswer
	if err := json.Unmarshal(raw, &a); err != nil {
		return e2eAnswer{}, fmt.Errorf("%s %s: status %d, not a v4 envelope: %w: %s", method, url, resp.StatusCode, err, raw)
	}
	a.status, a.raw = resp.StatusCode, raw
	return a, nil
}

func (a e2eAnswer) code() int {
	if len(a.Errors) == 0 {
		return 0
	}
	return a.Errors[0].Code
}

// setupAccount creates an account and token through edge 0's admin API and
// waits until both edges accept the token (follower reads may lag a moment).
func (c *e2eCluster) setupAccount(t *testing.T, tier string) (acct, bearer string) {
	var a e2eAnswer
	require.Eventually(t, func() bool {
		a = e2eCall(t, "POST", c.edgeURL[0]+"/admin/v1/accounts", "Bearer "+c.admin, map[string]any{"name": "e2e", "tier": tier})
		return a.status == 200
	}, 30*time.Second, 100*time.Millisecond)
	var acc struct{ ID string }
	require.NoError(t, json.Unmarshal(a.Result, &acc))
	a = e2eCall(t, "POST", c.edgeURL[0]+"/admin/v1/accounts/"+acc.ID+"/tokens", "Bearer "+c.admin, map[string]any{"name": "e2e"})
	require.Equal(t, 200, a.status, "%s", a.raw)
	var tok struct{ Token string }
	require.NoError(t, json.Unmarshal(a.Result, &tok))
	for _, u := range c.edgeURL {
		require.Eventually(t, func() bool {
			return e2eCall(t, "GET", u+"/client/v4/accounts/"+acc.ID+"/d1/database", "Bearer "+tok.Token, nil).status == 200
		}, 10*time.Second, 50*time.Millisecond)
	}
	return acc.ID, "Bearer " + tok.Token
}

func TestEdgeEndToEnd(t *testing.T) {
	c := newE2ECluster(t)
	acct, bearer := c.setupAccount(t, "paid")
	base := func(i int) string { return c.edgeURL[i] + "/client/v4/accounts/" + acct + "/d1/database" }

	// Create through edge 0.
	a := e2eCall(t, "POST", base(0), bearer, map[string]any{"name": "orders"})
	require.Equal(t, 200, a.status, "%s", a.raw)
	var db struct {
		UUID            string `json:"uuid"`
		Name            string `json:"name"`
		RunningInRegion string `json:"running_in_region"`
		NumTables       int    `json:"num_tables"`
		FileSize        int64  `json:"file_size"`
	}
	require.NoError(t, json.Unmarshal(a.Result, &db))
	assert.Equal(t, "WEUR", db.RunningInRegion)

	// Schema and data through edge 0, reads through edge 1 (a route miss there).
	a = e2eCall(t, "POST", base(0)+"/"+db.UUID+"/query", bearer, map[string]any{"batch": []any{
		map[string]any{"sql": "CREATE TABLE orders (id INTEGER PRIMARY KEY, item TEXT NOT NULL, qty INTEGER)"},
		map[string]any{"sql": "INSERT INTO orders (item, qty) VALUES (?, ?), (?, ?)", "params": []any{"apple", 3, "pear", 5}},
	}})
	require.Equal(t, 200, a.status, "%s", a.raw)
	var res []struct {
		Results []map[string]any `json:"results"`
		Success bool             `json:"success"`
		Meta    map[string]any   `json:"meta"`
	}
	var rows []map[string]any
	require.Eventually(t, func() bool {
		a = e2eCall(t, "POST", base(1)+"/"+db.UUID+"/query", bearer, map[string]any{"sql": "SELECT item, qty FROM orders WHERE qty > ? ORDER BY id", "params": []any{"1"}})
		if a.status != 200 {
			return false // edge 1 reads the route from a follower that may lag
		}
		require.NoError(t, json.Unmarshal(a.Result, &res))
		rows = res[0].Results
		return true
	}, 10*time.Second, 50*time.Millisecond)
	require.Len(t, rows, 2)
	assert.Equal(t, "apple", rows[0]["item"])
	assert.EqualValues(t, 5, rows[1]["qty"])
	assert.Contains(t, res[0].Meta, "rows_read")
	assert.Contains(t, res[0].Meta, "duration")

	a = e2eCall(t, "POST", base(1)+"/"+db.UUID+"/raw", bearer, map[string]any{"sql": "SELECT count(*) AS n FROM orders"})
	require.Equal(t, 200, a.status, "%s", a.raw)
	assert.Contains(t, string(a.Result), `"columns":["n"]`)

	// SQL errors are 400/7500 with SQLite's message.
	a = e2eCall(t, "POST", base(0)+"/"+db.UUID+"/query", bearer, map[string]any{"sql": "SELECT * FROM nope"})
	assert.Equal(t, 400, a.status, "%s", a.raw)
	assert.Equal(t, 7500, a.code())

	// Info: live table count and size from the object.
	a = e2eCall(t, "GET", base(0)+"/"+db.UUID, bearer, nil)
	require.Equal(t, 200, a.status, "%s", a.raw)
	require.NoError(t, json.Unmarshal(a.Result, &db))
	assert.Equal(t, 1, db.NumTables)
	assert.Greater(t, db.FileSize, int64(0))

	a = e2eCall(t, "PATCH", base(0)+"/"+db.UUID, bearer, map[string]any{"read_replication": map[string]any{"mode": "auto"}})
	require.Equal(t, 200, a.status, "%s", a.raw)
	assert.Contains(t, string(a.Result), `"mode":"auto"`)

	a = e2eCall(t, "GET", base(1)+"?name=ord", bearer, nil)
	require.Equal(t, 200, a.status, "%s", a.raw)
	assert.Contains(t, string(a.Result), db.UUID)

	// Binding token: straight to the host.
	a = e2eCall(t, "POST", base(0)+"/"+db.UUID+"/binding", bearer, nil)
	require.Equal(t, 200, a.status, "%s", a.raw)
	var mint struct{ Token string }
	require.NoError(t, json.Unmarshal(a.Result, &mint))
	a = e2eCall(t, "POST", c.edgeURL[1]+"/client/v4/bound/query", "Binding "+mint.Token, map[string]any{"sql": "SELECT count(*) AS n FROM orders"})
	require.Equal(t, 200, a.status, "%s", a.raw)
	assert.Contains(t, string(a.Result), `"n":2`)

	// A second database to delete.
	a = e2eCall(t, "POST", base(1), bearer, map[string]any{"name": "scratch", "primary_location_hint": "enam"})
	require.Equal(t, 200, a.status, "%s", a.raw)
	var scratch struct {
		UUID            string `json:"uuid"`
		RunningInRegion string `json:"running_in_region"`
	}
	require.NoError(t, json.Unmarshal(a.Result, &scratch))
	assert.Equal(t, "ENAM", scratch.RunningInRegion)
	a = e2eCall(t, "POST", base(1)+"/"+scratch.UUID+"/query", bearer, map[string]any{"sql": "SELECT 1"})
	require.Equal(t, 200, a.status, "%s", a.raw)
	a = e2eCall(t, "DELETE", base(1)+"/"+scratch.UUID, bearer, nil)
	require.Equal(t, 200, a.status, "%s", a.raw)
	a = e2eCall(t, "POST", base(1)+"/"+scratch.UUID+"/query", bearer, map[string]any{"sql": "SELECT 1"})
	assert.Equal(t, 404, a.status, "%s", a.raw)
	// Edge 0 still has the old route cached: the object itself refuses
	// (410), the edge re-resolves and answers not found.
	require.Eventually(t, func() bool {
		a = e2eCall(t, "POST", base(0)+"/"+scratch.UUID+"/query", bearer, map[string]any{"sql": "SELECT 1"})
		return a.status == 404
	}, 10*time.Second, 50*time.Millisecond, "%s", a.raw)

	// After a purge, routes refill from the catalog (bounded fallback).
	require.NoError(t, c.edges[0].Purge())
	var wg sync.WaitGroup
	statuses := make(chan int, 32)
	for i := 0; i < 32; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			statuses <- e2eCall(t, "POST", base(0)+"/"+db.UUID+"/query", bearer, map[string]any{"sql": "SELECT 1"}).status
		}()
	}
	wg.Wait()
	close(statuses)
	for st := range statuses {
		assert.Equal(t, 200, st)
	}

	// Warm both edges' routes for "orders", then stop every catalog node.
	for i := range c.edges {
		a = e2eCall(t, "POST", base(i)+"/"+db.UUID+"/query", bearer, map[string]any{"sql": "SELECT 1"})
		require.Equal(t, 200, a.status)
	}
	c.stopCatalog()
	const perEdge = 150
	var ok, total int
	start := time.Now()
	for i := 0; i < perEdge || time.Since(start) < 3*time.Second; i++ {
		for e := range c.edges {
			a = e2eCall(t, "POST", base(e)+"/"+db.UUID+"/query", bearer, map[string]any{"sql": "SELECT item FROM orders WHERE id = ?", "params": []any{1 + i%2}})
			total++
			if a.status == 200 {
				ok++
			} else {
				t.Logf("query with catalog down: %d %s", a.status, a.raw)
			}
		}
	}
	t.Logf("catalog down: %d/%d queries succeeded over %s", ok, total, time.Since(start).Round(time.Millisecond))
	assert.Equal(t, total, ok, "every query on an existing database succeeds with the catalog down")
	// A purged edge cannot resolve routes with the catalog down: it fails
	// fast with a retryable error instead of queueing on the catalog.
	require.NoError(t, c.edges[1].Purge())
	a = e2eCall(t, "POST", base(1)+"/"+db.UUID+"/query", bearer, map[string]any{"sql": "SELECT 1"})
	assert.Equal(t, 503, a.status, "%s", a.raw)
	assert.Equal(t, 7503, a.code())
	// Control plane: retryable errors.
	a = e2eCall(t, "POST", base(0), bearer, map[string]any{"name": "during-outage"})
	assert.Equal(t, 503, a.status, "%s", a.raw)
	assert.Equal(t, 7503, a.code())
	a = e2eCall(t, "GET", base(1), bearer, nil)
	assert.Equal(t, 503, a.status, "%s", a.raw)
	assert.Equal(t, 7503, a.code())

	// Restart the catalog: creates continue.
	c.restartCatalog()
	require.Eventually(t, func() bool {
		a = e2eCall(t, "POST", base(0), bearer, map[string]any{"name": "after-outage"})
		return a.status == 200
	}, 60*time.Second, 250*time.Millisecond, "create never recovered: %s", a.raw)
	var after struct{ UUID string }
	require.NoError(t, json.Unmarshal(a.Result, &after))
	a = e2eCall(t, "POST", base(0)+"/"+after.UUID+"/query", bearer, map[string]any{"sql": "SELECT 1 AS one"})
	assert.Equal(t, 200, a.status, "%s", a.raw)
	require.Eventually(t, func() bool {
		a = e2eCall(t, "GET", base(1), bearer, nil)
		return a.status == 200 && bytes.Contains(a.raw, []byte(after.UUID))
	}, 30*time.Second, 100*time.Millisecond)
}
