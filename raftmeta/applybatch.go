package raftmeta

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// Batched writes: POST /v1/apply-batch carries up to MaxApplyBatch
// independent commands in one request. Each keeps its own request ID and
// its own result, exactly as if it had come through /v1/apply. What the
// batch saves is the transport: one HTTP request, one TLS record stream and
// one handler per batch instead of per command (the edge coalesces
// concurrent creates into one, edge/createbatch.go). In the log, from
// catalog level 3 (fsm.LevelBatchEntry: every server's build knows it) the
// leader proposes the batch as one entry carrying its commands
// (fsm.AppendBatchEntry), which every replica applies as those commands
// one by one — one entry to encode, store, replicate and decode instead of
// N; below level 3, as N entries proposed together, so they share one
// AppendEntries, one fsync per replica and one FSM transaction and the log
// holds nothing a node of an older build cannot apply.
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
		if err := n.checkFresh(ctx, &cmds[i]); err != nil {
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

// applyLocalBatch proposes the commands as one batch entry once the
// cluster's catalog level allows it (fsm.LevelBatchEntry), else each as its
// own entry, every one proposed before waiting for any.
func (n *Node) applyLocalBatch(ctx context.Context, cmds []fsm.Command) ([]fsm.Result, []error) {
	if len(cmds) > 1 && n.cat.ClusterLevel() >= fsm.LevelBatchEntry && !n.noBatchEntries.Load() {
		if res, errs, ok := n.applyBatchEntry(ctx, cmds); ok {
			return res, errs
		}
	}
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
	// One goroutine waits for them all, in order (awaitFuture's reason
	// for a goroutine, a future Raft never answers after shutdown, holds
	// here too), instead of one per command: waited counts the futures
	// known to be finished.
	var waited atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for _, f := range futures {
			if f != nil {
				_ = f.Error()
			}
			waited.Add(1)
		}
	}()
	finished := len(futures)
	select {
	case <-done:
	case <-n.ctx.Done():
		select {
		case <-done:
		default:
			finished = int(waited.Load())
		}
	}
	for i, f := range futures {
		switch {
		case f == nil:
		case i < finished:
			res[i], errs[i] = n.outcome(f, f.Error(), starts[i])
		default: // the node is closing: outcome unknown, retried elsewhere with its request ID
			res[i], errs[i] = n.outcome(f, fmt.Errorf("%w: node closing", raft.ErrRaftShutdown), starts[i])
		}
	}
	return res, errs
}

