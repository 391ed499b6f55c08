package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/internal/plane"
	"github.com/shoaldb/shoal/objecthost"
	"github.com/shoaldb/shoal/pipeline"
	"github.com/shoaldb/shoal/pipeline/chsink"
	"github.com/shoaldb/shoal/pipeline/storage"
	"github.com/shoaldb/shoal/test/harness"
)

// The background plane's figures of issue 10 (docs/benchmarks.md,
// "Background plane: query-path cost and burst lag"), on
// harness.PipelineCluster (the cluster of test/pipeline_e2e_test.go's fault
// test): catalog, object host, edge and pipeline role as
// separate processes, the broker in this process over TCP, ClickHouse a
// child process. Run with SHOAL_BENCH=1; nothing here asserts a timing.

// planeBench is that cluster with accounts and databases holding a small
// table kv(id, v) of rows rows, all on its one object host.
type planeBench struct {
	c        *harness.PipelineCluster
	dbs      []harness.PipelineDB
	rows     int
	hostAddr string
	hostArgs []string // as harness.NewPipelineCluster started it: with --kafka-brokers
}

// benchEnvInt is the integer in $name, def when it is unset; anything else
// fails t.
func benchEnvInt(t *testing.T, name string, def int) int {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	require.NoError(t, err, "%s", name)
	return n
}

func newPlaneBench(t *testing.T, accounts, dbs, rows int) *planeBench {
	b := &planeBench{c: harness.NewPipelineCluster(t, shoalBin.Path(t)), rows: rows}
	b.hostArgs = slices.Clone(b.c.Host.Args)
	b.hostAddr = b.hostArgs[slices.Index(b.hostArgs, "--http-addr")+1]
	e := &harness.E2ECluster{Admin: b.c.Admin, EdgeURL: []string{b.c.EdgeURL}}
	var tokens []harness.PipelineDB
	for range accounts {
		acct, bearer := e.SetupAccount(t, "paid")
		tokens = append(tokens, harness.PipelineDB{Acct: acct, Token: strings.TrimPrefix(bearer, "Bearer ")})
	}
	fill := fmt.Sprintf("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM n WHERE i < %d) INSERT INTO kv SELECT i, 'value-' || i FROM n", rows)
	var mu sync.Mutex
	var failed []string
	made := make([]harness.PipelineDB, dbs)
	harness.Concurrently(dbs, 8, func(i int) {
		db := tokens[i%accounts]
		a, err := harness.Try(http.MethodPost, b.c.EdgeURL+"/client/v4/accounts/"+db.Acct+"/d1/database", "Bearer "+db.Token,
			map[string]any{"name": fmt.Sprintf("bench-%04d", i)})
		if err == nil && a.Status == http.StatusOK {
			var r struct{ UUID string }
			if err = json.Unmarshal(a.Result, &r); err == nil {
				db.UUID = r.UUID
				a, err = harness.Try(http.MethodPost, b.queryURL(db), "Bearer "+db.Token, map[string]any{"batch": []any{
					map[string]any{"sql": "CREATE TABLE kv (id INTEGER PRIMARY KEY, v TEXT)"}, map[string]any{"sql": fill}}})
			}
		}
		if err != nil || a.Status != http.StatusOK {
			mu.Lock()
			failed = append(failed, harness.AnswerText(a, err))
			mu.Unlock()
			return
		}
		made[i] = db
	})
	require.Empty(t, failed, "setting up %d databases", dbs)
	b.dbs = made
	return b
}

func (b *planeBench) queryURL(db harness.PipelineDB) string {
	return b.c.EdgeURL + "/client/v4/accounts/" + db.Acct + "/d1/database/" + db.UUID + "/query"
}

func (b *planeBench) send(db harness.PipelineDB, sql string, params ...any) error {
	body, err := json.Marshal(map[string]any{"sql": sql, "params": params})
	if err != nil {
		return err
	}
	return postJSON(b.queryURL(db), map[string]string{"Authorization": "Bearer " + db.Token, "Content-Type": "application/json"}, body)
}

// pointSelect is the measured query: one row by primary key from a random
// database.
func (b *planeBench) pointSelect(rng *rand.Rand) error {
	return b.send(b.dbs[rng.IntN(len(b.dbs))], "SELECT v FROM kv WHERE id = ?", 1+rng.IntN(b.rows))
}

