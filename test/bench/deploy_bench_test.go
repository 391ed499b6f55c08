package bench

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shoaldb/shoal/internal/benchenv"
	"github.com/shoaldb/shoal/internal/ids"
	"github.com/shoaldb/shoal/internal/pki"
	"github.com/shoaldb/shoal/raftmeta"
	"github.com/shoaldb/shoal/raftmeta/fsm"
	"github.com/shoaldb/shoal/test/harness"
)

// deployOpenRate is SHOAL_BENCH_OPEN_RATE (0: closed loops).
var deployOpenRate float64

// TestDeployBench is issue 15's measurement: Shoal in the shape users deploy
// it — 3 catalog voters, 3 object hosts and 1 edge as separate `shoal`
// processes on loopback, mutual TLS between them, fsync on — against a
// 3-member etcd (Debian's etcd-server 3.4, mutual TLS, fsync on) started in
// the same run on the same cores. Rounds interleave the systems (the order
// flips every round) so drift in the shared machine's speed hits both alike,
// and every ratio is taken within one round. Paths, each at 16 and 64
// clients:
//
//   - raw catalog write: raftmeta.Client.CreateDatabase (one catalog row
//     through Raft; the client sends concurrent writes together through
//     POST /v1/apply-batch, raftmeta/coalesce.go) vs etcd put, and the
//     same through a client sending one POST /v1/apply per write
//     (raw-single; what main's client does, and what a baseline cluster's
//     raw@base client does)
//   - create database end to end through the edge (host init, catalog
//     write, route cache) vs etcd put
//   - point SELECT through the edge vs etcd serializable get
//   - point SELECT straight to the object host (its internal API, mutual
//     TLS, as the edge calls it) vs etcd serializable get
//   - point SELECT through a second edge that forwards to the hosts over
//     HTTP (--host-transport http) instead of its multiplexed frame
//     connections: the A/B of the edge→host transport, same rounds
//
// The load generator is this process, in Go, for both systems, each
// through its own production client, one client object shared by every
// worker: Shoal's paths through net/http (HTTP/1.1, keep-alive, one
// connection per request in flight, as the edge and raftmeta.Client
// reuse them) and etcd through its Go client (clientv3 3.5: gRPC over one
// multiplexed HTTP/2 connection per member, its fastest path). The JSON
// gateway would have put etcd behind the same transport as Shoal but adds
// an in-process gRPC hop to every etcd request, which would flatter Shoal.
//
// Knobs: SHOAL_BENCH_ROUNDS (default 8), SHOAL_BENCH_SECONDS (each phase,
// default 3), SHOAL_BENCH_WORKERS (default 16,64), SHOAL_BENCH_PORT_BASE
// (children listen on consecutive ports from there; default: free ports),
// SHOAL_BENCH_PROFILE (a directory: CPU profiles of the Shoal processes in
// the last round, through /debug/pprof), SHOAL_BENCH_PHASES (the Shoal paths
// to run, comma-separated among raw, create, edge-select,
// edge-select-http, host-select; default all; the etcd paths they compare
// with run too, and the heartbeat phases only with raw), SHOAL_BENCH_BASELINE_BIN (a second shoal binary,
// e.g. built from main: a second cluster of it runs beside the first and
// its paths, named "PATH@base", are measured in the same rounds, so a change
// is compared with its baseline and with etcd in one run),
// SHOAL_BENCH_EDGE_ARGS and SHOAL_BENCH_BASELINE_EDGE_ARGS (extra
// space-separated flags for the edge of the first and of the baseline
// cluster, e.g. to compare settings of one build). The baseline's raw
// path uses this build's coalescing client with gathering off (main's
// client coalesces as well but did not gather); SHOAL_BENCH_BASELINE_SINGLE=1
// gives it one request per write. SHOAL_BENCH_RAW_GATHER (a duration; 0
// off) sets this build's raw client's gathering bound (raftmeta.WithWriteGather),
// SHOAL_BENCH_BASELINE_RAW_GATHER the baseline's (default 0);
// SHOAL_BENCH_RAW_GATHER_RULE and SHOAL_BENCH_BASELINE_RAW_GATHER_RULE
// (always or adaptive, raftmeta.WithWriteGatherAdaptive) their rules
// (defaults: the client's, adaptive; and always, main's rule before it);
// SHOAL_BENCH_RAW_INFLIGHT=N this build's raw client's send slots (default 1).
// SHOAL_BENCH_OPEN_RATE=R makes every measured phase an open loop of R
// operations a second (runOpen; the client counts bound what is in flight).
// Run with:
//
//	SHOAL_BENCH=1 go test ./test/bench -run TestDeployBench -v -count=1 -timeout 30m
func TestDeployBench(t *testing.T) {
	if os.Getenv("SHOAL_BENCH") == "" {
		t.Skip("set SHOAL_BENCH=1")
	}
	if harness.EtcdBin() == "" && os.Getenv("SHOAL_REQUIRE_ETCD") != "1" {
		t.Skip("etcd not installed (SHOAL_DEPS_BENCH=1 ./scripts/deps.sh installs Debian's etcd-server)")
	}
	dur, err := benchenv.Duration(3 * time.Second)
	require.NoError(t, err)
	levels, err := benchenv.Workers(16, 64)
	require.NoError(t, err)
	// SHOAL_BENCH_OPEN_RATE=R: every measured phase is an open loop of R
	// operations a second in all (runOpen), the client counts bounding the
	// requests in flight; the rates then say only whether a system kept
	// up, the latencies (from each arrival's scheduled time) are the figure.
	deployOpenRate = 0
	if s := os.Getenv("SHOAL_BENCH_OPEN_RATE"); s != "" {
		deployOpenRate, err = strconv.ParseFloat(s, 64)
		require.NoError(t, err, "SHOAL_BENCH_OPEN_RATE")
		require.Positive(t, deployOpenRate, "SHOAL_BENCH_OPEN_RATE")
	}
	rounds := 8
	if s := os.Getenv("SHOAL_BENCH_ROUNDS"); s != "" {
		rounds, err = strconv.Atoi(s)
		require.NoError(t, err, "SHOAL_BENCH_ROUNDS")
		require.Positive(t, rounds, "SHOAL_BENCH_ROUNDS")
	}
	// SHOAL_BENCH_PROFILE=DIR: CPU profiles of every Shoal process during
	// the last round's Shoal phases at the highest client count, through
	// their /debug/pprof (DIR/PATH-N-PROCESS.pb.gz; go tool pprof -top).
	profDir := os.Getenv("SHOAL_BENCH_PROFILE")
	if profDir != "" {
		require.NoError(t, os.MkdirAll(profDir, 0o755))
	}
	phases := map[string]bool{"raw": true, "create": true, "edge-select": true, "edge-select-http": true, "host-select": true}
	if s := os.Getenv("SHOAL_BENCH_PHASES"); s != "" {
		phases = map[string]bool{}
		for _, f := range strings.Split(s, ",") {
			f = strings.TrimSpace(f)
			switch f {
			case "raw", "create", "edge-select", "edge-select-http", "host-select":
				phases[f] = true
			default:
				t.Fatalf("SHOAL_BENCH_PHASES: unknown path %q (raw, create, edge-select, edge-select-http, host-select)", f)
			}
		}
	}
	ports := newPortAlloc(t)
	d := startDeployClusterSpec(t, ports, deploySpec{edgeArgs: strings.Fields(os.Getenv("SHOAL_BENCH_EDGE_ARGS"))})
	var base *deployCluster // SHOAL_BENCH_BASELINE_BIN's cluster, if any
	if bin := os.Getenv("SHOAL_BENCH_BASELINE_BIN"); bin != "" {
		abs, err := filepath.Abs(bin)
		require.NoError(t, err)
		base = startDeployClusterSpec(t, ports, deploySpec{bin: abs, prefix: "b", edgeArgs: strings.Fields(os.Getenv("SHOAL_BENCH_BASELINE_EDGE_ARGS"))})
	}
	etcd := harness.StartEtcd(t, d.pki, []string{ports.next(), ports.next(), ports.next()}, []string{ports.next(), ports.next(), ports.next()})
	ctx := context.Background()

	// etcd's client: one for every worker (it multiplexes), TLS with a
	// certificate of the same CA.
	etl, err := pki.NewLoader(etcd.Client)
	require.NoError(t, err)
	ecl, err := clientv3.New(clientv3.Config{Endpoints: etcd.Endpoints, TLS: etl.ClientFor(), DialTimeout: 10 * time.Second})
	require.NoError(t, err)
	defer ecl.Close()

	w := d.prepare(t, ecl, true)
	var bw workload
	if base != nil {
		bw = base.prepare(t, ecl, false)
	}
	var seq atomic.Int64
	val := make([]byte, etcdValueBytes)
	_, _ = crand.Read(val)
	valStr := hex.EncodeToString(val)[:etcdValueBytes]
	// The raw writes' UUIDs, which the heartbeat phases ask about.
	var rawMu sync.Mutex
	var rawUUIDs []string
	ops := map[string]func(int, *rand.Rand) error{
		"raw": func(_ int, _ *rand.Rand) error {
			u := ids.New()
			_, err := d.raw.CreateDatabase(ctx, fsm.CreateDatabase{UUID: u, AccountID: rawAccount,
				Name: fmt.Sprintf("raw-%d", seq.Add(1)), ObjectID: ids.New(), HostID: "raw", Region: "weur",
				ReadReplication: fsm.ReadReplicationDisabled})
			if err == nil {
				rawMu.Lock()
				if len(rawUUIDs) < 200_000 {
					rawUUIDs = append(rawUUIDs, u)
				}
				rawMu.Unlock()
			}
			return err
		},
		"raw-single": func(_ int, _ *rand.Rand) error {
			_, err := d.rawSingle.CreateDatabase(ctx, fsm.CreateDatabase{UUID: ids.New(), AccountID: rawAccount,
				Name: fmt.Sprintf("raw-%d", seq.Add(1)), ObjectID: ids.New(), HostID: "raw", Region: "weur",
				ReadReplication: fsm.ReadReplicationDisabled})
			return err
		},
		"create": func(_ int, _ *rand.Rand) error {
			return d.post(harness.Client(), d.edgeDB, map[string]string{"Authorization": w.bearer},
				[]byte(fmt.Sprintf(`{"name":"c-%d"}`, seq.Add(1))))
		},
		"edge-select": func(_ int, rng *rand.Rand) error {
			db := w.dbs[rng.IntN(len(w.dbs))]
			return d.post(harness.Client(), d.edgeDB+"/"+db.UUID+"/query", map[string]string{"Authorization": w.bearer}, pointSelect(rng))
		},
		"edge-select-http": func(_ int, rng *rand.Rand) error {
			db := w.dbs[rng.IntN(len(w.dbs))]
			return d.post(harness.Client(), d.edgeHTTPDB+"/"+db.UUID+"/query", map[string]string{"Authorization": w.bearer}, pointSelect(rng))
		},
		"host-select": func(_ int, rng *rand.Rand) error {
			db := w.dbs[rng.IntN(len(w.dbs))]
			return d.post(d.hostHC, "https://"+db.HostAddress+"/v1/objects/"+db.ObjectID+"/query",
				map[string]string{"X-Shoal-Database": db.UUID, "X-Shoal-Account": w.acct}, pointSelect(rng))
		},
		"etcd-put": func(_ int, _ *rand.Rand) error {
			_, err := ecl.Put(ctx, fmt.Sprintf("db/%d", seq.Add(1)), valStr)
			return err
		},
		"etcd-get": func(_ int, rng *rand.Rand) error {
			r, err := ecl.Get(ctx, etcdKey(rng.IntN(etcdKeys)), clientv3.WithSerializable())
			if err == nil && len(r.Kvs) != 1 {
				err = fmt.Errorf("etcd get: %d keys", len(r.Kvs))
			}
			return err
		},
	}
	if base != nil {
		ops["raw@base"] = func(_ int, _ *rand.Rand) error {
			_, err := base.raw.CreateDatabase(ctx, fsm.CreateDatabase{UUID: ids.New(), AccountID: rawAccount,
				Name: fmt.Sprintf("raw-%d", seq.Add(1)), ObjectID: ids.New(), HostID: "raw", Region: "weur",
				ReadReplication: fsm.ReadReplicationDisabled})
			return err
		}
		ops["raw-single@base"] = func(_ int, _ *rand.Rand) error {
			_, err := base.rawSingle.CreateDatabase(ctx, fsm.CreateDatabase{UUID: ids.New(), AccountID: rawAccount,
				Name: fmt.Sprintf("raw-%d", seq.Add(1)), ObjectID: ids.New(), HostID: "raw", Region: "weur",
				ReadReplication: fsm.ReadReplicationDisabled})
			return err
		}
		ops["create@base"] = func(_ int, _ *rand.Rand) error {
			return base.post(harness.Client(), base.edgeDB, map[string]string{"Authorization": bw.bearer},
				[]byte(fmt.Sprintf(`{"name":"c-%d"}`, seq.Add(1))))
		}
		ops["edge-select@base"] = func(_ int, rng *rand.Rand) error {
			db := bw.dbs[rng.IntN(len(bw.dbs))]
			return base.post(harness.Client(), base.edgeDB+"/"+db.UUID+"/query", map[string]string{"Authorization": bw.bearer}, pointSelect(rng))
		}
		ops["host-select@base"] = func(_ int, rng *rand.Rand) error {
			db := bw.dbs[rng.IntN(len(bw.dbs))]
			return base.post(base.hostHC, "https://"+db.HostAddress+"/v1/objects/"+db.ObjectID+"/query",
				map[string]string{"X-Shoal-Database": db.UUID, "X-Shoal-Account": bw.acct}, pointSelect(rng))
		}
	}
	// Shoal's paths and the etcd path each is compared with.
	allPaths := []struct{ name, label, base string }{
		{"raw", "raw catalog write (Client.Apply) vs etcd put", "etcd-put"},
		{"raw-single", "raw catalog write, one /v1/apply per write, vs etcd put", "etcd-put"},
		{"create", "create database through the edge vs etcd put", "etcd-put"},
		{"edge-select", "point SELECT through the edge vs etcd serializable get", "etcd-get"},
		{"host-select", "point SELECT straight to the object host vs etcd serializable get", "etcd-get"},
		{"edge-select-http", "point SELECT through an edge forwarding over HTTP vs etcd get", "etcd-get"},
		{"edge-select", "point SELECT through the edge: frames vs HTTP edge→host", "edge-select-http"},
		{"edge-select", "point SELECT through the edge vs straight to the host", "host-select"},
	}
	var paths []struct{ name, label, base string }
	var order []string
	etcdUsed := map[string]bool{}
	for _, p := range allPaths {
		if !phases[p.name] && !(p.name == "raw-single" && phases["raw"]) {
			continue
		}
		if !strings.HasPrefix(p.base, "etcd") {
			// A comparison of two Shoal paths: both must run.
			if phases[p.base] {
				paths = append(paths, p)
			}
			continue
		}
		paths = append(paths, p)
		order = append(order, p.name)
		// The baseline cluster has no HTTP-forwarding edge (edgeH). It
		// does run raw-single, as this build's cluster does: otherwise
		// only this build's catalog grows by those writes, and an A/A run
		// (the same binary on both sides) measured "this build" 1.06× the
		// baseline's catalog CPU at 16 clients.
		if base != nil && p.name != "edge-select-http" {
			paths = append(paths, struct{ name, label, base string }{p.name + "@base", p.label + " [baseline binary]", p.base})
			order = append(order, p.name+"@base")
		}
		if !etcdUsed[p.base] {
			etcdUsed[p.base] = true
			order = append(order, p.base)
		}
	}

	if base != nil && phases["edge-select"] && phases["host-select"] {
		// Issue #15's edge ÷ host-direct for the baseline's build too, so
		// that both builds' ratios come from the same rounds.
		paths = append(paths, struct{ name, label, base string }{"edge-select@base", "point SELECT through the edge vs straight to the host [baseline binary]", "host-select@base"})
	}

	leaderStart := d.raw.Leader()
	// Each phase's CPU groups, taken when it starts: catL is the leader
	// the raw client last learned (it follows a change of leader from the
	// next write's answer on).
	groupsFor := func(name string) []procGroup {
		if strings.HasSuffix(name, "@base") {
			return base.groups(etcd)
		}
		return d.groups(etcd)
	}
	// Warm-up: connections, caches, the Go runtime's heaps; not counted.
	for _, name := range order {
		runClients(t, levels[len(levels)-1], 500*time.Millisecond, ops[name])
	}
	var hb *heartbeatBench
	if phases["raw"] {
		hb = newHeartbeatBench(t, d)
	}
	res := map[string]*phaseSeries{}
	key := func(name string, n int) string { return fmt.Sprintf("%s/%d", name, n) }
	// The edge's own account of each create step (its
	// shoal_edge_create_step_duration_seconds and _batch_size), summed over
	// the create phases of each path and client count.
	steps := map[string]map[string]float64{}
	clusterFor := func(name string) *deployCluster {
		if strings.HasSuffix(name, "@base") {
			return base
		}
		return d
	}
	// rawClientFor is the raftmeta client a raw phase writes through.
	rawClientFor := func(name string) *raftmeta.Client {
		if strings.HasPrefix(strings.TrimSuffix(name, "@base"), "raw-single") {
			return clusterFor(name).rawSingle
		}
		return clusterFor(name).raw
	}
	// The public listener's lean-path counters over each edge phase
	// (shoal_edge_lean_requests_total, _handovers_total): whether the
	// generator's mixed pool is served lean.
	leanDelta := map[string][2]float64{}
	start := time.Now()
	for r := range rounds {
		seqOrder := order
		if r%2 == 1 { // etcd first every other round
			seqOrder = reversed(order)
		}
		for _, n := range levels {
			for _, name := range seqOrder {
				s := res[key(name, n)]
				if s == nil {
					s = &phaseSeries{}
					res[key(name, n)] = s
				}
				stop := func() {}
				if profDir != "" && r == rounds-1 && n == levels[len(levels)-1] && !strings.HasPrefix(name, "etcd") {
					if strings.HasSuffix(name, "@base") {
						stop = base.profile(t, profDir, fmt.Sprintf("%s-%d", strings.TrimSuffix(name, "@base")+"-base", n), dur)
					} else {
						stop = d.profile(t, profDir, fmt.Sprintf("%s-%d", name, n), dur)
					}
				}
				var before map[string]float64
				if strings.HasPrefix(name, "create") {
					before = clusterFor(name).edgeCreateMetrics(t)
				}
				var fsmBefore [3]float64
				var snapsBefore float64
				var gBefore raftmeta.GatherStats
				if strings.HasPrefix(name, "raw") {
					fsmBefore = clusterFor(name).leaderBatches(t)
					snapsBefore = clusterFor(name).snapshotsPersisted(t)
					gBefore = rawClientFor(name).GatherStats()
				}
				edgePhase := strings.HasPrefix(name, "create") || (strings.HasPrefix(name, "edge-select") && !strings.HasPrefix(name, "edge-select-http"))
				var leanBefore [2]float64
				if edgePhase {
					leanBefore = clusterFor(name).leanCounters(t)
				}
				s.add(t, groupsFor(name), n, dur, ops[name])
				stop()
				if edgePhase {
					after := clusterFor(name).leanCounters(t)
					acc := leanDelta[key(name, n)]
					acc[0] += after[0] - leanBefore[0]
					acc[1] += after[1] - leanBefore[1]
					leanDelta[key(name, n)] = acc
				}
				if strings.HasPrefix(name, "raw") {
					after := clusterFor(name).leaderBatches(t)
					s.fsmEntries += after[0] - fsmBefore[0]
					s.fsmBatches += after[1] - fsmBefore[1]
					s.fsmCommands += after[2] - fsmBefore[2]
					s.snapshots += clusterFor(name).snapshotsPersisted(t) - snapsBefore
					g := rawClientFor(name).GatherStats()
					s.gathers.Eligible += g.Eligible - gBefore.Eligible
					s.gathers.Waited += g.Waited - gBefore.Waited
					s.gathers.Probes += g.Probes - gBefore.Probes
					s.gathers.Filled += g.Filled - gBefore.Filled
				}
				if before != nil {
					after := clusterFor(name).edgeCreateMetrics(t)
					acc := steps[key(name, n)]
					if acc == nil {
						acc = map[string]float64{}
						steps[key(name, n)] = acc
					}
					for k, v := range after {
						acc[k] += v - before[k]
					}
				}
			}
		}
		rawMu.Lock()
		known := rawUUIDs[:len(rawUUIDs):len(rawUUIDs)]
		rawMu.Unlock()
		if phases["raw"] {
			hb.round(t, r, dur, known)
		}
		t.Logf("round %d/%d done at %s, load average %s", r+1, rounds, time.Since(start).Round(time.Second), loadAvg())
	}

	t.Logf("separate processes on loopback, mutual TLS, fsync on; %d rounds of %s per phase, systems interleaved; %s", rounds, dur, machine())
	if deployOpenRate > 0 {
		t.Logf("open loop: %.0f operations/s per phase (Poisson arrivals, latency from each arrival's scheduled time; n = the most in flight)", deployOpenRate)
	}
	t.Logf("CPU per operation (µs) from /proc/PID/stat: catalog = 3 voters (catL the leader at each phase's start, catF its two followers; leader %s at the start, %s at the end), hosts = 3 object hosts, edge (frames to the hosts), edgeH = the edge forwarding over HTTP, etcd = 3 members, gen = this load generator", leaderStart, d.raw.Leader())
	t.Logf("%-66s %3s %8s %17s %8s %8s %17s | %6s %6s %6s %6s %6s %6s %6s %6s | %s", "path", "n", "ops/s", "(min–max)", "p50 ms", "p99 ms", "ratio (min–max)", cpuColumns[0], cpuColumns[1], cpuColumns[2], cpuColumns[3], cpuColumns[4], cpuColumns[5], cpuColumns[6], cpuColumns[7], "load 1m")
	for _, n := range levels {
		for _, p := range paths {
			s, b := res[key(p.name, n)], res[key(p.base, n)]
			t.Logf("%-66s %3d %s | %s", p.label, n, s.row(b), s.cpuRow())
		}
		for _, name := range []string{"etcd-put", "etcd-get"} {
			if !etcdUsed[name] {
				continue
			}
			t.Logf("%-66s %3d %s | %s", name, n, res[key(name, n)].row(nil), res[key(name, n)].cpuRow())
		}
	}
	// What the machine allows: each path's all-in CPU per op against its
	// etcd counterpart's (ceilingRow).
	for _, n := range levels {
		for _, p := range paths {
			if !strings.HasPrefix(p.base, "etcd-") {
				continue
			}
			if s, b := res[key(p.name, n)], res[key(p.base, n)]; s != nil && b != nil {
				t.Logf("%-66s %3d %s", p.name+" vs "+p.base, n, s.ceilingRow(b))
			}
		}
	}
	if phases["raw"] {
		hb.report(t)
		for _, n := range levels {
			for _, name := range []string{"raw", "raw-single", "raw@base", "raw-single@base"} {
				if s := res[key(name, n)]; s != nil && s.fsmBatches > 0 {
					cmds := s.fsmCommands
					if cmds == 0 { // a build before batch entries: one command per entry
						cmds = s.fsmEntries
					}
					t.Logf("%-12s %3d per FSM batch on the leader: %.1f entries (shoal_raftmeta_fsm_batch_entries), %.1f commands; %.0f snapshots persisted by the voters during the %d phases; client gathers: eligible %d, waited %d (probes %d), filled %d",
						name, n, s.fsmEntries/s.fsmBatches, cmds/s.fsmBatches, s.snapshots, len(s.rates),
						s.gathers.Eligible, s.gathers.Waited, s.gathers.Probes, s.gathers.Filled)
				}
			}
		}
	}
	for _, n := range levels {
		for _, name := range []string{"create", "create@base", "edge-select", "edge-select@base"} {
			if l, ok := leanDelta[key(name, n)]; ok {
				ops := res[key(name, n)].lat.Len()
				t.Logf("%-16s %3d edge's lean path over the phases: %.0f requests served lean for %d operations (%.0f%%), %.0f connections handed to net/http (the counter reads, sent with Connection: close, are one hand-over each phase)",
					name, n, l[0], ops, 100*l[0]/float64(max(ops, 1)), l[1])
			}
		}
	}
	for _, n := range levels {
		for _, name := range []string{"create", "create@base"} {
			if m := steps[key(name, n)]; m != nil {
				t.Logf("%-12s %3d edge's create steps, mean ms: %s", name, n, stepMeans(m))
			}
		}
	}
	if base != nil {
		// The change against its baseline, same rounds.
		for _, n := range levels {
			done := map[string]bool{} // a path compared with several bases is listed once per base in allPaths
			for _, p := range allPaths {
				if !phases[p.name] || done[p.name] {
					continue
				}
				done[p.name] = true
				s, b := res[key(p.name, n)], res[key(p.name+"@base", n)]
				t.Logf("%-66s %3d this build vs baseline: %s", p.name, n, s.row(b))
				t.Logf("%-66s %3d this build vs baseline, CPU per op: %s", p.name, n, s.cpuRatioRow(b))
				if p.name == "raw" && os.Getenv("SHOAL_BENCH_BASELINE_SINGLE") == "1" {
					// The nodes' change alone: both send one request per write.
					t.Logf("%-66s %3d this build vs baseline: %s", "raw-single (one /v1/apply per write)", n, res[key("raw-single", n)].row(b))
				}
			}
		}
	}
}

