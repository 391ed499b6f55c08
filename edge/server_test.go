package edge

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/raftmeta/fsm"
)

func TestCRUDAndQueryEnvelope(t *testing.T) {
	e := newEnv(t)
	d := e.create(acctA, tokA, "my-db")
	assert.Len(t, d.UUID, 36)
	assert.Equal(t, "my-db", d.Name)
	assert.Equal(t, "production", d.Version)
	assert.Equal(t, "WEUR", d.RunningInRegion, "placed in the edge's region")
	assert.Nil(t, d.Jurisdiction)
	assert.Equal(t, "disabled", d.ReadReplication.Mode)
	_, err := time.Parse(time.RFC3339, d.CreatedAt)
	require.NoError(t, err)

	// Info combines catalog row and object's live size/table count.
	a := e.call("GET", dbPath(acctA)+"/"+d.UUID, tokA, nil)
	require.Equal(t, 200, a.Status, "%s", a.Raw)
	var info map[string]any
	require.NoError(t, json.Unmarshal(a.Result, &info))
	for _, f := range []string{"uuid", "name", "created_at", "version", "num_tables", "file_size", "jurisdiction", "running_in_region", "read_replication"} {
		assert.Contains(t, info, f)
	}
	assert.EqualValues(t, 2, info["num_tables"])
	assert.EqualValues(t, 8192, info["file_size"])

	// List with result_info.
	e.create(acctA, tokA, "other-db")
	a = e.call("GET", dbPath(acctA)+"?name=my&page=1&per_page=10", tokA, nil)
	require.Equal(t, 200, a.Status)
	var items []map[string]any
	require.NoError(t, json.Unmarshal(a.Result, &items))
	require.Len(t, items, 1)
	assert.Equal(t, d.UUID, items[0]["uuid"])
	require.NotNil(t, a.ResultInfo)
	assert.Equal(t, 1, a.ResultInfo.Count)
	assert.EqualValues(t, 1, a.ResultInfo.TotalCount)
	assert.Equal(t, 10, a.ResultInfo.PerPage)

	// Query: results and meta pass through.
	a = e.call("POST", dbPath(acctA)+"/"+d.UUID+"/query", tokA, map[string]any{"sql": "SELECT ?", "params": []any{"1"}})
	require.Equal(t, 200, a.Status, "%s", a.Raw)
	var res []struct {
		Results []map[string]any `json:"results"`
		Success bool             `json:"success"`
		Meta    map[string]any   `json:"meta"`
	}
	require.NoError(t, json.Unmarshal(a.Result, &res))
	require.Len(t, res, 1)
	assert.True(t, res[0].Success)
	assert.Equal(t, "SELECT ?", res[0].Results[0]["sql"])
	assert.EqualValues(t, 1, res[0].Meta["rows_read"])
	assert.Equal(t, "WEUR", res[0].Meta["served_by_region"])

	// Raw with a batch.
	a = e.call("POST", dbPath(acctA)+"/"+d.UUID+"/raw", tokA, map[string]any{"batch": []any{
		map[string]any{"sql": "SELECT 1"}, map[string]any{"sql": "SELECT ?", "params": []any{2}}}})
	require.Equal(t, 200, a.Status, "%s", a.Raw)
	var raw []struct {
		Results struct {
			Columns []string `json:"columns"`
			Rows    [][]any  `json:"rows"`
		} `json:"results"`
	}
	require.NoError(t, json.Unmarshal(a.Result, &raw))
	require.Len(t, raw, 2)
	assert.Equal(t, []string{"sql"}, raw[1].Results.Columns)

	// Update read replication.
	for _, m := range []string{"PUT", "PATCH"} {
		a = e.call(m, dbPath(acctA)+"/"+d.UUID, tokA, map[string]any{"read_replication": map[string]any{"mode": "auto"}})
		require.Equal(t, 200, a.Status, "%s", a.Raw)
		var up databaseJSON
		require.NoError(t, json.Unmarshal(a.Result, &up))
		assert.Equal(t, "auto", up.ReadReplication.Mode)
		assert.EqualValues(t, 2, up.NumTables, "live table count from the object")
	}

	// Delete: null result; then not found everywhere; the object learns.
	a = e.call("DELETE", dbPath(acctA)+"/"+d.UUID, tokA, nil)
	require.Equal(t, 200, a.Status, "%s", a.Raw)
	assert.Equal(t, "null", string(a.Result))
	for _, c := range []struct{ m, p string }{{"GET", ""}, {"DELETE", ""}, {"POST", "/query"}} {
		var body any
		if c.m == "POST" {
			body = map[string]any{"sql": "SELECT 1"}
		}
		a = e.call(c.m, dbPath(acctA)+"/"+d.UUID+c.p, tokA, body)
		assert.Equal(t, 404, a.Status, "%s %s", c.m, c.p)
		assert.Equal(t, 7404, a.code())
	}
	catDB := e.catalogDB(d.UUID)
	require.NoError(t, e.srv.Close()) // waits for the background delete notification
	assert.Equal(t, "deleted", e.hostOf(catDB.ObjectID).object(catDB.ObjectID).state)
}

