package robustness

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/test/robustness/failpoint"
)

// faultsPerSchedule is how many faults one random schedule injects.
const faultsPerSchedule = 3

// randomFault draws one fault, its target and its duration from r: every
// failpoint kind the machine supports, on any member it applies to.
func randomFault(e *env, r *rand.Rand) failpoint.Failpoint {
	e.sched.fault = time.Duration(2000+r.IntN(4000)) * time.Millisecond
	host := e.c.Hosts[r.IntN(len(e.c.Hosts))]
	choices := []func() failpoint.Failpoint{
		e.isolateLeader,
		func() failpoint.Failpoint { return e.killHost(host) },
		func() failpoint.Failpoint { return e.killMember(e.c.Catalog[r.IntN(len(e.c.Catalog))]) },
		func() failpoint.Failpoint { return e.killMember(e.c.Edges[r.IntN(len(e.c.Edges))]) },
		func() failpoint.Failpoint { return failpoint.NewStopCont(host.Name, host, e.sched.fault) },
		e.splitBrain,
		e.oneWay,
		func() failpoint.Failpoint { return e.diskFull(host) },
		e.cutOffCatalog,
		e.routePurge,
		e.lostCreate,
		e.stopFollower,
		e.throttleFollower,
	}
	if e.c.Pipeline != nil { // broker, ClickHouse and consumers down at once
		choices = append(choices, func() failpoint.Failpoint { return e.killMember(e.c.Pipeline) }, e.stopClickHouse)
	}
	if e.c.ObjectStore != nil {
		mode := []string{failpoint.StoreKilled, failpoint.StoreStopped, failpoint.StoreCut}[r.IntN(3)]
		choices = append(choices, func() failpoint.Failpoint { return e.objectStoreDown(mode) },
			func() failpoint.Failpoint { return e.restoreDuringHostKill(r.IntN(2) == 0) })
	}
	return choices[r.IntN(len(choices))]()
}

// TestFaultRandomSchedules runs $SHOAL_FAULT_SCHEDULES seeded random
// schedules (`make fault`: 200), each on a fresh cluster under the load:
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
	base := scheduleOf(t)
	for i := range n {
		sched := base
		sched.load.Seed = base.load.Seed + uint64(i)
		sched.name = "random"
		sched.warmup, sched.gap = 2*time.Second, time.Second
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
