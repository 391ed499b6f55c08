package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/test/harness"
)

// TestDeployIdleBench measures the fixed background CPU of the deploy
// bench's cluster (TestDeployBench's: 3 catalog voters, 3 object hosts, the
// frame edge and the HTTP-forwarding edge, separate processes, mutual TLS)
// with no traffic at all: what every write of the raw path pays on top of
// its own work (issue 15's catalog CPU per write). Each process's
// user+system CPU (/proc/PID/stat) over SHOAL_BENCH_IDLE_SECONDS (10) per
// round, SHOAL_BENCH_ROUNDS rounds (6), reported in ms of CPU per second
// (median, min–max). With SHOAL_BENCH_BASELINE_BIN a second cluster of that
// build idles beside it in the same windows, so the two are compared round
// by round. SHOAL_BENCH_PROFILE=DIR takes a CPU profile of every process
// over the last round (idle-PROCESS.pb.gz). Run with:
//
//	SHOAL_BENCH=1 go test ./test/bench -run TestDeployIdleBench -v -count=1
func TestDeployIdleBench(t *testing.T) {
	if os.Getenv("SHOAL_BENCH") == "" {
		t.Skip("set SHOAL_BENCH=1")
	}
	secs := envInt(t, "SHOAL_BENCH_IDLE_SECONDS", 10)
	rounds := envInt(t, "SHOAL_BENCH_ROUNDS", 6)
	profDir := os.Getenv("SHOAL_BENCH_PROFILE")
	if profDir != "" {
		require.NoError(t, os.MkdirAll(profDir, 0o755))
	}
	ports := newPortAlloc(t)
	clusters := []*deployCluster{startDeployClusterSpec(t, ports, deploySpec{})}
	names := []string{"this build"}
	if bin := os.Getenv("SHOAL_BENCH_BASELINE_BIN"); bin != "" {
		abs, err := filepath.Abs(bin)
		require.NoError(t, err)
		clusters = append(clusters, startDeployClusterSpec(t, ports, deploySpec{bin: abs, prefix: "b"}))
		names = append(names, "baseline")
	}
	// Settle: joins, registrations, the level check, the first drains.
	time.Sleep(5 * time.Second)
	type proc struct {
		cluster int
		name    string
		pid     int
	}
	var procs []proc
	for ci, d := range clusters {
		all := append(append(append([]*harness.Proc{}, d.cats...), d.hosts...), d.edge)
		if d.edgeH != nil {
			all = append(all, d.edgeH)
		}
		for _, p := range all {
			procs = append(procs, proc{ci, p.Name, p.Cmd.Process.Pid})
		}
	}
	perRound := make([][]float64, len(procs)) // ms of CPU per second, per round
	for r := range rounds {
		stop := func() {}
		if profDir != "" && r == rounds-1 {
			var stops []func()
			for ci, d := range clusters {
				stops = append(stops, d.profile(t, profDir, fmt.Sprintf("idle%d", ci), time.Duration(secs)*time.Second))
			}
			stop = func() {
				for _, s := range stops {
					s()
				}
			}
		}
		before := make([]int64, len(procs))
		for i, p := range procs {
			before[i] = cpuTicks(t, p.pid)
		}
		start := time.Now()
		// The measurement window itself: the cluster idles while its CPU is counted.
		time.Sleep(time.Duration(secs) * time.Second)
		el := time.Since(start).Seconds()
		for i, p := range procs {
			perRound[i] = append(perRound[i], float64(cpuTicks(t, p.pid)-before[i])*10/el)
		}
		stop()
		t.Logf("round %d/%d, load average %s", r+1, rounds, loadAvg())
	}
	t.Logf("idle CPU, ms per second (median, min–max over %d rounds of %d s); %s", rounds, secs, machine())
	for ci := range clusters {
		var catSum, allSum []float64
		for r := range rounds {
			var c, a float64
			for i, p := range procs {
				if p.cluster != ci {
					continue
				}
				a += perRound[i][r]
				if isCatalogProc(p.name) {
					c += perRound[i][r]
				}
			}
			catSum = append(catSum, c)
			allSum = append(allSum, a)
		}
		for i, p := range procs {
			if p.cluster != ci {
				continue
			}
			m, lo, hi := medMinMax(perRound[i])
			t.Logf("%-10s %-4s %6.1f (%.1f–%.1f)", names[ci], p.name, m, lo, hi)
		}
		m, lo, hi := medMinMax(catSum)
		t.Logf("%-10s catalog (3 voters) %6.1f (%.1f–%.1f)", names[ci], m, lo, hi)
		m, lo, hi = medMinMax(allSum)
		t.Logf("%-10s all processes      %6.1f (%.1f–%.1f)", names[ci], m, lo, hi)
	}
	if len(clusters) == 2 {
		// Same-window ratios of the catalogs' idle CPU.
		var ratios []float64
		for r := range rounds {
			var a, b float64
			for i, p := range procs {
				if !isCatalogProc(p.name) {
					continue
				}
				if p.cluster == 0 {
					a += perRound[i][r]
				} else {
					b += perRound[i][r]
				}
			}
			if b > 0 {
				ratios = append(ratios, a/b)
			}
		}
		m, lo, hi := medMinMax(ratios)
		t.Logf("catalog idle CPU, this build ÷ baseline, same windows: %.2f× (%.2f–%.2f)", m, lo, hi)
	}
}

// isCatalogProc says whether a deploy cluster's process name (c1, bc2, h1,
// be1…) is a catalog voter's.
func isCatalogProc(name string) bool {
	return strings.HasPrefix(strings.TrimPrefix(name, "b"), "c")
}
