package raftmeta

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/raftmeta/fsm"
)

func TestClientFindsNewLeaderAfterLeaderChange(t *testing.T) {
	tc := newTestCluster(t, 3, nil)
	cl, err := NewClient(tc.addrs(), WithCacheTTL(0))
	require.NoError(t, err)
	defer cl.Close()
	ctx := context.Background()

	_, err = cl.CreateAccount(ctx, newAccount("acct", 1000))
	require.NoError(t, err)
	old := tc.waitLeader()
	assert.Equal(t, old.HTTPAddr(), cl.Leader(), "client learns the leader from the first answer")

	require.NoError(t, old.Close())
	d := newDB("acct")
	got, err := cl.CreateDatabase(ctx, d)
	require.NoError(t, err)
	assert.Equal(t, d.UUID, got.UUID)
	leader := tc.waitLeader(old)
	assert.Equal(t, leader.HTTPAddr(), cl.Leader())

	// Reads at every level reach the new leader or a live follower.
	for _, o := range []ReadOptions{LinearizableRead(), LeaderRead(), StaleRead()} {
		require.Eventually(t, func() bool {
			db, err := cl.Database(ctx, d.UUID, o)
			return err == nil && db.Name == d.Name
		}, 5*time.Second, 20*time.Millisecond, "read %s", o.Consistency)
	}
}

func TestClientErrorsMapToSentinels(t *testing.T) {
	tc := newTestCluster(t, 3, nil)
	cl, err := NewClient(tc.addrs())
	require.NoError(t, err)
	defer cl.Close()
	ctx := context.Background()

	_, err = cl.CreateDatabase(ctx, newDB("nobody"))
	require.ErrorIs(t, err, fsm.ErrAccountNotFound)

	_, err = cl.CreateAccount(ctx, newAccount("acct", 1))
	require.NoError(t, err)
	_, err = cl.CreateAccount(ctx, newAccount("acct", 1))
	require.ErrorIs(t, err, fsm.ErrExists)
	d := newDB("acct")
	_, err = cl.CreateDatabase(ctx, d)
	require.NoError(t, err)
	_, err = cl.CreateDatabase(ctx, newDB("acct"))
	require.ErrorIs(t, err, fsm.ErrDatabaseLimit)

	_, err = cl.Database(ctx, "00000000-0000-4000-8000-000000000000", LinearizableRead())
	require.ErrorIs(t, err, fsm.ErrNotFound)
	_, err = cl.Database(ctx, "NOT-A-UUID", StaleRead())
	require.ErrorIs(t, err, fsm.ErrInvalid)
	_, err = cl.Account(ctx, "ghost", LeaderRead())
	require.ErrorIs(t, err, fsm.ErrAccountNotFound)

	bad := newDB("acct")
	bad.Name = "Has Spaces"
	_, err = cl.CreateDatabase(ctx, bad)
	require.ErrorIs(t, err, fsm.ErrInvalid)

	dbs, total, err := cl.ListDatabases(ctx, "acct", fsm.ListQuery{}, LinearizableRead())
	require.NoError(t, err)
	assert.EqualValues(t, 1, total)
	require.Len(t, dbs, 1)
	assert.Equal(t, d.UUID, dbs[0].UUID)
	byName, err := cl.DatabaseByName(ctx, "acct", d.Name, StaleRead())
	if err == nil { // stale may lag; linearizable must not
		assert.Equal(t, d.UUID, byName.UUID)
	}
	byName, err = cl.DatabaseByName(ctx, "acct", d.Name, LinearizableRead())
	require.NoError(t, err)
	assert.Equal(t, d.UUID, byName.UUID)
	hb, err := cl.Heartbeat(ctx, []string{d.UUID, "00000000-0000-4000-8000-000000000000"}, LinearizableRead())
	require.NoError(t, err)
	require.Len(t, hb.Databases, 2)
	assert.Contains(t, hb.Accounts, "acct")
}

