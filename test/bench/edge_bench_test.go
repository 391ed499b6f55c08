package bench

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime/pprof"
	"runtime/trace"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/mattn/go-sqlite3"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/internal/srvruntime"
	"github.com/shoaldb/shoal/raftmeta"
	"github.com/shoaldb/shoal/test/harness"
)

// runClients runs op from n goroutines for dur and returns latencies and ops/s.
func runClients(t *testing.T, n int, dur time.Duration, op func(worker int, rng *rand.Rand) error) (*harness.Latencies, float64) {
	l := &harness.Latencies{}
	var wg sync.WaitGroup
	var errs sync.Map
	start := time.Now()
	for w := 0; w < n; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for time.Since(start) < dur {
				t0 := time.Now()
				if err := op(w, rng); err != nil {
					errs.Store(w, err)
					return
				}
				l.Add(time.Since(t0))
			}
		}(w)
	}
	wg.Wait()
	errs.Range(func(_, v any) bool { t.Fatalf("bench op failed: %v", v); return false })
	return l, float64(l.Len()) / time.Since(start).Seconds()
}

// runOpen is runClients with arrivals on a schedule instead of back to
// back (an open loop): each of the n workers issues op at Poisson arrival
// times of rate/n per second, and a latency is counted from the arrival's
// scheduled time, so a worker that falls behind its schedule counts the
// wait (no coordinated omission); n bounds the requests in flight. With
// unsynchronised arrivals a group-commit delay (the catalog client's
// gather, the edge's create batchers) waits for callers that are not
// coming back at once, which a closed loop never shows.
func runOpen(t *testing.T, n int, dur time.Duration, rate float64, op func(worker int, rng *rand.Rand) error) (*harness.Latencies, float64) {
	l := &harness.Latencies{}
	var wg sync.WaitGroup
	var errs sync.Map
	start := time.Now()
	mean := float64(time.Second) * float64(n) / rate
	for w := 0; w < n; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			next := start.Add(time.Duration(rng.ExpFloat64() * mean))
			for next.Sub(start) < dur {
				if d := time.Until(next); d > 0 {
					time.Sleep(d) // the open loop's schedule: the next arrival is due then
				}
				if err := op(w, rng); err != nil {
					errs.Store(w, err)
					return
				}
				l.Add(time.Since(next))
				next = next.Add(time.Duration(rng.ExpFloat64() * mean))
			}
		}(w)
	}
	wg.Wait()
	errs.Range(func(_, v any) bool { t.Fatalf("bench op failed: %v", v); return false })
	return l, float64(l.Len()) / time.Since(start).Seconds()
}

func postJSON(url string, hdr map[string]string, body []byte) error {
	req, err := http.NewRequest("POST", url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := harness.Client().Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		return fmt.Errorf("%d %s", resp.StatusCode, b)
	}
	return nil
}

