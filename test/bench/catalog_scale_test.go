package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/internal/benchenv"
	"github.com/shoaldb/shoal/internal/ids"
	"github.com/shoaldb/shoal/internal/pki"
	"github.com/shoaldb/shoal/objecthost"
	"github.com/shoaldb/shoal/raftmeta"
	"github.com/shoaldb/shoal/raftmeta/fsm"
	"github.com/shoaldb/shoal/test/harness"
)

// TestCatalogScaleBench is issue 15's catalog-at-scale measurement: three
// `shoal raftmeta serve` voters as separate processes (mutual TLS, fsync
// on, the binary's defaults), filled with N databases spread over many
// accounts through the real write path (raftmeta.Client.CreateDatabase,
// concurrent clients, as the edge writes them), then:
//
//   - memory of every node: VmRSS (anonymous and file-backed), VmHWM, and
//     the Go heap from /metrics (in use, next GC target);
//   - the catalog file, Raft log and snapshot sizes on disk;
//   - idle CPU of the three over SHOAL_BENCH_IDLE_SECONDS with no traffic,
//     then with every database heartbeating at the hosts' default interval
//     (30 s, 1 s tick, through objecthost.RaftmetaCatalog: stale reads,
//     followers first, as `shoal objecthost serve` sends them), in phases
//     of SHOAL_BENCH_IDLE_SECONDS per mode of SHOAL_BENCH_HB_MODES
//     ("perdb,digest": per-database chunks of 5,000 UUIDs, as hosts without
//     digests send them, then bucket digests, as they do now), repeated
//     SHOAL_BENCH_HB_ROUNDS times (1), with each node's CPU and the
//     leader's share, and per node the heartbeat calls it answered and
//     its CPU above its own idle rate;
//   - time to restart a follower and then the leader (kill -9, start the
//     same command) to serving: /readyz, a linearizable read and a write
//     through that node, each timed from the process start.
//
// Knobs: SHOAL_BENCH_DATABASES (default 1,000,000), SHOAL_BENCH_ACCOUNTS
// (1,000), SHOAL_BENCH_WORKERS (fill clients, 64), SHOAL_BENCH_IDLE_SECONDS
// (60), SHOAL_BENCH_HOSTS (heartbeating hosts, 3), SHOAL_BENCH_PORT_BASE
// (consecutive ports for the children), SHOAL_BENCH_HB_MODES, SHOAL_BENCH_HB_ROUNDS
// (above; "perdb" alone against a binary without digests, e.g. SHOAL_TEST_BIN
// of main's), SHOAL_BENCH_PROFILE (a directory:
// heap profiles of each node after the fill and CPU profiles during the
// heartbeat phase, through /debug/pprof). Run with:
//
//	SHOAL_BENCH=1 SHOAL_BENCH_DATABASES=100000 go test ./test/bench -run TestCatalogScaleBench -v -count=1 -timeout 60m
func TestCatalogScaleBench(t *testing.T) {
	if os.Getenv("SHOAL_BENCH") == "" {
		t.Skip("set SHOAL_BENCH=1")
	}
	n := envInt(t, "SHOAL_BENCH_DATABASES", 1_000_000)
	accounts := envInt(t, "SHOAL_BENCH_ACCOUNTS", 1000)
	idle := time.Duration(envInt(t, "SHOAL_BENCH_IDLE_SECONDS", 60)) * time.Second
	hosts := envInt(t, "SHOAL_BENCH_HOSTS", 3)
	workers, err := benchenv.Workers(64)
	require.NoError(t, err)
	profDir := os.Getenv("SHOAL_BENCH_PROFILE")
	if profDir != "" {
		require.NoError(t, os.MkdirAll(profDir, 0o755))
	}
	t.Logf("machine: %s", machine())

	bin := shoalBin.Path(t)
	dir := t.TempDir()
	ports := newPortAlloc(t)
	pk := harness.NewPKI(t)
	s := &scaleCluster{dir: dir, pki: pk, ops: pk.HTTPClient(t, "ops", pki.RoleOperator)}
	s.cats, s.addrs = startCatalogVoters(t, bin, dir, pk, ports, "")
	ctx := context.Background()
	cl, err := raftmeta.NewClient(s.addrs, raftmeta.WithCacheTTL(0), raftmeta.WithTLS(pk.Loader(t, "bench", pki.RoleEdge, pki.RoleOperator)))
	require.NoError(t, err)
	defer cl.Close()

	// Accounts, then the databases round-robin over them.
	limits := fsm.Limits{MaxDatabases: 1 << 40, MaxStorageBytes: 1 << 50, MaxDatabaseBytes: 1 << 30}
	acct := func(i int) string { return fmt.Sprintf("acct-%04d", i) }
	var fail atomic.Value
	harness.Concurrently(accounts, workers[0], func(i int) {
		if _, err := cl.CreateAccount(ctx, fsm.CreateAccount{ID: acct(i), Name: acct(i), Tier: fsm.TierPaid, Limits: limits}); err != nil {
			fail.CompareAndSwap(nil, err)
		}
	})
	require.Nil(t, fail.Load(), "creating accounts")

	uuids := make([]string, n)
	objects := make([]string, n)
	var done atomic.Int64
	stop := make(chan struct{})
	go func() { // progress, so a long fill shows its rate
		tk := time.NewTicker(30 * time.Second)
		defer tk.Stop()
		last, lastAt := int64(0), time.Now()
		for {
			select {
			case <-stop:
				return
			case now := <-tk.C:
				d := done.Load()
				t.Logf("fill: %d of %d (%.0f/s over the last %s; load %s)", d, n, float64(d-last)/now.Sub(lastAt).Seconds(), now.Sub(lastAt).Round(time.Second), loadAvg())
				last, lastAt = d, now
			}
		}
	}()
	cpu0, self0, t0 := s.cpu(t), selfCPU(), time.Now()
	harness.Concurrently(n, workers[0], func(i int) {
		if fail.Load() != nil {
			return
		}
		u, obj := ids.New(), ids.New()
		_, err := cl.CreateDatabase(ctx, fsm.CreateDatabase{UUID: u, AccountID: acct(i % accounts), Name: fmt.Sprintf("db-%07d", i),
			ObjectID: obj, HostID: fmt.Sprintf("h%d", i%hosts+1), Region: "weur", ReadReplication: fsm.ReadReplicationDisabled})
		if err != nil {
			fail.CompareAndSwap(nil, err)
			return
		}
		uuids[i], objects[i] = u, obj
		done.Add(1)
	})
	close(stop)
	require.Nil(t, fail.Load(), "filling the catalog")
	fillDur := time.Since(t0)
	t.Logf("fill: %d databases over %d accounts in %s: %.0f creates/s with %d clients; catalog CPU %.0f µs per create (3 nodes), load generator %.0f µs; load %s",
		n, accounts, fillDur.Round(time.Second), float64(n)/fillDur.Seconds(), workers[0],
		float64((s.cpu(t)-cpu0).Microseconds())/float64(n), float64((selfCPU()-self0).Microseconds())/float64(n), loadAvg())

	// Settle: a snapshot on every node, so the figures below do not
	// include one in flight, and the state is what a restart restores.
	for i, a := range s.addrs {
		resp, err := s.ops.Post("https://"+a+"/v1/cluster/snapshot", "application/json", nil)
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK { // e.g. nothing new since its own last one
			t.Logf("snapshot on %s: %d %s", s.cats[i].Name, resp.StatusCode, b)
		}
	}
	leader := s.leaderIndex(t, cl)
	s.report(t, "after the fill", n, leader)
	if profDir != "" {
		s.heapProfiles(t, profDir, "heap-filled")
	}

	// Idle: no traffic at all.
	cpu := s.cpuEach(t)
	time.Sleep(idle) // the idle phase whose CPU is measured
	idleTicks := s.cpuEach(t)
	for i := range idleTicks {
		idleTicks[i] -= cpu[i]
	}
	s.logCPU(t, fmt.Sprintf("idle, no traffic, %s", idle), cpu, idle, 0)

	// Heartbeats of every database at the default interval, per database
	// (as hosts without digests send them) and with bucket digests, in
	// alternating phases of idle each (SHOAL_BENCH_HB_MODES, _ROUNDS).
	modes := strings.Split(envStr("SHOAL_BENCH_HB_MODES", "perdb,digest"), ",")
	rounds := envInt(t, "SHOAL_BENCH_HB_ROUNDS", 1)
	hb := newScaleHeartbeats(t, s, uuids, objects, accounts, hosts)
	for r := range rounds {
		for _, mode := range modes {
			cpu, self0 = s.cpuEach(t), selfCPU()
			served0 := s.staleReadsEach(t)
			var wait func()
			if profDir != "" {
				wait = s.cpuProfiles(t, profDir, fmt.Sprintf("cpu-heartbeats-%s-%d", mode, r), idle)
			}
			st := hb.run(t, idle, mode)
			if wait != nil {
				wait()
			}
			s.logCPU(t, fmt.Sprintf("round %d, %s heartbeats of %d databases every %s (%d hosts, chunks of %d), %s", r+1, mode, n, scaleHBInterval, hosts, scaleHBChunk, idle), cpu, idle, st.dbs, leader)
			s.logShares(t, leader, served0, cpu, idleTicks)
			t.Logf("heartbeats (%s): %d calls, %d DB-heartbeats (%.0f/s), %d per-database lookups, %d buckets sent, %d differing, %d unknown, %d failed calls, %d late ticks (a tick's calls took over 1 s), call p50 %.1f ms p99 %.1f ms; hosts (load generator) %.3f core; load %s",
				mode, st.calls, st.dbs, float64(st.dbs)/idle.Seconds(), st.lookups, st.buckets, st.differ, st.unknown, st.failed, st.late, harness.Millis(st.lat.Pct(0.5)), harness.Millis(st.lat.Pct(0.99)),
				(selfCPU()-self0).Seconds()/idle.Seconds(), loadAvg())
		}
	}
	s.report(t, "after the heartbeats", n, leader)

	// Restarts: a follower, then the leader.
	follower := (leader + 1) % len(s.cats)
	s.restart(t, follower, "follower", n)
	leader = s.leaderIndex(t, cl)
	s.restart(t, leader, "leader", n)
	s.report(t, "after both restarts", n, -1)
}

