package edge

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shoaldb/shoal/internal/groupwait"
)

// batcher coalesces concurrent calls of one kind (the catalog writes of
// creates, the inits and confirms sent to one object host) into batches:
// group commit without a timer. A call that finds a send slot free sends at
// once, on its own goroutine, in a batch of one — an idle edge adds no
// delay. While maxInflight batches are in flight, calls queue; the first
// batch to finish takes the whole queue (up to maxBatch) as its next batch.
// So the batch size follows the load: about the calls that arrive during
// one round trip, divided by the slots.
//
// A batcher may also linger (newLingeringBatcher): the slot holder then
// sends a batch only once its oldest call has waited linger (or as soon as
// maxBatch calls queued), so batches hold about the calls of linger
// instead of one round trip. Only for calls nobody waits on: the create flow's confirms,
// sent after the client's answer, whose cost is per batch (a frame stream,
// its JSON and goroutines on both sides) and whose delay changes nothing
// anyone sees (an unconfirmed object accepts queries; the catalog row is the
// checkpoint and heartbeats confirm what a lost confirm left).
//
// Every call keeps its own identity inside the batch (its own request ID,
// its own result or refusal); batching changes how many requests carry
// them, never what any one of them means. A caller whose ctx ends while
// its call is queued or in flight gets an error wrapping ErrUnavailable: the
// call's outcome is then unknown, exactly as for a request whose answer was
// lost, and the caller handles it the same way.
//
// Sends run under the owner's context (cancelled by Server.Close after its
// grace) with timeout, never under one caller's: one impatient caller must
// not fail the others' calls. wg counts the goroutines that continue with
// a queue after the call that started them returned.
type batcher[T, R any] struct {
	send        func(ctx context.Context, items []T) ([]R, []error)
	maxBatch    int
	maxInflight int
	timeout     time.Duration
	ctx         context.Context
	wg          *sync.WaitGroup
	observe     func(n int) // each batch's size, when set
	// timing, when set, is told how long each batch's send took, how long
	// each call queued before its batch was taken, and how long the slot
	// holder waited with its slot (batchTiming).
	timing *batchTiming
	linger time.Duration
	full   chan struct{}   // lingering: the queue reached maxBatch (wakes the wait early)
	flush  <-chan struct{} // lingering: closed, lingering ends (the owner is closing)
	// A gathering batcher's slot holder waits, before it takes a batch,
	// for calls known to be on their way (see gatherLocked): expecting
	// reports whether any are; gatherMax bounds the whole wait; wake is
	// signalled (buffered 1) when a call queues or an expected call will
	// not come.
	expecting func() bool
	gatherMax time.Duration
	wake      chan struct{}
	// groupDelay (> 0: a grouping batcher, see groupLocked) bounds how
	// long a batch that came back with ≥ 2 calls keeps its slot to wait
	// for about as many calls again; wake is signalled by each enqueue.
	groupDelay time.Duration

	mu       sync.Mutex
	queue    []*batchCall[T, R]
	inflight int
	// progress is when a batch was last taken or last came back: with
	// batches in flight and no progress for a while, the peer is stalled
	// (load).
	progress time.Time
	// last is the size of the batch that last came back (groupLocked).
	last int
}

type batchCall[T, R any] struct {
	item T
	at   time.Time // when it was queued (lingering or timed batchers only)
	res  R
	err  error
	done chan struct{}
}

func newBatcher[T, R any](ctx context.Context, wg *sync.WaitGroup, maxBatch, maxInflight int, timeout time.Duration,
	send func(ctx context.Context, items []T) ([]R, []error)) *batcher[T, R] {
	return &batcher[T, R]{send: send, maxBatch: max(1, maxBatch), maxInflight: max(1, maxInflight),
		timeout: timeout, ctx: ctx, wg: wg}
}

// newLingeringBatcher is newBatcher whose batches wait until their oldest
// call has queued for linger (see batcher).
func newLingeringBatcher[T, R any](ctx context.Context, wg *sync.WaitGroup, maxBatch, maxInflight int, timeout, linger time.Duration,
	send func(ctx context.Context, items []T) ([]R, []error)) *batcher[T, R] {
	b := newBatcher(ctx, wg, maxBatch, maxInflight, timeout, send)
	b.linger = max(0, linger)
	b.full = make(chan struct{}, 1)
	return b
}

// do submits item and waits for its result.
func (b *batcher[T, R]) do(ctx context.Context, item T) (R, error) {
	return b.doQueued(ctx, item, nil)
}

