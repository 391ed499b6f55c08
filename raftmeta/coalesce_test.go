package raftmeta

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// gatedProxy stands in front of a node: it counts the requests per path
// and the commands of each /v1/apply-batch, and holds the first /v1/apply
// until release is closed, so a test can queue writes behind it.
type gatedProxy struct {
	srv         *httptest.Server
	release     chan struct{}
	gateOnce    sync.Once
	releaseOnce sync.Once
	singles     atomic.Int64
	batches     atomic.Int64
	batched     atomic.Int64 // commands carried by /v1/apply-batch requests
	noBatches   bool         // answer /v1/apply-batch 404, as a build without it
	delay       atomic.Int64 // a slow round trip: each write request waits this long (ns) first

	mu    sync.Mutex
	sizes []int // commands per write request, in arrival order (a /v1/apply is 1)
}

// requestSizes is a copy of the commands per write request so far.
func (g *gatedProxy) requestSizes() []int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]int(nil), g.sizes...)
}

func (g *gatedProxy) recordSize(n int) {
	g.mu.Lock()
	g.sizes = append(g.sizes, n)
	g.mu.Unlock()
}

func newGatedProxy(t *testing.T, n *Node, noBatches bool) *gatedProxy {
	target, err := url.Parse("http://" + n.HTTPAddr())
	require.NoError(t, err)
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.ModifyResponse = func(r *http.Response) error { // keep the client on the proxy
		r.Header.Del(headerLeader)
		return nil
	}
	g := &gatedProxy{release: make(chan struct{}), noBatches: noBatches}
	g.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if d := g.delay.Load(); d > 0 && strings.HasPrefix(r.URL.Path, "/v1/apply") {
			time.Sleep(time.Duration(d)) // shapes the load (a slow network); nothing asserts on time
		}
		switch r.URL.Path {
		case "/v1/apply":
			g.singles.Add(1)
			g.recordSize(1)
			first := false
			g.gateOnce.Do(func() { first = true })
			if first {
				<-g.release
			}
		case "/v1/apply-batch":
			if g.noBatches {
				writeJSON(w, 404, map[string]wireError{"error": {Code: fsm.CodeNotFound, Message: "no such endpoint: " + r.URL.Path}})
				g.batches.Add(1)
				return
			}
			body, err := io.ReadAll(r.Body)
			if err != nil {
				http.Error(w, err.Error(), 500)
				return
			}
			var req ApplyBatchRequest
			if json.Unmarshal(body, &req) == nil {
				g.batched.Add(int64(len(req.Commands)))
				g.recordSize(len(req.Commands))
			}
			g.batches.Add(1)
			r.Body = io.NopCloser(bytes.NewReader(body))
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(func() {
		g.open() // a failed test may not have let the held request go
		g.srv.Close()
	})
	return g
}

// open lets the held request (and every later one) through.
func (g *gatedProxy) open() { g.releaseOnce.Do(func() { close(g.release) }) }

func (g *gatedProxy) addr() string { return strings.TrimPrefix(g.srv.URL, "http://") }

// queued is how many writes wait in cl's coalescer.
func queued(cl *Client) int {
	cl.writes.mu.Lock()
	defer cl.writes.mu.Unlock()
	return len(cl.writes.queue)
}

// Concurrent Client.Apply calls share requests: while one write is in
// flight (the only slot), the others queue and go together in one
// /v1/apply-batch. Each keeps its own outcome — a name taken by another
// write of the batch is that write's refusal — and its own entry; a caller
// that gives up while queued gets ErrUnavailable, while its write still
// goes out with the others (its outcome was unknown, not failed). Every
// replica ends with the same catalog.
func TestClientCoalescesConcurrentWrites(t *testing.T) {
	tc := newTestCluster(t, 3, nil)
	leader := tc.waitLeader()
	ctx := context.Background()
	_, err := leader.Apply(ctx, cmd(t, fsm.CmdCreateAccount, newAccount("acct", 1000)))
	require.NoError(t, err)
	g := newGatedProxy(t, leader, false)
	cl, err := NewClient([]string{g.addr()}, WithCacheTTL(0), WithWriteBatching(MaxApplyBatch, 1))
	require.NoError(t, err)
	defer cl.Close()

	const n = 40
	creates := make([]fsm.CreateDatabase, n)
	for i := range creates {
		creates[i] = newDB("acct")
	}
	creates[9].Name = creates[8].Name // one of the two is refused
	errs := make([]error, n)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the first write takes the slot and is held by the proxy
		defer wg.Done()
		_, errs[0] = cl.CreateDatabase(ctx, creates[0])
	}()
	require.Eventually(t, func() bool { return g.singles.Load() == 1 }, 10*time.Second, time.Millisecond)
	impatient, cancel := context.WithCancel(ctx)
	gaveUp := make(chan struct{})
	for i := 1; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := ctx
			if i == 5 {
				c = impatient
				defer close(gaveUp)
			}
			_, errs[i] = cl.CreateDatabase(c, creates[i])
		}()
	}
	require.Eventually(t, func() bool { return queued(cl) == n-1 }, 10*time.Second, time.Millisecond)
	cancel() // write 5 gives up while queued
	<-gaveUp
	require.ErrorIs(t, errs[5], ErrUnavailable)
	g.open()
	wg.Wait()

	assert.EqualValues(t, 1, g.singles.Load(), "only the first write went alone")
	assert.EqualValues(t, 1, g.batches.Load(), "the queued writes shared one request")
	assert.EqualValues(t, n-1, g.batched.Load())
	refused := 0
	for i, err := range errs {
		switch {
		case i == 5:
		case i == 8 || i == 9:
			if err != nil {
				require.ErrorIs(t, err, fsm.ErrNameTaken)
				refused++
			}
		default:
			require.NoError(t, err, "write %d", i)
		}
	}
	assert.Equal(t, 1, refused, "exactly one of the two writes of one name is refused")
	// The impatient caller's write went out with the batch all the same.
	_, err = cl.Database(ctx, creates[5].UUID, LinearizableRead())
	require.NoError(t, err)
	acct, err := cl.Account(ctx, "acct", LinearizableRead())
	require.NoError(t, err)
	assert.EqualValues(t, n-1, acct.ActiveDatabases)
	want := catalogDump(t, tc.waitLeader())
	for _, node := range tc.nodes {
		require.Eventually(t, func() bool { return catalogDump(t, node) == want }, 10*time.Second, 20*time.Millisecond, node.ID())
	}
}

