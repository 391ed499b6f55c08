package profiling

import (
	"io"
	"net"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/internal/pki"
)

// serve runs h behind the cluster's mutual TLS, as a role's internal
// listener does, and returns its https:// base URL.
func serve(t *testing.T, l *pki.Loader, h http.Handler) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(l.Listen(ln)) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "https://" + ln.Addr().String()
}

func get(t *testing.T, hc *http.Client, url string) (int, []byte) {
	resp, err := hc.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, b
}

// TestProfilesForOperatorsOnly: over mutual TLS, an operator's certificate
// gets a CPU profile and the heap profile; a certificate of another role
// is refused (403) before any profile is taken, and so is a request with
// no certificate at a listener that does not demand one (401); other paths
// go to the wrapped handler.
func TestProfilesForOperatorsOnly(t *testing.T) {
	dir := t.TempDir()
	caDir := filepath.Join(dir, "ca")
	_, err := pki.InitCA(caDir, "test", time.Hour)
	require.NoError(t, err)
	loader := func(node string, roles ...string) *pki.Loader {
		f, err := pki.Issue(caDir, filepath.Join(dir, "out"), pki.IssueRequest{Node: node, Roles: roles, Validity: time.Hour}, false)
		require.NoError(t, err)
		l, err := pki.NewLoader(f)
		require.NoError(t, err)
		return l
	}
	server := loader("n1", pki.RoleCatalog)
	client := func(l *pki.Loader) *http.Client {
		return &http.Client{Timeout: 30 * time.Second, Transport: l.Transport(&http.Transport{})}
	}
	ops, edge := client(loader("ops", pki.RoleOperator)), client(loader("e1", pki.RoleEdge))
	app := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "app") })
	base := serve(t, server, Wrap(app, true))

	code, body := get(t, ops, base+Prefix+"profile?seconds=1")
	require.Equal(t, http.StatusOK, code, "%s", body)
	require.Greater(t, len(body), 2)
	assert.Equal(t, []byte{0x1f, 0x8b}, body[:2], "a CPU profile is gzipped protobuf")
	code, body = get(t, ops, base+Prefix+"heap")
	require.Equal(t, http.StatusOK, code)
	assert.Equal(t, []byte{0x1f, 0x8b}, body[:2])
	code, body = get(t, ops, base+Prefix)
	require.Equal(t, http.StatusOK, code)
	assert.Contains(t, string(body), "goroutine")

	for _, p := range []string{"", "profile?seconds=1", "heap", "goroutine?debug=2", "cmdline", "trace?seconds=1"} {
		code, body = get(t, edge, base+Prefix+p)
		assert.Equal(t, http.StatusForbidden, code, "edge certificate, %s: %s", p, body)
		assert.NotContains(t, string(body), "goroutine")
	}
	code, body = get(t, edge, base+"/v1/other")
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, "app", string(body))

	// A handler reached without a client certificate (a listener that does
	// not demand one) refuses too.
	plainLn, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	plain := &http.Server{Handler: Handler(true), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = plain.Serve(plainLn) }()
	t.Cleanup(func() { _ = plain.Close() })
	code, _ = get(t, http.DefaultClient, "http://"+plainLn.Addr().String()+Prefix+"heap")
	assert.Equal(t, http.StatusUnauthorized, code)

	// Without TLS (an insecure cluster) every internal endpoint answers
	// anyone, profiles included.
	code, _ = get(t, http.DefaultClient, serveInsecure(t, Wrap(app, false))+Prefix+"heap")
	assert.Equal(t, http.StatusOK, code)
}

func serveInsecure(t *testing.T, h http.Handler) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "http://" + ln.Addr().String()
}
