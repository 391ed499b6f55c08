package raftmeta

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// Batched writes: POST /v1/apply-batch carries up to MaxApplyBatch
// independent commands in one request. Each keeps its own request ID and
// becomes its own Raft entry with its own result, exactly as if it had come
// through /v1/apply: the log holds nothing a node of an older build cannot
// apply, so builds with and without this endpoint keep identical catalogs.
// What the batch saves is the transport: one HTTP request, one TLS record
// stream and one handler per batch instead of per command (the edge
// coalesces concurrent creates into one, edge/createbatch.go), and the
// proposals enter Raft's apply channel together, so they share one
// AppendEntries, one fsync per replica and one FSM transaction.
//
// Answers: 200 with one item per command, in order — a result (refusals
// included, as fsm.Result.Err) or an error (not leader, unavailable,
// forbidden for that command's type, invalid envelope). A request-level
// error (not leader for a forwarded batch, malformed body, too large)
// concerns every command. A node of a build without the endpoint answers
// 404 not_found, which callers take as "send them one by one".

// MaxApplyBatch bounds the commands of one /v1/apply-batch request (the
// body limit, 1 MiB, holds a batch of that many creates with room to spare).
const MaxApplyBatch = 256

// ApplyBatchRequest is the body of POST /v1/apply-batch.
type ApplyBatchRequest struct {
	Commands []fsm.Command `json:"commands"`
}

// ApplyBatchItem is one command's outcome: Result when it was applied or
// refused by the catalog (Result.Err), Error when it was not applied
// (and may be retried with the same request ID when retryable).
type ApplyBatchItem struct {
	Result *fsm.Result `json:"result,omitempty"`
	Error  *wireError  `json:"error,omitempty"`
}

// ApplyBatchResponse answers POST /v1/apply-batch: one item per command.
type ApplyBatchResponse struct {
	Items []ApplyBatchItem `json:"items"`
	Node  string           `json:"node"`
}

// errBatchUnsupported: the node answering runs a build without
// /v1/apply-batch.
var errBatchUnsupported = errors.New("apply-batch not supported by the node")

// ApplyBatch proposes independent commands together and returns each
// one's result and error (as Apply would for it alone: a refusal is a
// *fsm.Error and also in its Result.Err). Commands whose leader moved or
// was unreachable are retried, with their request IDs, like Apply's.
func (n *Node) ApplyBatch(ctx context.Context, cmds []fsm.Command) ([]fsm.Result, []error) {
	res := make([]fsm.Result, len(cmds))
	errs := make([]error, len(cmds))
	var pending []int
	for i := range cmds {
		if err := checkCommand(&cmds[i], n.cfg.Now()); err != nil {
			errs[i] = err
			continue
		}
		pending = append(pending, i)
	}
	var lastErr error
	for attempt := 0; attempt < forwardAttempts && len(pending) > 0; attempt++ {
		if attempt > 0 {
			if err := sleepCtx(ctx, backoff(attempt-1)); err != nil {
				lastErr = fmt.Errorf("%w: %v (last error: %v)", ErrUnavailable, err, lastErr)
				break
			}
		}
		if n.ctx.Err() != nil {
			lastErr = ErrClosed
			break
		}
		sub := make([]fsm.Command, len(pending))
		for j, i := range pending {
			sub[j] = cmds[i]
		}
		var r []fsm.Result
		var e []error
		if n.raft.State() == raft.Leader {
			r, e = n.applyLocalBatch(ctx, sub)
		} else {
			r, e = n.forwardApplyBatch(ctx, sub)
		}
		var next []int
		for j, i := range pending {
			res[i], errs[i] = r[j], e[j]
			if e[j] != nil && retryable(e[j]) {
				next = append(next, i)
				lastErr = e[j]
			}
		}
		pending = next
	}
	for _, i := range pending {
		if errors.Is(lastErr, ErrClosed) {
			errs[i] = ErrClosed
			continue
		}
		errs[i] = fmt.Errorf("%w: no leader accepted the command after %d attempts: %v", ErrUnavailable, forwardAttempts, lastErr)
	}
	return res, errs
}

