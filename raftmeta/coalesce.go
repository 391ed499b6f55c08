package raftmeta

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/shoaldb/shoal/internal/groupwait"
	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// Write coalescing in the Client (issue #15, the raw catalog write). Most
// of what one write cost the catalog's leader was the request, not the
// command: its TLS records, net/http's handler, the JSON envelope, the
// goroutine wake-ups (CPU profiles of the three voters during
// TestDeployBench's raw phase: the HTTP server was ~30% of the leader's
// CPU at 16 writers). So concurrent Client.Apply calls share requests —
// group commit without a timer, as the edge coalesces its creates
// (edge/batcher.go):
//
//   - a call that finds one of the inflight send slots free goes at once,
//     alone, through POST /v1/apply exactly as before (an idle client adds
//     no delay and no new request shape);
//   - calls arriving while every slot is busy queue; the first send to
//     finish takes the queue (up to MaxApplyBatch commands and
//     coalesceMaxBytes of JSON) as one POST /v1/apply-batch.
//
// Nothing a command means changes: each keeps its own request ID (minted
// before it queues, kept by every retry), becomes its own Raft entry with
// its own result or refusal, and is acknowledged only once committed and
// applied, as through /v1/apply. The leader proposes a batch's commands
// before waiting for any, so they share an AppendEntries, an fsync per
// replica and an FSM transaction. A node of a build without
// /v1/apply-batch answers it 404; the client then sends each command of
// that batch through /v1/apply and keeps doing so for coalesceRecheck
// before it tries a batch again (a rolling upgrade: new clients, old
// leader). The log holds the same entries either way, so old and new
// nodes apply them identically.
//
// A caller whose ctx ends while its command is queued or in flight gets
// ErrUnavailable (outcome unknown, as for a lost answer); a batch runs
// under the client's context (ended by Close) with its own bound, so one
// impatient caller never fails the others' commands, and a write sent alone
// also under its caller's ctx, as before coalescing.
//
// Gathering (WithWriteGather, a bounded group-commit delay like Postgres's
// commit_delay with commit_siblings, or MySQL's
// binlog_group_commit_sync_delay with its no_delay_count). With one send
// slot, closed-loop callers settle into two alternating groups: batch A in
// flight while group B queues; when A returns, B goes at once and A's
// callers queue behind it, so an entry carries about half the callers
// (8.0 commands per entry at 16 writers). The catalog's cost is mostly per
// entry (a request, an AppendEntries, an fsync and an FSM transaction on
// each of three voters), so the slot holder, when a send of two or more
// commands returns — evidence of concurrent callers — waits before it
// takes the next batch until as many commands are queued as it expects
// back (the ones just answered plus those already queued, at most
// maxBatch), woken by each call that queues, for at most the bound
// (gatherLocked). It also keeps the slot through that wait when the queue
// is empty, or the first caller back would find the slot free and go
// alone. A send of one command (an idle client, a lone write, a single
// caller in a loop) never waits, and neither does a call that finds the
// slot free: it goes at once, as before. The wait only moves when a
// request is sent; nothing a command means changes.
//
// Gathering only while gathers fill (WithWriteGatherAdaptive, on by
// default). The wait pays off when the callers it expects do come back:
// closed-loop callers (each waiting for its answer, then writing again)
// queue again within about one think time, so the gather fills long before
// its bound. Independent writers (an open loop: edges and hosts serving
// many users) do not: to gather as many as were just answered takes about
// as long as the last round trip took to collect them, longer than the
// bound, so nearly every wait runs out its bound and every write queued
// behind it pays it (TestGatherOpenLoop: +0.9 ms at p50, 1.40×, at 1,500
// writes/s). So a send of two or more gathers only while a
// groupwait.Gate admits it: a score of recent gathers (an EWMA of "filled
// before the bound" — at least 7/8 of the writes it waited for came — or
// "ran out" short of them, weight 1/4) at least 1/2 — three waits
// that run out in a row turn gathering off — or, while off, every 16th
// such send as a probe, a probe that fills followed by another at once,
// so closed-loop callers turn it back on after a few sends (one filled
// probe after three waits ran out, three from a score near 0). A wait ended
// by Close does not count.