// TestEdgeBench measures the figures in docs/bench/edge.md. Run with
// SHOAL_BENCH=1; every figure is printed with its same-run baseline.
func TestEdgeBench(t *testing.T) {
	if os.Getenv("SHOAL_BENCH") == "" {
		t.Skip("set SHOAL_BENCH=1")
	}
	const clients = 16
	dur := 3 * time.Second
	// Every component runs in this process, as in `shoal dev`: give it the
	// runtime settings `shoal dev` runs with (internal/srvruntime; GOGC and
	// GOMAXPROCS in the environment win).
	defer srvruntime.Apply(true)()
	c := harness.NewE2ECluster(t)
	acct, bearer := c.SetupAccount(t, "paid")
	base := c.EdgeURL[0] + "/client/v4/accounts/" + acct + "/d1/database"
	a := harness.Call(t, "POST", base, bearer, map[string]any{"name": "bench"})
	require.Equal(t, 200, a.Status, "%s", a.Raw)
	var db struct{ UUID string }
	require.NoError(t, json.Unmarshal(a.Result, &db))
	const rows = 1000
	var batch []any
	batch = append(batch, map[string]any{"sql": "CREATE TABLE kv (id INTEGER PRIMARY KEY, v TEXT)"})
	batch = append(batch, map[string]any{"sql": fmt.Sprintf("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM n WHERE i < %d) INSERT INTO kv SELECT i, 'value-' || i FROM n", rows)})
	a = harness.Call(t, "POST", base+"/"+db.UUID+"/query", bearer, map[string]any{"batch": batch})
	require.Equal(t, 200, a.Status, "%s", a.Raw)

	cl, err := raftmeta.NewClient(c.CatAddrs)
	require.NoError(t, err)
	row, err := cl.Database(context.Background(), db.UUID, raftmeta.StaleRead())
	require.NoError(t, err)

	body := func(rng *rand.Rand) []byte {
		b, _ := json.Marshal(map[string]any{"sql": "SELECT v FROM kv WHERE id = ?", "params": []any{1 + rng.IntN(rows)}})
		return b
	}
	// 1. Point SELECT: in-process SQLite, straight to the host, through the edge.
	sdb, err := sql.Open("sqlite3", "file:"+filepath.Join(t.TempDir(), "base.db")+"?_journal_mode=WAL&_busy_timeout=5000")
	require.NoError(t, err)
	defer sdb.Close()
	sdb.SetMaxOpenConns(clients)
	_, err = sdb.Exec("CREATE TABLE kv (id INTEGER PRIMARY KEY, v TEXT)")
	require.NoError(t, err)
	_, err = sdb.Exec(fmt.Sprintf("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM n WHERE i < %d) INSERT INTO kv SELECT i, 'value-' || i FROM n", rows))
	require.NoError(t, err)
	lSQL, qpsSQL := runClients(t, clients, dur, func(_ int, rng *rand.Rand) error {
		var v string
		return sdb.QueryRow("SELECT v FROM kv WHERE id = ?", 1+rng.IntN(rows)).Scan(&v)
	})
	hostURL := "http://" + row.HostAddress + "/v1/objects/" + row.ObjectID + "/query"
	hostHdr := map[string]string{"X-Shoal-Database": db.UUID, "X-Shoal-Account": acct, "Content-Type": "application/json"}
	lHost, qpsHost := runClients(t, clients, dur, func(_ int, rng *rand.Rand) error { return postJSON(hostURL, hostHdr, body(rng)) })
	edgeHdr := map[string]string{"Authorization": bearer, "Content-Type": "application/json"}
	stopProfile := benchProfile(t, "query")
	lEdge, qpsEdge := runClients(t, clients, dur, func(_ int, rng *rand.Rand) error {
		return postJSON(base+"/"+db.UUID+"/query", edgeHdr, body(rng))
	})
	stopProfile()
	// The same point SELECTs from wrk (a C load generator in its own
	// process, 2 threads, 16 connections), when it is installed: the Go
	// clients above run in this process and take a share of the two cores
	// that real, remote clients would not.
	wrkEdge, wrkEdgeOK := runWrkQuery(t, base+"/"+db.UUID+"/query", map[string]string{"Authorization": bearer}, rows)
	wrkHost, wrkHostOK := runWrkQuery(t, hostURL, map[string]string{"X-Shoal-Database": db.UUID, "X-Shoal-Account": acct}, rows)
	// One client: the per-request cost of each path without queueing.
	l1Host, _ := runClients(t, 1, time.Second, func(_ int, rng *rand.Rand) error { return postJSON(hostURL, hostHdr, body(rng)) })
	l1Edge, _ := runClients(t, 1, time.Second, func(_ int, rng *rand.Rand) error {
		return postJSON(base+"/"+db.UUID+"/query", edgeHdr, body(rng))
	})
	t.Logf("point SELECT, 1 client: host p50 %s, edge p50 %s (edge adds %s)", l1Host.Pct(.5), l1Edge.Pct(.5), l1Edge.Pct(.5)-l1Host.Pct(.5))
	t.Logf("point SELECT, %d clients, %s each:", clients, dur)
	t.Logf("  in-process SQLite : p50 %8s  p99 %8s  %8.0f ops/s", lSQL.Pct(.5), lSQL.Pct(.99), qpsSQL)
	t.Logf("  object host direct: p50 %8s  p99 %8s  %8.0f ops/s  (%.2fx SQLite throughput)", lHost.Pct(.5), lHost.Pct(.99), qpsHost, qpsHost/qpsSQL)
	t.Logf("  through the edge  : p50 %8s  p99 %8s  %8.0f ops/s  (%.2fx host throughput, p50 +%s)", lEdge.Pct(.5), lEdge.Pct(.99), qpsEdge, qpsEdge/qpsHost, lEdge.Pct(.5)-lHost.Pct(.5))
	if wrkEdgeOK && wrkHostOK {
		t.Logf("point SELECT from wrk (2 threads, %d connections, 3s each):", clients)
		t.Logf("  object host direct: p50 %8s  p99 %8s  %8.0f ops/s", wrkHost.p50, wrkHost.p99, wrkHost.rate)
		t.Logf("  through the edge  : p50 %8s  p99 %8s  %8.0f ops/s  (%.2fx host throughput)", wrkEdge.p50, wrkEdge.p99, wrkEdge.rate, wrkEdge.rate/wrkHost.rate)
	}

	// 2. Creates at 16 clients.
	stopProfile = benchProfile(t, "create")
	var seq sync.Mutex
	n := 0
	lCreate, cps := runClients(t, clients, dur, func(_ int, _ *rand.Rand) error {
		seq.Lock()
		n++
		name := fmt.Sprintf("c%05d", n)
		seq.Unlock()
		b, _ := json.Marshal(map[string]any{"name": name})
		return postJSON(base, edgeHdr, b)
	})
	stopProfile()
	t.Logf("create, %d clients, %s: %d creates, p50 %s p99 %s, %.1f creates/s", clients, dur, lCreate.Len(), lCreate.Pct(.5), lCreate.Pct(.99), cps)
	// Where a create's time goes: the edge's per-step histogram (mean per
	// step) and the hosts' own init latency (index group commit included).
	edgeM := harness.ScrapeMetrics(t, c.EdgeURL[0]+"/metrics")
	for _, step := range []string{"account", "placement", "init", "catalog_write", "after"} {
		k := `shoal_edge_create_step_duration_seconds_%s{step="` + step + `"}`
		sum, cnt := edgeM[fmt.Sprintf(k, "sum")], edgeM[fmt.Sprintf(k, "count")]
		if cnt > 0 {
			t.Logf("  create step %-13s mean %8s (%v observations)", step, time.Duration(sum/cnt*float64(time.Second)), cnt)
		}
	}
	hs, err := cl.Hosts(context.Background(), raftmeta.ReadOptions{Consistency: raftmeta.Stale, NoCache: true})
	require.NoError(t, err)
	var hSum, hCnt float64
	for _, h := range hs {
		m := harness.ScrapeMetrics(t, "http://"+h.Address+"/metrics")
		hSum += m["shoal_objecthost_init_duration_seconds_sum"]
		hCnt += m["shoal_objecthost_init_duration_seconds_count"]
	}
	if hCnt > 0 {
		t.Logf("  host-side init (validation + index fsync) mean %s (%v inits)", time.Duration(hSum/hCnt*float64(time.Second)), hCnt)
	}

	// 3. Route lookup: bbolt hit vs miss (bounded follower read of the catalog).
	srv := c.Edges[0]
	ctx := context.Background()
	_, err = srv.LookupRoute(ctx, db.UUID)
	require.NoError(t, err)
	const hits = 20000
	t0 := time.Now()
	for i := 0; i < hits; i++ {
		if _, err := srv.LookupRoute(ctx, db.UUID); err != nil {
			t.Fatal(err)
		}
	}
	hitCost := time.Since(t0) / hits
	list, _, err := cl.ListDatabases(ctx, acct, harness.ListAll(), raftmeta.StaleRead())
	require.NoError(t, err)
	require.NoError(t, srv.Purge())
	t0 = time.Now()
	for _, d := range list {
		if _, err := srv.LookupRoute(ctx, d.UUID); err != nil {
			t.Fatal(err)
		}
	}
	missCost := time.Since(t0) / time.Duration(len(list))
	t.Logf("route lookup: bbolt hit %s/op (%d lookups), miss %s/op (%d lookups, follower read + write-through), miss/hit %.0fx",
		hitCost, hits, missCost, len(list), float64(missCost)/float64(hitCost))
}

