package raftmeta

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/raftmeta/fsm"
)

func TestWriteThroughFollowerIsForwardedAndReadLinearizablyElsewhere(t *testing.T) {
	tc := newTestCluster(t, 3, nil)
	leader := tc.waitLeader()
	var followers []*Node
	for _, n := range tc.nodes {
		if n != leader {
			followers = append(followers, n)
		}
	}
	ctx := context.Background()

	_, err := followers[0].Apply(ctx, cmd(t, fsm.CmdCreateAccount, newAccount("acct1", 100)))
	require.NoError(t, err)
	for i := 0; i < 20; i++ {
		d := newDB("acct1")
		// Write through one follower, then a linearizable read on the other
		// follower must see it at once: no sleeping, no retry.
		res, err := followers[i%2].Apply(ctx, cmd(t, fsm.CmdCreateDatabase, d))
		require.NoError(t, err)
		require.NotZero(t, res.Index)
		reader := followers[(i+1)%2]
		meta, err := reader.ReadBarrier(ctx, LinearizableRead())
		require.NoError(t, err)
		assert.GreaterOrEqual(t, meta.AppliedIndex, res.Index)
		got, err := reader.FSM().Database(ctx, d.UUID)
		require.NoError(t, err, "linearizable read on %s missed a write acknowledged via %s", reader.ID(), followers[i%2].ID())
		assert.Equal(t, d.Name, got.Name)
	}
	// Catalog refusals travel back through the forwarding hop as fsm errors.
	d := newDB("acct1")
	_, err = followers[0].Apply(ctx, cmd(t, fsm.CmdCreateDatabase, d))
	require.NoError(t, err)
	d2 := newDB("acct1")
	d2.Name = d.Name
	_, err = followers[1].Apply(ctx, cmd(t, fsm.CmdCreateDatabase, d2))
	require.ErrorIs(t, err, fsm.ErrNameTaken)

	// Forwarding was counted on the followers.
	fw := 0.0
	for _, f := range followers {
		mfs, err := f.metrics.reg.Gather()
		require.NoError(t, err)
		for _, mf := range mfs {
			if mf.GetName() == "shoal_raftmeta_forwarded_total" {
				for _, m := range mf.GetMetric() {
					fw += m.GetCounter().GetValue()
				}
			}
		}
	}
	assert.GreaterOrEqual(t, fw, 22.0)

	// Every replica converges to the same catalog.
	require.Eventually(t, func() bool {
		a := catalogDump(t, tc.nodes[0])
		return a == catalogDump(t, tc.nodes[1]) && a == catalogDump(t, tc.nodes[2])
	}, 10*time.Second, 20*time.Millisecond)
}

// Both log stores: raft-wal (the default) and raft-boltdb/v2.
func TestLeaderKilledUnderLoadLosesNoAcknowledgedWrite(t *testing.T) {
	for _, kind := range []string{LogStoreWAL, LogStoreBolt} {
		t.Run(kind, func(t *testing.T) { leaderKilledUnderLoad(t, kind) })
	}
}

func leaderKilledUnderLoad(t *testing.T, logStore string) {
	tc := newTestCluster(t, 3, func(_ int, c *Config) { c.LogStore = logStore })
	cl, err := NewClient(tc.addrs(), WithCacheTTL(0), WithRetries(20, 25*time.Millisecond, 500*time.Millisecond))
	require.NoError(t, err)
	defer cl.Close()
	ctx := context.Background()
	_, err = cl.CreateAccount(ctx, newAccount("load", 1_000_000))
	require.NoError(t, err)

	var (
		mu       sync.Mutex
		acked    []fsm.CreateDatabase
		failures atomic.Int64
		stop     atomic.Bool
		wg       sync.WaitGroup
	)
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				d := newDB("load")
				if _, err := cl.CreateDatabase(ctx, d); err != nil {
					// Unacknowledged: it may or may not exist; not checked.
					failures.Add(1)
					continue
				}
				mu.Lock()
				acked = append(acked, d)
				mu.Unlock()
			}
		}()
	}
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(acked) }
	require.Eventually(t, func() bool { return count() >= 150 }, 30*time.Second, 10*time.Millisecond)
	old := tc.waitLeader()
	require.NoError(t, old.Close()) // kill the leader mid-load
	before := count()
	require.Eventually(t, func() bool { return count() >= before+150 }, 40*time.Second, 10*time.Millisecond,
		"writes did not resume after the leader died")
	stop.Store(true)
	wg.Wait()

	leader := tc.waitLeader(old)
	require.NotEqual(t, old, leader)
	_, err = leader.ReadBarrier(ctx, LinearizableRead())
	require.NoError(t, err)
	for _, d := range acked {
		got, err := leader.FSM().Database(ctx, d.UUID)
		require.NoError(t, err, "acknowledged create %s lost after leader change", d.UUID)
		require.Equal(t, d.ObjectID, got.ObjectID)
	}
	acct, err := leader.FSM().Account(ctx, "load")
	require.NoError(t, err)
	// Retries reuse request IDs: no acknowledged create was applied twice
	// (the active count would exceed what exists otherwise) and the count is
	// at least the acknowledged creates.
	assert.GreaterOrEqual(t, acct.ActiveDatabases, int64(len(acked)))
	_, total, err := leader.FSM().ListDatabases(ctx, "load", fsm.ListQuery{PerPage: 1})
	require.NoError(t, err)
	assert.Equal(t, total, acct.ActiveDatabases)
	t.Logf("acknowledged %d creates, %d calls failed, new leader %s", len(acked), failures.Load(), leader.ID())
}