const (
	// defaultCoalesceInflight is the number of sends in flight at once
	// before calls queue: one, as the edge's catalog batcher. Against two,
	// in the same rounds of TestDeployBench (raw phase, load 27–38), one
	// gave larger Raft batches (7.1 against 5.1 entries per FSM
	// transaction at 16 writers, 26 against 19 at 64) and less catalog CPU
	// per write (588 against 836 µs at 16, 307 against 386 at 64), at no
	// loss of rate: while a batch commits the leader's Raft is busy with
	// it anyway (its fsync, then the followers').
	defaultCoalesceInflight = 1
	// coalesceMaxBytes bounds a batch's commands' JSON, well under the
	// API's 1 MiB body limit; a command larger than this goes alone.
	coalesceMaxBytes = 512 << 10
	// coalesceRecheck is how long a client that met a node without
	// /v1/apply-batch sends single requests before trying a batch again.
	coalesceRecheck = time.Minute
	// defaultWriteGather is WithWriteGather's default bound (see
	// "Gathering" above and raftmeta/DESIGN.md for the measurements).
	defaultWriteGather = time.Millisecond
)

// WithWriteBatching sets how concurrent writes share requests: up to
// inflight requests in flight at once (default 1), and calls arriving while
// they are busy sent together in the next one (at most maxBatch commands,
// default and ceiling MaxApplyBatch). inflight ≤ 0 turns coalescing off:
// every Apply is its own /v1/apply request. ApplyBatch is not affected.
func WithWriteBatching(maxBatch, inflight int) ClientOption {
	return func(c *clientConfig) { c.coalesceBatch, c.coalesceInflight, c.coalesceSet = maxBatch, inflight, true }
}

// WithWriteGather bounds the gathering wait of coalesced writes (see
// coalesce.go): after a send of two or more concurrent writes returns, the
// next batch waits at most d for the writes it expects back before it is
// sent (default 1 ms), while recent waits filled (WithWriteGatherAdaptive). d ≤ 0 turns gathering off: the next batch is
// whatever queued during the send, sent at once.
func WithWriteGather(d time.Duration) ClientOption {
	return func(c *clientConfig) { c.gather, c.gatherSet = d, true }
}

// WithWriteGatherAdaptive sets whether the gathering wait is skipped while
// recent waits ran out their bound instead of filling (default true; see
// "Gathering only while gathers fill" in coalesce.go): callers writing
// independently of their answers (an open loop) then pay no wait, closed
// loops keep the gather. false gathers after every send of two or more
// commands, the rule before this option.
func WithWriteGatherAdaptive(on bool) ClientOption {
	return func(c *clientConfig) { c.gatherFixed = !on }
}

// GatherStats counts a client's gathering decisions (WithWriteGather)
// since it was made: for tests, benchmarks and diagnostics.
type GatherStats struct {
	// Eligible is the sends of two or more commands after which the slot
	// holder could gather (gathering configured).
	Eligible int64
	// Waited is the gathers entered (Eligible minus those skipped while
	// recent gathers ran out their bound); Probes is how many of them were
	// entered only as a probe.
	Waited, Probes int64
	// Filled is the gathers that filled: their queue reached its target,
	// or at least 7/8 of the writes they waited for came, before the bound
	// (groupwait.Filled); FilledWait the time they waited in all.
	Filled     int64
	FilledWait time.Duration
}