func TestCreateConfirmsInBackgroundAndFillsCache(t *testing.T) {
	e := newEnv(t)
	d := e.create(acctA, tokA, "db1")
	catDB := e.catalogDB(d.UUID)
	rt, res := e.srv.cache.Get(d.UUID)
	assert.Equal(t, cacheHit, res, "the new route is written through")
	assert.Equal(t, catDB.ObjectID, rt.ObjectID)
	require.NoError(t, e.srv.Close()) // waits for the background confirm
	o := e.hostOf(catDB.ObjectID).object(catDB.ObjectID)
	assert.True(t, o.confirmed, "step 7: the object is confirmed after the answer")
}

func TestCreateRetriesWithNewIDsAfterInitFailure(t *testing.T) {
	e := newEnv(t)
	e.hosts[0].failInit = 1 // weur host refuses the first init
	d := e.create(acctA, tokA, "db1")
	e.hosts[0].mu.Lock()
	e.hosts[1].mu.Lock()
	all := append(append([]InitRequest{}, e.hosts[0].inits...), e.hosts[1].inits...)
	e.hosts[0].mu.Unlock()
	e.hosts[1].mu.Unlock()
	require.Len(t, all, 1, "the failed init recorded nothing")
	assert.Equal(t, d.UUID, all[0].DatabaseUUID)
	// The first attempt's ids never reached the catalog.
	e.cat.mu.Lock()
	require.Len(t, e.cat.created, 1)
	e.cat.mu.Unlock()
}

func TestCreateRetriesWithNewIDsAfterFailpointAndCatalogFailure(t *testing.T) {
	var fails atomic.Int64
	e := newEnv(t, func(o *Options) {
		o.Failpoint = func(step string) error {
			if step == "create:after-init" && fails.Add(1) == 1 {
				return fmt.Errorf("%w: injected", ErrUnavailable)
			}
			return nil
		}
	})
	e.cat.failWrite = []error{errCatalogDown} // attempt 2: the catalog write fails (not committed)
	d := e.create(acctA, tokA, "db1")
	uuids, objects := map[string]bool{}, map[string]bool{}
	for _, h := range e.hosts {
		h.mu.Lock()
		for i, in := range h.inits {
			assert.False(t, uuids[in.DatabaseUUID], "a UUID is never reused")
			assert.False(t, objects[h.initIDs[i]], "an object id is never reused")
			uuids[in.DatabaseUUID], objects[h.initIDs[i]] = true, true
		}
		h.mu.Unlock()
	}
	assert.Len(t, uuids, 3, "three attempts: failpoint, catalog failure, success")
	assert.True(t, uuids[d.UUID])
	e.cat.mu.Lock()
	assert.Len(t, e.cat.created, 2)
	assert.NotEqual(t, e.cat.created[0].UUID, e.cat.created[1].UUID)
	assert.NotEqual(t, e.cat.created[0].ObjectID, e.cat.created[1].ObjectID)
	e.cat.mu.Unlock()
}

func TestCreateLostAnswerAfterCatalogWriteIsResolved(t *testing.T) {
	// The catalog commits but the answer is lost: the retry (new ids) hits
	// name-taken, and the edge recognises its own earlier attempt.
	e := newEnv(t)
	e.cat.lostWrite = 1
	d := e.create(acctA, tokA, "db1")
	e.cat.mu.Lock()
	require.Len(t, e.cat.created, 2)
	first := e.cat.created[0]
	e.cat.mu.Unlock()
	assert.Equal(t, first.UUID, d.UUID, "the committed first attempt is the database")
	a := e.call("GET", dbPath(acctA), tokA, nil)
	assert.EqualValues(t, 1, a.ResultInfo.TotalCount)
}

