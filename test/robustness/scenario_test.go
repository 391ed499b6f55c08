package robustness

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/test/robustness/failpoint"
	"github.com/shoaldb/shoal/test/robustness/model"
	"github.com/shoaldb/shoal/test/robustness/report"
	"github.com/shoaldb/shoal/test/robustness/topology"
	"github.com/shoaldb/shoal/test/robustness/traffic"
	"github.com/shoaldb/shoal/test/robustness/validate"
)

// shoalBin is built once per test binary (the link takes seconds here).
var shoalBin topology.Binary

func TestMain(m *testing.M) {
	code := m.Run()
	shoalBin.Close()
	os.Exit(code)
}

// Object hosts heartbeat every heartbeat and treat a database unknown to the
// catalog as an orphan after grace (30 s and 2 min in production), so the
// destructive paths the faults could trigger run within the test.
const (
	heartbeat = time.Second
	grace     = 3 * time.Second
	// settleFor bounds the retries of a final read answered with a
	// transient error: longer than an election and a host restart.
	settleFor = 20 * time.Second
	// finalClient is the client ID of the final observations in the
	// history (the generators number theirs from 1).
	finalClient = 999
)

// schedule sizes a run: the short one `make test` runs, or the long one
// SHOAL_FAULT=long (`make fault`) runs.
type schedule struct {
	name        string
	rounds      int           // each: isolate the leader, kill -9 a host (alternating)
	warmup      time.Duration // traffic before the first fault
	partitioned time.Duration // how long the leader stays cut off
	hostDown    time.Duration // how long a killed host stays down
	between     time.Duration // traffic between faults
	extras      bool          // also SIGSTOP and throttle a follower each round
	load        traffic.Config
}

func scheduleOf(t *testing.T) schedule {
	if testing.Short() {
		t.Skip("multi-process fault test; skipped with -short")
	}
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("SHOAL_ROBUSTNESS_SEED"); s != "" {
		var err error
		seed, err = strconv.ParseUint(s, 10, 64)
		require.NoError(t, err, "SHOAL_ROBUSTNESS_SEED")
	}
	load := traffic.Config{Seed: seed, Creators: 2, DeleteEvery: 5, RowWriters: 2, Getters: 1, RegClients: 2, Pace: 50 * time.Millisecond}
	if os.Getenv("SHOAL_FAULT") == "long" {
		load.Creators, load.RowWriters, load.Getters = 4, 4, 2
		return schedule{name: "long", rounds: 4, warmup: 5 * time.Second, partitioned: 8 * time.Second,
			hostDown: 3 * time.Second, between: 5 * time.Second, extras: true, load: load}
	}
	return schedule{name: "short", rounds: 1, warmup: 3 * time.Second, partitioned: 4 * time.Second,
		hostDown: 2 * time.Second, between: 3 * time.Second, load: load}
}

// newCluster builds the network and starts the deployment, skipping (or,
// with SHOAL_REQUIRE_NETNS=1, failing) where namespaces are unavailable.
func newCluster(t *testing.T) *topology.Cluster {
	if err := topology.Available(); err != nil {
		if os.Getenv("SHOAL_REQUIRE_NETNS") == "1" {
			t.Fatalf("SHOAL_REQUIRE_NETNS=1 but network namespaces are unavailable: %v", err)
		}
		t.Skipf("robustness suite needs network namespaces (root, iproute2): %v; SHOAL_REQUIRE_NETNS=1 makes this a failure", err)
	}
	bin, err := shoalBin.Path()
	require.NoError(t, err)
	netw, err := topology.NewNet()
	require.NoError(t, err, "network namespaces")
	t.Cleanup(func() { assert.NoError(t, netw.Close(), "removing the namespaces") })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := topology.Start(ctx, netw, topology.Options{Bin: bin, Dir: t.TempDir(), Heartbeat: heartbeat, Grace: grace})
	t.Cleanup(func() { assert.NoError(t, c.Stop(), "stopping the cluster") }) // before netw.Close
	require.NoError(t, err, "starting the cluster")
	return c
}

