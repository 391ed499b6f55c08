package edge

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"net/http"
	"time"

	"github.com/gorilla/mux"

	v4 "github.com/shoaldb/shoal/internal/v4"
	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// The admin API (/admin/v1) manages accounts, their tier and limits, and
// their API tokens. Only the operator's admin token (from configuration) may
// call it. Token secrets are returned once, at mint; the catalog stores their
// SHA-256.

// AccountJSON is an account as the admin API shows it.
type AccountJSON struct {
	ID              string     `json:"id"`
	Name            string     `json:"name"`
	Tier            string     `json:"tier"`
	Limits          fsm.Limits `json:"limits"`
	ActiveDatabases int64      `json:"active_databases"`
	StorageBytes    int64      `json:"storage_bytes"`
	CreatedAt       string     `json:"created_at"`
}

func accountJSON(a fsm.Account) AccountJSON {
	return AccountJSON{ID: a.ID, Name: a.Name, Tier: a.Tier, Limits: a.Limits, ActiveDatabases: a.ActiveDatabases,
		StorageBytes: a.StorageBytes, CreatedAt: d1Time(a.CreatedAt)}
}

// TokenJSON is a minted or revoked token. Token (the secret) is set only in
// the mint answer.
type TokenJSON struct {
	ID        string   `json:"id"`
	AccountID string   `json:"account_id"`
	Name      string   `json:"name"`
	Revoked   bool     `json:"revoked"`
	Token     string   `json:"token,omitempty"`
	Scope     string   `json:"scope,omitempty"`
	Databases []string `json:"databases,omitempty"`
	ExpiresAt string   `json:"expires_at,omitempty"` // RFC 3339
}

type createAccountBody struct {
	ID     string      `json:"id,omitempty"`
	Name   string      `json:"name"`
	Tier   string      `json:"tier,omitempty"`
	Limits *fsm.Limits `json:"limits,omitempty"`
}

type updateAccountBody struct {
	Tier   *string     `json:"tier,omitempty"`
	Limits *fsm.Limits `json:"limits,omitempty"`
}

// createTokenBody: scope "edit" (default) or "read"; databases, names or
// UUIDs of the account's databases the token is limited to (resolved to
// UUIDs now: a later database of the same name is not included);
// ttl_seconds, when set, makes the token expire.
type createTokenBody struct {
	Name       string   `json:"name"`
	Scope      string   `json:"scope,omitempty"`
	Databases  []string `json:"databases,omitempty"`
	TTLSeconds int64    `json:"ttl_seconds,omitempty"`
}

// maxTokenTTL bounds ttl_seconds (ten years).
const maxTokenTTL = 10 * 365 * 24 * 3600

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func (s *Server) handleAdminCreateAccount(w http.ResponseWriter, r *http.Request, _ principal) {
	var body createAccountBody
	if err := readJSON(r.Body, smallBodyBytes, &body); err != nil {
		s.writeErr(w, r, err)
		return
	}
	if body.ID == "" {
		body.ID = randomHex(16) // Cloudflare account ids are 32 hex chars
	}
	if err := checkAccountID(body.ID); err != nil {
		s.writeErr(w, r, err)
		return
	}
	if body.Tier == "" {
		body.Tier = "free"
	}
	limits, ok := s.o.Tiers[body.Tier]
	if !ok {
		s.writeErr(w, r, invalid("Invalid property: tier => unknown tier %q", body.Tier))
		return
	}
	if body.Limits != nil {
		limits = *body.Limits
	}
	var a fsm.Account
	err := s.catalogWrite(r.Context(), func(ctx context.Context) error {
		var err error
		a, err = s.catalog.CreateAccount(ctx, fsm.CreateAccount{ID: body.ID, Name: body.Name, Tier: body.Tier, Limits: limits})
		return err
	})
	if err != nil {
		s.writeAdminErr(w, r, err)
		return
	}
	v4.WriteResult(w, accountJSON(a))
}

func (s *Server) handleAdminGetAccount(w http.ResponseWriter, r *http.Request, _ principal) {
	id := mux.Vars(r)["id"]
	if err := checkAccountID(id); err != nil {
		s.writeErr(w, r, err)
		return
	}
	a, err := catalogRead(r.Context(), s, func(ctx context.Context) (fsm.Account, error) { return s.catalog.Account(ctx, id) })
	if err != nil {
		s.writeAdminErr(w, r, err)
		return
	}
	v4.WriteResult(w, accountJSON(a))
}

func (s *Server) handleAdminUpdateAccount(w http.ResponseWriter, r *http.Request, _ principal) {
	id := mux.Vars(r)["id"]
	if err := checkAccountID(id); err != nil {
		s.writeErr(w, r, err)
		return
	}
	var body updateAccountBody
	if err := readJSON(r.Body, smallBodyBytes, &body); err != nil {
		s.writeErr(w, r, err)
		return
	}
	cmd := fsm.UpdateAccount{ID: id, Tier: body.Tier, Limits: body.Limits}
	if body.Tier != nil {
		limits, ok := s.o.Tiers[*body.Tier]
		if !ok {
			s.writeErr(w, r, invalid("Invalid property: tier => unknown tier %q", *body.Tier))
			return
		}
		if body.Limits == nil {
			cmd.Limits = &limits // a tier change brings the tier's limits
		}
	}
	var a fsm.Account
	err := s.catalogWrite(r.Context(), func(ctx context.Context) error {
		var err error
		a, err = s.catalog.UpdateAccount(ctx, cmd)
		return err
	})
	if err != nil {
		s.writeAdminErr(w, r, err)
		return
	}
	s.acctMu.Lock()
	delete(s.accts, id)
	s.acctMu.Unlock()
	// The catalog write is the checkpoint. Telling the background plane
	// (the `accounts` topic: the limiter lifts a daily-limit flag at once)
	// is best effort: the limiter's next pass re-reads the tier anyway.
	if s.o.AccountChanged != nil {
		if err := s.o.AccountChanged(r.Context(), a); err != nil {
			s.log.Warn("account change not published; the limiter learns it at its next pass", "account", id, "err", err)
		}
	}
	v4.WriteResult(w, accountJSON(a))
}