func TestCreateFailpointAfterCheckpointDatabaseExists(t *testing.T) {
	e := newEnv(t, func(o *Options) {
		o.Failpoint = func(step string) error {
			if step == "create:after-catalog-write" {
				return fmt.Errorf("%w: edge died", ErrUnavailable)
			}
			return nil
		}
	})
	a := e.call("POST", dbPath(acctA), tokA, map[string]any{"name": "db1"})
	require.Equal(t, 503, a.Status)
	assert.Equal(t, 7503, a.code())
	assert.NotEmpty(t, a.Header.Get("Retry-After"))
	// The database exists: listed, and queryable (route from the catalog).
	a = e.call("GET", dbPath(acctA), tokA, nil)
	var items []listItemJSON
	require.NoError(t, json.Unmarshal(a.Result, &items))
	require.Len(t, items, 1)
	q := e.call("POST", dbPath(acctA)+"/"+items[0].UUID+"/query", tokA, map[string]any{"sql": "SELECT 1"})
	assert.Equal(t, 200, q.Status, "%s", q.Raw)
	// A client retry of the create is refused: the name is taken.
	a = e.call("POST", dbPath(acctA), tokA, map[string]any{"name": "db1"})
	assert.Equal(t, 400, a.Status)
	assert.Equal(t, 7502, a.code())
}

func TestCreateFinalErrorsAreNotRetried(t *testing.T) {
	e := newEnv(t)
	e.create(acctA, tokA, "db1")
	a := e.call("POST", dbPath(acctA), tokA, map[string]any{"name": "db1"})
	assert.Equal(t, 400, a.Status)
	assert.Equal(t, 7502, a.code())
	e.cat.mu.Lock()
	assert.Len(t, e.cat.created, 2, "name taken is final: one attempt")
	e.cat.mu.Unlock()

	e.cat.addAccount("acct-c", 1)
	e.cat.addToken("tok-c", "acct-c", false)
	e.create("acct-c", "tok-c", "x")
	e.clock.Advance(time.Minute) // the account cache expires
	a = e.call("POST", dbPath("acct-c"), "tok-c", map[string]any{"name": "y"})
	assert.Equal(t, 400, a.Status)
	assert.Equal(t, 7406, a.code())
	assert.Equal(t, "The account has reached its limit of 1 databases (free tier): delete a database or upgrade the account to create more",
		a.Errors[0].Message, "the refusal names the limit")
}

func TestCreatePlacement(t *testing.T) {
	e := newEnv(t)
	a := e.call("POST", dbPath(acctA), tokA, map[string]any{"name": "east", "primary_location_hint": "enam"})
	require.Equal(t, 200, a.Status, "%s", a.Raw)
	var d databaseJSON
	require.NoError(t, json.Unmarshal(a.Result, &d))
	assert.Equal(t, "ENAM", d.RunningInRegion)
	// No host in jurisdiction eu: refused, not a silent misplacement
	// (placement_test.go checks the refusal itself).
	a = e.call("POST", dbPath(acctA), tokA, map[string]any{"name": "eu-db", "jurisdiction": "eu"})
	assert.Equal(t, 400, a.Status)
	e.cat.mu.Lock()
	h := e.cat.hosts["h2"]
	h.Jurisdiction = "eu"
	e.cat.hosts["h2"] = h
	e.cat.mu.Unlock()
	e.clock.Advance(time.Minute) // host list cache expires
	a = e.call("POST", dbPath(acctA), tokA, map[string]any{"name": "eu-db", "jurisdiction": "eu"})
	require.Equal(t, 200, a.Status, "%s", a.Raw)
	require.NoError(t, json.Unmarshal(a.Result, &d))
	require.NotNil(t, d.Jurisdiction)
	assert.Equal(t, "eu", *d.Jurisdiction)
}

