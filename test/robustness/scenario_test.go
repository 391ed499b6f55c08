package robustness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/objecthost/history"
	"github.com/shoaldb/shoal/raftmeta"
	"github.com/shoaldb/shoal/raftmeta/fsm"
	"github.com/shoaldb/shoal/test/harness"
	"github.com/shoaldb/shoal/test/robustness/failpoint"
	"github.com/shoaldb/shoal/test/robustness/model"
	"github.com/shoaldb/shoal/test/robustness/report"
	"github.com/shoaldb/shoal/test/robustness/topology"
	"github.com/shoaldb/shoal/test/robustness/traffic"
	"github.com/shoaldb/shoal/test/robustness/validate"
)

// shoalBin and s3Bin (the object store node, cmd/s3node) are built once per
// test binary (the link takes seconds here).
var (
	shoalBin topology.Binary
	s3Bin    = topology.Binary{Pkg: topology.S3NodePkg}
)

func TestMain(m *testing.M) {
	code := m.Run()
	shoalBin.Close()
	s3Bin.Close()
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
	// hostDisk is each object host's tmpfs: small enough for the
	// disk-full failpoint to fill at once.
	hostDisk = "256m"
	// edgeFailpoints are armed by the lost-create failpoint (SIGUSR1): a
	// third of creates lose their answer after the catalog write (the
	// checkpoint), and one init call in ten fails after the object was
	// made (leaving an orphan for the heartbeats to kill; more per pass
	// than the hosts' mass-orphan floor of 10 would be held, not killed).
	edgeFailpoints = "create:after-catalog-write=30%,create:after-init=10%"
	// archivedHost runs with durability = "archived": its writes are
	// acknowledged only once the object store has them.
	archivedHost = "h2"
	// bindingKey is the binding-token secret of the edges and the hosts.
	bindingKey = "robustness-binding-key-0123456789abcdef"
	// pipelineFailpoints are armed by the consumer-stopped failpoint
	// (SIGUSR1 to the pipeline node's process): the storage consumer and
	// the ClickHouse sink stop polling, the broker keeps serving.
	pipelineFailpoints = "consumers:stall=100%"
	// archiveAlarmLag is the hosts' archive alarm_lag: short, so an
	// object-store outage of a few seconds raises the lag alarm.
	archiveAlarmLag = 2 * time.Second
	// archiveSettle bounds the waits for the hosts' archive lag to recover
	// after an outage, and for their backlog to drain after the load.
	archiveSettle = 60 * time.Second
	// limitConverge is the bound within which a free account that
	// certainly went over its daily rows-written limit must be refused:
	// its last writes' usage leaves the host's 1 s aggregation window, the
	// ClickHouse sink flushes within its 1 s FlushInterval, the limiter's
	// next pass but one (every topology.LimiterInterval, 2 s: a pass
	// running while the rows land misses them) publishes the flag, and the
	// hosts' limits feed applies it — plus 4 s for ClickHouse's insert and
	// FINAL query, the limiter's catalog read and publish, and the feed, on
	// a loaded 2-core machine (measured on steady writes at load average
	// 20–30: 1.4–5.9 s from the write that took the account over to its
	// first refusal). 1 + 1 + 2×2 + 4 = 10 s.
	limitConverge = 10 * time.Second
	// limiterHandover is added after a kill -9 of the limiter or of the
	// pipeline node (the broker): the killed member leaves the limiter's
	// consumer group only at its session timeout (limiter.Config's
	// default, 10 s), and only then does the restarted one own partition 0
	// of accounts and act.
	limiterHandover = 10 * time.Second
)

// orphanBounds are the times within which an object that is not its
// database's live one must mark itself deleted
// (validate.OrphansConvergedInTime), from the hosts' configuration: the
// creation grace, then the next heartbeat (one interval plus the
// database's jitter, at most a tenth of the interval: objecthost
// heartbeat.go), plus processingSlack; after a fault, the hosts'
// heartbeat retry after a failed catalog call (objecthost's
// HeartbeatRetry default, 5 s) plus its jitter and the slack.
var orphanBounds = validate.OrphanBounds{
	Orphan:     grace + heartbeat + heartbeat/10 + processingSlack,
	Deleted:    heartbeat + heartbeat/10 + processingSlack,
	AfterFault: heartbeatRetry + heartbeatRetry/10 + processingSlack,
}

const (
	// heartbeatRetry is the object hosts' HeartbeatRetry (their default:
	// the topology does not set it).
	heartbeatRetry = 5 * time.Second
	// processingSlack is what a verdict may take once its heartbeat is
	// due, on a loaded 2-core machine: the beat's catalog call, the
	// linearizable confirmation and the fence of an orphan (a Raft write),
	// the index commit. Twice the most seen at load average 30 (orphans
	// 4.2 s p50, 5.1 s max against grace + heartbeat + jitter = 4.1 s).
	processingSlack = 2 * time.Second
)

// limitedLimits are the own daily rows-written limits of the free-tier
// accounts of the limiter's traffic (one writer each, at the load's
// pace): low enough that each crosses during a schedule, at different
// points of it; the last ones often cross in driveLimits, after the load.
var limitedLimits = []int64{40, 120, 300}

// schedule sizes a run: the short one `make test` runs, or the long one
// SHOAL_FAULT=long (`make fault`) runs.
type schedule struct {
	name   string
	long   bool
	fault  time.Duration // how long each fault lasts
	warmup time.Duration // traffic before the first fault
	gap    time.Duration // traffic between faults
	load   traffic.Config
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
	// Time travel on every register: a bookmark every ~2 s, a restore every
	// ~6 s (within the hosts' 10 per 10 minutes per database, 3 of them
	// left to the fault steps; the long schedule spreads its 7 over its run).
	load := traffic.Config{Seed: seed, Creators: 2, DeleteEvery: 5, RowWriters: 2, Getters: 1, RegClients: 2, Pace: 50 * time.Millisecond,
		TimeTravel: true, BookmarkEvery: 2 * time.Second, RestoreEvery: 6 * time.Second, Listers: 1, ListEvery: 500 * time.Millisecond,
		// The export, import and insights endpoints, at a modest rate:
		// an export and an insights request every ~2 s, an import into a
		// fresh database every ~4 s (its create, then its import).
		ExportEvery: 2 * time.Second, ImportEvery: 2 * time.Second, ImportRows: 20, InsightsEvery: 2 * time.Second}
	if os.Getenv("SHOAL_FAULT") == "long" {
		load.Creators, load.RowWriters, load.Getters = 4, 4, 2
		load.ListEvery = time.Second
		load.RestoreEvery = 80 * time.Second
		return schedule{name: "long", long: true, fault: 8 * time.Second, warmup: 5 * time.Second, gap: 5 * time.Second, load: load}
	}
	return schedule{name: "short", fault: 4 * time.Second, warmup: 3 * time.Second, gap: 2 * time.Second, load: load}
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
	s3, err := s3Bin.Path()
	require.NoError(t, err)
	netw, err := topology.NewNet()
	require.NoError(t, err, "network namespaces")
	t.Cleanup(func() { assert.NoError(t, netw.Close(), "removing the namespaces") })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := topology.Start(ctx, netw, topology.Options{Bin: bin, Dir: t.TempDir(), Heartbeat: heartbeat, Grace: grace,
		HostDisk: hostDisk, EdgeEnv: []string{"SHOAL_FAILPOINTS=" + edgeFailpoints}, Pipeline: true,
		PipelineEnv: []string{"SHOAL_FAILPOINTS=" + pipelineFailpoints}, Edges: 2, BindingKey: bindingKey,
		ArchivedHosts: []string{archivedHost}, Limiter: true, Archive: true, S3Bin: s3, ArchiveAlarmLag: archiveAlarmLag.String(),
		LimiterArgs:  []string{"--floor-rows-written-per-day", strconv.FormatInt(slices.Min(limitedLimits), 10)},
		EdgeInsights: true,
		TLS:          os.Getenv("SHOAL_ROBUSTNESS_TLS") == "1"})
	t.Cleanup(func() { assert.NoError(t, c.Stop(), "stopping the cluster") }) // before netw.Close
	require.NoError(t, err, "starting the cluster")
	return c
}

// env is one running scenario: the cluster, the recorded traffic, and the
// faults injected so far.
type env struct {
	t     *testing.T
	ctx   context.Context
	c     *topology.Cluster
	sched schedule
	hist  *traffic.History
	rep   *report.Report
	cl    *traffic.Client
	load  *traffic.Load
	r     *rand.Rand // the steps' own random choices, from the seed

	mu           sync.Mutex
	account      string
	integrity    []validate.Integrity   // files checked while their host was down
	cutOffs      []validate.Window      // when the catalog was cut off
	storeDowns   []validate.Window      // when the object store was down
	coldCutOffs  []validate.Window      // catalog cut off, with an edge restarted cold meanwhile
	storeNone    []validate.Window      // the object store surely could store nothing (not merely slow)
	storeOutages []validate.StoreOutage // what the hosts' archive status showed then
	outage       *validate.StoreOutage  // the outage in progress (sampled by its failpoint)
	limited      []limitedAccount       // the limiter's free-tier accounts
	// restore is the schedule's catalog rewind (catalogRestore), or nil.
	restore *validate.CatalogRestore
	// lost: the archive objects the store lost (objectStoreLoses).
	lost []topology.LostObject
	// archivedKills: what the archive held at each kill -9 of the
	// archived host (archivedAtKill).
	archivedKills []validate.ArchivedAtKill
}

// limitedAccount is one free-tier account of the limiter's traffic.
type limitedAccount struct {
	validate.LimitedAccount
	cl *traffic.Client
}

