package objecthost

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/gorilla/mux"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/shoaldb/shoal/internal/binding"
	"github.com/shoaldb/shoal/internal/frame"
	"github.com/shoaldb/shoal/internal/pki"
	"github.com/shoaldb/shoal/internal/profiling"
	v4 "github.com/shoaldb/shoal/internal/v4"
	"github.com/shoaldb/shoal/objecthost/sqlexec"
)

// Headers of the internal API (see DESIGN.md, "Internal API").
const (
	HeaderDatabase   = "X-Shoal-Database"
	HeaderAccount    = "X-Shoal-Account"
	HeaderGeneration = "X-Shoal-Generation"
	// HeaderNumbers chooses how integers beyond ±2^53 are rendered:
	// "exact" (the default: every digit) or "js" (the nearest double, as
	// D1 answers through JavaScript). Clients send it to the edge, which
	// passes it on (docs/d1-compatibility.md).
	HeaderNumbers = "Shoal-Numbers"
	// HeaderReadOnly "1" runs the query read-only (sqlexec.Request.ReadOnly):
	// the edge sets it for D1 Read tokens.
	HeaderReadOnly = "X-Shoal-Read-Only"
)

// Handler returns the internal HTTP API: lifecycle (init, confirm, delete,
// info), queries (query, raw), binding-token queries, /healthz, /metrics,
// /debug/pprof/ (operators only).
func (h *Host) Handler() http.Handler {
	r := mux.NewRouter()
	r.HandleFunc("/v1/objects/{id}/init", h.handleInit).Methods(http.MethodPost)
	r.HandleFunc("/v1/objects/{id}/confirm", h.handleGen(h.Confirm)).Methods(http.MethodPost)
	r.HandleFunc("/v1/objects/{id}/delete", h.handleGen(h.Delete)).Methods(http.MethodPost)
	r.HandleFunc("/v1/objects/{id}", h.handleInfo).Methods(http.MethodGet)
	// Which objects of a database this host holds (locate.go).
	r.HandleFunc("/v1/databases/{uuid}/objects", h.handleLocate).Methods(http.MethodGet)
	h.dumpRoutes(r)    // export/import endpoints: export.go, import.go
	h.historyRoutes(r) // time travel: history.go
	h.bindingRoutes(r) // binding-token revocation: bindings.go
	h.batchRoutes(r)   // batched init and confirm: batch.go
	r.HandleFunc("/v1/objects/{id}/query", h.handleQuery(false)).Methods(http.MethodPost)
	r.HandleFunc("/v1/objects/{id}/raw", h.handleQuery(true)).Methods(http.MethodPost)
	if h.cfg.Bindings != nil {
		r.HandleFunc("/v1/bound/query", h.handleBound(false)).Methods(http.MethodPost)
		r.HandleFunc("/v1/bound/raw", h.handleBound(true)).Methods(http.MethodPost)
	}
	r.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if h.closed.Load() {
			noteReason(w, ErrClosed)
			v4.WriteError(w, http.StatusServiceUnavailable, v4.CodeUnavailable, "closing")
			return
		}
		v4.WriteResult(w, map[string]any{"id": h.cfg.ID, "databases": h.active.Load()})
	}).Methods(http.MethodGet)
	r.HandleFunc("/v1/status", func(w http.ResponseWriter, _ *http.Request) {
		v4.WriteResult(w, h.Status())
	}).Methods(http.MethodGet)
	r.HandleFunc("/v1/resurrected", func(w http.ResponseWriter, _ *http.Request) {
		v4.WriteResult(w, map[string]any{"databases": h.Resurrected()})
	}).Methods(http.MethodGet)
	r.Handle("/metrics", promhttp.HandlerFor(h.m.reg, promhttp.HandlerOpts{})).Methods(http.MethodGet)
	// Go profiles: peerAllowed admits edges and operators, the profiling
	// handler then only operators.
	r.PathPrefix(profiling.Prefix).Handler(profiling.Handler(h.cfg.TLS != nil))
	r.NotFoundHandler = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		v4.WriteError(w, http.StatusNotFound, v4.CodeNotFound, "no such route")
	})
	r.MethodNotAllowedHandler = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		v4.WriteError(w, http.StatusMethodNotAllowed, v4.CodeInvalidRequest, "method not allowed")
	})
	r.Use(func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			if rec := recorderOf(w); rec != nil {
				if t, err := mux.CurrentRoute(req).GetPathTemplate(); err == nil {
					rec.route = t
				}
				rec.object = mux.Vars(req)["id"]
			}
			next.ServeHTTP(w, req)
		})
	})
	return &apiHandler{h: h, router: r}
}

