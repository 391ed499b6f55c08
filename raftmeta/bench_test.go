package raftmeta

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/internal/benchenv"
	"github.com/shoaldb/shoal/internal/srvruntime"
	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// TestBenchRaftmeta measures the catalog on 3 in-process voters over
// loopback TCP with fsync. Run with:
//
//	SHOAL_BENCH=1 go test ./raftmeta -run TestBenchRaftmeta -v -count=1
//
// Baselines measured in the same run: the fsyncs/s of a raft-boltdb log
// store appending one entry at a time on this disk (what a Raft without
// group commit could reach), and, for reads, the stale follower read.
func TestBenchRaftmeta(t *testing.T) {
	if os.Getenv("SHOAL_BENCH") == "" {
		t.Skip("set SHOAL_BENCH=1")
	}
	dur, err := benchenv.Duration(5 * time.Second)
	require.NoError(t, err)
	// The three nodes run in this process: give it the runtime settings
	// `shoal raftmeta serve` runs with (GOGC/GOMAXPROCS in the environment win).
	defer srvruntime.Apply(true)()
	fsyncs := benchBoltFsyncs(t, 2*time.Second)
	t.Logf("baseline: raft-boltdb single-entry append+fsync: %.0f/s", fsyncs)

	tc := newTestCluster(t, 3, func(_ int, c *Config) {
		c.LogStore = os.Getenv("SHOAL_BENCH_LOG_STORE") // "wal" (the default) or "bolt"
		if s := os.Getenv("SHOAL_BENCH_COMMIT_TIMEOUT"); s != "" {
			d, err := time.ParseDuration(s)
			require.NoError(t, err)
			c.CommitTimeout = d
		}
	})
	leader := tc.waitLeader()
	ctx := context.Background()
	_, err = leader.Apply(ctx, cmd(t, fsm.CmdCreateAccount, newAccount("bench", 1<<40)))
	require.NoError(t, err)

	levels, err := benchenv.Workers(1, 16, 64)
	require.NoError(t, err)
	for _, workers := range levels {
		batchesBefore, entriesBefore := batchStats(t, leader)
		r := benchRun(workers, dur, func(i int) func(context.Context) error {
			cl, err := NewClient(tc.addrs(), WithCacheTTL(0))
			require.NoError(t, err)
			return func(ctx context.Context) error {
				_, err := cl.CreateDatabase(ctx, newDB("bench"))
				return err
			}
		})
		batches, entries := batchStats(t, leader)
		mean := 0.0
		if batches > batchesBefore {
			mean = (entries - entriesBefore) / (batches - batchesBefore)
		}
		t.Logf("create-database via client, %2d clients: %7.0f/s  p50 %6.2f ms  p99 %6.2f ms  errors %d  (%.1fx the single-fsync baseline; mean FSM batch %.1f entries; %.0f µs process CPU per create)",
			workers, r.rate, ms(r.p50), ms(r.p99), r.errors, r.rate/fsyncs, mean, float64(r.cpuPerOp)/1e3)
	}

	// Same commands proposed in-process on the leader (no HTTP, no client):
	// how much of the cost is the API hop.
	for _, workers := range levels {
		r := benchRun(workers, dur, func(int) func(context.Context) error {
			return func(ctx context.Context) error {
				_, err := leader.Apply(ctx, cmd(t, fsm.CmdCreateDatabase, newDB("bench")))
				return err
			}
		})
		t.Logf("create-database via Node.Apply on the leader, %2d goroutines: %7.0f/s  p50 %6.2f ms  p99 %6.2f ms  errors %d",
			workers, r.rate, ms(r.p50), ms(r.p99), r.errors)
	}
	if os.Getenv("SHOAL_BENCH_SKIP_READS") != "" {
		return
	}
	// Reads at 16 clients: stale on a follower vs linearizable on the leader.
	d := newDB("bench")
	res, err := leader.Apply(ctx, cmd(t, fsm.CmdCreateDatabase, d))
	require.NoError(t, err)
	f := tc.follower()
	require.Eventually(t, func() bool { return f.AppliedIndex() >= res.Index }, 10*time.Second, time.Millisecond)
	read := func(addr string, o ReadOptions) benchResult {
		return benchRun(16, dur, func(int) func(context.Context) error {
			cl, err := NewClient([]string{addr}, WithCacheTTL(0))
			require.NoError(t, err)
			return func(ctx context.Context) error {
				_, err := cl.Database(ctx, d.UUID, o)
				return err
			}
		})
	}
	stale := read(f.HTTPAddr(), StaleRead())
	lin := read(leader.HTTPAddr(), LinearizableRead())
	linF := read(f.HTTPAddr(), LinearizableRead())
	t.Logf("stale read on a follower, 16 clients:        %7.0f/s  p50 %6.2f ms  p99 %6.2f ms  errors %d", stale.rate, ms(stale.p50), ms(stale.p99), stale.errors)
	t.Logf("linearizable read on the leader, 16 clients: %7.0f/s  p50 %6.2f ms  p99 %6.2f ms  errors %d  (%.2fx stale)", lin.rate, ms(lin.p50), ms(lin.p99), lin.errors, lin.rate/stale.rate)
	t.Logf("linearizable read on a follower, 16 clients: %7.0f/s  p50 %6.2f ms  p99 %6.2f ms  errors %d  (%.2fx stale)", linF.rate, ms(linF.p50), ms(linF.p99), linF.errors, linF.rate/stale.rate)
	for _, r := range []benchResult{stale, lin, linF} {
		if r.firstErr != nil {
			t.Logf("first read error: %v", r.firstErr)
		}
	}
	cached := benchRun(16, dur, func(int) func(context.Context) error {
		cl, err := NewClient([]string{f.HTTPAddr()})
		require.NoError(t, err)
		return func(ctx context.Context) error {
			_, err := cl.Database(ctx, d.UUID, StaleRead())
			return err
		}
	})
	t.Logf("stale read through the client cache (2 s TTL), 16 clients: %7.0f/s (%.1fx uncached)", cached.rate, cached.rate/stale.rate)
}

