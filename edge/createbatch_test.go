package edge

import (
	"context"
	"errors"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	v4 "github.com/shoaldb/shoal/internal/v4"
	"github.com/shoaldb/shoal/pipeline/event"
	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// batchCatalog is the fake catalog with the BatchCreator capability: each
// batch applies its creates one by one (as the catalog's log does), after
// waiting on gate when set.
type batchCatalog struct {
	*fakeCatalog
	gate chan struct{}

	bmu    sync.Mutex
	sizes  []int
	audits []*fsm.Audit // of every create batched, in order
}

func (c *batchCatalog) CreateDatabasesAs(ctx context.Context, cmds []fsm.CreateDatabase, audits []*fsm.Audit) ([]fsm.Database, []error) {
	c.bmu.Lock()
	c.sizes = append(c.sizes, len(cmds))
	c.audits = append(c.audits, audits...)
	gate := c.gate
	c.bmu.Unlock()
	if gate != nil {
		<-gate
	}
	out := make([]fsm.Database, len(cmds))
	errs := make([]error, len(cmds))
	for i := range cmds {
		out[i], errs[i] = c.fakeCatalog.CreateDatabase(ctx, cmds[i])
	}
	return out, errs
}

func (c *batchCatalog) batchSizes() []int {
	c.bmu.Lock()
	defer c.bmu.Unlock()
	return append([]int(nil), c.sizes...)
}

func newBatchEnv(t *testing.T, mod ...func(*Options)) (*env, *batchCatalog) {
	var bc *batchCatalog
	e := newEnv(t, append([]func(*Options){func(o *Options) {
		bc = &batchCatalog{fakeCatalog: o.Catalog.(*fakeCatalog)}
		o.Catalog = bc
		o.CreateBatchInflight = 1
	}}, mod...)...)
	return e, bc
}

func (e *env) catalogQueue() int {
	b := e.srv.cb.catalog
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.queue)
}

// Creates arriving while a catalog batch is in flight share the next one;
// each keeps its own outcome: of two creates of one name one succeeds and
// the other is refused as name taken, of two creates in an account with
// room for one, one is refused at the account's limit — and the others
// commit.
func TestCreateBatchMixedRefusals(t *testing.T) {
	e, bc := newBatchEnv(t)
	e.cat.addAccount(acctB, 1)
	gate := make(chan struct{})
	bc.bmu.Lock()
	bc.gate = gate
	bc.bmu.Unlock()

	var wg sync.WaitGroup
	first := make(chan answer, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		first <- e.call("POST", dbPath(acctA), tokA, map[string]any{"name": "first"})
	}()
	require.Eventually(t, func() bool { return len(bc.batchSizes()) == 1 }, 5*time.Second, time.Millisecond)

	type req struct{ acct, tok, name string }
	reqs := []req{{acctA, tokA, "same"}, {acctA, tokA, "same"}, {acctB, tokB, "p"}, {acctB, tokB, "q"}, {acctA, tokA, "other"}}
	answers := make([]answer, len(reqs))
	for i, r := range reqs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			answers[i] = e.call("POST", dbPath(r.acct), r.tok, map[string]any{"name": r.name})
		}()
	}
	require.Eventually(t, func() bool { return e.catalogQueue() == len(reqs) }, 5*time.Second, time.Millisecond)
	close(gate)
	wg.Wait()

	assert.Equal(t, []int{1, len(reqs)}, bc.batchSizes(), "the queued creates went in one batch")
	assert.Equal(t, 200, (<-first).Status)
	codes := func(idx ...int) []int {
		var out []int
		for _, i := range idx {
			out = append(out, answers[i].Status*10000+answers[i].code())
		}
		sort.Ints(out)
		return out
	}
	ok := 200*10000 + 0
	assert.Equal(t, []int{ok, 400*10000 + v4.CodeNameTaken}, codes(0, 1), "one of the two creates of one name")
	assert.Equal(t, []int{ok, 400*10000 + v4.CodeDatabaseLimit}, codes(2, 3), "one create fits under acct-b's limit")
	assert.Equal(t, 200, answers[4].Status, "%s", answers[4].Raw)

	// Each batched create carries its own request's audit record (the
	// batch is sent on a context of its own): the token that asked.
	bc.bmu.Lock()
	audits := append([]*fsm.Audit(nil), bc.audits...)
	bc.bmu.Unlock()
	require.Len(t, audits, 1+len(reqs))
	actors := map[string]int{}
	for _, a := range audits {
		require.NotNil(t, a, "a batched create without its audit record")
		actors[a.Actor]++
	}
	assert.Len(t, actors, 2, "two tokens asked: %v", actors)
	for actor := range actors {
		assert.True(t, strings.HasPrefix(actor, "token:"), actor)
	}

	a := e.call("GET", dbPath(acctA), tokA, nil)
	assert.EqualValues(t, 3, a.ResultInfo.TotalCount) // first, same, other
	a = e.call("GET", dbPath(acctB), tokB, nil)
	assert.EqualValues(t, 1, a.ResultInfo.TotalCount)
}

