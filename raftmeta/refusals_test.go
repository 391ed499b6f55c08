package raftmeta

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// TestRefusalsCrossTheAPIAsFinal iterates over fsm's registry of refusals,
// so a new one cannot be forgotten: each keeps its code over the internal
// HTTP API (a 4xx, never 5xx), comes back as an error that fsm.IsRefusal
// and errors.Is recognise, and is final: neither Node.Apply's forwarding
// nor the Client retries it.
func TestRefusalsCrossTheAPIAsFinal(t *testing.T) {
	for _, r := range fsm.Refusals() {
		t.Run(r.Code, func(t *testing.T) {
			for _, in := range []error{fmt.Errorf("%w: some detail", r.Err), &fsm.Error{Code: r.Code, Message: "refused"}} {
				status, w := toWire(in)
				assert.Equal(t, r.Code, w.Code)
				assert.GreaterOrEqual(t, status, 400)
				assert.Less(t, status, 500)
				back := fromWire(w)
				assert.True(t, fsm.IsRefusal(back), "%v", back)
				assert.ErrorIs(t, back, r.Err)
				assert.NotErrorIs(t, back, ErrUnavailable)
				assert.False(t, retryable(back), "Node.Apply would retry %v", back)
			}

			var calls atomic.Int64
			srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
				calls.Add(1)
				status, w := toWire(&fsm.Error{Code: r.Code, Message: "refused"})
				writeJSON(rw, status, map[string]wireError{"error": w})
			}))
			defer srv.Close()
			cl, err := NewClient([]string{strings.TrimPrefix(srv.URL, "http://")},
				WithRetries(5, time.Millisecond, time.Millisecond), WithCacheTTL(0))
			require.NoError(t, err)
			defer cl.Close()
			_, err = cl.RevokeToken(context.Background(), "t1")
			assert.ErrorIs(t, err, r.Err)
			assert.True(t, fsm.IsRefusal(err))
			assert.NotErrorIs(t, err, ErrUnavailable)
			assert.EqualValues(t, 1, calls.Load(), "the client retried a refusal")
		})
	}
}
