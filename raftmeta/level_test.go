package raftmeta

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// levelPorts gives each node of these tests fixed loopback ports in this
// branch's range (22000–22999).
func levelPorts(base int) func(i int, c *Config) {
	return func(i int, c *Config) {
		c.RaftAddr = fmt.Sprintf("127.0.0.1:%d", base+2*i)
		c.HTTPAddr = fmt.Sprintf("127.0.0.1:%d", base+2*i+1)
	}
}

// TestClusterLevelGateInACluster runs real nodes over TCP (raft-wal with
// fsync): a voter whose build knows only level 1 (fsm.WithBuildLevel; it
// bootstraps, so no level-2-only group exists before it), two voters and a
// non-voter of this build. The leader must not raise the level while a
// server is at 1, nor while any server — the non-voter included — does not
// answer; the gated command is refused through the client meanwhile, on
// every node alike. Once the old voter is "upgraded" (restarted without
// the override) and every server answers, the level loop raises it, every
// replica applies the gated command and the catalogs stay identical. Then
// a server of the older build may no longer join.
func TestClusterLevelGateInACluster(t *testing.T) {
	ctx := context.Background()
	ports := levelPorts(22100)
	oldBuild := func(c *Config) { c.FSMOptions = append(c.FSMOptions, fsm.WithBuildLevel(1)) }
	mod := func(i int, c *Config) {
		ports(i, c)
		c.LevelCheckInterval = 200 * time.Millisecond
		if i == 0 {
			oldBuild(c)
		}
	}
	tc := newTestCluster(t, 3, mod)
	tc.add("n3", true, mod)
	leader := tc.waitLeader()
	cl, err := NewClient(tc.addrs(), WithCacheTTL(0))
	require.NoError(t, err)
	defer cl.Close()

	_, err = cl.Apply(ctx, cmd(t, fsm.CmdRegisterHost, fsm.RegisterHost{ID: "h1", Address: "10.0.0.1:1", State: fsm.HostStateActive}))
	require.NoError(t, err)
	_, err = cl.Apply(ctx, cmd(t, fsm.CmdCreateAccount, newAccount("a1", 10)))
	require.NoError(t, err)
	db := newDB("a1")
	_, err = cl.Apply(ctx, cmd(t, fsm.CmdCreateDatabase, db))
	require.NoError(t, err)
	del := fsm.DeleteDatabaseIf{AccountID: "a1", UUID: db.UUID, ExpectObjectID: db.ObjectID, ExpectRoutingGeneration: 1}

	// Nobody proposes the level but the leader's own check.
	_, err = cl.Apply(ctx, cmd(t, fsm.CmdSetClusterLevel, fsm.SetClusterLevel{Level: 2}))
	require.ErrorIs(t, err, fsm.ErrInvalid)
	assert.Contains(t, err.Error(), "proposed only by the catalog leader's own level check")

	// One server at level 1: no raise, however often the leader asks.
	for i := 0; i < 3; i++ {
		got, err := leader.raiseClusterLevel(ctx)
		require.NoError(t, err)
		assert.Zero(t, got)
	}
	st, err := leader.Status(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(1), st.ClusterLevel)
	for _, m := range st.Members {
		want := int64(2)
		if m.ID == "n0" {
			want = 1
		}
		assert.Equal(t, want, m.BuildLevel, "member %s", m.ID)
		assert.Equal(t, int64(1), m.ClusterLevel, "member %s", m.ID)
	}
	_, err = cl.Apply(ctx, cmd(t, fsm.CmdDeleteDatabaseIf, del))
	require.ErrorIs(t, err, fsm.ErrClusterLevelTooLow)
	assert.Contains(t, err.Error(), "upgrade every catalog node to a build that knows level 2 first")
	for _, n := range tc.nodes { // refused before the log, on any node
		_, err := n.Apply(ctx, cmd(t, fsm.CmdDeleteDatabaseIf, del))
		require.ErrorIs(t, err, fsm.ErrClusterLevelTooLow, "via %s", n.ID())
	}

	// The old server upgraded, but the non-voter down: still no raise.
	tc.cfgs[0].FSMOptions = nil
	tc.restart(0)
	require.NoError(t, tc.nodes[3].Close())
	leader = tc.waitLeader(tc.nodes[3])
	_, err = leader.raiseClusterLevel(ctx)
	require.ErrorIs(t, err, errLevelUnknown)
	assert.Contains(t, err.Error(), "n3:")
	time.Sleep(time.Second) // several rounds of the level loop
	for _, n := range tc.nodes[:3] {
		assert.Equal(t, int64(1), n.FSM().ClusterLevel(), "node %s", n.ID())
	}

	// Every server answers, all of level 2: the loop raises the level.
	tc.restart(3)
	leader = tc.waitLeader()
	require.Eventually(t, func() bool {
		for _, n := range tc.nodes {
			if n.FSM().ClusterLevel() != 2 {
				return false
			}
		}
		return true
	}, 20*time.Second, 50*time.Millisecond, "the level never rose to 2 on every node")
	res, err := cl.Apply(ctx, cmd(t, fsm.CmdDeleteDatabaseIf, del))
	require.NoError(t, err)
	require.Nil(t, res.Err)
	idx := leader.AppliedIndex()
	for _, n := range tc.nodes {
		require.Eventually(t, func() bool { return n.AppliedIndex() >= idx }, 10*time.Second, 20*time.Millisecond)
		assert.Equal(t, catalogDump(t, leader), catalogDump(t, n), "node %s", n.ID())
		d, err := n.FSM().Database(ctx, db.UUID)
		require.NoError(t, err)
		assert.Equal(t, fsm.StateDeleted, d.State, "node %s", n.ID())
	}

	resp, err := http.Get("http://" + leader.HTTPAddr() + "/metrics")
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	assert.Contains(t, string(body), "\nshoal_raftmeta_cluster_level 2\n")
	assert.Contains(t, string(body), "\nshoal_raftmeta_build_level 2\n")

	// A server of the older build may not join a level-2 cluster.
	cfg := testConfig(t, "n4", t.TempDir())
	ports(4, &cfg)
	oldBuild(&cfg)
	cfg.Join, cfg.JoinTimeout = []string{leader.HTTPAddr()}, 2*time.Second
	n, err := NewNode(cfg)
	if err == nil {
		n.Close()
	}
	require.Error(t, err)
	assert.Contains(t, err.Error(), `"n4" runs a build of catalog level 1, the cluster is at level 2`)
	st, err = leader.Status(ctx)
	require.NoError(t, err)
	assert.Len(t, st.Members, 4)
}

