package raftmeta

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/hashicorp/raft"

	"github.com/shoaldb/shoal/internal/ids"
	"github.com/shoaldb/shoal/raftmeta/fsm"
)

const (
	forwardAttempts  = 8
	backoffBase      = 25 * time.Millisecond
	backoffMax       = 800 * time.Millisecond
	headerForwarded  = "X-Shoal-Forwarded"
	headerLeader     = "X-Shoal-Leader"
	headerLeaderID   = "X-Shoal-Leader-Id"
	headerAppliedIdx = "X-Shoal-Applied-Index"
)

// ApplyResponse is the answer to an applied command.
type ApplyResponse struct {
	Result fsm.Result `json:"result"`
	Node   string     `json:"node"` // the leader that applied it
}

// backoff returns the pause before retry attempt i (0-based), doubling
// from backoffBase up to backoffMax.
func backoff(i int) time.Duration {
	d := backoffBase << i
	if d > backoffMax || d <= 0 {
		d = backoffMax
	}
	return d
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// checkFresh is checkCommand against this node's view of the cluster's
// level, confirmed before a refusal: a node that has not yet applied the
// leader's latest set_cluster_level (a follower a few milliseconds behind,
// or a leader just elected) would otherwise answer a final
// cluster_level_too_low for a command the cluster already takes. So a
// command the local level refuses is checked again after a linearizable
// barrier (the leader's commit index, applied here); only then is the
// refusal final. A node that cannot reach the leader for it answers
// unavailable (retryable), not a refusal it could not confirm. Commands
// the local level allows — nearly all — cost nothing more.
func (n *Node) checkFresh(ctx context.Context, cmd *fsm.Command) error {
	err := checkCommand(cmd, n.cfg.Now(), n.cat.ClusterLevel())
	if err == nil || !errors.Is(err, fsm.ErrClusterLevelTooLow) || n.cat.ClusterLevel() >= n.cat.BuildLevel() {
		return err
	}
	if berr := n.linearizableBarrier(ctx); berr != nil {
		return fmt.Errorf("%w: cannot confirm the cluster's catalog level: %v", ErrUnavailable, berr)
	}
	return checkCommand(cmd, n.cfg.Now(), n.cat.ClusterLevel())
}

// checkCommand refuses what must never reach the log: versions this build
// does not know and missing request IDs are filled or refused here, and a
// command above the cluster's catalog level (the node's applied view of
// it, level; it only rises, so a refusal here can at worst come a moment
// after the leader raised it — checkFresh confirms such a refusal; the FSM
// refuses it anyway, but outside the log a replica of a build without
// levels never sees it). The rest (types, bodies) is the FSM's to judge.
func checkCommand(cmd *fsm.Command, now time.Time, level int64) error {
	if cmd.Version == 0 {
		cmd.Version = fsm.CommandVersion
	}
	if cmd.Version < 0 || cmd.Version > fsm.CommandVersion {
		return &fsm.Error{Code: fsm.CodeUnsupportedVersion,
			Message: fmt.Sprintf("command version %d is not supported (this node speaks up to %d)", cmd.Version, fsm.CommandVersion)}
	}
	if cmd.Type == "" {
		return &fsm.Error{Code: fsm.CodeInvalid, Message: "command type missing"}
	}
	if err := fsm.CheckLevel(cmd.Type, level); err != nil {
		return fsm.ToError(err)
	}
	if cmd.Type == fsm.CmdSetClusterLevel {
		// Only the leader's level check proposes it, locally (level.go):
		// from anyone else (any caller without TLS) it could raise the
		// level past a server of a build from before levels, which would
		// answer it unknown_command while the others write the row.
		return &fsm.Error{Code: fsm.CodeInvalid, Message: "set_cluster_level is proposed only by the catalog leader's own level check"}
	}
	if cmd.RequestID == "" {
		cmd.RequestID = ids.New()
	}
	if len(cmd.RequestID) > 128 {
		return &fsm.Error{Code: fsm.CodeInvalid, Message: "request id longer than 128 bytes"}
	}
	if cmd.Time == 0 {
		cmd.Time = now.UnixNano()
	}
	return nil
}

// Apply proposes cmd to the catalog from any node and returns once it is
// committed and applied on the leader. A follower forwards it to the leader
// over the HTTP API, following leader changes with bounded retries. Retries
// reuse cmd.RequestID, so the FSM applies the command at most once.
//
// A catalog refusal is returned as a *fsm.Error (errors.Is against fsm's
// sentinels); no leader within the retry budget is ErrUnavailable.
func (n *Node) Apply(ctx context.Context, cmd fsm.Command) (fsm.Result, error) {
	if err := n.checkFresh(ctx, &cmd); err != nil {
		return fsm.Result{}, err
	}
	var lastErr error
	for attempt := 0; attempt < forwardAttempts; attempt++ {
		if attempt > 0 {
			if err := sleepCtx(ctx, backoff(attempt-1)); err != nil {
				return fsm.Result{}, fmt.Errorf("%w: %v (last error: %v)", ErrUnavailable, err, lastErr)
			}
		}
		if n.ctx.Err() != nil {
			return fsm.Result{}, ErrClosed
		}
		var res fsm.Result
		var err error
		if n.raft.State() == raft.Leader {
			res, err = n.applyLocal(ctx, cmd)
		} else {
			res, err = n.forwardApply(ctx, cmd)
		}
		if err == nil || !retryable(err) {
			return res, err
		}
		lastErr = err
	}
	return fsm.Result{}, fmt.Errorf("%w: no leader accepted the command after %d attempts: %v", ErrUnavailable, forwardAttempts, lastErr)
}

// retryable reports whether a write may be retried elsewhere with the same
// request ID: the leader moved, was unknown, or could not be reached.
func retryable(err error) bool {
	var fe *fsm.Error
	if errors.As(err, &fe) {
		return false
	}
	return errors.Is(err, ErrNotLeader) || errors.Is(err, ErrUnavailable) ||
		errors.Is(err, raft.ErrNotLeader) || errors.Is(err, raft.ErrLeadershipLost) ||
		errors.Is(err, raft.ErrLeadershipTransferInProgress) || errors.Is(err, raft.ErrEnqueueTimeout) ||
		errors.Is(err, raft.ErrAbortedByRestore) || errors.Is(err, errTransport)
}

var errTransport = errors.New("transport error")

// applyLocal proposes on this node, which must be the leader.
func (n *Node) applyLocal(ctx context.Context, cmd fsm.Command) (fsm.Result, error) {
	f, start, err := n.propose(ctx, cmd)
	if err != nil {
		return fsm.Result{}, err
	}
	return n.await(f, start)
}

// propose hands cmd to Raft on this node (the leader) without waiting: the
// proposals of a batch (ApplyBatch) all wait in Raft's apply channel
// together, so they share one AppendEntries, one fsync and one FSM
// transaction.
func (n *Node) propose(ctx context.Context, cmd fsm.Command) (raft.ApplyFuture, time.Time, error) {
	data, err := marshalCommand(cmd)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("encode command: %w", err)
	}
	timeout := n.cfg.ApplyTimeout
	if dl, ok := ctx.Deadline(); ok {
		if d := time.Until(dl); d < timeout {
			timeout = d
		}
	}
	return n.raft.Apply(data, timeout), time.Now(), nil
}

