package edge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	v4 "github.com/shoaldb/shoal/internal/v4"
	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// assertNotRetryAnswer checks a D1 answer is not the "unavailable, retry"
// one (503, 7503, Retry-After).
func assertNotRetryAnswer(t *testing.T, status, code int, h http.Header, raw []byte) {
	t.Helper()
	assert.NotEqual(t, http.StatusServiceUnavailable, status, "%s", raw)
	assert.NotEqual(t, v4.CodeUnavailable, code, "%s", raw)
	assert.Empty(t, h.Get("Retry-After"), "%s", raw)
}

// TestCatalogRefusalsAreFinal iterates over fsm's registry of refusals, so a
// new one cannot be forgotten: in every form the edge receives it (a
// sentinel from an in-process catalog, wrapped, or an *fsm.Error decoded
// from the catalog's HTTP API), it is a refusal, a create is not retried
// with fresh IDs, reads pass it through the fallback unwrapped, the breaker
// counts it as an answer, and the client gets a D1 error that is not
// "unavailable, retry".
func TestCatalogRefusalsAreFinal(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	refusals := fsm.Refusals()
	require.NotEmpty(t, refusals)
	for _, r := range refusals {
		forms := []struct {
			name string
			err  error
		}{
			{"sentinel", r.Err},
			{"wrapped", fmt.Errorf("%w: some detail", r.Err)},
			{"wire", &fsm.Error{Code: r.Code, Message: "refused by the catalog"}},
		}
		for _, form := range forms {
			t.Run(r.Code+"/"+form.name, func(t *testing.T) {
				err := form.err
				require.True(t, isCatalogRefusal(err))

				// A create refused at the checkpoint is answered at once —
				// except "UUID exists": that refuses the edge's own fresh
				// UUID (a host fenced it as an orphan), not the client's
				// request, and the create retries with new IDs.
				before := e.cat.count("CreateDatabase")
				e.cat.mu.Lock()
				e.cat.failWrite = []error{err}
				e.cat.mu.Unlock()
				a := e.call("POST", dbPath(acctA), tokA, map[string]any{"name": "refused-" + form.name})
				if errors.Is(err, fsm.ErrExists) {
					assert.True(t, a.Success, "a fenced UUID is retried with new IDs: %s", a.Raw)
					assert.Equal(t, before+2, e.cat.count("CreateDatabase"), "one retry with new IDs")
				} else {
					assert.False(t, a.Success)
					assert.Equal(t, before+1, e.cat.count("CreateDatabase"), "a refused create was retried")
					assertNotRetryAnswer(t, a.Status, a.code(), a.Header, a.Raw)
				}

				// A read refused is the answer, not an outage.
				got := e.srv.fb.do(ctx, func(context.Context) error { return err })
				assert.ErrorIs(t, got, r.Err)
				assert.NotErrorIs(t, got, ErrUnavailable)
				got = e.srv.catalogWrite(ctx, func(context.Context) error { return err })
				assert.ErrorIs(t, got, r.Err)
				assert.NotErrorIs(t, got, ErrUnavailable)
				rec := httptest.NewRecorder()
				e.srv.writeErr(rec, httptest.NewRequest(http.MethodGet, "/client/v4/accounts/x/d1/database", nil), got)
				var env struct {
					Errors []struct{ Code int } `json:"errors"`
				}
				require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &env), rec.Body.String())
				require.NotEmpty(t, env.Errors)
				assertNotRetryAnswer(t, rec.Code, env.Errors[0].Code, rec.Header(), rec.Body.Bytes())
			})
		}
	}

	// The breaker counts refusals as a healthy catalog answering: however
	// many, it stays closed.
	for i := 0; i < 50; i++ {
		_ = e.srv.fb.do(ctx, func(context.Context) error { return refusals[i%len(refusals)].Err })
	}
	assert.NoError(t, e.srv.fb.do(ctx, func(context.Context) error { return nil }))
}