// doQueued is do, calling queued (when not nil) once item is in the queue,
// under b.mu: a gathering batcher's owner counts the call as arrived there,
// so a slot holder never sees it neither expected nor queued.
func (b *batcher[T, R]) doQueued(ctx context.Context, item T, queued func()) (R, error) {
	c := b.newCall(item)
	b.mu.Lock()
	b.enqueueLocked(c)
	if queued != nil {
		queued()
	}
	var batch []*batchCall[T, R]
	if b.inflight < b.maxInflight {
		b.inflight++
		if batch = b.nextLocked(false); batch == nil {
			b.inflight-- // another slot holder took the queue while this one gathered
		}
	}
	b.mu.Unlock()
	if batch != nil {
		// A free slot: send now, on this goroutine (no hand-over). If calls
		// queued meanwhile (or a grouping batcher holds its slot for the
		// next group), a goroutine carries on with them so this caller can
		// answer its client.
		b.sendBatch(batch)
		b.mu.Lock()
		b.cameBackLocked(len(batch))
		if len(b.queue) == 0 && !b.holdsSlotLocked() {
			b.inflight--
		} else {
			// The slot passes to a goroutine; it takes the next batch
			// itself (a lingering or grouping batcher waits there, not
			// this caller).
			b.wg.Add(1)
			go func() {
				defer b.wg.Done()
				b.mu.Lock()
				next := b.nextLocked(true)
				if next == nil {
					b.inflight-- // the group wait ended with nothing queued
				}
				b.mu.Unlock()
				b.drain(next)
			}()
		}
		b.mu.Unlock()
	}
	select {
	case <-c.done:
		return c.res, c.err
	case <-ctx.Done():
		var zero R
		return zero, fmt.Errorf("%w: gave up waiting for a batched call (its outcome is unknown): %w", ErrUnavailable, ctx.Err())
	}
}

// post queues item for a batch without waiting for its outcome, for calls
// nobody waits on (the create flow's confirms, sent after the client's
// answer): no goroutine per call — a call that finds a slot free starts
// one goroutine that sends batches until the queue is empty, lingering
// as the batcher does. With maxQueued (> 0) calls already queued it drops
// item and returns false (the peer is slow or down: what the caller
// posts is best effort). Outcomes are discarded.
func (b *batcher[T, R]) post(item T, maxQueued int) bool {
	c := b.newCall(item)
	b.mu.Lock()
	defer b.mu.Unlock()
	if maxQueued > 0 && len(b.queue) >= maxQueued {
		return false
	}
	b.enqueueLocked(c)
	if b.inflight < b.maxInflight {
		b.inflight++
		b.wg.Add(1)
		go func() {
			defer b.wg.Done()
			b.mu.Lock()
			next := b.nextLocked(false)
			if next == nil {
				b.inflight-- // another slot holder took the queue while this one waited
			}
			b.mu.Unlock()
			b.drain(next)
		}()
	}
	return true
}

// newCall is a call of item, stamped with its queuing time when the
// batcher lingers or is timed.
func (b *batcher[T, R]) newCall(item T) *batchCall[T, R] {
	c := &batchCall[T, R]{item: item, done: make(chan struct{})}
	if b.linger > 0 || b.timing != nil {
		c.at = time.Now()
	}
	return c
}

// enqueueLocked appends c to the queue and wakes whoever waits for it: a
// gathering or grouping slot holder, a lingering one once the queue is
// full (a full batch need not wait for its linger). Under b.mu.
func (b *batcher[T, R]) enqueueLocked(c *batchCall[T, R]) {
	b.queue = append(b.queue, c)
	b.signalWake()
	if b.full != nil && len(b.queue) == b.maxBatch {
		select {
		case b.full <- struct{}{}:
		default:
		}
	}
}

// drain sends batch, then whatever queued meanwhile, until the queue is
// empty (and, for a grouping batcher, stays empty through its group
// wait); then it frees its slot. A nil batch: nothing to do (the caller
// freed the slot).
func (b *batcher[T, R]) drain(batch []*batchCall[T, R]) {
	for batch != nil {
		b.sendBatch(batch)
		b.mu.Lock()
		b.cameBackLocked(len(batch))
		if len(b.queue) == 0 && !b.holdsSlotLocked() {
			b.inflight--
			b.mu.Unlock()
			return
		}
		batch = b.nextLocked(true)
		if batch == nil {
			b.inflight--
		}
		b.mu.Unlock()
	}
}

// cameBackLocked records a batch of n calls coming back.
func (b *batcher[T, R]) cameBackLocked(n int) {
	b.progress = time.Now()
	b.last = n
}

