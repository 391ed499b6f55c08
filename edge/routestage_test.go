package edge

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// openStagingCache opens a cache whose staged routes are flushed only by
// other writes and Close (the linger is longer than any test).
func openStagingCache(t *testing.T, path string, c *testClock) *RouteCache {
	t.Helper()
	rc, err := OpenRouteCache(path, RouteCacheOptions{Now: c.Now, StageLinger: time.Hour})
	require.NoError(t, err)
	t.Cleanup(func() { _ = rc.Close() })
	return rc
}

// A staged route answers lookups at once, before it is in the file, and
// Close writes it to the file: it is there after a restart.
func TestStagedRouteAnswersAtOnceAndCloseWritesIt(t *testing.T) {
	c := newTestClock()
	path := filepath.Join(t.TempDir(), "routes.db")
	rc := openStagingCache(t, path, c)
	r := route(1, "o1", "active")
	require.NoError(t, rc.Stage(r))
	got, res := rc.Get(u1)
	require.Equal(t, cacheHit, res, "readable the moment Stage returns")
	assert.Equal(t, r, got)
	_, inFile := rc.read(u1)
	assert.False(t, inFile, "not written yet (the linger is an hour)")
	rc.PutNegative(u1)
	_, res = rc.Get(u1)
	assert.Equal(t, cacheHit, res, "a negative entry never shadows a staged route")

	require.NoError(t, rc.Close())
	rc, err := OpenRouteCache(path, RouteCacheOptions{Now: c.Now})
	require.NoError(t, err)
	defer rc.Close()
	got, inFile = rc.read(u1)
	require.True(t, inFile, "Close wrote the staged route")
	assert.Equal(t, r, got)
}

// The flush Stage arms writes the staged routes within the linger.
func TestStagedRoutesAreFlushed(t *testing.T) {
	rc, err := OpenRouteCache(filepath.Join(t.TempDir(), "routes.db"), RouteCacheOptions{StageLinger: time.Millisecond})
	require.NoError(t, err)
	defer rc.Close()
	for i := range 10 {
		r := route(1, "o1", "active")
		r.DatabaseUUID = fmt.Sprintf("11111111-2222-4333-8444-%012d", i)
		require.NoError(t, rc.Stage(r))
	}
	require.Eventually(t, func() bool {
		rc.memoMu.RLock()
		defer rc.memoMu.RUnlock()
		return len(rc.staged) == 0
	}, 10*time.Second, time.Millisecond)
	for i := range 10 {
		_, ok := rc.read(fmt.Sprintf("11111111-2222-4333-8444-%012d", i))
		assert.True(t, ok, "route %d in the file", i)
	}
	assert.Equal(t, []string{"h:1"}, rc.Hosts(), "a flushed route notes its host, as Put does")
}

// Every write of the cache is ordered after the routes staged before it:
// the staged route is written first, in the write's own transaction, so
// the write's rule sees it (an older generation is refused, an
// invalidation or a feed tombstone lands on it), and what the lookup
// answers afterwards — and what the file holds after a restart — is what
// it would be had the route been Put when it was staged.
func TestWritesAfterAStagedRouteSeeIt(t *testing.T) {
	staged := route(2, "o2", "active")
	for _, tc := range []struct {
		name  string
		write func(t *testing.T, rc *RouteCache)
		want  func(t *testing.T, r Route, res lookupResult)
	}{
		{"Put of an older generation is refused", func(t *testing.T, rc *RouteCache) {
			stored, err := rc.Put(route(1, "o1", "active"))
			require.NoError(t, err)
			assert.False(t, stored)
		}, func(t *testing.T, r Route, res lookupResult) {
			require.Equal(t, cacheHit, res)
			assert.Equal(t, "o2", r.ObjectID)
		}},
		{"Put deleted at the same generation", func(t *testing.T, rc *RouteCache) {
			stored, err := rc.Put(route(2, "o2", "deleted"))
			require.NoError(t, err)
			assert.True(t, stored)
		}, func(t *testing.T, r Route, res lookupResult) {
			require.Equal(t, cacheHit, res)
			assert.Equal(t, "deleted", r.State)
		}},
		{"PutMany of an older generation is refused", func(t *testing.T, rc *RouteCache) {
			stored, err := rc.PutMany([]Route{route(1, "o1", "active")})
			require.NoError(t, err)
			assert.Equal(t, []bool{false}, stored)
		}, func(t *testing.T, r Route, res lookupResult) {
			require.Equal(t, cacheHit, res)
			assert.Equal(t, "o2", r.ObjectID)
		}},
		{"Invalidate", func(t *testing.T, rc *RouteCache) {
			require.NoError(t, rc.Invalidate(u1, 2))
		}, func(t *testing.T, r Route, res lookupResult) {
			assert.Equal(t, cacheMiss, res, "the staged route was invalidated, not left to answer")
		}},
		{"route feed tombstone", func(t *testing.T, rc *RouteCache) {
			_, _, err := rc.applyFeed("routes", 0, []feedEntry{{route: Route{DatabaseUUID: u1, Generation: 2}, tombstone: true}}, 1)
			require.NoError(t, err)
		}, func(t *testing.T, r Route, res lookupResult) {
			require.Equal(t, cacheHit, res)
			assert.Equal(t, "deleted", r.State)
			assert.Equal(t, "o2", r.ObjectID, "the tombstone kept the staged route's fields")
		}},
		{"Purge", func(t *testing.T, rc *RouteCache) {
			require.NoError(t, rc.Purge())
		}, func(t *testing.T, r Route, res lookupResult) {
			assert.Equal(t, cacheMiss, res)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newTestClock()
			path := filepath.Join(t.TempDir(), "routes.db")
			rc := openStagingCache(t, path, c)
			require.NoError(t, rc.Stage(staged))
			tc.write(t, rc)
			r, res := rc.Get(u1)
			tc.want(t, r, res)
			require.NoError(t, rc.Close())
			rc2, err := OpenRouteCache(path, RouteCacheOptions{Now: c.Now})
			require.NoError(t, err)
			defer rc2.Close()
			r, res = rc2.Get(u1)
			tc.want(t, r, res)
		})
	}
}