func TestClientUnavailableWhenAllNodesDown(t *testing.T) {
	var addrs []string
	for i := 0; i < 3; i++ { // ports that were free a moment ago: nothing listens
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		addrs = append(addrs, ln.Addr().String())
		ln.Close()
	}
	cl, err := NewClient(addrs, WithRetries(4, time.Millisecond, 5*time.Millisecond))
	require.NoError(t, err)
	ctx := context.Background()
	_, err = cl.CreateAccount(ctx, newAccount("a", 1))
	require.ErrorIs(t, err, ErrUnavailable)
	_, err = cl.Account(ctx, "a", StaleRead())
	require.ErrorIs(t, err, ErrUnavailable)
	_, err = cl.Account(ctx, "a", LinearizableRead())
	require.ErrorIs(t, err, ErrUnavailable)

	// A live cluster whose nodes were all closed answers the same way.
	tc := newTestCluster(t, 3, nil)
	cl2, err := NewClient(tc.addrs(), WithRetries(4, time.Millisecond, 5*time.Millisecond))
	require.NoError(t, err)
	_, err = cl2.CreateAccount(ctx, newAccount("a", 1))
	require.NoError(t, err)
	for _, n := range tc.nodes {
		require.NoError(t, n.Close())
	}
	_, err = cl2.CreateAccount(ctx, newAccount("b", 1))
	require.ErrorIs(t, err, ErrUnavailable)
	_, err = cl2.Account(ctx, "a", StaleRead())
	require.ErrorIs(t, err, ErrUnavailable)
}

// fakeNode is an HTTP stand-in counting account reads, to observe the
// client's cache without timing.
type fakeNode struct {
	reads   atomic.Int64
	release chan struct{}
}

func (f *fakeNode) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.reads.Add(1)
	if f.release != nil {
		<-f.release
	}
	writeJSON(w, 200, map[string]any{
		"result": fsm.Account{ID: r.URL.Path[len("/v1/accounts/"):], Tier: fsm.TierFree},
		"meta":   ReadMeta{Node: "fake", Consistency: Consistency(r.URL.Query().Get("consistency"))},
	})
}

func TestClientStaleCacheSharesOneEntryPerKey(t *testing.T) {
	fn := &fakeNode{release: make(chan struct{})}
	srv := httptest.NewServer(fn)
	defer srv.Close()
	var now atomic.Int64
	now.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	clock := func() time.Time { return time.Unix(0, now.Load()) }
	cl, err := NewClient([]string{srv.Listener.Addr().String()}, WithClock(clock), WithCacheTTL(2*time.Second))
	require.NoError(t, err)
	defer cl.Close()
	ctx := context.Background()

	// 50 concurrent misses of one key: one request (singleflight).
	var wg sync.WaitGroup
	errs := make(chan error, 50)
	for i := 0; i < 50; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a, err := cl.Account(ctx, "acct", StaleRead())
			if err == nil && a.ID != "acct" {
				err = assert.AnError
			}
			errs <- err
		}()
	}
	require.Eventually(t, func() bool { return fn.reads.Load() >= 1 }, 5*time.Second, time.Millisecond)
	close(fn.release)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	assert.EqualValues(t, 1, fn.reads.Load())

	// Within the TTL: served from the entry.
	now.Add(int64(1500 * time.Millisecond))
	_, err = cl.Account(ctx, "acct", StaleRead())
	require.NoError(t, err)
	assert.EqualValues(t, 1, fn.reads.Load())
	// Another key is another entry.
	_, err = cl.Account(ctx, "other", StaleRead())
	require.NoError(t, err)
	assert.EqualValues(t, 2, fn.reads.Load())
	// Linearizable and NoCache reads bypass the cache.
	_, err = cl.Account(ctx, "acct", LinearizableRead())
	require.NoError(t, err)
	_, err = cl.Account(ctx, "acct", ReadOptions{Consistency: Stale, NoCache: true})
	require.NoError(t, err)
	assert.EqualValues(t, 4, fn.reads.Load())
	// Past the TTL: fetched again.
	now.Add(int64(time.Second))
	_, err = cl.Account(ctx, "acct", StaleRead())
	require.NoError(t, err)
	assert.EqualValues(t, 5, fn.reads.Load())
	// A write through the client drops the account's entry.
	cl.invalidate("acct", "", "")
	_, err = cl.Account(ctx, "acct", StaleRead())
	require.NoError(t, err)
	assert.EqualValues(t, 6, fn.reads.Load())
}

