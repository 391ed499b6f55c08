package objecthost

// Benchmarks behind SHOAL_BENCH=1 (they print figures, they assert only
// correctness). Results are recorded in docs/bench/objecthost.md.
//
//	SHOAL_BENCH=1 go test ./objecthost/ -run 'TestBench' -v -timeout 30m
//	SHOAL_BENCH_DBS=100000 selects the many-databases size (default 20,000).

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	_ "github.com/mattn/go-sqlite3"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/objecthost/history"
	"github.com/shoaldb/shoal/objecthost/sqlexec"
	"github.com/shoaldb/shoal/raftmeta/fsm"
)

const benchClients = 16

func benchOnly(t *testing.T) {
	if os.Getenv("SHOAL_BENCH") == "" {
		t.Skip("set SHOAL_BENCH=1")
	}
}

func benchDur() time.Duration {
	if s := os.Getenv("SHOAL_BENCH_SECONDS"); s != "" {
		n, _ := strconv.Atoi(s)
		return time.Duration(n) * time.Second
	}
	return 3 * time.Second
}

// cpuTime is the process's user+system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// lastCPUPerOp is the process CPU time per operation of the last runFor
// (the machine is shared: throughput depends on how much CPU we got, the
// CPU cost per operation much less).
var lastCPUPerOp time.Duration

// runFor runs fn from n goroutines for d and returns operations per second.
func runFor(n int, d time.Duration, fn func(g int, i int) error) (float64, error) {
	cpu0 := cpuTime()
	var ops atomic.Int64
	var firstErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	start := time.Now()
	for g := 0; g < n; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if err := fn(g, i); err != nil {
					firstErr.CompareAndSwap(nil, err)
					return
				}
				ops.Add(1)
			}
		}(g)
	}
	time.Sleep(d) // the measured phase: the workers run for d
	close(stop)
	wg.Wait()
	el := time.Since(start)
	if ops.Load() > 0 {
		lastCPUPerOp = (cpuTime() - cpu0) / time.Duration(ops.Load())
	}
	if e, ok := firstErr.Load().(error); ok {
		return 0, e
	}
	return float64(ops.Load()) / el.Seconds(), nil
}

// listen serves h's API on a real loopback listener.
func listen(t *testing.T, h *Host) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &http.Server{Handler: h.Handler()}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "http://" + ln.Addr().String()
}

func keepAliveClient() *http.Client {
	return &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64, MaxConnsPerHost: 64, DisableCompression: true}}
}

type rpc struct {
	c    *http.Client
	base string
}

