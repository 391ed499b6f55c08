package raftmeta

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
)

// commitWatch sits between Raft and its network transport and records, from
// every AppendEntries request this node receives, the leader's commit index
// and when it arrived. That pair is what a stale read is bounded by.
//
// Raft's own LastContact is not enough: it is refreshed by heartbeats, which
// carry no log position and succeed even when the follower's log or catalog
// is far behind (a node replaying after a restart, one whose replication is
// backing off after a partition, one waiting for an InstallSnapshot). A read
// bounded only by LastContact can answer "unknown" for a database the
// cluster committed long ago. AppendEntries requests carry the leader's
// commit index (the leader sends one every CommitTimeout even when idle, see
// hashicorp/raft's replicate loop), so "applied ≥ the commit index the
// leader last told me, told within max_stale" bounds staleness in both time
// and log position.
//
// Heartbeats take the transport's fast path (SetHeartbeatHandler, promoted
// from the embedded transport) and never pass here; everything else is
// forwarded unchanged, in order, on the channel Raft consumes.
type commitWatch struct {
	*raft.NetworkTransport

	now  func() time.Time
	raft atomic.Pointer[raft.Raft] // for the current term; nil until Raft exists

	commit atomic.Uint64 // highest leader commit index seen
	atNano atomic.Int64  // when an AppendEntries of the current term last arrived (0: never)

	// hbMu fences the heartbeat fast path: handlers hold it shared, and
	// fenceHeartbeats takes it exclusively once Raft is shut down, so no
	// heartbeat is inside Raft (which may write the current term to the
	// stable store) when the stores close. Raft checks its shutdown channel
	// before handling one, but a heartbeat past that check when Shutdown
	// returns would otherwise write to a closed store and panic.
	hbMu     sync.RWMutex
	hbFenced bool

	once      sync.Once
	started   atomic.Bool
	closeOnce sync.Once
	out       chan raft.RPC
	stop      chan struct{}
	done      chan struct{}
}

func newCommitWatch(t *raft.NetworkTransport, now func() time.Time) *commitWatch {
	return &commitWatch{NetworkTransport: t, now: now, out: make(chan raft.RPC), stop: make(chan struct{}), done: make(chan struct{})}
}

// Consumer is called once by raft.NewRaft; it starts the forwarding loop.
func (w *commitWatch) Consumer() <-chan raft.RPC {
	w.once.Do(func() {
		w.started.Store(true)
		go w.loop(w.NetworkTransport.Consumer())
	})
	return w.out
}

func (w *commitWatch) loop(in <-chan raft.RPC) {
	defer close(w.done)
	for {
		select {
		case rpc := <-in:
			w.observe(rpc.Command)
			select {
			case w.out <- rpc:
			case <-w.stop:
				return
			}
		case <-w.stop:
			return
		}
	}
}

// observe records the leader's commit index carried by an AppendEntries
// request. Requests of an older term (a deposed leader's) are ignored: their
// commit index is real but may be far behind the cluster's, so it must not
// count as fresh contact.
func (w *commitWatch) observe(cmd any) {
	req, ok := cmd.(*raft.AppendEntriesRequest)
	if !ok || req.LeaderCommitIndex == 0 {
		return
	}
	if r := w.raft.Load(); r != nil && req.Term < r.CurrentTerm() {
		return
	}
	for {
		cur := w.commit.Load()
		if req.LeaderCommitIndex <= cur || w.commit.CompareAndSwap(cur, req.LeaderCommitIndex) {
			break
		}
	}
	w.atNano.Store(w.now().UnixNano())
}

// last returns the highest leader commit index seen and when the newest
// AppendEntries arrived (zero time: none since start).
func (w *commitWatch) last() (uint64, time.Time) {
	at := w.atNano.Load()
	if at == 0 {
		return w.commit.Load(), time.Time{}
	}
	return w.commit.Load(), time.Unix(0, at)
}

// SetHeartbeatHandler wraps Raft's heartbeat handler with the fence.
func (w *commitWatch) SetHeartbeatHandler(fn func(rpc raft.RPC)) {
	if fn == nil {
		w.NetworkTransport.SetHeartbeatHandler(nil)
		return
	}
	w.NetworkTransport.SetHeartbeatHandler(func(rpc raft.RPC) {
		w.hbMu.RLock()
		defer w.hbMu.RUnlock()
		if w.hbFenced {
			rpc.Respond(nil, raft.ErrTransportShutdown)
			return
		}
		fn(rpc)
	})
}

// fenceHeartbeats waits for heartbeats being handled and refuses the rest;
// call it after raft.Shutdown and before closing the stores.
func (w *commitWatch) fenceHeartbeats() {
	w.hbMu.Lock()
	w.hbFenced = true
	w.hbMu.Unlock()
}

// Close stops the forwarding loop (waiting for it if it ran), then the
// transport. Safe to call more than once.
func (w *commitWatch) Close() error {
	w.closeOnce.Do(func() { close(w.stop) })
	w.once.Do(func() {}) // no loop may start after Close
	if w.started.Load() {
		<-w.done
	}
	return w.NetworkTransport.Close()
}