// scenario runs steps under the schedule's load on a fresh cluster, then
// lets the system settle and runs every check. Faults are injected with
// e.run; each step helper below builds one failpoint.
func scenario(t *testing.T, name string, sched schedule, steps func(e *env)) {
	c := newCluster(t)
	ctx := context.Background()
	e := &env{t: t, ctx: ctx, c: c, sched: sched, hist: traffic.NewHistory(),
		rep: &report.Report{Scenario: name, Seed: sched.load.Seed, Schedule: sched.name, Command: rerunCommand(name, sched)},
		r:   rand.New(rand.NewPCG(sched.load.Seed, 0x57e9))}
	catalog, err := c.CatalogClient()
	require.NoError(t, err)
	t.Cleanup(catalog.Close)
	cl, err := traffic.NewClient(ctx, c.EdgeURLs(), c.Admin, catalog, e.hist)
	require.NoError(t, err, "account and token")
	e.account = cl.Account()
	sched.load.Registers, err = traffic.SetupRegisters(ctx, cl, 4)
	require.NoError(t, err, "register databases")
	e.sched.load.Registers = sched.load.Registers
	for _, limit := range limitedLimits {
		fc, err := traffic.NewAccountClient(ctx, c.EdgeURLs(), c.Admin, catalog, e.hist, traffic.AccountSpec{Name: fmt.Sprintf("free-%d", limit), Tier: "free",
			Limits: &fsm.Limits{MaxDatabases: 10, MaxStorageBytes: 5 << 30, MaxDatabaseBytes: 500 << 20, RowsWrittenPerDay: limit}})
		require.NoError(t, err, "free-tier account")
		dbs, rows, unacked, err := traffic.SetupLimited(ctx, fc, 2)
		require.NoError(t, err, "free-tier account's databases")
		e.limited = append(e.limited, limitedAccount{LimitedAccount: validate.LimitedAccount{Account: fc.Account(), Limit: limit, DBs: dbs,
			SetupRows: rows, SetupUnacked: unacked}, cl: fc})
		sched.load.Limited = append(sched.load.Limited, traffic.LimitedAccount{Client: fc, DBs: dbs})
	}

	t.Logf("seed %d (SHOAL_ROBUSTNESS_SEED reruns it), schedule %s, network %s.0/24", sched.load.Seed, sched.name, c.Net.Subnet())
	load := traffic.NewLoad(cl, sched.load)
	e.cl, e.load = cl, load
	loadCtx, stopLoad := context.WithCancel(ctx)
	var loadDone sync.WaitGroup
	loadDone.Add(1)
	go func() { defer loadDone.Done(); load.Run(loadCtx) }()
	t.Cleanup(func() { stopLoad(); loadDone.Wait() })

	time.Sleep(sched.warmup) // warm-up: traffic before the first fault
	steps(e)
	stopLoad()
	loadDone.Wait()
	// Past the creation grace and two heartbeats: any destructive verdict a
	// fault provoked has been acted on by now. The limited accounts'
	// writers go on meanwhile (driveLimits), which touches nothing else.
	driven := make(chan struct{})
	go func() { defer close(driven); e.driveLimits() }()
	time.Sleep(grace + 2*heartbeat) // real heartbeats and grace in real processes: no clock to inject across processes
	<-driven

	final := observe(t, cl, e.hist, load)
	// A catalog restore: what the hosts show an operator (read before
	// the final kill), then the operator's second delete of the
	// databases it brought back (after observe's probes of them).
	var (
		restoreSets validate.RestoreSets
		excluded    map[string]bool // left to the restore's own checks
		alarms      []validate.HostAlarms
		redeleted   map[string]validate.Redelete
		cliActive   []string              // `shoal cluster resurrected` before the second delete
		cleared     []validate.HostAlarms // the hosts' resurrected alarms after it
	)
	if e.restore != nil {
		restoreSets = e.restore.Sets(e.hist.Ops())
		excluded = restoreSets.Excluded()
		t.Log(restoreSummary(e.restore, restoreSets))
		alarms = e.restoreAlarms()
		redeleted, cliActive = e.redeleteResurrected(restoreSets, final)
		cleared = e.resurrectedCleared()
	}
	billed, producers := e.usage()
	storage, sizes, accountTotal := e.storageTotals(catalog, cl.Account(), final.Measured)
	drained := e.archiveDrained()
	// Every host reads back its whole archive once (the store may have
	// lost objects: object-store-loses), before the final kill.
	scrubs := e.finalScrubs()
	damages, _ := validate.Damages(scrubs)
	// The brake's alarms are read last before the hosts' final kill: a
	// host that restarted during the schedule decides its orphans only at
	// their first beats after the restart, which can come after the
	// observation above (read earlier, a mass held then was missed and its
	// orphans reported as not converged: seed 1796218103641371768).
	held := e.heldOrphans()
	objects, rows, finalChecks := e.hostState(catalog, cl.Account())
	// The databases a restore rewound are held by its own checks; the
	// catalog's sizes of those it still lists (the backup's) stay in the
	// account total.
	var restored int64
	for db := range excluded {
		restored += sizes[db]
	}
	coverage := storageCoverage(objectsWithout(objects, excluded), sizes, cl.Account())
	byValue := sizesByValue(objectsWithout(objects, excluded), sizes, accountTotal-restored, final.Measured, cl.Account(), validate.UsedBytes)
	archiveStart := time.Now()
	archived := e.archiveChecks(objects, damages)
	damageReported := e.archiveDamageReported(objects, scrubs)
	t.Logf("archive of %d objects verified and restored in %s", len(archived), time.Since(archiveStart).Round(time.Millisecond))
	usage := validate.UsageExact(e.hist.Ops(), cl.Sent(), billed, producers, e.crashWindows(objects))
	ops := e.hist.Ops()
	rep := e.rep
	rep.Ops = ops
	// Without a restore, excluded is empty and these see everything.
	kept, keptObjs, keptRows, keptFinal := withoutDBs(ops, excluded), objectsWithout(objects, excluded), rowsWithout(rows, excluded), finalWithout(final, excluded)
	rep.Results = append(rep.Results,
		validate.AckedCreatesPresent(kept, keptFinal),
		validate.AckedDeletesGone(kept, keptFinal),
		validate.AckedRowsReadable(ops, final),
		validate.ListedQueryable(keptFinal),
		validate.OneLiveObject(objects),
		validate.OrphansConverged(keptObjs, keptRows, map[string]bool{cl.Account(): true}, held),
		validate.OrphansConvergedInTime(keptObjs, keptRows, map[string]bool{cl.Account(): true}, ackedDeletes(kept), e.hist.Start(), e.faultWindows(), orphanBounds),
		validate.IntegrityClean(append(e.integrityChecks(), finalChecks...)),
		usage)
	if e.restore != nil {
		rep.Results = append(rep.Results,
			validate.LostKept(ops, restoreSets, objects, rows, final.Listed, validate.FileValues),
			validate.LostServed(restoreSets, final.Rows, final.Errors),
			validate.LostAlarmed(restoreSets, objects, alarms),
			validate.ResurrectedStayDeleted(restoreSets, objects, final, redeleted),
			validate.ResurrectedAlarmed(ops, restoreSets, objects, final, alarms, cliActive),
			validate.ResurrectedAlarmCleared(cleared))
	}
	rep.Results = append(rep.Results, validate.ExportsComplete(ops), validate.ImportsAtomic(ops), validate.InsightsAnswered(ops))
	if len(e.cutOffs) > 0 {
		rep.Results = append(rep.Results, validate.QueriesAvailableDuring(ops, e.cutOffs),
			validate.DumpsAvailableDuring("the catalog is cut off", ops, e.cutOffs))
	}
	rep.Results = append(rep.Results, storage, coverage, byValue, drained, validate.ArchiveConsistent(archived), damageReported, validate.RestoresAnswered(ops, damages))
	rep.Results = append(rep.Results, e.limitChecks(ops, objects)...)
	if len(e.coldCutOffs) > 0 {
		var bound []traffic.Op
		for _, op := range ops {
			if op.Kind == traffic.BoundRead {
				bound = append(bound, op)
			}
		}
		res := validate.QueriesAvailable("the catalog is cut off, through an edge restarted cold (binding tokens)", bound, e.coldCutOffs)
		if res.Checked == 0 {
			res.Violations = append(res.Violations, "no binding-token query was sent through the cold edge")
		}
		rep.Results = append(rep.Results, res)
	}
	if len(e.archivedKills) > 0 {
		rep.Results = append(rep.Results, validate.ArchivedWritesKept(e.archivedKills))
	}
	if len(e.storeDowns) > 0 {
		// Queries on the archived host wait for the store by design: a
		// write is not acknowledged until the store has it, and until
		// then the database answers nothing (503), reads included — a
		// read would show a write the archive may never get. Its writes
		// are held to validate.ArchivedWritesHeld instead.
		onArchived := map[string]bool{}
		for _, o := range objects {
			if o.Host == archivedHost {
				onArchived[o.DatabaseUUID] = true
			}
		}
		var defaultOps []traffic.Op
		for _, op := range ops {
			if !onArchived[op.DB] {
				defaultOps = append(defaultOps, op)
			}
		}
		rep.Results = append(rep.Results, validate.QueriesAvailable("the object store is down or faulty (the archived host's databases aside)", defaultOps, e.storeDowns),
			validate.ArchivedWritesHeld(ops, onArchived, e.storeNone),
			validate.ArchiveLagAlarm(ops, e.storeOutages, liveHosts(objects)))
	}
	// Writes of unknown outcome stay open to the end of the history (but
	// for those bounded by their host's kill), and a long schedule leaves
	// many: give porcupine longer there (a check that does not finish is
	// still a failure), and guard its memory. The cluster is stopped
	// first: a guard's panic runs no cleanup.
	checkFor := time.Minute
	if sched.long {
		checkFor = 10 * time.Minute
	}
	assert.NoError(t, c.Stop(), "stopping the cluster before the porcupine checks")
	// The history is kept on disk while porcupine runs (a guard's panic
	// writes no report) and removed if the run passes.
	dir := reportDir(name, sched)
	if err := os.MkdirAll(dir, 0o755); err == nil {
		rep.Ops = ops
		if files, err := rep.Write(dir); err == nil {
			t.Logf("history saved to %s while the linearizability checks run: %v", dir, files)
		}
	}
	bounded, nBounded := validate.BoundByHostKills(ops, liveHosts(objects), e.hostKills())
	regOps := validate.RegisterOperations(bounded)
	regRes, regInfo := validate.LinearizableWithin("register writes and reads through the edge", model.Register, regOps, checkFor, maxCheckHeap())
	regRes.Note = fmt.Sprintf("%d writes and restores of unknown outcome bounded by their host's kill", nBounded)
	rep.Visuals = []report.Visualization{{Name: "register", Model: model.Register, Info: regInfo, Check: regRes.Check, Ops: regOps}}
	if e.restore == nil {
		exOps := validate.ExistenceOperations(ops)
		exRes, exInfo := validate.LinearizableWithin("database existence (create, delete, linearizable get and list)", model.Existence, exOps, checkFor, maxCheckHeap())
		rep.Results = append(rep.Results, regRes, exRes, validate.ListsOneInstant(ops, 0))
		rep.Visuals = append(rep.Visuals, report.Visualization{Name: "existence", Model: model.Existence, Info: exInfo, Check: exRes.Check, Ops: exOps})
	} else {
		// The operator rewound the catalog: its history is checked on
		// each side of the restore (validate.ExistenceOperationsSplit).
		before, after := validate.ExistenceOperationsSplit(ops, *e.restore)
		bRes, bInfo := validate.LinearizableWithin("database existence before the catalog restore", model.Existence, before, checkFor, maxCheckHeap())
		aRes, aInfo := validate.LinearizableWithin("database existence after the catalog restore (from the backup's state)", model.ExistenceResumed, after, checkFor, maxCheckHeap())
		rep.Results = append(rep.Results, regRes, bRes, aRes, validate.ListsOneInstant(ops, e.restore.RestoreCall))
		rep.Visuals = append(rep.Visuals, report.Visualization{Name: "existence-before-restore", Model: model.Existence, Info: bInfo, Check: bRes.Check, Ops: before},
			report.Visualization{Name: "existence-after-restore", Model: model.ExistenceResumed, Info: aInfo, Check: aRes.Check, Ops: after})
	}

	t.Log("\n" + rep.Summary())
	assertTrafficChecked(t, ops)
	if rep.Failed() || t.Failed() {
		rep.Logs = map[string]string{}
		for _, m := range c.Members() {
			rep.Logs[m.Name] = report.Tail(m.Output(), 64<<10)
			t.Logf("--- %s output (tail):\n%s", m.Name, report.Tail(m.Output(), 3000))
		}
		files, err := rep.Write(dir)
		t.Logf("report written to %s: %v (err %v)", dir, files, err)
	}
	if !rep.Failed() && !t.Failed() {
		_ = os.RemoveAll(dir)
	}
	recordResults(t, rep)
	for _, res := range rep.Results {
		assert.True(t, res.OK(), "%s", res)
	}
}