// heartbeatBench measures the catalog's cost of object hosts' heartbeats
// and how it falls on the leader: heartbeatCallers callers (standing for
// hosts) send batches of heartbeatBatch UUIDs of existing databases as
// stale reads through a raftmeta.Client configured as hosts' are (hedging
// on), once spread round-robin over every node (plain StaleRead, the
// earlier behaviour) and once followers first (PreferFollowers, what hosts
// send now), in the same round.
type heartbeatBench struct {
	d      *deployCluster
	cl     *raftmeta.Client
	ops    *http.Client // an operator's, for /metrics
	leader int          // index in d.cats
	res    map[bool]*hbSeries
}

type hbSeries struct {
	rates       []float64 // database-heartbeats per second
	total, lead []float64 // catalog CPU per database-heartbeat (µs): all three, the leader's
	served      []float64 // the leader's share of the heartbeat calls served
}

const (
	heartbeatCallers = 4
	heartbeatBatch   = 1000
)

func newHeartbeatBench(t *testing.T, d *deployCluster) *heartbeatBench {
	cl, err := raftmeta.NewClient(d.catAddr, raftmeta.WithTLS(d.pki.Loader(t, "bench", pki.RoleEdge, pki.RoleOperator)))
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	// A write teaches the client the leader, as a host's registration does.
	_, err = cl.CreateAccount(context.Background(), fsm.CreateAccount{ID: "hb-probe", Name: "hb-probe", Tier: fsm.TierPaid,
		Limits: fsm.Limits{MaxDatabases: 1, MaxStorageBytes: 1, MaxDatabaseBytes: 1}})
	require.NoError(t, err)
	h := &heartbeatBench{d: d, cl: cl, leader: -1, res: map[bool]*hbSeries{false: {}, true: {}},
		ops: d.pki.HTTPClient(t, "ops", pki.RoleOperator)}
	for i, a := range d.catAddr {
		if a == cl.Leader() {
			h.leader = i
		}
	}
	require.NotEqual(t, -1, h.leader, "leader %q is not a catalog address", cl.Leader())
	return h
}

