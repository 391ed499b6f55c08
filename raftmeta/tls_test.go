package raftmeta

import (
	"bytes"
	"context"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/internal/pki"
	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// TestCatalogMutualTLS: a 3-voter catalog whose Raft port and HTTP API run
// over mutual TLS (real Raft RPCs and joins over TLS, fsync on), and what
// each role may do: an edge reads and creates databases but cannot touch
// membership or backups; an object host registers itself but cannot mint
// tokens or create accounts; a caller without a certificate of the cluster
// gets nothing; an operator restores, joins and removes.
func TestCatalogMutualTLS(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	caDir := filepath.Join(dir, "ca")
	_, err := pki.InitCA(caDir, "test", time.Hour)
	require.NoError(t, err)
	loader := func(node string, roles ...string) *pki.Loader {
		f, err := pki.Issue(caDir, filepath.Join(dir, node), pki.IssueRequest{Node: node, Roles: roles, Validity: time.Hour}, false)
		require.NoError(t, err)
		l, err := pki.NewLoader(f)
		require.NoError(t, err)
		return l
	}
	voters := []*pki.Loader{loader("n0", pki.RoleCatalog), loader("n1", pki.RoleCatalog), loader("n2", pki.RoleCatalog)}
	tc := newTestCluster(t, 3, func(i int, c *Config) { c.TLS = voters[i] })
	leader := tc.waitLeader()
	require.NotNil(t, leader)

	client := func(l *pki.Loader) *Client {
		c, err := NewClient(tc.addrs(), WithTLS(l), WithCacheTTL(0), WithRetries(2, 10*time.Millisecond, 50*time.Millisecond))
		require.NoError(t, err)
		t.Cleanup(c.Close)
		return c
	}
	edge := client(loader("e1", pki.RoleEdge))
	host := client(loader("h1", pki.RoleHost))
	op := loader("ops", pki.RoleOperator)
	operator := client(op)

	// The edge's admin API creates accounts and tokens; it creates databases.
	_, err = edge.CreateAccount(ctx, newAccount("a1", 10))
	require.NoError(t, err)
	_, err = host.RegisterHost(ctx, fsm.RegisterHost{ID: "h1", Address: "127.0.0.1:1", State: fsm.HostStateActive})
	require.NoError(t, err, "a host registers itself")
	d, err := edge.CreateDatabase(ctx, newDB("a1"))
	require.NoError(t, err)
	got, err := edge.Database(ctx, d.UUID, LinearizableRead())
	require.NoError(t, err)
	assert.Equal(t, d.UUID, got.UUID)
	_, err = host.Heartbeat(ctx, []string{d.UUID}, StaleRead())
	require.NoError(t, err)

	// A host may not mint tokens, create accounts or databases.
	_, err = host.CreateToken(ctx, fsm.CreateToken{ID: "t1", AccountID: "a1", Hash: "0000000000000000000000000000000000000000000000000000000000000001", Name: "x", Admin: true})
	require.ErrorIs(t, err, ErrForbidden)
	_, err = host.CreateAccount(ctx, newAccount("rogue", 1<<30))
	require.ErrorIs(t, err, ErrForbidden)
	_, err = host.TokenByHash(ctx, "0000000000000000000000000000000000000000000000000000000000000001", LinearizableRead())
	require.ErrorIs(t, err, ErrForbidden, "token records are the edges'")
	// An edge may not register hosts.
	_, err = edge.RegisterHost(ctx, fsm.RegisterHost{ID: "rogue", Address: "10.0.0.66:1", State: fsm.HostStateActive})
	require.ErrorIs(t, err, ErrForbidden)

	// Membership and backups: operators only.
	var buf bytes.Buffer
	_, _, err = NewAdmin(leader.HTTPAddr(), 5*time.Second, voters[0]).Backup(ctx, &buf)
	require.Error(t, err, "a voter's certificate is not an operator's")
	_, _, err = NewAdmin(leader.HTTPAddr(), 5*time.Second, op).Backup(ctx, &buf)
	require.NoError(t, err)
	st, err := NewAdmin(leader.HTTPAddr(), 5*time.Second, op).Status(ctx)
	require.NoError(t, err)
	assert.Len(t, st.Members, 3)
	_, err = operator.Hosts(ctx, LinearizableRead())
	require.NoError(t, err)

	// No certificate, or plain HTTP: nothing.
	resp, err := (&http.Client{Timeout: 2 * time.Second}).Get("http://" + leader.HTTPAddr() + "/v1/hosts")
	if err == nil {
		resp.Body.Close()
		assert.NotEqual(t, http.StatusOK, resp.StatusCode)
	}
	plain, err := NewClient(tc.addrs(), WithCacheTTL(0), WithRetries(1, time.Millisecond, time.Millisecond))
	require.NoError(t, err)
	defer plain.Close()
	_, err = plain.Hosts(ctx, LinearizableRead())
	require.Error(t, err)

	// A node with a certificate of the edge role cannot join as a voter.
	bad := testConfig(t, "rogue", t.TempDir())
	bad.TLS = loader("rogue", pki.RoleEdge)
	bad.Join = []string{leader.HTTPAddr()}
	bad.JoinTimeout = 2 * time.Second
	n, err := NewNode(bad)
	if err == nil {
		n.Close()
		t.Fatal("a node without the catalog role joined")
	}
}
