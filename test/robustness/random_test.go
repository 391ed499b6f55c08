package robustness

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/test/robustness/failpoint"
)

// faultsPerSchedule is how many faults one random schedule injects.
const faultsPerSchedule = 3

// randomFault draws one fault, its target and its duration from r: every
// failpoint kind the machine supports, on any member it applies to
// ($SHOAL_FAULT_KINDS, a comma-separated list of failpoint kinds, narrows
// the draw to those kinds: e.g. to exercise a new failpoint, or to rerun a
// family of faults with many seeds).
func randomFault(e *env, r *rand.Rand) failpoint.Failpoint {
	e.sched.fault = time.Duration(2000+r.IntN(4000)) * time.Millisecond
	host := e.c.Hosts[r.IntN(len(e.c.Hosts))]
	type choice struct {
		kind failpoint.Kind
		f    func() failpoint.Failpoint
	}
	choices := []choice{
		{failpoint.PartitionNode, e.isolateLeader},
		{failpoint.KillRestart, func() failpoint.Failpoint { return e.killHost(host) }},
		{failpoint.KillRestart, func() failpoint.Failpoint { return e.killMember(e.c.Catalog[r.IntN(len(e.c.Catalog))]) }},
		{failpoint.KillRestart, func() failpoint.Failpoint { return e.killMember(e.c.Edges[r.IntN(len(e.c.Edges))]) }},
		{failpoint.StopCont, func() failpoint.Failpoint { return failpoint.NewStopCont(host.Name, host, e.sched.fault) }},
		{failpoint.SplitBrain, e.splitBrain},
		{failpoint.OneWay, e.oneWay},
		{failpoint.DiskFull, func() failpoint.Failpoint { return e.diskFull(host) }},
		{failpoint.CatalogCutOff, e.cutOffCatalog},
		{failpoint.CatalogCutOff, e.cutOffCatalogColdEdge},
		{failpoint.RoutePurge, e.routePurge},
		{failpoint.LostCreate, e.lostCreate},
		{failpoint.StopCont, e.stopFollower},
		{failpoint.Throttle, e.throttleFollower},
		{failpoint.FollowerLag, e.followerLag},
		{failpoint.PacketLoss, func() failpoint.Failpoint {
			members := e.c.Members()
			return e.packetLoss(members[r.IntN(len(members))], 5+r.IntN(26))
		}},
	}
	if e.c.Pipeline != nil { // broker, ClickHouse and consumers down at once
		choices = append(choices,
			choice{failpoint.KillRestart, func() failpoint.Failpoint { return e.killMember(e.c.Pipeline) }},
			choice{failpoint.StopCont, e.stopClickHouse},
			choice{failpoint.ConsumerStopped, e.consumerStopped})
		if e.c.Limiter != nil {
			choices = append(choices, choice{failpoint.KillRestart, func() failpoint.Failpoint { return e.killMember(e.c.Limiter) }})
		}
	}
	if e.c.ObjectStore != nil {
		mode := []string{failpoint.StoreKilled, failpoint.StoreStopped, failpoint.StoreCut}[r.IntN(3)]
		faulty := []string{failpoint.StoreErrors, failpoint.StoreSlow}[r.IntN(2)]
		stopStore := r.IntN(2) == 0
		choices = append(choices,
			choice{failpoint.ObjectStoreDown, func() failpoint.Failpoint { return e.objectStoreDown(mode) }},
			choice{failpoint.ObjectStoreFaulty, func() failpoint.Failpoint { return e.objectStoreFaulty(faulty) }},
			choice{failpoint.ObjectStoreLoses, func() failpoint.Failpoint { return e.objectStoreLoses(1+r.IntN(4), r.Uint64()) }},
			choice{failpoint.KillRestart, func() failpoint.Failpoint { return e.restoreDuringHostKill(stopStore) }})
	}
	// A catalog restore (an operator rewinding the catalog) at most once
	// per schedule: the checks split the catalog's history at it.
	if e.restore == nil {
		choices = append(choices, choice{failpoint.CatalogRestore, e.catalogRestore})
	}
	if only := os.Getenv("SHOAL_FAULT_KINDS"); only != "" {
		want := map[failpoint.Kind]bool{}
		for _, k := range strings.Split(only, ",") {
			want[failpoint.Kind(strings.TrimSpace(k))] = true
		}
		kept := choices[:0]
		for _, c := range choices {
			if want[c.kind] {
				kept = append(kept, c)
			}
		}
		if len(kept) == 0 && e.restore != nil && want[failpoint.CatalogRestore] {
			// Only catalog-restore asked for, and this schedule has had
			// its one: draw from every other kind.
			e.t.Logf("catalog-restore already drawn in this schedule: drawing another kind")
			kept = choices
		}
		require.NotEmpty(e.t, kept, "SHOAL_FAULT_KINDS=%s names no failpoint kind this topology has", only)
		choices = kept
	}
	return choices[r.IntN(len(choices))].f()
}

// TestFaultRandomSchedules runs $SHOAL_FAULT_SCHEDULES seeded random
// schedules (`make fault`: 200, over two processes), each on a fresh cluster under the load:
// faultsPerSchedule faults drawn by randomFault, then every check. Schedule
// i's seed is the run's seed + i, printed in its name: to rerun one,
// SHOAL_ROBUSTNESS_SEED=<its seed> SHOAL_FAULT_SCHEDULES=1. Without
// SHOAL_FAULT_SCHEDULES it does not run (`make test` runs the fixed
// scenarios instead).
func TestFaultRandomSchedules(t *testing.T) {
	n := 0
	if s := os.Getenv("SHOAL_FAULT_SCHEDULES"); s != "" {
		var err error
		n, err = strconv.Atoi(s)
		require.NoError(t, err, "SHOAL_FAULT_SCHEDULES")
	}
	if n == 0 {
		t.Skip("random schedules run under `make fault` (SHOAL_FAULT_SCHEDULES=N); make test runs the fixed scenarios")
	}
	// SHOAL_FAULT_SCHEDULE_FIRST numbers the first schedule (default 0):
	// scripts/fault.sh splits a run over concurrent processes, each with
	// the run's seed and its own range of schedules.
	first := 0
	if s := os.Getenv("SHOAL_FAULT_SCHEDULE_FIRST"); s != "" {
		var err error
		first, err = strconv.Atoi(s)
		require.NoError(t, err, "SHOAL_FAULT_SCHEDULE_FIRST")
		require.GreaterOrEqual(t, first, 0, "SHOAL_FAULT_SCHEDULE_FIRST")
	}
	base := scheduleOf(t)
	for i := first; i < first+n; i++ {
		sched := base
		sched.load.Seed = base.load.Seed + uint64(i)
		sched.name = "random"
		sched.warmup, sched.gap = 2*time.Second, time.Second
		// A random schedule lasts ~20 s whatever SHOAL_FAULT says: the
		// long schedule's restore pace (one per register every 80 s, to
		// stay within the hosts' rate limit over a long run) would leave
		// it without a single restore, and every run failed the "restore
		// acknowledged" floor (make fault did, 24 of 24 schedules).
		sched.load.RestoreEvery = 6 * time.Second
		name := fmt.Sprintf("schedule-%03d-seed-%d", i, sched.load.Seed)
		t.Run(name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(sched.load.Seed, 0xfa17))
			scenario(t, "TestFaultRandomSchedules/"+name, sched, func(e *env) {
				for range faultsPerSchedule {
					e.run(randomFault(e, r))
				}
			})
		})
	}
}
