package harness

import (
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/internal/pki"
)

// PKI is a test cluster's certificate authority (internal/pki) and the
// certificates it issued, in a temp dir: tests run the authenticated
// internal plane as a cluster does.
type PKI struct {
	dir, caDir string
}

// NewPKI creates a CA for t.
func NewPKI(t testing.TB) *PKI {
	t.Helper()
	p := &PKI{dir: t.TempDir()}
	p.caDir = filepath.Join(p.dir, "ca")
	_, err := pki.InitCA(p.caDir, "test CA", 24*time.Hour)
	require.NoError(t, err)
	return p
}

// Files issues (once) node's certificate with roles and returns its files.
func (p *PKI) Files(t testing.TB, node string, roles ...string) pki.Files {
	t.Helper()
	out := filepath.Join(p.dir, "nodes")
	f := pki.Files{CA: filepath.Join(out, "ca.crt"), Cert: filepath.Join(out, node+".crt"), Key: filepath.Join(out, node+".key")}
	if _, err := pki.NewLoader(f); err == nil {
		return f
	}
	f, err := pki.Issue(p.caDir, out, pki.IssueRequest{Node: node, Roles: roles, Validity: 24 * time.Hour}, false)
	require.NoError(t, err)
	return f
}

// Args are the --tls-* flags of node's certificate.
func (p *PKI) Args(t testing.TB, node string, roles ...string) []string {
	f := p.Files(t, node, roles...)
	return []string{"--tls-ca", f.CA, "--tls-cert", f.Cert, "--tls-key", f.Key}
}

// Loader loads node's certificate.
func (p *PKI) Loader(t testing.TB, node string, roles ...string) *pki.Loader {
	l, err := pki.NewLoader(p.Files(t, node, roles...))
	require.NoError(t, err)
	return l
}

// HTTPClient is an HTTP client presenting node's certificate, accepting any
// server of the cluster (use https:// URLs).
func (p *PKI) HTTPClient(t testing.TB, node string, roles ...string) *http.Client {
	return &http.Client{Timeout: 30 * time.Second, Transport: p.Loader(t, node, roles...).Transport(&http.Transport{})}
}

// FilesWithHosts issues (once) node's certificate with roles and with hosts
// (IP addresses or DNS names) as SANs, for peers that verify hostnames the
// way TLS clients usually do (etcd in the benchmarks); Shoal's own
// components check roles, not addresses.
func (p *PKI) FilesWithHosts(t testing.TB, node string, hosts []string, roles ...string) pki.Files {
	t.Helper()
	out := filepath.Join(p.dir, "nodes")
	f := pki.Files{CA: filepath.Join(out, "ca.crt"), Cert: filepath.Join(out, node+".crt"), Key: filepath.Join(out, node+".key")}
	if _, err := pki.NewLoader(f); err == nil {
		return f
	}
	f, err := pki.Issue(p.caDir, out, pki.IssueRequest{Node: node, Roles: roles, Validity: 24 * time.Hour, Hosts: hosts}, false)
	require.NoError(t, err)
	return f
}