// round runs both variants (order flipped every other round) over known.
func (h *heartbeatBench) round(t *testing.T, r int, dur time.Duration, known []string) {
	if len(known) < 2*heartbeatBatch {
		return
	}
	variants := []bool{false, true}
	if r%2 == 1 {
		variants = []bool{true, false}
	}
	for _, followersFirst := range variants {
		o := raftmeta.ReadOptions{Consistency: raftmeta.Stale, PreferFollowers: followersFirst}
		before := make([]int64, len(h.d.cats))
		servedBefore := make([]float64, len(h.d.cats))
		for i, p := range h.d.cats {
			before[i] = cpuTicks(t, p.Cmd.Process.Pid)
			servedBefore[i] = h.staleServed(t, i)
		}
		l, rate := runClients(t, heartbeatCallers, dur, func(_ int, rng *rand.Rand) error {
			i := rng.IntN(len(known) - heartbeatBatch)
			_, err := h.cl.Heartbeat(context.Background(), known[i:i+heartbeatBatch], o)
			return err
		})
		dbs := float64(l.Len() * heartbeatBatch)
		s := h.res[followersFirst]
		var total, servedAll, servedLeader float64
		for i, p := range h.d.cats {
			us := float64(cpuTicks(t, p.Cmd.Process.Pid)-before[i]) * 10_000 / dbs
			total += us
			n := h.staleServed(t, i) - servedBefore[i]
			servedAll += n
			if i == h.leader {
				s.lead = append(s.lead, us)
				servedLeader = n
			}
		}
		s.served = append(s.served, servedLeader/servedAll)
		s.total = append(s.total, total)
		s.rates = append(s.rates, rate*heartbeatBatch)
	}
}