// A create whose catalog write committed inside a batch whose answer was
// lost is recognised on its retry (new IDs, name taken): the committed
// first attempt is the database, once.
func TestCreateBatchLostAnswerIsResolved(t *testing.T) {
	e, bc := newBatchEnv(t)
	e.cat.lostWrite = 1
	d := e.create(acctA, tokA, "db1")
	e.cat.mu.Lock()
	require.Len(t, e.cat.created, 2)
	first := e.cat.created[0]
	e.cat.mu.Unlock()
	assert.Equal(t, first.UUID, d.UUID, "the committed first attempt is the database")
	a := e.call("GET", dbPath(acctA), tokA, nil)
	assert.EqualValues(t, 1, a.ResultInfo.TotalCount)
	assert.Equal(t, []int{1, 1}, bc.batchSizes(), "both attempts went through the batcher")
}

// Hosts without the batch routes (an older build, here the fake host) get
// one init and one confirm per create, and the creates work.
func TestCreateBatchFallsBackToSingleHostCalls(t *testing.T) {
	e, _ := newBatchEnv(t)
	for i := range 4 {
		d := e.create(acctA, tokA, "db"+string(rune('a'+i)))
		require.Eventually(t, func() bool {
			o := e.hostOf(e.catalogDB(d.UUID).ObjectID)
			return o != nil && o.object(e.catalogDB(d.UUID).ObjectID).confirmed
		}, 5*time.Second, time.Millisecond, "confirmed through the single call")
	}
}

// Without the capability (or with CreateBatch < 0) every create is its own
// catalog write, as before.
func TestCreateBatchOff(t *testing.T) {
	e, bc := newBatchEnv(t, func(o *Options) { o.CreateBatch = -1 })
	e.create(acctA, tokA, "db1")
	assert.Empty(t, bc.batchSizes())
	assert.EqualValues(t, 1, e.cat.count("CreateDatabase"))
}

func TestBatcherCoalescesAndAnswersEachCall(t *testing.T) {
	var wg sync.WaitGroup
	gate := make(chan struct{})
	var mu sync.Mutex
	var sizes []int
	b := newBatcher(context.Background(), &wg, 3, 1, time.Minute, func(ctx context.Context, items []int) ([]int, []error) {
		mu.Lock()
		sizes = append(sizes, len(items))
		first := len(sizes) == 1
		mu.Unlock()
		if first {
			<-gate
		}
		out := make([]int, len(items))
		errs := make([]error, len(items))
		for i, v := range items {
			if v%2 == 1 {
				errs[i] = errors.New("odd")
				continue
			}
			out[i] = v * 10
		}
		return out, errs
	})
	var cw sync.WaitGroup
	res := make([]int, 6)
	errs := make([]error, 6)
	cw.Add(1)
	go func() { defer cw.Done(); res[0], errs[0] = b.do(context.Background(), 0) }()
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(sizes) == 1 }, 5*time.Second, time.Millisecond)
	for i := 1; i < 6; i++ {
		cw.Add(1)
		go func() { defer cw.Done(); res[i], errs[i] = b.do(context.Background(), i) }()
	}
	require.Eventually(t, func() bool { b.mu.Lock(); defer b.mu.Unlock(); return len(b.queue) == 5 }, 5*time.Second, time.Millisecond)
	close(gate)
	cw.Wait()
	wg.Wait()
	assert.Equal(t, []int{1, 3, 2}, sizes, "queued calls go in batches of at most maxBatch")
	for i := range 6 {
		if i%2 == 1 {
			assert.EqualError(t, errs[i], "odd", "call %d", i)
		} else {
			assert.NoError(t, errs[i])
			assert.Equal(t, i*10, res[i])
		}
	}
	b.mu.Lock()
	assert.Zero(t, b.inflight, "every slot released")
	b.mu.Unlock()
}