// run injects f, records it, and waits the schedule's gap of plain traffic.
func (e *env) run(f failpoint.Failpoint) {
	inj := f.Run(e.ctx, e.hist.Now)
	e.rep.Injections = append(e.rep.Injections, inj)
	e.t.Logf("%s: %s → %s", f, inj.Start.Round(time.Millisecond), inj.Healed.Round(time.Millisecond))
	assert.NoError(e.t, inj.Err)
	if f.Kind == failpoint.CatalogCutOff {
		e.mu.Lock()
		e.cutOffs = append(e.cutOffs, validate.Window{Name: f.String(), From: inj.Start, To: inj.Healed})
		e.mu.Unlock()
	}
	if f.Kind == failpoint.ObjectStoreDown || f.Kind == failpoint.ObjectStoreFaulty {
		e.storeRecovered(validate.Window{Name: f.String(), From: inj.Start, To: inj.Healed})
		if f.Param != failpoint.StoreSlow && !strings.HasPrefix(f.Param, failpoint.StoreSlow) {
			// Surely unable to store anything: from the injection's
			// return (an `ip link` takes tens of ms) to the heal's start.
			e.mu.Lock()
			e.storeNone = append(e.storeNone, validate.Window{Name: f.String(), From: inj.Effective, To: inj.HealStart})
			e.mu.Unlock()
		}
	}
	// Every member serves again (a restarted process has started, a
	// healed partition has a leader) before the next fault.
	for _, m := range e.c.Members() {
		if err := e.c.WaitHealthy(e.ctx, m, 60*time.Second); err != nil {
			// The error quotes only the end of the output: a crash's
			// reason is at the head of its goroutine dump, logged first.
			out := m.Output()
			e.t.Logf("--- %s crash reason:\n%s", m.Name, crashReason(out))
			e.t.Logf("--- %s output (tail):\n%s", m.Name, report.Tail(out, 64<<10))
			require.NoError(e.t, err, "%s after %s", m.Name, f)
		}
	}
	_, err := e.c.Leader(e.ctx)
	require.NoError(e.t, err, "no catalog leader after %s", f)
	time.Sleep(e.sched.gap) // the schedule's gap of plain traffic between faults
}

func (e *env) leader() *topology.Member {
	l, err := e.c.Leader(e.ctx)
	require.NoError(e.t, err)
	return l
}

func (e *env) followers() []*topology.Member {
	l := e.leader()
	var out []*topology.Member
	for _, m := range e.c.Catalog {
		if m != l {
			out = append(out, m)
		}
	}
	return out
}

func (e *env) isolateLeader() failpoint.Failpoint {
	l := e.leader()
	return failpoint.NewPartition(l.Name, l.Node(), e.sched.fault)
}

// killHost kills h with -9; while it is down, every live object's file it
// left is integrity-checked.
func (e *env) killHost(h *topology.Member) failpoint.Failpoint {
	return failpoint.NewKillRestart(h.Name, h, e.sched.fault/2, func() {
		e.hostDown(h, fmt.Sprintf("after kill -9 of %s at %s", h.Name, e.hist.Now().Round(time.Millisecond)), true)
	})
}

// hostDown runs the checks of a host killed -9, while it is down: every
// live object's file integrity-checked and, for the archived host, its
// acknowledged inserts looked up in the archive (archivedAtKill) unless the
// object store is stopped (storeUp false).
func (e *env) hostDown(h *topology.Member, when string, storeUp bool) {
	checks := e.checkHostFiles(h, when)
	e.mu.Lock()
	e.integrity = append(e.integrity, checks...)
	e.mu.Unlock()
	if h.Name == archivedHost {
		k := validate.ArchivedAtKill{Host: h.Name, When: when, Excused: "the object store was stopped"}
		if storeUp {
			k = e.archivedAtKill(h, when)
		}
		e.mu.Lock()
		e.archivedKills = append(e.archivedKills, k)
		e.mu.Unlock()
	}
}

// archivedAtKill reads, while the archived host h is down after a kill -9,
// the archive's newest point of each of its live databases with
// acknowledged inserts (validate.ArchivedWritesKept holds them to it).
func (e *env) archivedAtKill(h *topology.Member, when string) validate.ArchivedAtKill {
	k := validate.ArchivedAtKill{Host: h.Name, When: when, Acked: map[string][]int64{}, Values: map[string]map[int64]bool{}, Errs: map[string]string{}}
	// A database whose archive the store lost objects of (object-store-
	// loses) may have its newest point behind a hole until its host heals
	// it after the restart: left out, counted.
	hit := map[string]bool{}
	e.mu.Lock()
	for _, l := range e.lost {
		hit[l.DB()] = true
	}
	e.mu.Unlock()
	objs, err := validate.HostObjects(h.Name, h.Dir)
	if err != nil {
		k.Errs["index.db"] = err.Error()
		k.Acked["index.db"] = nil
		return k
	}
	live := map[string]bool{}
	for _, o := range objs {
		if o.Live() {
			live[o.DatabaseUUID] = true
		}
	}
	// The host is down: every insert acknowledged so far was acknowledged
	// before the kill (one answered after this read is left out).
	for _, op := range e.hist.Ops() {
		if op.Kind == traffic.Insert && op.Outcome == traffic.OK && live[op.DB] {
			if hit[op.DB] {
				k.SkippedDBs++
				live[op.DB] = false
				continue
			}
			k.Acked[op.DB] = append(k.Acked[op.DB], op.Value)
		}
	}
	dbs := make([]string, 0, len(k.Acked))
	for db := range k.Acked {
		dbs = append(dbs, db)
	}
	st, err := e.c.ArchiveStore()
	if err != nil {
		for _, db := range dbs {
			k.Errs[db] = err.Error()
		}
		return k
	}
	a := history.NewArchive(st)
	vals := make([]map[int64]bool, len(dbs))
	errs := make([]error, len(dbs))
	harness.Concurrently(len(dbs), 8, func(i int) {
		ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
		defer cancel()
		vals[i], errs[i] = validate.ArchivedValues(ctx, a, dbs[i])
	})
	for i, db := range dbs {
		if errs[i] != nil {
			k.Errs[db] = errs[i].Error()
		} else {
			k.Values[db] = vals[i]
		}
	}
	return k
}

func (e *env) killMember(m *topology.Member) failpoint.Failpoint {
	return failpoint.NewKillRestart(m.Name, m, e.sched.fault/2, nil)
}

// splitBrain splits the catalog 2/1 with the leader in the minority, one
// object host on each side and the edge with the majority: the old leader
// keeps believing it leads until its lease lapses, and the host beside it
// can reach only it.
func (e *env) splitBrain() failpoint.Failpoint {
	l, fs := e.leader(), e.followers()
	minority := []*topology.Member{l, e.c.Hosts[0]}
	majority := append(append([]*topology.Member{}, fs...), e.c.Hosts[1:]...)
	majority = append(majority, e.c.Edges...)
	param := fmt.Sprintf("%v | %v", topology.Names(minority...), topology.Names(majority...))
	return failpoint.Custom(failpoint.SplitBrain, l.Name+"+"+e.c.Hosts[0].Name, param, e.sched.fault,
		func() error { return e.c.Net.Partition(topology.Nodes(minority...), topology.Nodes(majority...)) },
		e.c.Net.Heal)
}

// oneWay: the leader stops receiving from a follower, which still receives
// the leader's appends (and so never times out and campaigns).
func (e *env) oneWay() failpoint.Failpoint {
	l, f := e.leader(), e.followers()[0]
	return failpoint.Custom(failpoint.OneWay, f.Name+"→"+l.Name, "", e.sched.fault,
		func() error { return l.Node().DropFrom(f.Node()) }, e.c.Net.Heal)
}

func (e *env) cutOffCatalog() failpoint.Failpoint {
	return failpoint.Custom(failpoint.CatalogCutOff, "catalog", "", e.sched.fault, e.c.CutOffCatalog, e.c.RejoinCatalog)
}