// Against a node of a build without /v1/apply-batch (a rolling upgrade: a
// new client, an old leader), coalesced writes go one by one through
// /v1/apply with the same outcomes, and the client does not try a batch
// again for a while.
func TestClientCoalescedWritesFallBackOnOlderNodes(t *testing.T) {
	tc := newTestCluster(t, 1, nil)
	leader := tc.waitLeader()
	ctx := context.Background()
	_, err := leader.Apply(ctx, cmd(t, fsm.CmdCreateAccount, newAccount("acct", 1000)))
	require.NoError(t, err)
	g := newGatedProxy(t, leader, true)
	cl, err := NewClient([]string{g.addr()}, WithCacheTTL(0), WithWriteBatching(MaxApplyBatch, 1))
	require.NoError(t, err)
	defer cl.Close()

	run := func(n int, gate bool) []error {
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, errs[i] = cl.CreateDatabase(ctx, newDB("acct"))
			}()
			if gate && i == 0 {
				require.Eventually(t, func() bool { return g.singles.Load() == 1 }, 10*time.Second, time.Millisecond)
			}
		}
		if gate {
			require.Eventually(t, func() bool { return queued(cl) == n-1 }, 10*time.Second, time.Millisecond)
			g.open()
		}
		wg.Wait()
		return errs
	}
	for i, err := range run(10, true) {
		require.NoError(t, err, "write %d", i)
	}
	assert.EqualValues(t, 1, g.batches.Load(), "one batch tried, answered 404")
	assert.EqualValues(t, 10, g.singles.Load(), "every write through /v1/apply")
	for i, err := range run(20, false) {
		require.NoError(t, err, "write %d", i)
	}
	assert.EqualValues(t, 1, g.batches.Load(), "no batch tried again within coalesceRecheck")
	assert.EqualValues(t, 30, g.singles.Load())
	acct, err := cl.Account(ctx, "acct", LinearizableRead())
	require.NoError(t, err)
	assert.EqualValues(t, 30, acct.ActiveDatabases)
}