// await waits for a proposal and returns its FSM result (a refusal as the
// error too).
func (n *Node) await(f raft.ApplyFuture, start time.Time) (fsm.Result, error) {
	return n.outcome(f, n.awaitFuture(f), start)
}

// outcome is the result of a finished proposal f whose Error() was err.
func (n *Node) outcome(f raft.ApplyFuture, err error, start time.Time) (fsm.Result, error) {
	if err != nil {
		if errors.Is(err, raft.ErrRaftShutdown) {
			return fsm.Result{}, fmt.Errorf("%w: %v", ErrUnavailable, err)
		}
		return fsm.Result{}, err
	}
	n.metrics.applyLatency.Observe(time.Since(start).Seconds())
	var res fsm.Result
	switch r := f.Response().(type) {
	case fsm.Result:
		res = r
	case *fsm.Result:
		if r != nil {
			res = *r
		}
	case error:
		return fsm.Result{}, r
	default:
		return fsm.Result{}, fmt.Errorf("unexpected fsm response %T", r)
	}
	if res.Index == 0 {
		res.Index = f.Index()
	}
	if res.Err != nil {
		return res, res.Err
	}
	return res, nil
}

// forwardApply sends cmd to the leader's /v1/apply. The leader does not
// forward again (one hop): if it lost leadership it answers not_leader and
// this node retries.
func (n *Node) forwardApply(ctx context.Context, cmd fsm.Command) (fsm.Result, error) {
	l, ok := n.leader()
	if !ok || l.HTTPAddr == "" {
		n.metrics.forwarded.WithLabelValues("apply", "no_leader").Inc()
		return fsm.Result{}, fmt.Errorf("%w: no leader known", ErrUnavailable)
	}
	body, err := json.Marshal(cmd)
	if err != nil {
		return fsm.Result{}, err
	}
	var out ApplyResponse
	if err := n.forward(ctx, http.MethodPost, l, "/v1/apply", bytes.NewReader(body), &out); err != nil {
		n.metrics.forwarded.WithLabelValues("apply", "error").Inc()
		return fsm.Result{}, err
	}
	n.metrics.forwarded.WithLabelValues("apply", "ok").Inc()
	return out.Result, nil
}