func (h *heartbeatBench) report(t *testing.T) {
	for _, followersFirst := range []bool{false, true} {
		s := h.res[followersFirst]
		if len(s.rates) == 0 {
			t.Log("heartbeats: too few databases to measure")
			return
		}
		name := "round-robin over all 3 nodes (before)"
		if followersFirst {
			name = "followers first (PreferFollowers, now)"
		}
		shares := make([]float64, len(s.total))
		for i := range s.total {
			shares[i] = s.lead[i] / s.total[i]
		}
		rm, rl, rh := medMinMax(s.rates)
		tm, tl, th := medMinMax(s.total)
		lm, ll, lh := medMinMax(s.lead)
		sm, sl, sh := medMinMax(shares)
		qm, ql, qh := medMinMax(s.served)
		t.Logf("heartbeats, %d callers × %d UUIDs, %-40s %7.0f DB-heartbeats/s (%.0f–%.0f); leader served %.0f%% of the calls (%.0f–%.0f%%); catalog CPU %.1f µs per DB-heartbeat (%.1f–%.1f), leader %.1f (%.1f–%.1f), the leader's share of that CPU %.0f%% (%.0f–%.0f%%, its Raft and background work included)",
			heartbeatCallers, heartbeatBatch, name, rm, rl, rh, 100*qm, 100*ql, 100*qh, tm, tl, th, lm, ll, lh, 100*sm, 100*sl, 100*sh)
	}
}

const (
	rawAccount     = "bench-raw"
	benchDBs       = 24   // databases the SELECTs spread over
	benchRows      = 1000 // rows of each
	etcdKeys       = 10000
	etcdValueBytes = 256
)

func etcdKey(i int) string { return fmt.Sprintf("kv/%05d", i) }

func pointSelect(rng *rand.Rand) []byte {
	return []byte(`{"sql":"SELECT v FROM kv WHERE id = ?","params":[` + strconv.Itoa(1+rng.IntN(benchRows)) + `]}`)
}

func reversed(s []string) []string {
	out := make([]string, len(s))
	for i, v := range s {
		out[len(s)-1-i] = v
	}
	return out
}

// deployCluster is the Shoal side of the benchmark: processes as
// cluster.hcl runs them, each with its own certificate of one CA.
type deployCluster struct {
	pki     *harness.PKI
	cats    []*harness.Proc
	hosts   []*harness.Proc
	edge    *harness.Proc
	edgeH   *harness.Proc // the edge forwarding over HTTP (--host-transport http)
	catAddr []string
	edgeURL string
	// edgeHTTPDB is edgeDB on edgeH.
	edgeHTTPDB string
	edgeHURL   string
	debug      map[string]string // process name → address of its /debug/pprof
	edgeDB     string            // the account's /d1/database URL, set by prepare
	admin      string
	raw        *raftmeta.Client // the raw-write client (edge + operator certificate)
	rawSingle  *raftmeta.Client // the same without write coalescing
	hostHC     *http.Client     // to the hosts' internal API, with an edge's certificate
}