// A caller that gives up gets ErrUnavailable (outcome unknown); the batch
// still completes for the others.
func TestBatcherCallerGivesUp(t *testing.T) {
	var wg sync.WaitGroup
	gate := make(chan struct{})
	var sent atomic.Int64
	b := newBatcher(context.Background(), &wg, 10, 1, time.Minute, func(ctx context.Context, items []int) ([]int, []error) {
		if sent.Add(1) == 1 {
			<-gate
		}
		return items, make([]error, len(items))
	})
	done := make(chan error, 1)
	go func() { _, err := b.do(context.Background(), 1); done <- err }()
	require.Eventually(t, func() bool { return sent.Load() == 1 }, 5*time.Second, time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	gaveUp := make(chan error, 1)
	go func() { _, err := b.do(ctx, 2); gaveUp <- err }()
	require.Eventually(t, func() bool { b.mu.Lock(); defer b.mu.Unlock(); return len(b.queue) == 1 }, 5*time.Second, time.Millisecond)
	cancel()
	require.ErrorIs(t, <-gaveUp, ErrUnavailable)
	close(gate)
	require.NoError(t, <-done)
	wg.Wait()
	assert.EqualValues(t, 2, sent.Load(), "the abandoned call was still sent (its outcome is unknown to its caller)")
}

// A lingering batcher (the confirms') does not send the call that found
// its slot free at once: it waits for more, and the calls that arrive
// meanwhile go in the same batch. The owner's context ending (Close) cuts
// the wait short and what queued is still sent. No timing is asserted: the
// linger is an hour, so only the owner's context can end the wait.
func TestLingeringBatcherWaitsForMore(t *testing.T) {
	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	var sizes []int
	b := newLingeringBatcher(ctx, &wg, 10, 1, time.Minute, time.Hour, func(_ context.Context, items []int) ([]int, []error) {
		mu.Lock()
		sizes = append(sizes, len(items))
		mu.Unlock()
		return items, make([]error, len(items))
	})
	var cw sync.WaitGroup
	for i := range 3 {
		cw.Add(1)
		go func() {
			defer cw.Done()
			v, err := b.do(context.Background(), i)
			assert.NoError(t, err)
			assert.Equal(t, i, v)
		}()
	}
	require.Eventually(t, func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return len(b.queue) == 3 && b.inflight == 1
	}, 5*time.Second, time.Millisecond, "every call queued behind the lingering slot")
	mu.Lock()
	assert.Empty(t, sizes, "nothing sent while the batch lingers")
	mu.Unlock()
	cancel()
	cw.Wait()
	wg.Wait()
	assert.Equal(t, []int{3}, sizes, "the three calls went in one batch")
	b.mu.Lock()
	assert.Zero(t, b.inflight, "slot released")
	b.mu.Unlock()
}

// A lingering batch is sent as soon as maxBatch calls queued, without
// waiting out its linger (an hour here: only the full queue can end it).
func TestLingeringBatcherSendsAFullBatchAtOnce(t *testing.T) {
	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel) // on failure, ends the linger so the goroutines finish
	var mu sync.Mutex
	var sizes []int
	b := newLingeringBatcher(ctx, &wg, 3, 1, time.Minute, time.Hour, func(_ context.Context, items []int) ([]int, []error) {
		mu.Lock()
		sizes = append(sizes, len(items))
		mu.Unlock()
		return items, make([]error, len(items))
	})
	for i := range 3 {
		go func() { _, _ = b.do(context.Background(), i) }()
	}
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(sizes) == 1 }, 10*time.Second, time.Millisecond,
		"the full batch was not sent")
	wg.Wait()
	mu.Lock()
	assert.Equal(t, []int{3}, sizes)
	mu.Unlock()
}

