package test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
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

// TestRaftmetaCLIThreeProcesses builds the shoal binary, starts three
// catalog nodes as real processes from the CLI (one bootstraps, two join),
// checks `shoal cluster status`, writes through one node and reads through
// another.
func TestRaftmetaCLIThreeProcesses(t *testing.T) {
	bin := shoalBin.Path(t)
	dir := t.TempDir()
	type proc struct {
		id, raftAddr, httpAddr string
		cmd                    *exec.Cmd
		log                    *bytes.Buffer
	}
	var procs []*proc
	start := func(id string, extra ...string) *proc {
		p := &proc{id: id, raftAddr: harness.FreeAddr(t), httpAddr: harness.FreeAddr(t), log: &bytes.Buffer{}}
		args := append([]string{"raftmeta", "serve", "--insecure", "--id", id, "--dir", filepath.Join(dir, id),
			"--raft-addr", p.raftAddr, "--http-addr", p.httpAddr}, extra...)
		p.cmd = exec.Command(bin, args...)
		p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
		require.NoError(t, p.cmd.Start())
		procs = append(procs, p)
		return p
	}
	t.Cleanup(func() {
		for _, p := range procs {
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
		}
		for _, p := range procs {
			done := make(chan struct{})
			go func() { _ = p.cmd.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(15 * time.Second):
				_ = p.cmd.Process.Kill()
				<-done
			}
			if t.Failed() {
				t.Logf("--- %s log:\n%s", p.id, p.log.String())
			}
		}
	})

	n1 := start("n1", "--bootstrap")
	harness.WaitReady(t, n1.httpAddr)
	n2 := start("n2", "--join", n1.httpAddr)
	n3 := start("n3", "--join", n2.httpAddr) // a follower's address: join follows it to the leader
	harness.WaitReady(t, n2.httpAddr)
	harness.WaitReady(t, n3.httpAddr)

	shoal := func(args ...string) (string, error) {
		out, err := exec.Command(bin, args...).CombinedOutput()
		return string(out), err
	}

	out, err := shoal("cluster", "status", "--json", "--addr", n3.httpAddr)
	require.NoError(t, err, out)
	var st raftmeta.ClusterStatus
	require.NoError(t, json.Unmarshal([]byte(out), &st), out)
	assert.Equal(t, "n1", st.Leader)
	require.Len(t, st.Members, 3)
	for i, m := range st.Members {
		assert.Equal(t, fmt.Sprintf("n%d", i+1), m.ID)
		assert.Equal(t, "Voter", m.Suffrage)
		assert.True(t, m.Reachable, m.ID)
		assert.Equal(t, procs[i].httpAddr, m.HTTPAddr)
		assert.Equal(t, procs[i].raftAddr, m.RaftAddr)
	}

	out, err = shoal("cluster", "status", "--addr", n2.httpAddr)
	require.NoError(t, err, out)
	assert.Contains(t, out, "leader: n1")
	for _, h := range []string{"ID", "SUFFRAGE", "COMMIT", "APPLIED", "LAST CONTACT", "BUILD LEVEL", "catalog level: "} {
		assert.Contains(t, out, h)
	}
	assert.Equal(t, 3, strings.Count(out, " voter "), out) // three voter rows

	// Clear errors: a leader-only op on a follower, and a wrong address.
	out, err = shoal("cluster", "remove", "n3", "--addr", n2.httpAddr)
	require.Error(t, err)
	assert.Contains(t, out, "not the leader")
	assert.Contains(t, out, "rerun with --addr "+n1.httpAddr)
	out, err = shoal("cluster", "status", "--addr", harness.FreeAddr(t), "--timeout", "2s")
	require.Error(t, err)
	assert.Contains(t, out, "cannot reach a raftmeta node")

	// Write through n2 (forwarded to the leader), read through n3.
	ctx := context.Background()
	w, err := raftmeta.NewClient([]string{n2.httpAddr})
	require.NoError(t, err)
	defer w.Close()
	r, err := raftmeta.NewClient([]string{n3.httpAddr})
	require.NoError(t, err)
	defer r.Close()
	_, err = w.CreateAccount(ctx, fsm.CreateAccount{ID: "acct", Name: "acct", Tier: fsm.TierFree, Limits: fsm.Limits{MaxDatabases: 10}})
	require.NoError(t, err)
	d := fsm.CreateDatabase{UUID: uuid.NewString(), AccountID: "acct", Name: "orders", ObjectID: uuid.NewString(), HostID: "h1", Region: "weur"}
	_, err = w.CreateDatabase(ctx, d)
	require.NoError(t, err)
	got, err := r.Database(ctx, d.UUID, raftmeta.LinearizableRead())
	require.NoError(t, err)
	assert.Equal(t, "orders", got.Name)
	assert.Equal(t, "acct", got.AccountID)
	byName, err := r.DatabaseByName(ctx, "acct", "orders", raftmeta.LinearizableRead())
	require.NoError(t, err)
	assert.Equal(t, d.UUID, byName.UUID)

	// Backup through the CLI produces a non-empty file.
	bak := filepath.Join(dir, "catalog.bak")
	out, err = shoal("cluster", "backup", "-o", bak, "--addr", n3.httpAddr)
	require.NoError(t, err, out)
	fi, err := os.Stat(bak)
	require.NoError(t, err)
	assert.Positive(t, fi.Size())
}
