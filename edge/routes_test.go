package edge

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const u1 = "11111111-2222-4333-8444-555555555555"

func openTestCache(t *testing.T, c *testClock) *RouteCache {
	rc, err := OpenRouteCache(filepath.Join(t.TempDir(), "routes.db"), RouteCacheOptions{Now: c.Now})
	require.NoError(t, err)
	t.Cleanup(func() { _ = rc.Close() })
	return rc
}

func route(gen int64, obj, state string) Route {
	return Route{DatabaseUUID: u1, ObjectID: obj, HostAddress: "h:1", AccountID: "a", State: state, Generation: gen}
}

func TestRouteCacheGenerationNeverGoesBackwards(t *testing.T) {
	c := newTestClock()
	rc := openTestCache(t, c)
	put := func(r Route) bool {
		ok, err := rc.Put(r)
		require.NoError(t, err)
		return ok
	}
	get := func() (Route, lookupResult) { return rc.Get(u1) }

	assert.True(t, put(route(2, "o2", "active")))
	assert.False(t, put(route(1, "o1", "active")), "an older generation never replaces a newer one")
	r, res := get()
	require.Equal(t, cacheHit, res)
	assert.Equal(t, "o2", r.ObjectID)

	assert.True(t, put(route(2, "o2", "deleted")), "same generation: active → deleted")
	assert.False(t, put(route(2, "o2", "active")), "same generation: never deleted → active")
	assert.True(t, put(route(3, "o3", "active")), "a newer generation may revive (moved/restored)")

	// Invalidating an older generation leaves the newer route alone.
	require.NoError(t, rc.Invalidate(u1, 2))
	r, res = get()
	require.Equal(t, cacheHit, res)
	assert.EqualValues(t, 3, r.Generation)

	// Invalidating the current generation leaves a tombstone: a miss, and the
	// same generation cannot come back until the tombstone expires.
	require.NoError(t, rc.Invalidate(u1, 3))
	_, res = get()
	assert.Equal(t, cacheMiss, res)
	assert.False(t, put(route(3, "o3", "active")), "the known-bad route is not re-cached")
	assert.False(t, put(route(2, "o2", "active")))
	assert.True(t, put(route(4, "o4", "active")), "a newer generation replaces a tombstone")

	require.NoError(t, rc.Invalidate(u1, 4))
	c.Advance(6 * time.Second)
	assert.True(t, put(route(4, "o4", "active")), "after the tombstone expires the same generation is accepted")
	r, res = get()
	require.Equal(t, cacheHit, res)
	assert.Equal(t, "o4", r.ObjectID)
}

func TestRouteCachePersistsAndPurges(t *testing.T) {
	c := newTestClock()
	path := filepath.Join(t.TempDir(), "routes.db")
	rc, err := OpenRouteCache(path, RouteCacheOptions{Now: c.Now})
	require.NoError(t, err)
	_, err = rc.Put(route(1, "o1", "active"))
	require.NoError(t, err)
	require.NoError(t, rc.Close())
	rc, err = OpenRouteCache(path, RouteCacheOptions{Now: c.Now})
	require.NoError(t, err)
	defer rc.Close()
	_, res := rc.Get(u1)
	assert.Equal(t, cacheHit, res, "routes survive a restart")
	rc.PutNegative("22222222-2222-4333-8444-555555555555")
	require.NoError(t, rc.Purge())
	_, res = rc.Get(u1)
	assert.Equal(t, cacheMiss, res)
	_, res = rc.Get("22222222-2222-4333-8444-555555555555")
	assert.Equal(t, cacheMiss, res)
	assert.Equal(t, 0, rc.Len())
}

func TestNegativeEntriesBoundedAndExpire(t *testing.T) {
	c := newTestClock()
	rc, err := OpenRouteCache(filepath.Join(t.TempDir(), "r.db"), RouteCacheOptions{Now: c.Now, MaxNegative: 10, NegativeTTL: time.Second})
	require.NoError(t, err)
	defer rc.Close()
	for i := 0; i < 100; i++ {
		rc.PutNegative(string(rune('a'+i%26)) + string(rune('a'+i/26)))
	}
	rc.mu.Lock()
	n := len(rc.negative)
	rc.mu.Unlock()
	assert.LessOrEqual(t, n, 10)
	rc.PutNegative("x")
	_, res := rc.Get("x")
	assert.Equal(t, cacheNegative, res)
	c.Advance(time.Second)
	_, res = rc.Get("x")
	assert.Equal(t, cacheMiss, res)
	// A negative entry never shadows a cached route.
	_, err = rc.Put(route(1, "o1", "active"))
	require.NoError(t, err)
	rc.PutNegative(u1)
	_, res = rc.Get(u1)
	assert.Equal(t, cacheHit, res)
}

func TestRouteCodecRoundTrip(t *testing.T) {
	for _, r := range []Route{
		route(1, "o1", "active"), route(1<<40, "", "deleted"),
		{DatabaseUUID: u1, InvalidUntil: -5, State: "active"}, {DatabaseUUID: u1, InvalidUntil: 1 << 62, State: "deleted", Generation: 3},
	} {
		got, err := decodeRoute(encodeRoute(r))
		require.NoError(t, err)
		assert.Equal(t, r, got)
	}
	enc := encodeRoute(route(7, "obj", "active"))
	for i := 0; i < len(enc); i++ {
		_, err := decodeRoute(enc[:i])
		assert.Error(t, err, "truncated at %d", i)
	}
}

