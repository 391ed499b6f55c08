package raftmeta

import (
	"bytes"
	"context"
	"errors"
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
	// A follower refuses the restore. On a loaded machine the leader may
	// move between finding it and asking: a node that was a follower then
	// but leads now proves nothing either way, so the refusal is asked of
	// a node that is a follower before and after the call.
	for {
		dl := dst.waitLeader()
		f := dst.follower()
		err = NewAdmin(f.HTTPAddr(), 10*time.Second).Restore(ctx, bytes.NewReader(buf.Bytes()))
		if dst.waitLeader() == dl && !f.IsLeader() {
			require.ErrorIs(t, err, ErrNotLeader)
			break
		}
		t.Logf("the leader moved during the follower's refusal (%v): asking again", err)
	}
	// The restore itself goes to the leader, again across a leader change
	// (as the operator's `shoal cluster restore` retries).
	for {
		dl := dst.waitLeader()
		err = NewAdmin(dl.HTTPAddr(), 30*time.Second).Restore(ctx, bytes.NewReader(buf.Bytes()))
		if !errors.Is(err, ErrNotLeader) {
			require.NoError(t, err)
			break
		}
		t.Logf("the leader moved before the restore: %v", err)
	}

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
		require.Eventually(t, func() bool { return catalogDump(t, n) == want }, time.Minute, 20*time.Millisecond, n.ID())
	}
}