func TestClientStaleReadsSpreadAndFallBack(t *testing.T) {
	tc := newTestCluster(t, 3, nil)
	leader := tc.waitLeader()
	f := tc.follower()
	ctx := context.Background()
	_, err := leader.Apply(ctx, cmd(t, fsm.CmdCreateAccount, newAccount("acct", 5)))
	require.NoError(t, err)
	// A dead address first, then a follower and the leader.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	dead := ln.Addr().String()
	ln.Close()
	// Hedging off and long attempt timeouts: on a loaded machine a slow
	// node would otherwise pull a hedged second attempt (served by both,
	// counted twice) or be demoted for timing out — the spread over the
	// nodes is what is under test, not their speed. The dead address
	// refuses at once and is demoted whatever the timeouts.
	cl, err := NewClient([]string{dead, f.HTTPAddr(), leader.HTTPAddr()}, WithCacheTTL(0), WithHedge(0), WithAttemptTimeouts(time.Minute, time.Minute))
	require.NoError(t, err)
	defer cl.Close()
	require.Eventually(t, func() bool {
		_, err := cl.Account(ctx, "acct", StaleRead())
		return err == nil
	}, time.Minute, 10*time.Millisecond)
	// Stale reads may trail the leader by one commit round: let every node
	// apply the account first.
	for _, n := range []*Node{f, leader} {
		require.Eventually(t, func() bool { return n.AppliedIndex() >= leader.AppliedIndex() }, 10*time.Second, 5*time.Millisecond)
	}
	// Stale reads are spread over the live nodes (not all on the first
	// listed), and the dead one is skipped.
	fBefore, lBefore := staleReads(t, f), staleReads(t, leader)
	for i := 0; i < 10; i++ {
		a, err := cl.Account(ctx, "acct", StaleRead())
		require.NoError(t, err)
		assert.Equal(t, "acct", a.ID)
	}
	fServed, lServed := staleReads(t, f)-fBefore, staleReads(t, leader)-lBefore
	assert.Equal(t, 10.0, fServed+lServed)
	assert.Positive(t, fServed)
	assert.Positive(t, lServed)
}

func staleReads(t *testing.T, n *Node) float64 {
	mfs, err := n.metrics.reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != "shoal_raftmeta_reads_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			lbl := map[string]string{}
			for _, l := range m.GetLabel() {
				lbl[l.GetName()] = l.GetValue()
			}
			if lbl["consistency"] == "stale" && lbl["outcome"] == "ok" {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// hangingNode never answers until the test ends: a SIGSTOPped follower.
type hangingNode struct {
	reads atomic.Int64
	done  chan struct{}
}

func (h *hangingNode) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.reads.Add(1)
	select {
	case <-h.done:
	case <-r.Context().Done():
	}
}

// A stale read whose first node hangs is answered by the next one once the
// hedge delay passes, not after the attempt timeout: with an attempt
// timeout of an hour and a 5 s budget, only hedging can answer at all.
// Every read succeeds whichever node the round-robin puts first.
func TestClientStaleReadHedgesPastAHungNode(t *testing.T) {
	hung := &hangingNode{done: make(chan struct{})}
	hsrv := httptest.NewServer(hung)
	defer hsrv.Close()
	defer close(hung.done)
	good := &fakeNode{}
	gsrv := httptest.NewServer(good)
	defer gsrv.Close()
	cl, err := NewClient([]string{hsrv.Listener.Addr().String(), gsrv.Listener.Addr().String()},
		WithCacheTTL(0), WithAttemptTimeouts(time.Hour, time.Hour), WithHedge(20*time.Millisecond))
	require.NoError(t, err)
	defer cl.Close()
	for i := range 6 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		a, err := cl.Account(ctx, fmt.Sprintf("acct%d", i), StaleRead())
		cancel()
		require.NoError(t, err, "read %d", i)
		assert.Equal(t, fmt.Sprintf("acct%d", i), a.ID)
	}
	assert.Positive(t, hung.reads.Load(), "the hung node was asked first at least once")

	// Hedging off: a read that starts on the hung node waits for it.
	off, err := NewClient([]string{hsrv.Listener.Addr().String()}, WithCacheTTL(0),
		WithAttemptTimeouts(time.Hour, time.Hour), WithHedge(0), WithRetries(1, time.Millisecond, time.Millisecond))
	require.NoError(t, err)
	defer off.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err = off.Account(ctx, "x", StaleRead())
	assert.Error(t, err)
}

