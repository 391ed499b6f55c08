package raftmeta

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/internal/ids"
	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// testCluster runs real nodes in-process over loopback TCP, each with its
// own temp dir, raft-boltdb with fsync, and HTTP API.
type testCluster struct {
	t     *testing.T
	nodes []*Node
	dirs  []string
	cfgs  []Config
}

func testConfig(t *testing.T, id, dir string) Config {
	return Config{
		ID: id, Dir: dir, RaftAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
		Logger:        slog.New(slog.NewTextHandler(io.Discard, nil)),
		RaftLogOutput: io.Discard,
	}
}

// newTestCluster starts n voters: node 0 bootstraps, the others join it.
func newTestCluster(t *testing.T, n int, mod func(i int, c *Config)) *testCluster {
	t.Helper()
	tc := &testCluster{t: t}
	for i := 0; i < n; i++ {
		tc.add(fmt.Sprintf("n%d", i), false, mod)
	}
	tc.waitLeader()
	return tc
}

func (tc *testCluster) add(id string, nonvoter bool, mod func(i int, c *Config)) *Node {
	tc.t.Helper()
	i := len(tc.nodes)
	cfg := testConfig(tc.t, id, tc.t.TempDir())
	if i == 0 {
		cfg.Bootstrap = true
	} else {
		cfg.Join = []string{tc.nodes[0].HTTPAddr()}
		cfg.JoinTimeout = 20 * time.Second
	}
	cfg.NonVoter = nonvoter
	if mod != nil {
		mod(i, &cfg)
	}
	n, err := NewNode(cfg)
	require.NoError(tc.t, err)
	tc.t.Cleanup(func() { n.Close() })
	tc.nodes = append(tc.nodes, n)
	tc.dirs = append(tc.dirs, cfg.Dir)
	tc.cfgs = append(tc.cfgs, cfg)
	if i == 0 {
		require.Eventually(tc.t, n.IsLeader, 15*time.Second, 20*time.Millisecond, "bootstrap node never led")
	}
	return n
}

// restart closes node i and opens it again on the same dir and addresses.
func (tc *testCluster) restart(i int) *Node {
	tc.t.Helper()
	require.NoError(tc.t, tc.nodes[i].Close())
	cfg := tc.cfgs[i]
	cfg.RaftAddr, cfg.HTTPAddr = tc.nodes[i].RaftAddr(), tc.nodes[i].HTTPAddr()
	cfg.Bootstrap, cfg.Join = false, nil
	var n *Node
	// The old listeners are closed; the ports may take a moment to free.
	require.Eventually(tc.t, func() bool {
		var err error
		n, err = NewNode(cfg)
		return err == nil
	}, 10*time.Second, 100*time.Millisecond)
	tc.t.Cleanup(func() { n.Close() })
	tc.nodes[i] = n
	return n
}

// waitLeader waits until exactly one open node leads and every open node
// knows it, and returns it.
func (tc *testCluster) waitLeader(skip ...*Node) *Node {
	tc.t.Helper()
	var leader *Node
	require.Eventually(tc.t, func() bool {
		leader = nil
		var alive []*Node
		for _, n := range tc.nodes {
			if n.ctx.Err() != nil || contains(skip, n) {
				continue
			}
			alive = append(alive, n)
			if n.IsLeader() {
				if leader != nil {
					return false
				}
				leader = n
			}
		}
		if leader == nil {
			return false
		}
		for _, n := range alive {
			if _, id := n.raft.LeaderWithID(); string(id) != leader.ID() {
				return false
			}
		}
		return leader.readyTerm.Load() == leader.raft.CurrentTerm()
	}, 20*time.Second, 20*time.Millisecond, "no stable leader")
	return leader
}

func contains(ns []*Node, n *Node) bool {
	for _, x := range ns {
		if x == n {
			return true
		}
	}
	return false
}

func (tc *testCluster) follower() *Node {
	for _, n := range tc.nodes {
		if n.ctx.Err() == nil && !n.IsLeader() {
			return n
		}
	}
	tc.t.Fatal("no follower")
	return nil
}

func (tc *testCluster) addrs() []string {
	var a []string
	for _, n := range tc.nodes {
		a = append(a, n.HTTPAddr())
	}
	return a
}

var testSeq atomic.Int64

func cmd(t testing.TB, typ fsm.CommandType, body any) fsm.Command {
	c, err := fsm.NewCommand(typ, ids.New(), time.Now().UnixNano(), body)
	require.NoError(t, err)
	return c
}

func newAccount(id string, maxDBs int64) fsm.CreateAccount {
	return fsm.CreateAccount{ID: id, Name: id, Tier: fsm.TierPaid, Limits: fsm.Limits{MaxDatabases: maxDBs, MaxStorageBytes: 1 << 40, MaxDatabaseBytes: 1 << 30}}
}

func newDB(acct string) fsm.CreateDatabase {
	s := testSeq.Add(1)
	return fsm.CreateDatabase{UUID: ids.New(), AccountID: acct, Name: fmt.Sprintf("db-%d", s),
		ObjectID: uuid.NewString(), HostID: "h1", Region: "weur", Jurisdiction: "", ReadReplication: fsm.ReadReplicationDisabled}
}

// catalogDump is the FSM dump without bookkeeping tables (applied index,
// remembered request IDs), which move with every entry, and without the
// audit row of the cluster level's raise: a new cluster's leader raises
// the level about a second after it leads and records the raise in its
// own entry after that (level.go), so it lands whenever it lands — between
// a test's two dumps, or after a "want" it compares replicas with. Tests
// of that row read the audit log (TestClusterLevelRaiseNotRefusedByALaggingFollower).
func catalogDump(t testing.TB, n *Node) string {
	d, err := n.FSM().Dump(context.Background())
	require.NoError(t, err)
	var out []string
	skip := false
	for _, line := range strings.Split(d, "\n") {
		if strings.HasPrefix(line, "## ") {
			skip = strings.HasPrefix(line, "## meta ") || strings.HasPrefix(line, "## requests ")
		}
		if !skip && !strings.Contains(line, raiseAuditMark) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}

// raiseAuditMark is in the detail of the level raise's audit row.
const raiseAuditMark = "raise_cluster_level"

// waitLevelRaised waits until n has applied the raise of a new cluster's
// catalog level to this build's and the audit row the leader records after
// it, for tests that read the whole audit log.
func waitLevelRaised(t testing.TB, n *Node) {
	t.Helper()
	require.Eventually(t, func() bool {
		if n.FSM().ClusterLevel() < fsm.BuildLevel {
			return false
		}
		page, err := n.FSM().Audit(context.Background(), fsm.AuditQuery{Limit: 100})
		if err != nil {
			return false
		}
		for _, e := range page.Entries {
			if strings.Contains(e.Detail, raiseAuditMark) {
				return true
			}
		}
		return false
	}, 30*time.Second, 20*time.Millisecond, "the cluster level's raise and its audit row on %s", n.ID())
}