// apiHandler serves POST /v1/objects/{id}/query and /raw — nearly every
// request a host gets — without the router: gorilla/mux tries each route's
// regexps in turn, which cost ~10 % of a point query's CPU. Every other
// request (and any query path the fast match does not recognise) goes to
// the router, which also registers the query routes, so the answers are
// the same either way.
type apiHandler struct {
	h      *Host
	router *mux.Router
}

func (a *apiHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a.serveRecorded(&failRecorder{ResponseWriter: w, status: http.StatusOK}, r)
}

// serveRecorded is ServeHTTP with the recorder given (a frame stream holds
// its own instead of allocating one per request).
func (a *apiHandler) serveRecorded(rec *failRecorder, r *http.Request) {
	a.serve(rec, r)
	if rec.status >= 500 {
		a.h.logFailure(r, rec)
	}
}

func (a *apiHandler) serve(w *failRecorder, r *http.Request) {
	if a.h.cfg.TLS != nil && !a.h.peerAllowed(w, r) {
		return
	}
	if r.URL.Path == frame.UpgradePath && r.Method == http.MethodGet {
		// An edge switching this connection to the multiplexed query
		// transport (frames.go), authenticated above like any request.
		w.route = frame.UpgradePath
		a.h.frames.upgrade(w, r, a)
		return
	}
	if r.Method == http.MethodPost {
		if id, raw, ok := queryRoute(r.URL.Path); ok {
			w.route, w.object = queryTemplate, id
			if raw {
				w.route = rawTemplate
			}
			a.h.serveQuery(w, r, id, Identity{DatabaseUUID: r.Header.Get(HeaderDatabase), AccountID: r.Header.Get(HeaderAccount)}, raw)
			return
		}
		// The create flow's batched calls (batch.go), also matched by
		// hand: with frames they are most of what a host serves besides
		// queries during a burst of creates.
		switch r.URL.Path {
		case batchInitPath:
			w.route = batchInitPath
			a.h.handleInitBatch(w, r)
			return
		case batchConfirmPath:
			w.route = batchConfirmPath
			a.h.handleConfirmBatch(w, r)
			return
		}
	}
	a.router.ServeHTTP(w, r)
}

const (
	queryTemplate = "/v1/objects/{id}/query"
	rawTemplate   = "/v1/objects/{id}/raw"
)

// peerAllowed authorises a request by its TLS peer's roles (Config.TLS):
// the objects and bound-query routes are for edges (and operators, whose
// lost-host recovery initialises objects); status and metrics for
// operators and edges; /healthz for any cluster certificate (the listener
// admits no other). It answers the refusal itself.
func (h *Host) peerAllowed(w http.ResponseWriter, r *http.Request) bool {
	id, ok := pki.PeerIdentity(r.TLS)
	if !ok {
		v4.WriteError(w, http.StatusUnauthorized, v4.CodeUnauthorized, "internal endpoint: a cluster certificate is required")
		return false
	}
	if r.URL.Path == "/healthz" || id.Has(pki.RoleEdge, pki.RoleOperator) {
		return true
	}
	v4.WriteError(w, http.StatusForbidden, v4.CodeForbidden, "internal endpoint: the caller's certificate roles do not allow this request")
	return false
}

// queryRoute matches /v1/objects/{id}/query and /v1/objects/{id}/raw with
// {id} one non-empty path segment, as the router's pattern does; "." and
// ".." are left to the router (it cleans and redirects such paths).
func queryRoute(path string) (id string, raw bool, ok bool) {
	const prefix = "/v1/objects/"
	if !strings.HasPrefix(path, prefix) {
		return "", false, false
	}
	rest := path[len(prefix):]
	switch {
	case strings.HasSuffix(rest, "/query"):
		id = rest[:len(rest)-len("/query")]
	case strings.HasSuffix(rest, "/raw"):
		id, raw = rest[:len(rest)-len("/raw")], true
	default:
		return "", false, false
	}
	if id == "" || id == "." || id == ".." || strings.IndexByte(id, '/') >= 0 {
		return "", false, false
	}
	return id, raw, true
}

// writeErr answers err in the v4 envelope. The message is statusOf's
// (never internals); err itself is recorded on the request (noteReason),
// and the host logs it once if the answer is a 5xx (apiHandler).
func writeErr(w http.ResponseWriter, err error) {
	noteReason(w, err)
	status, code, msg := statusOf(err)
	if status == http.StatusTooManyRequests {
		// Overload and admission refusals are worth a retry: say when.
		v4.WriteRetryAfter(w, status, code, msg, time.Second)
		return
	}
	v4.WriteError(w, status, code, msg)
}

// readBody reads at most limit bytes; more is ErrTooLarge-style 413.
func (h *Host) readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, h.cfg.MaxBodyBytes))
	if err != nil {
		var mb *http.MaxBytesError
		if errors.As(err, &mb) {
			return nil, &sqlexec.Error{Code: v4.CodeTooLarge, Message: fmt.Sprintf("request body over %d bytes", h.cfg.MaxBodyBytes), Statement: -1}
		}
		return nil, fmt.Errorf("%w: reading body: %v", ErrInvalid, err)
	}
	return b, nil
}

