package edge

import (
	"testing"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// forgetRoutesAndCutCatalog leaves the edge with no cached route (and no
// feed) and the catalog unreachable: the state of issue #12, where a
// database's route had reached only another edge's cache.
func (e *env) forgetRoutesAndCutCatalog() {
	e.t.Helper()
	require.NoError(e.t, e.srv.Purge())
	e.cat.setDown(true)
}

func (e *env) locates() int64 {
	var n int64
	for _, h := range e.hosts {
		n += h.locates.Load()
	}
	return n
}

func (e *env) hostRouteResults(result string) float64 {
	return testutil.ToFloat64(e.srv.m.hostRoutes.WithLabelValues(result))
}

var selectOne = map[string]any{"sql": "SELECT 1"}

func TestHostRouteServesWhenCatalogUnavailable(t *testing.T) {
	e := newEnv(t)
	d := e.create(acctA, tokA, "db")
	obj := e.catalogDB(d.UUID).ObjectID
	host := e.hostOf(obj)
	require.NotNil(t, host)
	e.forgetRoutesAndCutCatalog()

	a := e.call("POST", dbPath(acctA)+"/"+d.UUID+"/query", tokA, selectOne)
	require.Equal(t, 200, a.Status, "%s", a.Raw)
	assert.Contains(t, string(a.Result), "SELECT 1")
	assert.EqualValues(t, 1, host.queries.Load(), "forwarded to the host that holds it")
	host.mu.Lock()
	assert.Equal(t, d.UUID, host.lastHdr.Get(HeaderDatabase))
	assert.Equal(t, acctA, host.lastHdr.Get(HeaderAccount))
	host.mu.Unlock()
	assert.Equal(t, 1.0, e.hostRouteResults("found"))
	asked := e.locates()
	assert.EqualValues(t, len(e.hosts), asked, "every known host asked once")

	// The route was cached (at the feed's trust): the next query needs
	// neither the catalog nor the hosts' lookup.
	rt, res := e.srv.cache.Get(d.UUID)
	require.Equal(t, cacheHit, res)
	assert.Equal(t, obj, rt.ObjectID)
	a = e.call("POST", dbPath(acctA)+"/"+d.UUID+"/query", tokA, selectOne)
	require.Equal(t, 200, a.Status, "%s", a.Raw)
	assert.Equal(t, asked, e.locates())
}

func TestHostRouteNotAskedWhenCatalogSaysNotFound(t *testing.T) {
	e := newEnv(t)
	e.create(acctA, tokA, "db") // the edge knows the hosts
	a := e.call("POST", dbPath(acctA)+"/"+uuid.NewString()+"/query", tokA, selectOne)
	assert.Equal(t, 404, a.Status, "%s", a.Raw)
	assert.Equal(t, 7404, a.code())
	assert.Zero(t, e.locates(), "a definite not-found from the catalog is final")
}

func TestHostRoutePicksHighestGeneration(t *testing.T) {
	for newer := range 2 {
		e := newEnv(t)
		d := e.create(acctA, tokA, "db")
		cur := e.catalogDB(d.UUID)
		// The same database on both hosts: the one at the higher routing
		// generation is the live one (relocated), the other a leftover.
		for i, h := range e.hosts {
			h.mu.Lock()
			for id := range h.objects {
				delete(h.objects, id)
			}
			gen := cur.RoutingGeneration
			if i == newer {
				gen++
			}
			h.objects[newObjectID()] = &fakeObject{req: InitRequest{DatabaseUUID: d.UUID, AccountID: acctA},
				state: "active", confirmed: true, gen: gen}
			h.mu.Unlock()
		}
		e.forgetRoutesAndCutCatalog()
		a := e.call("POST", dbPath(acctA)+"/"+d.UUID+"/query", tokA, selectOne)
		require.Equal(t, 200, a.Status, "%s", a.Raw)
		assert.EqualValues(t, 1, e.hosts[newer].queries.Load(), "host %d holds the higher generation", newer)
		assert.EqualValues(t, 0, e.hosts[1-newer].queries.Load())
		rt, _ := e.srv.cache.Get(d.UUID)
		assert.Equal(t, cur.RoutingGeneration+1, rt.Generation)
	}
}

func TestHostRouteNeverCrossesAccounts(t *testing.T) {
	e := newEnv(t)
	d := e.create(acctA, tokA, "db")
	require.Equal(t, 200, e.call("GET", dbPath(acctB), tokB, nil).Status) // B's token validated
	e.forgetRoutesAndCutCatalog()

	// B names A's database on its own path: as unknown as a missing one
	// (503 while the catalog is away: the hosts' view is never a
	// definite "not found").
	a := e.call("POST", dbPath(acctB)+"/"+d.UUID+"/query", tokB, selectOne)
	assert.Equal(t, 503, a.Status, "%s", a.Raw)
	assert.Equal(t, 7503, a.code())
	missing := e.call("POST", dbPath(acctB)+"/"+uuid.NewString()+"/query", tokB, selectOne)
	assert.Equal(t, a.Status, missing.Status, "another account's database answers like a missing one")
	_, res := e.srv.cache.Get(d.UUID)
	assert.Equal(t, cacheMiss, res, "nothing cached from B's lookup")

	// A's own lookup caches the route; B still gets 404 from it.
	require.Equal(t, 200, e.call("POST", dbPath(acctA)+"/"+d.UUID+"/query", tokA, selectOne).Status)
	a = e.call("POST", dbPath(acctB)+"/"+d.UUID+"/query", tokB, selectOne)
	assert.Equal(t, 404, a.Status, "%s", a.Raw)
	var ran int64
	for _, h := range e.hosts {
		ran += h.queries.Load()
	}
	assert.EqualValues(t, 1, ran, "only A's query ran")
}

func TestHostRouteDeletedOrOldHosts(t *testing.T) {
	e := newEnv(t)
	d := e.create(acctA, tokA, "db")
	host := e.hostOf(e.catalogDB(d.UUID).ObjectID)
	e.forgetRoutesAndCutCatalog()

	// A host of an older build answers the new path 404 from its router:
	// unknown, but no proof of absence — still retryable.
	for _, h := range e.hosts {
		h.mu.Lock()
		h.noLocate = true
		h.mu.Unlock()
	}
	a := e.call("POST", dbPath(acctA)+"/"+d.UUID+"/query", tokA, selectOne)
	assert.Equal(t, 503, a.Status, "%s", a.Raw)
	assert.Equal(t, 7503, a.code())
	assert.Equal(t, 1.0, e.hostRouteResults("no_answer"))
	for _, h := range e.hosts {
		h.mu.Lock()
		h.noLocate = h != host
		h.mu.Unlock()
	}
	a = e.call("POST", dbPath(acctA)+"/"+d.UUID+"/query", tokA, selectOne)
	require.Equal(t, 200, a.Status, "the host that holds it answers: %s", a.Raw)

	// The newest object deleted: not found, and nothing cached.
	e.cat.setDown(false)
	d2 := e.create(acctA, tokA, "db2")
	e.forgetRoutesAndCutCatalog()
	for _, h := range e.hosts {
		h.mu.Lock()
		h.noLocate = false
		for _, o := range h.objects {
			if o.req.DatabaseUUID == d2.UUID {
				o.state = "deleted"
			}
		}
		h.mu.Unlock()
	}
	a = e.call("POST", dbPath(acctA)+"/"+d2.UUID+"/query", tokA, selectOne)
	assert.Equal(t, 404, a.Status, "%s", a.Raw)
	// ...but only when every known host answered: one that did not could
	// hold a newer, active object (a relocation), so it stays 503.
	for _, h := range e.hosts {
		h.mu.Lock()
		holds := false
		for _, o := range h.objects {
			holds = holds || o.req.DatabaseUUID == d2.UUID
		}
		h.noLocate = !holds // only the host holding the deleted object answers
		h.mu.Unlock()
	}
	if len(e.hosts) > 1 {
		a = e.call("POST", dbPath(acctA)+"/"+d2.UUID+"/query", tokA, selectOne)
		assert.Equal(t, 503, a.Status, "deleted on one host, another did not answer: %s", a.Raw)
	}
	for _, h := range e.hosts {
		h.mu.Lock()
		h.noLocate = false
		h.mu.Unlock()
	}
	_, res := e.srv.cache.Get(d2.UUID)
	assert.Equal(t, cacheMiss, res)
}

// "No host holds it" is never a definite 404, with or without a host list
// read from the catalog among the hosts asked: a host registered since may
// hold the database, and a client may act on a 404.
func TestHostRouteNeverAnswersNotFoundFromHosts(t *testing.T) {
	e := newEnv(t)
	for _, h := range e.hosts {
		e.srv.o.KnownHosts = append(e.srv.o.KnownHosts, h.addr())
	}
	require.Equal(t, 200, e.call("GET", dbPath(acctA), tokA, nil).Status) // token validated
	e.cat.setDown(true)
	a := e.call("POST", dbPath(acctA)+"/"+uuid.NewString()+"/query", tokA, selectOne)
	assert.Equal(t, 503, a.Status, "%s", a.Raw)
	assert.EqualValues(t, len(e.hosts), e.locates(), "the configured hosts were asked")
	assert.Equal(t, 1.0, e.hostRouteResults("not_found"), "every configured host answered none")

	e.cat.setDown(false)
	e.create(acctA, tokA, "db") // placement reads the catalog's host list
	e.cat.setDown(true)
	a = e.call("POST", dbPath(acctA)+"/"+uuid.NewString()+"/query", tokA, selectOne)
	assert.Equal(t, 503, a.Status, "every host of the catalog's list answered none: still not a definite 404 (%s)", a.Raw)
	assert.Equal(t, 2.0, e.hostRouteResults("not_found"))
}
