package edge

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/gorilla/mux"

	v4 "github.com/shoaldb/shoal/internal/v4"
)

// The identity endpoints Cloudflare's clients call before (or instead of)
// any D1 call: wrangler asks /memberships for the account when
// CLOUDFLARE_ACCOUNT_ID is not set, and `wrangler whoami` asks
// /user/tokens/verify, /user, /accounts and /memberships. A Shoal token
// belongs to exactly one account, so it is what Cloudflare calls an
// account API token, and these endpoints answer as Cloudflare's do for
// one:
//
//   - GET /client/v4/user/tokens/verify: 401 with code 1000, "Invalid API
//     Token" (the user endpoint does not know account tokens; wrangler
//     reads exactly that code as "an account token"), with a message
//     naming the account endpoint;
//   - GET /client/v4/accounts/{account_id}/tokens/verify: the token's id
//     and status "active";
//   - GET /client/v4/user: 403 with code 9109 (no user behind the token;
//     wrangler then prints no e-mail);
//   - GET /client/v4/accounts and /client/v4/memberships: the token's one
//     account (the admin token, which belongs to no account, gets an empty
//     list), paginated like every Cloudflare list.
//
// Each is authenticated and rate-limited like the D1 endpoints; none
// reveals anything of another account.

// Cloudflare's codes for the answers above (not in internal/v4's range:
// they are Cloudflare's own, which clients branch on).
const (
	codeInvalidAPIToken = 1000 // /user/tokens/verify for a token that is not a user token
	codeUnauthorizedRes = 9109 // "Unauthorized to access requested resource"
)

// membershipRoles are the roles reported for the token's account: a Shoal
// token may do everything the D1 API offers in its account.
var membershipRoles = []string{"Administrator"}

func (s *Server) identityRoutes(r *mux.Router) {
	r.Handle("/client/v4/user/tokens/verify", s.instrument("user_tokens_verify", http.HandlerFunc(s.handleUserTokenVerify))).Methods(http.MethodGet)
	r.Handle("/client/v4/user", s.instrument("user", http.HandlerFunc(s.handleUser))).Methods(http.MethodGet)
	r.Handle("/client/v4/accounts/{account_id}/tokens/verify", s.account("account_tokens_verify", s.handleAccountTokenVerify)).Methods(http.MethodGet)
	r.Handle("/client/v4/accounts", s.instrument("accounts", http.HandlerFunc(s.handleAccounts))).Methods(http.MethodGet)
	r.Handle("/client/v4/memberships", s.instrument("memberships", http.HandlerFunc(s.handleMemberships))).Methods(http.MethodGet)
}

// authenticated runs the token check of an endpoint without an account in
// its path, then the account's rate limit (the admin token has none).
func (s *Server) authenticated(w http.ResponseWriter, r *http.Request) (principal, bool) {
	p, err := s.auth.authenticate(r.Context(), r.Header.Get("Authorization"))
	if err == nil && !p.admin {
		err = s.checkRate(p.accountID, "")
	}
	if err != nil {
		s.writeErr(w, r, err)
		return principal{}, false
	}
	return p, true
}

func (s *Server) handleUserTokenVerify(w http.ResponseWriter, r *http.Request) {
	p, err := s.auth.authenticate(r.Context(), r.Header.Get("Authorization"))
	switch {
	case errors.Is(err, errUnauthenticated), errors.Is(err, errTokenExpired):
		writeJSON(w, http.StatusUnauthorized, v4.Envelope{Success: false,
			Errors: []v4.Error{{Code: codeInvalidAPIToken, Message: "Invalid API Token"}}, Messages: []any{}})
		return
	case err != nil:
		s.writeErr(w, r, err) // the catalog could not be asked: retry, not "invalid"
		return
	}
	if !p.admin {
		if err := s.checkRate(p.accountID, ""); err != nil {
			s.writeErr(w, r, err)
			return
		}
	}
	writeJSON(w, http.StatusUnauthorized, v4.Envelope{Success: false,
		Errors: []v4.Error{{Code: codeInvalidAPIToken, Message: "Invalid API Token"}},
		Messages: []any{v4.Error{Code: codeInvalidAPIToken,
			Message: "Shoal API tokens are account API tokens: verify this one at /client/v4/accounts/{account_id}/tokens/verify"}}})
}

// writeJSON writes v as the JSON body with status (HTML characters kept
// as they are, like internal/v4's envelopes).
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}

