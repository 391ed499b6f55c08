package objecthost

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	v4 "github.com/shoaldb/shoal/internal/v4"
	"github.com/shoaldb/shoal/objecthost/sqlexec"
)

func (g *tenantGuard) state(acct string) (running, waiting int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if s := g.accts[acct]; s != nil {
		return s.running, len(s.waiters)
	}
	return 0, 0
}

// TestTenantSlotsReused: a slot freed by the last request of an account
// is kept for reuse (at most maxFreeSlots of them) and serves another
// account from a clean state: its limits count from zero, and a waiter of
// the account it served before is not among its waiters.
func TestTenantSlotsReused(t *testing.T) {
	g := newTenantGuard(TenantLimits{MaxRunning: 1, MaxWaiting: 1, Wait: time.Hour}, prometheus.NewRegistry())
	ctx := context.Background()
	// Account a with one running and one waiting: the waiter is handed
	// the slot, then both leave.
	require.NoError(t, g.admit(ctx, "a"))
	done := make(chan error)
	go func() { done <- g.admit(ctx, "a") }()
	require.Eventually(t, func() bool { _, w := g.state("a"); return w == 1 }, 5*time.Second, time.Millisecond)
	g.leave("a")
	require.NoError(t, <-done)
	g.leave("a")
	g.mu.Lock()
	require.Len(t, g.free, 1, "a's slot kept")
	freed := g.free[0]
	g.mu.Unlock()

	// Account b gets that slot, as new: one runs, one waits, one is refused.
	require.NoError(t, g.admit(ctx, "b"))
	g.mu.Lock()
	assert.Same(t, freed, g.accts["b"], "the freed slot is reused")
	assert.Empty(t, g.free)
	g.mu.Unlock()
	r, w := g.state("b")
	assert.Equal(t, 1, r)
	assert.Equal(t, 0, w)
	go func() { done <- g.admit(ctx, "b") }()
	require.Eventually(t, func() bool { _, w := g.state("b"); return w == 1 }, 5*time.Second, time.Millisecond)
	assert.True(t, isAccountBusy(g.admit(ctx, "b")))
	g.leave("b")
	require.NoError(t, <-done)
	g.leave("b")

	// The free list is bounded.
	for i := range 2 * maxFreeSlots {
		require.NoError(t, g.admit(ctx, "acct-"+strings.Repeat("x", i)))
	}
	for i := range 2 * maxFreeSlots {
		g.leave("acct-" + strings.Repeat("x", i))
	}
	g.mu.Lock()
	assert.Len(t, g.free, maxFreeSlots)
	assert.Empty(t, g.accts)
	g.mu.Unlock()
}

// Admission per account: MaxRunning run, MaxWaiting wait in arrival order,
// the rest are refused at once; other accounts are not affected; a wait
// that runs out or is canceled leaves nothing behind.
func TestTenantAdmission(t *testing.T) {
	g := newTenantGuard(TenantLimits{MaxRunning: 2, MaxWaiting: 2, Wait: time.Hour}, prometheus.NewRegistry())
	ctx := context.Background()
	require.NoError(t, g.admit(ctx, "a"))
	require.NoError(t, g.admit(ctx, "a"))
	require.NoError(t, g.admit(ctx, "b"), "another account has its own slots")

	admitted := make(chan int, 2)
	for i := 1; i <= 2; i++ {
		go func() {
			if g.admit(ctx, "a") == nil {
				admitted <- i
			}
		}()
		require.Eventually(t, func() bool { _, w := g.state("a"); return w == i }, 5*time.Second, time.Millisecond)
	}
	err := g.admit(ctx, "a")
	require.True(t, isAccountBusy(err), "%v", err)
	assert.Contains(t, err.Error(), "too many concurrent requests for this account")

	g.leave("a")
	assert.Equal(t, 1, <-admitted, "the oldest waiter goes first")
	g.leave("a")
	assert.Equal(t, 2, <-admitted)
	r, w := g.state("a")
	assert.Equal(t, 2, r)
	assert.Equal(t, 0, w)

	// A canceled wait leaves the queue.
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- g.admit(cctx, "a") }()
	require.Eventually(t, func() bool { _, w := g.state("a"); return w == 1 }, 5*time.Second, time.Millisecond)
	cancel()
	assert.ErrorIs(t, <-done, context.Canceled)
	_, w = g.state("a")
	assert.Equal(t, 0, w)

	g.leave("a")
	g.leave("a")
	g.leave("b")
	r, _ = g.state("a")
	assert.Equal(t, 0, r)
	assert.Empty(t, g.accts, "idle accounts are forgotten")

	// A wait that runs out is refused.
	short := newTenantGuard(TenantLimits{MaxRunning: 1, Wait: 10 * time.Millisecond}, prometheus.NewRegistry())
	require.NoError(t, short.admit(ctx, "a"))
	assert.True(t, isAccountBusy(short.admit(ctx, "a")))
	short.leave("a")
	assert.Empty(t, short.accts)
}

