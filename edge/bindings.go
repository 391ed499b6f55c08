package edge

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/gorilla/mux"

	"github.com/shoaldb/shoal/internal/binding"
	v4 "github.com/shoaldb/shoal/internal/v4"
)

// Binding tokens (internal/binding): minted here for one database of the
// caller's account, sealed so their holder cannot read or change them, and
// revocable three ways (docs/security.md, "Binding tokens"):
//
//   - one token: DELETE …/{database_id}/binding/{token_id}
//   - every token of a database: DELETE …/{database_id}/binding
//   - every token minted with an API token: revoke that API token.
//
// The first two are recorded by the database's object host in the object's
// own metadata (objecthost/bindings.go) before the API answers, so they are
// in force from that answer on, everywhere: the host checks every bound
// query. The third is checked by the edge that serves the bound query,
// through its token cache (authenticator.parentValid): within TokenTTL
// (10 s) while the catalog is reachable.

// bindingError is a refused binding token: 401/10000 with a message that
// says why, without the token's contents.
type bindingError struct{ msg string }

func (e *bindingError) Error() string { return e.msg }

var errBindingRouteChanged = errors.New("the database's route changed since the binding token was minted")

// bindingRefusal turns why a binding token was refused into the answer.
func bindingRefusal(err error) error {
	switch {
	case errors.Is(err, binding.ErrExpired):
		return &bindingError{"Authentication error: binding token expired; mint a new one"}
	case errors.Is(err, errBindingParentRevoked):
		return &bindingError{"Authentication error: binding token revoked (the API token that minted it was revoked)"}
	case errors.Is(err, errBindingRouteChanged):
		return &bindingError{"Authentication error: binding token no longer valid for this database (its route changed); mint a new one"}
	case errors.Is(err, ErrUnavailable):
		return err
	}
	return &bindingError{"Authentication error: invalid binding token"}
}

// mintBody is the optional body of POST /{id}/binding.
type mintBody struct {
	TTLSeconds int64 `json:"ttl_seconds,omitempty"`
}

type mintResult struct {
	Token        string `json:"token"`
	TokenID      string `json:"token_id"`
	DatabaseUUID string `json:"database_uuid"`
	ExpiresAt    string `json:"expires_at"`
}

// bindingState is the object host's answer to GET …/bindings.
type bindingState struct {
	Epoch   int64 `json:"epoch"`
	Revoked int   `json:"revoked"`
}

// bindingTTL is the token lifetime asked for: ttl_seconds, default
// BindingDefaultTTL, at most BindingMaxTTL (longer asks are shortened to
// it). Compared in seconds: ttl_seconds is a client's int64 and must not
// overflow a Duration.
func (s *Server) bindingTTL(sec int64) (time.Duration, error) {
	if sec < 0 {
		return 0, invalid("Invalid property: ttl_seconds => must be positive")
	}
	if sec == 0 {
		return s.o.BindingDefaultTTL, nil
	}
	if maxSec := int64(s.o.BindingMaxTTL / time.Second); sec > maxSec {
		return s.o.BindingMaxTTL, nil
	}
	return time.Duration(sec) * time.Second, nil
}

// handleMintBinding seals a binding token for one database of the caller's
// account. The route is read fresh from the catalog (not the cache): a token
// outlives cache entries, so it should carry the newest route known; the
// database's binding epoch is read from its object host, which refuses
// tokens below it.
func (s *Server) handleMintBinding(w http.ResponseWriter, r *http.Request, p principal) {
	if s.o.BindingKeys == nil {
		v4.WriteError(w, http.StatusNotImplemented, v4.CodeInvalidRequest, "binding tokens are not enabled on this edge")
		return
	}
	acct, id, err := s.databaseRequest(r)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	b, err := readBody(r.Body, 4096)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	var mb mintBody
	if len(strings.TrimSpace(string(b))) > 0 {
		if err := decodeStrict(b, &mb); err != nil {
			s.writeErr(w, r, err)
			return
		}
	}
	ttl, err := s.bindingTTL(mb.TTLSeconds)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	rt, err := s.res.fill(r.Context(), id)
	if err == nil {
		err = usable(rt, acct)
	}
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	var st bindingState
	if err := s.hosts.call(r.Context(), rt.HostAddress, http.MethodGet, "/v1/objects/"+rt.ObjectID+"/bindings", &rt, nil, &st); err != nil {
		var he *HostError
		if !errors.As(err, &he) {
			err = fmt.Errorf("%w: object host unreachable: %w", ErrUnavailable, err)
		}
		s.writeErr(w, r, hostControlErr(err))
		return
	}
	now := s.o.Now()
	exp := now.Add(ttl)
	tokenID := binding.NewTokenID()
	tok, err := s.o.BindingKeys.Sign(binding.Claims{
		DatabaseUUID: rt.DatabaseUUID, ObjectID: rt.ObjectID, AccountID: rt.AccountID, HostAddress: rt.HostAddress,
		Generation: rt.Generation, IssuedAt: now.Unix(), ExpiresAt: exp.Unix(),
		TokenID: tokenID, Epoch: st.Epoch, Parent: p.tokenHash,
	})
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	v4.WriteResult(w, mintResult{Token: tok, TokenID: tokenID, DatabaseUUID: rt.DatabaseUUID, ExpiresAt: exp.UTC().Format(time.RFC3339)})
}

// revokeResult answers a revocation.
type revokeResult struct {
	DatabaseUUID string `json:"database_uuid"`
	TokenID      string `json:"token_id,omitempty"` // the one token revoked
	All          bool   `json:"all"`                // every token minted so far
}

// handleRevokeBindings serves DELETE …/{database_id}/binding (every binding
// token of the database) and DELETE …/{database_id}/binding/{token_id} (one).
// The object host records the revocation durably before it answers; this
// answer follows it, so a 200 means the revocation is in force. A host that
// cannot be reached is 503: nothing was revoked, retry.
func (s *Server) handleRevokeBindings(w http.ResponseWriter, r *http.Request, _ principal) {
	acct, id, err := s.databaseRequest(r)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	tokenID, one := mux.Vars(r)["token_id"]
	body := map[string]any{"all": true}
	if one {
		if !binding.ValidTokenID(tokenID) {
			s.writeErr(w, r, invalid("Invalid property: token_id => must be the token_id a mint answered (32 hex characters)"))
			return
		}
		// Refused until the latest it could expire: minted now at the
		// longest TTL.
		body = map[string]any{"token_id": tokenID, "until": s.o.Now().Add(s.o.BindingMaxTTL).Unix() + 1}
	}
	if err := s.hostCall(r.Context(), acct, id, viaCatalog, http.MethodPost, "/bindings/revoke", body, nil); err != nil {
		s.writeErr(w, r, hostControlErr(err))
		return
	}
	res := revokeResult{DatabaseUUID: id, All: !one}
	if one {
		res.TokenID = tokenID
	}
	v4.WriteResult(w, res)
}

// hostControlErr maps an object host's refusal of a control call: the
// object refusing the route means the database is gone for this account;
// anything else the host said passes as is (writeErr).
func hostControlErr(err error) error {
	var he *HostError
	if errors.As(err, &he) {
		switch he.Status {
		case http.StatusMisdirectedRequest, http.StatusGone, http.StatusNotFound:
			return ErrDatabaseNotFound
		}
	}
	return err
}