// The hand-written answers of /v1/apply and /v1/apply-batch are what
// writeJSON (encoding/json) wrote: byte for byte for results, refusals,
// errors and empty values, and for node names that need escaping.
func TestApplyAnswersMatchEncodingJSON(t *testing.T) {
	db, err := json.Marshal(fsm.Database{UUID: "0190a8b2-0000-7000-8000-000000000001", AccountID: "a", Name: "n<&>\u2028", State: fsm.StateActive, CreatedAt: 42})
	require.NoError(t, err)
	refusal := &fsm.Result{Index: 9, Err: &fsm.Error{Code: fsm.CodeNameTaken, Message: "name \"x\" taken <b>"}}
	results := []*fsm.Result{{Index: 7, Value: db}, {Index: 8}, refusal, {Index: 1 << 60, Value: json.RawMessage(`{"a":[1,2,{"b":null}]}`)}}
	for _, node := range []string{"c1", "node \"q\" <x>", ""} {
		items := []ApplyBatchItem{{Result: results[0]}, {Error: &wireError{Code: CodeNotLeader, Message: "m", Leader: "l:1"}},
			{Result: results[1]}, {Result: results[2]}, {Result: results[3]}}
		resp := ApplyBatchResponse{Items: items, Node: node}
		got, err := encodeBatchResponse(resp)
		require.NoError(t, err)
		assert.Equal(t, string(encoded(t, resp)), string(got), "node %q", node)

		for _, r := range results {
			want := httptest.NewRecorder()
			writeJSON(want, 200, ApplyResponse{Result: *r, Node: node})
			rec := httptest.NewRecorder()
			writeApplyResponse(rec, ApplyResponse{Result: *r, Node: node})
			assert.Equal(t, want.Body.String(), rec.Body.String())
			assert.Equal(t, want.Header(), rec.Header())
			assert.Equal(t, want.Code, rec.Code)
		}
	}
}

// encoded is writeJSON's body for v.
func encoded(t *testing.T, v any) []byte {
	rec := httptest.NewRecorder()
	writeJSON(rec, 200, v)
	return rec.Body.Bytes()
}

// Close ends the coalesced writes still in flight (outcome unknown:
// ErrUnavailable), waits for the client's goroutines, and leaves the client
// usable: a write after Close is sent as any other.
func TestClientCloseEndsCoalescedWritesAndStaysUsable(t *testing.T) {
	tc := newTestCluster(t, 1, nil)
	leader := tc.waitLeader()
	ctx := context.Background()
	_, err := leader.Apply(ctx, cmd(t, fsm.CmdCreateAccount, newAccount("acct", 1000)))
	require.NoError(t, err)
	g := newGatedProxy(t, leader, false)
	cl, err := NewClient([]string{g.addr()}, WithCacheTTL(0), WithWriteBatching(MaxApplyBatch, 1))
	require.NoError(t, err)
	defer cl.Close()

	held := make(chan error, 1)
	go func() { // takes the slot; the proxy holds its request
		_, err := cl.CreateDatabase(ctx, newDB("acct"))
		held <- err
	}()
	require.Eventually(t, func() bool { return g.singles.Load() == 1 }, 10*time.Second, time.Millisecond)
	closed := make(chan struct{})
	go func() {
		cl.Close()
		close(closed)
	}()
	select {
	case err := <-held:
		require.ErrorIs(t, err, ErrUnavailable)
	case <-time.After(30 * time.Second):
		t.Fatal("Close did not end the write in flight")
	}
	<-closed
	g.open()
	_, err = cl.CreateDatabase(ctx, newDB("acct"))
	require.NoError(t, err, "a client used after Close still writes")
}