// restartHost stops the object host (SIGTERM: the producer flushes its last
// window) and starts it on the same data directory and address, with the
// background plane on (--kafka-brokers) or off (no brokers).
func (b *planeBench) restartHost(t *testing.T, planeOn bool) {
	t.Helper()
	p := b.c.Host
	p.Signal(syscall.SIGTERM)
	select {
	case <-p.Exited:
	case <-time.After(30 * time.Second):
		t.Fatalf("object host did not stop on SIGTERM: %s", harness.Tail(p.Log.String(), 2000))
	}
	args := slices.Clone(b.hostArgs)
	if !planeOn {
		i := slices.Index(args, "--kafka-brokers")
		args = slices.Delete(args, i, i+2)
	}
	p.Args = args
	fmt.Fprintf(p.Log, "--- restarted at %s, plane on: %v ---\n", time.Now().Format(time.TimeOnly), planeOn)
	p.Start(t)
	harness.WaitHTTP200(t, "http://"+b.hostAddr+"/healthz", 30*time.Second, "object host never healthy: %s", p.Log)
}

// warm waits for the edge to reach the restarted host, opens every
// database's handle, then runs the measured load for d unmeasured.
func (b *planeBench) warm(t *testing.T, clients int, d time.Duration) {
	t.Helper()
	rng := rand.New(rand.NewPCG(1, 1))
	require.Eventually(t, func() bool { return b.pointSelect(rng) == nil }, 30*time.Second, 20*time.Millisecond,
		"no query through the edge after the host restart")
	harness.Concurrently(len(b.dbs), clients, func(i int) { _ = b.send(b.dbs[i], "SELECT v FROM kv WHERE id = 1") })
	runClients(t, clients, d, func(_ int, rng *rand.Rand) error { return b.pointSelect(rng) })
}

// procCPU is a process's user+system CPU time so far, from
// /proc/<pid>/stat (pid 0: this process). Linux reports it in USER_HZ
// ticks, 100 per second for every user-space ABI.
func procCPU(t *testing.T, pid int) time.Duration {
	t.Helper()
	name := "/proc/self/stat"
	if pid != 0 {
		name = "/proc/" + strconv.Itoa(pid) + "/stat"
	}
	raw, err := os.ReadFile(name)
	require.NoError(t, err)
	_, cpu, ok := parseProcStat(raw)
	require.True(t, ok, "%s: %q", name, raw)
	return cpu
}

// procFaults is a process's minor page faults so far (field 10 of
// /proc/<pid>/stat: pages the kernel mapped, and zeroed, on first touch).
func procFaults(t *testing.T, pid int) int64 {
	t.Helper()
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	require.NoError(t, err)
	f := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+2:]))
	n, err := strconv.ParseInt(f[10-3], 10, 64)
	require.NoError(t, err)
	return n
}

// procRSS is a process's resident set in bytes (VmRSS of /proc/<pid>/status).
func procRSS(t *testing.T, pid int) int64 {
	t.Helper()
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	require.NoError(t, err)
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			require.NoError(t, err)
			return kb << 10
		}
	}
	return 0
}

// groupCPU is procCPU summed over the live processes of a process group
// (clickhouse-server runs as a watchdog and the server it forks).
func groupCPU(t *testing.T, pgid int) time.Duration {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	require.NoError(t, err)
	var sum time.Duration
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		raw, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // exited meanwhile
		}
		if pg, cpu, ok := parseProcStat(raw); ok && pg == pgid {
			sum += cpu
		}
	}
	return sum
}

// parseProcStat reads the process group (field 5) and utime+stime (fields
// 14 and 15) of a /proc/<pid>/stat line; fields are counted after the
// command name, which may hold spaces.
func parseProcStat(raw []byte) (pgrp int, cpu time.Duration, ok bool) {
	i := strings.LastIndexByte(string(raw), ')')
	if i < 0 || i+2 > len(raw) {
		return 0, 0, false
	}
	f := strings.Fields(string(raw[i+2:])) // f[0] is field 3
	if len(f) < 13 {
		return 0, 0, false
	}
	pg, err1 := strconv.Atoi(f[5-3])
	ut, err2 := strconv.ParseInt(f[14-3], 10, 64)
	st, err3 := strconv.ParseInt(f[15-3], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return 0, 0, false
	}
	return pg, time.Duration(ut+st) * (time.Second / 100), true
}

// metricValue reads one sample from a Prometheus text exposition (0 when
// absent); unlike scrapeMetrics it may run off the test's goroutine.
func metricValue(url, name string) (float64, error) {
	resp, err := harness.Client().Get(url)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			return strconv.ParseFloat(v, 64)
		}
	}
	return 0, nil
}