func TestAccountIsolation(t *testing.T) {
	e := newEnv(t)
	d := e.create(acctA, tokA, "secret-db")
	other := e.create(acctB, tokB, "b-db")
	q := map[string]any{"sql": "SELECT 1"}
	// A's token on B's path: forbidden on every endpoint.
	for _, c := range []struct {
		m, p string
		b    any
	}{
		{"POST", "", map[string]any{"name": "x"}}, {"GET", "", nil}, {"GET", "/" + other.UUID, nil},
		{"PATCH", "/" + other.UUID, map[string]any{"read_replication": map[string]any{"mode": "auto"}}},
		{"DELETE", "/" + other.UUID, nil}, {"POST", "/" + other.UUID + "/query", q}, {"POST", "/" + other.UUID + "/raw", q},
		{"POST", "/" + other.UUID + "/binding", nil},
	} {
		a := e.call(c.m, dbPath(acctB)+c.p, tokA, c.b)
		assert.Equal(t, 403, a.Status, "%s %s", c.m, c.p)
		assert.Equal(t, 7403, a.code())
	}
	// B's token on B's path naming A's database: not found (existence does not leak).
	for _, c := range []struct {
		m, p string
		b    any
	}{
		{"GET", "", nil}, {"PUT", "", map[string]any{"read_replication": map[string]any{"mode": "auto"}}},
		{"DELETE", "", nil}, {"POST", "/query", q}, {"POST", "/raw", q}, {"POST", "/binding", nil},
	} {
		a := e.call(c.m, dbPath(acctB)+"/"+d.UUID+c.p, tokB, c.b)
		assert.Equal(t, 404, a.Status, "%s %s", c.m, c.p)
		assert.Equal(t, 7404, a.code())
	}
	a := e.call("GET", dbPath(acctB), tokB, nil)
	assert.NotContains(t, string(a.Result), d.UUID)
	// No token / bad token.
	a = e.call("GET", dbPath(acctA), "", nil)
	assert.Equal(t, 401, a.Status)
	assert.Equal(t, 10000, a.code())
	a = e.call("GET", dbPath(acctA), "nope", nil)
	assert.Equal(t, 401, a.Status)
	// A's database still intact.
	a = e.call("POST", dbPath(acctA)+"/"+d.UUID+"/query", tokA, q)
	assert.Equal(t, 200, a.Status)
}

func TestNegativeEntries(t *testing.T) {
	e := newEnv(t)
	unknown := "6f1c1d2e-3f40-4a5b-8c6d-7e8f90a1b2c3"
	q := map[string]any{"sql": "SELECT 1"}
	for i := 0; i < 3; i++ {
		a := e.call("POST", dbPath(acctA)+"/"+unknown+"/query", tokA, q)
		assert.Equal(t, 404, a.Status)
	}
	assert.EqualValues(t, 1, e.cat.count("Database"), "negative entry answers repeats")
	e.clock.Advance(3 * time.Second)
	e.call("POST", dbPath(acctA)+"/"+unknown+"/query", tokA, q)
	assert.EqualValues(t, 2, e.cat.count("Database"), "negative entries expire")
	// A real route replaces a negative entry.
	e.srv.cache.PutNegative("7f1c1d2e-3f40-4a5b-8c6d-7e8f90a1b2c3")
	_, err := e.srv.cache.Put(Route{DatabaseUUID: "7f1c1d2e-3f40-4a5b-8c6d-7e8f90a1b2c3", State: "active", Generation: 1})
	require.NoError(t, err)
	_, res := e.srv.cache.Get("7f1c1d2e-3f40-4a5b-8c6d-7e8f90a1b2c3")
	assert.Equal(t, cacheHit, res)
}

func TestStaleRouteIsInvalidatedAndRetriedOnce(t *testing.T) {
	e := newEnv(t)
	d := e.create(acctA, tokA, "db1")
	require.NoError(t, e.srv.cache.Purge())
	// Poison the cache with a route to the wrong object (generation 1)...
	catDB := e.catalogDB(d.UUID)
	wrong := e.create(acctA, tokA, "db2")
	wrongDB := e.catalogDB(wrong.UUID)
	_, err := e.srv.cache.Put(Route{DatabaseUUID: d.UUID, ObjectID: wrongDB.ObjectID, HostAddress: e.cat.hosts[wrongDB.HostID].Address,
		AccountID: acctA, State: "active", Generation: 1})
	require.NoError(t, err)
	// ...while the catalog moved the database at generation 2.
	e.cat.mu.Lock()
	catDB.RoutingGeneration = 2
	e.cat.dbs[d.UUID] = catDB
	e.cat.mu.Unlock()
	h := e.hostOf(catDB.ObjectID)
	h.mu.Lock()
	h.objects[catDB.ObjectID].gen = 2
	h.mu.Unlock()
	before := e.cat.count("Database")
	a := e.call("POST", dbPath(acctA)+"/"+d.UUID+"/query", tokA, map[string]any{"sql": "SELECT 1"})
	require.Equal(t, 200, a.Status, "%s", a.Raw)
	assert.EqualValues(t, before+1, e.cat.count("Database"), "one catalog read for the retry")
	rt, res := e.srv.cache.Get(d.UUID)
	require.Equal(t, cacheHit, res)
	assert.EqualValues(t, 2, rt.Generation)
	assert.Equal(t, catDB.ObjectID, rt.ObjectID)
}