// holdsSlotLocked reports whether the slot holder keeps its slot, with an
// empty queue, to wait for the next group (groupLocked).
func (b *batcher[T, R]) holdsSlotLocked() bool {
	return b.groupDelay > 0 && b.last >= 2
}

// nextLocked is the slot holder's next batch: takeLocked, after waiting (with
// b.mu released) for the next group if a batch just came back (returned,
// on a grouping batcher: groupLocked), for calls on their way (on a
// gathering batcher: gatherLocked) and until the oldest queued call has
// lingered (on a lingering batcher). Only the slot holder takes from the
// queue. It returns nil when the queue is empty after the group wait, or
// — with several slots — after a gather or linger wait during which another
// slot holder took it (the caller then frees the slot, under the same
// hold of b.mu; before 2026-12-04 that case sent an empty batch); otherwise
// a batch of at least one call. A queue reaching
// maxBatch cuts the linger short (a stale signal only makes a later batch
// smaller), and so does the owner's context ending (Close: what queued is
// sent, or fails, at once).
func (b *batcher[T, R]) nextLocked(returned bool) []*batchCall[T, R] {
	if returned {
		b.groupLocked()
		if len(b.queue) == 0 {
			return nil
		}
	}
	b.gatherLocked()
	if len(b.queue) == 0 {
		// With several slots, another holder took the queue while this
		// one waited (b.mu is released there): nothing to send.
		return nil
	}
	if b.linger > 0 && len(b.queue) < b.maxBatch {
		if wait := b.linger - time.Since(b.queue[0].at); wait > 0 {
			b.mu.Unlock()
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-b.full:
				t.Stop()
			case <-b.flush:
				t.Stop()
			case <-b.ctx.Done():
				t.Stop()
			}
			b.mu.Lock()
			if len(b.queue) == 0 {
				return nil
			}
		}
	}
	return b.takeLocked()
}

// newGroupingBatcher is newBatcher with a bounded group-commit delay (see
// groupLocked): after a batch of ≥ 2 calls comes back, the slot holder
// waits, at most groupDelay, until as many calls are queued again.
func newGroupingBatcher[T, R any](ctx context.Context, wg *sync.WaitGroup, maxBatch, maxInflight int, timeout, groupDelay time.Duration,
	send func(ctx context.Context, items []T) ([]R, []error)) *batcher[T, R] {
	b := newBatcher(ctx, wg, maxBatch, maxInflight, timeout, send)
	b.setGroupDelay(groupDelay)
	return b
}

func (b *batcher[T, R]) setGroupDelay(d time.Duration) {
	if d > 0 {
		b.groupDelay = d
		if b.wake == nil {
			b.wake = make(chan struct{}, 1)
		}
	}
}

// groupLocked is a grouping batcher's group-commit delay (Postgres's
// commit_delay with commit_siblings, sized by the load): when a batch of
// n ≥ 2 calls has just come back, the slot holder keeps its slot until
// about n calls are queued again (min(n, maxBatch)), woken by each
// enqueue, for at most groupDelay, and not once the owner's context ends.
// Closed-loop callers behind a one-slot batcher otherwise settle into
// small groups: the first of a group to come back finds the slot free (or
// a queue of one) and goes alone, and the rest wait a whole round trip
// behind it. A batch of one (a lone caller, an idle edge) never waits,
// and a call finding the slot free never does either: only the holder of
// a slot whose batch just came back waits. b.mu is held on entry and on
// return, released while waiting. With several slots a wake may go to
// another waiting holder: a missed wake only ends a wait at its bound.
func (b *batcher[T, R]) groupLocked() {
	if b.groupDelay <= 0 || b.last < 2 {
		return
	}
	target := min(b.last, b.maxBatch)
	t0 := time.Now()
	groupwait.Locked(&b.mu, b.wake, b.groupDelay, b.ctx.Done(), func() bool { return len(b.queue) >= target })
	b.timing.held("group", time.Since(t0))
}

// newGatheringBatcher is newBatcher whose slot holder waits, at most
// gatherMax per batch, while expecting() reports calls on their way (see
// gatherLocked). The owner calls gatherWake when an expected call will
// not come after all.
func newGatheringBatcher[T, R any](ctx context.Context, wg *sync.WaitGroup, maxBatch, maxInflight int, timeout, gatherMax time.Duration,
	expecting func() bool, send func(ctx context.Context, items []T) ([]R, []error)) *batcher[T, R] {
	b := newBatcher(ctx, wg, maxBatch, maxInflight, timeout, send)
	if gatherMax > 0 && expecting != nil {
		b.expecting, b.gatherMax = expecting, gatherMax
		if b.wake == nil {
			b.wake = make(chan struct{}, 1)
		}
	}
	return b
}