// Lookups racing the flushes always find a route once Stage returned:
// each is either staged or in the file (run with -race).
func TestStagedRoutesNeverVanishDuringAFlush(t *testing.T) {
	rc, err := OpenRouteCache(filepath.Join(t.TempDir(), "routes.db"), RouteCacheOptions{StageLinger: 50 * time.Microsecond})
	require.NoError(t, err)
	defer rc.Close()
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 1000 {
				r := route(1, "o1", "active")
				r.DatabaseUUID = fmt.Sprintf("11111111-2222-4333-8%03d-%012d", w, i)
				if !assert.NoError(t, rc.Stage(r)) {
					return
				}
				for range 3 {
					got, res := rc.Get(r.DatabaseUUID)
					if !assert.Equal(t, cacheHit, res, "%s lost", r.DatabaseUUID) || !assert.Equal(t, r, got) {
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	assert.Equal(t, 4000, rc.Len(), "Len writes what is staged, then counts")
}

// A create's route is readable by the next query at once, while it is
// still only staged: the query reads no route from the catalog.
func TestCreatedRouteServesTheNextQueryBeforeItIsWritten(t *testing.T) {
	e := newEnv(t, func(o *Options) { o.RouteStageLinger = time.Hour })
	d := e.create(acctA, tokA, "db1")
	_, inFile := e.srv.cache.read(d.UUID)
	require.False(t, inFile, "staged, not written (the linger is an hour)")
	reads := e.cat.count("Database")
	a := e.call("POST", dbPath(acctA)+"/"+d.UUID+"/query", tokA, map[string]any{"sql": "SELECT 1"})
	require.Equal(t, 200, a.Status, "%s", a.Raw)
	assert.Equal(t, reads, e.cat.count("Database"), "no catalog read of the route")
	require.NoError(t, e.srv.Close())
	rc, err := OpenRouteCache(filepath.Join(e.srv.o.Dir, "routes.db"), RouteCacheOptions{})
	require.NoError(t, err)
	defer rc.Close()
	_, inFile = rc.read(d.UUID)
	assert.True(t, inFile, "Server.Close wrote the staged route")
}

// DESIGN.md states the staging linger.
func TestStageLingerAsDocumented(t *testing.T) {
	doc, err := os.ReadFile("DESIGN.md")
	require.NoError(t, err)
	assert.Contains(t, string(doc), "created in the last `RouteStageLinger` (20 ms)")
	assert.Contains(t, string(doc), "(`RouteStageLinger`, 20 ms)")
	assert.Equal(t, 20*time.Millisecond, defaultStageLinger)
}

// With a negative linger, Stage is Put: the route is in the file when it
// returns.
func TestStageWithoutLingerIsPut(t *testing.T) {
	rc, err := OpenRouteCache(filepath.Join(t.TempDir(), "routes.db"), RouteCacheOptions{StageLinger: -1})
	require.NoError(t, err)
	defer rc.Close()
	require.NoError(t, rc.Stage(route(1, "o1", "active")))
	_, inFile := rc.read(u1)
	assert.True(t, inFile)
}