// deploySpec says how to start a deploy cluster: the binary (default this
// build), a prefix for its process names ("b" for the baseline's: bc1, bh1,
// be1) and extra flags for its object hosts and its edge.
type deploySpec struct {
	bin, prefix        string
	hostArgs, edgeArgs []string
}

func startDeployCluster(t *testing.T, ports *portAlloc) *deployCluster {
	return startDeployClusterSpec(t, ports, deploySpec{})
}

// startDeployClusterWith is startDeployCluster with hostArgs added to every
// object host's command line.
func startDeployClusterWith(t *testing.T, ports *portAlloc, hostArgs ...string) *deployCluster {
	return startDeployClusterSpec(t, ports, deploySpec{hostArgs: hostArgs})
}

func startDeployClusterSpec(t *testing.T, ports *portAlloc, s deploySpec) *deployCluster {
	bin, prefix, hostArgs, edgeArgs := s.bin, s.prefix, s.hostArgs, s.edgeArgs
	if bin == "" {
		bin = shoalBin.Path(t)
	}
	dir := t.TempDir()
	d := &deployCluster{pki: harness.NewPKI(t), admin: "bench-admin-token", debug: map[string]string{}}
	ops := d.pki.HTTPClient(t, "ops", pki.RoleOperator)
	d.cats, d.catAddr = startCatalogVoters(t, bin, dir, d.pki, ports, prefix)
	for i, addr := range d.catAddr {
		d.debug[d.cats[i].Name] = addr
	}
	catalog := strings.Join(d.catAddr, ",")
	for i := range 3 {
		id := fmt.Sprintf("%sh%d", prefix, i+1)
		addr := ports.next()
		p := harness.StartProc(t, bin, id, append([]string{"objecthost", "serve", "--id", id, "--dir", filepath.Join(dir, id),
			"--http-addr", addr, "--region", "weur", "--catalog", catalog, "--log-level", "warn"},
			append(d.pki.Args(t, id, pki.RoleHost), hostArgs...)...)...)
		harness.WaitHTTP200With(t, ops, "https://"+addr+"/healthz", 30*time.Second, "host %s never healthy: %s", id, p.Log)
		d.hosts = append(d.hosts, p)
		d.debug[id] = addr
	}
	edgeAddr := ports.next()
	d.edgeURL = "http://" + edgeAddr
	eid := prefix + "e1"
	d.debug[eid] = ports.next()
	d.edge = harness.StartProc(t, bin, eid, append([]string{"edge", "serve", "--http-addr", edgeAddr, "--debug-addr", d.debug[eid], "--dir", filepath.Join(dir, eid),
		"--region", "weur", "--catalog", catalog, "--admin-token", d.admin,
		"--account-rate", "1000000", "--database-rate", "1000000", "--log-level", "warn"}, append(edgeArgs, d.pki.Args(t, eid, pki.RoleEdge)...)...)...)
	harness.WaitHTTP200(t, d.edgeURL+"/healthz", 30*time.Second, "edge never healthy: %s", d.edge.Log)
	if prefix == "" {
		// The transport A/B: a second edge of this build forwarding over
		// HTTP (not in a baseline cluster, whose binary may predate the
		// flag).
		edgeHAddr := ports.next()
		d.edgeHURL = "http://" + edgeHAddr
		d.debug["e2"] = ports.next()
		d.edgeH = harness.StartProc(t, bin, "e2", append([]string{"edge", "serve", "--http-addr", edgeHAddr, "--debug-addr", d.debug["e2"], "--dir", filepath.Join(dir, "e2"),
			"--region", "weur", "--catalog", catalog, "--admin-token", d.admin, "--host-transport", "http",
			"--account-rate", "1000000", "--database-rate", "1000000", "--log-level", "warn"}, d.pki.Args(t, "e2", pki.RoleEdge)...)...)
		harness.WaitHTTP200(t, d.edgeHURL+"/healthz", 30*time.Second, "edge e2 never healthy: %s", d.edgeH.Log)
	}

	// The raw writes' clients: d.raw as this build's client is by default
	// (concurrent writes share requests and gather, raftmeta/coalesce.go;
	// SHOAL_BENCH_RAW_GATHER=DURATION sets its gathering bound, 0 off);
	// d.rawSingle one request per write. A baseline cluster's raw client
	// coalesces too (main's client has since e8f4b38) but does not gather
	// (as main's client before WithWriteGather), so "raw@base" is main's
	// client against main's nodes and "this build vs baseline" includes the
	// gather, which is client-side; SHOAL_BENCH_BASELINE_RAW_GATHER=DURATION
	// gives it a bound (to compare two bounds in the same rounds: the raw
	// write's nodes are the same code in both builds);
	// SHOAL_BENCH_BASELINE_SINGLE=1 gives it the single one (for a baseline
	// built before coalescing).
	rawOpts := []raftmeta.ClientOption{raftmeta.WithCacheTTL(0), raftmeta.WithTLS(d.pki.Loader(t, "bench", pki.RoleEdge, pki.RoleOperator))}
	single := append(rawOpts[:len(rawOpts):len(rawOpts)], raftmeta.WithWriteBatching(0, 0))
	var err error
	d.rawSingle, err = raftmeta.NewClient(d.catAddr, single...)
	require.NoError(t, err)
	t.Cleanup(d.rawSingle.Close)
	gatherEnv, gather := "SHOAL_BENCH_RAW_GATHER", ""
	if prefix != "" {
		gatherEnv, gather = "SHOAL_BENCH_BASELINE_RAW_GATHER", "0"
	}
	if v := os.Getenv(gatherEnv); v != "" {
		gather = v
	}
	if gather != "" {
		g, err := time.ParseDuration(gather)
		require.NoError(t, err, gatherEnv)
		rawOpts = append(rawOpts, raftmeta.WithWriteGather(g))
	}
	// The gather's rule (raftmeta.WithWriteGatherAdaptive): this build's
	// raw client takes the client's default (adaptive) unless
	// SHOAL_BENCH_RAW_GATHER_RULE says otherwise; the baseline's gathers
	// after every send of two or more (main's rule before the adaptive one)
	// unless SHOAL_BENCH_BASELINE_RAW_GATHER_RULE=adaptive.
	ruleEnv, rule := "SHOAL_BENCH_RAW_GATHER_RULE", ""
	if prefix != "" {
		ruleEnv, rule = "SHOAL_BENCH_BASELINE_RAW_GATHER_RULE", "always"
	}
	if v := os.Getenv(ruleEnv); v != "" {
		rule = v
	}
	switch rule {
	case "":
	case "always":
		rawOpts = append(rawOpts, raftmeta.WithWriteGatherAdaptive(false))
	case "adaptive":
		rawOpts = append(rawOpts, raftmeta.WithWriteGatherAdaptive(true))
	default:
		t.Fatalf("%s=%q: want always or adaptive", ruleEnv, rule)
	}
	// SHOAL_BENCH_RAW_INFLIGHT=N: this build's raw client sends up to N
	// batches at once (raftmeta.WithWriteBatching; the client's default 1).
	if v := os.Getenv("SHOAL_BENCH_RAW_INFLIGHT"); v != "" && prefix == "" {
		n, err := strconv.Atoi(v)
		require.NoError(t, err, "SHOAL_BENCH_RAW_INFLIGHT")
		rawOpts = append(rawOpts, raftmeta.WithWriteBatching(raftmeta.MaxApplyBatch, n))
	}
	if prefix == "" || os.Getenv("SHOAL_BENCH_BASELINE_SINGLE") != "1" {
		d.raw, err = raftmeta.NewClient(d.catAddr, rawOpts...)
		require.NoError(t, err)
		t.Cleanup(d.raw.Close)
	} else {
		d.raw = d.rawSingle
	}
	d.hostHC = &http.Client{Timeout: 30 * time.Second, Transport: d.pki.Loader(t, "bench", pki.RoleEdge, pki.RoleOperator).
		Transport(&http.Transport{MaxIdleConnsPerHost: 256}, pki.RoleHost)}
	require.Eventually(t, func() bool {
		hs, err := d.raw.Hosts(context.Background(), raftmeta.LinearizableRead())
		return err == nil && len(hs) == 3
	}, 30*time.Second, 50*time.Millisecond, "object hosts never registered")
	return d
}

