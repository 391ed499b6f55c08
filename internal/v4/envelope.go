// Package v4 is Cloudflare's v4 API response envelope, shared by the edge
// (public D1-compatible API) and the object hosts (whose internal query API
// answers in the same shape so the edge can pass results through untouched).
//
// Every response, success or failure, is
//
//	{"result": …, "success": bool, "errors": [{"code": int, "message": string}], "messages": [...]}
//
// with result_info added on paginated lists. Clients rely on errors[0].code
// being a number and on 4xx statuses for client errors.
package v4

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"
)

// D1-style error codes. Where D1 documents a code we use it (7500 for SQL
// errors); the others follow D1's 7xxx numbering and are documented in
// docs/api.md. Codes are part of the API: never renumber.
const (
	CodeInternal          = 7000  // internal error; retry may succeed
	CodeInvalidRequest    = 7400  // malformed JSON, wrong types, bad params
	CodeUnauthorized      = 10000 // missing or invalid token (Cloudflare's auth code)
	CodeForbidden         = 7403  // token not allowed for this account or action
	CodeNotFound          = 7404  // database (or account) not found
	CodeNameTaken         = 7502  // a database with that name already exists
	CodeDatabaseLimit     = 7406  // account has reached its database limit
	CodeTooLarge          = 7413  // body, statement, row, value over a limit
	CodeRateLimited       = 7429  // rate limited; see Retry-After
	CodeSQL               = 7500  // SQL error, message carries SQLite's text
	CodeOverloaded        = 7501  // database queue full: too many concurrent requests
	CodeStorageLimit      = 7504  // account or database storage limit: writes that grow are blocked
	CodeRowLimit          = 7505  // daily rows read/written limit reached (free tier)
	CodeTimeout           = 7529  // query exceeded its time limit (interrupted, rolled back)
	CodeUnavailable       = 7503  // dependency unavailable (catalog down, breaker open): retryable
	CodeDatabaseDeleted   = 7410  // database was deleted
	CodeWrongHost         = 7421  // object host does not own this database (stale route)
	CodeTransactionDenied = 7500  // BEGIN/COMMIT refused: still a SQL error for D1 clients
)

// Error is one entry of the envelope's errors array.
type Error struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func (e *Error) Error() string { return strconv.Itoa(e.Code) + ": " + e.Message }

// ResultInfo accompanies paginated lists.
type ResultInfo struct {
	Page       int   `json:"page"`
	PerPage    int   `json:"per_page"`
	Count      int   `json:"count"`
	TotalCount int64 `json:"total_count"`
}

// Envelope is the v4 response body.
type Envelope struct {
	Result     any         `json:"result"`
	Success    bool        `json:"success"`
	Errors     []Error     `json:"errors"`
	Messages   []any       `json:"messages"`
	ResultInfo *ResultInfo `json:"result_info,omitempty"`
}

// WriteResult writes a successful envelope with status 200.
func WriteResult(w http.ResponseWriter, result any) {
	write(w, http.StatusOK, Envelope{Result: result, Success: true, Errors: []Error{}, Messages: []any{}})
}

// WriteList writes a successful paginated envelope.
func WriteList(w http.ResponseWriter, result any, info ResultInfo) {
	write(w, http.StatusOK, Envelope{Result: result, Success: true, Errors: []Error{}, Messages: []any{}, ResultInfo: &info})
}

// CodeRecorder is implemented by response writers that want to know the
// D1 error code of the answer (the edge's access log and request metrics
// label requests with it). WriteError tells them; a writer that wraps
// another passes the call on (or exposes the inner writer with Unwrap).
type CodeRecorder interface {
	RecordCode(code int)
}

// RecordCode tells w's CodeRecorder, if any (looking through Unwrap), the
// D1 error code of the answer being written.
func RecordCode(w http.ResponseWriter, code int) {
	for w != nil {
		if r, ok := w.(CodeRecorder); ok {
			r.RecordCode(code)
			return
		}
		u, ok := w.(interface{ Unwrap() http.ResponseWriter })
		if !ok {
			return
		}
		w = u.Unwrap()
	}
}

// WriteError writes a failed envelope. Messages must never carry internals
// (paths, stack traces): callers pass user-facing text.
func WriteError(w http.ResponseWriter, status int, code int, message string) {
	RecordCode(w, code)
	write(w, status, Envelope{Result: nil, Success: false, Errors: []Error{{Code: code, Message: message}}, Messages: []any{}})
}

// WriteRetryAfter writes a failed envelope with a Retry-After header.
func WriteRetryAfter(w http.ResponseWriter, status int, code int, message string, after time.Duration) {
	secs := int(after.Round(time.Second) / time.Second)
	if secs < 1 {
		secs = 1
	}
	w.Header().Set("Retry-After", strconv.Itoa(secs))
	WriteError(w, status, code, message)
}

func write(w http.ResponseWriter, status int, env Envelope) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	// D1 returns "<", ">" and "&" as they are; Go's default would escape
	// them as \u003c etc. (still valid JSON, but not byte-for-byte D1).
	enc.SetEscapeHTML(false)
	_ = enc.Encode(env)
}
