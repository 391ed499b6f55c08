package test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/test/harness"
)

// requireRuntimeMetrics checks that the /metrics page at url has the
// collectors every role carries: shoal_build_info (= 1, with version and
// commit labels), the Go runtime's and the process's.
func requireRuntimeMetrics(t *testing.T, role, url string) {
	t.Helper()
	m := harness.ScrapeMetrics(t, url)
	build := ""
	for k, v := range m {
		if strings.HasPrefix(k, "shoal_build_info{") {
			build = k
			assert.Equal(t, 1.0, v, "%s: %s", role, k)
		}
	}
	if assert.NotEmpty(t, build, "%s: no shoal_build_info at %s", role, url) {
		assert.Contains(t, build, `version="`, role)
		assert.Contains(t, build, `commit="`, role)
	}
	assert.Contains(t, m, "go_goroutines", "%s: no Go collector", role)
	assert.Contains(t, m, "process_cpu_seconds_total", "%s: no process collector", role)
}

// jsonLines parses every line of a process's stderr as one JSON object (the
// --log-format json contract) and returns them.
func jsonLines(t *testing.T, role, out string) []map[string]any {
	t.Helper()
	var recs []map[string]any
	for _, ln := range strings.Split(strings.TrimSpace(out), "\n") {
		if ln == "" {
			continue
		}
		var rec map[string]any
		if !assert.NoError(t, json.Unmarshal([]byte(ln), &rec), "%s: a line that is not JSON: %q", role, ln) {
			continue
		}
		assert.Contains(t, rec, "time", role)
		assert.Contains(t, rec, "level", role)
		assert.Contains(t, rec, "msg", role)
		recs = append(recs, rec)
	}
	return recs
}

// TestRolesObservability: every role (catalog, pipeline, object host,
// edge, limiter) serves the Go, process and build_info collectors, and a
// role started with --log-format json writes nothing but JSON lines, the
// edge's access log among them.
func TestRolesObservability(t *testing.T) {
	bin := shoalBin.Path(t)
	c := harness.NewPipelineCluster(t, bin)

	limAddr := harness.FreeAddr(t)
	lim := harness.StartProc(t, bin, "limiter", "limiter", "serve", "--insecure", "--http-addr", limAddr,
		"--catalog", c.CatAddr, "--kafka-brokers", c.BrokerAddr, "--clickhouse-dsn", "clickhouse://default:@"+c.CH.Addr()+"/shoal",
		"--log-format", "json", "--log-level", "info")
	harness.WaitHTTP200(t, "http://"+limAddr+"/healthz", 60*time.Second, "limiter never healthy: %s", lim.Log)
	edgeAddr := harness.FreeAddr(t)
	edge := harness.StartProc(t, bin, "e2", "edge", "serve", "--insecure", "--http-addr", edgeAddr, "--dir", filepath.Join(c.Dir, "e2"),
		"--region", "weur", "--catalog", c.CatAddr, "--admin-token", c.Admin, "--log-format", "json", "--log-level", "info")
	harness.WaitHTTP200(t, "http://"+edgeAddr+"/healthz", 30*time.Second, "edge never healthy: %s", edge.Log)

	for role, url := range map[string]string{
		"catalog": "http://" + c.CatAddr + "/metrics", "pipeline": c.PipeURL + "/metrics", "host": c.HostURL + "/metrics",
		"edge": c.EdgeURL + "/metrics", "limiter": "http://" + limAddr + "/metrics",
	} {
		requireRuntimeMetrics(t, role, url)
	}

	// One request on the JSON edge: its access line.
	a := harness.Call(t, http.MethodPost, "http://"+edgeAddr+"/admin/v1/accounts", "Bearer "+c.Admin, map[string]any{"name": "obs"})
	require.Equal(t, http.StatusOK, a.Status, "%s", a.Raw)
	unknown := harness.Call(t, http.MethodGet, "http://"+edgeAddr+"/client/v4/nowhere", "", nil)
	require.Equal(t, http.StatusNotFound, unknown.Status)
	m := harness.ScrapeMetrics(t, "http://"+edgeAddr+"/metrics")
	assert.Equal(t, 1.0, m[`shoal_edge_requests_total{code="7000",endpoint="no_route",status="404"}`], "unknown routes are counted")

	var access []map[string]any
	require.Eventually(t, func() bool {
		access = nil
		for _, r := range jsonLines(t, "edge", edge.Log.String()) {
			if r["msg"] == "request" {
				access = append(access, r)
			}
		}
		return len(access) >= 2
	}, 10*time.Second, 50*time.Millisecond, "no access lines: %s", edge.Log)
	assert.Equal(t, "/admin/v1/accounts", access[0]["route"])
	assert.EqualValues(t, 200, access[0]["status"])
	assert.Equal(t, "no_route", access[1]["route"])
	assert.EqualValues(t, 7000, access[1]["code"])
	assert.NotContains(t, edge.Log.String(), c.Admin, "no token in the log")

	lines := jsonLines(t, "limiter", lim.Log.String())
	assert.NotEmpty(t, lines, "the limiter logs at info")
}

// TestDevObservability: `shoal dev --log-format json` writes only JSON
// lines on stderr (raft's own lines included, through slog), and its edge
// serves the runtime collectors and build_info.
func TestDevObservability(t *testing.T) {
	bin := shoalBin.Path(t)
	addr := harness.FreeAddr(t)
	out, errb := &harness.SyncWriter{}, &harness.SyncWriter{}
	cmd := exec.Command(bin, "dev", "--dir", filepath.Join(t.TempDir(), "dev"), "--addr", addr,
		"--base-port", fmt.Sprint(harness.DevBasePort(t)), "--log-format", "json", "--log-level", "info", "--quiet=false")
	cmd.Stdout, cmd.Stderr = out, errb
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	require.Eventually(t, func() bool {
		return strings.Contains(out.String(), "Press Ctrl-C")
	}, 90*time.Second, 100*time.Millisecond, "shoal dev never became ready: %s", errb)

	requireRuntimeMetrics(t, "dev", "http://"+addr+"/metrics")
	recs := jsonLines(t, "dev", errb.String())
	raft := 0
	for _, r := range recs {
		if r["component"] == "raft" {
			raft++
		}
	}
	assert.Positive(t, raft, "raft's lines (at info with --quiet=false) come through slog as JSON: %s", errb)
}