func TestBoundedFallbackUnderPurge(t *testing.T) {
	const capN = 4
	e := newEnv(t, func(o *Options) { o.FallbackCap = capN; o.CatalogTimeout = 5 * time.Second })
	var ids []string
	for i := 0; i < 12; i++ {
		ids = append(ids, e.create(acctA, tokA, fmt.Sprintf("db%d", i)).UUID)
	}
	require.NoError(t, e.srv.Purge())
	gate := make(chan struct{})
	e.cat.mu.Lock()
	e.cat.gate = gate
	e.cat.mu.Unlock()

	// 12 distinct databases, 3 concurrent queries each: 36 requests, 12 misses.
	var wg sync.WaitGroup
	var ok, fast503 atomic.Int64
	results := make(chan answer, 36)
	for _, id := range ids {
		for j := 0; j < 3; j++ {
			wg.Add(1)
			go func(id string) {
				defer wg.Done()
				results <- e.call("POST", dbPath(acctA)+"/"+id+"/query", tokA, map[string]any{"sql": "SELECT 1"})
			}(id)
		}
	}
	// Wait until the cap is full and the excess has been refused.
	require.Eventually(t, func() bool { return e.cat.dbInFlight.Load() == capN && len(results) >= 36-3*capN },
		10*time.Second, 5*time.Millisecond)
	assert.EqualValues(t, capN, e.srv.Stats().FallbackInFlight)
	close(gate)
	wg.Wait()
	close(results)
	for a := range results {
		switch a.Status {
		case 200:
			ok.Add(1)
		case 503:
			assert.Equal(t, 7503, a.code())
			assert.NotEmpty(t, a.Header.Get("Retry-After"))
			fast503.Add(1)
		default:
			t.Errorf("unexpected %d %s", a.Status, a.Raw)
		}
	}
	assert.LessOrEqual(t, e.cat.dbMaxFlight.Load(), int64(capN), "catalog concurrency never exceeds the cap")
	assert.LessOrEqual(t, e.srv.Stats().FallbackMaxSeen, int64(capN))
	assert.EqualValues(t, capN, e.cat.count("Database"), "singleflight: one read per database in flight")
	assert.EqualValues(t, 3*capN, ok.Load(), "requests sharing an admitted read succeed")
	assert.EqualValues(t, 36-3*capN, fast503.Load())
}

func TestBreakerOpensAndFailsFastButCachedRoutesServe(t *testing.T) {
	e := newEnv(t, func(o *Options) { o.BreakerFailures = 3; o.BreakerOpenFor = time.Hour })
	cached := e.create(acctA, tokA, "cached")
	var uncached []string
	for i := 0; i < 10; i++ {
		uncached = append(uncached, e.create(acctA, tokA, fmt.Sprintf("u%d", i)).UUID)
	}
	// Warm the token cache, then forget the uncached routes.
	for _, id := range uncached {
		require.NoError(t, e.srv.cache.Invalidate(id, 1))
	}
	e.clock.Advance(6 * time.Second) // tombstones expire → plain misses
	e.cat.setDown(true)
	q := map[string]any{"sql": "SELECT 1"}
	for _, id := range uncached {
		// The catalog read fails (then is refused by the open breaker);
		// the object hosts' last-resort lookup (hostroute.go) routes it.
		a := e.call("POST", dbPath(acctA)+"/"+id+"/query", tokA, q)
		assert.Equal(t, 200, a.Status, "%s", a.Raw)
	}
	assert.Equal(t, 10.0, e.hostRouteResults("found"))
	assert.Equal(t, "open", e.srv.Stats().BreakerState)
	assert.EqualValues(t, 3, e.cat.count("Database"), "after the breaker opens, misses fail fast without the catalog")
	// Existing databases with cached routes keep working with the catalog down,
	// even past the token TTL (stale grace).
	e.clock.Advance(time.Minute)
	for i := 0; i < 20; i++ {
		a := e.call("POST", dbPath(acctA)+"/"+cached.UUID+"/query", tokA, q)
		require.Equal(t, 200, a.Status, "%s", a.Raw)
	}
	// Create and list fail with a retryable error.
	a := e.call("POST", dbPath(acctA), tokA, map[string]any{"name": "new"})
	assert.Equal(t, 503, a.Status)
	a = e.call("GET", dbPath(acctA), tokA, nil)
	assert.Equal(t, 503, a.Status)
	assert.Equal(t, 7503, a.code())
}

