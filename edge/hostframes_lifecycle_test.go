package edge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/internal/frame"
	"github.com/shoaldb/shoal/pipeline/event"
)

// batchAnswerJSON is a host's answer to a batched lifecycle call: item i
// succeeds when statuses[i] is 0, else is refused with that status (code
// 7000+status).
func batchAnswerJSON(statuses ...int) string {
	items := make([]string, len(statuses))
	for i, st := range statuses {
		items[i] = `{}`
		if st != 0 {
			items[i] = fmt.Sprintf(`{"error":{"status":%d,"code":%d,"message":"refused %d"}}`, st, 7000+st, st)
		}
	}
	return `{"result":{"items":[` + strings.Join(items, ",") + `]},"success":true}`
}

// batchItemCount is the number of items in a batched lifecycle body.
func batchItemCount(t *testing.T, path string, body []byte) int {
	var v struct {
		Inits    []event.InitBatchItem    `json:"inits"`
		Confirms []event.ConfirmBatchItem `json:"confirms"`
	}
	require.NoError(t, json.Unmarshal(body, &v), "%s", body)
	if path == "/v1/batch/init" {
		return len(v.Inits)
	}
	return len(v.Confirms)
}

// lifecycleHost answers every batched call on frames with the second item
// refused 409 and the others accepted, and records what it got.
func lifecycleHost(t *testing.T) (*scriptedHost, *atomic.Int32) {
	var got atomic.Int32
	fh := newScriptedHost(t, func(c *scriptedConn, id uint32, req frame.Request, body []byte) {
		switch req.Path {
		case "/v1/batch/init", "/v1/batch/confirm":
			got.Add(1)
			assert.Equal(t, "application/json", req.Header.Get("Content-Type"))
			n := batchItemCount(t, req.Path, body)
			st := make([]int, n)
			if n > 1 {
				st[1] = http.StatusConflict
			}
			c.answer(id, 200, batchAnswerJSON(st...))
		default:
			echo(c, id, req, body)
		}
	})
	fh.lifecycle = true
	return fh, &got
}

func initItems(n int) []event.InitBatchItem {
	items := make([]event.InitBatchItem, n)
	for i := range items {
		items[i] = event.InitBatchItem{ObjectID: fmt.Sprintf("%032x", i+1), Init: InitRequest{DatabaseUUID: fmt.Sprintf("db-%d", i), AccountID: "a"}}
	}
	return items
}

// TestLifecycleBatchesOverFrames: a host whose upgrade answer names the
// lifecycle routes gets the batched inits and confirms on its frame
// connection — the one its queries use, no HTTP request — and each item's
// answer (a refusal of one item, success of the others) comes back as the
// HTTP call's would.
func TestLifecycleBatchesOverFrames(t *testing.T) {
	fh, got := lifecycleHost(t)
	hc := NewHostClient(10 * time.Second)
	defer hc.Close()
	ctx := context.Background()

	errs, err := hc.InitBatch(ctx, fh.addr(), initItems(3))
	require.NoError(t, err)
	require.Len(t, errs, 3)
	assert.NoError(t, errs[0])
	var he *HostError
	require.ErrorAs(t, errs[1], &he)
	assert.Equal(t, &HostError{Status: http.StatusConflict, Code: 7409, Message: "refused 409"}, he)
	assert.NoError(t, errs[2])

	rts := []Route{{ObjectID: "o1", DatabaseUUID: "d1", AccountID: "a", Generation: 1}, {ObjectID: "o2", DatabaseUUID: "d2", AccountID: "a", Generation: 1}}
	errs, err = hc.ConfirmBatch(ctx, fh.addr(), rts)
	require.NoError(t, err)
	require.Len(t, errs, 2)
	assert.NoError(t, errs[0])
	require.ErrorAs(t, errs[1], &he)
	assert.Equal(t, http.StatusConflict, he.Status)

	// A query shares the connection.
	status, ans, err := forwardTo(ctx, hc, fh.addr(), "q")
	require.NoError(t, err)
	assert.Equal(t, 200, status)
	assert.Contains(t, ans, `"echo":"q"`)

	assert.Equal(t, int32(2), got.Load())
	assert.Equal(t, int32(1), fh.accepts.Load(), "one connection for batches and queries")
	assert.Zero(t, fh.httpPosts.Load(), "no HTTP request")
	assert.Equal(t, int64(2), hc.batchFrames.Load())
	assert.Zero(t, hc.batchHTTP.Load())
}

