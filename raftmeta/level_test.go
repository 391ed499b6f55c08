package raftmeta

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
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
		want := fsm.BuildLevel
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

	// Every server answers, all of this build's level: the loop raises the
	// level to it.
	tc.restart(3)
	leader = tc.waitLeader()
	require.Eventually(t, func() bool {
		for _, n := range tc.nodes {
			if n.FSM().ClusterLevel() != fsm.BuildLevel {
				return false
			}
		}
		return true
	}, 20*time.Second, 50*time.Millisecond, "the level never rose to this build's on every node")
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
	assert.Contains(t, string(body), fmt.Sprintf("\nshoal_raftmeta_cluster_level %d\n", fsm.BuildLevel))
	assert.Contains(t, string(body), fmt.Sprintf("\nshoal_raftmeta_build_level %d\n", fsm.BuildLevel))

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
	assert.Contains(t, err.Error(), fmt.Sprintf(`"n4" runs a build of catalog level 1, the cluster is at level %d`, fsm.BuildLevel))
	st, err = leader.Status(ctx)
	require.NoError(t, err)
	assert.Len(t, st.Members, 4)
}

// TestBatchEntriesOnlyAtLevel3 runs real nodes over TCP (raft-wal with
// fsync) with one voter whose build knows only catalog level 2
// (fsm.WithBuildLevel(2): it would refuse a batch entry). The cluster
// rises to level 2 and stays there, and batched writes (/v1/apply-batch,
// which the leader proposes as one batch entry from level 3 on) reach the
// log as one entry per command: no replica is ever handed a batch entry.
// Once that voter is "upgraded" the level rises to 3, the same batches go
// as batch entries on every replica, each command answers as before
// (refusals included), and the catalogs stay identical.
func TestBatchEntriesOnlyAtLevel3(t *testing.T) {
	ctx := context.Background()
	ports := levelPorts(22200)
	mod := func(i int, c *Config) {
		ports(i, c)
		c.LevelCheckInterval = 200 * time.Millisecond
		if i == 0 {
			c.FSMOptions = append(c.FSMOptions, fsm.WithBuildLevel(2))
		}
	}
	tc := newTestCluster(t, 3, mod)
	cl, err := NewClient(tc.addrs(), WithCacheTTL(0))
	require.NoError(t, err)
	defer cl.Close()
	_, err = cl.Apply(ctx, cmd(t, fsm.CmdRegisterHost, fsm.RegisterHost{ID: "h1", Address: "10.0.0.1:1", State: fsm.HostStateActive}))
	require.NoError(t, err)
	_, err = cl.Apply(ctx, cmd(t, fsm.CmdCreateAccount, newAccount("a1", 1000)))
	require.NoError(t, err)

	levelIs := func(want int64) func() bool {
		return func() bool {
			for _, n := range tc.nodes {
				if n.FSM().ClusterLevel() != want {
					return false
				}
			}
			return true
		}
	}
	// A batch: creates, a name taken by an earlier command of the same
	// batch, an unknown account. Each command its own answer.
	batch := func() {
		t.Helper()
		var dbs []fsm.CreateDatabase
		for range 6 {
			dbs = append(dbs, newDB("a1"))
		}
		dup := newDB("a1")
		dup.Name = dbs[0].Name
		stranger := newDB("nobody")
		dbs = append(dbs, dup, stranger)
		got, errs := cl.CreateDatabases(ctx, dbs)
		for i := range 6 {
			require.NoError(t, errs[i], "create %d", i)
			assert.Equal(t, dbs[i].UUID, got[i].UUID)
		}
		require.ErrorIs(t, errs[6], fsm.ErrNameTaken)
		require.ErrorIs(t, errs[7], fsm.ErrAccountNotFound)
	}
	sameCatalogs := func() {
		t.Helper()
		leader := tc.waitLeader()
		idx := leader.AppliedIndex()
		for _, n := range tc.nodes {
			require.Eventually(t, func() bool { return n.AppliedIndex() >= idx }, 10*time.Second, 20*time.Millisecond)
			assert.Equal(t, catalogDump(t, leader), catalogDump(t, n), "node %s", n.ID())
		}
	}

	require.Eventually(t, levelIs(2), 20*time.Second, 50*time.Millisecond, "the level never rose to 2")
	for range 5 {
		batch()
	}
	time.Sleep(time.Second) // several rounds of the level loop
	require.True(t, levelIs(2)(), "the level rose past the level-2 build")
	sameCatalogs()
	for _, n := range tc.nodes {
		assert.Zero(t, n.FSM().BatchEntries(), "node %s was handed a batch entry below level 3", n.ID())
	}

	// The level-2 voter upgraded: level 3, batch entries on every replica.
	tc.cfgs[0].FSMOptions = nil
	tc.restart(0)
	tc.waitLeader()
	require.Eventually(t, levelIs(fsm.LevelBatchEntry), 20*time.Second, 50*time.Millisecond, "the level never rose to 3")
	for range 5 {
		batch()
	}
	sameCatalogs()
	for _, n := range tc.nodes {
		assert.GreaterOrEqual(t, n.FSM().BatchEntries(), uint64(5), "node %s", n.ID())
	}
}