func (s *Server) handleUser(w http.ResponseWriter, r *http.Request) {
	if _, ok := s.authenticated(w, r); !ok {
		return
	}
	v4.WriteError(w, http.StatusForbidden, codeUnauthorizedRes, "Unauthorized to access requested resource: Shoal API tokens belong to an account, not a user")
}

// tokenStatusJSON is Cloudflare's token verification result.
type tokenStatusJSON struct {
	ID     string `json:"id"`
	Status string `json:"status"`
}

func (s *Server) handleAccountTokenVerify(w http.ResponseWriter, r *http.Request, p principal) {
	if !p.admin {
		if err := s.checkRate(p.accountID, ""); err != nil {
			s.writeErr(w, r, err)
			return
		}
	}
	id := p.tokenID
	if p.admin {
		id = "admin"
	}
	v4.WriteResult(w, tokenStatusJSON{ID: id, Status: "active"})
}

// cfAccountJSON is Cloudflare's account object, with the fields clients read.
type cfAccountJSON struct {
	ID        string              `json:"id"`
	Name      string              `json:"name"`
	Type      string              `json:"type"`
	Settings  accountSettingsJSON `json:"settings"`
	CreatedOn string              `json:"created_on"`
}

type accountSettingsJSON struct {
	EnforceTwoFactor bool `json:"enforce_twofactor"`
}

// membershipJSON is Cloudflare's membership object.
type membershipJSON struct {
	ID      string        `json:"id"`
	Account cfAccountJSON `json:"account"`
	Roles   []string      `json:"roles"`
	Status  string        `json:"status"`
}

// tokenAccount returns the token's account as Cloudflare's object (nil for
// the admin token, which belongs to none).
func (s *Server) tokenAccount(w http.ResponseWriter, r *http.Request) (p principal, a *cfAccountJSON, page, perPage int, ok bool) {
	p, ok = s.authenticated(w, r)
	if !ok {
		return p, nil, 0, 0, false
	}
	page, perPage, err := listPage(r)
	if err != nil {
		s.writeErr(w, r, err)
		return p, nil, 0, 0, false
	}
	if p.admin {
		return p, nil, page, perPage, true
	}
	row, err := s.accountRow(r.Context(), p.accountID)
	if err != nil {
		s.writeErr(w, r, err)
		return p, nil, 0, 0, false
	}
	name := row.Name
	if name == "" {
		name = row.ID
	}
	return p, &cfAccountJSON{ID: row.ID, Name: name, Type: "standard",
		CreatedOn: time.Unix(0, row.CreatedAt).UTC().Format(time.RFC3339Nano)}, page, perPage, true
}

// listPage reads Cloudflare's page and per_page (defaults 1 and 20).
func listPage(r *http.Request) (page, perPage int, err error) {
	page, perPage = 1, 20
	q := r.URL.Query()
	if v := q.Get("page"); v != "" {
		if page, err = strconv.Atoi(v); err != nil || page < 1 {
			return 0, 0, invalid("Invalid property: page => must be an integer >= 1")
		}
	}
	if v := q.Get("per_page"); v != "" {
		if perPage, err = strconv.Atoi(v); err != nil || perPage < 1 {
			return 0, 0, invalid("Invalid property: per_page => must be an integer >= 1")
		}
	}
	return page, perPage, nil
}

// onePage answers a list of at most one item, paginated.
func onePage[T any](w http.ResponseWriter, item *T, page, perPage int) {
	out := []T{}
	total := 0
	if item != nil {
		total = 1
		if page == 1 {
			out = append(out, *item)
		}
	}
	v4.WriteList(w, out, v4.ResultInfo{Page: page, PerPage: perPage, Count: len(out), TotalCount: int64(total)})
}

func (s *Server) handleAccounts(w http.ResponseWriter, r *http.Request) {
	_, a, page, perPage, ok := s.tokenAccount(w, r)
	if !ok {
		return
	}
	onePage(w, a, page, perPage)
}

func (s *Server) handleMemberships(w http.ResponseWriter, r *http.Request) {
	p, a, page, perPage, ok := s.tokenAccount(w, r)
	if !ok {
		return
	}
	var m *membershipJSON
	if a != nil {
		m = &membershipJSON{ID: p.tokenID, Account: *a, Roles: membershipRoles, Status: "accepted"}
	}
	onePage(w, m, page, perPage)
}
