package test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/edge"
	"github.com/shoaldb/shoal/internal/binding"
	v4 "github.com/shoaldb/shoal/internal/v4"
	"github.com/shoaldb/shoal/objecthost"
	"github.com/shoaldb/shoal/objecthost/sqlexec"
	"github.com/shoaldb/shoal/raftmeta"
	"github.com/shoaldb/shoal/test/harness"
)

// tenantCluster is one catalog node, one object host with the limits under
// test and one edge, in this process over loopback HTTP, each served by
// v4.NewServer as the shoal binary serves them.
type tenantCluster struct {
	*harness.E2ECluster // EdgeURL and Admin only (for SetupAccount)
	host                *objecthost.Host
	hostReg             *prometheus.Registry
}

func newTenantCluster(t *testing.T, mod func(*objecthost.Config)) *tenantCluster {
	t.Helper()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	node, err := raftmeta.NewNode(raftmeta.Config{ID: "c0", Dir: t.TempDir(), RaftAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
		Bootstrap: true, Logger: quiet, RaftLogOutput: io.Discard})
	require.NoError(t, err)
	t.Cleanup(func() { _ = node.Close() })
	require.Eventually(t, node.IsLeader, 20*time.Second, 20*time.Millisecond)
	keys, err := binding.KeyringFromSecrets("limits-binding-secret-0123456789")
	require.NoError(t, err)
	cl, err := raftmeta.NewClient([]string{node.HTTPAddr()})
	require.NoError(t, err)
	hln, haddr := harness.Listen(t)
	reg := prometheus.NewRegistry()
	cfg := objecthost.Config{ID: "h0", Dir: t.TempDir(), Address: haddr, Region: "weur", Capacity: 1000,
		Catalog: objecthost.RaftmetaCatalog{C: cl}, Bindings: keys, Logger: quiet, Registry: reg}
	if mod != nil {
		mod(&cfg)
	}
	h, err := objecthost.Open(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = h.Close() })
	hs := v4.NewServer(h.Handler(), v4.ServerOptions{})
	go func() { _ = hs.Serve(hln) }()
	t.Cleanup(func() { _ = hs.Close() })
	ecl, err := raftmeta.NewClient([]string{node.HTTPAddr()})
	require.NoError(t, err)
	srv, err := edge.New(edge.Options{Catalog: edge.RaftmetaCatalog{C: ecl}, Dir: t.TempDir(), Region: "weur",
		AdminToken: "limits-admin", BindingKeys: keys, Logger: quiet, TokenTTL: time.Minute,
		AccountRate: edge.RateLimit{Rate: 1e6, Burst: 1e6}, DatabaseRate: edge.RateLimit{Rate: 1e6, Burst: 1e6}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Close() })
	eln, eaddr := harness.Listen(t)
	es := v4.NewServer(srv, v4.ServerOptions{})
	go func() { _ = es.Serve(eln) }()
	t.Cleanup(func() { _ = es.Close() })
	require.Eventually(t, func() bool {
		hosts, err := cl.Hosts(context.Background(), raftmeta.ReadOptions{Consistency: raftmeta.Linearizable, NoCache: true})
		return err == nil && len(hosts) == 1
	}, 30*time.Second, 50*time.Millisecond, "the host never registered")
	return &tenantCluster{E2ECluster: &harness.E2ECluster{EdgeURL: []string{"http://" + eaddr}, Admin: "limits-admin"}, host: h, hostReg: reg}
}

// neighbour runs one tenant's point SELECTs, one at a time, until stop is
// closed, recording each latency and every answer that is not 200.
type neighbour struct {
	lat    harness.Latencies
	failed atomic.Int64
	errs   sync.Map // first answer text per status
	done   chan struct{}
}