// cutOffCatalogColdEdge cuts the catalog off and, meanwhile, restarts the
// last edge cold (kill -9, its data directory emptied: no route cached, no
// token validated): queries through it with binding tokens minted before
// the cut must all succeed — the credential carries the route and the
// edge checks its signature itself. Bearer-token queries cannot pass a
// cold edge without the catalog (tokens live only there), so the load
// keeps off that edge while it is cold.
func (e *env) cutOffCatalogColdEdge() failpoint.Failpoint {
	cold := len(e.c.Edges) - 1
	edge := e.c.Edges[cold]
	type bound struct{ db, token string }
	var tokens []bound
	dbs := e.load.Live()
	e.r.Shuffle(len(dbs), func(i, j int) { dbs[i], dbs[j] = dbs[j], dbs[i] })
	for _, db := range dbs[:min(20, len(dbs))] {
		tok, err := e.cl.MintBinding(e.ctx, 0, db)
		if err != nil {
			e.t.Logf("binding token for %s not minted: %v", db, err)
			continue
		}
		tokens = append(tokens, bound{db, tok})
	}
	var from time.Duration
	f := failpoint.Custom(failpoint.CatalogCutOff, "catalog", fmt.Sprintf("%s restarted cold, %d binding tokens", edge.Name, len(tokens)), e.sched.fault,
		func() error {
			e.load.AvoidEdge(cold)
			if err := e.c.CutOffCatalog(); err != nil {
				return err
			}
			// Calls already on their way through the edge (warm until the
			// kill) finish first.
			time.Sleep(500 * time.Millisecond)
			if err := e.c.ColdRestart(e.ctx, edge); err != nil {
				return err
			}
			from = e.hist.Now()
			return nil
		},
		func() error {
			e.mu.Lock()
			e.coldCutOffs = append(e.coldCutOffs, validate.Window{Name: "catalog cut off, " + edge.Name + " cold", From: from, To: e.hist.Now()})
			e.mu.Unlock()
			err := e.c.RejoinCatalog()
			e.load.AvoidEdge(-1)
			return err
		})
	return f.WithDuring(func(ctx context.Context) {
		// Four readers (history clients 901–904): until the edge's
		// fallback gives up on the unreachable catalog, each read waits
		// out its catalog timeout (the parent token's revocation check).
		var wg sync.WaitGroup
		for c := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := c; ctx.Err() == nil && len(tokens) > 0; i += 4 {
					b := tokens[i%len(tokens)]
					e.cl.BoundRead(e.ctx, 901+c, cold, b.db, b.token) // not ctx: a read cut short at the heal is no failure
					select {
					case <-ctx.Done():
					case <-time.After(50 * time.Millisecond):
					}
				}
			}()
		}
		wg.Wait()
	})
}

func (e *env) diskFull(h *topology.Member) failpoint.Failpoint {
	return failpoint.Custom(failpoint.DiskFull, h.Name, hostDisk+" tmpfs", e.sched.fault,
		func() error { return topology.FillDisk(h.Dir) }, func() error { return topology.FreeDisk(h.Dir) })
}

// routePurge purges every edge's route cache every 100 ms: each query then
// misses the cache and takes the bounded fallback to the catalog.
func (e *env) routePurge() failpoint.Failpoint {
	f := failpoint.Custom(failpoint.RoutePurge, "edges", "every 100ms", e.sched.fault,
		func() error { return e.c.PurgeRoutes(e.ctx) }, func() error { return nil })
	return f.WithDuring(func(ctx context.Context) {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				_ = e.c.PurgeRoutes(ctx)
			}
		}
	})
}

// lostCreate arms the edges' create failpoints (edgeFailpoints) for the
// fault's duration.
func (e *env) lostCreate() failpoint.Failpoint {
	return failpoint.Custom(failpoint.LostCreate, "edges", edgeFailpoints, e.sched.fault, e.c.ToggleEdgeFailpoints, e.c.ToggleEdgeFailpoints)
}

// stopClickHouse pauses the managed clickhouse-server (SIGSTOP): the sink's
// inserts hang until it continues; queries must not notice.
func (e *env) stopClickHouse() failpoint.Failpoint {
	ch, err := e.c.ClickHouse()
	require.NoError(e.t, err)
	return failpoint.NewStopCont("clickhouse", ch, e.sched.fault)
}

func (e *env) stopFollower() failpoint.Failpoint {
	f := e.followers()[0]
	return failpoint.NewStopCont(f.Name, f, e.sched.fault)
}

// followerLag delays a follower's raft traffic by 100–400 ms each way: the
// leader's appends and their acknowledgements pass through a delaying
// relay in the follower's namespace (topology.Node.DelayPort; this kernel
// has no netem). The follower falls behind without timing out (heartbeat
// timeout 1 s) and the other follower keeps the quorum.
func (e *env) followerLag() failpoint.Failpoint {
	f := e.followers()[0]
	delay := time.Duration(100+e.r.IntN(300)) * time.Millisecond
	var relay *topology.Relay
	return failpoint.Custom(failpoint.FollowerLag, f.Name, fmt.Sprintf("raft +%s each way, relay", delay), e.sched.fault,
		func() (err error) { relay, err = f.Node().DelayPort(topology.RaftPort, delay); return err },
		func() error {
			if relay == nil {
				return nil
			}
			b, n := relay.Relayed()
			e.t.Logf("follower-lag relay of %s carried %d bytes over %d connections", f.Name, b, n)
			return relay.Close()
		})
}

// packetLoss drops pct% of m's packets both ways (iptables statistic).
func (e *env) packetLoss(m *topology.Member, pct int) failpoint.Failpoint {
	nd := m.Node()
	return failpoint.Custom(failpoint.PacketLoss, m.Name, fmt.Sprintf("%d%%", pct), e.sched.fault,
		func() error { return nd.Lose(pct) }, nd.Unlose)
}

// consumerStopped stalls the pipeline node's consumers (storage consumer
// and ClickHouse sink) while its broker keeps taking the hosts' records:
// usage and sizes wait in the broker and must arrive, exactly, after.
//
// The fault checks itself: from a second into the stall (a batch polled
// just before it may still land) to the heal, neither consumer polls a
// record — otherwise the fault was not in effect and its run proves
// nothing.
func (e *env) consumerStopped() failpoint.Failpoint {
	metrics := e.c.Pipeline
	counters := []string{"shoal_storage_consumer_consumed_total", "shoal_pipeline_chsink_consumed_total"}
	var during []float64
	f := failpoint.Custom(failpoint.ConsumerStopped, e.c.Pipeline.Name+" consumers", pipelineFailpoints, e.sched.fault,
		e.c.ToggleConsumers,
		func() error {
			if during != nil {
				at := scrapeCounters(metrics, counters)
				e.t.Logf("consumer-stopped: %v consumed one second into the stall, %v at its end", during, at)
				assert.Equal(e.t, during, at, "the consumers polled records while stopped: the consumer-stopped fault was not in effect")
			}
			return e.c.ToggleConsumers()
		})
	return f.WithDuring(func(ctx context.Context) {
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
			during = scrapeCounters(metrics, counters)
		}
	})
}

// scrapeCounters reads the named counters from m's /metrics page, each
// summed over its label sets (nil if the page cannot be read).
func scrapeCounters(m *topology.Member, names []string) []float64 {
	resp, err := m.HTTP.Get(m.URL("/metrics"))
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil
	}
	out := make([]float64, len(names))
	for _, line := range strings.Split(string(b), "\n") {
		for i, n := range names {
			if strings.HasPrefix(line, n+" ") || strings.HasPrefix(line, n+"{") {
				f := strings.Fields(line)
				v, _ := strconv.ParseFloat(f[len(f)-1], 64)
				out[i] += v
			}
		}
	}
	return out
}

// objectStoreLoses has the object store lose n objects it acknowledged
// (deleted or corrupted, chosen with seed: cmd/s3node's mode=lose), for
// good: the hosts' scrubbers must find the damage, heal what they can and
// report the rest (validate.ArchiveDamageReported at the end).
func (e *env) objectStoreLoses(n int, seed uint64) failpoint.Failpoint {
	return failpoint.Custom(failpoint.ObjectStoreLoses, e.c.ObjectStore.Name, fmt.Sprintf("%d objects, seed %d", n, seed), e.sched.fault,
		func() error {
			hit, err := e.c.StoreLose(e.ctx, n, "mixed", seed)
			e.mu.Lock()
			e.lost = append(e.lost, hit...)
			e.mu.Unlock()
			e.t.Logf("object store lost %v", hit)
			return err
		},
		func() error { return nil }) // nothing brings the objects back
}

// objectStoreFaulty keeps the object store up but has it answer every
// request 503 SlowDown (StoreErrors) or each one 3 s late (StoreSlow),
// sampling the hosts' archive status as for an outage; run then checks the
// same things as after one (queries unaffected, lag alarm, recovery).
func (e *env) objectStoreFaulty(mode string) failpoint.Failpoint {
	s := e.c.ObjectStore
	out := &validate.StoreOutage{AlarmLag: archiveAlarmLag, Hosts: map[string]*validate.HostLag{}}
	for _, h := range e.c.Hosts {
		out.Hosts[h.Name] = &validate.HostLag{}
	}
	e.mu.Lock()
	e.outage = out
	e.mu.Unlock()
	const slowBy = 3 * time.Second
	param, set := mode, func() error { return e.c.StoreFault(e.ctx, "503", 0) }
	if mode == failpoint.StoreSlow {
		param, set = fmt.Sprintf("%s, %s a request", mode, slowBy), func() error { return e.c.StoreFault(e.ctx, "slow", slowBy) }
	}
	f := failpoint.Custom(failpoint.ObjectStoreFaulty, s.Name, param, e.sched.fault, set,
		func() error { return e.c.StoreFault(e.ctx, "none", 0) })
	return f.WithDuring(func(ctx context.Context) {
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			e.sampleArchiveStatus(out)
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	})
}

func (e *env) throttleFollower() failpoint.Failpoint {
	f := e.followers()[0]
	return failpoint.NewThrottle(f.Name, f.Node(), "256kbit", e.sched.fault)
}

// objectStoreDown takes the object store away in the way mode names
// (failpoint.StoreKilled, StoreStopped, StoreCut), sampling every host's
// archive status (GET /v1/history/status) while it is down; run then waits
// for the lag to recover (storeRecovered).
func (e *env) objectStoreDown(mode string) failpoint.Failpoint {
	s := e.c.ObjectStore
	out := &validate.StoreOutage{AlarmLag: archiveAlarmLag, Hosts: map[string]*validate.HostLag{}}
	for _, h := range e.c.Hosts {
		out.Hosts[h.Name] = &validate.HostLag{}
	}
	e.mu.Lock()
	e.outage = out
	e.mu.Unlock()
	f := failpoint.NewObjectStoreDown(s.Name, mode, s, s.Node(), e.sched.fault)
	return f.WithDuring(func(ctx context.Context) {
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			e.sampleArchiveStatus(out)
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	})
}