func TestRateLimit429(t *testing.T) {
	e := newEnv(t, func(o *Options) { o.DatabaseRate = RateLimit{Rate: 0.5, Burst: 2} })
	d := e.create(acctA, tokA, "db1")
	q := map[string]any{"sql": "SELECT 1"}
	for i := 0; i < 2; i++ {
		a := e.call("POST", dbPath(acctA)+"/"+d.UUID+"/query", tokA, q)
		require.Equal(t, 200, a.Status)
	}
	a := e.call("POST", dbPath(acctA)+"/"+d.UUID+"/query", tokA, q)
	assert.Equal(t, 429, a.Status)
	assert.Equal(t, 7429, a.code())
	assert.Equal(t, "2", a.Header.Get("Retry-After"))
	// Another database has its own bucket.
	d2 := e.create(acctA, tokA, "db2")
	a = e.call("POST", dbPath(acctA)+"/"+d2.UUID+"/query", tokA, q)
	assert.Equal(t, 200, a.Status)
	e.clock.Advance(2 * time.Second)
	a = e.call("POST", dbPath(acctA)+"/"+d.UUID+"/query", tokA, q)
	assert.Equal(t, 200, a.Status, "the bucket refills")
}

func TestRateLimiterMapIsBounded(t *testing.T) {
	c := newTestClock()
	ls := newLimiters(RateLimit{Rate: 1, Burst: 1}, 3, c.Now)
	for i := 0; i < 10; i++ {
		ok, _ := ls.allow(fmt.Sprint(i))
		assert.True(t, ok)
	}
	assert.Equal(t, 3, ls.len())
	ok, _ := ls.allow("9")
	assert.False(t, ok, "recent keys keep their bucket")
}

func TestValidation(t *testing.T) {
	e := newEnv(t)
	d := e.create(acctA, tokA, "db1")
	qp := dbPath(acctA) + "/" + d.UUID + "/query"
	params101 := make([]any, 101)
	for i := range params101 {
		params101[i] = i
	}
	cases := []struct {
		name, method, path string
		body               any
		status, code       int
	}{
		{"malformed uuid", "POST", dbPath(acctA) + "/not-a-uuid/query", map[string]any{"sql": "SELECT 1"}, 400, 7400},
		{"uuid wrong length", "GET", dbPath(acctA) + "/" + d.UUID + "0", nil, 400, 7400},
		{"bad account id", "GET", "/client/v4/accounts/a%20b/d1/database", nil, 400, 7400},
		{"101 params", "POST", qp, map[string]any{"sql": "SELECT 1", "params": params101}, 400, 7400},
		{"sql over 100 KB", "POST", qp, map[string]any{"sql": strings.Repeat("x", 100_001)}, 413, 7413},
		{"sql is a number", "POST", qp, `{"sql": 1}`, 400, 7400},
		{"params is an object", "POST", qp, `{"sql": "SELECT 1", "params": {"a": 1}}`, 400, 7400},
		{"param is an object", "POST", qp, `{"sql": "SELECT ?", "params": [{"a": 1}]}`, 400, 7400},
		{"param array not bytes", "POST", qp, `{"sql": "SELECT ?", "params": [[1, 300]]}`, 400, 7400},
		{"unknown field", "POST", qp, `{"sql": "SELECT 1", "sqll": 2}`, 400, 7400},
		{"sql and batch", "POST", qp, `{"sql": "SELECT 1", "batch": [{"sql": "SELECT 2"}]}`, 400, 7400},
		{"empty batch", "POST", qp, `{"batch": []}`, 400, 7400},
		{"batch entry without sql", "POST", qp, `{"batch": [{"params": [1]}]}`, 400, 7400},
		{"empty body", "POST", qp, ``, 400, 7400},
		{"not json", "POST", qp, `SELECT 1`, 400, 7400},
		{"trailing data", "POST", qp, `{"sql": "SELECT 1"} {}`, 400, 7400},
		{"huge body", "POST", qp, `{"sql": "` + strings.Repeat("x", 5<<20) + `"}`, 413, 7413},
		{"bad name", "POST", dbPath(acctA), map[string]any{"name": "Bad Name"}, 400, 7400},
		{"name too long", "POST", dbPath(acctA), map[string]any{"name": strings.Repeat("a", 65)}, 400, 7400},
		{"no name", "POST", dbPath(acctA), map[string]any{}, 400, 7400},
		{"bad hint", "POST", dbPath(acctA), map[string]any{"name": "x", "primary_location_hint": "mars"}, 400, 7400},
		{"bad jurisdiction", "POST", dbPath(acctA), map[string]any{"name": "x", "jurisdiction": "moon"}, 400, 7400},
		{"bad mode", "PATCH", dbPath(acctA) + "/" + d.UUID, map[string]any{"read_replication": map[string]any{"mode": "sometimes"}}, 400, 7400},
		{"bad page", "GET", dbPath(acctA) + "?page=0", nil, 400, 7400},
	}
	before := e.hosts[0].queries.Load() + e.hosts[1].queries.Load()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a := e.call(c.method, c.path, tokA, c.body)
			assert.Equal(t, c.status, a.Status, "%s", a.Raw)
			assert.Equal(t, c.code, a.code())
			assert.False(t, a.Success)
		})
	}
	assert.Equal(t, before, e.hosts[0].queries.Load()+e.hosts[1].queries.Load(), "nothing invalid reaches a host")
	// Upper-case UUIDs are accepted and canonicalised.
	a := e.call("POST", dbPath(acctA)+"/"+strings.ToUpper(d.UUID)+"/query", tokA, map[string]any{"sql": "SELECT ?", "params": []any{"a", 1, 1.5, true, nil, []int{1, 2}}})
	assert.Equal(t, 200, a.Status, "%s", a.Raw)
}

