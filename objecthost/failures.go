package objecthost

import (
	"log/slog"
	"net/http"
)

// failRecorder is the response writer apiHandler hands every request: it
// keeps what the host logs about a server error (the host's 5xx are logged
// here, once, with their reason; the edge's access log has the rest).
type failRecorder struct {
	http.ResponseWriter
	status int
	code   int    // D1 error code written (v4.CodeRecorder)
	route  string // route template
	object string // the {id} of the route, if any
	reason error  // what writeErr was given
}

func (r *failRecorder) WriteHeader(status int) {
	r.status = status
	r.ResponseWriter.WriteHeader(status)
}

// RecordCode implements v4.CodeRecorder.
func (r *failRecorder) RecordCode(code int) { r.code = code }

// Unwrap gives http.ResponseController the underlying writer.
func (r *failRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

// recorderOf finds the request's failRecorder under w (nil outside
// apiHandler, e.g. a handler called directly by a unit test).
func recorderOf(w http.ResponseWriter) *failRecorder {
	for w != nil {
		if r, ok := w.(*failRecorder); ok {
			return r
		}
		u, ok := w.(interface{ Unwrap() http.ResponseWriter })
		if !ok {
			return nil
		}
		w = u.Unwrap()
	}
	return nil
}

// noteReason records why the answer written to w is an error; apiHandler
// logs it if the answer is a 5xx.
func noteReason(w http.ResponseWriter, err error) {
	if r := recorderOf(w); r != nil {
		r.reason = err
	}
}

// logFailure logs a 5xx answer once, with its reason and the edge's
// request id (X-Request-ID) so the two processes' lines join up.
func (h *Host) logFailure(r *http.Request, rec *failRecorder) {
	reason := "unknown"
	if rec.reason != nil {
		reason = rec.reason.Error()
	}
	route := rec.route
	if route == "" {
		route = "no_route"
	}
	h.log.LogAttrs(r.Context(), slog.LevelError, "request failed",
		slog.String("method", r.Method), slog.String("route", route), slog.String("object", rec.object), slog.Int("status", rec.status),
		slog.Int("code", rec.code), slog.String("request_id", r.Header.Get("X-Request-ID")),
		slog.String("err", reason))
}