// TestBatchEntryRefusedWholeFallsBack: a batch entry the FSM refuses as a
// whole (below level 3 — in a cluster only after a restore from an older
// backup lowered the level between the leader's check and the commit)
// applies nothing, and the leader proposes the commands one by one
// instead, each answering as always.
func TestBatchEntryRefusedWholeFallsBack(t *testing.T) {
	ctx := context.Background()
	tc := newTestCluster(t, 1, func(i int, c *Config) {
		levelPorts(22250)(i, c)
		c.FSMOptions = append(c.FSMOptions, fsm.WithBuildLevel(2))
	})
	n := tc.waitLeader()
	_, err := n.Apply(ctx, cmd(t, fsm.CmdCreateAccount, newAccount("a1", 100)))
	require.NoError(t, err)
	_, err = n.Apply(ctx, cmd(t, fsm.CmdRegisterHost, fsm.RegisterHost{ID: "h1", Address: "10.0.0.1:1", State: fsm.HostStateActive}))
	require.NoError(t, err)
	cmds := []fsm.Command{cmd(t, fsm.CmdCreateDatabase, newDB("a1")), cmd(t, fsm.CmdCreateDatabase, newDB("a1"))}
	before := catalogDump(t, n)
	_, _, ok := n.applyBatchEntry(ctx, cmds)
	require.False(t, ok, "a batch entry below level 3 must be refused whole")
	assert.Equal(t, before, catalogDump(t, n), "the refused batch entry applied something")
	assert.Equal(t, uint64(1), n.FSM().BatchEntries())
	// The leader's path: one by one, each its own result.
	res, errs := n.ApplyBatch(ctx, cmds)
	for i := range cmds {
		require.NoError(t, errs[i])
		require.Nil(t, res[i].Err)
	}
	assert.NotEqual(t, res[0].Index, res[1].Index, "one entry each")
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
	require.Equal(t, fsm.BuildLevel, got)
	require.Equal(t, int64(1), f.FSM().ClusterLevel(), "the held follower applied the raise")

	// Released while the follower waits on its barrier (the old code had
	// refused long before).
	go func() { time.Sleep(300 * time.Millisecond); g.release(f) }()
	res, err := f.Apply(ctx, cmd(t, fsm.CmdDeleteDatabaseIf, del))
	require.NoError(t, err, "a lagging follower refused a command the cluster takes")
	require.Nil(t, res.Err)
	assert.Equal(t, fsm.BuildLevel, f.FSM().ClusterLevel())

	// The raise is in the audit log, with its leader and servers.
	page, err := cl.AuditPage(ctx, fsm.AuditQuery{Limit: 10}, LinearizableRead())
	require.NoError(t, err)
	var raise *fsm.AuditEntry
	for i := range page.Entries {
		if strings.Contains(page.Entries[i].Detail, `"action":"raise_cluster_level"`) {
			raise = &page.Entries[i]
		}
	}
	require.NotNil(t, raise, "no audit row for the level raise: %+v", page.Entries)
	assert.Equal(t, "catalog-leader:"+leader.ID(), raise.Actor)
	assert.Equal(t, "cluster", raise.Subject)
	assert.Contains(t, raise.Detail, fmt.Sprintf(`"from":"1","servers":"n0,n1,n2","to":"%d"`, fsm.BuildLevel))
}