func (h *Host) handleInit(w http.ResponseWriter, r *http.Request) {
	b, err := h.readBody(w, r)
	if err != nil {
		writeErr(w, err)
		return
	}
	var req InitRequest
	if err := json.Unmarshal(b, &req); err != nil {
		writeErr(w, fmt.Errorf("%w: %v", ErrInvalid, err))
		return
	}
	info, err := h.Init(r.Context(), mux.Vars(r)["id"], req)
	if err != nil {
		writeErr(w, err)
		return
	}
	v4.WriteResult(w, info)
}

// checkIdentity refuses a control call whose identity headers, when
// present, name another database or account.
func (h *Host) checkIdentity(r *http.Request, id string) error {
	db, acct := r.Header.Get(HeaderDatabase), r.Header.Get(HeaderAccount)
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

func (h *Host) handleGen(op func(ctx context.Context, id string, gen int64) (ObjectInfo, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id := mux.Vars(r)["id"]
		b, err := h.readBody(w, r)
		if err != nil {
			writeErr(w, err)
			return
		}
		var req struct {
			RoutingGeneration int64 `json:"routing_generation"`
		}
		if len(b) > 0 {
			if err := json.Unmarshal(b, &req); err != nil {
				writeErr(w, fmt.Errorf("%w: %v", ErrInvalid, err))
				return
			}
		}
		if err := h.checkIdentity(r, id); err != nil {
			writeErr(w, err)
			return
		}
		info, err := op(r.Context(), id, req.RoutingGeneration)
		if err != nil {
			writeErr(w, err)
			return
		}
		v4.WriteResult(w, info)
	}
}

func (h *Host) handleInfo(w http.ResponseWriter, r *http.Request) {
	id := mux.Vars(r)["id"]
	if err := h.checkIdentity(r, id); err != nil {
		writeErr(w, err)
		return
	}
	info, err := h.Info(r.Context(), id)
	if err != nil {
		writeErr(w, err)
		return
	}
	v4.WriteResult(w, info)
}

func (h *Host) handleQuery(raw bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id := Identity{DatabaseUUID: r.Header.Get(HeaderDatabase), AccountID: r.Header.Get(HeaderAccount)}
		h.serveQuery(w, r, mux.Vars(r)["id"], id, raw)
	}
}

// handleBound serves a query carrying a binding token: the signature and
// expiry prove the edge issued the route; the object's own metadata must
// agree with the claims (database, account) and the generation must match,
// else 421 so the edge mints a fresh token.
func (h *Host) handleBound(raw bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		tok, err := binding.FromHeader(r.Header)
		if err != nil {
			writeErr(w, fmt.Errorf("%w: %v", ErrBinding, err))
			return
		}
		c, err := h.cfg.Bindings.Verify(tok, h.now())
		if err != nil {
			writeErr(w, fmt.Errorf("%w: %v", ErrBinding, err))
			return
		}
		if _, m, err := h.lookup(c.ObjectID); err == nil && !m.deleted() {
			if m.RoutingGeneration != c.Generation {
				writeErr(w, ErrWrongHost)
				return
			}
			if err := checkBinding(m, c); err != nil {
				writeErr(w, err)
				return
			}
		}
		h.serveQuery(w, r, c.ObjectID, Identity{DatabaseUUID: c.DatabaseUUID, AccountID: c.AccountID}, raw)
	}
}

func (h *Host) serveQuery(w http.ResponseWriter, r *http.Request, objectID string, id Identity, raw bool) {
	start := time.Now()
	h.m.queueDepth.Inc()
	defer h.m.queueDepth.Dec()
	// Admission per account (tenant.go), before the body is read: the
	// account is the object's own; an unknown object goes on to Query,
	// which refuses it.
	if _, m, err := h.lookup(objectID); err == nil {
		if err := h.tenant.admit(r.Context(), m.AccountID); err != nil {
			h.m.queryDone(outcome(err))
			writeErr(w, err)
			return
		}
		defer h.tenant.leave(m.AccountID)
	}
	lease := h.tenant.budget.Lease()
	defer lease.Release() // after the answer is written: its bytes are the results
	buf := h.bufs.Get().(*[]byte)
	defer func() {
		if cap(*buf) <= 1<<20 { // a huge result's buffer is left to the GC
			h.bufs.Put(buf)
		}
	}()
	res, err := h.query(w, r, objectID, id, raw, buf, lease)
	h.m.latency.Observe(time.Since(start).Seconds())
	h.m.queryDone(outcome(err))
	if err != nil {
		writeErr(w, err)
		return
	}
	writeResults(w, res, buf)
}