func TestBindingTokens(t *testing.T) {
	e := newEnv(t)
	d := e.create(acctA, tokA, "db1")
	other := e.create(acctA, tokA, "db2")
	a := e.call("POST", dbPath(acctA)+"/"+d.UUID+"/binding", tokA, map[string]any{"ttl_seconds": 600})
	require.Equal(t, 200, a.Status, "%s", a.Raw)
	var m mintResult
	require.NoError(t, json.Unmarshal(a.Result, &m))
	assert.Equal(t, d.UUID, m.DatabaseUUID)
	c, err := e.keys.Verify(m.Token, e.clock.Now())
	require.NoError(t, err)
	assert.Equal(t, e.clock.Now().Add(10*time.Minute).Unix(), c.ExpiresAt)

	// The bound path needs no catalog and no cache: take both away.
	require.NoError(t, e.srv.Purge())
	e.cat.setDown(true)
	before := e.cat.count("Database") + e.cat.count("TokenByHash")
	q := map[string]any{"sql": "SELECT 42"}
	a = e.call("POST", "/client/v4/bound/query", "Binding "+m.Token, q)
	require.Equal(t, 200, a.Status, "%s", a.Raw)
	assert.Contains(t, string(a.Result), "SELECT 42")
	a = e.call("POST", dbPath(acctA)+"/"+d.UUID+"/raw", "Binding "+m.Token, q)
	require.Equal(t, 200, a.Status, "binding token on the normal path: %s", a.Raw)
	assert.Equal(t, before, e.cat.count("Database")+e.cat.count("TokenByHash"))
	// Scoped to one database and one account.
	a = e.call("POST", dbPath(acctA)+"/"+other.UUID+"/query", "Binding "+m.Token, q)
	assert.Equal(t, 404, a.Status)
	a = e.call("POST", dbPath(acctB)+"/"+d.UUID+"/query", "Binding "+m.Token, q)
	assert.Equal(t, 403, a.Status)
	// Tampered or expired tokens are refused by the edge itself.
	a = e.call("POST", "/client/v4/bound/query", "Binding "+m.Token[:len(m.Token)-2]+"xx", q)
	assert.Equal(t, 401, a.Status)
	e.clock.Advance(11 * time.Minute)
	a = e.call("POST", "/client/v4/bound/query", "Binding "+m.Token, q)
	assert.Equal(t, 401, a.Status)
}