// A write sent alone (the client was idle) is bounded by its caller's
// context, as every write was before coalescing: cancelling it ends the
// request, even while the node has not answered.
func TestClientLoneWriteEndsWithItsContext(t *testing.T) {
	tc := newTestCluster(t, 1, nil)
	leader := tc.waitLeader()
	ctx := context.Background()
	_, err := leader.Apply(ctx, cmd(t, fsm.CmdCreateAccount, newAccount("acct", 1000)))
	require.NoError(t, err)
	g := newGatedProxy(t, leader, false)
	cl, err := NewClient([]string{g.addr()}, WithCacheTTL(0), WithWriteBatching(MaxApplyBatch, 1))
	require.NoError(t, err)
	defer cl.Close()

	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := cl.CreateDatabase(wctx, newDB("acct"))
		done <- err
	}()
	require.Eventually(t, func() bool { return g.singles.Load() == 1 }, 10*time.Second, time.Millisecond)
	cancel()
	select {
	case err := <-done:
		require.ErrorIs(t, err, ErrUnavailable)
	case <-time.After(30 * time.Second):
		t.Fatal("the write ignored its caller's cancellation")
	}
	g.open()
	_, err = cl.CreateDatabase(ctx, newDB("acct"))
	require.NoError(t, err)
}

// gathering reports whether cl's coalescer holds its send slot with
// nothing queued (a slot holder waiting in gatherLocked, or about to).
func gathering(cl *Client) bool {
	cl.writes.mu.Lock()
	defer cl.writes.mu.Unlock()
	return cl.writes.inflight == 1 && len(cl.writes.queue) == 0
}

// Closed-loop callers merge into one batch per round trip with gathering.
// With one send slot and no gather, 16 callers each writing in a loop
// settle into two alternating groups of about 8 (one in flight while the
// other queues); gathering waits, after a send of several, for the
// callers it just answered to queue again, so a request carries all 16.
// The proxy's 20 ms round trip only shapes the load (the callers come back
// well within it); the check is on batch sizes, not on time.
func TestClientGatherMergesClosedLoopCallers(t *testing.T) {
	tc := newTestCluster(t, 1, nil)
	leader := tc.waitLeader()
	ctx := context.Background()
	_, err := leader.Apply(ctx, cmd(t, fsm.CmdCreateAccount, newAccount("acct", 100_000)))
	require.NoError(t, err)
	g := newGatedProxy(t, leader, false)
	g.open()
	g.delay.Store(int64(20 * time.Millisecond))
	// A generous bound: every caller answered comes back long before it on
	// a loaded machine, so the batch is full, not cut by the timer.
	cl, err := NewClient([]string{g.addr()}, WithCacheTTL(0), WithWriteBatching(MaxApplyBatch, 1), WithWriteGather(500*time.Millisecond))
	require.NoError(t, err)
	defer cl.Close()

	const callers, each = 16, 12
	errs := make([]error, callers*each)
	var wg sync.WaitGroup
	for c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				_, errs[c*each+i] = cl.CreateDatabase(ctx, newDB("acct"))
			}
		}()
	}
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "write %d", i)
	}
	sizes := g.requestSizes()
	total := 0
	full := 0
	for _, n := range sizes {
		total += n
		if n == callers {
			full++
		}
	}
	t.Logf("commands per request: %v", sizes)
	assert.Equal(t, callers*each, total, "every write sent once")
	// Without gathering (checked: WithWriteGather(0) fails both checks)
	// the callers split in two groups, 8 commands per request on average:
	// here a lone write alternating with the 15 queued behind it (the
	// first caller back finds the slot free), about 2×each requests, half
	// of them of one command. With it, the callers move in one group.
	assert.GreaterOrEqual(t, full, each-2, "requests carrying all %d callers; sizes %v", callers, sizes)
	assert.LessOrEqual(t, len(sizes), each+3, "requests in all; sizes %v", sizes)
	st := cl.GatherStats()
	t.Logf("gathering: %+v", st)
	assert.GreaterOrEqual(t, st.Filled, int64(each-3), "gathers that filled")
	acct, err := cl.Account(ctx, "acct", LinearizableRead())
	require.NoError(t, err)
	assert.EqualValues(t, callers*each, acct.ActiveDatabases)
}