// sampleArchiveStatus reads every host's archive status once into out and
// reports whether every host is back under the alarm threshold.
func (e *env) sampleArchiveStatus(out *validate.StoreOutage) bool {
	all := true
	for _, h := range e.c.Hosts {
		l := out.Hosts[h.Name]
		st, err := e.c.HistoryStatus(e.ctx, h)
		if err != nil {
			l.Err = err.Error()
			all = false
			continue
		}
		l.Samples++
		l.MaxLag = max(l.MaxLag, st.LagSeconds)
		l.Alarm = l.Alarm || st.Alarm
		if st.Alarm || st.LagSeconds >= out.AlarmLag.Seconds() {
			all = false
		}
	}
	return all
}

// storeRecovered records an object-store outage that has just healed and
// waits (up to archiveSettle) until every host's archive lag is back under
// the alarm threshold: the backlog shipped.
func (e *env) storeRecovered(w validate.Window) {
	e.mu.Lock()
	out := e.outage
	e.outage = nil
	e.storeDowns = append(e.storeDowns, w)
	e.mu.Unlock()
	if out == nil {
		return
	}
	out.Window = w
	deadline := time.Now().Add(archiveSettle)
	for {
		if e.sampleArchiveStatus(out) {
			for _, l := range out.Hosts {
				l.Recovered = true
			}
			break
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond) // poll interval of a wait for the condition above (the event itself)
	}
	e.mu.Lock()
	e.storeOutages = append(e.storeOutages, *out)
	e.mu.Unlock()
}

// restoreDuringHostKill restores a register database through the edge and
// kills its host with -9 while the restore runs: at a random instant of it
// or, with stopStore, while the restore waits on the object store (paused
// with SIGSTOP, so the kill lands before the restore's checkpoint). The
// database must come back either fully restored or untouched (the register
// model sees the restore as of unknown outcome), its file intact (checked
// while the host is down and at the end). The host restarts after half the
// fault's duration.
func (e *env) restoreDuringHostKill(stopStore bool) failpoint.Failpoint {
	regs := e.sched.load.Registers
	db := regs[e.r.IntN(len(regs))]
	delay := time.Duration(e.r.IntN(60)) * time.Millisecond
	catalog, err := e.c.CatalogClient()
	require.NoError(e.t, err)
	defer catalog.Close()
	ctx, cancel := context.WithTimeout(e.ctx, 10*time.Second)
	d, err := catalog.Database(ctx, db, raftmeta.LinearizableRead())
	cancel()
	require.NoError(e.t, err, "register %s in the catalog", db)
	var h *topology.Member
	for _, m := range e.c.Hosts {
		if m.Name == d.HostID {
			h = m
		}
	}
	require.NotNil(e.t, h, "host %s of register %s", d.HostID, db)
	short := db[max(0, len(db)-8):] // UUIDv7s of one run share their leading (time) digits
	param := fmt.Sprintf("during a restore of …%s, %s in", short, delay)
	if stopStore {
		param = fmt.Sprintf("during a restore of …%s waiting on the stopped object store", short)
	}
	const client = 900 // the history's client ID of these restores
	inject := func() error {
		bm, ok := e.load.PickBookmark(e.r, db)
		if !ok {
			op := e.cl.Bookmark(e.ctx, client, 0, db)
			bm = op.Bookmark
		}
		if bm == "" || !e.cl.ReserveRestore(db, 0) {
			e.t.Logf("restore during kill of %s: no bookmark or no restore budget left; plain kill", h.Name)
			bm = ""
		}
		if stopStore {
			if err := e.c.ObjectStore.Signal(syscall.SIGSTOP); err != nil {
				return err
			}
			defer func() { _ = e.c.ObjectStore.Signal(syscall.SIGCONT) }()
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			if bm != "" {
				if op := e.cl.Restore(e.ctx, client, 0, db, bm); op.Outcome == traffic.OK {
					e.load.AddBookmarks(db, op.Prev, op.After)
				}
			}
		}()
		if stopStore {
			time.Sleep(500 * time.Millisecond) // the restore reaches the stopped store (it hangs there: no event to see)
		} else {
			time.Sleep(delay) // the fault's moment: a few ms into the restore
		}
		err := h.Kill()
		if err == nil {
			e.hostDown(h, fmt.Sprintf("after kill -9 of %s during a restore at %s", h.Name, e.hist.Now().Round(time.Millisecond)), !stopStore)
		}
		<-done
		return err
	}
	f := failpoint.Custom(failpoint.KillRestart, h.Name, param, e.sched.fault/2, inject, h.Start)
	return f
}

// storageTotals waits (up to storageSettle) until the catalog's storage
// total of account — the drained change log the limits are enforced on —
// equals the sum of the account's database sizes in the catalog, both read
// at the linearizable level once the load has stopped (the storage
// consumer and the 1-second drain lost and doubled nothing across the
// faults), and every database the final list showed has a size there (the
// final probe's query opened each one, and a size is published within a
// window of it; storageCoverage then holds the sizes against the files).
// The hosts' own total (shoal_objecthost_database_files_bytes, every database
// they hold, deleted ones until swept) is noted beside it, not compared.
func (e *env) storageTotals(catalog *raftmeta.Client, account string, measured map[string]int64) (validate.Result, map[string]int64, int64) {
	const storageSettle = 30 * time.Second
	r := validate.Result{Check: "catalog account storage total equals the sum of its databases' sizes (storage consumer and drain exact)", Checked: 1}
	deadline := time.Now().Add(storageSettle)
	var total, sum int64
	var sizes map[string]int64
	var err error
	for {
		total, sum, sizes, err = readStorage(e.ctx, catalog, account)
		// Every listed database has its size, and the one its host
		// measured last (observe's final GET) has reached the catalog.
		settled := true
		for db, n := range measured {
			if got, ok := sizes[db]; !ok || n > 0 && got != n {
				settled = false
				break
			}
		}
		if err == nil && total == sum && settled || time.Now().After(deadline) {
			break
		}
		time.Sleep(500 * time.Millisecond) // poll interval of a wait for the condition above (the event itself)
	}
	switch {
	case err != nil:
		r.Violations = []string{fmt.Sprintf("reading the catalog's storage figures: %v", err)}
	case total != sum:
		r.Violations = []string{fmt.Sprintf("account total %d bytes, its %d databases' sizes sum to %d (after %s)", total, len(sizes), sum, storageSettle)}
	}
	var onHosts float64
	for _, h := range e.c.Hosts {
		if v := scrapeCounters(h, []string{"shoal_objecthost_database_files_bytes"}); v != nil {
			onHosts += v[0]
		}
	}
	r.Note = fmt.Sprintf("catalog total %d bytes over %d databases; the hosts' database_files_bytes %.0f", total, len(sizes), onHosts)
	return r, sizes, total
}

// sizesByValue holds the catalog's storage figures (read by storageTotals
// once every listed database's last measurement — observe's final GET,
// measured holds what the hosts answered — had reached it) against the
// files the hosts left after the final kill, by value: each live database
// of account with a file has the size of its pages in use (the one measure
// a host publishes, at a write, a GET, a start or a restore; read by
// used), and the account's total is their sum. A violation names both
// figures and the GET's.
func sizesByValue(objs []validate.Object, sizes map[string]int64, total int64, measured map[string]int64, account string, used func(validate.Object) (int64, error)) validate.Result {
	r := validate.Result{Check: "catalog sizes equal the files by value: each live database's size is its pages in use, the account total their sum"}
	var sum int64
	for _, o := range objs {
		if !o.Live() || o.AccountID != account {
			continue
		}
		onDisk, err := used(o)
		if err != nil {
			r.Violations = append(r.Violations, fmt.Sprintf("%s/%s: the file left could not be measured: %v", o.Host, o.DatabaseUUID, err))
			continue
		}
		sum += onDisk
		got, ok := sizes[o.DatabaseUUID]
		if onDisk == 0 && !ok {
			continue // never written: no file, no size
		}
		r.Checked++
		if got != onDisk {
			m, measuredOK := measured[o.DatabaseUUID]
			r.Violations = append(r.Violations, fmt.Sprintf("%s/%s: catalog %d bytes, pages in use %d (final GET measured %d, %v)", o.Host, o.DatabaseUUID, got, onDisk, m, measuredOK))
		}
	}
	r.Checked++
	if total != sum {
		r.Violations = append(r.Violations, fmt.Sprintf("account total %d bytes, its live databases' pages in use %d", total, sum))
	}
	r.Note = fmt.Sprintf("account total %d bytes, files %d", total, sum)
	sort.Strings(r.Violations)
	return r
}

// storageCoverage checks the catalog's database sizes (read by
// storageTotals once the load stopped) against the files the hosts left:
// every live database with a non-empty file has a size in the catalog. A
// size event a crash lost in a host's memory is published again by the
// host's pass after its restart (objecthost/sizerepublish.go); before that
// pass such databases kept no size until their next growth. Sizes that
// differ from file + WAL now are noted, not failed: a host measures at a
// write, and a later checkpoint moves pages between WAL and file.
// Noted, not failed: sizesByValue holds them by value after the final GET.
func storageCoverage(objs []validate.Object, sizes map[string]int64, account string) validate.Result {
	r := validate.Result{Check: "every live database with a non-empty file has a size in the catalog"}
	differ := 0
	for _, o := range objs {
		if !o.Live() || o.AccountID != account {
			continue
		}
		fi, err := os.Stat(o.Path)
		if err != nil {
			continue // never opened: no file, no size
		}
		onDisk := fi.Size()
		if w, err := os.Stat(o.Path + "-wal"); err == nil {
			onDisk += w.Size()
		}
		if onDisk == 0 {
			continue // created but never written (e.g. its first write hit a full disk): no size to publish
		}
		r.Checked++
		got, ok := sizes[o.DatabaseUUID]
		switch {
		case !ok:
			r.Violations = append(r.Violations, fmt.Sprintf("%s/%s: %d bytes on disk, no size in the catalog", o.Host, o.DatabaseUUID, onDisk))
		case got != onDisk:
			differ++
		}
	}
	r.Note = fmt.Sprintf("%d with a size other than file+WAL now", differ)
	return r
}

