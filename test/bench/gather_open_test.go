package bench

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/internal/benchenv"
	"github.com/shoaldb/shoal/internal/ids"
	"github.com/shoaldb/shoal/raftmeta"
	"github.com/shoaldb/shoal/raftmeta/fsm"
	"github.com/shoaldb/shoal/test/harness"
)

// TestGatherOpenLoop prices the catalog client's gathering wait
// (raftmeta.WithWriteGather) for independent writers: one catalog of three
// `shoal raftmeta serve` processes (loopback TCP, fsync on), four clients
// of this build that differ only in gathering — off; after every send of
// two or more (WithWriteGatherAdaptive(false), the rule before it) with a
// 500 µs and a 1 ms bound; and the default (adaptive: only while recent
// gathers filled, 1 ms) — each driven in turn, round by round (the order
// rotating), by an open loop of Poisson arrivals (runOpen: latency from
// each arrival's scheduled time, at most SHOAL_BENCH_WORKERS in flight).
// A closed loop (TestDeployBench) never shows the cost: its callers come
// back at once. Printed per rate and client: pooled p50 / p90 / p99,
// commands per entry, catalog CPU per write, and the median (min–max) of
// the same-round ratios of p50 to the gather-off client's, and the
// client's gathering counters (raftmeta.GatherStats).
//
//	SHOAL_BENCH=1 go test ./test/bench -run TestGatherOpenLoop -v -count=1
//
// SHOAL_BENCH_OPEN_RATES (default 500,2000 writes/s), SHOAL_BENCH_ROUNDS
// (6), SHOAL_BENCH_SECONDS (3), SHOAL_BENCH_WORKERS (64).
func TestGatherOpenLoop(t *testing.T) {
	if os.Getenv("SHOAL_BENCH") == "" {
		t.Skip("set SHOAL_BENCH=1")
	}
	dur, err := benchenv.Duration(3 * time.Second)
	require.NoError(t, err)
	workers, err := benchenv.Workers(64)
	require.NoError(t, err)
	rates := []float64{500, 2000}
	if s := os.Getenv("SHOAL_BENCH_OPEN_RATES"); s != "" {
		rates = nil
		for _, f := range strings.Split(s, ",") {
			r, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
			require.NoError(t, err, "SHOAL_BENCH_OPEN_RATES")
			rates = append(rates, r)
		}
	}
	rounds := 6
	if s := os.Getenv("SHOAL_BENCH_ROUNDS"); s != "" {
		rounds, err = strconv.Atoi(s)
		require.NoError(t, err, "SHOAL_BENCH_ROUNDS")
	}
	procs, addrs := startRaftmetaProcs(t)
	ctx := context.Background()
	admin, err := raftmeta.NewClient(addrs)
	require.NoError(t, err)
	defer admin.Close()
	createBenchAccount(t, admin)

	type variant struct {
		name string
		opts []raftmeta.ClientOption
	}
	variants := []variant{
		{"gather off", []raftmeta.ClientOption{raftmeta.WithWriteGather(0)}},
		{"always gather, 500 µs bound", []raftmeta.ClientOption{raftmeta.WithWriteGather(500 * time.Microsecond), raftmeta.WithWriteGatherAdaptive(false)}},
		{"always gather, 1 ms bound", []raftmeta.ClientOption{raftmeta.WithWriteGatherAdaptive(false)}},
		{"default (adaptive, 1 ms bound)", nil},
	}
	clients := make([]*raftmeta.Client, len(variants))
	for i, v := range variants {
		clients[i], err = raftmeta.NewClient(addrs, append([]raftmeta.ClientOption{raftmeta.WithCacheTTL(0)}, v.opts...)...)
		require.NoError(t, err)
		defer clients[i].Close()
	}
	var seq atomic.Int64
	type cell struct {
		lat           harness.Latencies
		p50           []float64 // per round, ms
		cpu, ops      float64
		entries, cmds float64
		gs            raftmeta.GatherStats // summed over rounds
	}
	cells := map[string]*cell{}
	key := func(r float64, v int) string { return fmt.Sprintf("%.0f/%d", r, v) }
	n := workers[0]
	for round := range rounds {
		for _, rate := range rates {
			for k := range variants {
				v := (k + round) % len(variants) // the order rotates every round
				c := cells[key(rate, v)]
				if c == nil {
					c = &cell{}
					cells[key(rate, v)] = c
				}
				cl := clients[v]
				cpu0 := procsCPU(t, procs)
				m0 := leaderFSMCounters(t, addrs)
				g0 := cl.GatherStats()
				l, _ := runOpen(t, n, dur, rate, func(_ int, _ *rand.Rand) error {
					_, err := cl.CreateDatabase(ctx, fsm.CreateDatabase{UUID: ids.New(), AccountID: "bench",
						Name: fmt.Sprintf("db-%d", seq.Add(1)), ObjectID: ids.New(), HostID: "h1", Region: "weur",
						ReadReplication: fsm.ReadReplicationDisabled})
					return err
				})
				m1 := leaderFSMCounters(t, addrs)
				g1 := cl.GatherStats()
				c.gs.Eligible += g1.Eligible - g0.Eligible
				c.gs.Waited += g1.Waited - g0.Waited
				c.gs.Probes += g1.Probes - g0.Probes
				c.gs.Filled += g1.Filled - g0.Filled
				c.cpu += float64((procsCPU(t, procs) - cpu0).Microseconds())
				c.ops += float64(l.Len())
				c.entries += m1[0] - m0[0]
				c.cmds += m1[1] - m0[1]
				for _, d := range l.All() {
					c.lat.Add(d)
				}
				c.p50 = append(c.p50, harness.Millis(l.Pct(.5)))
			}
		}
		t.Logf("round %d/%d done, load average %s", round+1, rounds, loadAvg())
	}
	t.Logf("3 raftmeta processes, loopback, fsync on; open loop, %d in flight at most, %d rounds of %s; %s", n, rounds, dur, machine())
	for _, rate := range rates {
		off := cells[key(rate, 0)]
		for v, vr := range variants {
			c := cells[key(rate, v)]
			var ratios []float64
			for i := range c.p50 {
				ratios = append(ratios, c.p50[i]/off.p50[i])
			}
			med, lo, hi := medMinMax(ratios)
			perEntry := 0.0
			if c.entries > 0 {
				perEntry = c.cmds / c.entries
			}
			t.Logf("%5.0f writes/s  %-32s p50 %6.2f  p90 %6.2f  p99 %7.2f ms | commands per entry %5.1f | catalog CPU %4.0f µs/write | p50 ÷ gather off %.2f× (%.2f–%.2f) | gathers: eligible %d waited %d (probes %d) filled %d",
				rate, vr.name, harness.Millis(c.lat.Pct(.5)), harness.Millis(c.lat.Pct(.9)), harness.Millis(c.lat.Pct(.99)),
				perEntry, c.cpu/c.ops, med, lo, hi, c.gs.Eligible, c.gs.Waited, c.gs.Probes, c.gs.Filled)
		}
	}
}

// leaderFSMCounters sums, over the voters, the entries and commands their
// FSMs applied (shoal_raftmeta_fsm_batch_entries_sum and
// _commands_sum): every voter applies every entry, so the ratio is the
// commands per entry.
func leaderFSMCounters(t *testing.T, addrs []string) [2]float64 {
	var out [2]float64
	for _, a := range addrs {
		resp, err := http.Get("http://" + a + "/metrics")
		require.NoError(t, err)
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		v := metricValues(t, b, "shoal_raftmeta_fsm_batch_entries_sum", "shoal_raftmeta_fsm_batch_commands_sum")
		out[0] += v[0]
		out[1] += v[1]
	}
	return out
}

// metricValues reads the unlabelled samples names from a Prometheus text
// exposition (0 for a name it does not hold).
func metricValues(t *testing.T, b []byte, names ...string) []float64 {
	out := make([]float64, len(names))
	for _, line := range strings.Split(string(b), "\n") {
		for i, name := range names {
			if rest, ok := strings.CutPrefix(line, name+" "); ok {
				v, err := strconv.ParseFloat(rest, 64)
				require.NoError(t, err)
				out[i] = v
			}
		}
	}
	return out
}
