// Package pki is the cluster's internal authentication: a certificate
// authority the operator creates (`shoal cluster ca init`), node
// certificates it issues (`shoal cluster cert issue --node ID --roles …`),
// and the TLS configurations with which every internal listener and client
// authenticates its peer (mutual TLS) and learns its roles. It uses only the
// Go standard library's crypto (ECDSA P-256 keys, X.509, crypto/tls).
//
// Identity is the certificate, not the address: a certificate carries its
// node ID and roles as URI SANs (shoal://node/<id>, shoal://role/<role>),
// servers authorise each request by the caller's roles (Require), and
// clients check that the server holds the role they meant to reach
// (ClientFor). Addresses are not checked (no hostname verification): nodes
// move between addresses and the roles say what a peer may be. A stolen
// key of role R lets its holder act as any node of role R until its
// certificate expires or the CA is rotated.
//
// Rotation without downtime: certificates and the CA bundle are re-read
// from their files when they change (checked at most once per second, on
// the next handshake), so an operator replaces files in place. To rotate
// the CA: append the new CA to every node's bundle, reissue node
// certificates from the new CA, then drop the old CA from the bundles.
package pki

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
)

// Roles a certificate may carry.
const (
	RoleCatalog  = "catalog"  // a catalog voter: Raft, join, catalog-to-catalog calls
	RoleHost     = "host"     // an object host
	RoleEdge     = "edge"     // an edge: the public API's server
	RolePipeline = "pipeline" // the background plane's consumers
	RoleLimiter  = "limiter"  // the free-tier limiter
	RoleOperator = "operator" // shoal cluster …, shoal admin: restore, join, remove, snapshot, lost hosts
)

// AllRoles is every role, in a stable order.
var AllRoles = []string{RoleCatalog, RoleHost, RoleEdge, RolePipeline, RoleLimiter, RoleOperator}

const (
	uriScheme  = "shoal"
	nodeHost   = "node"
	roleHost   = "role"
	caFile     = "ca.crt"
	caKeyFile  = "ca.key"
	reloadTick = time.Second
)

// ErrExists is returned when InitCA or Issue would overwrite a file.
var ErrExists = errors.New("pki: file exists")

// Files names a node's credentials: the CA bundle (one or more CA
// certificates, PEM) it trusts, and its certificate and key (PEM).
type Files struct {
	CA, Cert, Key string
}

// Enabled reports whether any file is named.
func (f Files) Enabled() bool { return f.CA != "" || f.Cert != "" || f.Key != "" }

