package edge

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/gorilla/mux"

	"github.com/shoaldb/shoal/internal/binding"
	v4 "github.com/shoaldb/shoal/internal/v4"
	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// query serves POST /{id}/query and /{id}/raw: authenticate (bearer, or a
// binding token which skips the route lookup), rate-limit, validate, route,
// forward. The catalog is only consulted on a route cache miss.
func (s *Server) query(kind string) http.Handler {
	bearer := s.account(kind, func(w http.ResponseWriter, r *http.Request, p principal) {
		s.handleQuery(w, r, kind, p.readOnly)
	})
	// Built once, not per request: instrument keeps its resolved metric
	// observers in its closure.
	bound := s.instrument("bound_"+kind, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tok, _ := binding.FromHeader(r.Header)
		acct, id, err := s.pathDatabase(r)
		if err != nil {
			s.writeErr(w, r, err)
			return
		}
		s.serveBound(w, r, kind, tok, func(c binding.Claims) error {
			if c.AccountID != acct {
				return errForbidden
			}
			if c.DatabaseUUID != id {
				return ErrDatabaseNotFound
			}
			return nil
		})
	}))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := binding.FromHeader(r.Header); err == nil {
			bound.ServeHTTP(w, r)
			return
		}
		bearer.ServeHTTP(w, r)
	})
}

// handleQuery serves a bearer query; readOnly (a D1 Read token) makes the
// object host refuse any statement that writes.
func (s *Server) handleQuery(w http.ResponseWriter, r *http.Request, kind string, readOnly bool) {
	acct, id, err := s.databaseRequest(r)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	body, err := s.queryBody(r)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	// The cache, else the catalog, else — only when the catalog is
	// unavailable — the object hosts (hostroute.go).
	rt, err := s.objectRoute(r.Context(), id, acct)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	resp, err := s.forwardQuery(r, rt, kind, body, readOnly)
	if errors.Is(err, ErrStaleRoute) {
		// A stale route is harmless: forget it, ask the catalog once, retry
		// once. The host refused before executing anything (421/410/404), so
		// resending even a write cannot apply it twice.
		s.m.staleRoutes.Inc()
		if ierr := s.cache.Invalidate(id, rt.Generation); ierr != nil {
			s.log.Warn("route invalidate failed", "err", ierr)
		}
		rt, err = s.res.fill(r.Context(), id)
		if err == nil {
			err = usable(rt, acct)
		}
		if err == nil {
			resp, err = s.forwardQuery(r, rt, kind, body, readOnly)
		}
		var se *staleError
		if errors.As(err, &se) {
			if se.status == http.StatusGone || se.status == http.StatusNotFound {
				err = ErrDatabaseNotFound
			} else {
				err = fmt.Errorf("%w: database route is changing", ErrUnavailable)
			}
		}
	}
	if err != nil && neverSent(err) && s.movedCheckDue(id) {
		// The route's host refused the connection: a host that is down,
		// or one declared lost whose databases were relocated. Ask the
		// catalog whether the database moved (a higher generation) and
		// send the request there: it never reached the first host. At
		// most one catalog read per database per movedRecheck, so a dead
		// host's traffic cannot turn into a catalog storm.
		if nrt, ferr := s.res.fill(r.Context(), id); ferr == nil && nrt.Generation > rt.Generation && usable(nrt, acct) == nil {
			s.m.movedRoutes.Inc()
			resp, err = s.forwardQuery(r, nrt, kind, body, readOnly)
		}
	}
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	defer resp.Body.Close()
	s.passThrough(w, resp)
}

// movedRecheck bounds the catalog reads of databases whose host refuses
// connections: one per database per period.
const movedRecheck = 2 * time.Second

// movedCheckDue reports whether the database's route may be re-read now
// (and records that it is).
func (s *Server) movedCheckDue(id string) bool {
	now := s.o.Now()
	s.movedMu.Lock()
	defer s.movedMu.Unlock()
	if s.movedCheck == nil || len(s.movedCheck) > 100_000 {
		s.movedCheck = make(map[string]time.Time)
	}
	if last, ok := s.movedCheck[id]; ok && now.Sub(last) < movedRecheck {
		return false
	}
	s.movedCheck[id] = now
	return true
}

// usable checks a route may serve a query of account acct. Another account's
// database is "not found", like a deleted one.
func usable(rt Route, acct string) error {
	if rt.AccountID != acct || rt.State != fsm.StateActive {
		return ErrDatabaseNotFound
	}
	return nil
}

// staleError is an object host refusing a route: 421 wrong host, 410 deleted,
// 404 unknown object. It wraps ErrStaleRoute.
type staleError struct{ status int }

func (e *staleError) Error() string { return fmt.Sprintf("object host answered %d", e.status) }
func (e *staleError) Unwrap() error { return ErrStaleRoute }

// queryBody reads a query request's body within the size limit and
// validates it (both the bearer and the binding-token paths).
func (s *Server) queryBody(r *http.Request) ([]byte, error) {
	body, err := readBody(r.Body, s.o.Limits.MaxBodyBytes)
	if err != nil {
		return nil, err
	}
	return body, validateQueryBody(body, s.o.Limits)
}