// GatherStats returns the client's gathering counters (zero without
// coalescing or gathering).
func (c *Client) GatherStats() GatherStats {
	q := c.writes
	if q == nil {
		return GatherStats{}
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.stats
}

type coalescer struct {
	c           *Client
	maxBatch    int
	maxInflight int
	gather      time.Duration // ≤ 0: no gathering
	adaptive    bool          // gather only while the score says gathers fill
	wake        chan struct{} // buffered 1: a call queued (wakes a gathering slot holder)

	mu          sync.Mutex
	queue       []*queuedWrite
	queuedBytes int // the queue's commands' JSON, as takeLocked counts it
	inflight    int
	unsupported time.Time      // until then, no /v1/apply-batch (a node answered 404)
	gate        groupwait.Gate // adaptive: whether recent gathers filled
	stats       GatherStats
}

type queuedWrite struct {
	body []byte // the command's JSON (json.Marshal(fsm.Command))
	res  fsm.Result
	err  error
	done chan struct{}
}

func newCoalescer(c *Client, maxBatch, inflight int, gather time.Duration, adaptive bool) *coalescer {
	if maxBatch <= 0 || maxBatch > MaxApplyBatch {
		maxBatch = MaxApplyBatch
	}
	q := &coalescer{c: c, maxBatch: maxBatch, maxInflight: inflight}
	if gather > 0 {
		q.gather, q.adaptive, q.wake = gather, adaptive, make(chan struct{}, 1)
	}
	return q
}

// do submits one command (its JSON) and waits for its outcome.
func (q *coalescer) do(ctx context.Context, body []byte) (fsm.Result, error) {
	w := &queuedWrite{body: body, done: make(chan struct{})}
	q.mu.Lock()
	q.queue = append(q.queue, w)
	q.queuedBytes += len(body) + 1
	var batch []*queuedWrite
	if q.inflight < q.maxInflight {
		q.inflight++
		batch = q.takeLocked()
		q.c.wg.Add(1) // the slot is work Close waits for, on any goroutine
	} else if q.wake != nil {
		select { // a slot holder may be gathering: one more is here
		case q.wake <- struct{}{}:
		default:
		}
	}
	q.mu.Unlock()
	if batch != nil {
		// A free slot: send now on this goroutine (no hand-over). Calls
		// that queued meanwhile (or, gathering, that are expected back)
		// go on in a goroutine, so this caller can return as soon as its
		// own answer is in. A send of this call alone is also bounded by
		// its ctx, as every write was before coalescing.
		var own context.Context
		if len(batch) == 1 && batch[0] == w {
			own = ctx
		}
		q.send(own, batch)
		q.mu.Lock()
		gather := q.gathersAfterLocked(len(batch))
		if len(q.queue) == 0 && !gather {
			q.inflight--
		} else {
			// The slot passes to a goroutine, which takes the next batch
			// itself (and gathers there, not on this caller's time).
			answered := len(batch)
			q.c.wg.Add(1)
			go func() {
				defer q.c.wg.Done()
				q.mu.Lock()
				next := q.nextLocked(answered, gather)
				q.mu.Unlock()
				q.drain(next)
			}()
		}
		q.mu.Unlock()
		q.c.wg.Done()
	}
	select {
	case <-w.done:
		return w.res, w.err
	case <-ctx.Done():
		return fsm.Result{}, fmt.Errorf("%w: gave up waiting for a coalesced write (its outcome is unknown): %w", ErrUnavailable, ctx.Err())
	}
}

// drain sends batch, then the next ones (nextLocked), until there is none
// (nextLocked has then freed the slot; a nil batch: it had already).
func (q *coalescer) drain(batch []*queuedWrite) {
	for batch != nil {
		q.send(nil, batch)
		q.mu.Lock()
		batch = q.nextLocked(len(batch), q.gathersAfterLocked(len(batch)))
		q.mu.Unlock()
	}
}

// nextLocked is the slot holder's next batch once a send of answered
// commands returned: takeLocked after gatherLocked's wait (when gather:
// gathersAfterLocked's decision), or nil when the queue is still empty —
// the slot is then free (inflight decremented). Only the slot holder takes
// from the queue. q.mu is held on entry and on return (released while
// gathering).
func (q *coalescer) nextLocked(answered int, gather bool) []*queuedWrite {
	if gather {
		q.gatherLocked(answered)
	}
	if len(q.queue) == 0 {
		q.inflight--
		return nil
	}
	return q.takeLocked()
}

// gathersAfterLocked decides, once per send, whether the slot holder whose
// send of answered commands returned waits for more before its next batch:
// never after a send of one command or without gathering; with the
// adaptive rule, only while the gate admits it (recent gathers filled, or
// a probe). It counts the decision. q.mu held.
func (q *coalescer) gathersAfterLocked(answered int) bool {
	if q.gather <= 0 || answered < 2 {
		return false
	}
	q.stats.Eligible++
	wait, probe := true, false
	if q.adaptive {
		wait, probe = q.gate.Admit()
	}
	if wait {
		q.stats.Waited++
	}
	if probe {
		q.stats.Probes++
	}
	return wait
}

// gatherLocked is the gathering wait (see "Gathering" above), entered when
// gathersAfterLocked said so: until the queue holds as many as were just
// answered plus those queued now (at most maxBatch, or a batch's worth of
// bytes), woken by each call that queues, for at most q.gather in all, and
// no longer once the client's context ends (Close). With the queue already
// that long it returns at once. Its outcome (filled, or ran out its bound)
// goes to the gate, unless Close ended it. q.mu is held on entry and on
// return, released while waiting.
func (q *coalescer) gatherLocked(answered int) {
	start := len(q.queue)
	want := min(answered+start, q.maxBatch)
	select { // a signal left from before this wait only costs a re-check
	case <-q.wake:
	default:
	}
	filled := func() bool { return len(q.queue) >= want || q.queuedBytes >= coalesceMaxBytes }
	t0 := time.Now()
	stop := q.c.sendContext().Done()
	groupwait.Locked(&q.mu, q.wake, q.gather, stop, filled)
	select {
	case <-stop: // Close ended it: no evidence either way
		return
	default:
	}
	ok := filled() || groupwait.Filled(len(q.queue)-start, want-start)
	if ok {
		q.stats.Filled++
		q.stats.FilledWait += time.Since(t0)
	}
	q.gate.Record(ok)
}

// takeLocked removes the next batch from the head of the queue: up to
// maxBatch commands and coalesceMaxBytes of JSON, at least one.
func (q *coalescer) takeLocked() []*queuedWrite {
	n, size := 0, 0
	for n < len(q.queue) && n < q.maxBatch {
		size += len(q.queue[n].body) + 1
		if n > 0 && size > coalesceMaxBytes {
			break
		}
		n++
	}
	batch := make([]*queuedWrite, n)
	copy(batch, q.queue[:n])
	for _, w := range batch {
		q.queuedBytes -= len(w.body) + 1
	}
	rest := copy(q.queue, q.queue[n:])
	clear(q.queue[rest:])
	q.queue = q.queue[:rest]
	return batch
}

// send delivers one batch's outcomes. A batch of one, or any batch while a
// node lacking /v1/apply-batch was seen recently, goes through /v1/apply.
// The send runs under the client's context, and under own as well when it
// is its only caller's (own: that caller's ctx; nil otherwise).
func (q *coalescer) send(own context.Context, batch []*queuedWrite) {
	c := q.c
	ctx, cancel := context.WithTimeout(c.sendContext(), c.sendBound())
	defer cancel()
	if own != nil {
		stop := context.AfterFunc(own, cancel)
		defer stop()
	}
	q.mu.Lock()
	single := len(batch) == 1 || time.Now().Before(q.unsupported)
	q.mu.Unlock()
	if !single {
		bodies := make([][]byte, len(batch))
		for i, w := range batch {
			bodies[i] = w.body
		}
		res, errs, unsupported := c.applyBodies(ctx, bodies)
		if !unsupported {
			for i, w := range batch {
				w.res, w.err = res[i], errs[i]
				close(w.done)
			}
			return
		}
		q.mu.Lock()
		q.unsupported = time.Now().Add(coalesceRecheck)
		q.mu.Unlock()
	}
	if len(batch) == 1 {
		w := batch[0]
		w.res, w.err = c.applySingle(ctx, w.body)
		close(w.done)
		return
	}
	var wg sync.WaitGroup
	for _, w := range batch {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.res, w.err = c.applySingle(ctx, w.body)
			close(w.done)
		}()
	}
	wg.Wait()
}

// sendBound bounds one coalesced send with all its retries: every attempt
// timing out and every backoff at its longest.
func (c *Client) sendBound() time.Duration {
	return time.Duration(c.attempts) * (c.writeTO + c.boMax)
}
