package edge

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shoaldb/shoal/pipeline/event"
	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// Coalesced creates. Under load most of a create's cost was per request,
// not per database: three internal HTTP requests (the host's init, the
// catalog write, the confirm), each with its TLS records, handler and JSON,
// and one Raft proposal and host index commit each. The edge now sends the
// steps of concurrent creates together (batcher.go: a call that finds a
// free slot goes at once, alone; calls arriving while the slots are busy
// share the next request):
//
//   - step (4), the inits of the creates placed on one host: one POST
//     /v1/batch/init per batch (objecthost/batch.go), whose inits meet in
//     one index commit on the host;
//   - step (5), the catalog writes: one POST /v1/apply-batch per batch
//     (raftmeta/applybatch.go), one create_database command per create,
//     each with its own request ID and its own outcome — one create's
//     refusal (name taken, limit) is its own, the others commit;
//   - step (7), the route written through to the cache: one bbolt
//     transaction for the routes of the creates that finish together
//     (RouteCache.PutMany), and the confirms to one host: one POST
//     /v1/batch/confirm. Confirms go after the client's answer, so their
//     batcher lingers (Options.ConfirmLinger, 20ms): a batch waits for its
//     oldest confirm to be that old, and holds several instead of about
//     one (each batch costs a frame stream, its JSON and goroutines on both
//     sides).
//
// The flow of each create is unchanged (databases.go): its init returns
// only after its own index commit, its catalog write is still THE
// CREATION CHECKPOINT and is acknowledged only once committed, and a
// failure of any step retries that create alone from (2) with new IDs.
// Peers of older builds are handled by falling back to one request per
// create (a host or catalog node without the batch route answers 404).

// BatchCreator is an optional capability of a Catalog, found by type
// assertion: CreateDatabase for many creates in one round trip, with the
// i-th result and error answering cmds[i] exactly as CreateDatabase would
// have (a refusal is an fsm sentinel; any other error leaves that create's
// outcome unknown). raftmeta.Client has it (RaftmetaCatalog passes it on).
//
// audits[i] is the audit record (who asked, from where) of cmds[i]'s
// request: the creates of one batch come from different requests, so the
// batch's context carries none.
type BatchCreator interface {
	CreateDatabasesAs(ctx context.Context, cmds []fsm.CreateDatabase, audits []*fsm.Audit) ([]fsm.Database, []error)
}

// auditedCreate is one create in the catalog batcher, with the audit
// record of the request it came from.
type auditedCreate struct {
	cmd   fsm.CreateDatabase
	audit *fsm.Audit
}

// createBatching holds the batchers of the create flow: one for the
// catalog, one per host address for inits and for confirms.
type createBatching struct {
	catalog  *batcher[auditedCreate, fsm.Database] // nil: one request per create
	routes   *batcher[Route, bool]                 // nil: one cache transaction per delete
	maxBatch int                                   // ≤ 0: no host batching either
	inflight int

	// Gathering (see "Gathering the catalog batch" below): the longest
	// wait, and the creates on their way to the catalog batcher.
	gather time.Duration // ≤ 0: no gathering
	// Group-commit delays of the catalog batcher and of the init
	// batchers (batcher.groupLocked); ≤ 0: none.
	groupDelay, initGroupDelay time.Duration
	arriving                   atomic.Int64 // creates whose init came back, not yet in the catalog queue

	mu          sync.Mutex
	inits       map[string]*batcher[initCall, struct{}]
	confirms    map[string]*batcher[Route, struct{}]
	unsupported map[string]time.Time // host address → until when it is sent single calls

	wg sync.WaitGroup // batches still being sent after their first caller returned

	// timing of the catalog and init batchers (createBatchTimings).
	catalogTiming, initTiming *batchTiming
	// flush is closed as Close begins: lingering batches (the posted
	// confirms) are sent at once, within Close's grace, before the
	// owner's context ends.
	flush chan struct{}
}

