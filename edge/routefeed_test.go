package edge

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/shoaldb/shoal/pipeline/event"
)

const u2 = "22222222-2222-4333-8444-555555555555"

func TestApplyFeedOrderingAndPositions(t *testing.T) {
	c := newTestClock()
	rc := openTestCache(t, c)
	rc.PutNegative(u1)
	_, res := rc.Get(u1)
	require.Equal(t, cacheNegative, res)

	applied, stale, err := rc.applyFeed("routes", 3, []feedEntry{
		{route: route(2, "o2", "active")},
		{route: route(1, "o1", "active")}, // older after newer: ignored
	}, 10)
	require.NoError(t, err)
	assert.Equal(t, 1, applied)
	assert.Equal(t, 1, stale)
	r, res := rc.Get(u1)
	require.Equal(t, cacheHit, res, "a stored feed route clears the negative entry")
	assert.Equal(t, "o2", r.ObjectID)

	// A tombstone at an older generation deletes nothing; at the current one
	// it deletes and keeps the route's fields (account isolation still works).
	applied, stale, err = rc.applyFeed("routes", 3, []feedEntry{
		{tombstone: true, route: Route{DatabaseUUID: u1, State: "deleted", Generation: 1}},
	}, 11)
	require.NoError(t, err)
	assert.Equal(t, 0, applied)
	assert.Equal(t, 1, stale)
	applied, _, err = rc.applyFeed("routes", 3, []feedEntry{
		{tombstone: true, route: Route{DatabaseUUID: u1, State: "deleted", Generation: 2}},
		{route: route(2, "o2", "active")}, // a late republish of the deleted route: never back to active
		{tombstone: true, route: Route{DatabaseUUID: u2, State: "deleted", Generation: 5}},
	}, 14)
	require.NoError(t, err)
	assert.Equal(t, 2, applied)
	r, res = rc.Get(u1)
	require.Equal(t, cacheHit, res)
	assert.Equal(t, "deleted", r.State)
	assert.Equal(t, "o2", r.ObjectID)
	assert.Equal(t, "a", r.AccountID)
	r, res = rc.Get(u2)
	require.Equal(t, cacheHit, res, "a tombstone alone leaves a deleted marker")
	assert.Equal(t, "deleted", r.State)
	assert.ErrorIs(t, usable(r, "a"), ErrDatabaseNotFound)

	// Positions: per partition, the offset after the last applied batch.
	_, pos, err := rc.feedPositions("routes")
	require.NoError(t, err)
	assert.Equal(t, map[int32]int64{3: 14}, pos)
	var id [16]byte
	id[0] = 7
	require.NoError(t, rc.setFeedTopic("routes", id, false))
	gotID, pos, err := rc.feedPositions("routes")
	require.NoError(t, err)
	assert.Equal(t, id, gotID)
	assert.Len(t, pos, 1)
	id[0] = 8
	require.NoError(t, rc.setFeedTopic("routes", id, true))
	_, pos, err = rc.feedPositions("routes")
	require.NoError(t, err)
	assert.Empty(t, pos, "a recreated topic drops the positions")

	// Purge drops routes and positions.
	_, _, err = rc.applyFeed("routes", 0, nil, 99)
	require.NoError(t, err)
	require.NoError(t, rc.Purge())
	_, pos, err = rc.feedPositions("routes")
	require.NoError(t, err)
	assert.Empty(t, pos)
	assert.Equal(t, 0, rc.Len())
}

func TestApplyFeedTombstoneRespectsInvalidation(t *testing.T) {
	c := newTestClock()
	rc := openTestCache(t, c)
	_, err := rc.Put(route(3, "o3", "active"))
	require.NoError(t, err)
	require.NoError(t, rc.Invalidate(u1, 3))
	_, stale, err := rc.applyFeed("routes", 0, []feedEntry{{route: route(3, "o3", "active")}}, 1)
	require.NoError(t, err)
	assert.Equal(t, 1, stale, "the feed cannot re-insert a route a host just refused")
	applied, _, err := rc.applyFeed("routes", 0, []feedEntry{{route: route(4, "o4", "active")}}, 2)
	require.NoError(t, err)
	assert.Equal(t, 1, applied)
}