// forward performs one internal request to the leader l and decodes the
// answer into out, mapping error answers back to Go errors.
func (n *Node) forward(ctx context.Context, method string, l nodeMeta, path string, body io.Reader, out any) error {
	req, err := http.NewRequestWithContext(ctx, method, n.cfg.TLS.Scheme()+"://"+l.HTTPAddr+path, body)
	if err != nil {
		return err
	}
	req.Header.Set(headerForwarded, n.cfg.ID)
	req.Header.Set("Content-Type", "application/json")
	resp, err := n.hc.Do(req)
	if err != nil {
		n.forgetPeer(l.RaftAddr)
		return fmt.Errorf("%w: %w: %v", ErrUnavailable, errTransport, err)
	}
	defer resp.Body.Close()
	return decodeAnswer(resp, out)
}

// decodeAnswer reads a JSON answer: 2xx into out, otherwise a wireError.
func decodeAnswer(resp *http.Response, out any) error {
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("%w: %w: read answer: %v", ErrUnavailable, errTransport, err)
	}
	if resp.StatusCode/100 == 2 {
		if out == nil {
			return nil
		}
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("decode answer: %w", err)
		}
		return nil
	}
	var w struct {
		Error wireError `json:"error"`
	}
	if err := json.Unmarshal(data, &w); err != nil || w.Error.Code == "" {
		return fmt.Errorf("%w: %w: HTTP %d: %.200s", ErrUnavailable, errTransport, resp.StatusCode, data)
	}
	return fromWire(w.Error)
}

// awaitFuture waits for f, or for the node to close. hashicorp/raft answers
// a future still queued for the leader loop when Raft shuts down with
// nothing at all (the loop that would take it is gone), so a caller
// waiting on Error() alone could wait forever — and Close, which waits for
// its background loops and in-flight handlers, with it (seen: Close stuck
// behind the audit prune's apply). After close the outcome is unknown; the
// command carries its request ID, so a retry elsewhere is deduplicated.
// The goroutine left waiting on such a future ends with the process.
func (n *Node) awaitFuture(f raft.ApplyFuture) error {
	done := make(chan error, 1)
	go func() { done <- f.Error() }()
	select {
	case err := <-done:
		return err
	case <-n.ctx.Done():
		select {
		case err := <-done:
			return err
		default:
			return fmt.Errorf("%w: node closing", raft.ErrRaftShutdown)
		}
	}
}