// createBatchTimings are the create batchers' timings, by step
// (catalog_write, init): where a create's time in a step goes — queued
// for its batch (the slot busy, or its holder waiting for more), or in the
// batch's round trip — and how long the slot holders held their slot
// waiting (group: the group-commit delay; gather: creates on their way).
// Registered in reg when it is set (the edge's Registry option).
func createBatchTimings(reg *prometheus.Registry) (catalog, init *batchTiming) {
	buckets := prometheus.ExponentialBuckets(0.00005, 2, 16)
	send := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "shoal_edge_create_batch_send_seconds",
		Help: "Round trip of each coalesced create step's batch request (catalog_write, init).", Buckets: buckets}, []string{"step"})
	queued := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "shoal_edge_create_batch_queued_seconds",
		Help: "Time each create waited for its batch to be sent in a coalesced create step (catalog_write, init): the slot busy, or its holder waiting for more.", Buckets: buckets}, []string{"step"})
	hold := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shoal_edge_create_slot_hold_seconds_total",
		Help: "Time the create batchers' slot holders kept their slot waiting for more creates, by step (catalog_write, init) and reason (group: the group-commit delay; gather: creates on their way)."}, []string{"step", "reason"})
	if reg != nil {
		reg.MustRegister(send, queued, hold)
	}
	timing := func(step string) *batchTiming {
		return &batchTiming{send: send.WithLabelValues(step), queued: queued.WithLabelValues(step),
			hold: hold.MustCurryWith(prometheus.Labels{"step": step})}
	}
	return timing("catalog_write"), timing("init")
}

// Defaults of Options.CreateBatch and Options.CreateBatchInflight.
const (
	defaultCreateBatch         = 128
	defaultCreateBatchInflight = 1
	// defaultConfirmLinger is Options.ConfirmLinger's default: confirms
	// are sent after the client's answer, so waiting costs nobody
	// anything, and at a few hundred creates per second per host it makes
	// batches of several instead of about one.
	defaultConfirmLinger = 20 * time.Millisecond
	// defaultCreateGather is Options.CreateGather's default: goroutine
	// wake-ups take microseconds unless the edge's CPU is saturated.
	defaultCreateGather = time.Millisecond
	// defaultCreateGroupDelay and defaultCreateInitGroupDelay are the
	// group-commit delays' defaults (Options.CreateGroupDelay, "Grouping
	// the next batch" below): at 16 clients 2 ms took the catalog's CPU
	// per create to 0.84–0.91× of main's in five same-round runs, 1 ms
	// to 0.93× in two; either alone (catalog or init) did nothing visible.
	defaultCreateGroupDelay     = 2 * time.Millisecond
	defaultCreateInitGroupDelay = 2 * time.Millisecond
	// hostBatchRecheck is how long a host that answered 404 to a batch
	// route (an older build) is sent single calls before it is tried again.
	hostBatchRecheck = time.Minute
)

func (s *Server) initCreateBatching() {
	b := &s.cb
	b.maxBatch, b.inflight = s.o.CreateBatch, s.o.CreateBatchInflight
	b.gather = s.o.CreateGather
	if b.gather == 0 {
		b.gather = defaultCreateGather
	}
	b.groupDelay, b.initGroupDelay = s.o.CreateGroupDelay, s.o.CreateInitGroupDelay
	if b.groupDelay == 0 {
		b.groupDelay = defaultCreateGroupDelay
	}
	if b.initGroupDelay == 0 {
		b.initGroupDelay = defaultCreateInitGroupDelay
	}
	if b.maxBatch == 0 {
		b.maxBatch = defaultCreateBatch
	}
	if b.inflight <= 0 {
		b.inflight = defaultCreateBatchInflight
	}
	b.catalogTiming, b.initTiming = createBatchTimings(s.o.Registry)
	b.flush = make(chan struct{})
	b.inits = map[string]*batcher[initCall, struct{}]{}
	b.confirms = map[string]*batcher[Route, struct{}]{}
	b.unsupported = map[string]time.Time{}
	if b.maxBatch < 0 {
		return
	}
	// One slot: bbolt has one writer anyway; routes arriving during a
	// commit go in the next.
	b.routes = newBatcher(s.bgCtx, &b.wg, b.maxBatch, 1, time.Minute,
		func(_ context.Context, rs []Route) ([]bool, []error) {
			stored, err := s.cache.PutMany(rs)
			return stored, fill(len(rs), err)
		})
	if bc, ok := s.catalog.(BatchCreator); ok {
		b.catalog = newGatheringBatcher(s.bgCtx, &b.wg, b.maxBatch, b.inflight, 3*s.o.CatalogTimeout, b.gather,
			func() bool { return b.arriving.Load() > 0 },
			func(ctx context.Context, items []auditedCreate) ([]fsm.Database, []error) {
				cmds := make([]fsm.CreateDatabase, len(items))
				audits := make([]*fsm.Audit, len(items))
				for i, it := range items {
					cmds[i], audits[i] = it.cmd, it.audit
				}
				return bc.CreateDatabasesAs(ctx, cmds, audits)
			})
		b.catalog.observe = func(n int) { s.m.batchCatalog.Observe(float64(n)) }
		b.catalog.timing = b.catalogTiming
		b.catalog.setGroupDelay(b.groupDelay)
	}
}

