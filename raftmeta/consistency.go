package raftmeta

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/hashicorp/raft"
)

// Consistency is a read's consistency level, chosen per request.
type Consistency string

const (
	// Linearizable reads observe every write acknowledged before the read
	// started, on any node (ReadIndex: the leader captures its commit index,
	// confirms leadership with a heartbeat round, and the serving node waits
	// until it has applied that index). The zero value means Linearizable.
	Linearizable Consistency = "linearizable"
	// Leader reads are served only by the leader, from its local catalog,
	// trusting Raft's leader lease (LeaderLeaseTimeout) instead of a
	// heartbeat round. A deposed leader may serve for up to one lease.
	Leader Consistency = "leader"
	// Stale reads are served by any node, voters and non-voters, from the
	// local catalog, refused with ErrTooStale when the node has not heard
	// from a leader within the max-staleness bound.
	Stale Consistency = "stale"
)

// ReadOptions choose how a read is served. The zero value is a
// linearizable read.
type ReadOptions struct {
	Consistency Consistency
	// MaxStale tightens the node's max-staleness for a Stale read (0: the
	// node's own bound, which a request cannot loosen).
	MaxStale time.Duration
	// NoCache skips the Client's stale-read cache.
	NoCache bool
	// PreferFollowers sends a Stale read to the leader only when no
	// follower answers: the followers take turns (round-robin), the leader
	// (as last learned from a write or a linearizable read) is tried after
	// every healthy follower. For bulk background reads — object hosts'
	// heartbeats — whose load would otherwise fall on the leader that
	// serves every write as well. Ignored for other consistency levels.
	PreferFollowers bool
}

// StaleRead, LeaderRead and LinearizableRead are the common ReadOptions.
func StaleRead() ReadOptions        { return ReadOptions{Consistency: Stale} }
func LeaderRead() ReadOptions       { return ReadOptions{Consistency: Leader} }
func LinearizableRead() ReadOptions { return ReadOptions{Consistency: Linearizable} }

// ParseConsistency accepts "", "linearizable", "leader" and "stale".
func ParseConsistency(s string) (Consistency, error) {
	switch Consistency(s) {
	case "", Linearizable:
		return Linearizable, nil
	case Leader, Stale:
		return Consistency(s), nil
	}
	return "", fmt.Errorf("unknown consistency %q (want linearizable, leader or stale)", s)
}

func (o ReadOptions) level() Consistency {
	if o.Consistency == "" {
		return Linearizable
	}
	return o.Consistency
}

// ReadMeta describes how a read was served.
type ReadMeta struct {
	Node         string      `json:"node"`
	Consistency  Consistency `json:"consistency"`
	AppliedIndex uint64      `json:"applied_index"`
	// StalenessMs is how long before the read this node last received the
	// leader's commit index (0 on the leader and for linearizable reads).
	StalenessMs int64 `json:"staleness_ms"`
	// CommitIndex is, for a stale read, the commit index the node knew
	// (the leader's, as of StalenessMs ago) and had applied before serving:
	// the read reflects every write committed up to it.
	CommitIndex uint64 `json:"commit_index,omitempty"`
}

// ReadBarrier blocks until the local catalog may serve a read at the given
// level, then returns how fresh it is. Callers read n.FSM() afterwards; the
// catalog only moves forward, so the read is at least as fresh as ReadMeta.
func (n *Node) ReadBarrier(ctx context.Context, o ReadOptions) (ReadMeta, error) {
	lvl := o.level()
	meta := ReadMeta{Node: n.cfg.ID, Consistency: lvl}
	var err error
	switch lvl {
	case Linearizable:
		err = n.linearizableBarrier(ctx)
	case Leader:
		if n.raft.State() != raft.Leader {
			err = n.notLeader()
		}
	case Stale:
		meta.CommitIndex, meta.StalenessMs, err = n.staleBarrier(ctx, o.MaxStale)
	default:
		err = fmt.Errorf("unknown consistency %q", lvl)
	}
	outcome := "ok"
	if err != nil {
		outcome = "refused"
	}
	n.metrics.reads.WithLabelValues(string(lvl), outcome).Inc()
	if err != nil {
		return meta, err
	}
	meta.AppliedIndex = n.AppliedIndex()
	return meta, nil
}

