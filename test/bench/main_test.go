// Package bench holds the benchmark harnesses that run whole clusters, behind
// `make bench` and docs/benchmarks.md: Shoal as deployed — catalog voters,
// object hosts and an edge as separate processes over mutual TLS — against a
// 3-member etcd in the same run (TestDeployBench), the edge against in-process SQLite
// (TestEdgeBench), catalog creates on three `shoal raftmeta serve`
// processes (TestRaftmetaBenchProcesses), the catalog's memory, restart
// and background CPU at a million databases (TestCatalogScaleBench), the background plane's query-path
// cost and burst lag (TestBenchPipeline*, BenchmarkHostRecordUsage) and the
// limiter's figures (TestFigure*). Each harness skips unless SHOAL_BENCH is
// set (the limiter figures: SHOAL_BENCH=1), so `make test` only compiles
// them; they print figures with a same-run baseline and assert no timing.
// The clusters they run come from test/harness, shared with package test.
package bench

import (
	"os"
	"testing"

	"github.com/shoaldb/shoal/test/harness"
)

// shoalBin is the shoal binary the harnesses of this package run as real
// processes, built once per test process (harness.Binary).
var shoalBin harness.Binary

func TestMain(m *testing.M) {
	code := m.Run()
	shoalBin.Remove()
	os.Exit(code)
}
