package objecthost

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/gorilla/mux"

	"github.com/shoaldb/shoal/internal/binding"
	v4 "github.com/shoaldb/shoal/internal/v4"
)

// Binding-token revocation lives in the object's own metadata, like its
// state and routing generation: the object host is the authority on its
// objects, so a revocation needs no catalog on the query path and takes
// effect the moment it is stored (docs/security.md, "Binding tokens").
//
//   - Revoke all of a database's tokens: BindingEpoch goes up by one; every
//     token minted at a lower epoch is refused. The edge reads the epoch
//     when it mints (BindingState), so a token minted concurrently with a
//     revocation is minted at the old epoch and refused too: the race only
//     ever errs towards refusing.
//   - Revoke one token: its ID joins RevokedBindings until the latest time
//     it could expire (the edge passes now + its longest binding TTL);
//     entries past that are dropped at the next revocation. At most
//     MaxRevokedBindings per database: beyond, revoke them all.
//
// Checkpoint: the index commit (fsynced) of the new metadata; the API
// answers only after it, so an acknowledged revocation survives a crash. A
// database that moves to another object (restore, recovery) gets a new
// object ID and generation, which every existing token fails anyway.

// MaxRevokedBindings bounds the individually revoked tokens kept per
// database.
const MaxRevokedBindings = 1000

// ErrBindingRevoked refuses a binding token revoked on its object: 401/10000.
var ErrBindingRevoked = errors.New("binding token revoked")

// errTooManyRevoked: the per-token list is full.
var errTooManyRevoked = fmt.Errorf("%w: more than %d binding tokens of this database are revoked individually; revoke all of its binding tokens instead", ErrInvalid, MaxRevokedBindings)

// BindingState is what the edge needs to mint a token: the object's binding
// epoch, and how many tokens are revoked individually.
type BindingState struct {
	Epoch   int64 `json:"epoch"`
	Revoked int   `json:"revoked"`
}

// BindingRevocation is the body of POST /v1/objects/{id}/bindings/revoke:
// All, or one TokenID refused until Until (Unix seconds).
type BindingRevocation struct {
	All     bool   `json:"all,omitempty"`
	TokenID string `json:"token_id,omitempty"`
	Until   int64  `json:"until,omitempty"`
}

// checkBinding refuses claims that the object's metadata revoked.
func checkBinding(m *Meta, c binding.Claims) error {
	if c.Epoch < m.BindingEpoch {
		return ErrBindingRevoked
	}
	if len(m.RevokedBindings) > 0 {
		if _, found := slices.BinarySearchFunc(m.RevokedBindings, c.TokenID, func(r RevokedBinding, id string) int {
			return strings.Compare(r.ID, id)
		}); found {
			return ErrBindingRevoked
		}
	}
	return nil
}

// BindingState returns the object's binding state; the identity must match.
func (h *Host) BindingState(objectID string, id Identity) (BindingState, error) {
	_, m, err := h.lookup(objectID)
	if err != nil {
		return BindingState{}, err
	}
	if m.DatabaseUUID != id.DatabaseUUID || m.AccountID != id.AccountID {
		return BindingState{}, ErrWrongHost
	}
	if m.deleted() {
		return BindingState{}, ErrDeleted
	}
	return BindingState{Epoch: m.BindingEpoch, Revoked: len(m.RevokedBindings)}, nil
}

// RevokeBindings records a revocation durably (checkpoint: the index
// commit) and returns the new state. It is idempotent: revoking a token
// twice keeps one entry (with the later Until); every All raises the epoch.
func (h *Host) RevokeBindings(ctx context.Context, objectID string, id Identity, rev BindingRevocation) (BindingState, error) {
	if !rev.All && !binding.ValidTokenID(rev.TokenID) {
		return BindingState{}, fmt.Errorf("%w: token_id must be a binding token ID (32 hex characters)", ErrInvalid)
	}
	o, _, err := h.lookup(objectID)
	if err != nil {
		return BindingState{}, err
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	m := o.meta.Load()
	if o.gone || m == nil {
		return BindingState{}, ErrNotFound
	}
	if m.DatabaseUUID != id.DatabaseUUID || m.AccountID != id.AccountID {
		return BindingState{}, ErrWrongHost
	}
	if m.deleted() {
		return BindingState{}, ErrDeleted
	}
	n := *m
	now := h.now().Unix()
	// Drop entries whose tokens have expired by now.
	kept := make([]RevokedBinding, 0, len(m.RevokedBindings)+1)
	for _, r := range m.RevokedBindings {
		if r.Until > now {
			kept = append(kept, r)
		}
	}
	if rev.All {
		n.BindingEpoch++
		kept = nil // every listed token is below the new epoch
	} else {
		i, found := slices.BinarySearchFunc(kept, rev.TokenID, func(r RevokedBinding, id string) int { return strings.Compare(r.ID, id) })
		switch {
		case found:
			kept[i].Until = max(kept[i].Until, rev.Until)
		case len(kept) >= MaxRevokedBindings:
			return BindingState{}, errTooManyRevoked
		default:
			kept = slices.Insert(kept, i, RevokedBinding{ID: rev.TokenID, Until: max(rev.Until, now+1)})
		}
	}
	if len(kept) == 0 {
		kept = nil
	}
	n.RevokedBindings = kept
	if err := h.ix.put(&n); err != nil {
		return BindingState{}, err
	}
	h.setMeta(o, &n)
	what := "token " + rev.TokenID
	if rev.All {
		what = fmt.Sprintf("all (epoch %d)", n.BindingEpoch)
	}
	h.log.Info("binding tokens revoked", "database", n.DatabaseUUID, "account", n.AccountID, "object", n.ObjectID, "revoked", what)
	return BindingState{Epoch: n.BindingEpoch, Revoked: len(n.RevokedBindings)}, nil
}

// bindingRoutes registers GET /v1/objects/{id}/bindings and POST
// /v1/objects/{id}/bindings/revoke (identity headers required).
func (h *Host) bindingRoutes(r *mux.Router) {
	r.HandleFunc("/v1/objects/{id}/bindings", func(w http.ResponseWriter, r *http.Request) {
		st, err := h.BindingState(mux.Vars(r)["id"], identityOf(r))
		if err != nil {
			writeErr(w, err)
			return
		}
		v4.WriteResult(w, st)
	}).Methods(http.MethodGet)
	r.HandleFunc("/v1/objects/{id}/bindings/revoke", func(w http.ResponseWriter, r *http.Request) {
		b, err := h.readBody(w, r)
		if err != nil {
			writeErr(w, err)
			return
		}
		var rev BindingRevocation
		if err := json.Unmarshal(b, &rev); err != nil {
			writeErr(w, fmt.Errorf("%w: body must be {\"all\": true} or {\"token_id\": …, \"until\": …}", ErrInvalid))
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
		defer cancel()
		st, err := h.RevokeBindings(ctx, mux.Vars(r)["id"], identityOf(r), rev)
		if err != nil {
			writeErr(w, err)
			return
		}
		v4.WriteResult(w, st)
	}).Methods(http.MethodPost)
}

func identityOf(r *http.Request) Identity {
	return Identity{DatabaseUUID: r.Header.Get(HeaderDatabase), AccountID: r.Header.Get(HeaderAccount)}
}
