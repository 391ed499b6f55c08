package edge

import (
	"crypto/sha256"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// endpointCase is one per-database endpoint, called for database id of
// acctA with tokA. viaHosts: the endpoint only reaches the object, so the
// hosts may route it while the catalog is unavailable (edge/DESIGN.md,
// "Which endpoints route through the object hosts").
type endpointCase struct {
	name     string
	viaHosts bool
	call     func(e *env, id string) answer
}

func signedPath(e *env, kind, id, file string) string {
	e.t.Helper()
	tok, err := e.srv.signURL(urlClaims{Kind: kind, Account: acctA, Database: id, Filename: file,
		Expires: e.clock.Now().Add(time.Hour).Unix()})
	require.NoError(e.t, err)
	if kind == "export" {
		return "/client/v4/shoal/dump/" + tok
	}
	return "/client/v4/shoal/upload/" + tok
}

// download GETs a dump: the body is SQL when it succeeds, an envelope
// otherwise.
func (e *env) download(path string) answer {
	e.t.Helper()
	resp, err := e.ts.Client().Get(e.ts.URL + path)
	require.NoError(e.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(e.t, err)
	a := answer{Status: resp.StatusCode, Header: resp.Header, Raw: b}
	if resp.StatusCode != http.StatusOK {
		require.NoError(e.t, json.Unmarshal(b, &a), "%s", b)
		a.Status, a.Raw = resp.StatusCode, b
	}
	return a
}

var etagAB = strings.Repeat("ab", 16)

var endpointCases = []endpointCase{
	{"query", true, func(e *env, id string) answer {
		return e.call(http.MethodPost, dbPath(acctA)+"/"+id+"/query", tokA, selectOne)
	}},
	{"export", true, func(e *env, id string) answer {
		return e.call(http.MethodPost, dbPath(acctA)+"/"+id+"/export", tokA, map[string]any{"output_format": "polling"})
	}},
	{"export_download", true, func(e *env, id string) answer {
		return e.download(signedPath(e, "export", id, ""))
	}},
	{"import_init", true, func(e *env, id string) answer {
		return e.call(http.MethodPost, dbPath(acctA)+"/"+id+"/import", tokA, map[string]any{"action": "init", "etag": etagAB})
	}},
	{"import_upload", true, func(e *env, id string) answer {
		return e.call(http.MethodPut, signedPath(e, "import", id, etagAB+"-000000000000.sql"), "", "SELECT 1;")
	}},
	{"import_ingest", true, func(e *env, id string) answer {
		return e.call(http.MethodPost, dbPath(acctA)+"/"+id+"/import", tokA, map[string]any{"action": "ingest", "etag": etagAB, "filename": "f.sql"})
	}},
	{"time_travel_bookmark", true, func(e *env, id string) answer {
		return e.call(http.MethodGet, dbPath(acctA)+"/"+id+"/time_travel/bookmark", tokA, nil)
	}},
	{"insights", true, func(e *env, id string) answer {
		return e.call(http.MethodGet, insightsPath(acctA, id, ""), tokA, nil)
	}},
	// Catalog only: the checkpoint of a delete, the catalog's own rows,
	// a credential pinned to a route, a revocation whose 200 must mean
	// "in force on the live object", a restore.
	{"get", false, func(e *env, id string) answer {
		return e.call(http.MethodGet, dbPath(acctA)+"/"+id, tokA, nil)
	}},
	{"update", false, func(e *env, id string) answer {
		return e.call(http.MethodPatch, dbPath(acctA)+"/"+id, tokA, map[string]any{"read_replication": map[string]any{"mode": "auto"}})
	}},
	{"delete", false, func(e *env, id string) answer {
		return e.call(http.MethodDelete, dbPath(acctA)+"/"+id, tokA, nil)
	}},
	{"binding_mint", false, func(e *env, id string) answer {
		return e.call(http.MethodPost, dbPath(acctA)+"/"+id+"/binding", tokA, nil)
	}},
	{"binding_revoke_all", false, func(e *env, id string) answer {
		return e.call(http.MethodDelete, dbPath(acctA)+"/"+id+"/binding", tokA, nil)
	}},
	{"time_travel_restore", false, func(e *env, id string) answer {
		return e.call(http.MethodPost, dbPath(acctA)+"/"+id+"/time_travel/restore?bookmark=00000001-00000000-00000000-"+strings.Repeat("0", 64), tokA, nil)
	}},
	{"fork", false, func(e *env, id string) answer {
		return e.call(http.MethodPost, dbPath(acctA)+"/"+id+"/fork", tokA, map[string]any{"name": "forked"})
	}},
}

func newEndpointEnv(t *testing.T) *env {
	src := &fakeInsights{}
	return newEnv(t, func(o *Options) { o.Insights = src })
}

// TestEndpointsRouteThroughHostsWhenCatalogUnavailable: with no route
// cached and the catalog unavailable, the endpoints that only reach the
// object are routed by the object hosts and served; the others ask no
// host and answer a retryable 503.
func TestEndpointsRouteThroughHostsWhenCatalogUnavailable(t *testing.T) {
	for _, c := range endpointCases {
		t.Run(c.name, func(t *testing.T) {
			e := newEndpointEnv(t)
			d := e.create(acctA, tokA, "db")
			e.forgetRoutesAndCutCatalog()
			a := c.call(e, d.UUID)
			if c.viaHosts {
				require.Equal(t, http.StatusOK, a.Status, "%s", a.Raw)
				assert.EqualValues(t, len(e.hosts), e.locates(), "every known host asked")
				assert.Equal(t, 1.0, e.hostRouteResults("found"))
				return
			}
			assert.Equal(t, http.StatusServiceUnavailable, a.Status, "%s", a.Raw)
			assert.Equal(t, 7503, a.code())
			assert.Zero(t, e.locates(), "a catalog-only endpoint never routes through the hosts")
		})
	}
}

// TestEndpointsAskNoHostOnCatalogNotFound: the catalog's "not found" is
// final on every endpoint: 404, and no host is asked.
func TestEndpointsAskNoHostOnCatalogNotFound(t *testing.T) {
	for _, c := range endpointCases {
		t.Run(c.name, func(t *testing.T) {
			e := newEndpointEnv(t)
			e.create(acctA, tokA, "db") // the edge knows the hosts
			a := c.call(e, uuid.NewString())
			assert.Equal(t, http.StatusNotFound, a.Status, "%s", a.Raw)
			assert.Equal(t, 7404, a.code())
			assert.Zero(t, e.locates(), "a definite not-found from the catalog is final")
		})
	}
}

// TestEndpointsViaHostsKeepTheHostsRules: a database whose newest object
// is deleted (every host answered) is 404 on the endpoints that route
// through the hosts; one no host holds stays 503, never 404.
func TestEndpointsViaHostsKeepTheHostsRules(t *testing.T) {
	for _, c := range endpointCases {
		if !c.viaHosts {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			e := newEndpointEnv(t)
			d := e.create(acctA, tokA, "db")
			e.forgetRoutesAndCutCatalog()
			a := c.call(e, uuid.NewString())
			assert.Equal(t, http.StatusServiceUnavailable, a.Status, "no host holds it: %s", a.Raw)
			for _, h := range e.hosts {
				h.mu.Lock()
				for _, o := range h.objects {
					if o.req.DatabaseUUID == d.UUID {
						o.state = "deleted"
					}
				}
				h.mu.Unlock()
			}
			a = c.call(e, d.UUID)
			assert.Equal(t, http.StatusNotFound, a.Status, "newest object deleted, every host answered: %s", a.Raw)
		})
	}
}

// restart closes the env's edge and starts another on the same directory
// with mod applied to its options (the env's fake catalog and hosts stay).
func (e *env) restart(mod func(*Options)) {
	e.t.Helper()
	o := e.srv.o
	o.KnownHosts = nil
	o.Hosts = nil // the old one is closed with its server
	e.ts.Close()
	require.NoError(e.t, e.srv.Close())
	if mod != nil {
		mod(&o)
	}
	srv, err := New(o)
	require.NoError(e.t, err)
	e.srv = srv
	e.ts = httptest.NewServer(srv)
	e.t.Cleanup(func() {
		e.ts.Close()
		_ = srv.Close()
	})
}

// TestColdRestartRoutesThroughHosts: an edge restarted with the catalog
// down, an empty route cache and no configured hosts still serves a query
// to an existing database — its host book (hostbook.go) names the hosts
// to ask and its token book (tokenbook.go) the validated token — and the
// catalog's "not found" is still never guessed.
func TestColdRestartRoutesThroughHosts(t *testing.T) {
	e := newEnv(t)
	d := e.create(acctA, tokA, "db")
	require.Equal(t, 200, e.call(http.MethodPost, dbPath(acctA)+"/"+d.UUID+"/query", tokA, selectOne).Status)
	require.NoError(t, e.srv.Purge())
	require.Zero(t, e.srv.cache.Len())
	e.cat.setDown(true)
	e.restart(nil)
	assert.ElementsMatch(t, []string{e.hosts[0].addr(), e.hosts[1].addr()}, e.srv.cache.Hosts(), "the host book survived the restart and the purge")

	a := e.call(http.MethodPost, dbPath(acctA)+"/"+d.UUID+"/query", tokA, selectOne)
	require.Equal(t, 200, a.Status, "%s", a.Raw)
	assert.Equal(t, 1.0, e.hostRouteResults("found"))
	a = e.call(http.MethodPost, dbPath(acctA)+"/"+uuid.NewString()+"/query", tokA, selectOne)
	assert.Equal(t, 503, a.Status, "no host holds it: retryable, never 404 (%s)", a.Raw)
	a = e.call(http.MethodPost, dbPath(acctA)+"/"+d.UUID+"/query", tokB, selectOne)
	assert.Equal(t, 503, a.Status, "a token this edge never validated cannot be checked: %s", a.Raw)
}

// TestHostBookFollowsTheCatalog: the catalog's host list replaces the
// book (a host no longer registered is forgotten); routes and queries add
// to it; a purge keeps it.
func TestHostBookFollowsTheCatalog(t *testing.T) {
	dir := t.TempDir()
	c, err := OpenRouteCache(dir+"/routes.db", RouteCacheOptions{})
	require.NoError(t, err)
	_, err = c.Put(Route{DatabaseUUID: uuid.NewString(), ObjectID: "o", HostAddress: "10.0.0.1:1", AccountID: acctA, State: "active", Generation: 1})
	require.NoError(t, err)
	require.NoError(t, c.NoteHost("10.0.0.2:1"))
	assert.Equal(t, []string{"10.0.0.1:1", "10.0.0.2:1"}, c.Hosts())
	require.NoError(t, c.Purge())
	require.NoError(t, c.Close())
	c, err = OpenRouteCache(dir+"/routes.db", RouteCacheOptions{})
	require.NoError(t, err)
	defer c.Close()
	assert.Equal(t, []string{"10.0.0.1:1", "10.0.0.2:1"}, c.Hosts(), "kept across a purge and a reopen")
	require.NoError(t, c.ReplaceHosts([]string{"10.0.0.2:1", "10.0.0.3:1"}))
	assert.Equal(t, []string{"10.0.0.2:1", "10.0.0.3:1"}, c.Hosts())
	require.NoError(t, c.Close())
	c, err = OpenRouteCache(dir+"/routes.db", RouteCacheOptions{})
	require.NoError(t, err)
	assert.Equal(t, []string{"10.0.0.2:1", "10.0.0.3:1"}, c.Hosts())
}

// TestTokenBookKeepsOnlyTheGrace: a restarted edge serves a token it
// validated within the stale grace while the catalog is down, not one
// validated before it; a token the catalog stopped knowing is dropped.
func TestTokenBookKeepsOnlyTheGrace(t *testing.T) {
	e := newEnv(t)
	dA := e.create(acctA, tokA, "a")
	e.clock.Advance(10 * time.Minute)
	dB := e.create(acctB, tokB, "b")
	e.clock.Advance(6 * time.Minute) // A's check is past the 15 min grace, B's within
	require.NoError(t, e.srv.Purge())
	e.cat.setDown(true)
	e.restart(nil)
	a := e.call(http.MethodPost, dbPath(acctA)+"/"+dA.UUID+"/query", tokA, selectOne)
	assert.Equal(t, 503, a.Status, "validated too long ago: %s", a.Raw)
	a = e.call(http.MethodPost, dbPath(acctB)+"/"+dB.UUID+"/query", tokB, selectOne)
	assert.Equal(t, 200, a.Status, "validated within the grace, routed by the hosts: %s", a.Raw)

	// The catalog back, B's token gone from it: dropped from the book too.
	e.cat.setDown(false)
	e.cat.mu.Lock()
	delete(e.cat.tokens, HashToken(tokB))
	e.cat.mu.Unlock()
	e.clock.Advance(time.Minute)
	a = e.call(http.MethodGet, dbPath(acctB), tokB, nil)
	require.Equal(t, 401, a.Status, "%s", a.Raw)
	e.restart(nil)
	e.auth().mu.Lock()
	_, kept := e.auth().m[sha256Of(tokB)]
	e.auth().mu.Unlock()
	assert.False(t, kept, "an unknown token is not loaded again")
}

func (e *env) auth() *authenticator { return e.srv.auth }

func sha256Of(s string) [32]byte { return sha256.Sum256([]byte(s)) }

// DESIGN.md states the host book's bound and the token book's rewrite
// period.
func TestHostAndTokenBooksAsDocumented(t *testing.T) {
	doc, err := os.ReadFile("DESIGN.md")
	require.NoError(t, err)
	assert.Contains(t, string(doc), "object host addresses (at most 1,024)")
	assert.Equal(t, 1024, maxKnownHosts)
	assert.Contains(t, string(doc), "rewritten at most once a\nminute")
	assert.Equal(t, time.Minute, tokenSaveEvery)
}

// TestTimeTravelReadsKeepAStaleTierDuringAnOutage: a bookmark at a past
// point needs the account's tier (its retention). While the catalog is
// unavailable the edge answers it from the account row it last read,
// within TokenStaleGrace; past the grace it is 503 again. A restore — a
// write — never takes the stale row.
func TestTimeTravelReadsKeepAStaleTierDuringAnOutage(t *testing.T) {
	e := newEndpointEnv(t)
	d := e.create(acctA, tokA, "db")
	past := e.clock.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
	bookmark := func() answer {
		return e.call(http.MethodGet, dbPath(acctA)+"/"+d.UUID+"/time_travel/bookmark?timestamp="+past, tokA, nil)
	}
	restore := func() answer {
		return e.call(http.MethodPost, dbPath(acctA)+"/"+d.UUID+"/time_travel/restore?timestamp="+past, tokA, nil)
	}
	require.Equal(t, http.StatusOK, bookmark().Status, "the catalog up: the tier read and cached")
	e.cat.setDown(true)
	e.clock.Advance(time.Minute) // past AccountCacheTTL (3 s), within the grace (15 min)
	a := bookmark()
	require.Equal(t, http.StatusOK, a.Status, "a read of history takes the tier read a minute ago: %s", a.Raw)
	a = restore()
	assert.Equal(t, http.StatusServiceUnavailable, a.Status, "a restore takes no stale tier: %s", a.Raw)
	e.clock.Advance(15 * time.Minute)
	a = bookmark()
	assert.Equal(t, http.StatusServiceUnavailable, a.Status, "past the grace: %s", a.Raw)
	assert.Equal(t, 7503, a.code())
}
