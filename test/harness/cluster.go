package harness

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/edge"
	"github.com/shoaldb/shoal/internal/binding"
	"github.com/shoaldb/shoal/objecthost"
	"github.com/shoaldb/shoal/raftmeta"
	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// E2ECluster is raftmeta ×3, objecthost ×2 and edge ×2 in one process, over
// real loopback TCP, with real Raft (fsync) and real SQLite files, as
// NewE2ECluster starts it. Index i of each slice is the same node, host or
// edge throughout.
type E2ECluster struct {
	CatCfgs  []raftmeta.Config // the catalog nodes' configurations, which RestartCatalog reuses
	CatNodes []*raftmeta.Node
	CatAddrs []string // the catalog nodes' HTTP addresses
	Hosts    []*objecthost.Host
	HostAddr []string // host:port the hosts serve on
	Edges    []*edge.Server
	EdgeURL  []string // http://host:port of each edge
	Keys     *binding.Keyring
	Admin    string // the edges' admin token
}

// NewE2ECluster starts the cluster for t and returns once the catalog has a
// leader and both object hosts (regions weur and enam, capacity 1,000) have
// registered. Everything is closed when t ends. The edges run with a 1 s
// token TTL (so an outage outlives it) and rate limits out of the way.
func NewE2ECluster(t testing.TB) *E2ECluster {
	c := &E2ECluster{Admin: "e2e-admin-token"}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	for i := 0; i < 3; i++ {
		cfg := raftmeta.Config{ID: fmt.Sprintf("c%d", i), Dir: t.TempDir(), RaftAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
			Logger: quiet, RaftLogOutput: io.Discard, JoinTimeout: 30 * time.Second}
		if i == 0 {
			cfg.Bootstrap = true
		} else {
			cfg.Join = []string{c.CatAddrs[0]}
		}
		n, err := raftmeta.NewNode(cfg)
		require.NoError(t, err)
		c.CatCfgs = append(c.CatCfgs, cfg)
		c.CatNodes = append(c.CatNodes, n)
		c.CatAddrs = append(c.CatAddrs, n.HTTPAddr())
		if i == 0 {
			require.Eventually(t, n.IsLeader, 20*time.Second, 20*time.Millisecond)
		}
	}
	t.Cleanup(c.StopCatalog)
	keys, err := binding.KeyringFromSecrets("e2e-binding-secret-0123456789")
	require.NoError(t, err)
	c.Keys = keys
	for i, region := range []string{"weur", "enam"} {
		cl, err := raftmeta.NewClient(c.CatAddrs)
		require.NoError(t, err)
		ln, addr := Listen(t)
		h, err := objecthost.Open(objecthost.Config{ID: fmt.Sprintf("h%d", i), Dir: t.TempDir(), Address: addr,
			Region: region, Capacity: 1000, Catalog: objecthost.RaftmetaCatalog{C: cl}, Bindings: keys, Logger: quiet,
			HeartbeatInterval: 2 * time.Second})
		require.NoError(t, err)
		t.Cleanup(func() { _ = h.Close() })
		Serve(t, ln, h.Handler())
		c.Hosts = append(c.Hosts, h)
		c.HostAddr = append(c.HostAddr, addr)
	}
	for i := 0; i < 2; i++ {
		cl, err := raftmeta.NewClient(c.CatAddrs)
		require.NoError(t, err)
		srv, err := edge.New(edge.Options{Catalog: edge.RaftmetaCatalog{C: cl}, Dir: t.TempDir(), Region: "weur",
			AdminToken: c.Admin, BindingKeys: keys, Logger: quiet,
			// A short token TTL so the outage phase outlives it: validated
			// tokens must keep working while the catalog is down.
			TokenTTL:    time.Second,
			AccountRate: edge.RateLimit{Rate: 1e6, Burst: 1e6}, DatabaseRate: edge.RateLimit{Rate: 1e6, Burst: 1e6}})
		require.NoError(t, err)
		ln, addr := Listen(t)
		Serve(t, ln, srv)
		t.Cleanup(func() { _ = srv.Close() })
		c.Edges = append(c.Edges, srv)
		c.EdgeURL = append(c.EdgeURL, "http://"+addr)
	}
	// Both hosts registered (they register themselves at start).
	cl, err := raftmeta.NewClient(c.CatAddrs)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		hs, err := cl.Hosts(context.Background(), raftmeta.ReadOptions{Consistency: raftmeta.Stale, NoCache: true})
		return err == nil && len(hs) == 2
	}, 30*time.Second, 50*time.Millisecond, "object hosts never registered")
	return c
}

// StopCatalog closes every catalog node (a node already closed is skipped);
// hosts and edges keep running. Idempotent.
func (c *E2ECluster) StopCatalog() {
	for _, n := range c.CatNodes {
		if n != nil {
			_ = n.Close()
		}
	}
}

// RestartCatalog starts every catalog node again after StopCatalog, on its
// data directory and its old Raft and HTTP addresses (retrying for up to
// 20 s while the ports are released). It does not wait for a leader.
func (c *E2ECluster) RestartCatalog(t testing.TB) {
	for i, cfg := range c.CatCfgs {
		cfg.RaftAddr, cfg.HTTPAddr = c.CatNodes[i].RaftAddr(), c.CatAddrs[i]
		cfg.Bootstrap, cfg.Join = false, nil
		var n *raftmeta.Node
		require.Eventually(t, func() bool {
			var err error
			n, err = raftmeta.NewNode(cfg)
			return err == nil
		}, 20*time.Second, 100*time.Millisecond)
		c.CatNodes[i] = n
	}
}

// SetupAccount creates an account of tier and a token for it through edge
// 0's admin API and waits until every edge accepts the token (follower
// reads may lag a moment). It uses only EdgeURL and Admin, so a test with
// edges of its own may call it on an E2ECluster holding just those two.
func (c *E2ECluster) SetupAccount(t testing.TB, tier string) (acct, bearer string) {
	var a Answer
	require.Eventually(t, func() bool {
		a = Call(t, "POST", c.EdgeURL[0]+"/admin/v1/accounts", "Bearer "+c.Admin, map[string]any{"name": "e2e", "tier": tier})
		return a.Status == 200
	}, 30*time.Second, 100*time.Millisecond)
	var acc struct{ ID string }
	require.NoError(t, json.Unmarshal(a.Result, &acc))
	a = Call(t, "POST", c.EdgeURL[0]+"/admin/v1/accounts/"+acc.ID+"/tokens", "Bearer "+c.Admin, map[string]any{"name": "e2e"})
	require.Equal(t, 200, a.Status, "%s", a.Raw)
	var tok struct{ Token string }
	require.NoError(t, json.Unmarshal(a.Result, &tok))
	for _, u := range c.EdgeURL {
		require.Eventually(t, func() bool {
			return Call(t, "GET", u+"/client/v4/accounts/"+acc.ID+"/d1/database", "Bearer "+tok.Token, nil).Status == 200
		}, 10*time.Second, 50*time.Millisecond)
	}
	return acc.ID, "Bearer " + tok.Token
}

// ListAll is a catalog list query for every database of an account (one
// page of up to 10,000).
func ListAll() fsm.ListQuery { return fsm.ListQuery{Page: 1, PerPage: 10000} }