// readStorage is, at the linearizable level, account's drained storage
// total, the sum of its databases' sizes, and each database's size.
func readStorage(ctx context.Context, catalog *raftmeta.Client, account string) (total, sum int64, sizes map[string]int64, err error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	a, err := catalog.Account(ctx, account, raftmeta.LinearizableRead())
	if err != nil {
		return 0, 0, nil, err
	}
	sizes = map[string]int64{}
	for after := ""; ; {
		page, err := catalog.DatabaseStoragePage(ctx, after, fsm.MaxStoragePage, raftmeta.LinearizableRead())
		if err != nil {
			return 0, 0, nil, err
		}
		for _, d := range page.Databases {
			if d.AccountID == account {
				sum += d.SizeBytes
				sizes[d.UUID] = d.SizeBytes
			}
		}
		if after = page.Next; after == "" {
			break
		}
	}
	return a.StorageBytes, sum, sizes, nil
}

// archiveDrained waits (up to archiveSettle) until no host has anything
// left to ship — lag 0, no backlog — once the load has stopped: every
// commit is then in the archive, and the final kill -9 cannot leave an
// unshipped tail (which the default durability allows: it would ship at
// the host's next start) between the files and the archive check.
func (e *env) archiveDrained() validate.Result {
	r := validate.Result{Check: "every host's archive backlog shipped after the load stopped (lag 0, no backlog)"}
	deadline := time.Now().Add(archiveSettle)
	for {
		var behind []string
		for _, h := range e.c.Hosts {
			st, err := e.c.HistoryStatus(e.ctx, h)
			switch {
			case err != nil:
				behind = append(behind, fmt.Sprintf("%s: %v", h.Name, err))
			case st.LagSeconds > 0 || st.Backlog > 0:
				behind = append(behind, fmt.Sprintf("%s: lag %.1fs, %d databases behind, last error %q", h.Name, st.LagSeconds, st.Backlog, st.LastError))
			}
		}
		if len(behind) == 0 || time.Now().After(deadline) {
			r.Checked = len(e.c.Hosts)
			r.Violations = behind
			return r
		}
		time.Sleep(200 * time.Millisecond) // poll interval of a wait for the condition above (the event itself)
	}
}

// archiveChecks verifies the archive of every live object against the
// file its (killed) host left, from the object store (still up).
func (e *env) archiveChecks(objs []validate.Object, damages map[string]validate.Damage) []validate.ArchiveCheck {
	st, err := e.c.ArchiveStore()
	require.NoError(e.t, err)
	a := history.NewArchive(st)
	var live []validate.Object
	for _, o := range objs {
		if o.Live() {
			live = append(live, o)
		}
	}
	out := make([]validate.ArchiveCheck, len(live))
	harness.Concurrently(len(live), 8, func(i int) {
		ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
		defer cancel()
		var d *validate.Damage
		if dm, ok := damages[live[i].DatabaseUUID]; ok {
			d = &dm
		}
		out[i] = validate.CheckArchive(ctx, a, live[i], d)
	})
	return out
}

// finalScrubs has every host scrub its whole archive now (every object
// read) and reads what it then shows: its scrubber's report, the
// archive_damaged alarm in /v1/status and in `shoal cluster status`.
func (e *env) finalScrubs() []validate.HostScrub {
	var out []validate.HostScrub
	anyDamage := false
	for _, h := range e.c.Hosts {
		hs := validate.HostScrub{Host: h.Name}
		st, err := e.c.ScrubHost(e.ctx, h)
		if err != nil {
			hs.Err = err.Error()
		}
		hs.Status = st
		anyDamage = anyDamage || st.DamagedN > 0
		resp, err := h.HTTP.Get(h.URL("/v1/status"))
		if err != nil {
			hs.StatusErr = err.Error()
		} else {
			var env struct { // the v4 envelope
				Result struct {
					Alarms []struct {
						Kind      string `json:"kind"`
						Databases int    `json:"databases"`
					} `json:"alarms"`
				} `json:"result"`
			}
			if err := json.NewDecoder(resp.Body).Decode(&env); err != nil {
				hs.StatusErr = err.Error()
			}
			resp.Body.Close()
			for _, a := range env.Result.Alarms {
				if a.Kind == "archive_damaged" {
					hs.Alarm, hs.AlarmDBs = true, a.Databases
				}
			}
		}
		out = append(out, hs)
	}
	if anyDamage {
		ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
		defer cancel()
		cli, cliErr := "", ""
		if l, err := e.c.Leader(ctx); err != nil {
			cliErr = err.Error()
		} else if cli, err = e.c.CLI(ctx, "cluster", "status", "--addr", l.Addr); err != nil {
			cliErr = err.Error()
		}
		e.t.Logf("shoal cluster status after the final scrub:\n%s", cli)
		for i := range out {
			out[i].CLI, out[i].CLIErr = strings.Contains(cli, "ALARM "+out[i].Host+" archive_damaged"), cliErr
		}
	}
	for _, hs := range out {
		e.t.Logf("%s final scrub: %d databases checked, %d store errors, %d damaged %+v%s", hs.Host, hs.Status.Checked, hs.Status.Errors, hs.Status.DamagedN, hs.Status.Damaged, hs.Err)
	}
	return out
}

// archiveDamageReported holds the hosts' final scrubs to what the store
// lost (validate.ArchiveDamageReported), with the suite's own scrub of
// every hit database that is live at the end.
func (e *env) archiveDamageReported(objs []validate.Object, scrubs []validate.HostScrub) validate.Result {
	live := map[string]string{}
	for _, o := range objs {
		if o.Live() {
			live[o.DatabaseUUID] = o.Host
		}
	}
	st, err := e.c.ArchiveStore()
	require.NoError(e.t, err)
	own := map[string]history.ScrubReport{}
	for _, l := range e.lost {
		db := l.DB()
		if _, ok := live[db]; !ok {
			continue
		}
		if _, done := own[db]; done {
			continue
		}
		ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
		rep, err := validate.OwnScrub(ctx, st, db)
		cancel()
		require.NoError(e.t, err, "the suite's own scrub of %s", db)
		own[db] = rep
	}
	return validate.ArchiveDamageReported(e.lost, scrubs, own, live)
}

func (e *env) integrityChecks() []validate.Integrity {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]validate.Integrity(nil), e.integrity...)
}

// checkHostFiles integrity-checks every live object h left on its disk (h
// must be down).
func (e *env) checkHostFiles(h *topology.Member, when string) []validate.Integrity {
	objs, err := validate.HostObjects(h.Name, h.Dir)
	if err != nil {
		return []validate.Integrity{{Object: validate.Object{Host: h.Name, ObjectID: "index.db"}, When: when, Err: err}}
	}
	var out []validate.Integrity
	for _, o := range objs {
		if o.Live() {
			out = append(out, validate.IntegrityCheck(o, when))
		}
	}
	return out
}

// maxCheckHeap bounds the porcupine checks' heap: $SHOAL_ROBUSTNESS_MAX_HEAP_GB
// GiB, default 6 (the machines are shared).
func maxCheckHeap() uint64 {
	gb := uint64(6)
	if v, err := strconv.ParseUint(os.Getenv("SHOAL_ROBUSTNESS_MAX_HEAP_GB"), 10, 64); err == nil && v > 0 {
		gb = v
	}
	return gb << 30
}

// liveHosts maps each database to the host of its live object.
func liveHosts(objs []validate.Object) map[string]string {
	out := map[string]string{}
	for _, o := range objs {
		if o.Live() {
			out[o.DatabaseUUID] = o.Host
		}
	}
	return out
}

// hostKills lists, per object host, its kill -9 windows: from the kill to
// the restart.
func (e *env) hostKills() map[string][]validate.Window {
	hosts := map[string]bool{}
	for _, h := range e.c.Hosts {
		hosts[h.Name] = true
	}
	out := map[string][]validate.Window{}
	for _, inj := range e.rep.Injections {
		if inj.Failpoint.Kind == failpoint.KillRestart && hosts[inj.Failpoint.Target] && inj.Err == nil {
			out[inj.Failpoint.Target] = append(out[inj.Failpoint.Target], validate.Window{From: inj.Start, To: inj.Healed})
		}
	}
	return out
}

// crashLoss bounds what a host killed -9 may lose of its usage: the open
// 1 s aggregation window plus the records in flight to the broker.
const crashLoss = 2 * time.Second

// stallTimeout is the host producer's StallTimeout (pipeline/DESIGN.md):
// while the broker is away, records wait in the client's memory until
// nothing has been acknowledged for this long, and only then go to the
// on-disk spill.
const stallTimeout = 5 * time.Second

// crashWindows lists, per database, what each kill -9 of the host holding
// its live object may have lost of its usage: the crashLoss before the
// kill, or, when the pipeline node (the broker) was down or just back in
// the stallTimeout before that, everything from the crashLoss before the
// broker went away (the window then open and the records in flight, which
// the broker never acknowledged) — records the broker never acknowledged
// wait in the host's memory (the spill takes them only after
// stallTimeout), and pipeline/DESIGN.md's "Spill only on trouble" accepts
// that a crash loses them.
func (e *env) crashWindows(objs []validate.Object) map[string][]validate.Window {
	kills := map[string][]time.Duration{}
	var broker []failpoint.Injection
	for _, inj := range e.rep.Injections {
		if inj.Failpoint.Kind == failpoint.KillRestart {
			kills[inj.Failpoint.Target] = append(kills[inj.Failpoint.Target], inj.Start)
		}
		if e.c.Pipeline != nil && inj.Failpoint.Target == e.c.Pipeline.Name {
			broker = append(broker, inj)
		}
	}
	out := map[string][]validate.Window{}
	for _, o := range objs {
		for _, at := range kills[o.Host] {
			w := validate.Window{Name: "kill of " + o.Host, From: at - crashLoss, To: at}
			for _, b := range broker {
				if b.Start < at && b.Healed+stallTimeout >= w.From {
					w.From = min(w.From, b.Start-crashLoss)
					w.Name += " after the broker's " + string(b.Failpoint.Kind)
				}
			}
			out[o.DatabaseUUID] = append(out[o.DatabaseUUID], w)
		}
	}
	return out
}

