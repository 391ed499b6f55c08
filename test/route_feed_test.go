package test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/shoaldb/shoal/edge"
	"github.com/shoaldb/shoal/objecthost"
	"github.com/shoaldb/shoal/pipeline/event"
	"github.com/shoaldb/shoal/raftmeta"
	"github.com/shoaldb/shoal/test/harness"
)

// The route feed (principle 3 of ../shared/design.md): object hosts publish
// every route to the compacted routes topic, every edge consumes it into its
// bbolt cache. These tests run it on real components: a Kafka-protocol
// broker over TCP (kfake), three raftmeta nodes, two object hosts publishing
// through objecthost.KafkaRoutes, and edges consuming with
// edge.Options.RouteFeed.

// feedCluster is harness.E2ECluster with the route feed wired in.
type feedCluster struct {
	*harness.E2ECluster
	broker *kfake.Cluster
	quiet  *slog.Logger
}

func newFeedCluster(t *testing.T) *feedCluster {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	broker, err := kfake.NewCluster(kfake.NumBrokers(1)) // 127.0.0.1, a free port
	require.NoError(t, err)
	t.Cleanup(broker.Close)
	// The topic as documented in pipeline/DESIGN.md: compacted, keyed by
	// database UUID; tombstones outlive compaction of the records before
	// them for delete.retention.ms (default 24 h).
	require.NoError(t, broker.CreateTopic(event.TopicRoutes, 4, map[string]string{"cleanup.policy": "compact"}))

	c := &feedCluster{E2ECluster: &harness.E2ECluster{Admin: "feed-admin-token"}, broker: broker, quiet: quiet}
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
		c.CatCfgs, c.CatNodes, c.CatAddrs = append(c.CatCfgs, cfg), append(c.CatNodes, n), append(c.CatAddrs, n.HTTPAddr())
		if i == 0 {
			require.Eventually(t, n.IsLeader, 20*time.Second, 20*time.Millisecond)
		}
	}
	t.Cleanup(c.StopCatalog)
	for i, region := range []string{"weur", "enam"} {
		cl, err := raftmeta.NewClient(c.CatAddrs)
		require.NoError(t, err)
		kc, err := kgo.NewClient(kgo.SeedBrokers(broker.ListenAddrs()...))
		require.NoError(t, err)
		routes, err := objecthost.NewKafkaRoutes(kc, objecthost.KafkaRoutesOptions{Producer: fmt.Sprintf("h%d", i)})
		require.NoError(t, err)
		ln, addr := harness.Listen(t)
		h, err := objecthost.Open(objecthost.Config{ID: fmt.Sprintf("h%d", i), Dir: t.TempDir(), Address: addr,
			Region: region, Capacity: 1000, Catalog: objecthost.RaftmetaCatalog{C: cl}, Routes: routes, Logger: quiet,
			HeartbeatInterval: 2 * time.Second})
		require.NoError(t, err)
		h.Registry().MustRegister(routes)
		t.Cleanup(func() { _ = h.Close(); kc.Close() }) // cleanups run last-in first-out: the host goes before its client
		harness.Serve(t, ln, h.Handler())
		c.Hosts, c.HostAddr = append(c.Hosts, h), append(c.HostAddr, addr)
	}
	srv, url := c.startEdge(t, t.TempDir(), nil)
	c.Edges, c.EdgeURL = append(c.Edges, srv), append(c.EdgeURL, url)
	cl, err := raftmeta.NewClient(c.CatAddrs)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		hs, err := cl.Hosts(context.Background(), raftmeta.ReadOptions{Consistency: raftmeta.Stale, NoCache: true})
		return err == nil && len(hs) == 2
	}, 30*time.Second, 50*time.Millisecond, "object hosts never registered")
	return c
}