// Both log stores: raft-wal (the default) and raft-boltdb/v2.
func TestRestartedFollowerCatchesUpFromSnapshotAndLog(t *testing.T) {
	for _, kind := range []string{LogStoreWAL, LogStoreBolt} {
		t.Run(kind, func(t *testing.T) { restartedFollowerCatchesUp(t, kind) })
	}
}

func restartedFollowerCatchesUp(t *testing.T, logStore string) {
	tc := newTestCluster(t, 3, func(i int, c *Config) {
		c.LogStore = logStore
		c.SnapshotThreshold = 32
		c.TrailingLogs = 8
		c.SnapshotInterval = 200 * time.Millisecond
	})
	leader := tc.waitLeader()
	ctx := context.Background()
	_, err := leader.Apply(ctx, cmd(t, fsm.CmdCreateAccount, newAccount("acct", 100000)))
	require.NoError(t, err)
	for i := 0; i < 20; i++ {
		_, err := leader.Apply(ctx, cmd(t, fsm.CmdCreateDatabase, newDB("acct")))
		require.NoError(t, err)
	}
	fi := 0
	for i, n := range tc.nodes {
		if n != leader {
			fi = i
			break
		}
	}
	stoppedAt := tc.nodes[fi].AppliedIndex()
	require.NoError(t, tc.nodes[fi].Close())

	var created []fsm.CreateDatabase
	for i := 0; i < 200; i++ {
		d := newDB("acct")
		_, err := leader.Apply(ctx, cmd(t, fsm.CmdCreateDatabase, d))
		require.NoError(t, err)
		created = append(created, d)
	}
	snapIdx, err := leader.Snapshot()
	require.NoError(t, err)
	// The leader no longer holds the entries the follower missed: it must
	// ship a snapshot, then the log after it.
	first, err := leader.store.FirstIndex()
	require.NoError(t, err)
	require.Greater(t, first, stoppedAt+1, "log not compacted past the stopped follower")
	require.Greater(t, snapIdx, stoppedAt)
	for i := 0; i < 10; i++ {
		d := newDB("acct")
		_, err := leader.Apply(ctx, cmd(t, fsm.CmdCreateDatabase, d))
		require.NoError(t, err)
		created = append(created, d)
	}

	n := tc.restart(fi)
	target := leader.AppliedIndex()
	require.Eventually(t, func() bool { return n.AppliedIndex() >= target }, 20*time.Second, 20*time.Millisecond)
	for _, d := range created {
		_, err := n.FSM().Database(ctx, d.UUID)
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool { return catalogDump(t, n) == catalogDump(t, leader) }, 10*time.Second, 20*time.Millisecond)
}

