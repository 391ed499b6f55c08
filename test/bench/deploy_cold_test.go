package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/internal/benchenv"
	"github.com/shoaldb/shoal/raftmeta"
	"github.com/shoaldb/shoal/raftmeta/fsm"
	"github.com/shoaldb/shoal/test/harness"
)

// TestDeployColdQueryBench is issue 15's cold-query figure: a point SELECT
// through the edge to a database whose handle the object host has
// evicted (the file is on disk, the host must open it, read and close or
// keep it), in the deployment topology of TestDeployBench (3 voters, 3
// hosts, 1 edge, separate processes, mutual TLS, fsync on).
//
// The hosts keep coldMaxOpen handles each (--max-open). The cold phase
// reads coldDBs databases strictly round robin from one shared counter:
// a database comes back only after every other one was read, i.e. after
// about coldDBs/3 other databases were opened on its host, far more than
// the host keeps, so every read opens the file (the edge's route cache is
// warm: the cost measured is the host's). The warm phase reads 6 other
// databases (2 per host) that stay open. Phases alternate round by round,
// at 1 client (the latency of a cold query itself) and at 16 (with
// queueing on the two cores), and the report gives both (the warm one is
// the same run's baseline for the cold one).
//
// Two variants, each its own cluster: hosts without an archive, and with
// --archive-dir (history on: a cold open also attaches capture to the WAL,
// as every host with an archive configured does).
//
// Knobs: SHOAL_BENCH_ROUNDS (default 6), SHOAL_BENCH_SECONDS (each phase,
// default 3), SHOAL_BENCH_WORKERS (default 1,16), SHOAL_BENCH_PORT_BASE,
// SHOAL_BENCH_COLD_VARIANTS (off, on, or off,on: the default, one
// subtest after the other; off+on: both variants' clusters in one
// subtest, phases alternating round by round, and the same-round ratio
// of the two printed),
// SHOAL_BENCH_BASELINE_BIN (a second shoal binary: its own cluster beside
// this build's, phases alternating round by round, and the same-round
// ratio of the cold rates printed), SHOAL_BENCH_PROFILE (a directory: CPU
// profiles of this build's processes during the last round's cold phase
// at the highest client count, DIR/cold-VARIANT-N-PROCESS.pb.gz).
//
//	SHOAL_BENCH=1 go test ./test/bench -run TestDeployColdQueryBench -v -count=1 -timeout 30m
func TestDeployColdQueryBench(t *testing.T) {
	if os.Getenv("SHOAL_BENCH") == "" {
		t.Skip("SHOAL_BENCH not set: benchmark harness")
	}
	dur, err := benchenv.Duration(3 * time.Second)
	require.NoError(t, err)
	levels, err := benchenv.Workers(1, 16)
	require.NoError(t, err)
	rounds := 6
	if s := os.Getenv("SHOAL_BENCH_ROUNDS"); s != "" {
		rounds, err = strconv.Atoi(s)
		require.NoError(t, err, "SHOAL_BENCH_ROUNDS")
		require.Positive(t, rounds, "SHOAL_BENCH_ROUNDS")
	}
	ports := newPortAlloc(t)
	variants := []bool{false, true}
	interleave := false // both variants' clusters in the same rounds
	switch v := os.Getenv("SHOAL_BENCH_COLD_VARIANTS"); v {
	case "", "off,on":
	case "off":
		variants = []bool{false}
	case "on":
		variants = []bool{true}
	case "off+on":
		interleave = true
	default:
		t.Fatalf("SHOAL_BENCH_COLD_VARIANTS: %q (off, on, off,on, off+on)", v)
	}
	// SHOAL_BENCH_PROFILE=DIR: CPU profiles of this build's processes
	// during the last round's cold phase at the highest client count.
	profDir := os.Getenv("SHOAL_BENCH_PROFILE")
	if profDir != "" {
		require.NoError(t, os.MkdirAll(profDir, 0o755))
	}
	baseBin := os.Getenv("SHOAL_BENCH_BASELINE_BIN")
	if baseBin != "" {
		baseBin, err = filepath.Abs(baseBin)
		require.NoError(t, err)
	}
	variantName := func(archive bool) string {
		if archive {
			return "history=on"
		}
		return "history=off"
	}
	// Each run is one subtest whose clusters' phases alternate round by
	// round: a variant with this build and the baseline beside it, or
	// (off+on) both variants side by side, so the variants' difference is
	// a same-round figure too.
	type run struct {
		name     string
		variants []bool
	}
	var runs []run
	if interleave {
		runs = []run{{"history=off+on", []bool{false, true}}}
	} else {
		for _, archive := range variants {
			runs = append(runs, run{variantName(archive), []bool{archive}})
		}
	}
	for _, rn := range runs {
		name := rn.name
		t.Run(name, func(t *testing.T) {
			// One cluster of this build and, with SHOAL_BENCH_BASELINE_BIN,
			// one of the baseline binary beside it: their phases alternate
			// round by round, so their ratio is a same-run figure.
			type side struct {
				label          string
				variant        string // history=off or history=on
				base           bool   // the baseline binary's cluster
				d              *deployCluster
				groups         []procGroup
				coldOp, warmOp func(int, *rand.Rand) error
				sc, sw         []phaseSeries
			}
			start := func(label, bin, prefix string, archive bool) *side {
				var extra []string
				if archive {
					extra = []string{"--archive-dir", filepath.Join(t.TempDir(), "archive")}
				}
				d := startDeployClusterSpec(t, ports, deploySpec{bin: bin, prefix: prefix,
					hostArgs: append([]string{"--max-open", strconv.Itoa(coldMaxOpen)}, extra...)})
				cold, warm, bearer := d.prepareCold(t)
				hdr := map[string]string{"Authorization": bearer}
				hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
				var next atomic.Uint64
				return &side{
					label: label, variant: variantName(archive), base: bin != "", d: d,
					groups: []procGroup{{"cat", procPids(d.cats)}, {"hosts", procPids(d.hosts)}, {"edge", procPids([]*harness.Proc{d.edge})},
						{"gen", []int{os.Getpid()}}},
					coldOp: func(_ int, rng *rand.Rand) error {
						u := cold[next.Add(1)%uint64(len(cold))]
						return d.post(hc, d.edgeDB+"/"+u+"/query", hdr, pointSelect(rng))
					},
					warmOp: func(_ int, rng *rand.Rand) error {
						return d.post(hc, d.edgeDB+"/"+warm[rng.IntN(len(warm))]+"/query", hdr, pointSelect(rng))
					},
					sc: make([]phaseSeries, len(levels)), sw: make([]phaseSeries, len(levels)),
				}
			}
			var sides []*side
			for i, archive := range rn.variants {
				label, blabel := "this build", "baseline"
				if len(rn.variants) > 1 {
					label, blabel = label+", "+variantName(archive), blabel+", "+variantName(archive)
				}
				prefix := strings.Repeat("v", i) // distinct process names per cluster
				sides = append(sides, start(label, "", prefix, archive))
				if baseBin != "" {
					sides = append(sides, start(blabel, baseBin, "b"+prefix, archive))
				}
			}
			for r := range rounds {
				for i, workers := range levels {
					for k := range sides {
						sd := sides[(k+r)%len(sides)] // the first side rotates too
						cold := func() { sd.sc[i].add(t, sd.groups, workers, dur, sd.coldOp) }
						// This build's clusters only (with a baseline, the
						// side that runs first alternates round by round).
						if profDir != "" && !sd.base && r == rounds-1 && i == len(levels)-1 {
							cold = func() {
								wait := sd.d.profile(t, profDir, fmt.Sprintf("cold-%s-%d", sd.variant, workers), dur)
								sd.sc[i].add(t, sd.groups, workers, dur, sd.coldOp)
								wait()
							}
						}
						if r%2 == 0 {
							cold()
							sd.sw[i].add(t, sd.groups, workers, dur, sd.warmOp)
						} else {
							sd.sw[i].add(t, sd.groups, workers, dur, sd.warmOp)
							cold()
						}
					}
				}
				t.Logf("round %d/%d done, load average %s", r+1, rounds, loadAvg())
			}
			t.Logf("%s; %d hosts keeping %d handles each, %d cold databases read round robin, 6 warm; %d rounds of %s per phase; %s",
				name, 3, coldMaxOpen, coldDBs, rounds, dur, machine())
			t.Logf("%-46s %3s %8s %17s %8s %8s %17s %8s | %6s %6s %6s %6s | load 1m", "path", "n", "ops/s", "(min–max)", "p50 ms", "p99 ms", "cold/warm rate", "p99.9", "cat", "hosts", "edge", "gen")
			for _, sd := range sides {
				for i, n := range levels {
					t.Logf("%-46s %3d %s %8.2f | %s", "cold handle, "+sd.label, n, sd.sc[i].row(&sd.sw[i]), harness.Millis(sd.sc[i].lat.Pct(.999)), sd.sc[i].cpuRow())
					t.Logf("%-46s %3d %s %8.2f | %s", "warm handle, "+sd.label, n, sd.sw[i].row(nil), harness.Millis(sd.sw[i].lat.Pct(.999)), sd.sw[i].cpuRow())
				}
			}
			if baseBin != "" {
				for k := 0; k+1 < len(sides); k += 2 {
					for i, n := range levels {
						t.Logf("%-46s %3d %s", "cold, "+sides[k].label+" / baseline (same rounds)", n, sides[k].sc[i].row(&sides[k+1].sc[i]))
					}
				}
			}
			if len(rn.variants) > 1 {
				off, on := sides[0], sides[len(sides)/2] // this build's two variants
				for i, n := range levels {
					t.Logf("%-46s %3d %s", "cold, history=off / history=on (same rounds)", n, off.sc[i].row(&on.sc[i]))
					t.Logf("%-46s %3d %s", "warm, history=off / history=on (same rounds)", n, off.sw[i].row(&on.sw[i]))
				}
			}
		})
	}
}