// startEdge starts an edge consuming the route feed, on dir (reuse a dir to
// restart an edge). wrap, if set, wraps its catalog (to count its reads).
// The returned server is closed at the end of the test (Close is idempotent).
func (c *feedCluster) startEdge(t *testing.T, dir string, wrap func(edge.Catalog) edge.Catalog) (*edge.Server, string) {
	cl, err := raftmeta.NewClient(c.CatAddrs)
	require.NoError(t, err)
	var cat edge.Catalog = edge.RaftmetaCatalog{C: cl}
	if wrap != nil {
		cat = wrap(cat)
	}
	srv, err := edge.New(edge.Options{Catalog: cat, Dir: dir, Region: "weur", AdminToken: c.Admin, Logger: c.quiet,
		AccountRate: edge.RateLimit{Rate: 1e6, Burst: 1e6}, DatabaseRate: edge.RateLimit{Rate: 1e6, Burst: 1e6},
		RouteFeed: &edge.RouteFeedOptions{Brokers: c.broker.ListenAddrs(), RefreshInterval: 500 * time.Millisecond}})
	require.NoError(t, err)
	ln, addr := harness.Listen(t)
	harness.Serve(t, ln, srv)
	t.Cleanup(func() { _ = srv.Close() })
	return srv, "http://" + addr
}

// waitFeed waits until srv's feed has read the whole topic and handled at
// least n records.
func waitFeed(t *testing.T, srv *edge.Server, n int64) edge.RouteFeedStats {
	t.Helper()
	var st edge.RouteFeedStats
	require.Eventually(t, func() bool {
		st = srv.Stats().Feed
		return st.CaughtUp && st.Applied+st.Stale >= n
	}, 30*time.Second, 20*time.Millisecond, "route feed never caught up: %+v", st)
	return st
}

// topicRoute is the latest record of one key in the routes topic.
type topicRoute struct {
	route     event.Route
	tombstone bool
	records   int // records of this key still in the log
	partition int32
}

// readRoutesTopic reads the routes topic from its start to its current end
// and returns the latest record per database UUID.
func readRoutesTopic(t *testing.T, addrs []string) map[string]topicRoute {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.ConsumeTopics(event.TopicRoutes),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	require.NoError(t, err)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, event.TopicRoutes)
	require.NoError(t, err)
	remaining := map[int32]int64{}
	ends.Each(func(lo kadm.ListedOffset) {
		if lo.Offset > 0 {
			remaining[lo.Partition] = lo.Offset
		}
	})
	out := map[string]topicRoute{}
	for len(remaining) > 0 {
		fs := cl.PollFetches(ctx)
		require.NoError(t, ctx.Err(), "reading the routes topic")
		fs.EachRecord(func(r *kgo.Record) {
			tr := out[string(r.Key)]
			tr.records++
			tr.partition = r.Partition
			tr.tombstone = r.Value == nil
			if !tr.tombstone {
				require.NoError(t, event.Decode(r.Value, &tr.route))
			}
			out[string(r.Key)] = tr
			if r.Offset+1 >= remaining[r.Partition] {
				delete(remaining, r.Partition)
			}
		})
	}
	return out
}

