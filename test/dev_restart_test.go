package test

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/test/harness"
)

// devBasePort3 finds a base port whose ranges for a 3-voter `shoal dev`
// (base..base+2 Raft, base+100..102 catalog, base+200 host, base+300 broker,
// base+310/311 ClickHouse) are free.
func devBasePort3(t *testing.T) int {
	return harness.FreePortBase(t, 0, 1, 2, 100, 101, 102, 200, 300, 310, 311)
}

// runDevUntilReady starts `shoal dev` with args and waits until it serves.
func runDevUntilReady(t *testing.T, bin, apiURL string, args ...string) (*exec.Cmd, *harness.SyncWriter) {
	t.Helper()
	out, errb := &harness.SyncWriter{}, &harness.SyncWriter{}
	cmd := exec.Command(bin, append([]string{"dev"}, args...)...)
	cmd.Stdout, cmd.Stderr = out, errb
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	require.Eventually(t, func() bool {
		resp, err := http.Get(apiURL + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK && strings.Contains(out.String(), "Press Ctrl-C")
	}, 60*time.Second, 100*time.Millisecond, "shoal dev never became ready: %s", errb)
	return cmd, out
}

// stopDev sends SIGTERM and requires a clean exit (status 0) in time.
func stopDev(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		require.NoError(t, err, "shoal dev did not exit cleanly on SIGTERM")
	case <-time.After(30 * time.Second):
		t.Fatal("shoal dev did not stop within 30 s of SIGTERM")
	}
}

// TestDevRestartKeepsEverything is issue #5's "clean shutdown on Ctrl-C /
// SIGTERM: no corrupted files, restart resumes", with the 3-voter catalog of
// `shoal dev --nodes 3`: data written before a SIGTERM is there after a
// restart on the same directory, the saved account and token still work,
// and the catalog has its three voters again.
func TestDevRestartKeepsEverything(t *testing.T) {
	bin := shoalBin.Path(t)
	dir := filepath.Join(t.TempDir(), "dev")
	addr := harness.FreeAddr(t)
	base := devBasePort3(t)
	args := []string{"--nodes", "3", "--dir", dir, "--addr", addr, "--base-port", fmt.Sprint(base)}
	apiURL := "http://" + addr
	d1 := func(a ...string) cliResult {
		return runCLI(t, bin, nil, "", append([]string{"d1", "--dev-dir", dir}, a...)...)
	}

	cmd, out := runDevUntilReady(t, bin, apiURL, args...)
	assert.Contains(t, out.String(), "catalog voters: 3")
	saved, err := os.ReadFile(filepath.Join(dir, "dev.json"))
	require.NoError(t, err)
	r := d1("create", "keep")
	require.Equal(t, 0, r.code, "%s%s", r.stdout, r.stderr)
	r = d1("execute", "keep", "--command", "CREATE TABLE t(x TEXT); INSERT INTO t VALUES ('before restart')")
	require.Equal(t, 0, r.code, "%s%s", r.stdout, r.stderr)
	stopDev(t, cmd)

	cmd, out = runDevUntilReady(t, bin, apiURL, args...)
	defer stopDev(t, cmd)
	after, err := os.ReadFile(filepath.Join(dir, "dev.json"))
	require.NoError(t, err)
	assert.Equal(t, string(saved), string(after), "the restart must keep the account and token")
	assert.Contains(t, out.String(), "catalog voters: 3")
	r = d1("execute", "keep", "--command", "SELECT x FROM t", "--json")
	require.Equal(t, 0, r.code, "%s%s", r.stdout, r.stderr)
	assert.Contains(t, r.stdout, "before restart")
	r = d1("list")
	require.Equal(t, 0, r.code, "%s%s", r.stdout, r.stderr)
	assert.Contains(t, r.stdout, "keep")
	// The restarted catalog accepts writes (a leader among the 3 voters).
	r = d1("create", "after-restart")
	require.Equal(t, 0, r.code, "%s%s", r.stdout, r.stderr)
	// The catalog answers operators only: dev's internal calls are mutual
	// TLS with its own CA (DIR/pki).
	catAddr := fmt.Sprintf("127.0.0.1:%d", base+100)
	st := runCLI(t, bin, nil, "", "cluster", "status", "--addr", catAddr)
	require.NotEqual(t, 0, st.code, "no certificate: refused\n%s%s", st.stdout, st.stderr)
	pkiDir := filepath.Join(dir, "pki")
	st = runCLI(t, bin, nil, "", "cluster", "status", "--addr", catAddr, "--tls-ca", filepath.Join(pkiDir, "ca.crt"),
		"--tls-cert", filepath.Join(pkiDir, "operator.crt"), "--tls-key", filepath.Join(pkiDir, "operator.key"))
	require.Equal(t, 0, st.code, "%s%s", st.stdout, st.stderr)
	assert.Equal(t, 3, strings.Count(st.stdout, "voter"), st.stdout)
	st = runCLI(t, bin, nil, "", "cluster", "status", "--addr", catAddr, "--tls-ca", filepath.Join(pkiDir, "ca.crt"),
		"--tls-cert", filepath.Join(pkiDir, "edge.crt"), "--tls-key", filepath.Join(pkiDir, "edge.key"))
	require.Equal(t, 0, st.code, "status is open to every role: %s%s", st.stdout, st.stderr)
	bk := runCLI(t, bin, nil, "", "cluster", "backup", "-o", filepath.Join(t.TempDir(), "b"), "--addr", catAddr, "--tls-ca", filepath.Join(pkiDir, "ca.crt"),
		"--tls-cert", filepath.Join(pkiDir, "edge.crt"), "--tls-key", filepath.Join(pkiDir, "edge.key"))
	require.NotEqual(t, 0, bk.code, "an edge's certificate may not take backups: %s%s", bk.stdout, bk.stderr)
	assert.Contains(t, bk.stdout+bk.stderr, "forbidden")
}

// TestDevCreateThenUseAtOnce: with 3 catalog voters, a database is usable by
// name the moment its create returns, and the next list shows it, every
// time (read-your-writes through the edge: a name lookup that finds nothing
// is confirmed on the leader, and an account that just wrote lists from the
// leader). Before, stale lists spread over followers made `execute NAME`
// right after `create NAME` answer 7404 now and then.
func TestDevCreateThenUseAtOnce(t *testing.T) {
	bin := shoalBin.Path(t)
	dir := filepath.Join(t.TempDir(), "dev")
	addr := harness.FreeAddr(t)
	base := devBasePort3(t)
	cmd, _ := runDevUntilReady(t, bin, "http://"+addr, "--nodes", "3", "--dir", dir, "--addr", addr, "--base-port", fmt.Sprint(base))
	defer stopDev(t, cmd)
	d1 := func(a ...string) cliResult {
		return runCLI(t, bin, nil, "", append([]string{"d1", "--dev-dir", dir}, a...)...)
	}
	for i := range 15 {
		name := fmt.Sprintf("at-once-%d", i)
		r := d1("create", name)
		require.Equal(t, 0, r.code, "%s%s", r.stdout, r.stderr)
		r = d1("execute", name, "--command", "SELECT 1")
		require.Equal(t, 0, r.code, "round %d: execute right after create: %s%s", i, r.stdout, r.stderr)
		r = d1("list")
		require.Equal(t, 0, r.code, "%s%s", r.stdout, r.stderr)
		require.Contains(t, r.stdout, name, "round %d: list right after create", i)
	}
}