// A lone caller never gathers, however long the bound: a send of one
// command is no evidence of other callers, so its slot is free again the
// moment its answer is in, and the caller's next write goes at once on a
// free slot (its own request, under its own ctx) — with a one-hour bound,
// a wait entered would hold the slot.
func TestClientGatherNeverHoldsALoneCaller(t *testing.T) {
	tc := newTestCluster(t, 1, nil)
	leader := tc.waitLeader()
	ctx := context.Background()
	_, err := leader.Apply(ctx, cmd(t, fsm.CmdCreateAccount, newAccount("acct", 1000)))
	require.NoError(t, err)
	g := newGatedProxy(t, leader, false)
	g.open()
	cl, err := NewClient([]string{g.addr()}, WithCacheTTL(0), WithWriteBatching(MaxApplyBatch, 1), WithWriteGather(time.Hour))
	require.NoError(t, err)
	defer cl.Close()

	for i := range 20 {
		_, err := cl.CreateDatabase(ctx, newDB("acct"))
		require.NoError(t, err, "write %d", i)
		require.False(t, gathering(cl), "write %d: the slot is held after a lone write", i)
	}
	assert.EqualValues(t, 20, g.singles.Load(), "each write its own /v1/apply")
	assert.Zero(t, g.batches.Load())
}

// Close during a gather returns: it ends the wait (the client's context),
// waits for the slot holder's goroutine, and the client stays usable —
// the next write goes at once. The bound is an hour, so only Close can end
// this wait within the test's deadline.
func TestClientCloseEndsAGather(t *testing.T) {
	tc := newTestCluster(t, 1, nil)
	leader := tc.waitLeader()
	ctx := context.Background()
	_, err := leader.Apply(ctx, cmd(t, fsm.CmdCreateAccount, newAccount("acct", 1000)))
	require.NoError(t, err)
	g := newGatedProxy(t, leader, false)
	cl, err := NewClient([]string{g.addr()}, WithCacheTTL(0), WithWriteBatching(MaxApplyBatch, 1), WithWriteGather(time.Hour))
	require.NoError(t, err)
	defer cl.Close()

	// A lone write held by the proxy, three queued behind it: they go as
	// one batch, whose return (three answered, none queued) starts a
	// gather for three more that never come.
	errs := make([]error, 4)
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = cl.CreateDatabase(ctx, newDB("acct"))
		}()
		if i == 0 {
			require.Eventually(t, func() bool { return g.singles.Load() == 1 }, 10*time.Second, time.Millisecond)
		}
	}
	require.Eventually(t, func() bool { return queued(cl) == 3 }, 10*time.Second, time.Millisecond)
	g.open()
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "write %d", i)
	}
	require.EqualValues(t, 1, g.batches.Load())
	require.True(t, gathering(cl), "the slot holder gathers after a batch of three")

	closed := make(chan struct{})
	go func() {
		cl.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(30 * time.Second):
		t.Fatal("Close did not end the gather")
	}
	assert.False(t, gathering(cl), "Close left the slot held")
	_, err = cl.CreateDatabase(ctx, newDB("acct"))
	require.NoError(t, err, "a client used after Close still writes")
	assert.EqualValues(t, 2, g.singles.Load(), "the write after Close went at once, alone")
}