// TestRouteFeedServesWithCatalogDown is the acceptance test: an edge
// that never saw a database routes to it from the feed with every catalog
// node stopped; a deleted database is "not found" from the feed alone;
// generations never go backwards; a restarted edge resumes from the
// positions in its bbolt file.
func TestRouteFeedServesWithCatalogDown(t *testing.T) {
	require.Equal(t, objecthost.RouteGenerationHeader, edge.RouteGenerationHeader, "producer and consumer agree on the tombstone header")
	c := newFeedCluster(t)
	acct, bearer := c.SetupAccount(t, "paid")
	base := func(url string) string { return url + "/client/v4/accounts/" + acct + "/d1/database" }
	a := c.EdgeURL[0]

	// Create databases through edge A, each with a row that names it.
	const n = 12
	uuids := make([]string, n)
	for i := range uuids {
		r := harness.Call(t, "POST", base(a), bearer, map[string]any{"name": fmt.Sprintf("feed-%d", i)})
		require.Equal(t, 200, r.Status, "%s", r.Raw)
		var db struct{ UUID string }
		require.NoError(t, json.Unmarshal(r.Result, &db))
		uuids[i] = db.UUID
		r = harness.Call(t, "POST", base(a)+"/"+db.UUID+"/query", bearer, map[string]any{"batch": []any{
			map[string]any{"sql": "CREATE TABLE t (v TEXT)"},
			map[string]any{"sql": "INSERT INTO t VALUES (?)", "params": []any{db.UUID}},
		}})
		require.Equal(t, 200, r.Status, "%s", r.Raw)
	}
	// And two deleted databases (one to replay an old record against, one
	// for compaction).
	var r harness.Answer
	deleted := func(name string) string {
		r = harness.Call(t, "POST", base(a), bearer, map[string]any{"name": name})
		require.Equal(t, 200, r.Status, "%s", r.Raw)
		var db struct{ UUID string }
		require.NoError(t, json.Unmarshal(r.Result, &db))
		require.Eventually(t, func() bool { // confirmed (route published) before it is deleted
			tr, ok := readRoutesTopic(t, c.broker.ListenAddrs())[db.UUID]
			return ok && tr.route.State == "active"
		}, 30*time.Second, 100*time.Millisecond)
		r = harness.Call(t, "DELETE", base(a)+"/"+db.UUID, bearer, nil)
		require.Equal(t, 200, r.Status, "%s", r.Raw)
		return db.UUID
	}
	doomed, gone := deleted("doomed"), deleted("gone")

	// The hosts publish through the feed: on confirm (after each create) and
	// on delete (the deleted record, then a tombstone with its generation).
	require.Eventually(t, func() bool {
		routes := readRoutesTopic(t, c.broker.ListenAddrs())
		for _, u := range uuids {
			if tr := routes[u]; tr.tombstone || tr.route.State != "active" {
				return false
			}
		}
		return routes[doomed].tombstone && routes[gone].tombstone
	}, 30*time.Second, 100*time.Millisecond, "the hosts never published every route")
	routes := readRoutesTopic(t, c.broker.ListenAddrs())
	for _, u := range uuids {
		tr := routes[u]
		assert.Contains(t, c.HostAddr, tr.route.HostAddress)
		assert.Equal(t, acct, tr.route.AccountID)
		assert.EqualValues(t, 1, tr.route.Generation)
		assert.Regexp(t, `^h[01]@\d+$`, tr.route.EventID.Producer)
	}

	// Every catalog node stops. Edge B starts now, with an empty cache and
	// a catalog it cannot reach; it never saw any of these databases.
	c.StopCatalog()
	counted := &countingCatalog{}
	dirB := t.TempDir()
	countReads := func(cat edge.Catalog) edge.Catalog { counted.Catalog = cat; return counted }
	b, urlB := c.startEdge(t, dirB, countReads)
	assert.Equal(t, 0, b.Routes().Len())
	st := waitFeed(t, b, n+6) // n routes; per deleted database: route, deleted route, tombstone
	t.Logf("edge B read the feed: %+v", st)
	assert.Zero(t, st.Invalid)
	admin := "Bearer " + c.Admin // validated locally: B cannot ask the catalog about user tokens
	queryAll := func(url string) {
		t.Helper()
		for _, u := range uuids {
			r := harness.Call(t, "POST", base(url)+"/"+u+"/query", admin, map[string]any{"sql": "SELECT v FROM t"})
			if assert.Equal(t, 200, r.Status, "database %s through a fresh edge with the catalog down: %s", u, r.Raw) {
				assert.Contains(t, string(r.Result), u)
			}
		}
	}
	queryAll(urlB)
	for _, u := range []string{doomed, gone} {
		r = harness.Call(t, "POST", base(urlB)+"/"+u+"/query", admin, map[string]any{"sql": "SELECT 1"})
		assert.Equal(t, 404, r.Status, "a deleted database is not found, from the feed alone: %s", r.Raw)
		assert.Equal(t, 7404, r.Code())
	}
	assert.Zero(t, counted.reads.Load(), "edge B never asked the catalog")
	assert.EqualValues(t, n+2, b.Stats().CacheHits)

	// Generations never go backwards: a move of database 0 to generation 2
	// (same object and host, so it keeps working), then a late generation-1
	// record pointing nowhere, then an "active" record for the deleted
	// database at its own generation. B ignores both old records.
	prod, err := kgo.NewClient(kgo.SeedBrokers(c.broker.ListenAddrs()...))
	require.NoError(t, err)
	defer prod.Close()
	publish := func(rt event.Route) {
		t.Helper()
		rt.V, rt.EventID = event.Version, event.ID{Producer: "test", Seq: uint64(time.Now().UnixNano())}
		v, err := event.Encode(rt)
		require.NoError(t, err)
		require.NoError(t, prod.ProduceSync(context.Background(), &kgo.Record{Topic: event.TopicRoutes, Key: []byte(rt.DatabaseUUID), Value: v}).FirstErr())
	}
	moved := routes[uuids[0]].route
	moved.Generation = 2
	publish(moved)
	stale := moved
	stale.Generation, stale.HostAddress = 1, "127.0.0.1:1"
	publish(stale)
	revived := routes[uuids[1]].route // a complete active route, under the deleted UUID
	revived.DatabaseUUID, revived.ObjectID = doomed, "00000000000000000000000000000000"
	revived.Generation = 1
	publish(revived)
	before := st
	st = waitFeed(t, b, before.Applied+before.Stale+3)
	assert.Equal(t, before.Applied+1, st.Applied, "the move is applied")
	assert.Equal(t, before.Stale+2, st.Stale, "both old records are ignored")
	rt, err := b.LookupRoute(context.Background(), uuids[0])
	require.NoError(t, err)
	assert.EqualValues(t, 2, rt.Generation)
	assert.Equal(t, moved.HostAddress, rt.HostAddress)
	rt, err = b.LookupRoute(context.Background(), doomed)
	require.NoError(t, err)
	assert.Equal(t, "deleted", rt.State)
	queryAll(urlB)

	// Restart B on its directory: it resumes from the positions stored with
	// its routes (nothing re-read), keeps serving with the catalog down, and
	// applies what was published while it was away.
	require.NoError(t, b.Close())
	moved.Generation = 3
	publish(moved)
	b, urlB = c.startEdge(t, dirB, countReads)
	st = waitFeed(t, b, 1)
	assert.EqualValues(t, 1, st.Applied, "only the record published while B was down is read: %+v", st)
	assert.Zero(t, st.Stale)
	assert.Zero(t, st.Lag)
	queryAll(urlB)
	rt, err = b.LookupRoute(context.Background(), uuids[0])
	require.NoError(t, err)
	assert.EqualValues(t, 3, rt.Generation)
	assert.Zero(t, counted.reads.Load(), "edge B never asked the catalog")

	// Compaction drops the deleted database's records but its tombstone
	// (until delete.retention.ms): a third fresh edge still learns the
	// delete from the tombstone's generation header. A filler record in the
	// same partition makes the tombstone's batch cleanable (the last batch
	// of a partition never is).
	part := routes[gone].partition
	filler, err := kgo.NewClient(kgo.SeedBrokers(c.broker.ListenAddrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	require.NoError(t, err)
	defer filler.Close()
	require.NoError(t, filler.ProduceSync(context.Background(), &kgo.Record{Topic: event.TopicRoutes, Partition: part,
		Key:     []byte("ffffffff-ffff-4fff-8fff-ffffffffffff"),
		Headers: []kgo.RecordHeader{{Key: objecthost.RouteGenerationHeader, Value: []byte(strconv.Itoa(1))}}}).FirstErr())
	c.broker.Compact()
	tr := readRoutesTopic(t, c.broker.ListenAddrs())[gone]
	require.True(t, tr.tombstone)
	require.Equal(t, 1, tr.records, "only the tombstone of the deleted database is left")
	cEdge, urlC := c.startEdge(t, t.TempDir(), nil)
	waitFeed(t, cEdge, n)
	queryAll(urlC)
	r = harness.Call(t, "POST", base(urlC)+"/"+gone+"/query", admin, map[string]any{"sql": "SELECT 1"})
	assert.Equal(t, 404, r.Status, "%s", r.Raw)
	assert.Equal(t, 7404, r.Code())
}