// forwardQuery sends the validated body to the route's object host. It returns
// the host's response for pass-through, or a *staleError, or ErrUnavailable
// when the host cannot be reached.
func (s *Server) forwardQuery(r *http.Request, rt Route, kind string, body []byte, readOnly bool) (*http.Response, error) {
	h := make(http.Header, 6)
	setRouteHeaders(h, rt)
	if readOnly {
		h.Set(HeaderReadOnly, "1")
	}
	h[headerRequestIDCanonical] = []string{requestIDFrom(r.Context())}
	if v := r.Header.Get(HeaderNumbers); v != "" {
		h.Set(HeaderNumbers, v)
	}
	_ = s.cache.NoteHost(rt.HostAddress) // best effort (hostbook.go); a known address costs a map lookup
	resp, err := s.hosts.forward(r.Context(), s.hosts.URL(rt.HostAddress, "/v1/objects/"+rt.ObjectID+"/"+kind), h, body)
	if err != nil {
		return nil, fmt.Errorf("%w: object host unreachable: %w", ErrUnavailable, err)
	}
	switch resp.StatusCode {
	case http.StatusMisdirectedRequest, http.StatusGone, http.StatusNotFound:
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		return nil, &staleError{status: resp.StatusCode}
	}
	return resp, nil
}

// maxErrorBody bounds how much of an object host's error answer the edge
// reads to learn its code (a SQL error's message is SQLite's text, short).
const maxErrorBody = 1 << 20

// passThrough copies the host's v4 answer to the client untouched: results and
// meta are produced by the host in D1's shape. Overload and internal errors
// keep their status; Retry-After is kept when the host sets it.
func (s *Server) passThrough(w http.ResponseWriter, resp *http.Response) {
	if ct := resp.Header.Get("Content-Type"); ct != "" {
		w.Header().Set("Content-Type", ct)
	} else {
		w.Header().Set("Content-Type", "application/json")
	}
	if ra := resp.Header.Get("Retry-After"); ra != "" {
		w.Header().Set("Retry-After", ra)
	}
	if resp.StatusCode >= 400 {
		// An error answer is small: read it to learn its D1 code for the
		// access log and the request metrics, then pass it on as it is.
		body, err := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		if err == nil {
			var env struct {
				Errors []struct {
					Code int `json:"code"`
				} `json:"errors"`
			}
			if json.Unmarshal(body, &env) == nil && len(env.Errors) > 0 {
				v4.RecordCode(w, env.Errors[0].Code)
			}
		}
		w.WriteHeader(resp.StatusCode)
		_, _ = w.Write(body)
		return
	}
	w.WriteHeader(resp.StatusCode)
	buf := s.copyBufs.Get().(*[]byte)
	_, _ = io.CopyBuffer(w, resp.Body, *buf)
	s.copyBufs.Put(buf)
}

// handleBound serves /client/v4/bound/{query|raw}: a binding token is the only
// credential and carries the route; no catalog, no cache.
func (s *Server) handleBound(w http.ResponseWriter, r *http.Request) {
	tok, err := binding.FromHeader(r.Header)
	if err != nil {
		s.writeErr(w, r, errUnauthenticated)
		return
	}
	s.serveBound(w, r, mux.Vars(r)["kind"], tok, nil)
}

// serveBound verifies the token's signature locally (so the edge never
// forwards to an address it did not itself sign), then sends the query to the
// object host's bound endpoint, which verifies the token again and checks the
// claims against the object's own metadata.
func (s *Server) serveBound(w http.ResponseWriter, r *http.Request, kind, tok string, check func(binding.Claims) error) {
	if s.o.BindingKeys == nil {
		s.writeErr(w, r, errUnauthenticated)
		return
	}
	c, err := s.o.BindingKeys.Verify(tok, s.o.Now())
	if err != nil {
		s.writeErr(w, r, bindingRefusal(err))
		return
	}
	if check != nil {
		if err := check(c); err != nil {
			s.writeErr(w, r, err)
			return
		}
	}
	if err := s.checkRate(c.AccountID, c.DatabaseUUID); err != nil {
		s.writeErr(w, r, err)
		return
	}
	// The API token that minted it must still be valid (cached like a
	// bearer check; see authenticator.parentValid).
	if err := s.auth.parentValid(r.Context(), c.Parent); err != nil {
		s.writeErr(w, r, bindingRefusal(err))
		return
	}
	body, err := s.queryBody(r)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	h := make(http.Header, 6)
	setRouteHeaders(h, Route{DatabaseUUID: c.DatabaseUUID, AccountID: c.AccountID, Generation: c.Generation})
	binding.SetHeader(h, tok)
	h[headerRequestIDCanonical] = []string{requestIDFrom(r.Context())}
	if v := r.Header.Get(HeaderNumbers); v != "" {
		h.Set(HeaderNumbers, v)
	}
	resp, err := s.hosts.forward(r.Context(), s.hosts.URL(c.HostAddress, "/v1/bound/"+kind), h, body)
	if err != nil {
		s.writeErr(w, r, fmt.Errorf("%w: object host unreachable: %w", ErrUnavailable, err))
		return
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusMisdirectedRequest, http.StatusNotFound:
		// The route the token carries is no longer true (the database
		// moved or its generation changed): the token is spent, not the
		// database. A deleted database stays 410 (passed through).
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		s.writeErr(w, r, bindingRefusal(errBindingRouteChanged))
		return
	}
	s.passThrough(w, resp)
}