// startCatalogVoters starts three `shoal raftmeta serve` voters
// PREFIXc1…PREFIXc3 as separate processes with mutual TLS (the first
// bootstraps, the others join it) in dir/PREFIXc1… and returns them once
// each is ready, with their HTTP addresses.
func startCatalogVoters(t *testing.T, bin, dir string, p *harness.PKI, ports *portAlloc, prefix string) ([]*harness.Proc, []string) {
	ops := p.HTTPClient(t, "ops", pki.RoleOperator)
	var procs []*harness.Proc
	var addrs []string
	for i := range 3 {
		id := fmt.Sprintf("%sc%d", prefix, i+1)
		addr := ports.next()
		args := []string{"raftmeta", "serve", "--id", id, "--dir", filepath.Join(dir, id), "--raft-addr", ports.next(),
			"--http-addr", addr, "--log-level", "warn"}
		if i == 0 {
			args = append(args, "--bootstrap")
		} else {
			args = append(args, "--join", addrs[0])
		}
		proc := harness.StartProc(t, bin, id, append(args, p.Args(t, id, pki.RoleCatalog)...)...)
		harness.WaitHTTP200With(t, ops, "https://"+addr+"/readyz", 30*time.Second, "catalog %s never ready: %s", id, proc.Log)
		procs = append(procs, proc)
		addrs = append(addrs, addr)
	}
	return procs, addrs
}

// workload is what the SELECTs read: benchDBs databases of one account
// (placed by the edge over the three hosts), benchRows rows each.
type workload struct {
	acct, bearer string
	dbs          []fsm.Database
}

// prepare creates the accounts, the SELECTs' databases and (withEtcd)
// etcd's keys.
func (d *deployCluster) prepare(t *testing.T, ecl *clientv3.Client, withEtcd bool) workload {
	ctx := context.Background()
	limits := fsm.Limits{MaxDatabases: 1 << 40, MaxStorageBytes: 1 << 50, MaxDatabaseBytes: 1 << 30}
	for _, id := range []string{rawAccount, "bench"} {
		_, err := d.raw.CreateAccount(ctx, fsm.CreateAccount{ID: id, Name: id, Tier: fsm.TierPaid, Limits: limits})
		require.NoError(t, err)
	}
	d.waitCatalogLevel(t) // after a write: the raw client knows the leader
	w := workload{acct: "bench"}
	a := harness.Call(t, http.MethodPost, d.edgeURL+"/admin/v1/accounts/bench/tokens", "Bearer "+d.admin, map[string]any{"name": "bench"})
	require.Equal(t, http.StatusOK, a.Status, "%s", a.Raw)
	var tok struct{ Token string }
	require.NoError(t, json.Unmarshal(a.Result, &tok))
	w.bearer = "Bearer " + tok.Token
	d.edgeDB = d.edgeURL + "/client/v4/accounts/bench/d1/database"
	d.edgeHTTPDB = d.edgeHURL + "/client/v4/accounts/bench/d1/database"
	fill := fmt.Sprintf(`{"batch":[{"sql":"CREATE TABLE kv (id INTEGER PRIMARY KEY, v TEXT)"},{"sql":"WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM n WHERE i < %d) INSERT INTO kv SELECT i, 'value-' || i FROM n"}]}`, benchRows)
	for i := range benchDBs {
		a := harness.Call(t, http.MethodPost, d.edgeDB, w.bearer, map[string]any{"name": fmt.Sprintf("sel-%02d", i)})
		require.Equal(t, http.StatusOK, a.Status, "%s", a.Raw)
		var db struct{ UUID string }
		require.NoError(t, json.Unmarshal(a.Result, &db))
		require.NoError(t, d.post(harness.Client(), d.edgeDB+"/"+db.UUID+"/query", map[string]string{"Authorization": w.bearer}, []byte(fill)))
		row, err := d.raw.Database(ctx, db.UUID, raftmeta.LinearizableRead())
		require.NoError(t, err)
		w.dbs = append(w.dbs, row)
	}
	// The second edge learns the token and the routes one query at a time
	// (64 clients at once on a cold edge would be refused as a token-check
	// flood).
	for _, db := range w.dbs {
		if d.edgeH == nil {
			break
		}
		require.Eventually(t, func() bool {
			return d.post(harness.Client(), d.edgeHTTPDB+"/"+db.UUID+"/query", map[string]string{"Authorization": w.bearer}, []byte(`{"sql":"SELECT 1"}`)) == nil
		}, 30*time.Second, 100*time.Millisecond, "edge e2 never served %s", db.UUID)
	}
	perHost := map[string]int{}
	for _, db := range w.dbs {
		perHost[db.HostID]++
	}
	t.Logf("SELECT databases per host: %v", perHost)
	if !withEtcd {
		return w
	}
	val := strings.Repeat("v", etcdValueBytes)
	var putErr atomic.Value
	harness.Concurrently(etcdKeys, 64, func(i int) {
		if _, err := ecl.Put(ctx, etcdKey(i), val); err != nil {
			putErr.CompareAndSwap(nil, err)
		}
	})
	require.Nil(t, putErr.Load(), "loading etcd's keys")
	return w
}

// profile starts a CPU profile of every Shoal process for dur, written to
// dir/name-PROCESS.pb.gz, and returns the function that waits for them.
func (d *deployCluster) profile(t *testing.T, dir, name string, dur time.Duration) (wait func()) {
	ops := d.pki.HTTPClient(t, "ops", pki.RoleOperator)
	ops.Timeout = dur + 30*time.Second
	var wg sync.WaitGroup
	errs := make(chan error, len(d.debug))
	for proc, addr := range d.debug {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := ops.Get(fmt.Sprintf("https://%s/debug/pprof/profile?seconds=%d", addr, max(1, int(dur.Seconds()))))
			if err != nil {
				errs <- err
				return
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			if err == nil && resp.StatusCode != http.StatusOK {
				err = fmt.Errorf("%s profile: %d %s", proc, resp.StatusCode, b)
			}
			if err == nil {
				err = os.WriteFile(filepath.Join(dir, name+"-"+proc+".pb.gz"), b, 0o644)
			}
			if err != nil {
				errs <- err
			}
		}()
	}
	return func() {
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Errorf("profile: %v", err)
		}
	}
}

// post sends body and wants a 200, the body read to the end so the
// connection is reused.
func (d *deployCluster) post(hc *http.Client, url string, hdr map[string]string, body []byte) error {
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("POST %s: %d %s", url, resp.StatusCode, harness.Tail(string(b), 300))
	}
	return nil
}

// edgeCreateMetrics reads the edge's create-step histograms' sums and
// counts (and the batch sizes', when the build has them) from its /metrics.
func (d *deployCluster) edgeCreateMetrics(t *testing.T) map[string]float64 {
	resp, err := harness.Client().Get(d.edgeURL + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	out := map[string]float64{}
	for _, line := range strings.Split(string(b), "\n") {
		for _, prefix := range []string{"shoal_edge_create_step_duration_seconds_sum", "shoal_edge_create_step_duration_seconds_count",
			"shoal_edge_create_batch_creates_sum", "shoal_edge_create_batch_creates_count",
			"shoal_edge_create_batch_send_seconds_sum", "shoal_edge_create_batch_send_seconds_count",
			"shoal_edge_create_batch_queued_seconds_sum", "shoal_edge_create_batch_queued_seconds_count",
			"shoal_edge_create_slot_hold_seconds_total",
			`shoal_edge_create_batch_creates_bucket{step="catalog_write",le="1"}`, `shoal_edge_create_batch_creates_bucket{step="init",le="1"}`} {
			if strings.HasPrefix(line, prefix+"{") || strings.HasPrefix(line, prefix+" ") {
				f := strings.Fields(line)
				v, err := strconv.ParseFloat(f[len(f)-1], 64)
				require.NoError(t, err)
				out[f[0]] = v
			}
		}
	}
	return out
}

// leanCounters reads the edge's lean-path counters (requests served lean,
// connections handed to net/http) from its /metrics, on a connection of
// its own (not the generator's pool, whose connections it would otherwise
// add to or hand over).
func (d *deployCluster) leanCounters(t *testing.T) [2]float64 {
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
	resp, err := c.Get(d.edgeURL + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var out [2]float64
	for _, line := range strings.Split(string(b), "\n") {
		for i, name := range []string{"shoal_edge_lean_requests_total ", "shoal_edge_lean_handovers_total "} {
			if v, ok := strings.CutPrefix(line, name); ok {
				out[i], err = strconv.ParseFloat(strings.TrimSpace(v), 64)
				require.NoError(t, err)
			}
		}
	}
	return out
}

// waitCatalogLevel waits until the leader's catalog level is its build's
// (the level loop raises it within a round, 10 s): a build whose write
// path changes with the level (batch entries from level 3) is measured as
// it runs once every node is upgraded.
func (d *deployCluster) waitCatalogLevel(t *testing.T) {
	ops := d.pki.HTTPClient(t, "ops", pki.RoleOperator)
	var last string
	require.Eventually(t, func() bool {
		resp, err := ops.Get("https://" + d.raw.Leader() + "/metrics")
		if err != nil {
			return false
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return false
		}
		var cluster, build string
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "shoal_raftmeta_cluster_level "); ok {
				cluster = v
			}
			if v, ok := strings.CutPrefix(line, "shoal_raftmeta_build_level "); ok {
				build = v
			}
		}
		last = fmt.Sprintf("cluster level %s, build level %s", cluster, build)
		return cluster != "" && cluster == build
	}, 60*time.Second, 250*time.Millisecond, "the catalog never reached its build's level: %s", last)
	t.Logf("catalog %s: %s", d.raw.Leader(), last)
}

