package edge

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Every database route answers 405 to a method it does not serve — mux's
// method mismatch is sensitive to the order routes are registered in (the
// time-travel routes once turned POST …/insights into a 404).
func TestDatabaseRoutesWrongMethodIs405(t *testing.T) {
	e := newEnv(t)
	id := "01a23504-33ae-784b-b692-1bbc0e16e225"
	for _, c := range []struct{ method, suffix string }{
		{http.MethodPost, "/" + id + "/insights"},
		{http.MethodPost, "/" + id + "/time_travel/bookmark"},
		{http.MethodGet, "/" + id + "/time_travel/restore"},
		{http.MethodGet, "/" + id + "/export"},
		{http.MethodGet, "/" + id + "/query"},
	} {
		a := e.call(c.method, dbPath(acctA)+c.suffix, tokA, nil)
		assert.Equal(t, http.StatusMethodNotAllowed, a.Status, "%s %s: %s", c.method, c.suffix, a.Raw)
	}
}

// A restore or a fork at a point whose archived history the store lost
// answers the host's D1-style refusal (400 7400, naming what no longer
// restores: objecthost/restoredamage.go) to the client in the v4 envelope,
// not a retryable 503, and a fork creates nothing.
func TestDamagedHistoryReachesTheClient(t *testing.T) {
	e := newEnv(t)
	d := e.create(acctA, tokA, "tt-damaged")
	const msg = "bookmark 00000001-… can no longer be restored: the archive of its history is damaged (records 5..9 of generation 0000000000000001 are lost or fail their checksum); nothing was changed: the database keeps its current content"
	for _, h := range e.hosts {
		h.mu.Lock()
		h.damaged = msg
		h.mu.Unlock()
	}
	bm := "00000001-00000000-00000000-" + strings.Repeat("0", 64)
	a := e.call("POST", dbPath(acctA)+"/"+d.UUID+"/time_travel/restore?bookmark="+bm, tokA, nil)
	require.Equal(t, http.StatusBadRequest, a.Status, a.Raw)
	require.False(t, a.Success)
	require.Len(t, a.Errors, 1)
	assert.Equal(t, 7400, a.Errors[0].Code)
	assert.Equal(t, msg, a.Errors[0].Message)

	a = e.call("POST", dbPath(acctA)+"/"+d.UUID+"/fork", tokA, map[string]any{"name": "tt-fork", "bookmark": bm})
	require.Equal(t, http.StatusBadRequest, a.Status, a.Raw)
	require.Len(t, a.Errors, 1)
	assert.Equal(t, 7400, a.Errors[0].Code)
	assert.Equal(t, msg, a.Errors[0].Message)
	a = e.call("GET", dbPath(acctA)+"?name=tt-fork", tokA, nil)
	require.Equal(t, http.StatusOK, a.Status, a.Raw)
	assert.NotContains(t, string(a.Result), "tt-fork", "no database was created")
}