// Heartbeats (PreferFollowers) go to the followers, taking turns, and
// never to the leader the client knows while a follower answers; with the
// followers unreachable they fall back to the leader. Plain stale reads
// still include the leader in their rotation. Hedging is off so that a
// slow follower on a loaded machine cannot pull a hedged attempt onto the
// leader: the order of the nodes is what is under test.
func TestClientHeartbeatsPreferFollowers(t *testing.T) {
	tc := newTestCluster(t, 3, nil)
	leader := tc.waitLeader()
	ctx := context.Background()
	cl, err := NewClient(tc.addrs(), WithCacheTTL(0), WithHedge(0), WithAttemptTimeouts(10*time.Second, 10*time.Second))
	require.NoError(t, err)
	defer cl.Close()
	_, err = cl.CreateAccount(ctx, newAccount("acct", 5))
	require.NoError(t, err)
	require.Equal(t, leader.HTTPAddr(), cl.Leader(), "a write teaches the client the leader")
	for _, n := range tc.nodes {
		require.Eventually(t, func() bool { return n.AppliedIndex() >= leader.AppliedIndex() }, 10*time.Second, 5*time.Millisecond)
	}
	served := func() map[string]float64 {
		out := map[string]float64{}
		for _, n := range tc.nodes {
			out[n.HTTPAddr()] = staleReads(t, n)
		}
		return out
	}
	uuids := []string{"01890a5d-ac96-774b-bcce-b302099a8057"}
	hb := ReadOptions{Consistency: Stale, PreferFollowers: true}
	before := served()
	const n = 30
	for range n {
		_, err := cl.Heartbeat(ctx, uuids, hb)
		require.NoError(t, err)
	}
	after := served()
	var followers float64
	for addr, v := range after {
		d := v - before[addr]
		if addr == leader.HTTPAddr() {
			assert.Zero(t, d, "the leader served heartbeats while followers answered")
			continue
		}
		assert.Positive(t, d, "follower %s took no turn", addr)
		followers += d
	}
	assert.Equal(t, float64(n), followers)

	// A client that only reads (an object host between writes) learns the
	// leader from its first answer and spares it from then on.
	ro, err := NewClient(tc.addrs(), WithCacheTTL(0), WithHedge(0), WithAttemptTimeouts(10*time.Second, 10*time.Second))
	require.NoError(t, err)
	defer ro.Close()
	require.Empty(t, ro.Leader())
	_, err = ro.Heartbeat(ctx, uuids, hb)
	require.NoError(t, err)
	require.Equal(t, leader.HTTPAddr(), ro.Leader(), "a read answer teaches the client the leader")
	before = served()
	for range n {
		_, err := ro.Heartbeat(ctx, uuids, hb)
		require.NoError(t, err)
	}
	assert.Zero(t, served()[leader.HTTPAddr()]-before[leader.HTTPAddr()], "a read-only client sent heartbeats to the leader")

	// Plain stale reads: the leader takes its turn.
	before = served()
	for range n {
		_, err := cl.Heartbeat(ctx, uuids, StaleRead())
		require.NoError(t, err)
	}
	assert.Positive(t, served()[leader.HTTPAddr()]-before[leader.HTTPAddr()])

	// Followers unreachable: the leader answers.
	var dead []string
	for range 2 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		dead = append(dead, ln.Addr().String())
		ln.Close()
	}
	cl2, err := NewClient(append(dead, leader.HTTPAddr()), WithCacheTTL(0), WithHedge(0))
	require.NoError(t, err)
	defer cl2.Close()
	_, err = cl2.CreateAccount(ctx, newAccount("acct2", 5))
	require.NoError(t, err)
	require.Equal(t, leader.HTTPAddr(), cl2.Leader())
	lBefore := staleReads(t, leader)
	for range 5 {
		_, err := cl2.Heartbeat(ctx, uuids, hb)
		require.NoError(t, err)
	}
	assert.Equal(t, 5.0, staleReads(t, leader)-lBefore)
}