// TestFaultLeaderIsolationAndHostKill: under traffic (creates, deletes,
// gets at both levels, row inserts, register writes and reads), each round
// cuts the catalog leader off the network for a few seconds and heals it,
// then kills an object host with -9 and restarts it. Afterwards every
// acknowledged create must be listed, found and queryable, every
// acknowledged row readable, and the register and existence histories
// linearizable.
func TestFaultLeaderIsolationAndHostKill(t *testing.T) {
	sched := scheduleOf(t)
	c := newCluster(t)
	ctx := context.Background()
	hist := traffic.NewHistory()
	catalog, err := c.CatalogClient()
	require.NoError(t, err)
	t.Cleanup(catalog.Close)
	cl, err := traffic.NewClient(ctx, c.EdgeURLs(), c.Admin, catalog, hist)
	require.NoError(t, err, "account and token")
	sched.load.Registers, err = traffic.SetupRegisters(ctx, cl, 4)
	require.NoError(t, err, "register databases")

	rep := &report.Report{Scenario: t.Name(), Seed: sched.load.Seed, Schedule: sched.name}
	t.Logf("seed %d (SHOAL_ROBUSTNESS_SEED reruns it), schedule %s, network %s.0/24", sched.load.Seed, sched.name, c.Net.Subnet())
	load := traffic.NewLoad(cl, sched.load)
	loadCtx, stopLoad := context.WithCancel(ctx)
	var loadDone sync.WaitGroup
	loadDone.Add(1)
	go func() { defer loadDone.Done(); load.Run(loadCtx) }()
	t.Cleanup(func() { stopLoad(); loadDone.Wait() })

	run := func(f failpoint.Failpoint) {
		inj := f.Run(ctx, hist.Now)
		rep.Injections = append(rep.Injections, inj)
		t.Logf("%s: %s → %s", f, inj.Start.Round(time.Millisecond), inj.Healed.Round(time.Millisecond))
		assert.NoError(t, inj.Err)
	}
	time.Sleep(sched.warmup)
	for round := 1; round <= sched.rounds; round++ {
		leader, err := c.Leader(ctx)
		require.NoError(t, err)
		run(failpoint.NewPartition(leader.Name, leader.Node(), sched.partitioned))
		after, err := c.Leader(ctx)
		require.NoError(t, err, "no leader after the partition healed")
		t.Logf("leader before the partition %s, after %s", leader.Name, after.Name)
		time.Sleep(sched.between)

		host := c.Hosts[(round-1)%len(c.Hosts)]
		run(failpoint.NewKillRestart(host.Name, host, sched.hostDown))
		require.NoError(t, c.WaitHealthy(ctx, host, 60*time.Second), "host after its restart")
		time.Sleep(sched.between)

		if sched.extras {
			leader, err := c.Leader(ctx)
			require.NoError(t, err)
			follower := c.Catalog[0]
			for _, m := range c.Catalog {
				if m != leader {
					follower = m
					break
				}
			}
			run(failpoint.NewStopCont(follower.Name, follower, sched.partitioned))
			time.Sleep(sched.between)
			run(failpoint.NewThrottle(follower.Name, follower.Node(), "256kbit", sched.partitioned))
			time.Sleep(sched.between)
		}
	}
	stopLoad()
	loadDone.Wait()
	// Past the creation grace and two heartbeats: any destructive verdict a
	// fault provoked has been acted on by now.
	time.Sleep(grace + 2*heartbeat)

	final := observe(t, cl, hist, load)
	ops := hist.Ops()
	rep.Ops = ops
	rep.Results = append(rep.Results,
		validate.AckedCreatesPresent(ops, final),
		validate.AckedDeletesGone(ops, final),
		validate.AckedRowsReadable(ops, final))
	regRes, regInfo := validate.Linearizable("register writes and reads through the edge", model.Register, validate.RegisterOperations(ops), time.Minute)
	exRes, exInfo := validate.Linearizable("database existence (create, delete, linearizable get)", model.Existence, validate.ExistenceOperations(ops), time.Minute)
	rep.Results = append(rep.Results, regRes, exRes)
	rep.Visuals = []report.Visualization{{Name: "register", Model: model.Register, Info: regInfo}, {Name: "existence", Model: model.Existence, Info: exInfo}}

	t.Log("\n" + rep.Summary())
	assertTrafficChecked(t, ops)
	if rep.Failed() {
		rep.Logs = map[string]string{}
		for _, m := range c.Members() {
			rep.Logs[m.Name] = report.Tail(m.Output(), 64<<10)
			t.Logf("--- %s output (tail):\n%s", m.Name, report.Tail(m.Output(), 3000))
		}
		dir := os.Getenv("SHOAL_ROBUSTNESS_REPORT_DIR")
		if dir == "" {
			dir = os.TempDir()
		}
		dir = filepath.Join(dir, fmt.Sprintf("shoal-robustness-%s-%d", sched.name, sched.load.Seed))
		files, err := rep.Write(dir)
		t.Logf("report written to %s: %v (err %v)", dir, files, err)
	}
	for _, res := range rep.Results {
		assert.True(t, res.OK(), "%s", res)
	}
}