func startNeighbour(t *testing.T, url, bearer string, stop <-chan struct{}) *neighbour {
	n := &neighbour{done: make(chan struct{})}
	go func() {
		defer close(n.done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			start := time.Now()
			a, err := harness.Try("POST", url, bearer, map[string]any{"sql": "SELECT id, v FROM kv WHERE id = ?", "params": []any{1 + i%100}})
			n.lat.Add(time.Since(start))
			if err != nil || a.Status != 200 {
				n.failed.Add(1)
				n.errs.LoadOrStore(fmt.Sprint(a.Status), harness.AnswerText(a, err))
			}
		}
	}()
	return n
}

func (n *neighbour) report(t *testing.T, phase string) {
	<-n.done
	t.Logf("%s: neighbour's point SELECTs: %d, failed %d, p50 %.2f ms, p99 %.2f ms, max %.2f ms", phase, n.lat.Len(), n.failed.Load(),
		harness.Millis(n.lat.Pct(0.5)), harness.Millis(n.lat.Pct(0.99)), harness.Millis(n.lat.Pct(1)))
	n.errs.Range(func(k, v any) bool { t.Logf("  first %v: %v", k, v); return true })
}

func setupNeighbour(t *testing.T, c *tenantCluster) (url, bearer string) {
	acct, bearer := c.SetupAccount(t, "paid")
	d := createDB(t, c.EdgeURL[0], acct, bearer, "neighbour")
	url = c.EdgeURL[0] + "/client/v4/accounts/" + acct + "/d1/database/" + d.UUID + "/query"
	a := harness.Call(t, "POST", url, bearer, map[string]any{"sql": "CREATE TABLE kv (id INTEGER PRIMARY KEY, v TEXT); " +
		"INSERT INTO kv SELECT value, 'value-' || value FROM json_each('[" + seq(100) + "]')"})
	require.Equal(t, 200, a.Status, "%s", a.Raw)
	return url, bearer
}

func seq(n int) string {
	s := make([]string, n)
	for i := range s {
		s[i] = fmt.Sprint(i + 1)
	}
	return strings.Join(s, ",")
}

func recurseTo(n int64) string {
	return fmt.Sprintf("WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM r WHERE i < %d) ", n)
}