// The adaptive gather (the default, WithWriteGatherAdaptive) holds no
// writes of a paced open loop and still gathers for closed-loop callers.
//
// Open loop: writes arrive one at a time, each in its own goroutine, at
// least 25 ms apart (a sleep between launches, so arrivals never bunch),
// while the proxy takes 80 ms per request: each send carries about three
// writes, so after each the slot holder may gather, for three more within
// its 20 ms bound — which cannot come (at most one arrives per 20 ms).
// Gathering after every such send (the rule before the adaptive one,
// WithWriteGatherAdaptive(false): checked, it fails here with every
// eligible send waited) holds each of those batches for the bound; the
// adaptive rule stops after three waits run out and only probes, every
// groupwait.ProbeEvery-th send.
//
// Closed loop, same client: 16 callers writing in a loop come back at once,
// so the probes fill, gathering turns back on, and requests carry all 16
// (a rule that never gathers, or never probes, sends 1, 15, 1, 15…).
// The assertions are on the client's gathering counters and on the
// proxy's request sizes, not on time.
func TestClientGatherSkipsAnOpenLoopAndKeepsClosedLoops(t *testing.T) {
	tc := newTestCluster(t, 1, nil)
	leader := tc.waitLeader()
	ctx := context.Background()
	_, err := leader.Apply(ctx, cmd(t, fsm.CmdCreateAccount, newAccount("acct", 100_000)))
	require.NoError(t, err)
	g := newGatedProxy(t, leader, false)
	g.open()
	g.delay.Store(int64(80 * time.Millisecond))
	cl, err := NewClient([]string{g.addr()}, WithCacheTTL(0), WithWriteBatching(MaxApplyBatch, 1), WithWriteGather(20*time.Millisecond))
	require.NoError(t, err)
	defer cl.Close()

	const arrivals = 60
	errs := make([]error, arrivals)
	var wg sync.WaitGroup
	for i := range arrivals {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = cl.CreateDatabase(ctx, newDB("acct"))
		}()
		time.Sleep(25 * time.Millisecond) // paces the open loop's arrivals (the load's shape); nothing asserts on time
	}
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "open-loop write %d", i)
	}
	open := cl.GatherStats()
	t.Logf("open loop: %+v; commands per request %v", open, g.requestSizes())
	require.GreaterOrEqual(t, open.Eligible, int64(10), "sends of two or more, each a chance to gather")
	// Three waits before the score turns gathering off, then a probe every
	// groupwait.ProbeEvery-th eligible send (plus slack for a probe that fills
	// by chance on a stalled machine, and is followed by another).
	assert.LessOrEqual(t, open.Waited, 3+open.Eligible/4, "gathers entered in an open loop: %+v", open)

	// The closed loop on the same client.
	g.delay.Store(int64(10 * time.Millisecond))
	before := len(g.requestSizes())
	const callers, each = 16, 40
	errs = make([]error, callers*each)
	for c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				_, errs[c*each+i] = cl.CreateDatabase(ctx, newDB("acct"))
			}
		}()
	}
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "closed-loop write %d", i)
	}
	closed := cl.GatherStats()
	sizes := g.requestSizes()[before:]
	full := 0
	for _, n := range sizes {
		if n == callers {
			full++
		}
	}
	t.Logf("closed loop: %+v; commands per request %v", closed, sizes)
	assert.Greater(t, closed.Filled-open.Filled, int64(5), "gathers that filled in the closed loop")
	// Gathering back on within a few dozen sends; the rest (most of each
	// caller's 40 writes) carry all 16 callers.
	assert.GreaterOrEqual(t, full, 10, "requests carrying all %d callers; sizes %v", callers, sizes)
	acct, err := cl.Account(ctx, "acct", LinearizableRead())
	require.NoError(t, err)
	assert.EqualValues(t, arrivals+callers*each, acct.ActiveDatabases)
}
