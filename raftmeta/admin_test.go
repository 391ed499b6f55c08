package raftmeta

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/raftmeta/fsm"
)

func TestAdminStatusRemoveSnapshot(t *testing.T) {
	tc := newTestCluster(t, 3, nil)
	nv := tc.add("reader", true, nil)
	leader := tc.waitLeader()
	ctx := context.Background()

	// The reader learns the membership from the log it replicates.
	var st ClusterStatus
	require.Eventually(t, func() bool {
		var err error
		st, err = NewAdmin(nv.HTTPAddr(), 5*time.Second).Status(ctx)
		return err == nil && len(st.Members) == 4
	}, 10*time.Second, 20*time.Millisecond)
	assert.Equal(t, leader.ID(), st.Leader)
	for _, m := range st.Members {
		assert.True(t, m.Reachable, m.ID)
		assert.NotEmpty(t, m.HTTPAddr)
		if m.ID == "reader" {
			assert.Equal(t, "Nonvoter", m.Suffrage)
		} else {
			assert.Equal(t, "Voter", m.Suffrage)
		}
		assert.Equal(t, m.ID == leader.ID(), m.Leader)
	}

	// Leader-only operations on a follower name the leader.
	err := NewAdmin(nv.HTTPAddr(), 5*time.Second).Remove(ctx, "reader")
	var nl *NotLeaderError
	require.ErrorAs(t, err, &nl)
	assert.Equal(t, leader.HTTPAddr(), nl.Leader)

	la := NewAdmin(leader.HTTPAddr(), 5*time.Second)
	require.ErrorIs(t, la.Remove(ctx, "ghost"), fsm.ErrNotFound)
	require.NoError(t, la.Remove(ctx, "reader"))
	st, err = la.Status(ctx)
	require.NoError(t, err)
	assert.Len(t, st.Members, 3)

	_, err = leader.Apply(ctx, cmd(t, fsm.CmdCreateAccount, newAccount("acct", 10)))
	require.NoError(t, err)
	idx, err := la.Snapshot(ctx)
	require.NoError(t, err)
	assert.NotZero(t, idx)

	// A wrong address gives a clear error.
	_, err = NewAdmin("127.0.0.1:1", time.Second).Status(ctx)
	require.ErrorIs(t, err, ErrUnavailable)
	assert.Contains(t, err.Error(), "127.0.0.1:1")
}

func TestBackupRestoreIntoNewCluster(t *testing.T) {
	src := newTestCluster(t, 3, nil)
	ctx := context.Background()
	cl, err := NewClient(src.addrs())
	require.NoError(t, err)
	defer cl.Close()
	_, err = cl.CreateAccount(ctx, newAccount("acct", 100))
	require.NoError(t, err)
	var dbs []fsm.CreateDatabase
	for i := 0; i < 10; i++ {
		d := newDB("acct")
		_, err := cl.CreateDatabase(ctx, d)
		require.NoError(t, err)
		dbs = append(dbs, d)
	}
	var buf bytes.Buffer
	idx, n, err := NewAdmin(src.follower().HTTPAddr(), 10*time.Second).Backup(ctx, &buf)
	require.NoError(t, err)
	assert.NotZero(t, idx)
	assert.EqualValues(t, buf.Len(), n)
	srcLeader := src.waitLeader()
	_, err = srcLeader.ReadBarrier(ctx, LinearizableRead())
	require.NoError(t, err)
	want := catalogDump(t, srcLeader)

	// A later write is not in the backup.
	late := newDB("acct")
	_, err = cl.CreateDatabase(ctx, late)
	require.NoError(t, err)

	dst := newTestCluster(t, 3, nil)
	dcl, err := NewClient(dst.addrs())
	require.NoError(t, err)
	defer dcl.Close()
	_, err = dcl.CreateAccount(ctx, newAccount("other", 1)) // replaced by the restore
	require.NoError(t, err)
	dl := dst.waitLeader()
	err = NewAdmin(dst.follower().HTTPAddr(), 10*time.Second).Restore(ctx, bytes.NewReader(buf.Bytes()))
	require.ErrorIs(t, err, ErrNotLeader)
	require.NoError(t, NewAdmin(dl.HTTPAddr(), 30*time.Second).Restore(ctx, bytes.NewReader(buf.Bytes())))

	for _, d := range dbs {
		got, err := dcl.Database(ctx, d.UUID, LinearizableRead())
		require.NoError(t, err)
		assert.Equal(t, d.Name, got.Name)
	}
	_, err = dcl.Database(ctx, late.UUID, LinearizableRead())
	require.ErrorIs(t, err, fsm.ErrNotFound)
	_, err = dcl.Account(ctx, "other", LinearizableRead())
	require.ErrorIs(t, err, fsm.ErrAccountNotFound)
	// Every node of the new cluster holds the restored catalog.
	for _, n := range dst.nodes {
		require.Eventually(t, func() bool { return catalogDump(t, n) == want }, 10*time.Second, 20*time.Millisecond, n.ID())
	}
}