func (s *Server) handleAdminCreateToken(w http.ResponseWriter, r *http.Request, _ principal) {
	acct := mux.Vars(r)["id"]
	if err := checkAccountID(acct); err != nil {
		s.writeErr(w, r, err)
		return
	}
	b, err := readBody(r.Body, smallBodyBytes)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	var body createTokenBody
	if len(b) > 0 {
		if err := decodeStrict(b, &body); err != nil {
			s.writeErr(w, r, err)
			return
		}
	}
	switch body.Scope {
	case "", fsm.ScopeEdit, fsm.ScopeRead:
	default:
		s.writeErr(w, r, invalid("Invalid property: scope => must be read or edit"))
		return
	}
	if body.TTLSeconds < 0 || body.TTLSeconds > maxTokenTTL {
		s.writeErr(w, r, invalid("Invalid property: ttl_seconds => must be 0 (no expiry) to %d", maxTokenTTL))
		return
	}
	if len(body.Databases) > 100 {
		s.writeErr(w, r, invalid("Invalid property: databases => at most 100"))
		return
	}
	var dbs []string
	for _, ref := range body.Databases {
		d, err := s.resolveDatabaseRef(r.Context(), acct, ref)
		if err != nil {
			s.writeErr(w, r, err)
			return
		}
		dbs = append(dbs, d.UUID)
	}
	var expires int64
	if body.TTLSeconds > 0 {
		expires = s.o.Now().Add(time.Duration(body.TTLSeconds) * time.Second).UnixNano()
	}
	secretBytes := make([]byte, 30)
	_, _ = rand.Read(secretBytes)
	secret := base64.RawURLEncoding.EncodeToString(secretBytes) // 40 chars, like Cloudflare's tokens
	var t fsm.Token
	err = s.catalogWrite(r.Context(), func(ctx context.Context) error {
		var err error
		t, err = s.catalog.CreateToken(ctx, fsm.CreateToken{ID: randomHex(16), AccountID: acct, Hash: HashToken(secret), Name: body.Name,
			Scope: body.Scope, Databases: dbs, ExpiresAt: expires})
		return err
	})
	if err != nil {
		s.writeAdminErr(w, r, err)
		return
	}
	// No negative entry of this edge may outlive the mint (it cannot exist
	// for a fresh random secret, but the rule is cheap to keep exactly).
	s.auth.forget(HashToken(secret))
	out := TokenJSON{ID: t.ID, AccountID: t.AccountID, Name: t.Name, Token: secret, Scope: t.Scope, Databases: t.Databases}
	if t.ExpiresAt > 0 {
		out.ExpiresAt = time.Unix(0, t.ExpiresAt).UTC().Format(time.RFC3339)
	}
	v4.WriteResult(w, out)
}

func (s *Server) handleAdminRevokeToken(w http.ResponseWriter, r *http.Request, _ principal) {
	id := mux.Vars(r)["id"]
	if err := checkAccountID(id); err != nil {
		s.writeErr(w, r, err)
		return
	}
	var t fsm.Token
	err := s.catalogWrite(r.Context(), func(ctx context.Context) error {
		var err error
		t, err = s.catalog.RevokeToken(ctx, fsm.RevokeToken{ID: id})
		return err
	})
	if err != nil {
		s.writeAdminErr(w, r, err)
		return
	}
	v4.WriteResult(w, TokenJSON{ID: t.ID, AccountID: t.AccountID, Name: t.Name, Revoked: true})
}

// writeAdminErr maps catalog refusals of admin commands.
func (s *Server) writeAdminErr(w http.ResponseWriter, r *http.Request, err error) {
	switch {
	case isCatalogRefusal(err) && (errors.Is(err, fsm.ErrNotFound) || errors.Is(err, fsm.ErrAccountNotFound)):
		v4.WriteError(w, http.StatusNotFound, v4.CodeNotFound, "not found")
	case errors.Is(err, fsm.ErrExists):
		v4.WriteError(w, http.StatusConflict, v4.CodeInvalidRequest, "already exists")
	case errors.Is(err, fsm.ErrInvalid):
		v4.WriteError(w, http.StatusBadRequest, v4.CodeInvalidRequest, "invalid: "+err.Error())
	default:
		s.writeErr(w, r, err)
	}
}

// resolveDatabaseRef finds one of acct's active databases by UUID or name.
func (s *Server) resolveDatabaseRef(ctx context.Context, acct, ref string) (fsm.Database, error) {
	if id, err := canonicalUUID(ref); err == nil {
		d, err := s.ownDatabase(ctx, acct, id)
		if errors.Is(err, ErrDatabaseNotFound) || errors.Is(err, fsm.ErrNotFound) {
			return d, invalid("Invalid property: databases => no database %q in the account", ref)
		}
		return d, err
	}
	d, err := catalogRead(ctx, s, func(ctx context.Context) (fsm.Database, error) { return s.catalog.DatabaseByName(ctx, acct, ref) })
	if errors.Is(err, fsm.ErrNotFound) {
		return d, invalid("Invalid property: databases => no database %q in the account", ref)
	}
	return d, err
}