// scaleCluster is the catalog of TestCatalogScaleBench.
type scaleCluster struct {
	dir   string
	pki   *harness.PKI
	ops   *http.Client // an operator's certificate
	cats  []*harness.Proc
	addrs []string
}

func envInt(t *testing.T, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(strings.ReplaceAll(v, "_", ""))
	require.NoError(t, err, name)
	require.Positive(t, n, name)
	return n
}

func (s *scaleCluster) cpu(t *testing.T) time.Duration {
	var total int64
	for _, c := range s.cpuEach(t) {
		total += c
	}
	return time.Duration(total) * 10 * time.Millisecond
}

func (s *scaleCluster) cpuEach(t *testing.T) []int64 {
	out := make([]int64, len(s.cats))
	for i, p := range s.cats {
		out[i] = cpuTicks(t, p.Cmd.Process.Pid)
	}
	return out
}

// logCPU reports each node's CPU since before (clock ticks), in cores, and
// per DB-heartbeat when dbs > 0.
func (s *scaleCluster) logCPU(t *testing.T, what string, before []int64, d time.Duration, dbs int64, leader ...int) {
	after := s.cpuEach(t)
	var parts []string
	var total float64
	for i := range after {
		c := float64(after[i]-before[i]) / 100 / d.Seconds()
		total += c
		parts = append(parts, fmt.Sprintf("%s %.3f", s.cats[i].Name, c))
	}
	per := ""
	if dbs > 0 {
		per = fmt.Sprintf("; %.2f µs of catalog CPU per DB-heartbeat", total*d.Seconds()*1e6/float64(dbs))
	}
	if len(leader) > 0 && leader[0] >= 0 && total > 0 {
		per += fmt.Sprintf("; leader %s carries %.0f%%", s.cats[leader[0]].Name, 100*float64(after[leader[0]]-before[leader[0]])/100/d.Seconds()/total)
	}
	t.Logf("CPU, %s: %.3f cores in total (%s)%s; load %s", what, total, strings.Join(parts, ", "), per, loadAvg())
}