// TestResourceExhaustionIsBounded: one tenant's legal but hostile queries
// — a million-row result, a UNION spilling gigabytes to temporary files,
// huge values, SQL too long or too deep, endless recursion, a program bomb
// — each stopped by a limit with a clear D1-style error, while another
// tenant's point SELECTs on the same host keep being answered.
func TestResourceExhaustionIsBounded(t *testing.T) {
	c := newTenantCluster(t, func(cfg *objecthost.Config) {
		cfg.Limits = sqlexec.DefaultLimits()
		cfg.Limits.QueryTimeout = 10 * time.Second
		cfg.Limits.MaxTempBytes = 64 << 20
	})
	nURL, nBearer := setupNeighbour(t, c)
	acct, bearer := c.SetupAccount(t, "paid")
	d := createDB(t, c.EdgeURL[0], acct, bearer, "hostile")
	q := c.EdgeURL[0] + "/client/v4/accounts/" + acct + "/d1/database/" + d.UUID + "/query"

	stop := make(chan struct{})
	n := startNeighbour(t, nURL, nBearer, stop)

	var program strings.Builder
	program.WriteString("WITH c(x) AS NOT MATERIALIZED (SELECT CASE random()")
	for i := 0; i < 2000; i++ {
		fmt.Fprintf(&program, " WHEN %d THEN %d", i, i)
	}
	program.WriteString(" END) SELECT x FROM c" + strings.Repeat(" UNION ALL SELECT x FROM c", 499))
	inList := make([]string, 30_000)
	for i := range inList {
		inList[i] = fmt.Sprint(i)
	}
	params := make([]any, 101)
	for i := range params {
		params[i] = i
	}
	cases := []struct {
		name   string
		body   map[string]any
		status int
		code   int
		msg    string
	}{
		{"million rows", map[string]any{"sql": recurseTo(1_000_000) + "SELECT i, 'padding padding padding padding padding' AS pad FROM r"}, 413, 7413, "result too large"},
		{"union spills to temporary files", map[string]any{"sql": recurseTo(1_000_000) + "SELECT count(*) FROM (SELECT hex(randomblob(500)) FROM r UNION SELECT hex(randomblob(500)) FROM r)"}, 413, 7413, "temporary storage"},
		{"order by spills", map[string]any{"sql": recurseTo(1_000_000) + "SELECT count(*) FROM (SELECT hex(randomblob(500)) AS k FROM r ORDER BY k LIMIT -1 OFFSET 1)"}, 413, 7413, "temporary storage"},
		{"zeroblob of a gigabyte", map[string]any{"sql": "SELECT length(zeroblob(1000000000))"}, 413, 7413, "SQLITE_TOOBIG"},
		{"string over 2 MB", map[string]any{"sql": "SELECT length(printf('%.*c', 3000000, 'x'))"}, 413, 7413, "SQLITE_TOOBIG"},
		{"group_concat over 2 MB", map[string]any{"sql": recurseTo(200_000) + "SELECT length(group_concat(printf('%020d', i))) FROM r"}, 413, 7413, "SQLITE_TOOBIG"},
		{"IN list of 170 KB", map[string]any{"sql": "SELECT 1 WHERE 5 IN (" + strings.Join(inList, ",") + ")"}, 413, 7413, "limit"},
		{"body of 5 MiB", map[string]any{"sql": "SELECT 1 -- " + strings.Repeat("x", 5<<20)}, 413, 7413, "request body exceeds"},
		{"101 parameters", map[string]any{"sql": "SELECT 1 WHERE 5 IN (" + strings.TrimSuffix(strings.Repeat("?,", 101), ",") + ")", "params": params}, 400, 7400, "100"},
		{"nested parentheses", map[string]any{"sql": "SELECT " + strings.Repeat("(", 5000) + "1" + strings.Repeat(")", 5000)}, 400, 7500, "SQLITE_ERROR"},
		{"expression depth", map[string]any{"sql": "SELECT 1" + strings.Repeat(" + 1", 3000)}, 400, 7500, "SQLITE_ERROR"},
		{"compound of 600 selects", map[string]any{"sql": "SELECT 1" + strings.Repeat(" UNION SELECT 1", 600)}, 400, 7500, "SQLITE_ERROR"},
		{"nested subqueries", map[string]any{"sql": strings.Repeat("SELECT * FROM (", 3000) + "SELECT 1" + strings.Repeat(")", 3000)}, 400, 7500, "SQLITE_ERROR"},
		{"endless recursion", map[string]any{"sql": "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM r) SELECT count(*) FROM r"}, 400, 7529, "time limit"},
		{"LIKE pattern over 50 bytes", map[string]any{"sql": "SELECT 'a' LIKE '" + strings.Repeat("%a", 40) + "'"}, 400, 7500, "LIKE or GLOB pattern too complex"},
		{"program bomb", map[string]any{"sql": program.String()}, 413, 7413, "too complex"},
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for _, tc := range cases {
		start := time.Now()
		a := harness.Call(t, "POST", q, bearer, tc.body)
		t.Logf("%-32s %d/%d in %s: %s", tc.name, a.Status, a.Code(), time.Since(start).Round(time.Millisecond), harness.Tail(string(a.Raw), 160))
		if assert.Equal(t, tc.status, a.Status, "%s: %s", tc.name, harness.Tail(string(a.Raw), 300)) {
			assert.Equal(t, tc.code, a.Code(), tc.name)
			assert.Contains(t, a.Errors[0].Message, tc.msg, tc.name)
			assert.False(t, a.Success)
		}
		if tc.name == "million rows" {
			runtime.ReadMemStats(&after)
			t.Logf("  process heap in use: %d MB before, %d MB after the refused million-row SELECT (Go runtime.MemStats.HeapInuse)",
				before.HeapInuse>>20, after.HeapInuse>>20)
		}
	}
	assert.Zero(t, sqlexec.TempSpaceInUse(), "no temporary file is left behind")
	close(stop)
	n.report(t, "during the attacks")
	assert.Zero(t, n.failed.Load(), "the neighbour's queries were all answered")
	assert.Greater(t, n.lat.Len(), 0)
}

// TestCPUBombKeepsNeighbourServed: a tenant keeps 32 clients busy with
// queries that burn CPU until their time limit, over four databases on one
// host; another tenant's point SELECTs on that host keep being answered.
// The neighbour's latencies before and during the attack are reported, not
// asserted (shared machines); the bomber's refusals by the per-account cap
// are counted.
func TestCPUBombKeepsNeighbourServed(t *testing.T) {
	c := newTenantCluster(t, func(cfg *objecthost.Config) {
		cfg.Limits = sqlexec.DefaultLimits()
		cfg.Limits.QueryTimeout = 2 * time.Second
	})
	nURL, nBearer := setupNeighbour(t, c)
	acct, bearer := c.SetupAccount(t, "paid")
	var bombURLs []string
	for i := 0; i < 4; i++ {
		d := createDB(t, c.EdgeURL[0], acct, bearer, fmt.Sprintf("bomb-%d", i))
		bombURLs = append(bombURLs, c.EdgeURL[0]+"/client/v4/accounts/"+acct+"/d1/database/"+d.UUID+"/query")
	}

	stop := make(chan struct{})
	n := startNeighbour(t, nURL, nBearer, stop)
	time.Sleep(3 * time.Second) // load duration: the neighbour's baseline against real processes
	close(stop)
	n.report(t, "before the attack")
	require.Zero(t, n.failed.Load())

	var outcomes sync.Map // "status/code" → *atomic.Int64
	count := func(k string) {
		v, _ := outcomes.LoadOrStore(k, new(atomic.Int64))
		v.(*atomic.Int64).Add(1)
	}
	attackStop := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < 32; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			bomb := map[string]any{"sql": "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM r) SELECT count(*) FROM r WHERE i % 7 = 3"}
			for {
				select {
				case <-attackStop:
					return
				default:
				}
				a, err := harness.Try("POST", bombURLs[w%len(bombURLs)], bearer, bomb)
				if err != nil {
					count("transport error")
					continue
				}
				count(fmt.Sprintf("%d/%d", a.Status, a.Code()))
				if a.Status == 429 {
					time.Sleep(100 * time.Millisecond) // what a client honouring Retry-After would do, roughly
				}
			}
		}()
	}
	time.Sleep(time.Second) // the bombs are running
	stop = make(chan struct{})
	n = startNeighbour(t, nURL, nBearer, stop)
	time.Sleep(10 * time.Second) // load duration: the neighbour measured while the bombs run
	close(stop)
	n.report(t, "during the attack")
	close(attackStop)
	wg.Wait()
	outcomes.Range(func(k, v any) bool { t.Logf("bomber's answers %v: %d", k, v.(*atomic.Int64).Load()); return true })
	m := counters(t, c.hostReg)
	t.Logf("host admission: %v waited, %v refused", m["shoal_objecthost_account_admission_waited_total"], m["shoal_objecthost_account_admission_refused_total"])
	assert.Zero(t, n.failed.Load(), "every one of the neighbour's queries was answered during the attack")
	v, ok := outcomes.Load("400/7529")
	require.True(t, ok, "the bombs ran into their time limit")
	assert.Greater(t, v.(*atomic.Int64).Load(), int64(0))
}

// counters sums the host's counters by name from its registry.
func counters(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	mfs, err := reg.Gather()
	require.NoError(t, err)
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if c := m.GetCounter(); c != nil {
				out[mf.GetName()] += c.GetValue()
			}
		}
	}
	return out
}