// perfRecord profiles pid with perf(1) into dir/name.data when
// SHOAL_BENCH_PERF_DIR is set (the host serves no /debug/pprof), sampling
// CPU time or the event SHOAL_BENCH_PERF_EVENT names; the returned
// function stops it. Read with `perf report -i FILE`.
func perfRecord(t *testing.T, pid int, name string) (stop func()) {
	dir := os.Getenv("SHOAL_BENCH_PERF_DIR")
	if dir == "" {
		return func() {}
	}
	args := []string{"record", "-F", "499", "-g", "-p", strconv.Itoa(pid), "-o", filepath.Join(dir, name+".data")}
	if ev := os.Getenv("SHOAL_BENCH_PERF_EVENT"); ev != "" { // e.g. page-faults
		args = append(args, "-e", ev)
	}
	cmd := exec.Command("perf", args...)
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	cmd.SysProcAttr = harness.ChildProcAttr()
	require.NoError(t, cmd.Start(), "perf record")
	return func() {
		_ = cmd.Process.Signal(syscall.SIGINT)
		_ = cmd.Wait()
	}
}

// costSlot is one measured slot of TestBenchPipelineQueryCost.
type costSlot struct {
	on                        bool
	ops                       int
	qps                       float64
	p50, p99                  time.Duration
	host, edge, rest, self    time.Duration // CPU over the slot
	pipe, ch                  time.Duration
	wall                      time.Duration
	usageEvents, usageWindows float64 // published by the host during the slot
	hostFaults                int64   // the host's minor page faults during the slot
	hostRSS                   int64   // at the slot's end
}

func (s costSlot) perOp(cpu time.Duration) time.Duration { return cpu / time.Duration(max(s.ops, 1)) }

func planeLabel(on bool) string {
	if on {
		return "ON "
	}
	return "OFF"
}