type benchResult struct {
	rate     float64
	cpuPerOp time.Duration // process CPU (user+sys, all nodes and clients) per completed op
	p50, p99 time.Duration
	errors   int64
	firstErr error
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// benchRun runs workers goroutines calling op until dur elapses.
func benchRun(workers int, dur time.Duration, mk func(i int) func(context.Context) error) benchResult {
	ops := make([]func(context.Context) error, workers)
	for i := range ops {
		ops[i] = mk(i)
	}
	var (
		mu    sync.Mutex
		lats  []time.Duration
		errs  atomic.Int64
		wg    sync.WaitGroup
		first atomic.Pointer[error]
	)
	ctx := context.Background()
	cpu0 := processCPU()
	deadline := time.Now().Add(dur)
	start := time.Now()
	for i := 0; i < workers; i++ {
		wg.Add(1)
		go func(op func(context.Context) error) {
			defer wg.Done()
			var local []time.Duration
			for time.Now().Before(deadline) {
				t0 := time.Now()
				if err := op(ctx); err != nil {
					errs.Add(1)
					first.CompareAndSwap(nil, &err)
					continue
				}
				local = append(local, time.Since(t0))
			}
			mu.Lock()
			lats = append(lats, local...)
			mu.Unlock()
		}(ops[i])
	}
	wg.Wait()
	el := time.Since(start)
	cpu := processCPU() - cpu0
	sort.Slice(lats, func(i, j int) bool { return lats[i] < lats[j] })
	r := benchResult{rate: float64(len(lats)) / el.Seconds(), errors: errs.Load()}
	if p := first.Load(); p != nil {
		r.firstErr = *p
	}
	if len(lats) > 0 {
		r.cpuPerOp = cpu / time.Duration(len(lats))
		r.p50 = lats[len(lats)/2]
		r.p99 = lats[len(lats)*99/100]
	}
	return r
}

func batchStats(t *testing.T, n *Node) (batches, entries float64) {
	mfs, err := n.metrics.reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == "shoal_raftmeta_fsm_batch_entries" {
			h := mf.GetMetric()[0].GetHistogram()
			return float64(h.GetSampleCount()), h.GetSampleSum()
		}
	}
	return 0, 0
}