// usage waits (up to usageFor) until ClickHouse bills at least every
// acknowledged query, then returns what it billed per database and each
// producer's sequence numbers.
func (e *env) usage() (map[string]int64, []validate.ProducerSeqs) {
	// Until every acknowledged query is billed, or the totals have not
	// moved for stableFor (what a killed host lost never comes), or
	// usageFor has passed.
	const usageFor, stableFor = 45 * time.Second, 5 * time.Second
	acked := validate.AckedQueries(e.hist.Ops())
	var billed map[string]int64
	var producers []validate.ProducerSeqs
	var last int64 = -1
	lastChange := time.Now()
	deadline := time.Now().Add(usageFor)
	for {
		var err error
		billed, producers, err = e.clickhouseUsage(e.account)
		short, total := 0, int64(0)
		for db, n := range acked {
			if billed[db] < n {
				short++
			}
		}
		for _, n := range billed {
			total += n
		}
		if total != last {
			last, lastChange = total, time.Now()
		}
		done := err == nil && (short == 0 || time.Since(lastChange) > stableFor)
		if done || time.Now().After(deadline) {
			if err != nil {
				e.t.Errorf("reading usage from ClickHouse: %v", err)
			}
			break
		}
		time.Sleep(time.Second) // poll interval of a wait for the condition above (the event itself)
	}
	return billed, producers
}

func (e *env) clickhouseUsage(account string) (map[string]int64, []validate.ProducerSeqs, error) {
	ctx, cancel := context.WithTimeout(e.ctx, 20*time.Second)
	defer cancel()
	out, err := e.c.ClickHouseQuery(ctx, "SELECT database_uuid, sum(queries) FROM shoal.requests FINAL WHERE account_id = '"+account+"' GROUP BY database_uuid FORMAT TSV")
	if err != nil {
		return nil, nil, err
	}
	billed := map[string]int64{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var db string
		var n int64
		if line == "" {
			continue
		}
		if _, err := fmt.Sscanf(line, "%s\t%d", &db, &n); err != nil {
			return nil, nil, fmt.Errorf("usage line %q: %w", line, err)
		}
		billed[db] = n
	}
	out, err = e.c.ClickHouseQuery(ctx, "SELECT event_producer, min(event_seq), max(event_seq), uniqExact(event_seq) FROM shoal.requests GROUP BY event_producer FORMAT TSV") // seqs count every account's events
	if err != nil {
		return nil, nil, err
	}
	var producers []validate.ProducerSeqs
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if line == "" {
			continue
		}
		var p validate.ProducerSeqs
		if _, err := fmt.Sscanf(line, "%s\t%d\t%d\t%d", &p.Producer, &p.Min, &p.Max, &p.Distinct); err != nil {
			return nil, nil, fmt.Errorf("producer line %q: %w", line, err)
		}
		producers = append(producers, p)
	}
	return billed, producers, nil
}

// heldOrphans reads each host's /v1/status: how many orphan verdicts its
// mass-orphan alarm holds (0 without one).
func (e *env) heldOrphans() map[string]int {
	out := map[string]int{}
	for _, h := range e.c.Hosts {
		resp, err := h.HTTP.Get(h.URL("/v1/status"))
		if err != nil {
			e.t.Errorf("%s status: %v", h.Name, err)
			continue
		}
		// /v1/status answers in the v4 envelope: {"result": {…}}.
		var env struct {
			Result struct {
				Alarms []struct {
					Kind      string `json:"kind"`
					Databases int    `json:"databases"`
				} `json:"alarms"`
			} `json:"result"`
		}
		err = json.NewDecoder(resp.Body).Decode(&env)
		resp.Body.Close()
		st := env.Result
		if err != nil {
			e.t.Errorf("%s status: %v", h.Name, err)
			continue
		}
		for _, a := range st.Alarms {
			if a.Kind == "mass_orphans" {
				out[h.Name] += a.Databases
				e.t.Logf("%s holds %d orphan verdicts (mass_orphans alarm)", h.Name, a.Databases)
			}
		}
	}
	return out
}

// hostState stops every object host with kill -9 (a last kill), reads their
// indexes, integrity-checks every live object, and asks the catalog
// (linearizable) about every database of account found on them. The hosts
// stay down: the scenario is over.
func (e *env) hostState(catalog *raftmeta.Client, account string) ([]validate.Object, map[string]validate.CatalogRow, []validate.Integrity) {
	var objs []validate.Object
	var checks []validate.Integrity
	for _, h := range e.c.Hosts {
		require.NoError(e.t, h.Kill())
		var fs syscall.Statfs_t
		if syscall.Statfs(h.Dir, &fs) == nil {
			total, free := int64(fs.Blocks)*fs.Bsize, int64(fs.Bavail)*fs.Bsize
			e.t.Logf("%s's disk at the end: %d of %d MiB used", h.Name, (total-free)>>20, total>>20)
		}
		o, err := validate.HostObjects(h.Name, h.Dir)
		require.NoError(e.t, err, "reading %s's index", h.Name)
		objs = append(objs, o...)
		for _, ob := range o {
			if ob.Live() {
				checks = append(checks, validate.IntegrityCheck(ob, "final, after kill -9 of "+h.Name))
			}
		}
	}
	rows := map[string]validate.CatalogRow{}
	for _, o := range objs {
		if o.AccountID != account {
			continue
		}
		if _, ok := rows[o.DatabaseUUID]; ok {
			continue
		}
		var d fsm.Database
		var err error
		deadline := time.Now().Add(settleFor)
		for {
			ctx, cancel := context.WithTimeout(e.ctx, 5*time.Second)
			d, err = catalog.Database(ctx, o.DatabaseUUID, raftmeta.LinearizableRead())
			cancel()
			if err == nil || errors.Is(err, fsm.ErrNotFound) || time.Now().After(deadline) {
				break
			}
			time.Sleep(200 * time.Millisecond) // retry interval until a definite answer
		}
		switch {
		case err == nil:
			rows[o.DatabaseUUID] = validate.CatalogRow{Found: true, Active: d.State == fsm.StateActive, ObjectID: d.ObjectID, HostID: d.HostID}
		case errors.Is(err, fsm.ErrNotFound):
			rows[o.DatabaseUUID] = validate.CatalogRow{}
		default:
			e.t.Errorf("catalog read of %s: %v", o.DatabaseUUID, err)
		}
	}
	return objs, rows, checks
}

// TestFaultLeaderIsolationAndHostKill: under traffic (creates, deletes,
// gets at both levels, row inserts, register writes, reads, bookmarks and
// restores), the catalog leader is cut off the network and healed, an
// object host is killed with -9 and restarted, the object store is killed
// -9 and restarted on its data, and a register's host is killed -9 during
// a time-travel restore (long: each of four rounds also SIGSTOPs, then
// throttles a follower).
func TestFaultLeaderIsolationAndHostKill(t *testing.T) {
	sched := scheduleOf(t)
	rounds := 1
	if sched.long {
		rounds = 4
	}
	scenario(t, t.Name(), sched, func(e *env) {
		for round := range rounds {
			e.run(e.isolateLeader())
			e.run(e.killHost(e.c.Hosts[round%len(e.c.Hosts)]))
			e.run(e.objectStoreDown(failpoint.StoreKilled))
			e.run(e.restoreDuringHostKill(false))
			if sched.long {
				e.run(e.stopFollower())
				e.run(e.throttleFollower())
				e.run(e.followerLag())
				e.run(e.packetLoss(e.c.Hosts[(round+1)%len(e.c.Hosts)], 20))
			}
		}
	})
}

// TestFaultPartitionsDiskAndSeedInjections: a split brain 2/1 with the
// leader and a host in the minority, a one-way link into the leader, a
// host's disk full, the seed design's injections (the central catalog cut
// off — every query to an existing database must still succeed —, a
// routing-miss storm, create answers lost after the checkpoint), ClickHouse
// paused, the pipeline node (broker, ClickHouse, consumers) killed -9, the
// object store paused (SIGSTOP) and then cut off the network, a register's
// host killed -9 while its restore waits on the paused object store, and
// the stale-read issue's permanent schedule: every catalog node killed and
// restarted in turn under load.
func TestFaultPartitionsDiskAndSeedInjections(t *testing.T) {
	sched := scheduleOf(t)
	scenario(t, t.Name(), sched, func(e *env) {
		e.run(e.splitBrain())
		e.run(e.oneWay())
		e.run(e.diskFull(e.c.Hosts[0]))
		e.run(e.cutOffCatalogColdEdge())
		e.run(e.routePurge())
		e.run(e.lostCreate())
		e.run(e.stopClickHouse())
		e.run(e.killMember(e.c.Pipeline))
		e.run(e.objectStoreDown(failpoint.StoreStopped))
		e.run(e.objectStoreDown(failpoint.StoreCut))
		if sched.long {
			e.run(e.consumerStopped())
			e.run(e.objectStoreFaulty(failpoint.StoreErrors))
			e.run(e.objectStoreFaulty(failpoint.StoreSlow))
		}
		e.run(e.restoreDuringHostKill(true))
		for _, m := range e.c.Catalog {
			e.run(e.killMember(m))
		}
	})
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
	for _, k := range []traffic.Kind{traffic.Create, traffic.Delete, traffic.Insert, traffic.RegWrite, traffic.RegRead, traffic.LinGet, traffic.EdgeGet, traffic.Bookmark, traffic.Restore,
		traffic.Export, traffic.Import, traffic.ImportRead, traffic.Insights} {
		assert.Positive(t, n[k], "no %s was acknowledged: the checks would be vacuous", k)
	}
}

