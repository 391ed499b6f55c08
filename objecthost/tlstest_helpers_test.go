package objecthost

import (
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/internal/pki"
	v4 "github.com/shoaldb/shoal/internal/v4"
)

// testCA makes a cluster CA for one test and returns what issues a
// certificate (loaded) for a node with roles from it.
func testCA(t *testing.T) func(node string, roles ...string) *pki.Loader {
	dir := t.TempDir()
	_, err := pki.InitCA(filepath.Join(dir, "ca"), "test", time.Hour)
	require.NoError(t, err)
	return func(node string, roles ...string) *pki.Loader {
		f, err := pki.Issue(filepath.Join(dir, "ca"), dir, pki.IssueRequest{Node: node, Roles: roles, Validity: time.Hour}, false)
		require.NoError(t, err)
		l, err := pki.NewLoader(f)
		require.NoError(t, err)
		return l
	}
}

// serveTLS serves th's handler under mutual TLS with hostTLS on a
// loopback port until the test ends, and returns the listener.
func serveTLS(t *testing.T, th *testHost, hostTLS *pki.Loader) net.Listener {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	hs := v4.NewServer(th.Handler(), v4.ServerOptions{})
	go func() { _ = hs.ServeWrapped(ln, hostTLS.Listen) }()
	t.Cleanup(func() { _ = hs.Close() })
	return ln
}