// TestBenchPipelineQueryCost: point SELECTs through the edge with the
// object host's background plane on (--kafka-brokers: usage and sizes
// aggregated on the query path and produced to the broker, the pipeline
// role consuming them into ClickHouse) and off (the same host restarted
// without brokers), in interleaved rounds of the same run. Every slot
// restarts the host, so ON and OFF slots are built alike; rounds alternate
// which goes first (ON OFF, OFF ON, …). Prints throughput, p50/p99 and the
// CPU per query of the host and the edge per slot, and the ON/OFF ratios.
//
//	SHOAL_BENCH=1 go test -run TestBenchPipelineQueryCost -v -count=1 -timeout 30m ./test/bench/
//
// SHOAL_BENCH_ROUNDS (6), SHOAL_BENCH_SECONDS (8, per slot),
// SHOAL_BENCH_WARM_S (10: load, unmeasured, after each restart; a host
// with the plane on takes seconds to settle: its heap spikes while the
// producer starts and it takes ~1,000 page faults/s for a while after),
// SHOAL_BENCH_CLIENTS (16), SHOAL_BENCH_DBS (300), SHOAL_BENCH_PERF_DIR
// (perf record of the host in every slot), SHOAL_BENCH_HOST_LOG (print the
// host's output).
func TestBenchPipelineQueryCost(t *testing.T) {
	if os.Getenv("SHOAL_BENCH") == "" {
		t.Skip("set SHOAL_BENCH=1")
	}
	rounds := benchEnvInt(t, "SHOAL_BENCH_ROUNDS", 6)
	dur := time.Duration(benchEnvInt(t, "SHOAL_BENCH_SECONDS", 8)) * time.Second
	clients := benchEnvInt(t, "SHOAL_BENCH_CLIENTS", 16)
	nDB := benchEnvInt(t, "SHOAL_BENCH_DBS", 300)
	warmFor := time.Duration(benchEnvInt(t, "SHOAL_BENCH_WARM_S", 10)) * time.Second
	b := newPlaneBench(t, 8, nDB, 100)
	t.Logf("%d databases over 8 accounts, kv of %d rows each, on one host; %d rounds × (ON, OFF) × %s after %s of warm-up, %d clients",
		nDB, b.rows, rounds, dur, warmFor, clients)
	hostMetrics := "http://" + b.hostAddr + "/metrics"

	slot := func(on bool, round int) costSlot {
		b.restartHost(t, on)
		b.warm(t, clients, warmFor)
		var ev0, win0 float64
		if on {
			ev0, _ = metricValue(hostMetrics, "shoal_pipeline_usage_events_total")
			win0, _ = metricValue(hostMetrics, "shoal_pipeline_usage_windows_total")
		}
		hostPid, edgePid, pipePid, catPid := b.c.Host.Cmd.Process.Pid, b.c.Edge.Cmd.Process.Pid, b.c.Pipe.Cmd.Process.Pid, b.c.Cat.Cmd.Process.Pid
		stopPerf := perfRecord(t, hostPid, fmt.Sprintf("host-%s-r%d", strings.TrimSpace(strings.ToLower(planeLabel(on))), round))
		f0 := procFaults(t, hostPid)
		h0, e0, p0, c0, ch0, s0 := procCPU(t, hostPid), procCPU(t, edgePid), procCPU(t, pipePid), procCPU(t, catPid), groupCPU(t, b.c.CH.Pid()), procCPU(t, 0)
		t0 := time.Now()
		l, qps := runClients(t, clients, dur, func(_ int, rng *rand.Rand) error { return b.pointSelect(rng) })
		s := costSlot{on: on, ops: l.Len(), qps: qps, p50: l.Pct(.5), p99: l.Pct(.99), wall: time.Since(t0),
			host: procCPU(t, hostPid) - h0, edge: procCPU(t, edgePid) - e0, pipe: procCPU(t, pipePid) - p0,
			rest: procCPU(t, catPid) - c0, ch: groupCPU(t, b.c.CH.Pid()) - ch0, self: procCPU(t, 0) - s0,
			hostFaults: procFaults(t, hostPid) - f0, hostRSS: procRSS(t, hostPid)}
		stopPerf()
		if on {
			ev, _ := metricValue(hostMetrics, "shoal_pipeline_usage_events_total")
			win, _ := metricValue(hostMetrics, "shoal_pipeline_usage_windows_total")
			s.usageEvents, s.usageWindows = ev-ev0, win-win0
		}
		sec := s.wall.Seconds()
		t.Logf("round %d %s: %7.0f q/s  p50 %7s  p99 %7s | CPU/query host %5.1f µs  edge %5.1f µs  test proc (clients+broker) %5.1f µs | CPU/s pipeline %3.0f ms  clickhouse %3.0f ms  catalog %3.0f ms | host faults %.0f/s, RSS %d MiB | usage events %.0f/s (%.0f windows)",
			round, planeLabel(on), s.qps, s.p50.Round(time.Microsecond), s.p99.Round(time.Microsecond),
			us(s.perOp(s.host)), us(s.perOp(s.edge)), us(s.perOp(s.self)),
			float64(s.pipe.Milliseconds())/sec, float64(s.ch.Milliseconds())/sec, float64(s.rest.Milliseconds())/sec,
			float64(s.hostFaults)/sec, s.hostRSS>>20, s.usageEvents/sec, s.usageWindows)
		return s
	}

	var on, off []costSlot
	for r := range rounds {
		order := []bool{true, false}
		if r%2 == 1 {
			order = []bool{false, true}
		}
		for _, o := range order {
			s := slot(o, r)
			if o {
				on = append(on, s)
			} else {
				off = append(off, s)
			}
		}
	}

	// The plane really ran: the sink inserted what the ON slots produced.
	var st benchPipeStatus
	require.NoError(t, harness.GetJSON(b.c.PipeURL+"/v1/status", &st))
	require.NotNil(t, st.ClickHouse, "the pipeline role has no ClickHouse sink")
	require.NotZero(t, st.ClickHouse.Sink.Inserted, "the sink inserted nothing: the plane was not on")

	ratio := func(f func(costSlot) float64) (per []float64, pooled float64) {
		var sumOn, sumOff float64
		for i := range on {
			per = append(per, f(on[i])/f(off[i]))
			sumOn += f(on[i])
			sumOff += f(off[i])
		}
		return per, sumOn / sumOff
	}
	report := func(what string, f func(costSlot) float64) {
		per, pooled := ratio(f)
		parts := make([]string, len(per))
		for i, r := range per {
			parts[i] = fmt.Sprintf("%.3f", r)
		}
		t.Logf("  %-28s median %.3f  pooled %.3f  per round %s", what, median(per), pooled, strings.Join(parts, " "))
	}
	t.Logf("ON/OFF, same rounds (median of the per-round ratios; pooled = sum ON / sum OFF):")
	report("throughput", func(s costSlot) float64 { return s.qps })
	report("p50", func(s costSlot) float64 { return float64(s.p50) })
	report("p99", func(s costSlot) float64 { return float64(s.p99) })
	report("host CPU per query", func(s costSlot) float64 { return float64(s.host) / float64(s.ops) })
	report("edge CPU per query", func(s costSlot) float64 { return float64(s.edge) / float64(s.ops) })
	// The edge runs the same binary and load in both configurations: host
	// CPU relative to the edge's in the same slot cancels the machine's own
	// slowdowns (other work on the two cores), which move both alike.
	report("host CPU ÷ edge CPU", func(s costSlot) float64 { return float64(s.host) / float64(s.edge) })
	report("host page faults per query", func(s costSlot) float64 { return float64(s.hostFaults) / float64(s.ops) })
	report("host+edge CPU per query", func(s costSlot) float64 { return float64(s.host+s.edge) / float64(s.ops) })
	report("all roles' CPU per query", func(s costSlot) float64 {
		return float64(s.host+s.edge+s.pipe+s.ch+s.rest) / float64(s.ops)
	})
	if os.Getenv("SHOAL_BENCH_HOST_LOG") != "" { // e.g. with GODEBUG=gctrace=1 in the environment
		t.Logf("object host output (tail):\n%s", harness.Tail(b.c.Host.Log.String(), 20000))
	}
	t.Logf("sink after the run: %d events inserted in %d batches, %d insert errors, %d duplicates dropped",
		st.ClickHouse.Sink.Inserted, st.ClickHouse.Sink.Batches, st.ClickHouse.Sink.InsertErrors, st.ClickHouse.Sink.DuplicatesDropped)
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

func median(v []float64) float64 {
	s := slices.Clone(v)
	sort.Float64s(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// benchPipeStatus is the pipeline role's /v1/status (cmd/shoal's
// pipelineStatus).
type benchPipeStatus struct {
	Storage    storage.Stats `json:"storage"`
	ClickHouse *struct {
		Reachable bool         `json:"reachable"`
		Sink      chsink.Stats `json:"sink"`
	} `json:"clickhouse"`
	Kafka      *plane.KafkaReport `json:"kafka"`
	KafkaError string             `json:"kafka_error"`
}

func (s *benchPipeStatus) groupLag(group string) int64 {
	if s.Kafka == nil {
		return -1
	}
	for _, g := range s.Kafka.Groups {
		if g.Group == group {
			return g.Lag
		}
	}
	return -1
}

// lagSample is one reading of the pipeline role's status.
type lagSample struct {
	at                 time.Duration // since the load started
	phase              string
	qps                float64 // queries answered since the previous sample, per second
	usageLag, storeLag int64   // the brokers' view: records past the groups' committed offsets
	sinkLag, storeCLag int64   // the consumers' own view at their last fetch
	oldestPending      time.Duration
	sinceCommitted     time.Duration // now − window end of the newest committed usage event
	lastCommitted      time.Time     // that window end
	usageEventsPerSec  float64       // published by the host since the previous sample
	sizeEventsPerSec   float64
	statusErr          string
	statusTook         time.Duration
}

// TestBenchPipelineBurstLag: with the plane on, steady paced load for
// SHOAL_BENCH_STEADY_S (20) seconds at SHOAL_BENCH_QPS (500) queries/s on a
// tenth of the databases, then ×10 — ten times the rate on all of them, so
// ten times the active (account, database, shape) keys, which is what the
// host's per-second pre-aggregation turns into usage events — for
// SHOAL_BENCH_BURST_S (20) seconds, then the steady load again until the
// lag is back (at most SHOAL_BENCH_DRAIN_S, 90). One query in ten is an
// INSERT of 1 KiB (so sizes move and the storage topic carries something). The
// pipeline role's /v1/status (what `shoal pipeline status --json` prints)
// is sampled every 500 ms: the groups' lag as the brokers report it, the
// consumers' own lag, the age of the oldest usage window pending in the
// sink. With SHOAL_BENCH_PAUSE_PIPELINE=1 the pipeline role is stopped
// (SIGSTOP) for the burst and continued at its end: the backlog of the
// whole burst, and how fast the consumers drain it.
//
//	SHOAL_BENCH=1 go test -run TestBenchPipelineBurstLag -v -count=1 -timeout 30m ./test/bench/
func TestBenchPipelineBurstLag(t *testing.T) {
	if os.Getenv("SHOAL_BENCH") == "" {
		t.Skip("set SHOAL_BENCH=1")
	}
	const factor = 10
	rate := float64(benchEnvInt(t, "SHOAL_BENCH_QPS", 500))
	steadyDur := time.Duration(benchEnvInt(t, "SHOAL_BENCH_STEADY_S", 20)) * time.Second
	burstDur := time.Duration(benchEnvInt(t, "SHOAL_BENCH_BURST_S", 20)) * time.Second
	drainMax := time.Duration(benchEnvInt(t, "SHOAL_BENCH_DRAIN_S", 90)) * time.Second
	nDB := benchEnvInt(t, "SHOAL_BENCH_DBS", 600)
	workers := benchEnvInt(t, "SHOAL_BENCH_CLIENTS", 64)
	pause := os.Getenv("SHOAL_BENCH_PAUSE_PIPELINE") != ""
	b := newPlaneBench(t, 8, nDB, 100)
	b.warm(t, 16, time.Second)
	steadyDBs := nDB / factor
	// Start from a drained plane: the sink's first batch (set-up and
	// warm-up usage, ClickHouse's tables created) can take seconds.
	require.Eventually(t, func() bool {
		var st benchPipeStatus
		return harness.GetJSON(b.c.PipeURL+"/v1/status", &st) == nil && st.ClickHouse != nil && st.ClickHouse.Sink.LastCommittedMs > 0 &&
			st.groupLag(chsink.DefaultGroup) == 0 && st.groupLag(storage.DefaultGroup) == 0
	}, 90*time.Second, 250*time.Millisecond, "the plane never drained the set-up's usage: %s", b.c.Pipe.Log)

	// An open-loop generator: a pacer issues tokens at the phase's rate,
	// workers take them. Tokens the workers cannot take (all busy, the
	// buffer full) are dropped and counted: the box's limit, reported.
	var (
		phase    atomic.Value // "steady", "burst", "after"
		curRate  atomic.Uint64
		answered atomic.Int64
		failures atomic.Int64
		dropped  atomic.Int64
		errOnce  sync.Once
		firstErr string
	)
	phase.Store("steady")
	curRate.Store(uint64(rate))
	tokens := make(chan struct{}, workers)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		last, owed := time.Now(), 0.0
		for {
			select {
			case <-stop:
				return
			case now := <-tick.C:
				owed += now.Sub(last).Seconds() * float64(curRate.Load())
				last = now
				for ; owed >= 1; owed-- {
					select {
					case tokens <- struct{}{}:
					default:
						dropped.Add(1)
					}
				}
			}
		}
	}()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 11))
			for {
				select {
				case <-stop:
					return
				case <-tokens:
				}
				n := steadyDBs
				if phase.Load() == "burst" {
					n = nDB
				}
				db := b.dbs[rng.IntN(n)]
				var err error
				if rng.IntN(10) == 0 {
					err = b.send(db, "INSERT INTO kv (v) VALUES (hex(randomblob(512)))") // 1 KiB: the size moves
				} else {
					err = b.send(db, "SELECT v FROM kv WHERE id = ?", 1+rng.IntN(b.rows))
				}
				if err != nil {
					failures.Add(1)
					errOnce.Do(func() { firstErr = err.Error() })
					continue
				}
				answered.Add(1)
			}
		}()
	}
	defer func() { close(stop); wg.Wait() }()

	hostMetrics := "http://" + b.hostAddr + "/metrics"
	statusClient := &http.Client{Timeout: 2 * time.Second}
	start := time.Now()
	var samples []lagSample
	var prevAnswered int64
	prevEvents, _ := metricValue(hostMetrics, "shoal_pipeline_usage_events_total")
	prevSizes, _ := metricValue(hostMetrics, "shoal_pipeline_size_events_total")
	prevAt := time.Duration(0)
	sample := func() lagSample {
		t0 := time.Now()
		s := lagSample{phase: phase.Load().(string)}
		var st benchPipeStatus
		resp, err := statusClient.Get(b.c.PipeURL + "/v1/status")
		if err == nil {
			err = json.NewDecoder(resp.Body).Decode(&st)
			resp.Body.Close()
		}
		now := time.Now()
		s.at, s.statusTook = now.Sub(start), now.Sub(t0)
		switch {
		case err != nil:
			s.statusErr = err.Error()
		case st.KafkaError != "":
			s.statusErr = st.KafkaError
		}
		s.usageLag, s.storeLag = st.groupLag(chsink.DefaultGroup), st.groupLag(storage.DefaultGroup)
		s.storeCLag = st.Storage.Lag
		if ch := st.ClickHouse; ch != nil {
			s.sinkLag = ch.Sink.Lag
			if ch.Sink.OldestPendingMs > 0 {
				s.oldestPending = now.Sub(time.UnixMilli(ch.Sink.OldestPendingMs))
			}
			if ch.Sink.LastCommittedMs > 0 {
				s.lastCommitted = time.UnixMilli(ch.Sink.LastCommittedMs)
				s.sinceCommitted = now.Sub(s.lastCommitted)
			}
		}
		a := answered.Load()
		ev, _ := metricValue(hostMetrics, "shoal_pipeline_usage_events_total")
		sz, _ := metricValue(hostMetrics, "shoal_pipeline_size_events_total")
		if dt := (s.at - prevAt).Seconds(); dt > 0 {
			s.qps = float64(a-prevAnswered) / dt
			s.usageEventsPerSec, s.sizeEventsPerSec = (ev-prevEvents)/dt, (sz-prevSizes)/dt
		}
		prevAnswered, prevEvents, prevSizes, prevAt = a, ev, sz, s.at
		return s
	}
	every := time.NewTicker(500 * time.Millisecond)
	defer every.Stop()
	var burstStart, burstEnd time.Duration
	answeredAt := map[string]int64{}
	droppedAt := map[string]int64{}
	phaseStart := map[string]time.Duration{"steady": 0}
	drainedAt, zeroAt := time.Duration(-1), time.Duration(-1)
	var steadyMaxUsage, steadyMaxStore int64
	const steadyWarm = 2 * time.Second
	for range every.C {
		s := sample()
		samples = append(samples, s)
		el := time.Since(start)
		switch s.phase {
		case "steady":
			if s.at >= steadyWarm { // past the last windows of the warm-up, which touched every database
				steadyMaxUsage, steadyMaxStore = max(steadyMaxUsage, s.usageLag), max(steadyMaxStore, s.storeLag)
			}
			if el >= steadyDur {
				answeredAt["steady"], droppedAt["steady"] = answered.Load(), dropped.Load()
				burstStart = el
				phaseStart["burst"] = el
				curRate.Store(uint64(factor * rate))
				phase.Store("burst")
				if pause {
					b.c.Pipe.Signal(syscall.SIGSTOP)
				}
			}
		case "burst":
			if el >= burstStart+burstDur {
				answeredAt["burst"], droppedAt["burst"] = answered.Load(), dropped.Load()
				burstEnd = el
				phaseStart["after"] = el
				curRate.Store(uint64(rate))
				phase.Store("after")
				if pause {
					b.c.Pipe.Signal(syscall.SIGCONT)
				}
			}
		case "after":
			// Drained: ClickHouse holds every window up to the burst's end
			// (the newest committed one ends after it) and the lag is down
			// to the steady phase's.
			caughtUp := s.statusErr == "" && !s.lastCommitted.Before(start.Add(burstEnd))
			if caughtUp && drainedAt < 0 && s.usageLag <= steadyMaxUsage && s.storeLag <= steadyMaxStore {
				drainedAt = s.at
			}
			if caughtUp && zeroAt < 0 && s.usageLag == 0 && s.storeLag == 0 {
				zeroAt = s.at
			}
		}
		if s.phase == "after" && ((drainedAt >= 0 && zeroAt >= 0 && el > drainedAt+5*time.Second) || el > burstEnd+drainMax) {
			answeredAt["after"], droppedAt["after"] = answered.Load(), dropped.Load()
			phaseStart["end"] = el
			break
		}
	}

	t.Logf("%d databases over 8 accounts (steady load on %d of them, the burst on all), %d workers, 1 query in 10 an INSERT", nDB, steadyDBs, workers)
	if pause {
		t.Logf("the pipeline role was stopped (SIGSTOP) for the whole burst and continued (SIGCONT) at its end")
	}
	t.Logf("   t(s) phase     q/s  usage-ev/s size-ev/s  usage-lag store-lag  sink-lag store-c-lag  oldest-pending  since-commit  status-took")
	for _, s := range samples {
		note := ""
		if s.statusErr != "" {
			note = "  status error: " + s.statusErr
		}
		t.Logf("  %5.1f %-6s %6.0f %11.0f %9.0f %10d %9d %9d %11d %14s %13s %12s%s", s.at.Seconds(), s.phase, s.qps, s.usageEventsPerSec, s.sizeEventsPerSec,
			s.usageLag, s.storeLag, s.sinkLag, s.storeCLag, s.oldestPending.Round(10*time.Millisecond),
			s.sinceCommitted.Round(10*time.Millisecond), s.statusTook.Round(time.Millisecond), note)
	}
	var prevA, prevD int64
	for _, ph := range []string{"steady", "burst", "after"} {
		d := (phaseStart[map[string]string{"steady": "burst", "burst": "after", "after": "end"}[ph]] - phaseStart[ph]).Seconds()
		a, dr := answeredAt[ph]-prevA, droppedAt[ph]-prevD
		prevA, prevD = answeredAt[ph], droppedAt[ph]
		t.Logf("phase %-6s %5.1f s: %8.0f queries/s answered, %d tokens dropped (generator saturated)", ph, d, float64(a)/d, dr)
	}
	peak := func(phases []string, f func(lagSample) float64) float64 {
		var m float64
		for _, s := range samples {
			if slices.Contains(phases, s.phase) && s.statusErr == "" && (s.phase != "steady" || s.at >= steadyWarm) {
				m = max(m, f(s))
			}
		}
		return m
	}
	for _, ph := range [][]string{{"steady"}, {"burst"}, {"after"}} {
		t.Logf("peak during %v: usage lag %.0f records, storage lag %.0f, sink's own lag %.0f, oldest pending %s, since last commit %s",
			ph, peak(ph, func(s lagSample) float64 { return float64(s.usageLag) }),
			peak(ph, func(s lagSample) float64 { return float64(s.storeLag) }),
			peak(ph, func(s lagSample) float64 { return float64(s.sinkLag) }),
			time.Duration(peak(ph, func(s lagSample) float64 { return float64(s.oldestPending) })).Round(10*time.Millisecond),
			time.Duration(peak(ph, func(s lagSample) float64 { return float64(s.sinceCommitted) })).Round(10*time.Millisecond))
	}
	if pause && drainedAt >= 0 {
		var backlog int64
		for _, s := range samples {
			if s.phase == "after" && s.statusErr == "" {
				backlog = s.usageLag + s.storeLag // the first answer after SIGCONT
				break
			}
		}
		t.Logf("backlog when the role answered again: %d records; drained in %.1f s", backlog, (drainedAt - burstEnd).Seconds())
	}
	if drainedAt >= 0 {
		t.Logf("burst end → ClickHouse holds every window to the burst's end and both groups' lag is within the steady phase's peak (usage %d, storage %d): %.1f s",
			steadyMaxUsage, steadyMaxStore, (drainedAt - burstEnd).Seconds())
	} else {
		t.Logf("lag NOT back within the steady peak %s after the burst", drainMax)
	}
	if zeroAt >= 0 {
		t.Logf("burst end → ClickHouse holds every window to the burst's end and both groups' lag is 0: %.1f s", (zeroAt - burstEnd).Seconds())
	} else {
		t.Logf("no sample with both groups' lag 0 within %s after the burst", drainMax)
	}
	if n := failures.Load(); n > 0 {
		errOnce.Do(func() {})
		t.Logf("%d queries failed (first: %s)", n, firstErr)
	}
}