// feedBroker is a kfake cluster on loopback with the routes topic.
func feedBroker(t *testing.T, partitions int32) (*kfake.Cluster, *kgo.Client) {
	t.Helper()
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1)) // listens on 127.0.0.1, random ports
	require.NoError(t, err)
	t.Cleanup(cluster.Close)
	if partitions > 0 {
		require.NoError(t, cluster.CreateTopic(event.TopicRoutes, partitions, map[string]string{"cleanup.policy": "compact"}))
	}
	prod, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...))
	require.NoError(t, err)
	t.Cleanup(prod.Close)
	return cluster, prod
}

func produceRoute(t *testing.T, cl *kgo.Client, r event.Route) {
	t.Helper()
	r.V = event.Version
	v, err := event.Encode(r)
	require.NoError(t, err)
	require.NoError(t, cl.ProduceSync(context.Background(), &kgo.Record{Topic: event.TopicRoutes, Key: []byte(r.DatabaseUUID), Value: v}).FirstErr())
}

func produceTombstone(t *testing.T, cl *kgo.Client, uuid string, gen int64) {
	t.Helper()
	require.NoError(t, cl.ProduceSync(context.Background(), &kgo.Record{Topic: event.TopicRoutes, Key: []byte(uuid),
		Headers: []kgo.RecordHeader{{Key: RouteGenerationHeader, Value: []byte(strconv.FormatInt(gen, 10))}}}).FirstErr())
}

func feedUUID(i int) string {
	return "00000000-0000-4000-8000-" + strconv.FormatInt(1e11+int64(i), 10)[:12]
}

func activeRoute(i int, gen int64, host string) event.Route {
	return event.Route{DatabaseUUID: feedUUID(i), ObjectID: "obj" + strconv.Itoa(i), HostAddress: host,
		AccountID: "acct", State: "active", Generation: gen}
}

func feedServer(t *testing.T, dir string, cluster *kfake.Cluster) *Server {
	t.Helper()
	srv, err := New(Options{Catalog: newFakeCatalog(), Dir: dir, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		RouteFeed: &RouteFeedOptions{Brokers: cluster.ListenAddrs(), RefreshInterval: 200 * time.Millisecond, RetryBackoff: 50 * time.Millisecond}})
	require.NoError(t, err)
	return srv
}

func waitCaughtUp(t *testing.T, srv *Server, applied int64) RouteFeedStats {
	t.Helper()
	var st RouteFeedStats
	require.Eventually(t, func() bool {
		st = srv.Stats().Feed
		return st.CaughtUp && st.Applied+st.Stale >= applied
	}, 20*time.Second, 20*time.Millisecond, "feed never caught up: %+v", st)
	return st
}

