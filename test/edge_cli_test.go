package test

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/internal/binding"
	"github.com/shoaldb/shoal/objecthost"
	"github.com/shoaldb/shoal/raftmeta"
	"github.com/shoaldb/shoal/test/harness"
)

// TestEdgeCLI runs `shoal edge serve` as a real process against an
// in-process catalog node and object host, and drives it with `shoal admin`.
func TestEdgeCLI(t *testing.T) {
	bin := shoalBin.Path(t)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	node, err := raftmeta.NewNode(raftmeta.Config{ID: "c0", Dir: t.TempDir(), RaftAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
		Bootstrap: true, Logger: quiet, RaftLogOutput: io.Discard})
	require.NoError(t, err)
	t.Cleanup(func() { _ = node.Close() })
	require.Eventually(t, node.IsLeader, 20*time.Second, 20*time.Millisecond)
	const bindingSecret = "cli-binding-secret-0123456789"
	keys, err := binding.KeyringFromSecrets(bindingSecret)
	require.NoError(t, err)
	cl, err := raftmeta.NewClient([]string{node.HTTPAddr()})
	require.NoError(t, err)
	ln, addr := harness.Listen(t)
	h, err := objecthost.Open(objecthost.Config{ID: "h0", Dir: t.TempDir(), Address: addr, Region: "weur",
		Capacity: 100, Catalog: objecthost.RaftmetaCatalog{C: cl}, Bindings: keys, Logger: quiet})
	require.NoError(t, err)
	t.Cleanup(func() { _ = h.Close() })
	harness.Serve(t, ln, h.Handler())

	edgeAddr := harness.FreeAddr(t)
	var logs bytes.Buffer
	srv := exec.Command(bin, "edge", "serve", "--insecure", "--http-addr", edgeAddr, "--dir", t.TempDir(), "--region", "weur",
		"--catalog", node.HTTPAddr(), "--log-level", "warn")
	srv.Env = append(os.Environ(), "SHOAL_ADMIN_TOKEN=cli-admin", "SHOAL_BINDING_KEY="+bindingSecret)
	srv.Stdout, srv.Stderr = &logs, &logs
	require.NoError(t, srv.Start())
	exited := make(chan error, 1)
	go func() { exited <- srv.Wait() }()
	t.Cleanup(func() {
		_ = srv.Process.Kill()
	})
	edgeURL := "http://" + edgeAddr
	require.Eventually(t, func() bool {
		resp, err := http.Get(edgeURL + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	}, 20*time.Second, 50*time.Millisecond, "edge never healthy: %s", &logs)
	// The edge re-executed itself in place (same PID) with the runtime's
	// monitor kept awake (srvruntime.MonitorAwake).
	assertMonitorAwake(t, "edge", srv.Process.Pid)

	admin := func(args ...string) map[string]any {
		t.Helper()
		cmd := exec.Command(bin, append([]string{"admin", "--edge", edgeURL}, args...)...)
		cmd.Env = append(os.Environ(), "SHOAL_ADMIN_TOKEN=cli-admin")
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "shoal admin %v: %s", args, out)
		var m map[string]any
		require.NoError(t, json.Unmarshal(out, &m), "%s", out)
		return m
	}
	acct := admin("account", "create", "--name", "cli", "--tier", "free")
	id := acct["id"].(string)
	assert.Len(t, id, 32)
	tok := admin("token", "create", id, "--name", "cli")
	secret := tok["token"].(string)
	bearer := "Bearer " + secret

	base := edgeURL + "/client/v4/accounts/" + id + "/d1/database"
	var a harness.Answer
	require.Eventually(t, func() bool {
		a = harness.Call(t, "POST", base, bearer, map[string]any{"name": "from-cli"})
		return a.Status == 200
	}, 20*time.Second, 100*time.Millisecond, "create: %s", &a.Raw)
	var db struct{ UUID string }
	require.NoError(t, json.Unmarshal(a.Result, &db))
	a = harness.Call(t, "POST", base+"/"+db.UUID+"/query", bearer, map[string]any{"sql": "SELECT 40 + 2 AS answer"})
	require.Equal(t, 200, a.Status, "%s", a.Raw)
	assert.Contains(t, string(a.Result), `"answer":42`)
	// Binding tokens work end to end with the key from the environment.
	a = harness.Call(t, "POST", base+"/"+db.UUID+"/binding", bearer, nil)
	require.Equal(t, 200, a.Status, "%s", a.Raw)
	var mint struct{ Token string }
	require.NoError(t, json.Unmarshal(a.Result, &mint))
	a = harness.Call(t, "POST", edgeURL+"/client/v4/bound/query", "Binding "+mint.Token, map[string]any{"sql": "SELECT 1 AS one"})
	require.Equal(t, 200, a.Status, "%s", a.Raw)

	got := admin("account", "update", id, "--max-databases", "1")
	limits := got["limits"].(map[string]any)
	assert.EqualValues(t, 1, limits["max_databases"])
	admin("token", "revoke", tok["id"].(string))
	// The help output never prints the admin secret taken from the env.
	help := exec.Command(bin, "admin", "--help")
	help.Env = append(os.Environ(), "SHOAL_ADMIN_TOKEN=cli-admin")
	out, err := help.CombinedOutput()
	require.NoError(t, err)
	assert.False(t, strings.Contains(string(out), "cli-admin"), "%s", out)

	require.NoError(t, srv.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-exited:
		assert.NoError(t, err, "edge exit: %s", &logs)
	case <-time.After(20 * time.Second):
		t.Fatalf("edge did not exit on SIGTERM: %s", &logs)
	}
}

// assertMonitorAwake checks that the role's process pid runs with the
// runtime's monitor kept awake: it re-executed itself in place with
// schedtrace added to GODEBUG (internal/srvruntime.MonitorAwake). Only on
// Linux, and only when this test's own GODEBUG does not set schedtrace
// (the role then leaves the operator's setting alone).
func assertMonitorAwake(t *testing.T, role string, pid int) {
	t.Helper()
	if runtime.GOOS != "linux" || strings.Contains(os.Getenv("GODEBUG"), "schedtrace") {
		return
	}
	environ, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	require.NoError(t, err)
	var godebug string
	for _, kv := range strings.Split(string(environ), "\x00") {
		if v, ok := strings.CutPrefix(kv, "GODEBUG="); ok {
			godebug = v
			break
		}
	}
	assert.Contains(t, strings.Split(godebug, ","), "schedtrace=2147483647", "the %s's GODEBUG: %q", role, godebug)
}