// BenchmarkHostRecordUsage is, in-process, what the plane adds to each
// query on the object host's path: PipelineSinks.RecordUsage (shape the
// first statement, add it to the usage aggregator's shard), for the point
// SELECT of TestBenchPipelineQueryCost over 300 databases. The windows are
// published to a discarding publisher.
//
//	go test -run '^$' -bench HostRecordUsage -benchmem ./test/bench/
func BenchmarkHostRecordUsage(b *testing.B) {
	a := pipeline.NewUsageAggregator(discardPublisher{}, pipeline.NewSequencer("h@1"), pipeline.UsageConfig{})
	defer a.Close()
	sinks := objecthost.PipelineSinks{Usage: a}
	dbs := make([]string, 300)
	for i := range dbs {
		dbs[i] = fmt.Sprintf("0190a000-0000-7000-8000-%012d", i)
	}
	accts := []string{"a0", "a1", "a2", "a3", "a4", "a5", "a6", "a7"}
	now := time.Now()
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ { // one goroutine: ns/op is CPU per query
		sinks.RecordUsage(objecthost.UsageEvent{AccountID: accts[i%len(accts)], DatabaseUUID: dbs[i%len(dbs)],
			RowsRead: 1, Time: now, Duration: 40 * time.Microsecond, SQL: "SELECT v FROM kv WHERE id = ?"})
	}
}

type discardPublisher struct{}

func (discardPublisher) Publish(string, []byte, []byte) error { return nil }