// PutMany keeps Put's rule for each route (never backwards) in one
// transaction.
func TestRouteCachePutMany(t *testing.T) {
	rc := openTestCache(t, newTestClock())
	_, err := rc.Put(route(3, "obj-new", "active"))
	require.NoError(t, err)
	other := Route{DatabaseUUID: "018f0000-0000-7000-8000-000000000002", ObjectID: "o2", HostAddress: "h:1", AccountID: "a", State: "active", Generation: 1}
	stored, err := rc.PutMany([]Route{route(2, "obj-old", "active"), other})
	require.NoError(t, err)
	assert.Equal(t, []bool{false, true}, stored)
	got, res := rc.Get(u1)
	require.Equal(t, cacheHit, res)
	assert.Equal(t, "obj-new", got.ObjectID, "an older generation never replaces a newer one")
	got, res = rc.Get(other.DatabaseUUID)
	require.Equal(t, cacheHit, res)
	assert.Equal(t, "o2", got.ObjectID)
}

// A batcher whose batch is stuck in flight stops counting as busy once it
// made no progress for the stall time, so placement stops joining a hung
// host's batch (queuedInits); while batches come back it counts its queue
// and slots. No timing is asserted: the stall times used are 0 (any age is
// stalled) and an hour (never stalled).
func TestBatcherLoadIgnoresAStalledPeer(t *testing.T) {
	var wg sync.WaitGroup
	release := make(chan struct{})
	b := newBatcher(context.Background(), &wg, 10, 1, time.Minute, func(_ context.Context, items []int) ([]int, []error) {
		<-release
		return items, make([]error, len(items))
	})
	assert.Zero(t, b.load(time.Hour), "idle")
	var cw sync.WaitGroup
	for i := range 3 {
		cw.Add(1)
		go func() {
			defer cw.Done()
			_, err := b.do(context.Background(), i)
			assert.NoError(t, err)
		}()
	}
	require.Eventually(t, func() bool { return b.load(time.Hour) == 3 }, 5*time.Second, time.Millisecond,
		"one batch in flight, two calls queued")
	time.Sleep(time.Millisecond) // the clock moves past the last take
	assert.Zero(t, b.load(0), "in flight with no progress since: a stalled peer is not busy")
	close(release)
	cw.Wait()
	wg.Wait()
	assert.Zero(t, b.load(0), "nothing in flight: idle")
}

// The creates of one init batch come back together and share one catalog
// batch: the first to reach the free catalog slot waits for the others of
// its batch (createbatch.go, "Gathering the catalog batch") instead of
// going alone. No timing is asserted: CreateGather is an hour, so only the
// arrival of every expected create ends the wait.
func TestCreateGatherSharesOneCatalogBatch(t *testing.T) {
	e, bc := newBatchEnv(t, func(o *Options) { o.CreateGather = time.Hour })
	h := e.hosts[0] // the only host of the edge's region: every create's
	gate := make(chan struct{})
	h.mu.Lock()
	h.initGate = gate
	h.mu.Unlock()
	// An init holds the host's batch slot, so the creates' inits queue
	// and go together in the next batch.
	held := make(chan error, 1)
	go func() {
		_, err := e.srv.initBatcher(h.addr()).do(context.Background(),
			initCall{item: event.InitBatchItem{ObjectID: "00000000000000000000000000000001",
				Init: InitRequest{DatabaseUUID: "018f0000-0000-7000-8000-0000000000aa", AccountID: acctA, Name: "held"}}})
		held <- err
	}()
	require.Eventually(t, func() bool { return e.srv.queuedInits(h.addr()) == 1 }, 5*time.Second, time.Millisecond)
	const n = 5
	var wg sync.WaitGroup
	answers := make([]answer, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			answers[i] = e.call("POST", dbPath(acctA), tokA, map[string]any{"name": "g" + string(rune('a'+i))})
		}()
	}
	require.Eventually(t, func() bool { return e.srv.queuedInits(h.addr()) == 1+n }, 5*time.Second, time.Millisecond,
		"the creates' inits queue behind the held one")
	close(gate)
	require.NoError(t, <-held)
	wg.Wait()
	for i, a := range answers {
		assert.Equal(t, 200, a.Status, "create %d: %s", i, a.Raw)
	}
	assert.Equal(t, []int{n}, bc.batchSizes(), "the init batch's creates went in one catalog batch")
	assert.Zero(t, e.srv.cb.arriving.Load(), "no create left counted as on its way")
}

