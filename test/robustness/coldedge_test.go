package robustness

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/test/robustness/topology"
	"github.com/shoaldb/shoal/test/robustness/traffic"
)

// TestFaultColdEdgeRoutesThroughHosts is issue #12's "from warm and from
// cold edges" with real processes, each in its own namespace: 3 catalog
// voters, 2 object hosts and 1 edge started without --config (it knows no
// host but from the catalog and its own routes) and without a route feed
// (no pipeline), so nothing but the object hosts can route a database the
// edge's cache does not hold while the catalog is cut off.
//
//  1. Databases are created and queried once through the edge (it
//     validates the token, caches the routes, books the hosts).
//  2. The catalog is cut off (every voter's link down).
//  3. Warm edge, under the route-purge fault (its cache purged every
//     100 ms, and at the start of each round of queries): every query
//     to an existing database must succeed — each purge sends the next
//     queries to the hosts' route lookup.
//  4. The edge is purged and killed -9, then restarted on the same data
//     directory (route cache empty, host and token books kept): every
//     query to an existing database must succeed; an unknown database is
//     never a 404 (the hosts' view is partial).
//
// 100% means every query, no retries. Without the host book the restarted
// edge knows no host (503); without the token book it cannot check the
// token (503).
func TestFaultColdEdgeRoutesThroughHosts(t *testing.T) {
	c := newPlainCluster(t)
	ctx := context.Background()
	catalog, err := c.CatalogClient()
	require.NoError(t, err)
	t.Cleanup(catalog.Close)
	hist := traffic.NewHistory()
	cl, err := traffic.NewClient(ctx, c.EdgeURLs(), c.Admin, catalog, hist)
	require.NoError(t, err, "account and token")

	const n = 12
	var dbs []string
	for i := range n {
		op := cl.Create(ctx, 1, 0, fmt.Sprintf("cold-%d", i))
		require.Equal(t, traffic.OK, op.Outcome, "create: %s", op.Answer)
		require.NoError(t, cl.Exec(ctx, 0, op.DB, "CREATE TABLE t (x INTEGER)", "INSERT INTO t VALUES (1)"))
		dbs = append(dbs, op.DB)
	}
	for _, db := range dbs {
		out, text := cl.Probe(ctx, 0, db)
		require.Equal(t, traffic.OK, out, "warm-up query: %s", text)
	}

	require.NoError(t, c.CutOffCatalog())
	t.Cleanup(func() { _ = c.RejoinCatalog() })

	// probeAll queries every database rounds times; it returns the
	// queries sent and the failures.
	probeAll := func(rounds int, purge bool) (sent int, failures []string) {
		for r := range rounds {
			if purge {
				// Each round starts on an empty route cache (queries
				// are faster than the background purges' period).
				require.NoError(t, c.PurgeRoutes(ctx))
			}
			for _, db := range dbs {
				sent++
				if out, text := cl.Probe(ctx, 0, db); out != traffic.OK {
					failures = append(failures, fmt.Sprintf("round %d, %s: %s %s", r, db, out, text))
				}
			}
		}
		return sent, failures
	}

	// 3. Warm edge under the route-purge fault.
	purgeCtx, stopPurge := context.WithCancel(ctx)
	var purging sync.WaitGroup
	purges := 0
	purging.Add(1)
	go func() {
		defer purging.Done()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-purgeCtx.Done():
				return
			case <-tick.C:
				if c.PurgeRoutes(purgeCtx) == nil {
					purges++
				}
			}
		}
	}()
	start := time.Now()
	sent, failures := probeAll(5, true)
	stopPurge()
	purging.Wait()
	t.Logf("warm edge, catalog cut off, %d background purges and one per round: %d/%d queries succeeded in %s", purges, sent-len(failures), sent, time.Since(start).Round(time.Millisecond))
	assert.Empty(t, firstOf(failures), "every query to an existing database succeeds from the warm edge (%d failed)", len(failures))

	// 4. Cold edge: purged, killed -9, restarted on its data directory.
	edge := c.Edges[0]
	require.NoError(t, c.PurgeRoutes(ctx))
	require.NoError(t, edge.Kill())
	require.NoError(t, edge.Start())
	require.NoError(t, c.WaitHealthy(ctx, edge, 60*time.Second))
	start = time.Now()
	sent, failures = probeAll(3, false)
	t.Logf("cold edge, catalog cut off: %d/%d queries succeeded in %s", sent-len(failures), sent, time.Since(start).Round(time.Millisecond))
	assert.Empty(t, firstOf(failures), "every query to an existing database succeeds from the restarted edge (%d failed)", len(failures))
	out, text := cl.Probe(ctx, 0, uuid.NewString())
	assert.NotEqual(t, traffic.NotFound, out, "no host holds it: never a definite 404 without the catalog (%s)", text)
	if t.Failed() {
		t.Logf("--- %s output (tail):\n%s", edge.Name, tailOut(edge.Output(), 4000))
	}

	// The catalog back: the edge serves creates again.
	require.NoError(t, c.RejoinCatalog())
	require.Eventually(t, func() bool {
		return cl.Create(ctx, 1, 0, "after-cut-off").Outcome == traffic.OK
	}, 60*time.Second, 500*time.Millisecond, "creates recover after the catalog is back")
}

// firstOf keeps a failure message short: the first three.
func firstOf(failures []string) []string { return failures[:min(3, len(failures))] }

func tailOut(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// newPlainCluster starts the smallest topology the cold-edge test needs: no
// pipeline (so no route feed), no archive, no limiter.
func newPlainCluster(t *testing.T) *topology.Cluster {
	if err := topology.Available(); err != nil {
		if os.Getenv("SHOAL_REQUIRE_NETNS") == "1" {
			t.Fatalf("SHOAL_REQUIRE_NETNS=1 but network namespaces are unavailable: %v", err)
		}
		t.Skipf("robustness suite needs network namespaces (root, iproute2): %v; SHOAL_REQUIRE_NETNS=1 makes this a failure", err)
	}
	bin, err := shoalBin.Path()
	require.NoError(t, err)
	netw, err := topology.NewNet()
	require.NoError(t, err, "network namespaces")
	t.Cleanup(func() { assert.NoError(t, netw.Close(), "removing the namespaces") })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := topology.Start(ctx, netw, topology.Options{Bin: bin, Dir: t.TempDir(), Heartbeat: heartbeat, Grace: grace,
		Edges: 1, TLS: os.Getenv("SHOAL_ROBUSTNESS_TLS") == "1"})
	t.Cleanup(func() { assert.NoError(t, c.Stop(), "stopping the cluster") })
	require.NoError(t, err, "starting the cluster")
	return c
}