// createCatalogWrite is step (5) of one create: through the catalog
// batcher when the catalog can take batches, else alone. Errors are
// classified as catalogWrite's: a refusal as is, anything else wrapped in
// ErrUnavailable (outcome unknown).
//
// tk is the create's gathering ticket (nil: none); it leaves the expected
// creates once the write is queued (or at once, on the path without a
// batcher).
func (s *Server) createCatalogWrite(ctx context.Context, cmd fsm.CreateDatabase, tk *createTicket) (fsm.Database, error) {
	if s.cb.catalog == nil {
		tk.leave()
		var d fsm.Database
		err := s.catalogWrite(ctx, func(ctx context.Context) error {
			var err error
			d, err = s.catalog.CreateDatabase(ctx, cmd)
			return err
		})
		return d, err
	}
	item := auditedCreate{cmd: cmd}
	if a, ok := fsm.AuditFrom(ctx); ok {
		item.audit = &a
	}
	var queued func()
	if tk != nil {
		queued = tk.catalogQueued
	}
	d, err := s.cb.catalog.doQueued(ctx, item, queued)
	if err != nil && !isCatalogRefusal(err) && !errors.Is(err, ErrUnavailable) {
		err = fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return d, err
}

// initObject is step (4) of one create: batched with the other inits for
// the same host, unless batching is off or the init restores from the
// archive (a fork: as long as its restore, so it goes alone). tk (nil:
// none) counts as arriving at the catalog batcher once the init's batch
// comes back with it done.
func (s *Server) initObject(ctx context.Context, addr, objectID string, in InitRequest, tk *createTicket) error {
	if s.cb.maxBatch < 0 || in.RestoreFrom != nil {
		_, err := s.hosts.Init(ctx, addr, objectID, in)
		return err
	}
	_, err := s.initBatcher(addr).do(ctx, initCall{item: event.InitBatchItem{ObjectID: objectID, Init: in}, tk: tk})
	return err
}

// postConfirm schedules step (7) of a create, the confirm: queued on the
// host's confirm batcher without a goroutine of its own (batcher.post),
// or — without batching — in a background goroutine. A confirm dropped
// because the host's queue is full (maxConfirmQueue: the host is slow or
// down) counts in shoal_edge_background_dropped_total, as a background
// task shed does; the object's heartbeat confirms it from the catalog.
func (s *Server) postConfirm(rt Route) {
	if s.cb.maxBatch < 0 {
		s.goBackground("confirm", func(ctx context.Context) error { return s.hosts.Confirm(ctx, rt) })
		return
	}
	if !s.confirmBatcher(rt.HostAddress).post(rt, maxConfirmQueue) {
		s.m.bgDropped.Inc()
	}
}

// maxConfirmQueue bounds the confirms queued for one host: at the
// 20 ms linger and a host answering, a few hundred at most are queued
// even at 10,000 creates a second.
const maxConfirmQueue = 4096

// cacheDeletedRoute writes a deleted database's route (its tombstone)
// through to the cache, batched with the routes of concurrent deletes. (A
// new database's route is staged instead: RouteCache.Stage.)
func (s *Server) cacheDeletedRoute(rt Route) error {
	if s.cb.routes == nil {
		_, err := s.cache.Put(rt)
		return err
	}
	_, err := s.cb.routes.do(context.Background(), rt)
	return err
}

func (s *Server) initBatcher(addr string) *batcher[initCall, struct{}] {
	b := &s.cb
	b.mu.Lock()
	defer b.mu.Unlock()
	if x := b.inits[addr]; x != nil {
		return x
	}
	x := newBatcher(s.bgCtx, &b.wg, min(b.maxBatch, event.MaxHostBatch), b.inflight, 10*time.Second,
		func(ctx context.Context, calls []initCall) ([]struct{}, []error) {
			items := make([]event.InitBatchItem, len(calls))
			for i, c := range calls {
				items[i] = c.item
			}
			errs := s.hostBatchOrEach(addr, len(items),
				func() ([]error, error) { return s.hosts.InitBatch(ctx, addr, items) },
				func(i int) error { _, err := s.hosts.Init(ctx, addr, items[i].ObjectID, items[i].Init); return err })
			// Before the callers wake: the creates whose init is done are
			// on their way to the catalog batcher, which may wait for them.
			for i, c := range calls {
				if i < len(errs) && errs[i] == nil {
					c.tk.arrive()
				}
			}
			return make([]struct{}, len(items)), errs
		})
	x.observe = func(n int) { s.m.batchInit.Observe(float64(n)) }
	x.timing = b.initTiming
	x.setGroupDelay(b.initGroupDelay)
	b.inits[addr] = x
	return x
}

// hostBatchOrEach sends n items of one create step to the host at addr:
// in one batch request when the host takes batch routes, else (an older
// build: its 404 marks it for hostBatchRecheck) one request per item, all
// at once. The i-th error answers item i; a batch request that failed as a
// whole fails every item with its error (outcome unknown).
func (s *Server) hostBatchOrEach(addr string, n int, batch func() ([]error, error), one func(i int) error) []error {
	if s.hostBatches(addr) {
		errs, err := batch()
		if err == nil {
			return errs
		}
		if !errors.Is(err, errHostBatchUnsupported) {
			return fill(n, err)
		}
		s.hostBatchUnsupported(addr)
	}
	errs := make([]error, n)
	concurrently(n, func(i int) { errs[i] = one(i) })
	return errs
}

func (s *Server) confirmBatcher(addr string) *batcher[Route, struct{}] {
	b := &s.cb
	b.mu.Lock()
	defer b.mu.Unlock()
	if x := b.confirms[addr]; x != nil {
		return x
	}
	linger := s.o.ConfirmLinger
	if linger == 0 {
		linger = defaultConfirmLinger
	}
	x := newLingeringBatcher(s.bgCtx, &b.wg, min(b.maxBatch, event.MaxHostBatch), b.inflight, 10*time.Second, linger,
		func(ctx context.Context, rts []Route) ([]struct{}, []error) {
			errs := s.hostBatchOrEach(addr, len(rts),
				func() ([]error, error) { return s.hosts.ConfirmBatch(ctx, addr, rts) },
				func(i int) error { return s.hosts.Confirm(ctx, rts[i]) })
			return make([]struct{}, len(rts)), errs
		})
	x.observe = func(n int) { s.m.batchConfirm.Observe(float64(n)) }
	x.flush = b.flush
	b.confirms[addr] = x
	return x
}

// hostBatches reports whether the host at addr is sent batches (it did not
// answer 404 to one within hostBatchRecheck).
func (s *Server) hostBatches(addr string) bool {
	s.cb.mu.Lock()
	defer s.cb.mu.Unlock()
	until, ok := s.cb.unsupported[addr]
	return !ok || s.o.Now().After(until)
}

func (s *Server) hostBatchUnsupported(addr string) {
	s.cb.mu.Lock()
	s.cb.unsupported[addr] = s.o.Now().Add(hostBatchRecheck)
	s.cb.mu.Unlock()
	s.log.Info("object host takes no batched lifecycle calls (older build): sending them one by one", "host", addr)
}

func fill(n int, err error) []error {
	errs := make([]error, n)
	for i := range errs {
		errs[i] = err
	}
	return errs
}

// concurrently runs fn(0..n-1) on n goroutines and waits for them.
func concurrently(n int, fn func(i int)) {
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			fn(i)
		}()
	}
	wg.Wait()
}