// applyBatchEntry proposes cmds as one log entry (fsm.AppendBatchEntry)
// and returns each command's outcome as applyLocal would return it for the
// command as its own entry, every Result carrying the batch entry's index.
// The entry is atomic in the log: every command applies or none does, so
// an unknown outcome (leader lost, node closing) is every command's, and
// each is retried with its request ID as before.
//
// The level was read from this node's applied catalog, so every replica
// applies the entry that raised it before this one; the only way the FSM
// still refuses the entry as a whole is a catalog restored from a backup of
// a lower level between the check and the commit. Nothing was applied then,
// and ok=false tells the caller to propose the commands one by one.
func (n *Node) applyBatchEntry(ctx context.Context, cmds []fsm.Command) (res []fsm.Result, errs []error, ok bool) {
	res = make([]fsm.Result, len(cmds))
	errs = make([]error, len(cmds))
	// all gives every command the entry's outcome (it is atomic).
	all := func(err error) ([]fsm.Result, []error, bool) {
		for i := range errs {
			errs[i] = err
		}
		return res, errs, true
	}
	enc := make([][]byte, len(cmds))
	for i := range cmds {
		b, err := marshalCommand(cmds[i])
		if err != nil {
			return all(fmt.Errorf("encode command: %w", err))
		}
		enc[i] = b
	}
	timeout := n.cfg.ApplyTimeout
	if dl, ok := ctx.Deadline(); ok {
		if d := time.Until(dl); d < timeout {
			timeout = d
		}
	}
	start := time.Now()
	f := n.raft.Apply(fsm.AppendBatchEntry(nil, enc), timeout)
	if err := n.awaitFuture(f); err != nil {
		_, err = n.outcome(f, err, start)
		return all(err)
	}
	switch r := f.Response().(type) {
	case fsm.BatchResults:
		if len(r) != len(cmds) {
			return all(fmt.Errorf("batch entry answered %d results for %d commands", len(r), len(cmds)))
		}
		d := time.Since(start).Seconds()
		for i := range r {
			n.metrics.applyLatency.Observe(d)
			res[i] = r[i]
			if res[i].Index == 0 {
				res[i].Index = f.Index()
			}
			if res[i].Err != nil {
				errs[i] = res[i].Err
			}
		}
		return res, errs, true
	case fsm.Result:
		if r.Err != nil && r.Err.Code == fsm.CodeClusterLevelTooLow {
			n.log.Warn("batch entry refused by the catalog's level (restored from an older backup?); proposing its commands one by one", "err", r.Err)
			return nil, nil, false
		}
		return all(fmt.Errorf("batch entry refused as a whole: %v", r.Err))
	case error:
		return all(r)
	default:
		return all(fmt.Errorf("unexpected fsm response %T to a batch entry", r))
	}
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
		if err := n.checkFresh(r.Context(), &c); err != nil {
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
	writeBatchResponse(w, ApplyBatchResponse{Items: items, Node: n.cfg.ID})
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
	bodies := make([][]byte, len(cmds))
	for i := range cmds {
		c.fillCommand(&cmds[i])
		b, err := json.Marshal(cmds[i])
		if err != nil {
			errs := make([]error, len(cmds))
			for j := range errs {
				errs[j] = err
			}
			return make([]fsm.Result, len(cmds)), errs
		}
		bodies[i] = b
	}
	res, errs, unsupported := c.applyBodies(ctx, bodies)
	if unsupported {
		// A node of an older build: each command through /v1/apply, with
		// its own request ID and retries.
		var wg sync.WaitGroup
		for i := range bodies {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res[i], errs[i] = c.applySingle(ctx, bodies[i])
			}()
		}
		wg.Wait()
	}
	return res, errs
}

// batchBody is the /v1/apply-batch body of commands already encoded each
// (json.Marshal(fsm.Command)): byte for byte json.Marshal(ApplyBatchRequest)
// of them, without encoding them again.
func batchBody(bodies [][]byte, pending []int) []byte {
	n := len(`{"commands":[]}`)
	for _, i := range pending {
		n += len(bodies[i]) + 1
	}
	b := make([]byte, 0, n)
	b = append(b, `{"commands":[`...)
	for j, i := range pending {
		if j > 0 {
			b = append(b, ',')
		}
		b = append(b, bodies[i]...)
	}
	return append(b, `]}`...)
}