// TestLifecycleBatchesOverFramesRequestErrors: a refusal of the whole
// request over frames is the HTTP call's: a 404 (a host without the
// batch routes) is errHostBatchUnsupported, another status a HostError for
// the whole batch, and an answer with the wrong number of items a 502.
func TestLifecycleBatchesOverFramesRequestErrors(t *testing.T) {
	var mode atomic.Int32
	fh := newScriptedHost(t, func(c *scriptedConn, id uint32, req frame.Request, body []byte) {
		switch mode.Load() {
		case 0:
			c.answer(id, 404, `{"success":false,"errors":[{"code":7404,"message":"no such route"}]}`)
		case 1:
			c.answer(id, 400, `{"success":false,"errors":[{"code":7400,"message":"a batch holds 1 to 256 items"}]}`)
		default:
			c.answer(id, 200, batchAnswerJSON(0))
		}
	})
	fh.lifecycle = true
	hc := NewHostClient(10 * time.Second)
	defer hc.Close()
	ctx := context.Background()

	_, err := hc.InitBatch(ctx, fh.addr(), initItems(2))
	assert.ErrorIs(t, err, errHostBatchUnsupported)
	mode.Store(1)
	_, err = hc.InitBatch(ctx, fh.addr(), initItems(2))
	var he *HostError
	require.ErrorAs(t, err, &he)
	assert.Equal(t, http.StatusBadRequest, he.Status)
	assert.Equal(t, 7400, he.Code)
	mode.Store(2)
	_, err = hc.InitBatch(ctx, fh.addr(), initItems(2))
	require.ErrorAs(t, err, &he)
	assert.Equal(t, http.StatusBadGateway, he.Status, "one item answered for two")
	assert.Zero(t, fh.httpPosts.Load())
}

// TestLifecycleBatchesFallBackToHTTP: hosts of an earlier version get the
// batched calls as HTTP requests, with the same per-item answers — a host
// whose frame connections take only queries (no lifecycle in its upgrade
// answer: its queries still go over frames), a host without the frame
// transport (404 to the upgrade) — and so does every host with
// --host-transport http.
func TestLifecycleBatchesFallBackToHTTP(t *testing.T) {
	answerHTTP := func(path string, body []byte) string {
		n := batchItemCount(t, path, body)
		st := make([]int, n)
		st[0] = http.StatusNotFound
		return batchAnswerJSON(st...)
	}
	check := func(t *testing.T, hc *HostClient, fh *scriptedHost) {
		errs, err := hc.InitBatch(context.Background(), fh.addr(), initItems(2))
		require.NoError(t, err)
		require.Len(t, errs, 2)
		var he *HostError
		require.ErrorAs(t, errs[0], &he)
		assert.Equal(t, http.StatusNotFound, he.Status)
		assert.NoError(t, errs[1])
		errs, err = hc.ConfirmBatch(context.Background(), fh.addr(), []Route{{ObjectID: "o", DatabaseUUID: "d", AccountID: "a", Generation: 1}})
		require.NoError(t, err)
		require.ErrorAs(t, errs[0], &he)
		assert.Equal(t, int32(2), fh.httpPosts.Load(), "both batches over HTTP")
		assert.Zero(t, hc.batchFrames.Load())
		assert.Equal(t, int64(2), hc.batchHTTP.Load())
	}

	t.Run("frames for queries only", func(t *testing.T) {
		var onFrames atomic.Int32
		fh := newScriptedHost(t, func(c *scriptedConn, id uint32, req frame.Request, body []byte) {
			onFrames.Add(1)
			if strings.HasPrefix(req.Path, "/v1/batch/") {
				// What such a host answers a batch on a stream.
				c.answer(id, 400, `{"success":false,"errors":[{"code":7400,"message":"route not served over shoal-frames/1"}]}`)
				return
			}
			echo(c, id, req, body)
		})
		fh.onHTTP = answerHTTP
		hc := NewHostClient(10 * time.Second)
		defer hc.Close()
		// A query first: the connection is up when the batches come.
		_, ans, err := forwardTo(context.Background(), hc, fh.addr(), "q")
		require.NoError(t, err)
		assert.Contains(t, ans, `"echo":"q"`)
		check(t, hc, fh)
		assert.Equal(t, int32(1), onFrames.Load(), "only the query went over frames")
		assert.Equal(t, int64(1), hc.sentFrames.Load())
	})
	t.Run("no frames", func(t *testing.T) {
		fh := newScriptedHost(t, nil)
		fh.refuse = http.StatusNotFound
		fh.onHTTP = answerHTTP
		hc := NewHostClient(10 * time.Second)
		defer hc.Close()
		check(t, hc, fh)
		assert.Equal(t, int32(1), fh.upgrades.Load(), "asked once")
	})
	t.Run("host transport http", func(t *testing.T) {
		fh, got := lifecycleHost(t)
		fh.onHTTP = answerHTTP
		hc := NewHostClient(10 * time.Second)
		defer hc.Close()
		require.NoError(t, hc.UseTransport(TransportHTTP))
		check(t, hc, fh)
		assert.Zero(t, fh.upgrades.Load(), "never asked")
		assert.Zero(t, got.Load())
	})
}

