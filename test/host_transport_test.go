package test

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/internal/pki"
	"github.com/shoaldb/shoal/test/harness"
)

// TestHostTransportProcesses runs a catalog, an object host and two edges
// as processes with mutual TLS: edge e1 forwards queries over the
// multiplexed frame transport (the default), edge e2 with --host-transport
// http, as an edge of an earlier version does. Both give the same answers;
// e1's went over frames. A host killed with a query in flight fails that
// query with a retryable 503 (not resent: it may have run), and once the
// host is back the next query through e1 dials again and succeeds.
//
// Creates through e1 send their batched inits and confirms on the same
// frame connection; through e2 as HTTP requests.
//
// SHOAL_OLD_HOST_BIN, when set, names a shoal binary of an earlier version
// for the host: one without the frame transport (then e1 must fall back to
// HTTP for queries too), or one whose frame connections take queries only
// (then e1 sends its lifecycle batches over HTTP and its queries over
// frames) — the same answers either way (the mixed-version rolling
// upgrade). SHOAL_OLD_FRAMES=1 says the old host has the frame transport.
// SHOAL_OLD_EDGE_BIN, when set, adds an edge e3 of an earlier version:
// its creates (lifecycle batches over HTTP, or single calls) must work
// against this host, and its databases must answer through e1.
func TestHostTransportProcesses(t *testing.T) {
	bin := shoalBin.Path(t)
	hostBin := bin
	oldHost := os.Getenv("SHOAL_OLD_HOST_BIN")
	if oldHost != "" {
		hostBin = oldHost
	}
	oldFrames := os.Getenv("SHOAL_OLD_FRAMES") == "1"
	oldEdge := os.Getenv("SHOAL_OLD_EDGE_BIN")
	dir := t.TempDir()
	p := harness.NewPKI(t)
	ops := p.HTTPClient(t, "ops", pki.RoleOperator)
	catAddr := harness.FreeAddr(t)
	cat := harness.StartProc(t, bin, "n1", append([]string{"raftmeta", "serve", "--id", "n1", "--dir", filepath.Join(dir, "n1"),
		"--raft-addr", harness.FreeAddr(t), "--http-addr", catAddr, "--bootstrap", "--log-level", "warn"},
		p.Args(t, "n1", pki.RoleCatalog)...)...)
	harness.WaitHTTP200With(t, ops, "https://"+catAddr+"/readyz", 30*time.Second, "catalog never ready: %s", cat.Log)
	hostAddr := harness.FreeAddr(t)
	host := harness.StartProc(t, hostBin, "h1", append([]string{"objecthost", "serve", "--id", "h1", "--dir", filepath.Join(dir, "h1"),
		"--http-addr", hostAddr, "--region", "weur", "--catalog", catAddr, "--log-level", "warn"},
		p.Args(t, "h1", pki.RoleHost)...)...)
	harness.WaitHTTP200With(t, ops, "https://"+hostAddr+"/healthz", 30*time.Second, "host never healthy: %s", host.Log)
	if oldHost == "" {
		// The host re-executed itself in place with the runtime's
		// monitor kept awake (srvruntime.MonitorAwake).
		assertMonitorAwake(t, "object host", host.Cmd.Process.Pid)
	}
	edges := map[string]string{}
	type edgeSpec struct{ name, transport, bin string }
	specs := []edgeSpec{{"e1", "frames", bin}, {"e2", "http", bin}}
	if oldEdge != "" {
		specs = append(specs, edgeSpec{"e3", "frames", oldEdge})
	}
	for _, e := range specs {
		addr := harness.FreeAddr(t)
		proc := harness.StartProc(t, e.bin, e.name, append([]string{"edge", "serve", "--http-addr", addr, "--dir", filepath.Join(dir, e.name),
			"--region", "weur", "--catalog", catAddr, "--admin-token", "admin", "--host-transport", e.transport,
			"--account-rate", "100000", "--database-rate", "100000", "--log-level", "warn"}, p.Args(t, e.name, pki.RoleEdge)...)...)
		edges[e.name] = "http://" + addr
		harness.WaitHTTP200(t, edges[e.name]+"/healthz", 30*time.Second, "edge %s never healthy: %s", e.name, proc.Log)
	}
	c := &harness.E2ECluster{EdgeURL: []string{edges["e1"], edges["e2"]}, Admin: "admin"}
	acct, bearer := c.SetupAccount(t, "paid")
	dbURL := func(e string) string { return edges[e] + "/client/v4/accounts/" + acct + "/d1/database" }
	var a harness.Answer
	require.Eventually(t, func() bool {
		a = harness.Call(t, http.MethodPost, dbURL("e1"), bearer, map[string]any{"name": "transport"})
		return a.Status == http.StatusOK
	}, 30*time.Second, 200*time.Millisecond, "create: %s", a.Raw)
	var db struct{ UUID string }
	require.NoError(t, json.Unmarshal(a.Result, &db))
	a = harness.Call(t, http.MethodPost, dbURL("e1")+"/"+db.UUID+"/query", bearer, map[string]any{"batch": []any{
		map[string]any{"sql": "CREATE TABLE kv (k INTEGER PRIMARY KEY, v TEXT)"},
		map[string]any{"sql": "INSERT INTO kv VALUES (1, 'one'), (2, 'two'), (3, ?)", "params": []any{"three"}},
	}})
	require.Equal(t, http.StatusOK, a.Status, "%s", a.Raw)

	queries := []struct {
		kind string
		body any
	}{
		{"query", map[string]any{"sql": "SELECT * FROM kv WHERE k >= ? ORDER BY k", "params": []any{2}}},
		{"raw", map[string]any{"sql": "SELECT k, v FROM kv ORDER BY k"}},
		{"query", map[string]any{"sql": "SELECT * FROM missing"}},
		{"query", map[string]any{"batch": []any{map[string]any{"sql": "SELECT 1 AS a"}, map[string]any{"sql": "SELECT 2 AS b"}}}},
		{"query", map[string]any{"sql": "SELECT hex(zeroblob(300000)) AS big"}}, // over one frame and the window
	}
	for _, q := range queries {
		f := harness.Call(t, http.MethodPost, dbURL("e1")+"/"+db.UUID+"/"+q.kind, bearer, q.body)
		h := harness.Call(t, http.MethodPost, dbURL("e2")+"/"+db.UUID+"/"+q.kind, bearer, q.body)
		assert.Equal(t, h.Status, f.Status, "%v", q.body)
		assert.Equal(t, withoutTimings(t, h.Raw), withoutTimings(t, f.Raw), "%v", q.body)
	}
	// Creates through every edge, each database then queried through e1.
	for name := range edges {
		a := harness.Call(t, http.MethodPost, dbURL(name), bearer, map[string]any{"name": "made-by-" + name})
		require.Equal(t, http.StatusOK, a.Status, "create through %s: %s", name, a.Raw)
		var made struct{ UUID string }
		require.NoError(t, json.Unmarshal(a.Result, &made))
		a = harness.Call(t, http.MethodPost, dbURL("e1")+"/"+made.UUID+"/query", bearer, map[string]any{"sql": "SELECT 1 AS one"})
		require.Equal(t, http.StatusOK, a.Status, "query of %s's database: %s", name, a.Raw)
	}
	counter := func(edge, metric string) (frames, plain int) {
		resp, err := http.Get(edges[edge] + "/metrics")
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		count := func(transport string) int {
			m := regexp.MustCompile(metric + `\{transport="` + transport + `"\} (\d+)`).FindSubmatch(b)
			require.NotNil(t, m, "no %s %s series on %s", transport, metric, edge)
			n, _ := strconv.Atoi(string(m[1]))
			return n
		}
		return count("frames"), count("http")
	}
	forwards := func(edge string) (int, int) { return counter(edge, "shoal_edge_host_forwards_total") }
	batches := func(edge string) (int, int) { return counter(edge, "shoal_edge_host_lifecycle_batches_total") }
	f1, h1 := forwards("e1")
	f2, h2 := forwards("e2")
	bf1, bh1 := batches("e1")
	bf2, bh2 := batches("e2")
	switch {
	case oldHost == "":
		assert.Positive(t, f1, "e1 forwarded over frames")
		assert.Zero(t, h1)
		assert.Positive(t, bf1, "e1's creates batched over frames")
		assert.Zero(t, bh1)
	case oldFrames:
		assert.Positive(t, f1, "an older host with frames: e1 forwards over them")
		assert.Zero(t, h1)
		assert.Zero(t, bf1, "an older host takes only queries on frames: e1's batches go over HTTP")
		assert.Positive(t, bh1)
	default:
		assert.Zero(t, f1, "an older host: e1 falls back to HTTP")
		assert.Positive(t, h1)
		assert.Zero(t, bf1)
		assert.Positive(t, bh1)
	}
	assert.Zero(t, f2)
	assert.Positive(t, h2)
	assert.Zero(t, bf2, "--host-transport http: batches over HTTP too")
	assert.Positive(t, bh2)

	// A host killed with a query in flight: that query fails (503, retry),
	// the next one after the restart succeeds through e1 (a new
	// connection).
	answered := make(chan harness.Answer, 1)
	go func() {
		a, err := harness.Try(http.MethodPost, dbURL("e1")+"/"+db.UUID+"/query", bearer,
			map[string]any{"sql": "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"})
		if err != nil {
			a = harness.Answer{Status: -1, Raw: []byte(err.Error())}
		}
		answered <- a
	}()
	require.Eventually(t, func() bool { return hostQueueDepth(t, ops, hostAddr) > 0 }, 20*time.Second, 20*time.Millisecond,
		"the endless query never reached the host")
	host.Restart(t, 0)
	a = <-answered
	assert.Equal(t, http.StatusServiceUnavailable, a.Status, "%s", a.Raw)
	assert.Equal(t, 7503, a.Code(), "%s", a.Raw)
	harness.WaitHTTP200With(t, ops, "https://"+hostAddr+"/healthz", 30*time.Second, "host never back: %s", host.Log)
	require.Eventually(t, func() bool {
		a = harness.Call(t, http.MethodPost, dbURL("e1")+"/"+db.UUID+"/query", bearer, map[string]any{"sql": "SELECT count(*) AS n FROM kv"})
		return a.Status == http.StatusOK
	}, 30*time.Second, 100*time.Millisecond, "no query succeeded after the restart: %s", a.Raw)
	assert.Contains(t, string(a.Raw), `"n":3`)
}

// hostQueueDepth reads shoal_objecthost_queue_depth from a host's /metrics.
func hostQueueDepth(t *testing.T, ops *http.Client, addr string) float64 {
	resp, err := ops.Get("https://" + addr + "/metrics")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	m := regexp.MustCompile(`(?m)^shoal_objecthost_queue_depth (\S+)$`).FindSubmatch(b)
	if m == nil {
		return 0
	}
	v, _ := strconv.ParseFloat(string(m[1]), 64)
	return v
}

// withoutTimings drops the timings (meta.duration, meta.timings) from a v4
// answer.
func withoutTimings(t *testing.T, b []byte) string {
	var v any
	require.NoError(t, json.Unmarshal(b, &v), "%s", b)
	var strip func(any)
	strip = func(x any) {
		switch x := x.(type) {
		case map[string]any:
			delete(x, "duration")
			delete(x, "timings")
			for _, y := range x {
				strip(y)
			}
		case []any:
			for _, y := range x {
				strip(y)
			}
		}
	}
	strip(v)
	out, err := json.Marshal(v)
	require.NoError(t, err)
	return string(out)
}