// staleBarrier admits a stale read when the node's catalog is fresh in both
// time and log position: the leader's commit index reached this node within
// the bound (the leader itself is always fresh), and the node has applied
// at least that index — waiting up to StaleCatchUp for the usual in-flight
// batch. A node still replaying after a start, or catching up after a
// partition, answers ErrNotReady and never "unknown" for rows it has not
// applied yet. Returns the index the read is bounded by and the staleness.
func (n *Node) staleBarrier(ctx context.Context, reqBound time.Duration) (uint64, int64, error) {
	bound := n.cfg.MaxStale
	if reqBound > 0 && reqBound < bound {
		bound = reqBound
	}
	target := n.raft.CommitIndex()
	var staleness time.Duration
	if n.raft.State() != raft.Leader {
		commit, at := n.trans.last()
		if at.IsZero() {
			return 0, 0, fmt.Errorf("%w: node %s has not heard from a leader since it started", ErrTooStale, n.cfg.ID)
		}
		staleness = max(n.cfg.Now().Sub(at), 0)
		if staleness > bound {
			return 0, 0, fmt.Errorf("%w: node %s last heard the leader's commit index %s ago (max %s)", ErrTooStale, n.cfg.ID, staleness.Round(time.Millisecond), bound)
		}
		target = max(target, commit)
	}
	if n.AppliedIndex() < target {
		wctx, cancel := context.WithTimeout(ctx, n.cfg.StaleCatchUp)
		err := n.waitApplied(wctx, target)
		cancel()
		if errors.Is(err, ErrClosed) {
			return 0, 0, err
		}
		if err != nil {
			return 0, 0, fmt.Errorf("%w: node %s has applied index %d of %d committed (replaying or catching up)", ErrNotReady, n.cfg.ID, n.AppliedIndex(), target)
		}
	}
	return target, staleness.Milliseconds(), nil
}

func (n *Node) linearizableBarrier(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, n.cfg.ReadTimeout)
	defer cancel()
	var lastErr error
	for attempt := 0; attempt < forwardAttempts; attempt++ {
		if attempt > 0 {
			if err := sleepCtx(ctx, backoff(attempt-1)); err != nil {
				return fmt.Errorf("%w: read index: %v (last error: %v)", ErrUnavailable, err, lastErr)
			}
		}
		var idx uint64
		var err error
		if n.raft.State() == raft.Leader {
			idx, err = n.leaderReadIndex(ctx)
		} else {
			idx, err = n.forwardReadIndex(ctx)
		}
		if err == nil {
			return n.waitApplied(ctx, idx)
		}
		if !retryable(err) {
			return err
		}
		lastErr = err
	}
	return fmt.Errorf("%w: read index: %v", ErrUnavailable, lastErr)
}

// leaderReadIndex is the ReadIndex step on the leader: the commit index,
// confirmed by a heartbeat round (VerifyLeader) taken after capturing it.
// Concurrent VerifyLeader calls share heartbeat rounds.
func (n *Node) leaderReadIndex(ctx context.Context) (uint64, error) {
	if n.raft.State() != raft.Leader {
		return 0, n.notLeader()
	}
	if err := n.ensureLeaderReady(ctx); err != nil {
		return 0, err
	}
	idx := n.raft.CommitIndex()
	if err := n.raft.VerifyLeader().Error(); err != nil {
		return 0, n.notLeader()
	}
	return idx, nil
}

func (n *Node) forwardReadIndex(ctx context.Context) (uint64, error) {
	l, ok := n.leader()
	if !ok || l.HTTPAddr == "" {
		n.metrics.forwarded.WithLabelValues("read_index", "no_leader").Inc()
		return 0, fmt.Errorf("%w: no leader known", ErrUnavailable)
	}
	var out struct {
		Index uint64 `json:"index"`
	}
	if err := n.forward(ctx, "GET", l, "/v1/read-index", nil, &out); err != nil {
		n.metrics.forwarded.WithLabelValues("read_index", "error").Inc()
		return 0, err
	}
	n.metrics.forwarded.WithLabelValues("read_index", "ok").Inc()
	return out.Index, nil
}

// waitApplied blocks until the local catalog has applied idx.
func (n *Node) waitApplied(ctx context.Context, idx uint64) error {
	for {
		wake := n.fsm.wake()
		if n.AppliedIndex() >= idx {
			return nil
		}
		select {
		case <-wake:
		case <-ctx.Done():
			return fmt.Errorf("%w: waiting for index %d (applied %d): %v", ErrUnavailable, idx, n.AppliedIndex(), ctx.Err())
		case <-n.ctx.Done():
			return ErrClosed
		}
	}
}

func formatIndex(i uint64) string { return strconv.FormatUint(i, 10) }
