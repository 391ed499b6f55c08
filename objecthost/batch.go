package objecthost

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sync"

	"github.com/gorilla/mux"

	v4 "github.com/shoaldb/shoal/internal/v4"
	"github.com/shoaldb/shoal/pipeline/event"
)

// Batched lifecycle calls (POST /v1/batch/init, /v1/batch/confirm; the
// types and rules are pipeline/event's): an edge coalesces the inits and
// confirms of concurrent creates placed on this host into one request
// each. Every item runs exactly the code its own call would (Init,
// Confirm, with the same identity check), concurrently, so the inits of a
// batch meet in one index commit (the committer's group commit): one
// fsync for the batch instead of one per create, and one HTTP request
// instead of one per create. Each init's checkpoint is still its index
// commit, and an item's answer is given only after it: a batch answered
// is a batch of durable inits (or of refusals, item by item).
//
// The same two routes are served on the edge's frame connection
// (frames.go) when it was upgraded to this version: the same handlers,
// bodies and answers, without an HTTP exchange of their own.

// The batched lifecycle routes.
const (
	batchInitPath    = "/v1/batch/init"
	batchConfirmPath = "/v1/batch/confirm"
)

func (h *Host) batchRoutes(r *mux.Router) {
	r.HandleFunc(batchInitPath, h.handleInitBatch).Methods(http.MethodPost)
	r.HandleFunc(batchConfirmPath, h.handleConfirmBatch).Methods(http.MethodPost)
}

func (h *Host) handleInitBatch(w http.ResponseWriter, r *http.Request) {
	var req event.InitBatchRequest
	if !h.decodeBatch(w, r, &req) {
		return
	}
	if !batchSizeOK(w, len(req.Inits)) {
		return
	}
	items := make([]event.BatchItemAnswer, len(req.Inits))
	var wg sync.WaitGroup
	for i, it := range req.Inits {
		if it.Init.RestoreFrom != nil {
			items[i] = h.itemError(fmt.Errorf("%w: an init restoring from the archive cannot be batched", ErrInvalid))
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := h.Init(r.Context(), it.ObjectID, it.Init)
			items[i] = h.itemAnswer(err)
		}()
	}
	wg.Wait()
	v4.WriteResult(w, event.BatchAnswer{Items: items})
}

func (h *Host) handleConfirmBatch(w http.ResponseWriter, r *http.Request) {
	var req event.ConfirmBatchRequest
	if !h.decodeBatch(w, r, &req) {
		return
	}
	if !batchSizeOK(w, len(req.Confirms)) {
		return
	}
	items := make([]event.BatchItemAnswer, len(req.Confirms))
	var wg sync.WaitGroup
	for i, it := range req.Confirms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := h.checkObjectIdentity(it.ObjectID, it.DatabaseUUID, it.AccountID); err != nil {
				items[i] = h.itemError(err)
				return
			}
			_, err := h.Confirm(r.Context(), it.ObjectID, it.RoutingGeneration)
			items[i] = h.itemAnswer(err)
		}()
	}
	wg.Wait()
	v4.WriteResult(w, event.BatchAnswer{Items: items})
}

func (h *Host) decodeBatch(w http.ResponseWriter, r *http.Request, v any) bool {
	b, err := h.readBody(w, r)
	if err == nil {
		if err = json.Unmarshal(b, v); err != nil {
			err = fmt.Errorf("%w: %v", ErrInvalid, err)
		}
	}
	if err != nil {
		writeErr(w, err)
		return false
	}
	return true
}

func batchSizeOK(w http.ResponseWriter, n int) bool {
	if n < 1 || n > event.MaxHostBatch {
		writeErr(w, fmt.Errorf("%w: a batch holds 1 to %d items, not %d", ErrInvalid, event.MaxHostBatch, n))
		return false
	}
	return true
}

// checkObjectIdentity is checkIdentity for a batch item: the named database
// and account, when given, must be the object's.
func (h *Host) checkObjectIdentity(id, db, acct string) error {
	if db == "" && acct == "" {
		return nil
	}
	_, m, err := h.lookup(id)
	if err != nil {
		return err
	}
	if (db != "" && db != m.DatabaseUUID) || (acct != "" && acct != m.AccountID) {
		return ErrWrongHost
	}
	return nil
}

func (h *Host) itemAnswer(err error) event.BatchItemAnswer {
	if err != nil {
		return h.itemError(err)
	}
	return event.BatchItemAnswer{}
}

// itemError is the answer the single call would have given, as an item. A
// 5xx is logged here with its reason, as apiHandler logs a single call's.
func (h *Host) itemError(err error) event.BatchItemAnswer {
	status, code, msg := statusOf(err)
	if status >= 500 {
		h.log.Error("batched lifecycle call failed", "status", status, "err", err)
	}
	return event.BatchItemAnswer{Error: &event.BatchItemError{Status: status, Code: code, Message: msg}}
}