// benchBoltFsyncs appends single entries to a raft-boltdb store (fsync on)
// for d and returns appends per second.
func benchBoltFsyncs(t *testing.T, d time.Duration) float64 {
	s, err := raftboltdb.New(raftboltdb.Options{Path: filepath.Join(t.TempDir(), "raft.db")})
	require.NoError(t, err)
	defer s.Close()
	data := []byte(fmt.Sprintf("%0200d", 0))
	start := time.Now()
	i := uint64(0)
	for time.Since(start) < d {
		i++
		require.NoError(t, s.StoreLog(&raft.Log{Index: i, Term: 1, Type: raft.LogCommand, Data: data}))
	}
	return float64(i) / time.Since(start).Seconds()
}

// TestBenchRaftmetaStages measures the serial stages of the write pipeline
// alone, in batches of 20 (what 64 clients produce): the catalog FSM's
// ApplyBatch of create-database commands, and raft-boltdb StoreLogs with
// fsync. Each bounds the cluster's create rate. Run with:
//
//	SHOAL_BENCH=1 go test ./raftmeta -run TestBenchRaftmetaStages -v -count=1
func TestBenchRaftmetaStages(t *testing.T) {
	if os.Getenv("SHOAL_BENCH") == "" {
		t.Skip("set SHOAL_BENCH=1")
	}
	const batch = 20
	cat, err := fsm.New(t.TempDir())
	require.NoError(t, err)
	defer cat.Close()
	idx := uint64(0)
	mk := func(typ fsm.CommandType, body any) *raft.Log {
		idx++
		c := cmd(t, typ, body)
		b, err := json.Marshal(c)
		require.NoError(t, err)
		return &raft.Log{Index: idx, Term: 1, Type: raft.LogCommand, Data: b}
	}
	cat.ApplyBatch([]*raft.Log{mk(fsm.CmdCreateAccount, newAccount("bench", 1<<40))})
	var logs [][]*raft.Log
	for i := 0; i < 2500; i++ {
		var b []*raft.Log
		for j := 0; j < batch; j++ {
			b = append(b, mk(fsm.CmdCreateDatabase, newDB("bench")))
		}
		logs = append(logs, b)
	}
	start := time.Now()
	for _, b := range logs {
		for _, r := range cat.ApplyBatch(b) {
			require.Nil(t, r.(fsm.Result).Err)
		}
	}
	fsmRate := float64(2500*batch) / time.Since(start).Seconds()

	s, err := raftboltdb.New(raftboltdb.Options{Path: filepath.Join(t.TempDir(), "raft.db")})
	require.NoError(t, err)
	defer s.Close()
	start = time.Now()
	for _, b := range logs {
		require.NoError(t, s.StoreLogs(b))
	}
	boltRate := float64(2500*batch) / time.Since(start).Seconds()
	t.Logf("FSM ApplyBatch, create-database in batches of %d: %.0f entries/s (%.3f ms CPU+IO per entry)", batch, fsmRate, 1000/fsmRate)
	t.Logf("raft-boltdb StoreLogs with fsync, batches of %d: %.0f entries/s (%.0f fsynced batches/s)", batch, boltRate, boltRate/batch)
}