func TestRouteFeedConsumesResumesAndNeverGoesBackwards(t *testing.T) {
	cluster, prod := feedBroker(t, 4)
	const n = 50
	for i := 0; i < n; i++ {
		produceRoute(t, prod, activeRoute(i, 1, "h1:1"))
	}
	dir := t.TempDir()
	srv := feedServer(t, dir, cluster)
	st := waitCaughtUp(t, srv, n)
	assert.EqualValues(t, n, st.Applied)
	assert.EqualValues(t, 4, st.Partitions)
	for i := 0; i < n; i++ {
		r, err := srv.LookupRoute(context.Background(), feedUUID(i))
		require.NoError(t, err)
		assert.Equal(t, "h1:1", r.HostAddress)
	}

	// A move to generation 2, then an old generation-1 record arriving late:
	// the cache keeps generation 2.
	produceRoute(t, prod, activeRoute(0, 2, "h2:1"))
	produceRoute(t, prod, activeRoute(0, 1, "h1:1"))
	st = waitCaughtUp(t, srv, n+2)
	assert.EqualValues(t, n+1, st.Applied)
	assert.EqualValues(t, 1, st.Stale)
	r, err := srv.LookupRoute(context.Background(), feedUUID(0))
	require.NoError(t, err)
	assert.Equal(t, "h2:1", r.HostAddress)
	assert.EqualValues(t, 2, r.Generation)

	// Delete: the deleted record, then its tombstone.
	del := activeRoute(1, 1, "h1:1")
	del.State = "deleted"
	produceRoute(t, prod, del)
	produceTombstone(t, prod, del.DatabaseUUID, 1)
	// A record that cannot be decoded is skipped, not fatal.
	require.NoError(t, prod.ProduceSync(context.Background(), &kgo.Record{Topic: event.TopicRoutes, Key: []byte(feedUUID(2)), Value: []byte("{nope")}).FirstErr())
	waitCaughtUp(t, srv, n+4)
	// The bad record comes last: wait for it too (the counts above may be
	// reached before it is read).
	require.Eventually(t, func() bool { return srv.Stats().Feed.Invalid == 1 }, 20*time.Second, 20*time.Millisecond,
		"the undecodable record was not counted: %+v", srv.Stats().Feed)
	r, err = srv.LookupRoute(context.Background(), del.DatabaseUUID)
	require.NoError(t, err)
	assert.Equal(t, "deleted", r.State)
	require.NoError(t, srv.Close())

	// Restart on the same directory: it resumes from its stored positions
	// (nothing re-applied), then applies what was published meanwhile.
	produceRoute(t, prod, activeRoute(n, 1, "h1:1"))
	srv = feedServer(t, dir, cluster)
	defer srv.Close()
	st = waitCaughtUp(t, srv, 1)
	assert.EqualValues(t, 1, st.Applied, "a restart re-reads only records it had not applied")
	assert.Zero(t, st.Stale)
	assert.Zero(t, st.Lag)
	_, err = srv.LookupRoute(context.Background(), feedUUID(n))
	require.NoError(t, err)

	// A purge drops routes and positions; the feed re-reads the topic.
	require.NoError(t, srv.Purge())
	require.Eventually(t, func() bool {
		rt, res := srv.Routes().Get(feedUUID(0))
		return res == cacheHit && rt.Generation == 2
	}, 20*time.Second, 20*time.Millisecond, "the purged cache never refilled from the feed")
}

func TestRouteFeedWaitsForTopic(t *testing.T) {
	cluster, prod := feedBroker(t, 0)
	srv := feedServer(t, t.TempDir(), cluster)
	defer srv.Close()
	require.Eventually(t, func() bool { return srv.Stats().Feed.CaughtUp }, 10*time.Second, 20*time.Millisecond,
		"no topic yet is nothing to read")
	require.NoError(t, cluster.CreateTopic(event.TopicRoutes, 2, nil))
	produceRoute(t, prod, activeRoute(7, 1, "h1:1"))
	waitCaughtUp(t, srv, 1)
	_, res := srv.Routes().Get(feedUUID(7))
	assert.Equal(t, cacheHit, res)
}

func TestRouteFeedCloseStopsConsumer(t *testing.T) {
	cluster, _ := feedBroker(t, 1)
	srv := feedServer(t, t.TempDir(), cluster)
	waitCaughtUp(t, srv, 0)
	done := make(chan error, 1)
	go func() { done <- srv.Close() }()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return: the feed goroutine is still running")
	}
	// The cache file is closed and can be opened again.
	rc, err := OpenRouteCache(filepath.Join(srv.o.Dir, "routes.db"), RouteCacheOptions{})
	require.NoError(t, err)
	require.NoError(t, rc.Close())
}
