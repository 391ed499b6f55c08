package config

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestExampleClusterFileIsValid(t *testing.T) {
	t.Setenv("SHOAL_ADMIN_TOKEN", "admin-secret")
	t.Setenv("SHOAL_BINDING_KEY", "binding-secret")
	_, self, _, _ := runtime.Caller(0)
	c, err := Load(filepath.Join(filepath.Dir(self), "..", "..", "cluster.hcl"))
	require.NoError(t, err)
	assert.Len(t, c.Nodes, 3)
	assert.Equal(t, []string{"127.0.0.1:7101", "127.0.0.1:7102", "127.0.0.1:7103"}, c.CatalogAddrs("weur"))
	assert.Equal(t, "127.0.0.1:7103", c.CatalogAddrs("enam")[0], "nearby catalog nodes come first")
	assert.Equal(t, "admin-secret", c.Secrets.AdminToken)
	n3, err := c.Node("n3")
	require.NoError(t, err)
	assert.Equal(t, "us", n3.Jurisdiction)
	assert.True(t, n3.IsVoter())
	free, ok := c.Tier("free")
	require.True(t, ok)
	assert.EqualValues(t, 10, free.MaxDatabases)
}

func TestDefaults(t *testing.T) {
	c, err := Parse("c.hcl", []byte(`insecure = true
node "a" {
  roles = ["raftmeta"]
  raft_addr = "127.0.0.1:1"
  catalog_addr = "127.0.0.1:2"
}`))
	require.NoError(t, err)
	assert.Equal(t, "5s", c.Catalog.MaxStale)
	assert.Equal(t, "weur", c.Nodes[0].Region)
	assert.True(t, c.Kafka.Embedded)
	assert.True(t, c.ClickHouse.Managed)
	paid, ok := c.Tier("paid")
	require.True(t, ok)
	assert.EqualValues(t, 50_000, paid.MaxDatabases)
}

// node1 is a minimal valid node for cases about other blocks.
const node1 = `
node "a" {
  roles = ["raftmeta"]
  raft_addr = "127.0.0.1:1"
  catalog_addr = "127.0.0.1:2"
}
`