// Gathering the catalog batch. Creates reach the catalog batcher in
// clumps: an init batch coming back from a host wakes all of its creates
// at once. Without gathering, the first of a clump to find the catalog
// slot free went alone and the rest made the next batch — at 16 clients
// about half the catalog batches held one create (4.6 per batch on
// average) — and the catalog's cost is per batch (one request to the
// leader, one log entry appended and fsynced on every voter, one FSM
// transaction per replica). So the catalog batcher's slot holder waits,
// before it takes a batch, for the creates of init batches that came back
// and are not yet in its queue (batcher.gatherLocked), at most
// Options.CreateGather (1ms): they are woken already, and reach the queue
// within goroutine wake-ups. With none on their way (an idle edge, a lone
// create, a fork) a call goes at once, as before.
//
// Nothing about one create changes: its init is done and durable on its
// host before it counts as arriving, its catalog write is still the
// checkpoint and is answered only once committed; the wait only moves
// when the request is sent. Measured (docs/benchmarks.md, "Gathering the
// catalog batch"): waiting also for init batches due back within a
// catalog round trip, or making init batches wait for creates still in
// steps (1)–(3), gave nothing more in the same rounds, and was dropped.

// Grouping the next batch. Closed-loop clients behind a one-slot batcher
// arrive in groups (the creates answered by one batch come back
// together, spread over the time their clients take to send the next), and
// the first of a group to find the slot free went alone while the rest
// waited a whole round trip behind it: 40% of the catalog batches and 45%
// of the init batches held one create at 16 clients. So both the catalog
// batcher and each host's init batcher have a bounded group-commit delay
// (batcher.groupLocked; Options.CreateGroupDelay, CreateInitGroupDelay,
// 2 ms): when a batch of n ≥ 2 creates comes back, the slot holder keeps
// the slot until about n creates are queued again, at most the delay. A
// host whose init slot is held counts as busy for placement, so the next
// group's creates join it instead of starting alone on another host. A
// batch of one never holds its slot (a lone client, an idle edge), and a
// create finding a free slot goes at once.
//
// What it buys is bounded by how the one-slot catalog batcher works under
// load: while its slot is always busy it sends one entry per round trip
// whatever the sizes, so batches of one are a matter of distribution,
// not of count; the entries per second fall only by the time the slot is
// held. Measured (docs/benchmarks.md, "Grouping the next batch"): at 16
// clients catalog batches of one 35–42% → 6–15%, creates per catalog
// batch 5.7–5.9 → 6.5–7.6, the catalog's CPU per create 0.84–0.91× of
// main's with 2 ms holds (either hold alone: no change); with placement's
// slack at 512 too, hosts 0.85–0.90× at 64 clients. Nothing about one
// create changes: the delay only moves when a request is sent.

