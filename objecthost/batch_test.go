package objecthost

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	v4 "github.com/shoaldb/shoal/internal/v4"
	"github.com/shoaldb/shoal/pipeline/event"
)

func batchItems(t *testing.T, env envelope) []event.BatchItemAnswer {
	t.Helper()
	var a event.BatchAnswer
	require.NoError(t, json.Unmarshal(env.Result, &a))
	return a.Items
}

// A batch of inits: each item gets the answer its own init would have —
// refusals (bad object ID, another database's object, a restore) for
// those items only — and the accepted ones are durable when the batch is
// answered (they survive a restart: their checkpoint, the index commit,
// came first). Repeating the batch is idempotent. Confirms in a batch are
// checked against each object's identity.
func TestBatchInitAndConfirm(t *testing.T) {
	th := newTestHost(t, nil)
	srv := serve(t, th)
	c := srv.Client()
	a, b, taken := newDB("acct"), newDB("acct"), newDB("acct")
	th.mustInit(t, taken)
	inits := []event.InitBatchItem{
		{ObjectID: a.obj, Init: a.init()},
		{ObjectID: "not-hex", Init: b.init()},
		{ObjectID: taken.obj, Init: InitRequest{DatabaseUUID: uuid.NewString(), AccountID: "acct"}},
		{ObjectID: b.obj, Init: b.init()},
		{ObjectID: newObjectID(), Init: InitRequest{DatabaseUUID: uuid.NewString(), AccountID: "acct",
			RestoreFrom: &event.RestoreSource{DatabaseUUID: uuid.NewString()}}},
	}
	status, env := call(t, c, srv, "POST", "/v1/batch/init", nil, event.InitBatchRequest{Inits: inits})
	require.Equal(t, http.StatusOK, status, env)
	items := batchItems(t, env)
	require.Len(t, items, len(inits))
	assert.Nil(t, items[0].Error)
	require.NotNil(t, items[1].Error)
	assert.Equal(t, http.StatusBadRequest, items[1].Error.Status)
	require.NotNil(t, items[2].Error)
	assert.Equal(t, http.StatusConflict, items[2].Error.Status)
	assert.Equal(t, CodeConflict, items[2].Error.Code)
	assert.Nil(t, items[3].Error)
	require.NotNil(t, items[4].Error, "a restoring init is never batched")
	assert.Equal(t, http.StatusBadRequest, items[4].Error.Status)

	// The same batch again: the same answers (init is idempotent).
	status, env = call(t, c, srv, "POST", "/v1/batch/init", nil, event.InitBatchRequest{Inits: inits})
	require.Equal(t, http.StatusOK, status, env)
	again := batchItems(t, env)
	assert.Equal(t, items, again)

	// Durable once answered: a restart keeps both objects.
	th.reopen(t)
	srv = serve(t, th)
	c = srv.Client()
	for _, d := range []db{a, b} {
		status, env = call(t, c, srv, "GET", "/v1/objects/"+d.obj, &d, nil)
		require.Equal(t, http.StatusOK, status, env)
		var info ObjectInfo
		require.NoError(t, json.Unmarshal(env.Result, &info))
		assert.Equal(t, d.uuid, info.DatabaseUUID)
	}

	confirms := []event.ConfirmBatchItem{
		{ObjectID: a.obj, DatabaseUUID: a.uuid, AccountID: a.account, RoutingGeneration: 1},
		{ObjectID: b.obj, DatabaseUUID: a.uuid, AccountID: b.account, RoutingGeneration: 1}, // wrong database
		{ObjectID: newObjectID(), DatabaseUUID: b.uuid, AccountID: b.account, RoutingGeneration: 1},
	}
	status, env = call(t, c, srv, "POST", "/v1/batch/confirm", nil, event.ConfirmBatchRequest{Confirms: confirms})
	require.Equal(t, http.StatusOK, status, env)
	items = batchItems(t, env)
	require.Len(t, items, 3)
	assert.Nil(t, items[0].Error)
	info, err := th.Info(t.Context(), a.obj)
	require.NoError(t, err)
	assert.True(t, info.Confirmed)
	require.NotNil(t, items[1].Error)
	assert.Equal(t, v4.CodeWrongHost, items[1].Error.Code)
	require.NotNil(t, items[2].Error)
	assert.Equal(t, http.StatusNotFound, items[2].Error.Status)
	info, err = th.Info(t.Context(), b.obj)
	require.NoError(t, err)
	assert.False(t, info.Confirmed, "a confirm naming another database changes nothing")
}

func TestBatchRefusesBadRequests(t *testing.T) {
	th := newTestHost(t, nil)
	srv := serve(t, th)
	c := srv.Client()
	status, env := call(t, c, srv, "POST", "/v1/batch/init", nil, event.InitBatchRequest{})
	assert.Equal(t, http.StatusBadRequest, status)
	assert.Equal(t, v4.CodeInvalidRequest, errCode(env))
	status, env = call(t, c, srv, "POST", "/v1/batch/confirm", nil, "{nope")
	assert.Equal(t, http.StatusBadRequest, status)
	assert.Equal(t, v4.CodeInvalidRequest, errCode(env))
	many := make([]event.ConfirmBatchItem, event.MaxHostBatch+1)
	status, _ = call(t, c, srv, "POST", "/v1/batch/confirm", nil, event.ConfirmBatchRequest{Confirms: many})
	assert.Equal(t, http.StatusBadRequest, status)
}