// applyLocalBatch proposes every command before waiting for any.
func (n *Node) applyLocalBatch(ctx context.Context, cmds []fsm.Command) ([]fsm.Result, []error) {
	res := make([]fsm.Result, len(cmds))
	errs := make([]error, len(cmds))
	futures := make([]raft.ApplyFuture, len(cmds))
	starts := make([]time.Time, len(cmds))
	for i := range cmds {
		f, start, err := n.propose(ctx, cmds[i])
		if err != nil {
			errs[i] = err
			continue
		}
		futures[i], starts[i] = f, start
	}
	for i, f := range futures {
		if f != nil {
			res[i], errs[i] = n.await(f, starts[i])
		}
	}
	return res, errs
}

// forwardApplyBatch sends the batch to the leader's /v1/apply-batch, or,
// when the leader's build lacks it, each command to its /v1/apply.
func (n *Node) forwardApplyBatch(ctx context.Context, cmds []fsm.Command) ([]fsm.Result, []error) {
	res := make([]fsm.Result, len(cmds))
	errs := make([]error, len(cmds))
	l, ok := n.leader()
	if !ok || l.HTTPAddr == "" {
		n.metrics.forwarded.WithLabelValues("apply_batch", "no_leader").Inc()
		for i := range errs {
			errs[i] = fmt.Errorf("%w: no leader known", ErrUnavailable)
		}
		return res, errs
	}
	body, err := json.Marshal(ApplyBatchRequest{Commands: cmds})
	if err != nil {
		for i := range errs {
			errs[i] = err
		}
		return res, errs
	}
	var out ApplyBatchResponse
	err = n.forward(ctx, http.MethodPost, l, "/v1/apply-batch", bytes.NewReader(body), &out)
	if err == nil && len(out.Items) != len(cmds) {
		err = fmt.Errorf("%w: %w: leader answered %d items for %d commands", ErrUnavailable, errTransport, len(out.Items), len(cmds))
	}
	if isBatchUnsupported(err) {
		// A leader of an older build: one by one, concurrently (they still
		// meet in the leader's apply channel).
		n.metrics.forwarded.WithLabelValues("apply_batch", "unsupported").Inc()
		var wg sync.WaitGroup
		for i := range cmds {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res[i], errs[i] = n.forwardApply(ctx, cmds[i])
			}()
		}
		wg.Wait()
		return res, errs
	}
	if err != nil {
		n.metrics.forwarded.WithLabelValues("apply_batch", "error").Inc()
		for i := range errs {
			errs[i] = err
		}
		return res, errs
	}
	n.metrics.forwarded.WithLabelValues("apply_batch", "ok").Inc()
	for i, it := range out.Items {
		res[i], errs[i] = it.outcome()
	}
	return res, errs
}

// isBatchUnsupported reports a request-level 404 from /v1/apply-batch: the
// endpoint never answers not_found itself, so that is a build without it.
func isBatchUnsupported(err error) bool {
	var fe *fsm.Error
	return errors.Is(err, errBatchUnsupported) || (errors.As(err, &fe) && fe.Code == fsm.CodeNotFound)
}

// outcome is the item as Apply would have returned it.
func (it ApplyBatchItem) outcome() (fsm.Result, error) {
	switch {
	case it.Error != nil:
		return fsm.Result{}, fromWire(*it.Error)
	case it.Result == nil:
		return fsm.Result{}, fmt.Errorf("%w: %w: empty batch item", ErrUnavailable, errTransport)
	case it.Result.Err != nil:
		return *it.Result, it.Result.Err
	}
	return *it.Result, nil
}