// staleReadsEach is each node's count of stale reads answered (the
// heartbeat calls: nothing else reads during the heartbeat phases).
func (s *scaleCluster) staleReadsEach(t *testing.T) []float64 {
	out := make([]float64, len(s.cats))
	for i := range s.cats {
		out[i] = s.metrics(t, i)[`shoal_raftmeta_reads_total{consistency="stale",outcome="ok"}`]
	}
	return out
}

// logShares reports how the heartbeat load fell on the nodes: the calls
// each answered since served0, and each node's CPU above its own idle
// rate (idleTicks over an idle phase as long as this one) since cpu0 —
// issue 15's "the leader carries ≤ 1/N of it".
func (s *scaleCluster) logShares(t *testing.T, leader int, served0 []float64, cpu0, idleTicks []int64) {
	served, cpu := s.staleReadsEach(t), s.cpuEach(t)
	var calls, above float64
	parts := make([]string, len(s.cats))
	for i := range s.cats {
		c := served[i] - served0[i]
		a := float64(cpu[i] - cpu0[i] - idleTicks[i])
		calls += c
		above += max(a, 0)
		role := "follower"
		if i == leader {
			role = "leader"
		}
		parts[i] = fmt.Sprintf("%s (%s) %.0f calls, %+.0f ms CPU above idle", s.cats[i].Name, role, c, a*10)
	}
	share := func(v, total float64) string {
		if total <= 0 {
			return "-"
		}
		return fmt.Sprintf("%.0f%%", 100*v/total)
	}
	la := float64(cpu[leader] - cpu0[leader] - idleTicks[leader])
	t.Logf("heartbeat load by node: %s; the leader answered %s of the calls and took %s of the CPU above idle",
		strings.Join(parts, ", "), share(served[leader]-served0[leader], calls), share(max(la, 0), above))
}

