package objecthost

import (
	"fmt"
	"net/http"

	"github.com/gorilla/mux"

	v4 "github.com/shoaldb/shoal/internal/v4"
	"github.com/shoaldb/shoal/pipeline/event"
)

// LocatedObject is one object of a database on this host (Locate).
type LocatedObject = event.LocatedObject

// Locate returns this host's objects of database uuid that belong to
// account acct — active and deleted, confirmed or not — from the in-memory
// index, without opening any file. It is what an edge asks when it has no
// route and the catalog cannot be read (edge/hostroute.go): the host is the
// authority on its own objects, so its answer is as good as the route feed's.
// Another account's objects are left out, so the answer for them is the
// answer for an unknown database.
//
// Cost: a scan of the index under its read lock (the index is keyed by
// object ID); edges bound how many such lookups they send (a cap, one per
// database at a time) and only send them while the catalog is unavailable.
func (h *Host) Locate(uuid, acct string) []LocatedObject {
	var out []LocatedObject
	h.mu.RLock()
	defer h.mu.RUnlock()
	for _, o := range h.objects {
		m := o.meta.Load()
		if m == nil || m.DatabaseUUID != uuid || m.AccountID != acct {
			continue
		}
		out = append(out, LocatedObject{ObjectID: m.ObjectID, AccountID: m.AccountID, State: m.State,
			RoutingGeneration: m.RoutingGeneration, Confirmed: m.Confirmed})
	}
	return out
}

// handleLocate serves GET /v1/databases/{uuid}/objects: Locate for the
// account named by X-Shoal-Account (required). No object: 404, the same
// answer as an unknown database's, whichever account holds it. Like every
// per-object call it is for edges (and operators) under mutual TLS
// (peerAllowed).
func (h *Host) handleLocate(w http.ResponseWriter, r *http.Request) {
	uuid, acct := mux.Vars(r)["uuid"], r.Header.Get(HeaderAccount)
	switch {
	case !validUUID(uuid):
		writeErr(w, fmt.Errorf("%w: database id must be a canonical lowercase UUID", ErrInvalid))
		return
	case acct == "" || len(acct) > 64:
		writeErr(w, fmt.Errorf("%w: %s must name the account (1..64 bytes)", ErrInvalid, HeaderAccount))
		return
	}
	objs := h.Locate(uuid, acct)
	if len(objs) == 0 {
		writeErr(w, ErrNotFound)
		return
	}
	v4.WriteResult(w, event.LocateAnswer{Objects: objs})
}