// Through the HTTP API: while an account has MaxRunning queries running,
// its next request waits and is refused with 429/7429 and Retry-After once
// the wait is over, while another account's queries on the same host are
// answered.
func TestHTTPAccountConcurrencyCap(t *testing.T) {
	th := newTestHost(t, func(c *Config) {
		c.Tenant = TenantLimits{MaxRunning: 1, MaxWaiting: 1, Wait: 50 * time.Millisecond}
	})
	srv := serve(t, th)
	hog, hog2, other := newDB("hog"), newDB("hog"), newDB("polite")
	for _, d := range []db{hog, hog2, other} {
		th.mustInit(t, d)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // runs until canceled (QueryTimeout is 30 s)
		defer wg.Done()
		req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL+"/v1/objects/"+hog.obj+"/query",
			strings.NewReader(`{"sql":"WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM r) SELECT count(*) FROM r"}`))
		req.Header.Set(HeaderDatabase, hog.uuid)
		req.Header.Set(HeaderAccount, hog.account)
		if resp, err := srv.Client().Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	require.Eventually(t, func() bool { r, _ := th.tenant.state("hog"); return r == 1 }, 5*time.Second, time.Millisecond)

	status, env := call(t, srv.Client(), srv, "POST", "/v1/objects/"+hog2.obj+"/query", &hog2, `{"sql":"SELECT 1"}`)
	assert.Equal(t, http.StatusTooManyRequests, status, "%+v", env)
	assert.Equal(t, v4.CodeRateLimited, errCode(env))
	assert.Contains(t, env.Errors[0].Message, "too many concurrent requests for this account")

	status, env = call(t, srv.Client(), srv, "POST", "/v1/objects/"+other.obj+"/query", &other, `{"sql":"SELECT 1 AS one"}`)
	assert.Equal(t, http.StatusOK, status, "%+v", env)

	cancel()
	wg.Wait()
	require.Eventually(t, func() bool { r, _ := th.tenant.state("hog"); return r == 0 }, 5*time.Second, time.Millisecond)
	status, _ = call(t, srv.Client(), srv, "POST", "/v1/objects/"+hog2.obj+"/query", &hog2, `{"sql":"SELECT 1"}`)
	assert.Equal(t, http.StatusOK, status, "the account's slot came back")
}

// The HTTP query path encodes results as they are read and refuses one
// over the limit with 413/7413, the limit in the message, and no partial
// answer.
func TestHTTPResultLimit(t *testing.T) {
	th := newTestHost(t, func(c *Config) {
		c.Limits = sqlexec.DefaultLimits()
		c.Limits.MaxResultBytes = 64 << 10
	})
	srv := serve(t, th)
	d := newDB("acct")
	th.mustInit(t, d)
	status, env := call(t, srv.Client(), srv, "POST", "/v1/objects/"+d.obj+"/query", &d,
		`{"sql":"WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM r WHERE i < 1000000) SELECT i, 'padding padding' AS p FROM r"}`)
	assert.Equal(t, http.StatusRequestEntityTooLarge, status)
	assert.Equal(t, v4.CodeTooLarge, errCode(env))
	assert.Contains(t, env.Errors[0].Message, "result too large")
	assert.Equal(t, json.RawMessage("null"), env.Result)
	status, env = call(t, srv.Client(), srv, "POST", "/v1/objects/"+d.obj+"/raw", &d,
		`{"sql":"WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM r WHERE i < 10) SELECT i FROM r"}`)
	require.Equal(t, http.StatusOK, status, "%+v", env)
	assert.Contains(t, string(env.Result), `"rows":[[1],[2],[3],[4],[5],[6],[7],[8],[9],[10]]`)
}