// gatherLocked is the gathering batcher's wait before its slot holder takes
// a batch: while expecting() reports calls on their way (the catalog
// batcher: creates whose init batch came back, woken but not yet queued),
// it waits for them — woken by each call that queues and by gatherWake —
// for at most gatherMax in all, and never once the queue holds maxBatch or
// the owner's context ends. With nothing expected (an idle edge, a lone
// create) it returns at once: the call goes alone, as without gathering.
// b.mu is held on entry and on return, released while waiting (expecting
// is called without it).
func (b *batcher[T, R]) gatherLocked() {
	if b.expecting == nil {
		return
	}
	var t *time.Timer
	defer func() {
		if t != nil {
			t.Stop()
		}
	}()
	t0 := time.Now()
	defer func() { b.timing.held("gather", time.Since(t0)) }()
	for len(b.queue) < b.maxBatch {
		b.mu.Unlock()
		more := b.expecting()
		if more && t == nil {
			t = time.NewTimer(b.gatherMax)
		}
		if more {
			select {
			case <-b.wake:
			case <-t.C:
				more = false
			case <-b.ctx.Done():
				more = false
			}
		}
		b.mu.Lock()
		if !more {
			return
		}
	}
}

// batchTiming is where a batcher reports its timings (the create
// batchers: createBatchTimings): what a call's wait is made of.
type batchTiming struct {
	send   prometheus.Observer // per batch: the send's round trip
	queued prometheus.Observer // per call: from queuing to its batch being taken
	// hold is the time slot holders waited with their slot, by reason
	// (group: groupLocked; gather: gatherLocked).
	hold *prometheus.CounterVec
}

// held adds d to the slot hold time for reason (nil-safe).
func (t *batchTiming) held(reason string, d time.Duration) {
	if t == nil || t.hold == nil {
		return
	}
	t.hold.WithLabelValues(reason).Add(d.Seconds())
}

// signalWake wakes a gathering or grouping slot holder (no-op for other
// batchers).
func (b *batcher[T, R]) signalWake() {
	if b.wake == nil {
		return
	}
	select {
	case b.wake <- struct{}{}:
	default:
	}
}

// gatherWake tells a gathering batcher that an expected call will not come
// (it re-asks expecting).
func (b *batcher[T, R]) gatherWake() { b.signalWake() }

// load is how busy the batcher is — the calls queued for its next batch
// plus one per batch in flight — or 0 when it has batches in flight but
// took or finished none for stall: a peer that stopped answering is not
// "busy" (placement must not pile creates onto a hung host's batch).
func (b *batcher[T, R]) load(stall time.Duration) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.inflight > 0 && time.Since(b.progress) > stall {
		return 0
	}
	return len(b.queue) + b.inflight
}

// takeLocked removes up to maxBatch calls from the head of the queue.
func (b *batcher[T, R]) takeLocked() []*batchCall[T, R] {
	n := min(len(b.queue), b.maxBatch)
	b.progress = time.Now()
	batch := make([]*batchCall[T, R], n)
	copy(batch, b.queue[:n])
	if b.timing != nil {
		for _, c := range batch {
			b.timing.queued.Observe(b.progress.Sub(c.at).Seconds())
		}
	}
	rest := copy(b.queue, b.queue[n:])
	clear(b.queue[rest:])
	b.queue = b.queue[:rest]
	return batch
}

func (b *batcher[T, R]) sendBatch(batch []*batchCall[T, R]) {
	items := make([]T, len(batch))
	for i, c := range batch {
		items[i] = c.item
	}
	if b.observe != nil {
		b.observe(len(items))
	}
	ctx, cancel := context.WithTimeout(b.ctx, b.timeout)
	var t0 time.Time
	if b.timing != nil {
		t0 = time.Now()
	}
	res, errs := b.send(ctx, items)
	if b.timing != nil {
		b.timing.send.Observe(time.Since(t0).Seconds())
	}
	cancel()
	for i, c := range batch {
		if i < len(res) {
			c.res = res[i]
		}
		if i < len(errs) {
			c.err = errs[i]
		} else {
			c.err = fmt.Errorf("%w: batch answered %d of %d calls", ErrUnavailable, len(errs), len(batch))
		}
		close(c.done)
	}
}