type wrkResult struct {
	rate     float64
	p50, p99 time.Duration
}

// runWrkQuery runs wrk for 3 s against a query URL with random point
// SELECTs; ok is false when wrk is not installed (the figure is skipped).
func runWrkQuery(t *testing.T, url string, hdr map[string]string, rows int) (wrkResult, bool) {
	if _, err := exec.LookPath("wrk"); err != nil {
		t.Log("wrk not installed: skipping the wrk figures")
		return wrkResult{}, false
	}
	var lua strings.Builder
	lua.WriteString("wrk.method = \"POST\"\nwrk.headers[\"Content-Type\"] = \"application/json\"\n")
	for k, v := range hdr {
		fmt.Fprintf(&lua, "wrk.headers[%q] = %q\n", k, v)
	}
	fmt.Fprintf(&lua, "request = function()\n  return wrk.format(nil, nil, nil, '{\"sql\":\"SELECT v FROM kv WHERE id = ?\",\"params\":[' .. math.random(%d) .. ']}')\nend\n", rows)
	p := filepath.Join(t.TempDir(), "q.lua")
	require.NoError(t, os.WriteFile(p, []byte(lua.String()), 0o644))
	out, err := exec.Command("wrk", "-t2", "-c16", "-d3s", "--latency", "-s", p, url).CombinedOutput()
	require.NoError(t, err, string(out))
	require.NotContains(t, string(out), "Non-2xx", string(out))
	m := regexp.MustCompile(`Requests/sec:\s+([0-9.]+)`).FindSubmatch(out)
	require.NotNil(t, m, string(out))
	var r wrkResult
	r.rate, _ = strconv.ParseFloat(string(m[1]), 64)
	for _, q := range regexp.MustCompile(`(?m)^\s+(50|99)%\s+([0-9.]+)(us|ms|s)\s*$`).FindAllSubmatch(out, -1) {
		d, err := time.ParseDuration(string(q[2]) + strings.Replace(string(q[3]), "us", "µs", 1))
		require.NoError(t, err)
		if string(q[1]) == "50" {
			r.p50 = d
		} else {
			r.p99 = d
		}
	}
	require.NotZero(t, r.p99, string(out))
	return r, true
}

// benchProfile starts a CPU profile of one phase when SHOAL_BENCH_CPUPROFILE
// is set, or an execution trace when SHOAL_BENCH_TRACE is (FILE.phase is
// written; every component runs in this process), and returns its stop
// function.
func benchProfile(t *testing.T, phase string) func() {
	if f := os.Getenv("SHOAL_BENCH_TRACE"); f != "" {
		out, err := os.Create(f + "." + phase)
		require.NoError(t, err)
		require.NoError(t, trace.Start(out))
		return func() { trace.Stop(); out.Close() }
	}
	f := os.Getenv("SHOAL_BENCH_CPUPROFILE")
	if f == "" {
		return func() {}
	}
	out, err := os.Create(f + "." + phase)
	require.NoError(t, err)
	require.NoError(t, pprof.StartCPUProfile(out))
	return func() { pprof.StopCPUProfile(); out.Close() }
}