// A replica that has not yet applied the leader's set_cluster_level (held
// behind here; a follower a few milliseconds late in production) must not
// answer a final cluster_level_too_low for a command the cluster already
// takes: it confirms its view with a linearizable barrier first, and the
// command then applies. Before, the follower refused it at once.
func TestClusterLevelRaiseNotRefusedByALaggingFollower(t *testing.T) {
	ctx := context.Background()
	ports := levelPorts(25100)
	mod := func(i int, c *Config) {
		ports(i, c)
		c.LevelCheckInterval = -1 // no loop: the test raises the level itself
		if i == 0 {
			c.FSMOptions = append(c.FSMOptions, fsm.WithBuildLevel(1))
		}
	}
	tc := newTestCluster(t, 3, mod)
	cl, err := NewClient(tc.addrs(), WithCacheTTL(0))
	require.NoError(t, err)
	defer cl.Close()
	_, err = cl.Apply(ctx, cmd(t, fsm.CmdRegisterHost, fsm.RegisterHost{ID: "h1", Address: "10.0.0.1:1", State: fsm.HostStateActive}))
	require.NoError(t, err)
	_, err = cl.Apply(ctx, cmd(t, fsm.CmdCreateAccount, newAccount("a1", 10)))
	require.NoError(t, err)
	db := newDB("a1")
	_, err = cl.Apply(ctx, cmd(t, fsm.CmdCreateDatabase, db))
	require.NoError(t, err)
	del := fsm.DeleteDatabaseIf{AccountID: "a1", UUID: db.UUID, ExpectObjectID: db.ObjectID, ExpectRoutingGeneration: 1}

	tc.cfgs[0].FSMOptions = nil // n0 "upgraded"
	tc.restart(0)
	leader := tc.waitLeader()
	for _, n := range tc.nodes {
		require.Eventually(t, func() bool { return n.AppliedIndex() >= leader.AppliedIndex() }, 10*time.Second, 5*time.Millisecond)
		require.Equal(t, int64(1), n.FSM().ClusterLevel(), "node %s", n.ID())
	}
	f := tc.follower()
	g := holdApplies(f)
	defer g.release(f)
	got, err := leader.raiseClusterLevel(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(2), got)
	require.Equal(t, int64(1), f.FSM().ClusterLevel(), "the held follower applied the raise")

	// Released while the follower waits on its barrier (the old code had
	// refused long before).
	go func() { time.Sleep(300 * time.Millisecond); g.release(f) }()
	res, err := f.Apply(ctx, cmd(t, fsm.CmdDeleteDatabaseIf, del))
	require.NoError(t, err, "a lagging follower refused a command the cluster takes")
	require.Nil(t, res.Err)
	assert.Equal(t, int64(2), f.FSM().ClusterLevel())
}
