// Package profiling serves the Go runtime's profiles (net/http/pprof) under
// /debug/pprof/ on every role's internal listener, for operators only: with
// cluster TLS on, the caller must present a certificate of the cluster's CA
// carrying the operator role (shoal cluster cert issue --roles operator);
// without TLS (--insecure) it answers whoever reaches the listener, as every
// internal endpoint then does. It is never mounted on the edge's public D1
// API: the edge serves it on its own --debug-addr listener.
package profiling

import (
	"net/http"
	"net/http/pprof"
	"strings"

	"github.com/shoaldb/shoal/internal/pki"
	v4 "github.com/shoaldb/shoal/internal/v4"
)

// Prefix is the path every profile is served under.
const Prefix = "/debug/pprof/"

// Handler serves /debug/pprof/ (the index, cmdline, profile, symbol, trace
// and every runtime profile by name: heap, goroutine, allocs, block, mutex,
// threadcreate). With tlsOn, a caller without the operator role is refused
// (401 without a client certificate, 403 with another role) before any
// profile is taken. Safe for concurrent use.
func Handler(tlsOn bool) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc(Prefix, pprof.Index) // named profiles: /debug/pprof/heap …
	mux.HandleFunc(Prefix+"cmdline", pprof.Cmdline)
	mux.HandleFunc(Prefix+"profile", pprof.Profile)
	mux.HandleFunc(Prefix+"symbol", pprof.Symbol)
	mux.HandleFunc(Prefix+"trace", pprof.Trace)
	if !tlsOn {
		return mux
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, ok := pki.PeerIdentity(r.TLS)
		if !ok {
			v4.WriteError(w, http.StatusUnauthorized, v4.CodeUnauthorized, "profiles: a cluster certificate is required")
			return
		}
		if !id.Has(pki.RoleOperator) {
			v4.WriteError(w, http.StatusForbidden, v4.CodeForbidden, "profiles: the operator role is required")
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// Wrap serves Prefix with Handler(tlsOn) and everything else with h.
func Wrap(h http.Handler, tlsOn bool) http.Handler {
	p := Handler(tlsOn)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, Prefix) {
			p.ServeHTTP(w, r)
			return
		}
		h.ServeHTTP(w, r)
	})
}