// applyBodies sends commands (each one's JSON, request ID, time and version
// filled) through /v1/apply-batch with the client's retries and returns each
// one's outcome. unsupported: the node answered that it has no such route
// (a build without it); nothing was applied by that answer and the caller
// sends the commands one by one.
func (c *Client) applyBodies(ctx context.Context, bodies [][]byte) (res []fsm.Result, errs []error, unsupported bool) {
	res = make([]fsm.Result, len(bodies))
	errs = make([]error, len(bodies))
	pending := make([]int, len(bodies))
	for i := range pending {
		pending[i] = i
	}
	var lastErr error
	var order []string
	for attempt := 0; attempt < c.attempts && len(pending) > 0; attempt++ {
		target := c.writeTarget(&order)
		var out ApplyBatchResponse
		resp, err := c.do(ctx, c.writeTO, http.MethodPost, target, "/v1/apply-batch", batchBody(bodies, pending), &out)
		c.noteLeader(resp)
		if err == nil && len(out.Items) != len(pending) {
			err = fmt.Errorf("%w: %w: %s answered %d items for %d commands", ErrUnavailable, errTransport, target, len(out.Items), len(pending))
		}
		if isBatchUnsupported(err) {
			if len(pending) != len(bodies) {
				// Some were answered by a node that has the route (the
				// leader moved to an older build mid-batch): the rest one
				// by one here.
				for _, i := range pending {
					res[i], errs[i] = c.applySingle(ctx, bodies[i])
				}
				return res, errs, false
			}
			return res, errs, true
		}
		if err != nil {
			retryNow, nodeErr := c.writeFailed(err, target)
			if !nodeErr {
				for _, i := range pending { // a refusal of the whole request
					errs[i] = err
				}
				return res, errs, false
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
	return res, errs, false
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

// appendResultJSON appends json.Marshal(r) for a Result without a refusal,
// written directly: encoding/json would re-scan and re-compact Value, which
// the FSM produced compact and escaped (by json.Marshal or its byte-identical
// encoders). ok=false: r carries a refusal; use json.Marshal.
func appendResultJSON(b []byte, r *fsm.Result) (_ []byte, ok bool) {
	if r.Err != nil {
		return b, false
	}
	b = append(b, `{"index":`...)
	b = strconv.AppendUint(b, r.Index, 10)
	if len(r.Value) > 0 {
		b = append(b, `,"value":`...)
		b = append(b, r.Value...)
	}
	return append(b, '}'), true
}

// encodeBatchResponse is writeJSON's encoding of resp (json.Marshal and a
// newline), with the applied results written by appendResultJSON: on a
// batch of creates the answer's encoding was a third of the batch
// handler's CPU on the leader. Items with a refusal or an error go through
// encoding/json. node must need no JSON escaping (a node ID; checked).
func encodeBatchResponse(resp ApplyBatchResponse) ([]byte, error) {
	if !plainJSONString(resp.Node) {
		b, err := json.Marshal(resp)
		return append(b, '\n'), err
	}
	size := 32 + len(resp.Node)
	for _, it := range resp.Items {
		if it.Result != nil {
			size += len(it.Result.Value) + 40
		}
	}
	b := make([]byte, 0, size)
	b = append(b, `{"items":[`...)
	for i := range resp.Items {
		if i > 0 {
			b = append(b, ',')
		}
		it := &resp.Items[i]
		if it.Result != nil && it.Error == nil {
			b = append(b, `{"result":`...)
			var ok bool
			if b, ok = appendResultJSON(b, it.Result); ok {
				b = append(b, '}')
				continue
			}
			b = b[:len(b)-len(`{"result":`)]
		}
		ib, err := json.Marshal(it)
		if err != nil {
			return nil, err
		}
		b = append(b, ib...)
	}
	b = append(b, `],"node":"`...)
	b = append(b, resp.Node...)
	return append(b, "\"}\n"...), nil
}

// plainJSONString reports whether s encodes in JSON as itself between
// quotes (printable ASCII without '"', '\\' and the HTML characters
// encoding/json escapes).
func plainJSONString(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return false
		}
	}
	return true
}

// writeBatchResponse writes resp as a 200 answer.
func writeBatchResponse(w http.ResponseWriter, resp ApplyBatchResponse) {
	b, err := encodeBatchResponse(resp)
	if err != nil {
		writeJSON(w, 200, resp) // what it did before: encoding/json's output
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(200)
	_, _ = w.Write(b)
}

// writeApplyResponse writes /v1/apply's answer, as writeJSON would, the
// result written by appendResultJSON when it carries no refusal.
func writeApplyResponse(w http.ResponseWriter, resp ApplyResponse) {
	if !plainJSONString(resp.Node) {
		writeJSON(w, 200, resp)
		return
	}
	b := make([]byte, 0, len(resp.Result.Value)+64)
	b = append(b, `{"result":`...)
	b, ok := appendResultJSON(b, &resp.Result)
	if !ok {
		writeJSON(w, 200, resp)
		return
	}
	b = append(b, `,"node":"`...)
	b = append(b, resp.Node...)
	b = append(b, "\"}\n"...)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(200)
	_, _ = w.Write(b)
}