// TestRouteCacheExpireDeleted: deleted routes older than the retention are
// dropped (then a lookup misses), younger ones and active ones stay, and a
// deleted route revived at a newer generation is no longer expired.
func TestRouteCacheExpireDeleted(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	clock := func() time.Time { return now }
	c, err := OpenRouteCache(filepath.Join(t.TempDir(), "routes.db"), RouteCacheOptions{Now: clock})
	require.NoError(t, err)
	defer c.Close()
	put := func(uuid, state string, gen int64) {
		ok, err := c.Put(Route{DatabaseUUID: uuid, ObjectID: "o-" + uuid, HostAddress: "h:1", AccountID: "a", State: state, Generation: gen})
		require.NoError(t, err)
		require.True(t, ok)
	}
	put("old", "deleted", 1)
	put("revived", "deleted", 1)
	put("live", "active", 1)
	now = now.Add(8 * 24 * time.Hour)
	put("young", "deleted", 1)
	put("revived", "active", 2)

	n, err := c.ExpireDeleted(7*24*time.Hour, 100)
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	_, res := c.Get("old")
	assert.Equal(t, cacheMiss, res, "an expired deleted route is gone")
	for _, uuid := range []string{"young", "revived", "live"} {
		_, ok := c.read(uuid)
		assert.True(t, ok, uuid)
	}
	n, err = c.ExpireDeleted(7*24*time.Hour, 100)
	require.NoError(t, err)
	assert.Zero(t, n)
}

// TestRouteCacheMemoFollowsEveryWrite: a route remembered in memory by a
// lookup is never answered after a write changed it in the file — for
// each kind of write (Put, PutMany, Invalidate, the route feed, the
// expiry of deleted routes, Purge) — and a route read from the file
// before a write committed is not remembered.
func TestRouteCacheMemoFollowsEveryWrite(t *testing.T) {
	c := newTestClock()
	rc := openTestCache(t, c)
	get := func() (Route, lookupResult) { return rc.Get(u1) }
	prime := func(r Route) {
		t.Helper()
		require.NoError(t, rc.Purge())
		_, err := rc.Put(r)
		require.NoError(t, err)
		got, res := get()
		require.Equal(t, cacheHit, res)
		require.Equal(t, r, got)
		got, res = get() // now from memory
		require.Equal(t, cacheHit, res)
		require.Equal(t, r, got)
	}

	prime(route(1, "o1", "active"))
	_, err := rc.Put(route(2, "o2", "active"))
	require.NoError(t, err)
	got, _ := get()
	assert.Equal(t, "o2", got.ObjectID, "Put")

	prime(route(1, "o1", "active"))
	_, err = rc.PutMany([]Route{route(3, "o3", "active")})
	require.NoError(t, err)
	got, _ = get()
	assert.Equal(t, "o3", got.ObjectID, "PutMany")

	prime(route(1, "o1", "active"))
	require.NoError(t, rc.Invalidate(u1, 1))
	_, res := get()
	assert.Equal(t, cacheMiss, res, "Invalidate")

	prime(route(1, "o1", "active"))
	_, _, err = rc.applyFeed("routes", 0, []feedEntry{{route: route(1, "o1", "deleted"), tombstone: true}}, 1)
	require.NoError(t, err)
	got, res = get()
	assert.Equal(t, cacheHit, res)
	assert.Equal(t, "deleted", got.State, "route feed")

	prime(route(1, "o1", "deleted"))
	c.Advance(8 * 24 * time.Hour)
	n, err := rc.ExpireDeleted(7*24*time.Hour, 100)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	_, res = get()
	assert.Equal(t, cacheMiss, res, "ExpireDeleted")

	prime(route(1, "o1", "active"))
	require.NoError(t, rc.Purge())
	_, res = get()
	assert.Equal(t, cacheMiss, res, "Purge")

	// A lookup that read the file before a write committed (here: its
	// epoch is from before the Put) may not remember what it read.
	require.NoError(t, rc.Purge())
	old := route(1, "o1", "active")
	_, err = rc.Put(old)
	require.NoError(t, err)
	rc.memoMu.RLock()
	epoch := rc.memoEpoch
	rc.memoMu.RUnlock()
	_, err = rc.Put(route(2, "o2", "active"))
	require.NoError(t, err)
	rc.remember(old, epoch)
	got, _ = get()
	assert.Equal(t, "o2", got.ObjectID, "a read older than a write is not remembered")
}

// DESIGN.md states the memo's bound.
func TestRouteMemoBoundAsDocumented(t *testing.T) {
	doc, err := os.ReadFile("DESIGN.md")
	require.NoError(t, err)
	assert.Contains(t, string(doc), "an in-memory memo of up to 32,768 live routes")
	assert.Equal(t, 32768, defaultMaxMemo)
}