// assertTrafficChecked fails a run whose traffic was too thin for its checks
// to mean anything (e.g. every create failed): a check of nothing passes.
func assertTrafficChecked(t *testing.T, ops []traffic.Op) {
	n := map[traffic.Kind]int{}
	for _, op := range ops {
		if op.Outcome == traffic.OK {
			n[op.Kind]++
		}
	}
	for _, k := range []traffic.Kind{traffic.Create, traffic.Delete, traffic.Insert, traffic.RegWrite, traffic.RegRead, traffic.LinGet, traffic.EdgeGet} {
		assert.Positive(t, n[k], "no %s was acknowledged: the checks would be vacuous", k)
	}
}

// observe reads the state the checkers judge, once every fault has healed:
// the account's list, each acknowledged database's edge GET, each live
// database's rows, and a final linearizable get and register read (recorded
// in the history, so the models check them too). Transient answers are
// retried for up to settleFor.
func observe(t *testing.T, cl *traffic.Client, hist *traffic.History, load *traffic.Load) validate.Final {
	ctx := context.Background()
	f := validate.Final{Rows: map[string]map[int64]bool{}, Errors: map[string]string{}, EdgeGet: map[string]traffic.Outcome{}}
	var err error
	deadline := time.Now().Add(settleFor)
	for f.Listed, err = cl.List(ctx, 0); err != nil && time.Now().Before(deadline); f.Listed, err = cl.List(ctx, 0) {
		time.Sleep(200 * time.Millisecond)
	}
	require.NoError(t, err, "final list")

	var acked, regs []string
	for _, op := range hist.Ops() {
		if op.Kind == traffic.Create && op.Outcome == traffic.OK {
			acked = append(acked, op.DB)
		}
	}
	regSeen := map[string]bool{}
	for _, op := range hist.Ops() {
		if (op.Kind == traffic.RegWrite || op.Kind == traffic.RegRead) && !regSeen[op.DB] {
			regSeen[op.DB] = true
			regs = append(regs, op.DB)
		}
	}
	settle := func(call func() traffic.Op) traffic.Op {
		deadline := time.Now().Add(settleFor)
		for {
			op := call()
			if op.Outcome != traffic.Unknown || time.Now().After(deadline) {
				return op
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	var mu sync.Mutex
	concurrently(len(acked), 8, func(i int) {
		db := acked[i]
		g := settle(func() traffic.Op { return cl.EdgeGet(ctx, finalClient, i%cl.Edges(), db) })
		settle(func() traffic.Op { return cl.LinGet(ctx, finalClient, db) })
		mu.Lock()
		f.EdgeGet[db] = g.Outcome
		mu.Unlock()
	})
	live := load.Live()
	concurrently(len(live), 8, func(i int) {
		db := live[i]
		var vals []int64
		var out traffic.Outcome
		var text string
		deadline := time.Now().Add(settleFor)
		for {
			vals, out, text = cl.Rows(ctx, i%cl.Edges(), db)
			if out != traffic.Unknown || time.Now().After(deadline) {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		mu.Lock()
		defer mu.Unlock()
		if out != traffic.OK {
			f.Errors[db] = text
			return
		}
		f.Rows[db] = map[int64]bool{}
		for _, v := range vals {
			f.Rows[db][v] = true
		}
	})
	for i, db := range regs {
		settle(func() traffic.Op { return cl.RegRead(ctx, finalClient, i%cl.Edges(), db) })
	}
	return f
}

// concurrently calls fn(0) … fn(n-1) from `workers` goroutines.
func concurrently(n, workers int, fn func(i int)) {
	var wg sync.WaitGroup
	next := make(chan int)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				fn(i)
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
}
