package objecthost

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/internal/pki"
	"github.com/shoaldb/shoal/pipeline/event"
)

// TestLocateForEdgesOnly checks GET /v1/databases/{uuid}/objects, the
// edges' last-resort route lookup: under mutual TLS only edges (and
// operators) may ask; it answers the caller account's objects of the
// database from the index — active, deleted — and 404 for an unknown
// database and for another account's, alike.
func TestLocateForEdgesOnly(t *testing.T) {
	issue := testCA(t)
	hostTLS := issue("h1", pki.RoleHost)
	th := newTestHost(t, func(c *Config) { c.TLS = hostTLS })
	ln := serveTLS(t, th, hostTLS)

	live := newDB("acct-a")
	th.mustInit(t, live)
	_, err := th.Confirm(context.Background(), live.obj, 0)
	require.NoError(t, err)
	gone := newDB("acct-a")
	th.mustInit(t, gone)
	_, err = th.Delete(context.Background(), gone.obj, 0)
	require.NoError(t, err)

	get := func(l *pki.Loader, id, acct string) (int, []event.LocatedObject, string) {
		t.Helper()
		hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: l.ClientFor(pki.RoleHost)}}
		req, err := http.NewRequest(http.MethodGet, "https://"+ln.Addr().String()+"/v1/databases/"+id+"/objects", nil)
		require.NoError(t, err)
		req.Header.Set(HeaderAccount, acct)
		resp, err := hc.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		var env struct {
			Result event.LocateAnswer `json:"result"`
		}
		if resp.StatusCode == http.StatusOK {
			require.NoError(t, json.Unmarshal(b, &env), string(b))
		}
		return resp.StatusCode, env.Result.Objects, string(b)
	}
	edgeTLS := issue("e1", pki.RoleEdge)

	for name, l := range map[string]*pki.Loader{"host": issue("h2", pki.RoleHost), "pipeline": issue("p1", pki.RolePipeline)} {
		status, objs, body := get(l, live.uuid, live.account)
		assert.Equal(t, http.StatusForbidden, status, "%s: %s", name, body)
		assert.Empty(t, objs, name)
	}

	status, objs, body := get(edgeTLS, live.uuid, live.account)
	require.Equal(t, http.StatusOK, status, body)
	require.Len(t, objs, 1)
	assert.Equal(t, event.LocatedObject{ObjectID: live.obj, AccountID: "acct-a", State: StateActive, Confirmed: true}, objs[0])

	status, objs, body = get(edgeTLS, gone.uuid, gone.account)
	require.Equal(t, http.StatusOK, status, body)
	require.Len(t, objs, 1)
	assert.Equal(t, StateDeleted, objs[0].State, "a deleted object is reported as deleted, not hidden")

	status, _, body = get(edgeTLS, uuid.NewString(), "acct-a")
	assert.Equal(t, http.StatusNotFound, status, "unknown database: %s", body)

	status, objs, body = get(edgeTLS, live.uuid, "acct-b")
	assert.Equal(t, http.StatusNotFound, status, "another account's database is unknown: %s", body)
	assert.Empty(t, objs)

	status, _, body = get(edgeTLS, live.uuid, "")
	assert.Equal(t, http.StatusBadRequest, status, "the account is required: %s", body)
}