// Gathering and the group-commit delays never hold a create nobody else
// is on the way with: a lone create, one whose first init failed (its
// retry), and one after it all finish although CreateGather and the group
// delays are an hour — a create counted as arriving and never uncounted,
// or a batch of one holding its slot, would hold every later batch for
// that hour.
func TestCreateGatherNeverHoldsALoneCreate(t *testing.T) {
	e, bc := newBatchEnv(t, func(o *Options) {
		o.CreateGather, o.CreateGroupDelay, o.CreateInitGroupDelay = time.Hour, time.Hour, time.Hour
	})
	for _, name := range []string{"lone", "after-failed-init", "next"} {
		done := make(chan answer, 1)
		go func() { done <- e.call("POST", dbPath(acctA), tokA, map[string]any{"name": name}) }()
		select {
		case a := <-done:
			require.Equal(t, 200, a.Status, "%s: %s", name, a.Raw)
		case <-time.After(30 * time.Second): // a liveness bound, against an hour's wait
			t.Fatalf("create %q held by the catalog batcher's gathering or a group delay", name)
		}
		if name == "lone" {
			e.hosts[0].mu.Lock()
			e.hosts[0].failInit = 1
			e.hosts[0].mu.Unlock()
		}
	}
	assert.Equal(t, []int{1, 1, 1}, bc.batchSizes())
	assert.Zero(t, e.srv.cb.arriving.Load())
}

// A grouping batcher (group-commit delay): once a batch of n ≥ 2 calls
// comes back, its slot holder keeps the slot until n calls are queued
// again, so the next group goes together instead of its first call
// alone; a batch of one never holds the slot; the owner's context ending
// (Close) ends the wait and what queued is sent. No timing is asserted:
// the delay is an hour, so only the queue reaching n (or the context) can
// end the wait.
func TestGroupingBatcherWaitsForTheNextGroup(t *testing.T) {
	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel) // on failure, ends the wait so the goroutines finish
	gate := make(chan struct{})
	var mu sync.Mutex
	var sizes []int
	b := newGroupingBatcher(ctx, &wg, 10, 1, time.Minute, time.Hour, func(_ context.Context, items []int) ([]int, []error) {
		mu.Lock()
		sizes = append(sizes, len(items))
		first := len(sizes) == 1
		mu.Unlock()
		if first {
			<-gate
		}
		return items, make([]error, len(items))
	})
	sent := func() []int { mu.Lock(); defer mu.Unlock(); return append([]int(nil), sizes...) }
	queued := func() int { b.mu.Lock(); defer b.mu.Unlock(); return len(b.queue) }
	var cw sync.WaitGroup
	call := func(v int) {
		cw.Add(1)
		go func() {
			defer cw.Done()
			got, err := b.do(context.Background(), v)
			assert.NoError(t, err)
			assert.Equal(t, v, got)
		}()
	}
	// A lone call goes at once (a free slot), and the three that queue
	// behind it go next: the batch that came back held one call.
	call(0)
	require.Eventually(t, func() bool { return len(sent()) == 1 }, 5*time.Second, time.Millisecond)
	for v := 1; v <= 3; v++ {
		call(v)
	}
	require.Eventually(t, func() bool { return queued() == 3 }, 5*time.Second, time.Millisecond)
	close(gate)
	cw.Wait()
	require.Equal(t, []int{1, 3}, sent())
	// The batch of three came back: the next two calls wait for a third.
	call(4)
	call(5)
	require.Eventually(t, func() bool { return queued() == 2 }, 5*time.Second, time.Millisecond,
		"the next group's first calls queue behind the held slot instead of going alone")
	assert.Equal(t, []int{1, 3}, sent(), "nothing sent before the group is complete")
	call(6)
	cw.Wait()
	assert.Equal(t, []int{1, 3, 3}, sent(), "the next group went together")
	// Two of the next three come; the owner's context ending sends them.
	call(7)
	call(8)
	require.Eventually(t, func() bool { return queued() == 2 }, 5*time.Second, time.Millisecond)
	cancel()
	cw.Wait()
	wg.Wait()
	assert.Equal(t, []int{1, 3, 3, 2}, sent())
	b.mu.Lock()
	assert.Zero(t, b.inflight, "slot released")
	b.mu.Unlock()
}