func (r rpc) do(path string, d db, body []byte) error {
	req, err := http.NewRequest("POST", r.base+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set(HeaderDatabase, d.uuid)
	req.Header.Set(HeaderAccount, d.account)
	resp, err := r.c.Do(req)
	if err != nil {
		return err
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return err
	}
	if resp.StatusCode != 200 {
		return fmt.Errorf("status %d: %s", resp.StatusCode, b)
	}
	return nil
}

func TestBenchQueryThroughput(t *testing.T) {
	benchOnly(t)
	dur := benchDur()
	th := newTestHost(t, nil)
	base := listen(t, th.Host)
	r := rpc{c: keepAliveClient(), base: base}
	ctx := context.Background()
	const rows = 10000
	d := newDB("bench")
	th.mustInit(t, d)
	_, err := th.Query(ctx, d.obj, d.id(), q("CREATE TABLE kv (id INTEGER PRIMARY KEY, v TEXT)"))
	require.NoError(t, err)
	_, err = th.Query(ctx, d.obj, d.id(), q(fmt.Sprintf("WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM c WHERE i < %d) INSERT INTO kv SELECT i, 'value-' || i FROM c", rows)))
	require.NoError(t, err)

	// Baseline 1: sqlexec in-process on a file with the host's settings.
	basePath := filepath.Join(t.TempDir(), "base.db")
	sx, err := sqlexec.Open(basePath, sqlexec.Options{Limits: sqlexec.DefaultLimits(), ReadConns: th.cfg.ReadConns})
	require.NoError(t, err)
	defer sx.Close()
	_, err = sx.Execute(ctx, q("CREATE TABLE kv (id INTEGER PRIMARY KEY, v TEXT)"))
	require.NoError(t, err)
	_, err = sx.Execute(ctx, q(fmt.Sprintf("WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM c WHERE i < %d) INSERT INTO kv SELECT i, 'value-' || i FROM c", rows)))
	require.NoError(t, err)
	// Baseline 2: plain database/sql + mattn/go-sqlite3, WAL, synchronous
	// NORMAL, one writer connection and the same number of readers.
	rawPath := filepath.Join(t.TempDir(), "raw.db")
	raw, err := sql.Open("sqlite3", "file:"+rawPath+"?_journal_mode=WAL&_synchronous=NORMAL&_busy_timeout=5000")
	require.NoError(t, err)
	defer raw.Close()
	raw.SetMaxOpenConns(1 + th.cfg.ReadConns)
	_, err = raw.Exec("CREATE TABLE kv (id INTEGER PRIMARY KEY, v TEXT)")
	require.NoError(t, err)
	_, err = raw.Exec(fmt.Sprintf("WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM c WHERE i < %d) INSERT INTO kv SELECT i, 'value-' || i FROM c", rows))
	require.NoError(t, err)
	sel, err := raw.Prepare("SELECT id, v FROM kv WHERE id = ?")
	require.NoError(t, err)
	ins, err := raw.Prepare("INSERT INTO kv (v) VALUES (?)")
	require.NoError(t, err)

	selBody := func(i int) []byte {
		return []byte(`{"sql":"SELECT id, v FROM kv WHERE id = ?","params":[` + strconv.Itoa(1+i%rows) + `]}`)
	}
	insBody := []byte(`{"sql":"INSERT INTO kv (v) VALUES (?)","params":["new"]}`)
	selReq := func(i int) sqlexec.Request {
		return sqlexec.Request{Statements: []sqlexec.Statement{{SQL: "SELECT id, v FROM kv WHERE id = ?", Params: []json.RawMessage{json.RawMessage(strconv.Itoa(1 + i%rows))}}}}
	}
	insReq := sqlexec.Request{Statements: []sqlexec.Statement{{SQL: "INSERT INTO kv (v) VALUES (?)", Params: []json.RawMessage{json.RawMessage(`"new"`)}}}}

	rpcSel, err := runFor(benchClients, dur, func(g, i int) error { return r.do("/v1/objects/"+d.obj+"/query", d, selBody(g*7919+i)) })
	require.NoError(t, err)
	cpuRPCSel := lastCPUPerOp
	sxSel, err := runFor(benchClients, dur, func(g, i int) error { _, err := sx.Execute(ctx, selReq(g*7919+i)); return err })
	require.NoError(t, err)
	cpuSxSel := lastCPUPerOp
	rawSel, err := runFor(benchClients, dur, func(g, i int) error {
		var id int64
		var v string
		return sel.QueryRow(1+(g*7919+i)%rows).Scan(&id, &v)
	})
	require.NoError(t, err)
	cpuRawSel := lastCPUPerOp

	rpcIns, err := runFor(benchClients, dur, func(g, i int) error { return r.do("/v1/objects/"+d.obj+"/query", d, insBody) })
	require.NoError(t, err)
	cpuRPCIns := lastCPUPerOp
	sxIns, err := runFor(benchClients, dur, func(g, i int) error { _, err := sx.Execute(ctx, insReq); return err })
	require.NoError(t, err)
	cpuSxIns := lastCPUPerOp
	rawIns, err := runFor(benchClients, dur, func(g, i int) error { _, err := ins.Exec("new"); return err })
	require.NoError(t, err)
	cpuRawIns := lastCPUPerOp
	t.Logf("CPU per op (client + server, whole process): SELECT RPC %s, sqlexec %s, database/sql %s; INSERT RPC %s, sqlexec %s, database/sql %s",
		cpuRPCSel, cpuSxSel, cpuRawSel, cpuRPCIns, cpuSxIns, cpuRawIns)

	if wrkSel, wrkIns, ok := runWrk(t, base, d, dur, rows); ok {
		t.Logf("wrk (C client, 2 threads, %d connections) through the RPC: point SELECT %.0f/s (%.2fx sqlexec), INSERT %.0f/s (%.2fx sqlexec)",
			benchClients, wrkSel, wrkSel/sxSel, wrkIns, wrkIns/sxIns)
	}
	t.Logf("point SELECT, %d clients, %s each: RPC %.0f/s | in-process sqlexec %.0f/s (RPC = %.2fx) | database/sql %.0f/s (RPC = %.2fx)",
		benchClients, dur, rpcSel, sxSel, rpcSel/sxSel, rawSel, rpcSel/rawSel)
	t.Logf("single-row INSERT, %d clients: RPC %.0f/s | in-process sqlexec %.0f/s (RPC = %.2fx) | database/sql %.0f/s (RPC = %.2fx)",
		benchClients, rpcIns, sxIns, rpcIns/sxIns, rawIns, rpcIns/rawIns)
}

func TestBenchInitRate(t *testing.T) {
	benchOnly(t)
	dur := benchDur()
	th := newTestHost(t, func(c *Config) { c.Catalog = nil })
	r := rpc{c: keepAliveClient(), base: listen(t, th.Host)}
	rate, err := runFor(benchClients, dur, func(g, i int) error {
		d := newDB("bench")
		body, _ := json.Marshal(d.init())
		return r.do("/v1/objects/"+d.obj+"/init", d, body)
	})
	require.NoError(t, err)
	n := th.Stats().Active
	th.reopen(t)
	require.Equal(t, n, th.Stats().Active, "every acknowledged init is durable")
	t.Logf("init over HTTP, %d concurrent: %.0f inits/s (%d databases, all present after reopen)", benchClients, rate, n)
	// Baseline: one fsynced SQLite file per init, the design the index replaces.
	dir := t.TempDir()
	var seq atomic.Int64
	fileRate, err := runFor(benchClients, dur, func(g, i int) error {
		p := filepath.Join(dir, strconv.FormatInt(seq.Add(1), 10)+".db")
		conn, err := sql.Open("sqlite3", "file:"+p+"?_journal_mode=WAL&_synchronous=FULL")
		if err != nil {
			return err
		}
		defer conn.Close()
		_, err = conn.Exec("CREATE TABLE _meta (k, v); INSERT INTO _meta VALUES ('uuid', 'x')")
		return err
	})
	require.NoError(t, err)
	t.Logf("baseline: create + fsync one SQLite file per init, %d concurrent: %.0f/s (index is %.1fx)", benchClients, fileRate, rate/fileRate)
}

func TestBenchManyDatabases(t *testing.T) {
	benchOnly(t)
	n := 20000
	if s := os.Getenv("SHOAL_BENCH_DBS"); s != "" {
		n, _ = strconv.Atoi(s)
	}
	th := newTestHost(t, func(c *Config) { c.Catalog = nil })
	ctx := context.Background()
	all := make([]db, n)
	for i := range all {
		all[i] = newDB(fmt.Sprintf("acct-%d", i%1000))
	}
	// Build: inits from 64 goroutines (group-committed).
	start := time.Now()
	var next atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < 64; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if _, err := th.Init(ctx, all[i].obj, all[i].init()); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	initDur := time.Since(start)
	idx := th.Stats().IndexBytes
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	t.Logf("%d inits in %s (%.0f/s); index file %d bytes = %.0f bytes/database; Go heap %d MB (%.0f bytes/database)",
		n, initDur.Round(time.Millisecond), float64(n)/initDur.Seconds(), idx, float64(idx)/float64(n), ms.HeapAlloc>>20, float64(ms.HeapAlloc)/float64(n))

	// First query on each creates its file: CREATE TABLE + one row, the
	// smallest useful database. SHOAL_BENCH_FILES limits how many get a
	// file (file creation is bound by the disk's fsync rate: each evicted
	// handle's close checkpoints its WAL).
	files := n
	if s := os.Getenv("SHOAL_BENCH_FILES"); s != "" {
		files, _ = strconv.Atoi(s)
		files = min(files, n)
	}
	start = time.Now()
	next.Store(0)
	for g := 0; g < benchClients; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= files {
					return
				}
				d := all[i]
				if _, err := th.Query(ctx, d.obj, d.id(), q("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT); INSERT INTO t VALUES (1, 'x')")); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	fileDur := time.Since(start)
	th.reopen(t) // closes every handle: WAL checkpointed into the files
	var du, nfiles int64
	_ = filepath.Walk(filepath.Join(th.dir, "dbs"), func(_ string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() {
			du += fi.Size()
			nfiles++
		}
		return nil
	})
	t.Logf("first query (creates the file) on %d databases in %s (%.0f/s); %d files, %d bytes = %.0f bytes/database (+ index %.0f)",
		files, fileDur.Round(time.Millisecond), float64(files)/fileDur.Seconds(), nfiles, du, float64(du)/float64(files), float64(th.Stats().IndexBytes)/float64(n))

	// Cold queries: random databases, handle cache (1,000) far smaller than n.
	r := rpc{c: keepAliveClient(), base: listen(t, th.Host)}
	const samples = 3000
	lat := make([]time.Duration, 0, samples)
	latRPC := make([]time.Duration, 0, samples)
	var cpuIn, cpuRPC time.Duration
	for i := 0; i < samples; i++ {
		d := all[rand.IntN(files)]
		c0 := cpuTime()
		s := time.Now()
		_, err := th.Query(ctx, d.obj, d.id(), q("SELECT v FROM t WHERE id = 1"))
		require.NoError(t, err)
		lat = append(lat, time.Since(s))
		c1 := cpuTime()
		d = all[rand.IntN(files)]
		s = time.Now()
		require.NoError(t, r.do("/v1/objects/"+d.obj+"/query", d, []byte(`{"sql":"SELECT v FROM t WHERE id = 1"}`)))
		latRPC = append(latRPC, time.Since(s))
		cpuIn += c1 - c0
		cpuRPC += cpuTime() - c1
	}
	pct := func(l []time.Duration, p float64) time.Duration {
		slices.Sort(l)
		return l[int(float64(len(l)-1)*p)]
	}
	t.Logf("cold query to a random one of %d databases with a file (of %d in all; cache %d): in-process p50 %s p90 %s p99 %s | over HTTP p50 %s p90 %s p99 %s; open handles %d",
		files, n, th.Host.cfg.MaxOpen, pct(lat, .5), pct(lat, .9), pct(lat, .99), pct(latRPC, .5), pct(latRPC, .9), pct(latRPC, .99), th.Stats().OpenHandles)
	t.Logf("process CPU per cold query (incl. the evicted handle's background close): in-process %s, over HTTP (client + host) %s",
		cpuIn/samples, cpuRPC/samples)
}

// countingCatalog answers every UUID as known, active, confirmed at
// generation 0 and counts calls (heartbeat schedule simulation).
type countingCatalog struct {
	calls, uuids atomic.Int64
}

func (c *countingCatalog) Heartbeat(_ context.Context, uuids []string) (fsm.HeartbeatAnswer, error) {
	c.calls.Add(1)
	c.uuids.Add(int64(len(uuids)))
	ans := fsm.HeartbeatAnswer{Databases: make([]fsm.HeartbeatState, len(uuids))}
	for i, u := range uuids {
		ans.Databases[i] = fsm.HeartbeatState{UUID: u, Known: true, State: fsm.StateActive, AccountID: "a"}
	}
	return ans, nil
}
func (c *countingCatalog) ConfirmHeartbeat(ctx context.Context, uuids []string) (fsm.HeartbeatAnswer, error) {
	return c.Heartbeat(ctx, uuids)
}
func (c *countingCatalog) FenceOrphans(_ context.Context, _ string, uuids []string) (fsm.FenceAnswer, error) {
	return fsm.FenceAnswer{Known: uuids}, nil
}
func (c *countingCatalog) RegisterHost(context.Context, fsm.RegisterHost) error     { return nil }
func (c *countingCatalog) ReportHostLoad(context.Context, fsm.ReportHostLoad) error { return nil }

func TestBenchHeartbeatSchedule(t *testing.T) {
	benchOnly(t)
	n := 1_000_000
	if s := os.Getenv("SHOAL_BENCH_HB_DBS"); s != "" {
		n, _ = strconv.Atoi(s)
	}
	for _, chunk := range []int{1000, 5000, 10000} { // 5,000 is the default
		cat := &countingCatalog{}
		th := newTestHost(t, func(c *Config) { c.Catalog = cat; c.HeartbeatBatch = chunk })
		// Simulate n objects in memory only (no index rows, no files): the
		// schedule and the answer handling are what is measured.
		now := th.clock.Now()
		for i := 0; i < n; i++ {
			m := &Meta{ObjectID: fmt.Sprintf("%032x", i), DatabaseUUID: fmt.Sprintf("00000000-0000-4000-8000-%012x", i), AccountID: "a", State: StateActive, Confirmed: true, CreatedAt: now}
			o := &object{}
			o.meta.Store(m)
			th.objects[m.ObjectID] = o
			th.scheduleFirst(m, now)
		}
		const ticks = 60 // two default intervals of 1 s ticks
		var maxCalls int64
		var cpu time.Duration
		for k := 0; k < ticks; k++ {
			th.clock.Advance(time.Second)
			before := cat.calls.Load()
			s := time.Now()
			th.RunHeartbeats(context.Background())
			cpu += time.Since(s)
			maxCalls = max(maxCalls, cat.calls.Load()-before)
		}
		t.Logf("%d databases, interval 30 s, 1 s ticks, chunk %d: %.1f catalog calls/s (max %d in one tick), %.0f heartbeats/s, host time per tick %s",
			n, chunk, float64(cat.calls.Load())/ticks, maxCalls, float64(cat.uuids.Load())/ticks, (cpu / ticks).Round(time.Microsecond))
		require.NoError(t, th.Host.Close())
	}
}

// BenchmarkRPCPointSelect is the RPC point SELECT alone (for profiling):
//
//	go test ./objecthost/ -run '^$' -bench RPCPointSelect -cpuprofile cpu.out
func BenchmarkRPCPointSelect(b *testing.B) {
	h, err := Open(Config{ID: "bench", Dir: b.TempDir(), Manual: true})
	require.NoError(b, err)
	defer h.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(b, err)
	srv := &http.Server{Handler: h.Handler()}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	r := rpc{c: keepAliveClient(), base: "http://" + ln.Addr().String()}
	d := newDB("bench")
	_, err = h.Init(context.Background(), d.obj, d.init())
	require.NoError(b, err)
	_, err = h.Query(context.Background(), d.obj, d.id(), q("CREATE TABLE kv (id INTEGER PRIMARY KEY, v TEXT); INSERT INTO kv VALUES (1, 'one')"))
	require.NoError(b, err)
	body := []byte(`{"sql":"SELECT id, v FROM kv WHERE id = ?","params":[1]}`)
	b.SetParallelism(8)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := r.do("/v1/objects/"+d.obj+"/query", d, body); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// runWrk drives the RPC with wrk (a C load generator, far cheaper per
// request than Go's HTTP client, so the host gets more of the two cores)
// when it is installed.
func runWrk(t *testing.T, base string, d db, dur time.Duration, rows int) (sel, ins float64, ok bool) {
	if _, err := exec.LookPath("wrk"); err != nil {
		t.Log("wrk not installed: skipping the wrk figures")
		return 0, 0, false
	}
	dir := t.TempDir()
	script := func(name, body string) string {
		p := filepath.Join(dir, name)
		lua := fmt.Sprintf(`wrk.method = "POST"
wrk.headers["%s"] = "%s"
wrk.headers["%s"] = "%s"
wrk.headers["Content-Type"] = "application/json"
request = function()
  return wrk.format(nil, nil, nil, %s)
end
`, HeaderDatabase, d.uuid, HeaderAccount, d.account, body)
		require.NoError(t, os.WriteFile(p, []byte(lua), 0o644))
		return p
	}
	run := func(p string) float64 {
		cpu0 := cpuTime()
		out, err := exec.Command("wrk", "-t2", "-c"+strconv.Itoa(benchClients), "-d"+strconv.Itoa(int(dur.Seconds()))+"s", "-s", p, base+"/v1/objects/"+d.obj+"/query").CombinedOutput()
		require.NoError(t, err, string(out))
		m := regexp.MustCompile(`Requests/sec:\s+([0-9.]+)`).FindSubmatch(out)
		require.NotNil(t, m, string(out))
		require.NotContains(t, string(out), "Non-2xx", string(out))
		v, _ := strconv.ParseFloat(string(m[1]), 64)
		t.Logf("wrk %s: %.0f req/s, host CPU per request %s", filepath.Base(p), v, time.Duration(float64(cpuTime()-cpu0)/(v*dur.Seconds())))
		return v
	}
	sel = run(script("sel.lua", fmt.Sprintf(`'{"sql":"SELECT id, v FROM kv WHERE id = ?","params":[' .. math.random(%d) .. ']}'`, rows)))
	ins = run(script("ins.lua", `'{"sql":"INSERT INTO kv (v) VALUES (?)","params":["new"]}'`))
	return sel, ins, true
}

// BenchmarkColdQuery is a point SELECT through Host.Query on a database
// whose handle was evicted (the host keeps 8 handles; 64 databases are
// read round robin, so every read opens the file), for profiling the cold
// path (TestDeployColdQueryBench measures it in the deployment topology):
//
//	go test ./objecthost/ -run '^$' -bench ColdQuery -cpuprofile cpu.out
func BenchmarkColdQuery(b *testing.B) {
	for _, hist := range []bool{false, true} {
		b.Run(fmt.Sprintf("history=%v", hist), func(b *testing.B) { benchColdQuery(b, hist) })
	}
}

func benchColdQuery(b *testing.B, hist bool) {
	cfg := Config{ID: "bench", Dir: b.TempDir(), Manual: true, MaxOpen: 8}
	if hist {
		store, err := history.NewDirStore(b.TempDir())
		require.NoError(b, err)
		cfg.History = &HistoryConfig{Store: store, SweepInterval: -1}
	}
	h, err := Open(cfg)
	require.NoError(b, err)
	defer h.Close()
	ctx := context.Background()
	dbs := make([]db, 64)
	for i := range dbs {
		dbs[i] = newDB("bench")
		_, err = h.Init(ctx, dbs[i].obj, dbs[i].init())
		require.NoError(b, err)
		_, err = h.Query(ctx, dbs[i].obj, dbs[i].id(), q("CREATE TABLE kv (id INTEGER PRIMARY KEY, v TEXT); INSERT INTO kv VALUES (1, 'one')"))
		require.NoError(b, err)
	}
	sel := q("SELECT id, v FROM kv WHERE id = 1")
	// One pass first: every database has been closed once (with history,
	// its writes captured, settled and its generation shipped), so the
	// timed loop measures the steady cold path, not the set-up's tail.
	for _, d := range dbs {
		_, err := h.Query(ctx, d.obj, d.id(), sel)
		require.NoError(b, err)
	}
	lat := make([]time.Duration, b.N)
	b.ResetTimer()
	cpu0 := cpuTime()
	for i := range b.N {
		d := dbs[i%len(dbs)]
		t0 := time.Now()
		if _, err := h.Query(ctx, d.obj, d.id(), sel); err != nil {
			b.Fatal(err)
		}
		lat[i] = time.Since(t0)
	}
	b.StopTimer()
	// The process's CPU per cold query (the open, the query, the evicted
	// handle's background close, the shipper): steadier than wall time on a
	// shared machine.
	b.ReportMetric(float64((cpuTime()-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/op")
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}
