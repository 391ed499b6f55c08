package edge

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCreateAnswersCreatedInRegion: wrangler prints the region from
// create's created_in_region, upper-case like D1's.
func TestCreateAnswersCreatedInRegion(t *testing.T) {
	e := newEnv(t)
	a := e.call(http.MethodPost, dbPath(acctA), tokA, map[string]any{"name": "regional", "primary_location_hint": "enam"})
	require.Equal(t, http.StatusOK, a.Status, string(a.Raw))
	var d map[string]any
	require.NoError(t, json.Unmarshal(a.Result, &d))
	assert.Equal(t, "ENAM", d["created_in_region"])
	assert.Equal(t, "ENAM", d["running_in_region"])

	a = e.call(http.MethodGet, dbPath(acctA)+"/"+d["uuid"].(string), tokA, nil)
	require.Equal(t, http.StatusOK, a.Status, string(a.Raw))
	assert.NotContains(t, string(a.Result), "created_in_region", "D1 reports it at create only")
}

// TestD1BodiesAsDocumented: documented D1 input is accepted, unknown fields
// are ignored, and wrong types or malformed JSON still get a clear 400.
func TestD1BodiesAsDocumented(t *testing.T) {
	e := newEnv(t)

	// read_replication at create.
	a := e.call(http.MethodPost, dbPath(acctA), tokA, map[string]any{"name": "rr", "read_replication": map[string]any{"mode": "auto"}})
	require.Equal(t, http.StatusOK, a.Status, string(a.Raw))
	var d databaseJSON
	require.NoError(t, json.Unmarshal(a.Result, &d))
	assert.Equal(t, "auto", d.ReadReplication.Mode)
	assert.Equal(t, "auto", e.catalogDB(d.UUID).ReadReplication)

	// Unknown (future) fields are ignored at create, update, export, import.
	a = e.call(http.MethodPost, dbPath(acctA), tokA, map[string]any{"name": "future", "some_future_field": map[string]any{"x": 1}})
	require.Equal(t, http.StatusOK, a.Status, string(a.Raw))
	var f databaseJSON
	require.NoError(t, json.Unmarshal(a.Result, &f))
	assert.Equal(t, "disabled", f.ReadReplication.Mode)
	base := dbPath(acctA) + "/" + f.UUID
	a = e.call(http.MethodPatch, base, tokA, map[string]any{"read_replication": map[string]any{"mode": "auto", "later": true}, "other": 1})
	require.Equal(t, http.StatusOK, a.Status, string(a.Raw))
	a = e.call(http.MethodPost, base+"/export", tokA, map[string]any{"output_format": "polling", "new_option": "x"})
	require.Equal(t, http.StatusOK, a.Status, string(a.Raw))
	a = e.call(http.MethodPost, base+"/import", tokA, map[string]any{"action": "init", "etag": strings.Repeat("ab", 16), "new_option": "x"})
	require.Equal(t, http.StatusOK, a.Status, string(a.Raw))

	// PATCH {} and PUT {} change nothing and answer the database.
	for _, m := range []string{http.MethodPatch, http.MethodPut} {
		a = e.call(m, base, tokA, map[string]any{})
		require.Equal(t, http.StatusOK, a.Status, string(a.Raw))
		var u databaseJSON
		require.NoError(t, json.Unmarshal(a.Result, &u))
		assert.Equal(t, f.UUID, u.UUID)
		assert.Equal(t, "auto", u.ReadReplication.Mode, "unchanged by an empty update")
	}
	assert.Equal(t, "auto", e.catalogDB(f.UUID).ReadReplication)

	// Known fields are still validated strictly; errors are v4 envelopes.
	bad := []struct {
		method, path string
		body         any
		want         string
	}{
		{http.MethodPost, dbPath(acctA), map[string]any{"name": "x1", "read_replication": map[string]any{"mode": "sometimes"}}, "read_replication.mode"},
		{http.MethodPost, dbPath(acctA), map[string]any{"name": "x2", "read_replication": map[string]any{}}, "read_replication.mode => required"},
		{http.MethodPost, dbPath(acctA), map[string]any{"name": "x3", "read_replication": "auto"}, "read_replication"},
		{http.MethodPost, dbPath(acctA), map[string]any{"name": 7}, "name"},
		{http.MethodPost, dbPath(acctA), `{"name": "x4"`, "malformed JSON"},
		{http.MethodPost, dbPath(acctA), `{"name": "x5"} {}`, "trailing data"},
		{http.MethodPatch, base, map[string]any{"read_replication": map[string]any{"mode": 1}}, "read_replication.mode"},
		{http.MethodPatch, base, `not json`, "malformed JSON"},
		{http.MethodPost, base + "/export", map[string]any{"output_format": "polling", "dump_options": map[string]any{"tables": "t"}}, "dump_options.tables"},
	}
	for _, c := range bad {
		a := e.call(c.method, c.path, tokA, c.body)
		assert.Equal(t, http.StatusBadRequest, a.Status, "%v: %s", c.body, a.Raw)
		assert.Equal(t, 7400, a.code(), "%v", c.body)
		assert.False(t, a.Success)
		if assert.NotEmpty(t, a.Errors) {
			assert.Contains(t, a.Errors[0].Message, c.want, "%v", c.body)
		}
	}
	_, err := e.cat.DatabaseByName(t.Context(), acctA, "x1")
	assert.Error(t, err, "a refused create made nothing")
}