// A grouping batcher's wait is bounded: a group that stays short of the
// batch that came back is sent when the delay ends (liveness only: the
// delay is a millisecond and nothing is timed).
func TestGroupingBatcherSendsAShortGroupAtItsBound(t *testing.T) {
	var wg sync.WaitGroup
	gate := make(chan struct{})
	var mu sync.Mutex
	var sizes []int
	b := newGroupingBatcher(context.Background(), &wg, 10, 1, time.Minute, time.Millisecond, func(_ context.Context, items []int) ([]int, []error) {
		mu.Lock()
		sizes = append(sizes, len(items))
		first := len(sizes) == 1
		mu.Unlock()
		if first {
			<-gate
		}
		return items, make([]error, len(items))
	})
	var cw sync.WaitGroup
	call := func(v int) {
		cw.Add(1)
		go func() { defer cw.Done(); _, err := b.do(context.Background(), v); assert.NoError(t, err) }()
	}
	call(0)
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(sizes) == 1 }, 5*time.Second, time.Millisecond)
	call(1)
	call(2)
	require.Eventually(t, func() bool { b.mu.Lock(); defer b.mu.Unlock(); return len(b.queue) == 2 }, 5*time.Second, time.Millisecond)
	close(gate)
	cw.Wait() // a batch of two came back
	call(3)   // one of the next two: sent alone once the delay ends
	cw.Wait()
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, []int{1, 2, 1}, sizes)
}

// Through the edge: after a catalog batch of two creates came back, the
// next create waits (CreateGroupDelay, an hour here: only the second
// create can end the wait) for a second one instead of taking the free
// slot alone, and the two share one catalog batch.
func TestCreateGroupDelaySharesTheNextCatalogBatch(t *testing.T) {
	e, bc := newBatchEnv(t, func(o *Options) { o.CreateGroupDelay = time.Hour })
	gate := make(chan struct{})
	bc.bmu.Lock()
	bc.gate = gate
	bc.bmu.Unlock()
	var wg sync.WaitGroup
	create := func(name string) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a := e.call("POST", dbPath(acctA), tokA, map[string]any{"name": name})
			assert.Equal(t, 200, a.Status, "%s: %s", name, a.Raw)
		}()
	}
	create("x")
	require.Eventually(t, func() bool { return len(bc.batchSizes()) == 1 }, 5*time.Second, time.Millisecond)
	create("y1")
	create("y2")
	require.Eventually(t, func() bool { return e.catalogQueue() == 2 }, 5*time.Second, time.Millisecond)
	close(gate)
	wg.Wait()
	require.Equal(t, []int{1, 2}, bc.batchSizes())
	create("z1")
	require.Eventually(t, func() bool { return e.catalogQueue() == 1 }, 5*time.Second, time.Millisecond,
		"after a batch of two, the next create waits for another")
	assert.Equal(t, []int{1, 2}, bc.batchSizes())
	create("z2")
	wg.Wait()
	assert.Equal(t, []int{1, 2, 2}, bc.batchSizes())
}

