package pki

import (
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func issue(t *testing.T, caDir, out, node string, roles ...string) *Loader {
	t.Helper()
	f, err := Issue(caDir, out, IssueRequest{Node: node, Roles: roles, Validity: time.Hour}, true)
	require.NoError(t, err)
	l, err := NewLoader(f)
	require.NoError(t, err)
	return l
}

// serveRoles serves, over real TLS on loopback, a handler that needs one of
// roles, and returns its URL.
func serveRoles(t *testing.T, l *Loader, roles ...string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &http.Server{Handler: l.Require(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, _ := PeerIdentity(r.TLS)
		_, _ = w.Write([]byte(id.Node))
	}), roles...)}
	go func() { _ = srv.Serve(l.Listen(ln)) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "https://" + ln.Addr().String() + "/x"
}

func get(c *http.Client, url string) (int, error) {
	resp, err := c.Get(url)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

// TestMutualTLSRoles: real TLS handshakes on loopback between certificates
// of one CA: the right role passes, a wrong role is 403, no certificate or
// one from another CA never gets past the handshake, a client refuses a
// server without the role it expects, and rotated files (a reissued
// certificate, a second CA in the bundle) take effect without a restart.
func TestMutualTLSRoles(t *testing.T) {
	dir := t.TempDir()
	caDir := filepath.Join(dir, "ca")
	_, err := InitCA(caDir, "test", 24*time.Hour)
	require.NoError(t, err)
	_, err = InitCA(caDir, "test", 24*time.Hour)
	require.ErrorIs(t, err, ErrExists, "a CA is never overwritten")

	host := issue(t, caDir, filepath.Join(dir, "h1"), "h1", RoleHost)
	edgeL := issue(t, caDir, filepath.Join(dir, "e1"), "e1", RoleEdge)
	pipe := issue(t, caDir, filepath.Join(dir, "p1"), "p1", RolePipeline)
	assert.Equal(t, Identity{Node: "e1", Roles: []string{RoleEdge}}, edgeL.Identity())

	url := serveRoles(t, host, RoleEdge, RoleOperator)
	client := func(l *Loader, roles ...string) *http.Client {
		return &http.Client{Timeout: 5 * time.Second, Transport: l.Transport(&http.Transport{}, roles...)}
	}
	code, err := get(client(edgeL, RoleHost), url)
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, code)
	code, err = get(client(pipe, RoleHost), url)
	require.NoError(t, err)
	assert.Equal(t, http.StatusForbidden, code, "a valid certificate of the wrong role")
	_, err = get(client(edgeL, RoleCatalog), url)
	assert.ErrorContains(t, err, "want one of [catalog]", "the client checks the server's role")

	// No certificate at all.
	noCert := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: edgeL.ClientFor(RoleHost)}}
	noCert.Transport.(*http.Transport).TLSClientConfig.GetClientCertificate = nil
	_, err = get(noCert, url)
	assert.Error(t, err)

	// Another cluster's CA.
	otherCA := filepath.Join(dir, "other-ca")
	_, err = InitCA(otherCA, "other", time.Hour)
	require.NoError(t, err)
	stranger := issue(t, otherCA, filepath.Join(dir, "x"), "x", RoleEdge, RoleOperator)
	_, err = get(client(stranger), url)
	assert.Error(t, err, "a certificate of another CA")

	// Rotation: the host's certificate reissued in place;
	// then a second CA appended to the host's bundle admits its certs.
	_, err = Issue(caDir, filepath.Join(dir, "h1"), IssueRequest{Node: "h1", Roles: []string{RoleHost}, Validity: time.Hour}, true)
	require.NoError(t, err)
	bundle := filepath.Join(dir, "h1", "ca.crt")
	b1, err := os.ReadFile(bundle)
	require.NoError(t, err)
	b2, err := os.ReadFile(filepath.Join(otherCA, "ca.crt"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(bundle, append(b1, b2...), 0o644))
	later := time.Now().Add(2 * time.Second)
	os.Chtimes(bundle, later, later)
	// The stranger trusts only its own CA; give it the host's too.
	sb := filepath.Join(dir, "x", "ca.crt")
	require.NoError(t, os.WriteFile(sb, append(b2, b1...), 0o644))
	os.Chtimes(sb, later, later)
	// Each loader rereads its files at its next use after reloadTick:
	// asked until both have (not slept past the tick); a loader that
	// never reloads fails here.
	require.Eventually(t, func() bool {
		code, err = get(client(stranger, RoleHost), url)
		return err == nil && code == http.StatusOK
	}, 30*time.Second, 100*time.Millisecond, "the new CA in the bundle is trusted without a restart")
}

func TestIssueValidation(t *testing.T) {
	dir := t.TempDir()
	_, err := Issue(dir, dir, IssueRequest{Node: "n1", Roles: []string{RoleEdge}, Validity: time.Hour}, false)
	require.ErrorContains(t, err, "ca init")
	_, err = InitCA(dir, "t", time.Hour)
	require.NoError(t, err)
	_, err = Issue(dir, dir, IssueRequest{Node: "n1", Roles: []string{"root"}, Validity: time.Hour}, false)
	require.ErrorContains(t, err, "unknown role")
	_, err = Issue(dir, dir, IssueRequest{Node: "a/b", Roles: []string{RoleEdge}, Validity: time.Hour}, false)
	require.Error(t, err)
	_, err = Issue(dir, dir, IssueRequest{Node: "n1", Validity: time.Hour}, false)
	require.Error(t, err)
	f, err := Issue(dir, filepath.Join(dir, "out"), IssueRequest{Node: "n1", Roles: []string{RoleEdge}, Validity: time.Hour}, false)
	require.NoError(t, err)
	_, err = Issue(dir, filepath.Join(dir, "out"), IssueRequest{Node: "n1", Roles: []string{RoleEdge}, Validity: time.Hour}, false)
	require.ErrorIs(t, err, ErrExists)
	st, err := os.Stat(f.Key)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), st.Mode().Perm())
	require.Error(t, Files{CA: "x"}.Check())
}