// leaderIndex finds the leader through a write (the client learns it).
func (s *scaleCluster) leaderIndex(t *testing.T, cl *raftmeta.Client) int {
	_, err := cl.CreateAccount(context.Background(), fsm.CreateAccount{ID: "probe-" + ids.New(), Name: "probe", Tier: fsm.TierFree,
		Limits: fsm.Limits{MaxDatabases: 1, MaxStorageBytes: 1, MaxDatabaseBytes: 1}})
	require.NoError(t, err)
	for i, a := range s.addrs {
		if a == cl.Leader() {
			return i
		}
	}
	t.Fatalf("leader %q is not a catalog address", cl.Leader())
	return -1
}

// report logs every node's memory and disk use.
func (s *scaleCluster) report(t *testing.T, when string, n, leader int) {
	for i, p := range s.cats {
		role := "follower"
		switch {
		case leader < 0:
			role = "-"
		case i == leader:
			role = "leader"
		}
		st := procStatus(t, p.Cmd.Process.Pid)
		m := s.metrics(t, i)
		nodeDir := filepath.Join(s.dir, p.Name)
		t.Logf("memory %s, %s (%s): VmRSS %s (anon %s, file %s; %.0f bytes per database), VmHWM %s; Go heap in use %s, next GC %s, runtime total %s; disk: catalog %s, raft log %s, snapshots %s",
			when, p.Name, role, mib(st["VmRSS"]), mib(st["RssAnon"]), mib(st["RssFile"]), float64(st["VmRSS"])/float64(n), mib(st["VmHWM"]),
			mib(int64(m["go_memstats_heap_inuse_bytes"])), mib(int64(m["go_memstats_next_gc_bytes"])), mib(int64(m["go_memstats_sys_bytes"])),
			mib(dirSize(t, filepath.Join(nodeDir, "fsm"))), mib(dirSize(t, filepath.Join(nodeDir, "raft-wal"))+dirSize(t, filepath.Join(nodeDir, "raft.db"))),
			mib(dirSize(t, filepath.Join(nodeDir, "snapshots"))))
	}
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

// procStatus reads the kB fields of /proc/PID/status, in bytes.
func procStatus(t *testing.T, pid int) map[string]int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	require.NoError(t, err)
	out := map[string]int64{}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || !strings.HasSuffix(v, " kB") {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(v, " kB")), 10, 64)
		if err == nil {
			out[k] = n << 10
		}
	}
	return out
}

func dirSize(t *testing.T, path string) int64 {
	var total int64
	err := filepath.WalkDir(path, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if info, err := d.Info(); err == nil && !d.IsDir() {
			total += info.Size()
		}
		return nil
	})
	if err != nil && !os.IsNotExist(err) {
		t.Logf("size of %s: %v", path, err)
	}
	return total
}

// metrics scrapes node i's /metrics (name{labels} → value).
func (s *scaleCluster) metrics(t *testing.T, i int) map[string]float64 {
	resp, err := s.ops.Get("https://" + s.addrs[i] + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		j := strings.LastIndexByte(line, ' ')
		if j < 0 {
			continue
		}
		if v, err := strconv.ParseFloat(line[j+1:], 64); err == nil {
			out[line[:j]] = v
		}
	}
	require.NoError(t, sc.Err())
	return out
}