// With two slots, a gathering slot holder whose queue was taken by the
// other slot while it waited sends nothing and frees its slot: every
// batch sent holds at least one call (before 2026-12-04 it sent an empty
// batch — an empty catalog request, counted as a batch of one). No timing
// is asserted: the gather bound is an hour.
func TestGatheringBatcherWithTwoSlotsSendsNoEmptyBatch(t *testing.T) {
	var wg sync.WaitGroup
	var expecting atomic.Bool
	expecting.Store(true)
	var mu sync.Mutex
	var sizes []int
	b := newGatheringBatcher(context.Background(), &wg, 10, 2, time.Minute, time.Hour, expecting.Load,
		func(_ context.Context, items []int) ([]int, []error) {
			mu.Lock()
			sizes = append(sizes, len(items))
			mu.Unlock()
			return items, make([]error, len(items))
		})
	var cw sync.WaitGroup
	call := func(v int) {
		cw.Add(1)
		go func() {
			defer cw.Done()
			got, err := b.do(context.Background(), v)
			assert.NoError(t, err)
			assert.Equal(t, v, got)
		}()
	}
	// The first call takes a slot and gathers (something is expected).
	call(1)
	require.Eventually(t, func() bool { b.mu.Lock(); defer b.mu.Unlock(); return b.inflight == 1 && len(b.queue) == 1 },
		5*time.Second, time.Millisecond)
	// Nothing more is expected; the second call takes the other slot and
	// wakes the first holder: one of them takes both calls.
	expecting.Store(false)
	call(2)
	cw.Wait()
	wg.Wait()
	mu.Lock()
	assert.Equal(t, []int{2}, sizes, "one batch of both calls, no empty one")
	mu.Unlock()
	b.mu.Lock()
	assert.Zero(t, b.inflight, "both slots released")
	b.mu.Unlock()
}

// The create batchers report where a step's time goes: each batch's round
// trip and each create's wait for its batch, per step, in the edge's
// registry (what the deploy bench prints beside the step means).
func TestCreateBatchTimingsAreReported(t *testing.T) {
	reg := prometheus.NewRegistry()
	e, bc := newBatchEnv(t, func(o *Options) { o.Registry = reg })
	for _, name := range []string{"t1", "t2"} {
		a := e.call("POST", dbPath(acctA), tokA, map[string]any{"name": name})
		require.Equal(t, 200, a.Status, a.Raw)
	}
	require.Equal(t, []int{1, 1}, bc.batchSizes())
	counts := map[string]uint64{}
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if h := m.GetHistogram(); h != nil && strings.HasPrefix(mf.GetName(), "shoal_edge_create_batch_") {
				for _, l := range m.GetLabel() {
					if l.GetName() == "step" {
						counts[mf.GetName()+"/"+l.GetValue()] = h.GetSampleCount()
					}
				}
			}
		}
	}
	for _, step := range []string{"init", "catalog_write"} {
		assert.Equal(t, uint64(2), counts["shoal_edge_create_batch_send_seconds/"+step], "one round trip per batch: %s", step)
		assert.Equal(t, uint64(2), counts["shoal_edge_create_batch_queued_seconds/"+step], "one wait per create: %s", step)
	}
}

// post queues a call that nobody waits on: it returns at once even while
// the batcher's send is blocked, its calls go in the lingering batches as
// do()'s would, and with maxQueued calls queued it drops the next one
// (false). One goroutine sends for all of them, not one per call
// (checked by counting: with a goroutine per post, 50 blocked posts would
// hold 50). The send is gated, so nothing here depends on timing.
func TestBatcherPostQueuesWithoutAGoroutinePerCall(t *testing.T) {
	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	gate := make(chan struct{})
	var mu sync.Mutex
	var got []int
	b := newLingeringBatcher(ctx, &wg, 100, 1, time.Minute, time.Millisecond, func(_ context.Context, items []int) ([]int, []error) {
		<-gate
		mu.Lock()
		got = append(got, items...)
		mu.Unlock()
		return items, make([]error, len(items))
	})
	before := runtime.NumGoroutine()
	require.True(t, b.post(0, 60))
	require.Eventually(t, func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return len(b.queue) == 0 && b.inflight == 1
	}, 10*time.Second, time.Millisecond, "the first post's batch is in flight (blocked on the gate)")
	for i := 1; i <= 60; i++ {
		require.True(t, b.post(i, 60), "post %d", i)
	}
	assert.False(t, b.post(61, 60), "a post beyond maxQueued is dropped")
	assert.Less(t, runtime.NumGoroutine()-before, 10, "posts hold no goroutine each")
	close(gate)
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(got) == 61 }, 10*time.Second, time.Millisecond)
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	for i, v := range got {
		assert.Equal(t, i, v, "in order")
	}
	b.mu.Lock()
	assert.Zero(t, b.inflight, "slot released")
	b.mu.Unlock()
}