func TestNonVoterServesStaleReadsAndRefusesPastMaxStale(t *testing.T) {
	tc := newTestCluster(t, 3, nil)
	var offset atomic.Int64
	nv := tc.add("reader", true, func(_ int, c *Config) {
		c.MaxStale = 2 * time.Second
		c.ReadTimeout = time.Second
		c.Now = func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
	})
	leader := tc.waitLeader()
	ctx := context.Background()

	cf := leader.raft.GetConfiguration()
	require.NoError(t, cf.Error())
	for _, s := range cf.Configuration().Servers {
		if string(s.ID) == "reader" {
			assert.Equal(t, "Nonvoter", s.Suffrage.String())
		}
	}

	_, err := leader.Apply(ctx, cmd(t, fsm.CmdCreateAccount, newAccount("acct", 10)))
	require.NoError(t, err)
	d := newDB("acct")
	res, err := nv.Apply(ctx, cmd(t, fsm.CmdCreateDatabase, d)) // a non-voter forwards writes too
	require.NoError(t, err)
	require.Eventually(t, func() bool { return nv.AppliedIndex() >= res.Index }, 10*time.Second, 10*time.Millisecond)

	meta, err := nv.ReadBarrier(ctx, StaleRead())
	require.NoError(t, err)
	assert.Equal(t, Stale, meta.Consistency)
	assert.Less(t, meta.StalenessMs, int64(2000))
	got, err := nv.FSM().Database(ctx, d.UUID)
	require.NoError(t, err)
	assert.Equal(t, d.Name, got.Name)

	// A tighter per-request bound than the staleness now is refused.
	offset.Store(int64(time.Second))
	_, err = nv.ReadBarrier(ctx, ReadOptions{Consistency: Stale, MaxStale: 500 * time.Millisecond})
	require.ErrorIs(t, err, ErrTooStale)

	// Stop every voter: the non-voter keeps serving until max_stale passes.
	for _, n := range tc.nodes[:3] {
		require.NoError(t, n.Close())
	}
	offset.Store(0)
	_, err = nv.ReadBarrier(ctx, StaleRead())
	require.NoError(t, err, "within max_stale the reader still serves")
	offset.Store(int64(3 * time.Second))
	_, err = nv.ReadBarrier(ctx, StaleRead())
	require.ErrorIs(t, err, ErrTooStale)

	// Through HTTP and the client the refusal keeps its identity.
	cl, err := NewClient([]string{nv.HTTPAddr()}, WithRetries(2, time.Millisecond, time.Millisecond))
	require.NoError(t, err)
	defer cl.Close()
	_, err = cl.Database(ctx, d.UUID, ReadOptions{Consistency: Stale, NoCache: true})
	require.ErrorIs(t, err, ErrTooStale)
	_, err = cl.Database(ctx, d.UUID, LinearizableRead())
	require.ErrorIs(t, err, ErrUnavailable)
	assert.False(t, errors.Is(err, ErrTooStale))
}

func TestLeaderReadsOnlyOnLeader(t *testing.T) {
	tc := newTestCluster(t, 3, nil)
	leader := tc.waitLeader()
	ctx := context.Background()
	_, err := leader.ReadBarrier(ctx, LeaderRead())
	require.NoError(t, err)
	_, err = tc.follower().ReadBarrier(ctx, LeaderRead())
	var nl *NotLeaderError
	require.ErrorAs(t, err, &nl)
	assert.Equal(t, leader.HTTPAddr(), nl.Leader)
	assert.Equal(t, leader.ID(), nl.LeaderID)
}

func TestStatsDrainLoopRunsOnLeader(t *testing.T) {
	tc := newTestCluster(t, 3, func(_ int, c *Config) { c.DrainInterval = 100 * time.Millisecond })
	leader := tc.waitLeader()
	ctx := context.Background()
	f := tc.follower()
	_, err := f.Apply(ctx, cmd(t, fsm.CmdCreateAccount, newAccount("acct", 10)))
	require.NoError(t, err)
	d := newDB("acct")
	_, err = f.Apply(ctx, cmd(t, fsm.CmdCreateDatabase, d))
	require.NoError(t, err)
	_, err = f.Apply(ctx, cmd(t, fsm.CmdSetDatabaseStats, fsm.SetDatabaseStats{Stats: []fsm.DatabaseStat{{UUID: d.UUID, SizeBytes: 4096}}}))
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		a, err := leader.FSM().Account(ctx, "acct")
		return err == nil && a.StorageBytes == 4096
	}, 10*time.Second, 20*time.Millisecond, "stats change log never drained into the account total")
	p, err := leader.FSM().PendingStatsChanges(ctx)
	require.NoError(t, err)
	assert.Zero(t, p)
}