func (n *Node) handleApplyBatch(w http.ResponseWriter, r *http.Request) {
	var req ApplyBatchRequest
	if err := decodeBody(w, r, &req); err != nil {
		n.writeErr(w, err)
		return
	}
	if len(req.Commands) == 0 || len(req.Commands) > MaxApplyBatch {
		n.writeErr(w, invalid("a batch holds 1 to %d commands, not %d", MaxApplyBatch, len(req.Commands)))
		return
	}
	if r.Header.Get(headerForwarded) != "" && n.raft.State() != raft.Leader {
		n.writeErr(w, n.notLeader()) // one hop only
		return
	}
	items := make([]ApplyBatchItem, len(req.Commands))
	var idx []int
	var cmds []fsm.Command
	for i := range req.Commands {
		c := req.Commands[i]
		if err := checkCommand(&c, n.cfg.Now()); err != nil {
			_, we := toWire(err)
			items[i].Error = &we
			continue
		}
		if !n.mayPropose(r, c.Type) {
			items[i].Error = &wireError{Code: CodeForbidden, Message: "the caller's certificate roles may not propose " + string(c.Type)}
			continue
		}
		idx = append(idx, i)
		cmds = append(cmds, c)
	}
	if len(cmds) > 0 {
		res, errs := n.ApplyBatch(r.Context(), cmds)
		for j, i := range idx {
			switch {
			case errs[j] == nil:
				items[i].Result = &res[j]
			case res[j].Err != nil: // a catalog refusal: the result carries it
				items[i].Result = &res[j]
			default:
				_, we := toWire(errs[j])
				if we.Code == CodeInternal {
					n.log.Error("internal error", "err", errs[j])
				}
				items[i].Error = &we
			}
		}
	}
	n.setLeaderHeaders(w)
	writeJSON(w, 200, ApplyBatchResponse{Items: items, Node: n.cfg.ID})
}

// ApplyBatch proposes independent commands in as few requests as possible
// (MaxApplyBatch each) and returns each one's result and error, as Apply
// would for it alone. Request IDs (filled when empty) are kept across
// retries, so a command retried after an unknown outcome applies at most
// once. Against a node of a build without /v1/apply-batch it sends them one
// by one, concurrently: the commands of a batch must be independent (the
// batch route proposes them in order, the fallback in no set order).
func (c *Client) ApplyBatch(ctx context.Context, cmds []fsm.Command) ([]fsm.Result, []error) {
	res := make([]fsm.Result, len(cmds))
	errs := make([]error, len(cmds))
	for start := 0; start < len(cmds); start += MaxApplyBatch {
		end := min(start+MaxApplyBatch, len(cmds))
		r, e := c.applyBatch(ctx, cmds[start:end])
		copy(res[start:end], r)
		copy(errs[start:end], e)
	}
	return res, errs
}

func (c *Client) applyBatch(ctx context.Context, cmds []fsm.Command) ([]fsm.Result, []error) {
	res := make([]fsm.Result, len(cmds))
	errs := make([]error, len(cmds))
	pending := make([]int, 0, len(cmds))
	for i := range cmds {
		if cmds[i].RequestID == "" {
			cmds[i].RequestID = c.newID()
		}
		if cmds[i].Time == 0 {
			cmds[i].Time = c.now().UnixNano()
		}
		if cmds[i].Version == 0 {
			cmds[i].Version = fsm.CommandVersion
		}
		pending = append(pending, i)
	}
	var lastErr error
	var order []string
	for attempt := 0; attempt < c.attempts && len(pending) > 0; attempt++ {
		target := c.writeTarget(&order)
		sub := make([]fsm.Command, len(pending))
		for j, i := range pending {
			sub[j] = cmds[i]
		}
		body, err := json.Marshal(ApplyBatchRequest{Commands: sub})
		if err != nil {
			for _, i := range pending {
				errs[i] = err
			}
			return res, errs
		}
		var out ApplyBatchResponse
		resp, err := c.do(ctx, c.writeTO, http.MethodPost, target, "/v1/apply-batch", body, &out)
		c.noteLeader(resp)
		if err == nil && len(out.Items) != len(sub) {
			err = fmt.Errorf("%w: %w: %s answered %d items for %d commands", ErrUnavailable, errTransport, target, len(out.Items), len(sub))
		}
		if isBatchUnsupported(err) {
			// A node of an older build: each command through /v1/apply,
			// with its own request ID and retries.
			var wg sync.WaitGroup
			for _, i := range pending {
				wg.Add(1)
				go func() {
					defer wg.Done()
					res[i], errs[i] = c.Apply(ctx, cmds[i])
				}()
			}
			wg.Wait()
			return res, errs
		}
		if err != nil {
			retryNow, nodeErr := c.writeFailed(err, target)
			if !nodeErr {
				for _, i := range pending { // a refusal of the whole request
					errs[i] = err
				}
				return res, errs
			}
			lastErr = err
			if retryNow {
				continue // follow the leader hint at once
			}
		} else {
			var next []int
			for j, i := range pending {
				r, e := out.Items[j].outcome()
				res[i], errs[i] = r, e
				if e != nil && isRetryableWrite(e) {
					next = append(next, i)
					lastErr = e
				}
			}
			pending = next
			if len(pending) == 0 {
				break
			}
		}
		if ctx.Err() != nil {
			break
		}
		if err := c.pause(ctx, attempt); err != nil {
			break
		}
	}
	for _, i := range pending {
		errs[i] = writeGaveUp(ctx, lastErr)
	}
	return res, errs
}