// leaderBatches reads the sums and count of the catalog leader's FSM batch
// sizes from its /metrics: entries (shoal_raftmeta_fsm_batch_entries) and
// commands (shoal_raftmeta_fsm_batch_commands, where a batch entry counts
// its commands; absent from builds before batch entries, which apply one
// command per entry) per FSM transaction. The leader is the raw client's.
func (d *deployCluster) leaderBatches(t *testing.T) [3]float64 {
	ops := d.pki.HTTPClient(t, "ops", pki.RoleOperator)
	resp, err := ops.Get("https://" + d.raw.Leader() + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	v := metricValues(t, b, "shoal_raftmeta_fsm_batch_entries_sum", "shoal_raftmeta_fsm_batch_entries_count", "shoal_raftmeta_fsm_batch_commands_sum")
	return [3]float64{v[0], v[1], v[2]}
}

// snapshotsPersisted is how many snapshots the cluster's three voters have
// persisted (shoal_raftmeta_snapshot_duration_seconds_count{phase="persist"},
// summed; a snapshot costs each voter a copy of the catalog, so one landing
// in a phase weighs on that phase's catalog CPU).
func (d *deployCluster) snapshotsPersisted(t *testing.T) float64 {
	ops := d.pki.HTTPClient(t, "ops", pki.RoleOperator)
	const name = `shoal_raftmeta_snapshot_duration_seconds_count{phase="persist"} `
	var sum float64
	for _, addr := range d.catAddr {
		resp, err := ops.Get("https://" + addr + "/metrics")
		require.NoError(t, err)
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, name); ok {
				f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
				require.NoError(t, err)
				sum += f
			}
		}
	}
	return sum
}

// stepMeans formats mean time per create step and mean batch sizes.
func stepMeans(m map[string]float64) string {
	var b strings.Builder
	for _, st := range []string{"account", "placement", "init", "catalog_write", "after"} {
		sum := m[`shoal_edge_create_step_duration_seconds_sum{step="`+st+`"}`]
		n := m[`shoal_edge_create_step_duration_seconds_count{step="`+st+`"}`]
		if n > 0 {
			fmt.Fprintf(&b, "%s %.2f ", st, 1000*sum/n)
		}
	}
	for _, st := range []string{"init", "catalog_write", "confirm"} {
		sum := m[`shoal_edge_create_batch_creates_sum{step="`+st+`"}`]
		n := m[`shoal_edge_create_batch_creates_count{step="`+st+`"}`]
		if n > 0 {
			fmt.Fprintf(&b, "| batch %s %.1f ", st, sum/n)
		}
	}
	// Catalog batches of one create (sent alone: the slot was free).
	if n := m[`shoal_edge_create_batch_creates_count{step="catalog_write"}`]; n > 0 {
		fmt.Fprintf(&b, "| catalog batches of one %.0f%% ", 100*m[`shoal_edge_create_batch_creates_bucket{step="catalog_write",le="1"}`]/n)
	}
	if n := m[`shoal_edge_create_batch_creates_count{step="init"}`]; n > 0 {
		fmt.Fprintf(&b, "| init batches of one %.0f%% ", 100*m[`shoal_edge_create_batch_creates_bucket{step="init",le="1"}`]/n)
	}
	// Where a step's time goes (builds with the batch timings): each
	// create queued for its batch, the batch's round trip, and the time
	// the slot holders held their slot waiting (per batch).
	for _, st := range []string{"init", "catalog_write"} {
		nq := m[`shoal_edge_create_batch_queued_seconds_count{step="`+st+`"}`]
		ns := m[`shoal_edge_create_batch_send_seconds_count{step="`+st+`"}`]
		if nq == 0 || ns == 0 {
			continue
		}
		fmt.Fprintf(&b, "| %s queued %.2f send %.2f hold group %.2f gather %.2f ", st,
			1000*m[`shoal_edge_create_batch_queued_seconds_sum{step="`+st+`"}`]/nq,
			1000*m[`shoal_edge_create_batch_send_seconds_sum{step="`+st+`"}`]/ns,
			1000*m[`shoal_edge_create_slot_hold_seconds_total{reason="group",step="`+st+`"}`]/ns,
			1000*m[`shoal_edge_create_slot_hold_seconds_total{reason="gather",step="`+st+`"}`]/ns)
	}
	return b.String()
}

// cpuColumns names groups' columns, in groups' order.
var cpuColumns = []string{"cat", "catL", "catF", "hosts", "edge", "edgeH", "etcd", "gen"}

// procGroup is processes whose CPU is reported together.
type procGroup struct {
	name string
	pids []int
}

// groups are the CPU columns: catalog, hosts, edge, etcd, then the load
// generator (this process, pid 0 below).
func (d *deployCluster) groups(e *harness.EtcdCluster) []procGroup {
	pids := func(ps []*harness.Proc) []int {
		var out []int
		for _, p := range ps {
			out = append(out, p.Cmd.Process.Pid)
		}
		return out
	}
	// The catalog's leader and followers separately as well (catL, catF):
	// the leader carries the HTTP API and the proposals, the followers only
	// Raft. The leader is the one the raw-write client learned from its
	// writes (prepare's); leaderCheck says whether it stayed so.
	var leader, followers []int
	for i, p := range d.cats {
		if d.catAddr[i] == d.raw.Leader() {
			leader = append(leader, p.Cmd.Process.Pid)
		} else {
			followers = append(followers, p.Cmd.Process.Pid)
		}
	}
	pg := [][]int{pids(d.cats), leader, followers, pids(d.hosts), pids([]*harness.Proc{d.edge}), pids(procList(d.edgeH)), pids(e.Procs), {os.Getpid()}}
	out := make([]procGroup, len(pg))
	for i := range pg {
		out[i] = procGroup{cpuColumns[i], pg[i]}
	}
	return out
}

// procList is p as a list, empty for nil.
func procList(p *harness.Proc) []*harness.Proc {
	if p == nil {
		return nil
	}
	return []*harness.Proc{p}
}

// cpuTicks is the user+system CPU of pid in clock ticks (100 per second on
// Linux), from /proc/PID/stat.
func cpuTicks(t *testing.T, pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	require.NoError(t, err)
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return ut + st
}

// phaseSeries is one path at one client count over every round.
type phaseSeries struct {
	rates []float64
	lat   harness.Latencies // every round's, pooled
	cpu   [][]float64       // per round: µs per op per group
	load  []float64         // 1-minute load average at each round's start
	// raw writes: the leader's FSM entries and batches over every round
	fsmEntries, fsmBatches, fsmCommands float64
	// raw writes: snapshots the three voters persisted during the phases
	snapshots float64
	// raw writes: the raw client's gathering decisions over every round
	gathers raftmeta.GatherStats
}