func TestErrorsNameFileLineAndField(t *testing.T) {
	cases := []struct {
		name, src, want string
	}{
		{"bad address", `
node "a" {
  roles = ["raftmeta"]
  raft_addr = "nope"
  catalog_addr = "127.0.0.1:2"
}`, `c.hcl:4: node "a": raft_addr: not a host:port address: "nope"`},
		{"missing address", `
node "a" {
  roles = ["raftmeta", "edge"]
  raft_addr = "127.0.0.1:1"
  catalog_addr = "127.0.0.1:2"
}`, `c.hcl:2: node "a": edge_addr: required for role edge`},
		{"edge debug address", `
node "a" {
  roles = ["raftmeta", "edge"]
  raft_addr = "127.0.0.1:1"
  catalog_addr = "127.0.0.1:2"
  edge_addr = "127.0.0.1:3"
  edge_debug_addr = "127.0.0.1:2"
}`, `c.hcl:7: node "a": edge_debug_addr: address 127.0.0.1:2 already used by a.catalog_addr`},
		{"unknown role", `
node "a" {
  roles = ["raftmeta", "chef"]
  raft_addr = "127.0.0.1:1"
  catalog_addr = "127.0.0.1:2"
}`, `c.hcl:3: node "a": roles: unknown role "chef"`},
		{"bad duration", `
catalog {
  max_stale = "soon"
}
node "a" {
  roles = ["raftmeta"]
  raft_addr = "127.0.0.1:1"
  catalog_addr = "127.0.0.1:2"
}`, `c.hcl:3: catalog: max_stale: not a positive duration: "soon"`},
		{"duplicate address", `
node "a" {
  roles = ["raftmeta"]
  raft_addr = "127.0.0.1:1"
  catalog_addr = "127.0.0.1:2"
}
node "b" {
  roles = ["raftmeta"]
  raft_addr = "127.0.0.1:1"
  catalog_addr = "127.0.0.1:3"
}`, `c.hcl:9: node "b": raft_addr: address 127.0.0.1:1 already used by a.raft_addr`},
		{"syntax", "node \"a\" {\n  roles = [\n", "c.hcl:"},
		{"unknown attribute", `
node "a" {
  roles = ["raftmeta"]
  raft_addr = "127.0.0.1:1"
  catalog_addr = "127.0.0.1:2"
  colour = "blue"
}`, `c.hcl:6: Unsupported argument`},
		{"no voter", `
node "a" {
  roles = ["raftmeta"]
  voter = false
  raft_addr = "127.0.0.1:1"
  catalog_addr = "127.0.0.1:2"
}`, `no voting raftmeta node`},
		{"unset env secret", `
node "a" {
  roles = ["raftmeta"]
  raft_addr = "127.0.0.1:1"
  catalog_addr = "127.0.0.1:2"
}
secrets {
  admin_token = "env:SHOAL_TEST_SURELY_UNSET"
}`, `c.hcl:8: secrets: admin_token: environment variable SHOAL_TEST_SURELY_UNSET is empty or unset`},
		{"pipeline role without address", `
node "a" {
  roles = ["raftmeta", "pipeline"]
  raft_addr = "127.0.0.1:1"
  catalog_addr = "127.0.0.1:2"
}`, `node "a": pipeline_addr: required for role pipeline`},
		{"unknown SASL mechanism", node1 + `
kafka {
  brokers = ["k:9092"]
  sasl_mechanism = "kerberos"
  sasl_user = "u"
}`, `kafka: sasl_mechanism: unknown mechanism "kerberos"`},
		{"SASL without user", node1 + `
kafka {
  brokers = ["k:9092"]
  sasl_mechanism = "plain"
}`, `kafka: sasl_user: required with sasl_mechanism`},
		{"embedded broker with two addresses", node1 + `
kafka {
  embedded = true
  brokers = ["127.0.0.1:1", "127.0.0.1:2"]
}`, `kafka: brokers: the embedded broker is one node`},
		{"client certificate without key", node1 + `
kafka {
  brokers = ["k:9092"]
  tls = true
  tls_cert_file = "/c.pem"
}`, `kafka: tls_cert_file: tls_cert_file and tls_key_file go together`},
		{"bad limiter interval", node1 + `
limiter {
  interval = "often"
}`, `limiter: interval: not a positive duration: "often"`},
		{"archive without a place", node1 + `
archive {
  durability = "archived"
}`, `archive: dir: give dir (a directory outside every data_dir) or bucket (S3)`},
		{"archive bucket without endpoint", node1 + `
archive {
  bucket = "b"
}`, `archive: endpoint: required with bucket`},
		{"archive bad durability", node1 + `
archive {
  dir = "/a"
  durability = "maybe"
}`, `archive: durability: default or archived, not "maybe"`},
		{"archive bad lag", node1 + `
archive {
  dir = "/a"
  max_lag = "soon"
}`, `archive: max_lag: not a positive duration: "soon"`},
		{"archive bad bucket sweep", node1 + `
archive {
  dir = "/a"
  bucket_sweep_interval = "daily"
}`, `archive: bucket_sweep_interval: not a positive duration: "daily"`},
		{"archive prefix", node1 + `
archive {
  endpoint = "s3:9000"
  bucket = "b"
  prefix = "p"
}`, `archive: prefix: must end in / (got "p")`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("c.hcl", []byte(tc.src))
			require.Error(t, err)
			assert.ErrorIs(t, err, ErrInvalid)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// TestTLSRequired: a cluster file names its certificates or says, in so
// many words, that it runs without them.
func TestTLSRequired(t *testing.T) {
	_, err := Parse("c.hcl", []byte(node1))
	require.ErrorIs(t, err, ErrInvalid)
	assert.Contains(t, err.Error(), "no tls block")
	_, err = Parse("c.hcl", []byte("insecure = true\ntls {\n  ca_file = \"ca.crt\"\n  cert_dir = \"pki\"\n}\n"+node1))
	require.ErrorIs(t, err, ErrInvalid)
	assert.Contains(t, err.Error(), "remove one")
	c, err := Parse("c.hcl", []byte("tls {\n  ca_file = \"/etc/shoal/ca.crt\"\n  cert_dir = \"/etc/shoal/pki\"\n}\n"+node1))
	require.NoError(t, err)
	ca, cert, key := c.NodeTLS("a")
	assert.Equal(t, []string{"/etc/shoal/ca.crt", "/etc/shoal/pki/a.crt", "/etc/shoal/pki/a.key"}, []string{ca, cert, key})
}

func TestLoadMissingFile(t *testing.T) {
	_, err := Load(filepath.Join(t.TempDir(), "absent.hcl"))
	require.Error(t, err)
	assert.ErrorIs(t, err, os.ErrNotExist)
}