// Check reports a partial set.
func (f Files) Check() error {
	if !f.Enabled() {
		return nil
	}
	var missing []string
	for _, p := range [][2]string{{"ca", f.CA}, {"cert", f.Cert}, {"key", f.Key}} {
		if p[1] == "" {
			missing = append(missing, p[0])
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("tls: %s not set (give ca, cert and key together)", strings.Join(missing, ", "))
	}
	return nil
}

// InitCA creates a certificate authority in dir: ca.crt (the certificate
// every node trusts) and ca.key (0600; keep it off the nodes).
func InitCA(dir, name string, validity time.Duration) (string, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	crtPath, keyPath := filepath.Join(dir, caFile), filepath.Join(dir, caKeyFile)
	for _, p := range []string{crtPath, keyPath} {
		if _, err := os.Stat(p); err == nil {
			return "", fmt.Errorf("%w: %s", ErrExists, p)
		}
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: name, Organization: []string{"shoal"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return "", err
	}
	if err := writePEMKey(keyPath, key); err != nil {
		return "", err
	}
	if err := writeFile(crtPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return "", err
	}
	return crtPath, nil
}

// IssueRequest describes a node certificate.
type IssueRequest struct {
	Node     string   // node ID (n1, h1, e1, an operator's name)
	Roles    []string // from AllRoles
	Validity time.Duration
	// Hosts are optional DNS names and IP addresses added as SANs, for
	// tools that verify hostnames (Shoal's own clients check roles, not
	// addresses).
	Hosts []string
}

// Issue signs a certificate for r with the CA in caDir and writes
// <outDir>/<node>.crt and <node>.key (0600). It refuses to overwrite
// unless overwrite (reissue for rotation).
func Issue(caDir, outDir string, r IssueRequest, overwrite bool) (Files, error) {
	if r.Node == "" || strings.ContainsAny(r.Node, "/\\ \t\n") || len(r.Node) > 64 {
		return Files{}, fmt.Errorf("pki: node id %q: 1..64 characters, no slash or space", r.Node)
	}
	if len(r.Roles) == 0 {
		return Files{}, errors.New("pki: at least one role")
	}
	for _, role := range r.Roles {
		if !slices.Contains(AllRoles, role) {
			return Files{}, fmt.Errorf("pki: unknown role %q (roles: %s)", role, strings.Join(AllRoles, ", "))
		}
	}
	caCert, caKey, err := loadCA(caDir)
	if err != nil {
		return Files{}, err
	}
	out := Files{CA: filepath.Join(outDir, caFile), Cert: filepath.Join(outDir, r.Node+".crt"), Key: filepath.Join(outDir, r.Node+".key")}
	if !overwrite {
		for _, p := range []string{out.Cert, out.Key} {
			if _, err := os.Stat(p); err == nil {
				return Files{}, fmt.Errorf("%w: %s (reissue with --force)", ErrExists, p)
			}
		}
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Files{}, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: r.Node, Organization: []string{"shoal"}, OrganizationalUnit: r.Roles},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(r.Validity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		URIs:         []*url.URL{{Scheme: uriScheme, Host: nodeHost, Path: "/" + r.Node}},
	}
	roles := slices.Clone(r.Roles)
	sort.Strings(roles)
	for _, role := range slices.Compact(roles) {
		tmpl.URIs = append(tmpl.URIs, &url.URL{Scheme: uriScheme, Host: roleHost, Path: "/" + role})
	}
	for _, h := range r.Hosts {
		if ip := parseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	if tmpl.NotAfter.After(caCert.NotAfter) {
		tmpl.NotAfter = caCert.NotAfter
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		return Files{}, err
	}
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return Files{}, err
	}
	if err := writePEMKey(out.Key, key); err != nil {
		return Files{}, err
	}
	if err := writeFile(out.Cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return Files{}, err
	}
	caPEM, err := os.ReadFile(filepath.Join(caDir, caFile))
	if err != nil {
		return Files{}, err
	}
	if _, err := os.Stat(out.CA); err != nil || overwrite {
		// The bundle next to the node's files; an existing one is kept
		// (it may hold two CAs during a rotation) unless reissuing.
		if existing, rerr := os.ReadFile(out.CA); rerr == nil && bytes.Contains(existing, caPEM) {
			return out, nil
		}
		if err := writeFile(out.CA, caPEM, 0o644); err != nil {
			return Files{}, err
		}
	}
	return out, nil
}

// Identity is what a peer's certificate says.
type Identity struct {
	Node  string
	Roles []string
}

// Has reports whether the identity holds any of roles.
func (id Identity) Has(roles ...string) bool {
	for _, r := range roles {
		if slices.Contains(id.Roles, r) {
			return true
		}
	}
	return false
}

// IdentityOf reads a certificate's node and roles (empty if it has none).
func IdentityOf(c *x509.Certificate) Identity {
	var id Identity
	for _, u := range c.URIs {
		if u.Scheme != uriScheme {
			continue
		}
		v := strings.TrimPrefix(u.Path, "/")
		switch u.Host {
		case nodeHost:
			id.Node = v
		case roleHost:
			id.Roles = append(id.Roles, v)
		}
	}
	return id
}

// PeerIdentity is the identity of a TLS connection's verified peer.
func PeerIdentity(cs *tls.ConnectionState) (Identity, bool) {
	if cs == nil || len(cs.PeerCertificates) == 0 {
		return Identity{}, false
	}
	return IdentityOf(cs.PeerCertificates[0]), true
}

// Loader holds a node's credentials, re-read when their files change.
// Safe for concurrent use.
type Loader struct {
	f Files

	mu      sync.Mutex
	checked time.Time
	mtimes  [3]time.Time
	cert    *tls.Certificate
	pool    *x509.CertPool
	err     error
}

// NewLoader loads f (all three files must be set and valid).
func NewLoader(f Files) (*Loader, error) {
	if err := f.Check(); err != nil {
		return nil, err
	}
	if !f.Enabled() {
		return nil, errors.New("tls: no files")
	}
	l := &Loader{f: f}
	if err := l.reload(true); err != nil {
		return nil, err
	}
	return l, nil
}

// Identity is this node's own identity.
func (l *Loader) Identity() Identity {
	cert, _, _ := l.current()
	if cert == nil || cert.Leaf == nil {
		return Identity{}
	}
	return IdentityOf(cert.Leaf)
}

func (l *Loader) current() (*tls.Certificate, *x509.CertPool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if time.Since(l.checked) >= reloadTick {
		_ = l.reloadLocked(false) // a bad new file keeps the last good credentials
	}
	return l.cert, l.pool, l.err
}

func (l *Loader) reload(force bool) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.reloadLocked(force)
}

func (l *Loader) reloadLocked(force bool) error {
	l.checked = time.Now()
	var mt [3]time.Time
	for i, p := range []string{l.f.CA, l.f.Cert, l.f.Key} {
		st, err := os.Stat(p)
		if err != nil {
			if force {
				return fmt.Errorf("tls: %w", err)
			}
			return nil
		}
		mt[i] = st.ModTime()
	}
	if !force && mt == l.mtimes {
		return nil
	}
	cert, err := tls.LoadX509KeyPair(l.f.Cert, l.f.Key)
	if err != nil {
		if force {
			return fmt.Errorf("tls: load %s and %s: %w", l.f.Cert, l.f.Key, err)
		}
		return nil
	}
	caPEM, err := os.ReadFile(l.f.CA)
	if err != nil {
		return fmt.Errorf("tls: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		if force {
			return fmt.Errorf("tls: %s holds no PEM certificate", l.f.CA)
		}
		return nil
	}
	if _, err := cert.Leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		if force {
			return fmt.Errorf("tls: %s is not signed by a CA in %s: %w", l.f.Cert, l.f.CA, err)
		}
		return nil
	}
	l.cert, l.pool, l.mtimes = &cert, pool, mt
	return nil
}