// TestLifecycleBatchHostGoneMidBatch: a host that closes the connection,
// or resets the stream, with a batch on it fails the whole batch with an
// error that is neither a refusal nor "not sent" — each create's init or
// confirm outcome is unknown, so the create flow retries with new IDs
// (retryable), exactly as for a lost HTTP answer — and the batch is not
// resent by the client. The next batch dials a new connection.
func TestLifecycleBatchHostGoneMidBatch(t *testing.T) {
	var mode, got atomic.Int32
	fh := newScriptedHost(t, func(c *scriptedConn, id uint32, req frame.Request, body []byte) {
		got.Add(1)
		switch mode.Load() {
		case 0:
			c.nc.Close()
		case 1:
			c.send(frame.AppendReset(nil, id))
		default:
			c.answer(id, 200, batchAnswerJSON(make([]int, batchItemCount(t, req.Path, body))...))
		}
	})
	fh.lifecycle = true
	hc := NewHostClient(10 * time.Second)
	defer hc.Close()
	ctx := context.Background()

	for _, m := range []int32{0, 1} {
		mode.Store(m)
		before := got.Load()
		errs, err := hc.InitBatch(ctx, fh.addr(), initItems(3))
		require.Error(t, err, "mode %d", m)
		assert.Nil(t, errs)
		assert.False(t, errors.Is(err, errHostBatchUnsupported))
		var he *HostError
		assert.False(t, errors.As(err, &he), "not a refusal: %v", err)
		assert.False(t, neverSent(err), "it reached the host: %v", err)
		var ns *errNotSent
		assert.False(t, errors.As(err, &ns), "it reached the host: %v", err)
		assert.True(t, retryable(err))
		assert.Equal(t, before+1, got.Load(), "sent once, not resent")
	}
	_, err := hc.ConfirmBatch(ctx, fh.addr(), []Route{{ObjectID: "o", DatabaseUUID: "d", AccountID: "a", Generation: 1}})
	require.Error(t, err, "the stream reset")

	mode.Store(2)
	errs, err := hc.InitBatch(ctx, fh.addr(), initItems(3))
	require.NoError(t, err)
	for _, e := range errs {
		assert.NoError(t, e)
	}
	assert.Equal(t, int32(2), fh.accepts.Load(), "a new connection after the closed one")
	assert.Zero(t, fh.httpPosts.Load())
}