// writeResults writes the v4 envelope of a query's results in one Write
// with its Content-Length: the same bytes v4.WriteResult writes (test
// TestQueryEnvelopeBytes), without encoding/json's reflection and its
// re-validation of the rows' MarshalJSON output.
func writeResults(w http.ResponseWriter, res []sqlexec.StatementResult, buf *[]byte) {
	if largeResults(res) {
		// Written in parts: a large answer is held once, as its results,
		// not copied into the envelope (the result budget counts it once).
		b, parts := sqlexec.AppendResultsParts((*buf)[:0], `{"result":`, ",\"success\":true,\"errors\":[],\"messages\":[]}\n", res)
		*buf = b
		n := 0
		for _, p := range parts {
			n += len(p)
		}
		hdr := w.Header()
		hdr["Content-Type"] = []string{"application/json"}
		hdr["Content-Length"] = []string{strconv.Itoa(n)}
		w.WriteHeader(http.StatusOK)
		for _, p := range parts {
			if _, err := w.Write(p); err != nil {
				return
			}
		}
		return
	}
	b := append((*buf)[:0], `{"result":`...)
	b = sqlexec.AppendResults(b, res)
	b = append(b, ",\"success\":true,\"errors\":[],\"messages\":[]}\n"...)
	*buf = b
	hdr := w.Header()
	hdr["Content-Type"] = jsonContentType
	if !framed(w) { // frames delimit the answer themselves (frameResponse drops the header)
		hdr["Content-Length"] = []string{strconv.Itoa(len(b))}
	}
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(b)
}

// jsonContentType is the Content-Type value of every query answer, shared
// (read only: net/http and the frame encoder only read header values, and
// Header.Set replaces a slice rather than writing into it) instead of a
// new slice per answer.
var jsonContentType = []string{"application/json"}

// framed reports whether w writes to a frame stream (under apiHandler's
// recorder).
func framed(w http.ResponseWriter) bool {
	if rec, ok := w.(*failRecorder); ok {
		w = rec.ResponseWriter
	}
	_, ok := w.(*frameResponse)
	return ok
}

func (h *Host) query(w http.ResponseWriter, r *http.Request, objectID string, id Identity, raw bool, buf *[]byte, lease *sqlexec.ResultLease) ([]sqlexec.StatementResult, error) {
	b, err := h.readQueryBody(w, r, buf)
	if err != nil {
		return nil, err
	}
	req, err := sqlexec.ParseBody(b) // keeps no reference to b
	if err != nil {
		return nil, err
	}
	req.Raw = raw
	req.ReadOnly = r.Header.Get(HeaderReadOnly) == "1"
	// Results are encoded as they are read, counted exactly against the
	// per-request limit and the host's result budget (sqlexec).
	req.Encode, req.Lease = true, lease
	switch r.Header.Get(HeaderNumbers) {
	case "", "exact":
	case "js":
		req.JSNumbers = true
	default:
		return nil, fmt.Errorf("%w: header %s must be \"exact\" or \"js\"", ErrInvalid, HeaderNumbers)
	}
	return h.Query(r.Context(), objectID, id, req)
}

// readQueryBody is readBody into a reused buffer, sized from
// Content-Length when the client sent one.
func (h *Host) readQueryBody(w http.ResponseWriter, r *http.Request, buf *[]byte) ([]byte, error) {
	if r.ContentLength < 0 || r.ContentLength > h.cfg.MaxBodyBytes {
		return h.readBody(w, r) // unknown length, or refused with readBody's error
	}
	n := int(r.ContentLength)
	if cap(*buf) < n {
		*buf = make([]byte, n, max(n, 4096))
	}
	b := (*buf)[:n]
	if _, err := io.ReadFull(r.Body, b); err != nil {
		return nil, fmt.Errorf("%w: reading body: %v", ErrInvalid, err)
	}
	return b, nil
}

// largeResults reports whether an answer holds an encoded result worth
// not copying (writeResults).
func largeResults(res []sqlexec.StatementResult) bool {
	for i := range res {
		if e, ok := res[i].Results.(sqlexec.Encoded); ok && len(e) > 64<<10 {
			return true
		}
	}
	return false
}

// outcome is the metrics label of a query's result.
func outcome(err error) string {
	if err == nil {
		return "ok"
	}
	_, code, _ := statusOf(err)
	switch code {
	case v4.CodeSQL:
		return "sql_error"
	case v4.CodeNotFound:
		return "not_found"
	case v4.CodeDatabaseDeleted:
		return "deleted"
	case v4.CodeWrongHost:
		return "wrong_host"
	case v4.CodeOverloaded:
		return "overloaded"
	case v4.CodeTooLarge, v4.CodeStorageLimit, v4.CodeRowLimit, v4.CodeTimeout, v4.CodeInvalidRequest, v4.CodeRateLimited:
		return "limit"
	default:
		return "error"
	}
}
