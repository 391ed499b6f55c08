package edge

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A host that is restarting drops the edge's delete and confirm notices
// (connection closed without an answer, then 503 while it loads); both are
// idempotent, so the edge sends them again and they arrive. A definite
// answer other than 503 is final: a 404 is not sent again, and a query
// forward, which may write, is never resent by this path.
func TestIdempotentNoticesReachARestartingHost(t *testing.T) {
	var calls atomic.Int64
	var deletes, confirms atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := calls.Add(1)
		switch {
		case n == 1: // the process died mid-request: the connection just closes
			hj, ok := w.(http.Hijacker)
			require.True(t, ok)
			c, _, err := hj.Hijack()
			require.NoError(t, err)
			c.Close()
			return
		case n == 2:
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte(`{"success":false,"errors":[{"code":7500,"message":"starting"}],"messages":[],"result":null}`))
			return
		}
		switch {
		case strings.HasSuffix(r.URL.Path, "/delete"):
			deletes.Add(1)
		case strings.HasSuffix(r.URL.Path, "/confirm"):
			confirms.Add(1)
		}
		_, _ = w.Write([]byte(`{"success":true,"errors":[],"messages":[],"result":{}}`))
	}))
	defer srv.Close()
	hc := NewHostClient(10 * time.Second)
	defer hc.Close()
	rt := Route{HostAddress: strings.TrimPrefix(srv.URL, "http://"), ObjectID: "0123456789abcdef0123456789abcdef", DatabaseUUID: "d", AccountID: "a", Generation: 1}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, hc.Delete(ctx, rt), "the notice arrives after the host is back")
	assert.EqualValues(t, 1, deletes.Load())
	assert.EqualValues(t, 3, calls.Load(), "closed, 503, then answered")

	calls.Store(0)
	require.NoError(t, hc.Confirm(ctx, rt))
	assert.EqualValues(t, 1, confirms.Load())

	// A definite refusal is final.
	var refusals atomic.Int64
	srv404 := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		refusals.Add(1)
		w.WriteHeader(http.StatusNotFound)
		_, _ = w.Write([]byte(`{"success":false,"errors":[{"code":7404,"message":"no such object"}],"messages":[],"result":null}`))
	}))
	defer srv404.Close()
	rt.HostAddress = strings.TrimPrefix(srv404.URL, "http://")
	var he *HostError
	require.ErrorAs(t, hc.Delete(ctx, rt), &he)
	assert.Equal(t, http.StatusNotFound, he.Status)
	assert.EqualValues(t, 1, refusals.Load(), "not sent again")
}
