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
// sent (default 1 ms). d ≤ 0 turns gathering off: the next batch is
// whatever queued during the send, sent at once.
func WithWriteGather(d time.Duration) ClientOption {
	return func(c *clientConfig) { c.gather, c.gatherSet = d, true }
}

type coalescer struct {
	c           *Client
	maxBatch    int
	maxInflight int
	gather      time.Duration // ≤ 0: no gathering
	wake        chan struct{} // buffered 1: a call queued (wakes a gathering slot holder)

	mu          sync.Mutex
	queue       []*queuedWrite
	queuedBytes int // the queue's commands' JSON, as takeLocked counts it
	inflight    int
	unsupported time.Time // until then, no /v1/apply-batch (a node answered 404)
}

type queuedWrite struct {
	body []byte // the command's JSON (json.Marshal(fsm.Command))
	res  fsm.Result
	err  error
	done chan struct{}
}

func newCoalescer(c *Client, maxBatch, inflight int, gather time.Duration) *coalescer {
	if maxBatch <= 0 || maxBatch > MaxApplyBatch {
		maxBatch = MaxApplyBatch
	}
	q := &coalescer{c: c, maxBatch: maxBatch, maxInflight: inflight}
	if gather > 0 {
		q.gather, q.wake = gather, make(chan struct{}, 1)
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
		if len(q.queue) == 0 && !q.gathersAfter(len(batch)) {
			q.inflight--
		} else {
			// The slot passes to a goroutine, which takes the next batch
			// itself (and gathers there, not on this caller's time).
			answered := len(batch)
			q.c.wg.Add(1)
			go func() {
				defer q.c.wg.Done()
				q.mu.Lock()
				next := q.nextLocked(answered)
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
		batch = q.nextLocked(len(batch))
		q.mu.Unlock()
	}
}

// nextLocked is the slot holder's next batch once a send of answered
// commands returned: takeLocked after gatherLocked's wait, or nil when the
// queue is still empty — the slot is then free (inflight decremented).
// Only the slot holder takes from the queue. q.mu is held on entry and on
// return (released while gathering).
func (q *coalescer) nextLocked(answered int) []*queuedWrite {
	q.gatherLocked(answered)
	if len(q.queue) == 0 {
		q.inflight--
		return nil
	}
	return q.takeLocked()
}

// gathersAfter reports whether a slot holder whose send of answered
// commands returned waits for more before its next batch.
func (q *coalescer) gathersAfter(answered int) bool {
	return q.gather > 0 && answered >= 2
}

// gatherLocked is the gathering wait (see "Gathering" above): after a send
// of two or more commands, until the queue holds as many as were just
// answered plus those queued now (at most maxBatch, or a batch's worth of
// bytes), woken by each call that queues, for at most q.gather in all, and
// no longer once the client's context ends (Close). After a send of one
// command, or with the queue already that long, it returns at once. q.mu
// is held on entry and on return, released while waiting.
func (q *coalescer) gatherLocked(answered int) {
	if !q.gathersAfter(answered) {
		return
	}
	want := min(answered+len(q.queue), q.maxBatch)
	select { // a signal left from before this wait only costs a re-check
	case <-q.wake:
	default:
	}
	groupwait.Locked(&q.mu, q.wake, q.gather, q.c.sendContext().Done(), func() bool {
		return len(q.queue) >= want || q.queuedBytes >= coalesceMaxBytes
	})
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