// processCPU is this process's user+system CPU time so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestBenchBatchEntry is the A/B of batch entries alone: 3 in-process
// voters over loopback TCP with fsync (raft-wal), the leader's
// Node.ApplyBatch called with batches of create_database commands (what a
// coalescing client's /v1/apply-batch hands it, without the HTTP hop), one
// batch in flight, as one batch entry (level 3) or as N entries
// (noBatchEntries), alternating every round (the order flips), so both
// share the machine's load. CPU is the whole process's (three replicas and
// the caller) per create. Run with:
//
//	SHOAL_BENCH=1 go test ./raftmeta -run TestBenchBatchEntry -v -count=1
//	# SHOAL_BENCH_ROUNDS (6), SHOAL_BENCH_SECONDS per phase (3), SHOAL_BENCH_WORKERS (batch sizes: 8,32)
func TestBenchBatchEntry(t *testing.T) {
	if os.Getenv("SHOAL_BENCH") == "" {
		t.Skip("set SHOAL_BENCH=1")
	}
	dur, err := benchenv.Duration(3 * time.Second)
	require.NoError(t, err)
	sizes, err := benchenv.Workers(8, 32)
	require.NoError(t, err)
	rounds := 6
	if s := os.Getenv("SHOAL_BENCH_ROUNDS"); s != "" {
		_, err := fmt.Sscan(s, &rounds)
		require.NoError(t, err)
	}
	defer srvruntime.Apply(true)()
	tc := newTestCluster(t, 3, func(i int, c *Config) { c.LevelCheckInterval = 200 * time.Millisecond })
	leader := tc.waitLeader()
	ctx := context.Background()
	_, err = leader.Apply(ctx, cmd(t, fsm.CmdCreateAccount, newAccount("bench", 1<<40)))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return leader.cat.ClusterLevel() >= fsm.LevelBatchEntry }, 20*time.Second, 50*time.Millisecond)
	type sample struct{ rate, cpu, p99 float64 }
	res := map[string][]sample{}
	for r := range rounds {
		for _, b := range sizes {
			modes := []bool{true, false}
			if r%2 == 1 {
				modes = []bool{false, true}
			}
			for _, batchEntries := range modes {
				leader.noBatchEntries.Store(!batchEntries)
				out := benchRun(1, dur, func(int) func(context.Context) error {
					return func(ctx context.Context) error {
						cmds := make([]fsm.Command, b)
						for i := range cmds {
							cmds[i] = cmd(t, fsm.CmdCreateDatabase, newDB("bench"))
						}
						_, errs := leader.ApplyBatch(ctx, cmds)
						for _, err := range errs {
							if err != nil {
								return err
							}
						}
						return nil
					}
				})
				require.Zero(t, out.errors, "%v", out.firstErr)
				k := fmt.Sprintf("batch=%d entries=%v", b, map[bool]string{true: "one", false: "N"}[batchEntries])
				res[k] = append(res[k], sample{rate: out.rate * float64(b), cpu: float64(out.cpuPerOp) / 1e3 / float64(b), p99: ms(out.p99)})
			}
		}
		var la [3]float64
		if l, err := os.ReadFile("/proc/loadavg"); err == nil {
			fmt.Sscan(string(l), &la[0], &la[1], &la[2])
		}
		t.Logf("round %d/%d done, load average %.2f", r+1, rounds, la[0])
	}
	med := func(xs []float64) float64 {
		s := append([]float64(nil), xs...)
		sort.Float64s(s)
		return s[len(s)/2]
	}
	for _, b := range sizes {
		one, n := res[fmt.Sprintf("batch=%d entries=one", b)], res[fmt.Sprintf("batch=%d entries=N", b)]
		var rates, cpus, cpuOne, cpuN, rOne, rN, p99One, p99N []float64
		for i := range one {
			rates = append(rates, one[i].rate/n[i].rate)
			cpus = append(cpus, one[i].cpu/n[i].cpu)
			cpuOne, cpuN = append(cpuOne, one[i].cpu), append(cpuN, n[i].cpu)
			rOne, rN = append(rOne, one[i].rate), append(rN, n[i].rate)
			p99One, p99N = append(p99One, one[i].p99), append(p99N, n[i].p99)
		}
		sort.Float64s(cpus)
		sort.Float64s(rates)
		t.Logf("batch of %2d: one entry %6.0f creates/s, %5.1f µs CPU/create, batch p99 %5.2f ms | N entries %6.0f/s, %5.1f µs, p99 %5.2f ms | same-round ratio one/N: CPU %.2f× (%.2f–%.2f), rate %.2f× (%.2f–%.2f)",
			b, med(rOne), med(cpuOne), med(p99One), med(rN), med(cpuN), med(p99N),
			med(cpus), cpus[0], cpus[len(cpus)-1], med(rates), rates[0], rates[len(rates)-1])
	}
}