func (s *scaleCluster) fetch(t *testing.T, url, path string) {
	hc := *s.ops
	hc.Timeout = 5 * time.Minute // a CPU profile takes its whole duration
	resp, err := hc.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s: %s", url, b)
	require.NoError(t, os.WriteFile(path, b, 0o644))
}

func (s *scaleCluster) heapProfiles(t *testing.T, dir, name string) {
	for i, p := range s.cats {
		s.fetch(t, "https://"+s.addrs[i]+"/debug/pprof/heap", filepath.Join(dir, name+"-"+p.Name+".pb.gz"))
	}
}

func (s *scaleCluster) cpuProfiles(t *testing.T, dir, name string, d time.Duration) (wait func()) {
	var wg sync.WaitGroup
	for i, p := range s.cats {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.fetch(t, fmt.Sprintf("https://%s/debug/pprof/profile?seconds=%d", s.addrs[i], int(d.Seconds())), filepath.Join(dir, name+"-"+p.Name+".pb.gz"))
		}()
	}
	return wg.Wait
}

// restart kill -9s node i, starts the same command again and times, from
// the start, /readyz, a linearizable read and a write through that node.
func (s *scaleCluster) restart(t *testing.T, i int, role string, n int) {
	p := s.cats[i]
	p.Signal(syscall.SIGKILL)
	<-p.Exited
	start := time.Now()
	p.Start(t)
	one, err := raftmeta.NewClient([]string{s.addrs[i]}, raftmeta.WithCacheTTL(0), raftmeta.WithRetries(1, 10*time.Millisecond, 10*time.Millisecond),
		raftmeta.WithRequestTimeout(2*time.Second), raftmeta.WithTLS(s.pki.Loader(t, "bench", pki.RoleEdge, pki.RoleOperator)))
	require.NoError(t, err)
	defer one.Close()
	ctx := context.Background()
	until := func(what string, ok func() bool) time.Duration {
		deadline := start.Add(5 * time.Minute)
		for time.Now().Before(deadline) {
			if ok() {
				return time.Since(start)
			}
			time.Sleep(20 * time.Millisecond) // poll interval: until the condition holds
		}
		t.Fatalf("restarted %s %s: %s not reached in 5 minutes: %s", role, p.Name, what, harness.Tail(p.Log.String(), 2000))
		return 0
	}
	up := until("listening", func() bool {
		resp, err := s.ops.Get("https://" + s.addrs[i] + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return true
	})
	ready := until("ready", func() bool {
		resp, err := s.ops.Get("https://" + s.addrs[i] + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	read := until("a linearizable read", func() bool {
		_, err := one.Account(ctx, "acct-0000", raftmeta.LinearizableRead())
		return err == nil
	})
	write := until("a write", func() bool {
		_, err := one.CreateAccount(ctx, fsm.CreateAccount{ID: "restart-" + ids.New(), Name: "r", Tier: fsm.TierFree,
			Limits: fsm.Limits{MaxDatabases: 1, MaxStorageBytes: 1, MaxDatabaseBytes: 1}})
		return err == nil
	})
	t.Logf("restart of the %s %s at %d databases (kill -9, same command): HTTP up %.2f s, /readyz %.2f s, linearizable read %.2f s, write %.2f s after the process start; load %s",
		role, p.Name, n, up.Seconds(), ready.Seconds(), read.Seconds(), write.Seconds(), loadAvg())
}

// Heartbeat settings of `shoal objecthost serve` (objecthost.Config
// defaults): every database every 30 s, a 1 s tick, 5,000 UUIDs per call.
const (
	scaleHBInterval = 30 * time.Second
	scaleHBTick     = time.Second
	scaleHBChunk    = 5000
)

// scaleHeartbeats stands for the object hosts: each owns the databases
// placed on it and, every tick, sends the ones due in that tick, one call
// after another, as objecthost.Host.RunHeartbeats does, through the hosts'
// catalog adapter. Mode "perdb": the due UUIDs in chunks (hosts without
// digests). Mode "digest": one call with the digests of the buckets the due
// databases fall in (each host keeps them over all its databases, as
// objecthost/digests.go does) and their accounts, then per-database calls
// for the due databases of the buckets answered different.
type scaleHeartbeats struct {
	hosts    [][]int // per host: indexes of its databases; the ones due in tick k are those at position%ticks == k%ticks
	uuids    []string
	accounts []string // per database
	digests  [][fsm.DigestBuckets]fsm.BucketDigest
	cats     []objecthost.RaftmetaCatalog
}

type scaleHBStats struct {
	calls, dbs, lookups, buckets, differ, unknown, failed, late int64
	lat                                                         *harness.Latencies
}

func envStr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func newScaleHeartbeats(t *testing.T, s *scaleCluster, uuids, objects []string, accounts, hosts int) *scaleHeartbeats {
	h := &scaleHeartbeats{hosts: make([][]int, hosts), uuids: uuids, accounts: make([]string, len(uuids)),
		digests: make([][fsm.DigestBuckets]fsm.BucketDigest, hosts)}
	for i, u := range uuids {
		hi := i % hosts
		h.hosts[hi] = append(h.hosts[hi], i)
		h.accounts[i] = fmt.Sprintf("acct-%04d", i%accounts)
		b := fsm.DigestBucket(u)
		d := &h.digests[hi][b]
		d.Bucket = b
		d.Digest ^= fsm.DigestOf(u, objects[i], 1)
		d.Count++
	}
	for i := range hosts {
		cl, err := raftmeta.NewClient(s.addrs, raftmeta.WithTLS(s.pki.Loader(t, fmt.Sprintf("h%d", i+1), pki.RoleHost)))
		require.NoError(t, err)
		t.Cleanup(cl.Close)
		h.cats = append(h.cats, objecthost.RaftmetaCatalog{C: cl})
	}
	return h
}

func (h *scaleHeartbeats) run(t *testing.T, d time.Duration, mode string) scaleHBStats {
	st := scaleHBStats{lat: &harness.Latencies{}}
	ticks := int(scaleHBInterval / scaleHBTick)
	var wg sync.WaitGroup
	start := time.Now()
	for hi, own := range h.hosts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			perDB := func(due []string) {
				for c := 0; c < len(due); c += scaleHBChunk {
					chunk := due[c:min(c+scaleHBChunk, len(due))]
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					t0 := time.Now()
					ans, err := h.cats[hi].Heartbeat(ctx, chunk)
					cancel()
					st.lat.Add(time.Since(t0))
					atomic.AddInt64(&st.calls, 1)
					if err != nil {
						atomic.AddInt64(&st.failed, 1)
						continue
					}
					atomic.AddInt64(&st.lookups, int64(len(chunk)))
					for _, db := range ans.Databases {
						if !db.Known {
							atomic.AddInt64(&st.unknown, 1)
						}
					}
				}
			}
			for k := 0; ; k++ {
				at := start.Add(time.Duration(k) * scaleHBTick)
				if at.Sub(start) >= d {
					return
				}
				if w := time.Until(at); w > 0 {
					time.Sleep(w) // pacing: heartbeat ticks at their schedule
				} else if w < -scaleHBTick {
					atomic.AddInt64(&st.late, 1)
				}
				var due []int
				for j := k % ticks; j < len(own); j += ticks {
					due = append(due, own[j])
				}
				atomic.AddInt64(&st.dbs, int64(len(due)))
				if mode != "digest" {
					uu := make([]string, len(due))
					for j, i := range due {
						uu[j] = h.uuids[i]
					}
					perDB(uu)
					continue
				}
				q := fsm.DigestQuery{HostID: fmt.Sprintf("h%d", hi+1)}
				inQ, seen := map[int]bool{}, map[string]bool{}
				for _, i := range due {
					if b := fsm.DigestBucket(h.uuids[i]); !inQ[b] {
						inQ[b] = true
						q.Buckets = append(q.Buckets, h.digests[hi][b])
					}
					if a := h.accounts[i]; !seen[a] {
						seen[a] = true
						q.Accounts = append(q.Accounts, a)
					}
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				t0 := time.Now()
				ans, err := h.cats[hi].HeartbeatDigests(ctx, q)
				cancel()
				st.lat.Add(time.Since(t0))
				atomic.AddInt64(&st.calls, 1)
				if err != nil {
					atomic.AddInt64(&st.failed, 1)
					continue
				}
				atomic.AddInt64(&st.buckets, int64(len(q.Buckets)))
				atomic.AddInt64(&st.differ, int64(len(ans.Differ)))
				if len(ans.Differ) > 0 {
					diff := map[int]bool{}
					for _, b := range ans.Differ {
						diff[b] = true
					}
					var uu []string
					for _, i := range due {
						if diff[fsm.DigestBucket(h.uuids[i])] {
							uu = append(uu, h.uuids[i])
						}
					}
					perDB(uu)
				}
			}
		}()
	}
	wg.Wait()
	return st
}
