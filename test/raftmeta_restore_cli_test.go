package test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/raftmeta"
	"github.com/shoaldb/shoal/raftmeta/fsm"
	"github.com/shoaldb/shoal/test/harness"
)

// TestRaftmetaCLIRestoreRefusesBadFiles runs `shoal cluster restore` against
// a catalog process with a truncated, a corrupted and a foreign file: each
// fails with the reason, the process keeps serving with its catalog
// unchanged and restarts normally; then a real backup restores.
func TestRaftmetaCLIRestoreRefusesBadFiles(t *testing.T) {
	bin := shoalBin.Path(t)
	dir := t.TempDir()
	raftAddr, httpAddr := harness.FreeAddr(t), harness.FreeAddr(t)
	var log bytes.Buffer
	var proc *exec.Cmd
	start := func(extra ...string) {
		proc = exec.Command(bin, append([]string{"raftmeta", "serve", "--insecure", "--id", "n1", "--dir", filepath.Join(dir, "n1"),
			"--raft-addr", raftAddr, "--http-addr", httpAddr}, extra...)...)
		proc.Stdout, proc.Stderr = &log, &log
		require.NoError(t, proc.Start())
		harness.WaitReady(t, httpAddr)
	}
	stop := func() {
		_ = proc.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = proc.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = proc.Process.Kill()
			<-done
		}
	}
	t.Cleanup(func() {
		stop()
		if t.Failed() {
			t.Logf("--- n1 log:\n%s", log.String())
		}
	})
	start("--bootstrap")
	shoal := func(args ...string) (string, error) {
		out, err := exec.Command(bin, append(args, "--addr", httpAddr)...).CombinedOutput()
		return string(out), err
	}

	ctx := context.Background()
	cl, err := raftmeta.NewClient([]string{httpAddr})
	require.NoError(t, err)
	defer cl.Close()
	_, err = cl.CreateAccount(ctx, fsm.CreateAccount{ID: "acct", Name: "acct", Tier: fsm.TierFree, Limits: fsm.Limits{MaxDatabases: 10}})
	require.NoError(t, err)
	d := fsm.CreateDatabase{UUID: uuid.NewString(), AccountID: "acct", Name: "orders", ObjectID: uuid.NewString(), HostID: "h1", Region: "weur"}
	_, err = cl.CreateDatabase(ctx, d)
	require.NoError(t, err)
	bak := filepath.Join(dir, "catalog.bak")
	out, err := shoal("cluster", "backup", "-o", bak)
	require.NoError(t, err, out)
	good, err := os.ReadFile(bak)
	require.NoError(t, err)

	later := fsm.CreateDatabase{UUID: uuid.NewString(), AccountID: "acct", Name: "later", ObjectID: uuid.NewString(), HostID: "h1", Region: "weur"}
	_, err = cl.CreateDatabase(ctx, later)
	require.NoError(t, err)

	flipped := bytes.Clone(good)
	flipped[len(flipped)/2] ^= 1
	bad := map[string]struct {
		data []byte
		want string
	}{
		"truncated.bak": {good[:len(good)-100], "invalid backup: truncated at byte"},
		"flipped.bak":   {flipped, "invalid backup: checksum mismatch"},
		"notes.txt":     {[]byte("these are my notes\n"), "invalid backup: not a catalog snapshot or backup"},
	}
	for name, c := range bad {
		path := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(path, c.data, 0o600))
		out, err := shoal("cluster", "restore", path)
		require.Error(t, err, out)
		assert.Contains(t, out, c.want, name)
		// Still serving, with both databases.
		for _, u := range []string{d.UUID, later.UUID} {
			_, err := cl.Database(ctx, u, raftmeta.LinearizableRead())
			require.NoError(t, err, name)
		}
	}

	// A restart is normal (no bad snapshot in the store).
	stop()
	start()
	_, err = cl.Database(ctx, later.UUID, raftmeta.LinearizableRead())
	require.NoError(t, err)

	out, err = shoal("cluster", "restore", bak)
	require.NoError(t, err, out)
	assert.Contains(t, out, "restored "+bak)
	_, err = cl.Database(ctx, d.UUID, raftmeta.LinearizableRead())
	require.NoError(t, err)
	_, err = cl.Database(ctx, later.UUID, raftmeta.LinearizableRead())
	require.ErrorIs(t, err, fsm.ErrNotFound)
}