// verify checks a peer's chain against the current CA bundle, for use
// (key usage usage) and, when roles is not empty, that it holds one of
// them.
func (l *Loader) verify(cs tls.ConnectionState, usage x509.ExtKeyUsage, roles []string) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("tls: the peer presented no certificate (internal endpoints need a cluster certificate)")
	}
	_, pool, _ := l.current()
	inter := x509.NewCertPool()
	for _, c := range cs.PeerCertificates[1:] {
		inter.AddCert(c)
	}
	leaf := cs.PeerCertificates[0]
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
		return fmt.Errorf("tls: peer certificate not issued by this cluster's CA: %w", err)
	}
	if len(roles) > 0 {
		id := IdentityOf(leaf)
		if !id.Has(roles...) {
			return fmt.Errorf("tls: peer %q has roles %v, want one of %v", id.Node, id.Roles, roles)
		}
	}
	return nil
}

// Server is the configuration of an internal listener: a client
// certificate from this cluster's CA is required (any role: handlers
// authorise by role with Require).
func (l *Loader) Server() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		// No session tickets: a TLS 1.3 server sends them after the
		// handshake, and those unread bytes would make an idle pooled
		// connection look out of step to a client that peeks at its socket
		// (the edge's host pool). Every connection is long-lived anyway.
		SessionTicketsDisabled: true,
		ClientAuth:             tls.RequireAnyClientCert, // verified below, against the current bundle
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			c, _, _ := l.current()
			return c, nil
		},
		VerifyConnection: func(cs tls.ConnectionState) error {
			return l.verify(cs, x509.ExtKeyUsageClientAuth, nil)
		},
	}
}

// ClientFor is the configuration of a client calling servers that hold one
// of roles (e.g. RoleHost for an edge calling object hosts).
func (l *Loader) ClientFor(roles ...string) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		// The chain and the role are verified in VerifyConnection against
		// the current bundle (which may change at run time); addresses
		// are not identities here (see the package comment).
		InsecureSkipVerify: true, //nolint:gosec // verified in VerifyConnection
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			c, _, _ := l.current()
			return c, nil
		},
		VerifyConnection: func(cs tls.ConnectionState) error {
			return l.verify(cs, x509.ExtKeyUsageServerAuth, roles)
		},
	}
}

func loadCA(dir string) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	crtPEM, err := os.ReadFile(filepath.Join(dir, caFile))
	if err != nil {
		return nil, nil, fmt.Errorf("pki: CA certificate: %w (create one with shoal cluster ca init)", err)
	}
	keyPEM, err := os.ReadFile(filepath.Join(dir, caKeyFile))
	if err != nil {
		return nil, nil, fmt.Errorf("pki: CA key: %w", err)
	}
	cb, _ := pem.Decode(crtPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return nil, nil, errors.New("pki: CA files are not PEM")
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, nil, err
	}
	key, err := x509.ParseECPrivateKey(kb.Bytes)
	if err != nil {
		return nil, nil, err
	}
	return cert, key, nil
}

func writePEMKey(path string, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	return writeFile(path, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), 0o600)
}

// writeFile writes atomically (temp file, fsync, rename): a node reloading
// credentials never reads half a file.
func writeFile(path string, b []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-"+filepath.Base(path))
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand never fails on supported platforms
	}
	return n
}