// coldMaxOpen is the hosts' --max-open in TestDeployColdQueryBench, coldDBs the
// databases its cold phase reads (about 70 per host: each comes back after
// ~70 others were opened on its host, past the 16 it keeps).
const (
	coldMaxOpen = 16
	coldDBs     = 210
)

func procPids(ps []*harness.Proc) []int {
	var out []int
	for _, p := range ps {
		out = append(out, p.Cmd.Process.Pid)
	}
	return out
}

// prepareCold creates an account, coldDBs + 6 databases of benchRows rows
// through the edge, and returns the cold and warm UUIDs and the bearer.
func (d *deployCluster) prepareCold(t *testing.T) (cold, warm []string, bearer string) {
	ctx := context.Background()
	limits := fsm.Limits{MaxDatabases: 1 << 40, MaxStorageBytes: 1 << 50, MaxDatabaseBytes: 1 << 30}
	_, err := d.raw.CreateAccount(ctx, fsm.CreateAccount{ID: "bench", Name: "bench", Tier: fsm.TierPaid, Limits: limits})
	require.NoError(t, err)
	a := harness.Call(t, http.MethodPost, d.edgeURL+"/admin/v1/accounts/bench/tokens", "Bearer "+d.admin, map[string]any{"name": "bench"})
	require.Equal(t, http.StatusOK, a.Status, "%s", a.Raw)
	var tok struct{ Token string }
	require.NoError(t, json.Unmarshal(a.Result, &tok))
	bearer = "Bearer " + tok.Token
	d.edgeDB = d.edgeURL + "/client/v4/accounts/bench/d1/database"
	fill := fmt.Sprintf(`{"batch":[{"sql":"CREATE TABLE kv (id INTEGER PRIMARY KEY, v TEXT)"},{"sql":"WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM n WHERE i < %d) INSERT INTO kv SELECT i, 'value-' || i FROM n"}]}`, benchRows)
	uuids := make([]string, coldDBs+6)
	var failed atomic.Value
	harness.Concurrently(len(uuids), 8, func(i int) {
		a := harness.Call(t, http.MethodPost, d.edgeDB, bearer, map[string]any{"name": fmt.Sprintf("cold-%03d", i)})
		if a.Status != http.StatusOK {
			failed.CompareAndSwap(nil, fmt.Errorf("create: %d %s", a.Status, a.Raw))
			return
		}
		var db struct{ UUID string }
		if err := json.Unmarshal(a.Result, &db); err != nil {
			failed.CompareAndSwap(nil, err)
			return
		}
		if err := d.post(harness.Client(), d.edgeDB+"/"+db.UUID+"/query", map[string]string{"Authorization": bearer}, []byte(fill)); err != nil {
			failed.CompareAndSwap(nil, err)
			return
		}
		uuids[i] = db.UUID
	})
	require.Nil(t, failed.Load(), "creating the databases")
	// Warm: two per host (placement is the edge's; pick by the catalog row).
	perHost := map[string]int{}
	for _, u := range uuids {
		row, err := d.raw.Database(ctx, u, raftmeta.LinearizableRead())
		require.NoError(t, err)
		if perHost[row.HostID] < 2 && len(warm) < 6 {
			perHost[row.HostID]++
			warm = append(warm, u)
			continue
		}
		cold = append(cold, u)
	}
	require.Len(t, warm, 6, "warm databases per host: %v", perHost)
	rand.Shuffle(len(cold), func(i, j int) { cold[i], cold[j] = cold[j], cold[i] })
	return cold, warm, bearer
}