// observe reads the state the checkers judge, once every fault has healed:
// the account's list, each acknowledged database's edge GET, each live
// database's rows, a probe query on every listed database, and a final
// linearizable get and register read (recorded in the history, so the
// models check them too). Transient answers are retried for up to
// settleFor.
func observe(t *testing.T, cl *traffic.Client, hist *traffic.History, load *traffic.Load) validate.Final {
	ctx := context.Background()
	f := validate.Final{Rows: map[string]map[int64]bool{}, Errors: map[string]string{}, EdgeGet: map[string]traffic.Outcome{}, Probe: map[string]string{}}
	var err error
	deadline := time.Now().Add(settleFor)
	for f.Listed, err = cl.List(ctx, 0); err != nil && time.Now().Before(deadline); f.Listed, err = cl.List(ctx, 0) {
		time.Sleep(200 * time.Millisecond) // retry interval until a definite answer
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
			time.Sleep(200 * time.Millisecond) // retry interval until a definite answer
		}
	}
	var mu sync.Mutex
	harness.Concurrently(len(acked), 8, func(i int) {
		db := acked[i]
		g := settle(func() traffic.Op { return cl.EdgeGet(ctx, finalClient, i%cl.Edges(), db) })
		settle(func() traffic.Op { return cl.LinGet(ctx, finalClient, db) })
		mu.Lock()
		f.EdgeGet[db] = g.Outcome
		mu.Unlock()
	})
	live := load.Live()
	harness.Concurrently(len(live), 8, func(i int) {
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
			time.Sleep(200 * time.Millisecond) // retry interval until a definite answer
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
	var listed []string
	for db := range f.Listed {
		listed = append(listed, db)
	}
	harness.Concurrently(len(listed), 8, func(i int) {
		db := listed[i]
		var out traffic.Outcome
		var text string
		deadline := time.Now().Add(settleFor)
		for {
			out, text = cl.Probe(ctx, i%cl.Edges(), db)
			if out != traffic.Unknown || time.Now().After(deadline) {
				break
			}
			time.Sleep(200 * time.Millisecond) // retry interval until a definite answer
		}
		mu.Lock()
		defer mu.Unlock()
		if out != traffic.OK {
			f.Probe[db] = text
		} else {
			f.Probe[db] = ""
		}
	})
	for i, db := range regs {
		settle(func() traffic.Op { return cl.RegRead(ctx, finalClient, i%cl.Edges(), db) })
	}
	// Last, every listed database's GET: its host measures the file (and
	// publishes the size when it changed) after every query above, so the
	// catalog's sizes can be held to the files by value (storageTotals,
	// sizesByValue).
	f.Measured = map[string]int64{}
	harness.Concurrently(len(listed), 8, func(i int) {
		db := listed[i]
		deadline := time.Now().Add(settleFor)
		for {
			n, out, _ := cl.FileSize(ctx, i%cl.Edges(), db)
			if out == traffic.OK {
				mu.Lock()
				f.Measured[db] = n
				mu.Unlock()
				return
			}
			if out != traffic.Unknown || time.Now().After(deadline) {
				return
			}
			time.Sleep(200 * time.Millisecond) // retry interval until a definite answer
		}
	})
	return f
}

// rerunCommand is the command that reruns the scenario name (a test, or
// TestFaultRandomSchedules/<schedule>) with sched's seed and the knobs of
// this run that change what it does (run as root, build.env loaded, from
// the repository root).
func rerunCommand(name string, sched schedule) string {
	env := []string{fmt.Sprintf("SHOAL_ROBUSTNESS_SEED=%d", sched.load.Seed)}
	for _, k := range []string{"SHOAL_FAULT", "SHOAL_FAULT_KINDS", "SHOAL_ROBUSTNESS_TLS"} {
		if v := os.Getenv(k); v != "" {
			env = append(env, k+"="+v)
		}
	}
	test := name
	if strings.HasPrefix(name, "TestFaultRandomSchedules/") {
		// Schedule i's seed is the run's seed + i: rerun it as the first.
		env = append(env, "SHOAL_FAULT_SCHEDULES=1")
		test = "TestFaultRandomSchedules"
	}
	return fmt.Sprintf("%s go test -count=1 -run '^%s$' -v ./test/robustness/", strings.Join(env, " "), test)
}

// reportDir is where a run's report goes: $SHOAL_ROBUSTNESS_REPORT_DIR
// (default the temp dir)/shoal-robustness-<scenario>-<schedule>-<seed>.
func reportDir(name string, sched schedule) string {
	dir := os.Getenv("SHOAL_ROBUSTNESS_REPORT_DIR")
	if dir == "" {
		dir = os.TempDir()
	}
	return filepath.Join(dir, fmt.Sprintf("shoal-robustness-%s-%s-%d", sanitize(name), sched.name, sched.load.Seed))
}

func sanitize(s string) string {
	out := []rune(s)
	for i, r := range out {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-') {
			out[i] = '_'
		}
	}
	return string(out)
}

// recordResults appends the run's record to $SHOAL_ROBUSTNESS_RESULTS (the
// raw material of docs/reliability.md), when set.
func recordResults(t *testing.T, rep *report.Report) {
	if path := os.Getenv("SHOAL_ROBUSTNESS_RESULTS"); path != "" {
		assert.NoError(t, rep.AppendRecord(path), "recording the run")
	}
}

// faultWindows are the injections, from their start to their heal.
func (e *env) faultWindows() []validate.Window {
	var out []validate.Window
	for _, inj := range e.rep.Injections {
		out = append(out, validate.Window{Name: inj.Failpoint.String(), From: inj.Start, To: inj.Healed})
	}
	return out
}

// ackedDeletes maps each database whose delete was acknowledged to that
// answer's return.
func ackedDeletes(ops []traffic.Op) map[string]time.Duration {
	out := map[string]time.Duration{}
	for _, op := range ops {
		if op.Kind == traffic.Delete && op.Outcome == traffic.OK {
			if _, ok := out[op.DB]; !ok {
				out[op.DB] = op.Return
			}
		}
	}
	return out
}

// limitFaults are the windows the limit checks extend their bound past:
// every injection, a kill -9 of the limiter or of the pipeline node (the
// broker) lengthened by limiterHandover.
func (e *env) limitFaults() []validate.Window {
	var out []validate.Window
	for _, inj := range e.rep.Injections {
		w := validate.Window{Name: inj.Failpoint.String(), From: inj.Start, To: inj.Healed}
		if inj.Failpoint.Kind == failpoint.KillRestart && (e.c.Limiter != nil && inj.Failpoint.Target == e.c.Limiter.Name ||
			e.c.Pipeline != nil && inj.Failpoint.Target == e.c.Pipeline.Name) {
			w.To += limiterHandover
		}
		out = append(out, w)
	}
	return out
}

// anyHostCrashes is crashWindows for dbs as if each lived on every host: a
// superset of their loss windows, for driveLimits (which runs before the
// hosts' indexes say where each database lives).
func (e *env) anyHostCrashes(dbs []string) map[string][]validate.Window {
	var objs []validate.Object
	for _, db := range dbs {
		for _, h := range e.c.Hosts {
			objs = append(objs, validate.Object{Host: h.Name, DatabaseUUID: db})
		}
	}
	return e.crashWindows(objs)
}

// driveLimits goes on writing to each limited account after the load has
// stopped, at the load's pace, until it certainly went over its limit and
// a write called after its deadline (limitConverge past that, and past the
// faults) has returned: so that LimitEnforced judges at least one write
// past the bound in every run, whichever faults the schedule drew, and the
// refusal's latency is measured on a steady stream of writes. (The
// deadline here counts a host kill's loss window against every database,
// a superset of the final check's: its writes are past the check's
// deadline too.) Bounded by 2 minutes.
func (e *env) driveLimits() {
	giveUp := time.Now().Add(2 * time.Minute)
	faults := e.limitFaults()
	var wg sync.WaitGroup
	for k, la := range e.limited {
		wg.Add(1)
		go func() {
			defer wg.Done()
			crashes := e.anyHostCrashes(la.DBs)
			client := 800 + k
			var tl validate.LimitTimeline
			for i := 0; time.Now().Before(giveUp); i++ {
				if i%10 == 0 && !tl.OK {
					tl = validate.Timeline(e.hist.Ops(), la.LimitedAccount, crashes, faults, limitConverge)
				}
				past := tl.OK && e.hist.Now() > tl.Deadline
				la.cl.FreeInsert(e.ctx, client, i%la.cl.Edges(), la.DBs[i%len(la.DBs)], e.load.NextValue())
				if past {
					return
				}
				time.Sleep(e.sched.load.Pace) // pacing: the limited accounts' writers
			}
			e.t.Logf("free account %s (limit %d): not certainly over its limit, or its deadline not reached, 2 minutes after the load", la.Account, la.Limit)
		}()
	}
	wg.Wait()
}

// limitChecks judges the limiter's traffic: LimitEnforced for each limited
// account, and LimitedRowsKept over the files the hosts left (objects,
// read after the final kill: the accounts' queries are refused by then).
func (e *env) limitChecks(ops []traffic.Op, objects []validate.Object) []validate.Result {
	if len(e.limited) == 0 {
		return nil
	}
	crashes := e.crashWindows(objects)
	faults := e.limitFaults()
	enforced := validate.Result{Check: "free-tier daily row limit enforced: never refused under it, every write refused within the bound once over"}
	var notes []string
	live := map[string]validate.Object{}
	for _, o := range objects {
		if o.Live() {
			live[o.DatabaseUUID] = o
		}
	}
	rows := map[string]map[int64]bool{}
	var missing []string
	for _, la := range e.limited {
		r, _ := validate.LimitEnforced(ops, la.LimitedAccount, crashes, faults, limitConverge)
		enforced.Checked += r.Checked
		enforced.Violations = append(enforced.Violations, r.Violations...)
		notes = append(notes, r.Note)
		for _, db := range la.DBs {
			o, ok := live[db]
			if !ok {
				missing = append(missing, fmt.Sprintf("%s (account %s): no live object on any host", db, la.Account))
				continue
			}
			vals, err := validate.FileValues(o)
			if err != nil {
				missing = append(missing, fmt.Sprintf("%s: reading its file: %v", db, err))
				continue
			}
			rows[db] = vals
		}
	}
	enforced.Note = strings.Join(notes, "; ")
	kept := validate.LimitedRowsKept(ops, rows)
	kept.Violations = append(kept.Violations, missing...)
	return []validate.Result{enforced, kept}
}

// crashReason is the head of the last Go crash in a process's output (its
// "fatal error:" or "panic:" line and what follows, 4 KiB), or a note that
// the output holds none: a goroutine dump is often longer than the tail a
// report quotes, and its reason is in its first lines.
func crashReason(out string) string {
	at := -1
	// The header's first line names the crash; the signal lines follow it.
	for _, markers := range [][]string{{"fatal error:", "panic:", "runtime: out of memory"}, {"unexpected fault address", "SIGSEGV", "SIGBUS", "SIGABRT"}} {
		for _, marker := range markers {
			if i := strings.LastIndex(out, marker); i > at {
				at = i
			}
		}
		if at >= 0 {
			break
		}
	}
	if at < 0 {
		return "(no Go crash header in the kept output)"
	}
	if start := strings.LastIndexByte(out[:at], '\n'); start >= 0 {
		at = start + 1
	}
	return out[at:min(len(out), at+4<<10)]
}
