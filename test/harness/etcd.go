package harness

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/internal/pki"
)

// EtcdCluster is a three-member etcd (Debian's etcd-server, /usr/bin/etcd)
// on loopback, the peer the deployment benchmark measures Shoal against. It
// runs as Shoal does there: separate processes, mutual TLS between members
// and for clients (certificates of the test's CA, with 127.0.0.1 as a SAN:
// etcd checks hostnames), fsync on (etcd's default; nothing here turns it
// off).
type EtcdCluster struct {
	Procs     []*Proc
	Endpoints []string  // https://127.0.0.1:port of each member's client URL
	Client    pki.Files // a client certificate etcd accepts
	Dir       string    // the members' data directories are under it
}

// EtcdBin is the etcd server StartEtcd runs ($SHOAL_ETCD_BIN, else etcd on
// PATH), "" when there is none.
func EtcdBin() string {
	if b := os.Getenv("SHOAL_ETCD_BIN"); b != "" {
		return b
	}
	p, _ := exec.LookPath("etcd")
	return p
}

// StartEtcd starts the three members on the client and peer addresses
// (host:port, three of each) and returns once every member answers
// /health. A missing etcd skips t (SHOAL_DEPS_BENCH=1 ./scripts/deps.sh
// installs it), unless SHOAL_REQUIRE_ETCD=1, which fails it.
func StartEtcd(t testing.TB, p *PKI, clientAddrs, peerAddrs []string) *EtcdCluster {
	t.Helper()
	bin := EtcdBin()
	if bin == "" {
		if os.Getenv("SHOAL_REQUIRE_ETCD") == "1" {
			t.Fatal("etcd not installed (SHOAL_DEPS_BENCH=1 ./scripts/deps.sh installs Debian's etcd-server)")
		}
		t.Skip("etcd not installed (SHOAL_DEPS_BENCH=1 ./scripts/deps.sh installs Debian's etcd-server)")
	}
	require.Len(t, clientAddrs, 3)
	require.Len(t, peerAddrs, 3)
	c := &EtcdCluster{Dir: t.TempDir()}
	srv := p.FilesWithHosts(t, "etcd", []string{"127.0.0.1", "localhost"}, pki.RoleOperator)
	c.Client = p.FilesWithHosts(t, "etcd-client", []string{"127.0.0.1"}, pki.RoleOperator)
	var initial []string
	for i := range 3 {
		initial = append(initial, fmt.Sprintf("m%d=https://%s", i+1, peerAddrs[i]))
	}
	for i := range 3 {
		name := fmt.Sprintf("m%d", i+1)
		client, peer := "https://"+clientAddrs[i], "https://"+peerAddrs[i]
		c.Endpoints = append(c.Endpoints, client)
		c.Procs = append(c.Procs, StartProc(t, bin, "etcd-"+name,
			"--name", name, "--data-dir", filepath.Join(c.Dir, name),
			"--listen-client-urls", client, "--advertise-client-urls", client,
			"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
			"--initial-cluster", strings.Join(initial, ","), "--initial-cluster-state", "new",
			"--initial-cluster-token", "shoal-bench",
			"--client-cert-auth", "--trusted-ca-file", srv.CA, "--cert-file", srv.Cert, "--key-file", srv.Key,
			"--peer-client-cert-auth", "--peer-trusted-ca-file", srv.CA, "--peer-cert-file", srv.Cert, "--peer-key-file", srv.Key,
			"--logger", "zap", "--log-outputs", "stderr", "--log-level", "warn"))
	}
	hc := p.HTTPClient(t, "etcd-client")
	for i, e := range c.Endpoints {
		WaitHTTP200With(t, hc, e+"/health", 30*time.Second, "etcd member %d never healthy: %s", i+1, c.Procs[i].Log)
	}
	return c
}