// A PreferFollowers read never hedges onto the leader: with both followers
// hung far past the hedge delay (attempts that never time out), both
// followers are asked and the leader is not; plain stale reads do hedge to
// it. Once the followers fail (attempt timeout), the leader answers.
func TestClientPreferFollowersNeverHedgesToLeader(t *testing.T) {
	hung := &hangingNode{done: make(chan struct{})}
	f1, f2 := httptest.NewServer(hung), httptest.NewServer(hung)
	defer f1.Close()
	defer f2.Close()
	defer close(hung.done)
	lead := &fakeNode{}
	lsrv := httptest.NewServer(lead)
	defer lsrv.Close()
	addrs := []string{f1.Listener.Addr().String(), f2.Listener.Addr().String(), lsrv.Listener.Addr().String()}
	hb := ReadOptions{Consistency: Stale, PreferFollowers: true}

	cl, err := NewClient(addrs, WithCacheTTL(0), WithAttemptTimeouts(time.Hour, time.Hour), WithHedge(10*time.Millisecond),
		WithRetries(1, time.Millisecond, time.Millisecond))
	require.NoError(t, err)
	defer cl.Close()
	cl.setLeader(addrs[2])
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	_, err = cl.Account(ctx, "x", hb)
	cancel()
	assert.Error(t, err, "only hung followers may be asked")
	assert.Zero(t, lead.reads.Load(), "the leader was asked as a hedge")
	assert.EqualValues(t, 2, hung.reads.Load(), "the second follower is a hedge target")

	ctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
	_, err = cl.Account(ctx, "y", StaleRead())
	cancel()
	require.NoError(t, err, "a plain stale read hedges to the leader")
	assert.EqualValues(t, 1, lead.reads.Load())

	fast, err := NewClient(addrs, WithCacheTTL(0), WithAttemptTimeouts(50*time.Millisecond, 50*time.Millisecond), WithHedge(10*time.Millisecond))
	require.NoError(t, err)
	defer fast.Close()
	fast.setLeader(addrs[2])
	ctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
	a, err := fast.Account(ctx, "z", hb)
	cancel()
	require.NoError(t, err, "followers failing: the leader answers")
	assert.Equal(t, "z", a.ID)
	assert.EqualValues(t, 2, lead.reads.Load())
}

// orderAvoiding puts the avoided node last, behind the demoted ones too,
// and changes nothing for "" or an unknown node.
func TestNodeOrderAvoiding(t *testing.T) {
	now := time.Unix(0, 0)
	o := newNodeOrder([]string{"a", "b", "c", "d"}, func() time.Time { return now }, time.Minute)
	firsts := map[string]bool{}
	for range 8 {
		got := o.orderAvoiding("b")
		require.Len(t, got, 4)
		assert.Equal(t, "b", got[3], "%v", got)
		assert.ElementsMatch(t, []string{"a", "b", "c", "d"}, got)
		firsts[got[0]] = true
	}
	assert.Len(t, firsts, 3, "the other nodes take turns first")
	o.demote("c", time.Minute)
	for range 8 {
		got := o.orderAvoiding("b")
		assert.Equal(t, []string{"c", "b"}, got[2:], "%v: a demoted follower before the leader", got)
	}
	assert.Len(t, o.orderAvoiding(""), 4)
	assert.Len(t, o.orderAvoiding("zz"), 4)
}
