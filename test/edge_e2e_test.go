package test

import (
	"bytes"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/test/harness"
)

func TestEdgeEndToEnd(t *testing.T) {
	c := harness.NewE2ECluster(t)
	acct, bearer := c.SetupAccount(t, "paid")
	base := func(i int) string { return c.EdgeURL[i] + "/client/v4/accounts/" + acct + "/d1/database" }

	// Create through edge 0.
	a := harness.Call(t, "POST", base(0), bearer, map[string]any{"name": "orders"})
	require.Equal(t, 200, a.Status, "%s", a.Raw)
	var db struct {
		UUID            string `json:"uuid"`
		Name            string `json:"name"`
		RunningInRegion string `json:"running_in_region"`
		NumTables       int    `json:"num_tables"`
		FileSize        int64  `json:"file_size"`
	}
	require.NoError(t, json.Unmarshal(a.Result, &db))
	assert.Equal(t, "WEUR", db.RunningInRegion)

	// Schema and data through edge 0, reads through edge 1 (a route miss there).
	a = harness.Call(t, "POST", base(0)+"/"+db.UUID+"/query", bearer, map[string]any{"batch": []any{
		map[string]any{"sql": "CREATE TABLE orders (id INTEGER PRIMARY KEY, item TEXT NOT NULL, qty INTEGER)"},
		map[string]any{"sql": "INSERT INTO orders (item, qty) VALUES (?, ?), (?, ?)", "params": []any{"apple", 3, "pear", 5}},
	}})
	require.Equal(t, 200, a.Status, "%s", a.Raw)
	var res []struct {
		Results []map[string]any `json:"results"`
		Success bool             `json:"success"`
		Meta    map[string]any   `json:"meta"`
	}
	var rows []map[string]any
	require.Eventually(t, func() bool {
		a = harness.Call(t, "POST", base(1)+"/"+db.UUID+"/query", bearer, map[string]any{"sql": "SELECT item, qty FROM orders WHERE qty > ? ORDER BY id", "params": []any{"1"}})
		if a.Status != 200 {
			return false // edge 1 reads the route from a follower that may lag
		}
		require.NoError(t, json.Unmarshal(a.Result, &res))
		rows = res[0].Results
		return true
	}, 10*time.Second, 50*time.Millisecond)
	require.Len(t, rows, 2)
	assert.Equal(t, "apple", rows[0]["item"])
	assert.EqualValues(t, 5, rows[1]["qty"])
	assert.Contains(t, res[0].Meta, "rows_read")
	assert.Contains(t, res[0].Meta, "duration")

	a = harness.Call(t, "POST", base(1)+"/"+db.UUID+"/raw", bearer, map[string]any{"sql": "SELECT count(*) AS n FROM orders"})
	require.Equal(t, 200, a.Status, "%s", a.Raw)
	assert.Contains(t, string(a.Result), `"columns":["n"]`)

	// SQL errors are 400/7500 with SQLite's message.
	a = harness.Call(t, "POST", base(0)+"/"+db.UUID+"/query", bearer, map[string]any{"sql": "SELECT * FROM nope"})
	assert.Equal(t, 400, a.Status, "%s", a.Raw)
	assert.Equal(t, 7500, a.Code())

	// Info: live table count and size from the object.
	a = harness.Call(t, "GET", base(0)+"/"+db.UUID, bearer, nil)
	require.Equal(t, 200, a.Status, "%s", a.Raw)
	require.NoError(t, json.Unmarshal(a.Result, &db))
	assert.Equal(t, 1, db.NumTables)
	assert.Greater(t, db.FileSize, int64(0))

	a = harness.Call(t, "PATCH", base(0)+"/"+db.UUID, bearer, map[string]any{"read_replication": map[string]any{"mode": "auto"}})
	require.Equal(t, 200, a.Status, "%s", a.Raw)
	assert.Contains(t, string(a.Result), `"mode":"auto"`)

	a = harness.Call(t, "GET", base(1)+"?name=ord", bearer, nil)
	require.Equal(t, 200, a.Status, "%s", a.Raw)
	assert.Contains(t, string(a.Result), db.UUID)

	// Binding token: straight to the host.
	a = harness.Call(t, "POST", base(0)+"/"+db.UUID+"/binding", bearer, nil)
	require.Equal(t, 200, a.Status, "%s", a.Raw)
	var mint struct{ Token string }
	require.NoError(t, json.Unmarshal(a.Result, &mint))
	a = harness.Call(t, "POST", c.EdgeURL[1]+"/client/v4/bound/query", "Binding "+mint.Token, map[string]any{"sql": "SELECT count(*) AS n FROM orders"})
	require.Equal(t, 200, a.Status, "%s", a.Raw)
	assert.Contains(t, string(a.Result), `"n":2`)

	// A second database to delete.
	a = harness.Call(t, "POST", base(1), bearer, map[string]any{"name": "scratch", "primary_location_hint": "enam"})
	require.Equal(t, 200, a.Status, "%s", a.Raw)
	var scratch struct {
		UUID            string `json:"uuid"`
		RunningInRegion string `json:"running_in_region"`
	}
	require.NoError(t, json.Unmarshal(a.Result, &scratch))
	assert.Equal(t, "ENAM", scratch.RunningInRegion)
	a = harness.Call(t, "POST", base(1)+"/"+scratch.UUID+"/query", bearer, map[string]any{"sql": "SELECT 1"})
	require.Equal(t, 200, a.Status, "%s", a.Raw)
	a = harness.Call(t, "DELETE", base(1)+"/"+scratch.UUID, bearer, nil)
	require.Equal(t, 200, a.Status, "%s", a.Raw)
	a = harness.Call(t, "POST", base(1)+"/"+scratch.UUID+"/query", bearer, map[string]any{"sql": "SELECT 1"})
	assert.Equal(t, 404, a.Status, "%s", a.Raw)
	// Edge 0 still has the old route cached: the object itself refuses
	// (410), the edge re-resolves and answers not found.
	require.Eventually(t, func() bool {
		a = harness.Call(t, "POST", base(0)+"/"+scratch.UUID+"/query", bearer, map[string]any{"sql": "SELECT 1"})
		return a.Status == 404
	}, 10*time.Second, 50*time.Millisecond, "%s", a.Raw)

	// After a purge, routes refill from the catalog (bounded fallback).
	require.NoError(t, c.Edges[0].Purge())
	var wg sync.WaitGroup
	statuses := make(chan int, 32)
	for i := 0; i < 32; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			statuses <- harness.Call(t, "POST", base(0)+"/"+db.UUID+"/query", bearer, map[string]any{"sql": "SELECT 1"}).Status
		}()
	}
	wg.Wait()
	close(statuses)
	for st := range statuses {
		assert.Equal(t, 200, st)
	}

	// Warm both edges' routes for "orders", then stop every catalog node.
	for i := range c.Edges {
		a = harness.Call(t, "POST", base(i)+"/"+db.UUID+"/query", bearer, map[string]any{"sql": "SELECT 1"})
		require.Equal(t, 200, a.Status)
	}
	c.StopCatalog()
	const perEdge = 150
	var ok, total int
	start := time.Now()
	for i := 0; i < perEdge || time.Since(start) < 3*time.Second; i++ {
		for e := range c.Edges {
			a = harness.Call(t, "POST", base(e)+"/"+db.UUID+"/query", bearer, map[string]any{"sql": "SELECT item FROM orders WHERE id = ?", "params": []any{1 + i%2}})
			total++
			if a.Status == 200 {
				ok++
			} else {
				t.Logf("query with catalog down: %d %s", a.Status, a.Raw)
			}
		}
	}
	t.Logf("catalog down: %d/%d queries succeeded over %s", ok, total, time.Since(start).Round(time.Millisecond))
	assert.Equal(t, total, ok, "every query on an existing database succeeds with the catalog down")
	// A purged edge cannot read routes from the catalog while it is down:
	// it asks the object hosts instead (edge/hostroute.go, invariant 8)
	// and the query is served; a database no host holds stays a
	// retryable 503, never a 404 on the hosts' partial view.
	require.NoError(t, c.Edges[1].Purge())
	a = harness.Call(t, "POST", base(1)+"/"+db.UUID+"/query", bearer, map[string]any{"sql": "SELECT 1"})
	assert.Equal(t, 200, a.Status, "routed by the object hosts: %s", a.Raw)
	a = harness.Call(t, "POST", base(1)+"/"+uuid.NewString()+"/query", bearer, map[string]any{"sql": "SELECT 1"})
	assert.Equal(t, 503, a.Status, "%s", a.Raw)
	assert.Equal(t, 7503, a.Code())
	// Control plane: retryable errors.
	a = harness.Call(t, "POST", base(0), bearer, map[string]any{"name": "during-outage"})
	assert.Equal(t, 503, a.Status, "%s", a.Raw)
	assert.Equal(t, 7503, a.Code())
	a = harness.Call(t, "GET", base(1), bearer, nil)
	assert.Equal(t, 503, a.Status, "%s", a.Raw)
	assert.Equal(t, 7503, a.Code())

	// Restart the catalog: creates continue.
	c.RestartCatalog(t)
	require.Eventually(t, func() bool {
		a = harness.Call(t, "POST", base(0), bearer, map[string]any{"name": "after-outage"})
		return a.Status == 200
	}, 60*time.Second, 250*time.Millisecond, "create never recovered: %s", a.Raw)
	var after struct{ UUID string }
	require.NoError(t, json.Unmarshal(a.Result, &after))
	a = harness.Call(t, "POST", base(0)+"/"+after.UUID+"/query", bearer, map[string]any{"sql": "SELECT 1 AS one"})
	assert.Equal(t, 200, a.Status, "%s", a.Raw)
	require.Eventually(t, func() bool {
		a = harness.Call(t, "GET", base(1), bearer, nil)
		return a.Status == 200 && bytes.Contains(a.Raw, []byte(after.UUID))
	}, 30*time.Second, 100*time.Millisecond)
}
