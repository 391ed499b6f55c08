package pki

import (
	"net"
	"net/http"

	v4 "github.com/shoaldb/shoal/internal/v4"
)

// Require lets a request through only if its TLS peer holds one of roles;
// otherwise 403 (401 without a verified certificate) in the v4 envelope. A
// nil Loader means the listener runs without TLS (insecure mode): every
// request passes.
func (l *Loader) Require(next http.Handler, roles ...string) http.Handler {
	if l == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, ok := PeerIdentity(r.TLS)
		switch {
		case !ok:
			v4.WriteError(w, http.StatusUnauthorized, v4.CodeUnauthorized, "internal endpoint: a cluster certificate is required")
		case !id.Has(roles...):
			v4.WriteError(w, http.StatusForbidden, v4.CodeForbidden, "internal endpoint: the caller's certificate roles do not allow this request")
		default:
			next.ServeHTTP(w, r)
		}
	})
}

// Listen wraps ln with the server configuration (nil Loader: ln as is).
func (l *Loader) Listen(ln net.Listener) net.Listener {
	if l == nil {
		return ln
	}
	return tlsListener(ln, l.Server())
}

// Transport is an http.Transport for calling servers of roles (nil
// Loader: plain HTTP).
func (l *Loader) Transport(base *http.Transport, roles ...string) *http.Transport {
	if l == nil {
		return base
	}
	t := base.Clone()
	t.TLSClientConfig = l.ClientFor(roles...)
	t.ForceAttemptHTTP2 = false
	return t
}

// Scheme is "https" with TLS, "http" without.
func (l *Loader) Scheme() string {
	if l == nil {
		return "http"
	}
	return "https"
}