func (s *phaseSeries) add(t *testing.T, groups []procGroup, n int, dur time.Duration, op func(int, *rand.Rand) error) {
	s.load = append(s.load, loadAvg1())
	before := make([]int64, len(groups))
	for i, g := range groups {
		for _, p := range g.pids {
			before[i] += cpuTicks(t, p)
		}
	}
	var l *harness.Latencies
	var rate float64
	if deployOpenRate > 0 {
		l, rate = runOpen(t, n, dur, deployOpenRate, op)
	} else {
		l, rate = runClients(t, n, dur, op)
	}
	cpu := make([]float64, len(groups))
	for i, g := range groups {
		var after int64
		for _, p := range g.pids {
			after += cpuTicks(t, p)
		}
		cpu[i] = float64(after-before[i]) * 10_000 / float64(l.Len()) // 10 ms a tick, in µs
	}
	s.rates = append(s.rates, rate)
	s.cpu = append(s.cpu, cpu)
	for _, d := range l.All() {
		s.lat.Add(d)
	}
}

// row is ops/s median (min–max), pooled p50/p99, and the median (min–max)
// of the same-round ratios to base (none when base is nil).
func (s *phaseSeries) row(base *phaseSeries) string {
	med, lo, hi := medMinMax(s.rates)
	out := fmt.Sprintf("%8.0f %17s %8.2f %8.2f", med, fmt.Sprintf("(%.0f–%.0f)", lo, hi), harness.Millis(s.lat.Pct(.5)), harness.Millis(s.lat.Pct(.99)))
	if base == nil {
		return out + fmt.Sprintf(" %17s", "")
	}
	ratios := make([]float64, len(s.rates))
	for i := range s.rates {
		ratios[i] = s.rates[i] / base.rates[i]
	}
	rm, rl, rh := medMinMax(ratios)
	return out + fmt.Sprintf(" %17s", fmt.Sprintf("%.2f× (%.2f–%.2f)", rm, rl, rh))
}

// cpuRow is the median over rounds of each group's CPU per op, and the
// median (min–max) load average.
func (s *phaseSeries) cpuRow() string {
	var b strings.Builder
	for g := range s.cpu[0] {
		col := make([]float64, len(s.cpu))
		for r := range s.cpu {
			col[r] = s.cpu[r][g]
		}
		m, _, _ := medMinMax(col)
		fmt.Fprintf(&b, "%6.0f ", m)
	}
	m, lo, hi := medMinMax(s.load)
	fmt.Fprintf(&b, "| %.2f (%.2f–%.2f)", m, lo, hi)
	return b.String()
}

// allIn is a round's CPU per op summed over every process on the machine:
// the groups without the leader/followers split of the catalog (cat
// holds both), the load generator included.
func (s *phaseSeries) allIn(r int) float64 {
	var sum float64
	for g, v := range s.cpu[r] {
		if name := cpuColumns[g]; name != "catL" && name != "catF" {
			sum += v
		}
	}
	return sum
}

// ceilingRow compares what one operation of each system costs the whole
// machine — every process of the system plus the load generator — round
// by round. On a machine whose cores both systems saturate, throughput is
// cores ÷ that cost, so peer's all-in cost ÷ this path's is the ratio the
// path can reach there however its latency is cut; "cores busy" is rate ×
// cost, how close each system came to the machine's limit.
func (s *phaseSeries) ceilingRow(peer *phaseSeries) string {
	var mine, theirs, ceil, busy, peerBusy []float64
	for r := range s.cpu {
		if r >= len(peer.cpu) || r >= len(s.rates) || r >= len(peer.rates) {
			break
		}
		a, b := s.allIn(r), peer.allIn(r)
		if a <= 0 || b <= 0 {
			continue
		}
		mine, theirs, ceil = append(mine, a), append(theirs, b), append(ceil, b/a)
		busy, peerBusy = append(busy, s.rates[r]*a/1e6), append(peerBusy, peer.rates[r]*b/1e6)
	}
	if len(ceil) == 0 {
		return "no CPU figures"
	}
	m, _, _ := medMinMax(mine)
	p, _, _ := medMinMax(theirs)
	c, lo, hi := medMinMax(ceil)
	sb, _, _ := medMinMax(busy)
	pb, _, _ := medMinMax(peerBusy)
	return fmt.Sprintf("all-in CPU per op %.0f µs vs %.0f µs: CPU-bound ceiling of the ratio %.2f× (%.2f–%.2f); cores busy %.2f vs %.2f of %d",
		m, p, c, lo, hi, sb, pb, runtime.NumCPU())
}

// cpuRatioRow is, per CPU column, the median (min–max) of the same-round
// ratios of CPU per op to base's: a build's CPU cut is judged round by
// round, as its throughput is, not from two medians taken apart. Columns
// where either side used no CPU (etcd, a transport the path does not use)
// are left out.
func (s *phaseSeries) cpuRatioRow(base *phaseSeries) string {
	names := cpuColumns
	if base == nil || len(base.cpu) == 0 || len(s.cpu) == 0 {
		return "no baseline"
	}
	var b strings.Builder
	for g := range s.cpu[0] {
		var ratios []float64
		for r := range s.cpu {
			if r >= len(base.cpu) || g >= len(base.cpu[r]) {
				break
			}
			if s.cpu[r][g] > 0 && base.cpu[r][g] > 0 {
				ratios = append(ratios, s.cpu[r][g]/base.cpu[r][g])
			}
		}
		if len(ratios) == 0 || g >= len(names) || names[g] == "etcd" || names[g] == "gen" {
			continue
		}
		m, lo, hi := medMinMax(ratios)
		fmt.Fprintf(&b, "%s %.2f× (%.2f–%.2f)  ", names[g], m, lo, hi)
	}
	return strings.TrimSpace(b.String())
}

func medMinMax(v []float64) (med, lo, hi float64) {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s) == 0 {
		return 0, 0, 0
	}
	med = s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return med, s[0], s[len(s)-1]
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	return strings.Join(f[:3], " ")
}

func loadAvg1() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	v, _ := strconv.ParseFloat(strings.Fields(string(b))[0], 64)
	return v
}

// machine describes where the figures come from.
func machine() string {
	var u syscall.Utsname
	_ = syscall.Uname(&u)
	rel := make([]byte, 0, len(u.Release))
	for _, c := range u.Release {
		if c == 0 {
			break
		}
		rel = append(rel, byte(c))
	}
	return fmt.Sprintf("%d CPUs, Linux %s, %s, load average at the end %s", runtime.NumCPU(), rel, time.Now().UTC().Format("2006-01-02 15:04 UTC"), loadAvg())
}

// portAlloc hands out loopback addresses for the children: consecutive
// ports from $SHOAL_BENCH_PORT_BASE (skipping taken ones), else free ports.
type portAlloc struct {
	t    *testing.T
	next func() string
}

func newPortAlloc(t *testing.T) *portAlloc {
	p := &portAlloc{t: t}
	base := os.Getenv("SHOAL_BENCH_PORT_BASE")
	if base == "" {
		p.next = func() string { return harness.FreeAddr(t) }
		return p
	}
	port, err := strconv.Atoi(base)
	require.NoError(t, err, "SHOAL_BENCH_PORT_BASE")
	p.next = func() string {
		for ; port < 65535; port++ {
			addr := fmt.Sprintf("127.0.0.1:%d", port)
			ln, err := net.Listen("tcp", addr)
			if err == nil {
				ln.Close()
				port++
				return addr
			}
		}
		t.Fatal("no free port above SHOAL_BENCH_PORT_BASE")
		return ""
	}
	return p
}

// staleServed is catalog node i's count of stale reads served
// (shoal_raftmeta_reads_total{consistency="stale",outcome="ok"}).
func (h *heartbeatBench) staleServed(t *testing.T, i int) float64 {
	resp, err := h.ops.Get("https://" + h.d.catAddr[i] + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	const name = `shoal_raftmeta_reads_total{consistency="stale",outcome="ok"} `
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, name) {
			v, err := strconv.ParseFloat(strings.TrimPrefix(line, name), 64)
			require.NoError(t, err)
			return v
		}
	}
	return 0
}