// isRetryableWrite is the client's rule for one command's error: the leader
// moved or the catalog could not answer (the outcome may be unknown; the
// same request ID makes a retry safe). Refusals are final.
func isRetryableWrite(err error) bool {
	var nl *NotLeaderError
	return errors.As(err, &nl) || errors.Is(err, ErrUnavailable)
}

// CreateDatabases records many databases in one request (the edge's
// coalesced creates): each is its own create_database command with its own
// request ID and outcome — a refusal of one (name taken, the account's
// limit, …) leaves the others unaffected. The i-th Database and error
// answer cmds[i].
//
// Every command carries the audit record of ctx (fsm.WithAudit), as
// CreateDatabase does; CreateDatabasesAs gives each its own.
func (c *Client) CreateDatabases(ctx context.Context, cmds []fsm.CreateDatabase) ([]fsm.Database, []error) {
	var audits []*fsm.Audit
	if a, ok := fsm.AuditFrom(ctx); ok {
		audits = make([]*fsm.Audit, len(cmds))
		for i := range audits {
			audits[i] = &a
		}
	}
	return c.CreateDatabasesAs(ctx, cmds, audits)
}

// CreateDatabasesAs is CreateDatabases with the audit record of each
// create (who asked, from where) given per command: the creates of one
// batch come from different requests. audits[i] (nil, or audits shorter
// than cmds: none) goes with cmds[i]; the audit of ctx is not used.
func (c *Client) CreateDatabasesAs(ctx context.Context, cmds []fsm.CreateDatabase, audits []*fsm.Audit) ([]fsm.Database, []error) {
	out := make([]fsm.Database, len(cmds))
	errs := make([]error, len(cmds))
	batch := make([]fsm.Command, 0, len(cmds))
	idx := make([]int, 0, len(cmds))
	now := c.now().UnixNano()
	for i, d := range cmds {
		cmd, err := fsm.NewCommand(fsm.CmdCreateDatabase, c.newID(), now, d)
		if err != nil {
			errs[i] = err
			continue
		}
		if i < len(audits) && audits[i] != nil {
			a := *audits[i]
			cmd.Audit = &a
		}
		batch = append(batch, cmd)
		idx = append(idx, i)
	}
	res, rerrs := c.ApplyBatch(ctx, batch)
	for j, i := range idx {
		errs[i] = rerrs[j]
		if errs[i] == nil && len(res[j].Value) > 0 {
			if err := json.Unmarshal(res[j].Value, &out[i]); err != nil {
				errs[i] = fmt.Errorf("decode %s result: %w", fsm.CmdCreateDatabase, err)
			}
		}
		c.invalidate(cmds[i].AccountID, cmds[i].UUID, cmds[i].Name)
	}
	return out, errs
}