func TestTokenCacheTTLAndRevocation(t *testing.T) {
	e := newEnv(t)
	a := e.call("POST", "/admin/v1/accounts", adminTok, map[string]any{"name": "shop", "tier": "paid"})
	require.Equal(t, 200, a.Status, "%s", a.Raw)
	var acct AccountJSON
	require.NoError(t, json.Unmarshal(a.Result, &acct))
	assert.Len(t, acct.ID, 32)
	assert.EqualValues(t, 50_000, acct.Limits.MaxDatabases)
	a = e.call("POST", "/admin/v1/accounts/"+acct.ID+"/tokens", adminTok, map[string]any{"name": "ci"})
	require.Equal(t, 200, a.Status, "%s", a.Raw)
	var tok TokenJSON
	require.NoError(t, json.Unmarshal(a.Result, &tok))
	require.NotEmpty(t, tok.Token)
	e.cat.mu.Lock()
	_, stored := e.cat.tokens[HashToken(tok.Token)]
	e.cat.mu.Unlock()
	assert.True(t, stored, "the catalog stores the hash")

	a = e.call("GET", dbPath(acct.ID), tok.Token, nil)
	require.Equal(t, 200, a.Status)
	// A non-admin token cannot use the admin API.
	a = e.call("GET", "/admin/v1/accounts/"+acct.ID, tok.Token, nil)
	assert.Equal(t, 403, a.Status)
	// Revoke: effective once the cache TTL passes.
	a = e.call("DELETE", "/admin/v1/tokens/"+tok.ID, adminTok, nil)
	require.Equal(t, 200, a.Status, "%s", a.Raw)
	a = e.call("GET", dbPath(acct.ID), tok.Token, nil)
	assert.Equal(t, 200, a.Status, "within the TTL the cached check stands")
	e.clock.Advance(11 * time.Second)
	a = e.call("GET", dbPath(acct.ID), tok.Token, nil)
	assert.Equal(t, 401, a.Status)

	a = e.call("PATCH", "/admin/v1/accounts/"+acct.ID, adminTok, map[string]any{"tier": "free"})
	require.Equal(t, 200, a.Status, "%s", a.Raw)
	require.NoError(t, json.Unmarshal(a.Result, &acct))
	assert.EqualValues(t, 10, acct.Limits.MaxDatabases)
	a = e.call("GET", "/admin/v1/accounts/nope", adminTok, nil)
	assert.Equal(t, 404, a.Status)
}

func TestRequestIDPropagatesAndMetrics(t *testing.T) {
	e := newEnv(t)
	d := e.create(acctA, tokA, "db1")
	a := e.call("POST", dbPath(acctA)+"/"+d.UUID+"/query", tokA, map[string]any{"sql": "SELECT 1"})
	require.Equal(t, 200, a.Status)
	id := a.Header.Get(HeaderRequestID)
	require.NotEmpty(t, id)
	catDB := e.catalogDB(d.UUID)
	h := e.hostOf(catDB.ObjectID)
	h.mu.Lock()
	assert.Equal(t, id, h.lastHdr.Get(HeaderRequestID))
	assert.Equal(t, d.UUID, h.lastHdr.Get(HeaderDatabase))
	assert.Equal(t, acctA, h.lastHdr.Get(HeaderAccount))
	h.mu.Unlock()
	resp, err := e.ts.Client().Get(e.ts.URL + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	buf := new(strings.Builder)
	_, _ = fmt.Fprint(buf, mustRead(resp.Body))
	for _, m := range []string{"shoal_edge_route_cache_hits_total", "shoal_edge_catalog_fallback_in_flight", "shoal_edge_catalog_breaker_state"} {
		assert.Contains(t, buf.String(), m)
	}
	hz := e.call("GET", "/healthz", "", nil)
	assert.Equal(t, 200, hz.Status)
}

func TestCatalogUnavailableIsRetryable(t *testing.T) {
	e := newEnv(t)
	e.cat.setDown(true)
	a := e.call("GET", dbPath(acctA), tokA, nil) // token never seen: cannot authenticate
	assert.Equal(t, 503, a.Status)
	assert.Equal(t, 7503, a.code())
	assert.True(t, errors.Is(fmt.Errorf("x: %w", ErrUnavailable), ErrUnavailable))
}

func TestCloseCancelsBackgroundWorkAfterGrace(t *testing.T) {
	e := newEnv(t, func(o *Options) { o.CloseGrace = 50 * time.Millisecond })
	// A host whose confirm never answers: the background confirm hangs.
	blocked := make(chan struct{})
	released := make(chan struct{})
	hang := newFakeHost(t, e.keys)
	inner := hang.srv.Config.Handler
	hang.srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/confirm") {
			// Consume the body so the server watches the connection and
			// cancels r.Context() when the edge abandons the call.
			_, _ = io.Copy(io.Discard, r.Body)
			close(blocked)
			select {
			case <-r.Context().Done():
				close(released)
			case <-time.After(15 * time.Second): // never hang the test server
			}
			return
		}
		inner.ServeHTTP(w, r)
	})
	e.cat.mu.Lock()
	e.cat.hosts = map[string]fsm.Host{"h9": {ID: "h9", Address: hang.addr(), Region: "weur", Capacity: 10, State: "active"}}
	e.cat.mu.Unlock()
	e.create(acctA, tokA, "db1")
	<-blocked
	done := make(chan error, 1)
	go func() { done <- e.srv.Close() }()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return")
	}
	select {
	case <-released:
	case <-time.After(10 * time.Second):
		t.Fatal("the background confirm was not cancelled")
	}
}