// initCall is one init in a host's init batcher, with its create's
// gathering ticket (nil: none).
type initCall struct {
	item event.InitBatchItem
	tk   *createTicket
}

// createTicket follows one create attempt through gathering. state: 0
// init in flight, 1 arriving (its init came back done), 2 gone (its
// catalog write queued, or it left the flow). Transitions only move
// forward and are idempotent, so every exit path may call leave.
type createTicket struct {
	cb    *createBatching
	state atomic.Int32
}

// startCreate is a ticket for a create whose init goes through a host's
// init batcher, or nil when the catalog batcher does not gather.
func (b *createBatching) startCreate() *createTicket {
	if b.catalog == nil || b.catalog.expecting == nil {
		return nil
	}
	return &createTicket{cb: b}
}

// move sets the state to next if it is earlier and keeps the arriving
// count; it reports the state left (-1: none, already there or past it).
func (t *createTicket) move(next int32) int32 {
	if t == nil {
		return -1
	}
	for {
		cur := t.state.Load()
		if cur >= next {
			return -1
		}
		if t.state.CompareAndSwap(cur, next) {
			if cur == 1 {
				t.cb.arriving.Add(-1)
			}
			if next == 1 {
				t.cb.arriving.Add(1)
			}
			return cur
		}
	}
}

// arrive: the init came back done; the create heads for the catalog
// queue. Called by the init batch's send before its callers wake.
func (t *createTicket) arrive() { t.move(1) }

// catalogQueued: the catalog write is in the queue (called under the
// batcher's lock, which wakes its slot holder itself).
func (t *createTicket) catalogQueued() { t.move(2) }

// leave: the create left the flow without queuing its catalog write; a
// slot holder waiting for it re-checks at once.
func (t *createTicket) leave() {
	if t.move(2) == 1 {
		t.cb.catalog.gatherWake()
	}
}
