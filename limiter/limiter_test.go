package limiter

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/pipeline/event"
	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// activeOf waits until exactly one of ls is active and returns it.
func activeOf(t *testing.T, ls ...*Limiter) *Limiter {
	t.Helper()
	var act *Limiter
	require.Eventually(t, func() bool {
		act = nil
		n := 0
		for _, l := range ls {
			if l.Active() {
				act, n = l, n+1
			}
		}
		return n == 1
	}, 30*time.Second, 20*time.Millisecond, "no single active limiter")
	return act
}

// waitPasses waits until l completed n more passes.
func waitPasses(t *testing.T, l *Limiter, n int64) {
	t.Helper()
	from := l.Status().Passes
	require.Eventually(t, func() bool { return l.Status().Passes >= from+n }, 30*time.Second, 10*time.Millisecond)
}

// TestFreeAccountLimitedOnceAcrossRestartAndTwoLimiters is the row-limit
// flow end to end: real ClickHouse, broker, catalog, SMTP server and
// webhook receiver.
func TestFreeAccountLimitedOnceAcrossRestartAndTwoLimiters(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	createAccount(t, e.cat, "acct-free", "Free One", fsm.TierFree)
	createAccount(t, e.cat, "acct-paid", "Paid One", fsm.TierPaid)
	a := e.start(t, "a", nil)
	b := e.start(t, "b", nil)
	act := activeOf(t, a, b)

	now := e.clk.Now()
	addUsage(t, e.st, "acct-free", now, 1000, 60_000)
	addUsage(t, e.st, "acct-paid", now, 9_000_000, 400_000)
	waitPasses(t, act, 3)
	assert.Empty(t, e.limit.of("acct-free"), "under the limit: no flag")

	addUsage(t, e.st, "acct-free", now, 0, 40_001) // 100,001 rows written
	crossed := time.Now()
	_, end := dayBounds(now)
	require.Eventually(t, func() bool {
		l, _, ok := e.limit.latest("acct-free")
		return ok && l.UntilMs == end.UnixMilli()
	}, 20*time.Second, 10*time.Millisecond, "no flag for the free account")
	lim, seen, _ := e.limit.latest("acct-free")
	t.Logf("crossing → flag on limits: %v (pass interval 200ms)", seen.Sub(crossed).Round(time.Millisecond))
	assert.Equal(t, ReasonRowsWritten, lim.Reason)
	assert.Equal(t, event.Version, lim.V)

	rcpt := "owner+acct-free@example.com"
	require.Eventually(t, func() bool { return len(e.mb.to(rcpt)) >= 1 && len(e.hk.of("acct-free")) >= 1 },
		20*time.Second, 10*time.Millisecond, "no notice")
	mails := e.mb.to(rcpt)
	require.Len(t, mails, 1)
	assert.Contains(t, mails[0].data, "rows written per day")
	assert.Contains(t, mails[0].data, "100001")
	assert.Contains(t, mails[0].data, "Free One")
	hooks := e.hk.of("acct-free")
	require.Len(t, hooks, 1)
	day, _ := dayBounds(now)
	assert.Equal(t, WebhookPayload{NoticeID: "acct-free/" + day, AccountID: "acct-free", AccountName: "Free One",
		Limit: ReasonRowsWritten, Value: 100_001, Threshold: 100_000, Day: day, Until: end.Format(time.RFC3339)}, hooks[0])

	// Two limiters for a while, then the active one restarts: the other
	// takes over, and a fresh instance joins; still one notice.
	waitPasses(t, act, 5)
	act.Close()
	other := a
	if act == a {
		other = b
	}
	c := e.start(t, "c", nil)
	act2 := activeOf(t, other, c)
	waitPasses(t, act2, 10)
	assert.Len(t, e.mb.to(rcpt), 1, "a second mail after the restart")
	assert.Len(t, e.hk.of("acct-free"), 1, "a second webhook after the restart")
	l, _, _ := e.limit.latest("acct-free")
	assert.Equal(t, end.UnixMilli(), l.UntilMs, "the new leader keeps the flag")
	assert.Zero(t, e.hk.badSigs)

	// The paid account is over both free thresholds and never limited.
	for _, l := range e.limit.of("acct-paid") {
		assert.LessOrEqual(t, l.UntilMs, time.Now().UnixMilli(), "a paid account was limited: %+v", l)
	}
	assert.Empty(t, e.mb.to("owner+acct-paid@example.com"))
	assert.Empty(t, e.hk.of("acct-paid"))

	// An upgrade (catalog, then the accounts event) clears the flag.
	paid := fsm.TierPaid
	_, err := e.cat.UpdateAccount(ctx, fsm.UpdateAccount{ID: "acct-free", Tier: &paid})
	require.NoError(t, err)
	upgraded := time.Now()
	publishTier(t, e.k, "acct-free", fsm.TierPaid)
	require.Eventually(t, func() bool {
		l, _, ok := e.limit.latest("acct-free")
		return ok && l.UntilMs <= time.Now().UnixMilli()
	}, 20*time.Second, 10*time.Millisecond, "the upgrade did not clear the flag")
	_, seen, _ = e.limit.latest("acct-free")
	t.Logf("upgrade → clearing record: %v", seen.Sub(upgraded).Round(time.Millisecond))
	waitPasses(t, act2, 5)
	l, _, _ = e.limit.latest("acct-free")
	assert.LessOrEqual(t, l.UntilMs, time.Now().UnixMilli(), "re-limited after the upgrade")
	assert.Len(t, e.mb.to(rcpt), 1)
}

// TestNextUTCDay: a flag lifts at the end of its day; the new day has no
// flag until the account crosses again, and then a new notice.
func TestNextUTCDay(t *testing.T) {
	e := newEnv(t)
	createAccount(t, e.cat, "acct-day", "day@example.com", fsm.TierFree)
	l := e.start(t, "a", func(c *Config) { c.Notify.SMTP.To = "{account_name}" })
	activeOf(t, l)
	now := e.clk.Now()
	day1, end1 := dayBounds(now)
	addUsage(t, e.st, "acct-day", now, 5_000_001, 0)
	require.Eventually(t, func() bool { return len(e.mb.to("day@example.com")) == 1 }, 20*time.Second, 10*time.Millisecond)
	// Day 1's webhook too, before the clock moves on: a notice still in
	// flight when its limit lifts is dropped by design ("the limit lifted
	// first"), and under load it was (CI, 2026-12-03).
	require.Eventually(t, func() bool { return len(e.hk.of("acct-day")) == 1 }, 20*time.Second, 10*time.Millisecond)
	lim, _, _ := e.limit.latest("acct-day")
	assert.Equal(t, ReasonRowsRead, lim.Reason)
	assert.Equal(t, end1.UnixMilli(), lim.UntilMs)

	// Move the clock to 00:00:05 UTC of the next day.
	e.clk.Advance(end1.Add(5 * time.Second).Sub(e.clk.Now()))
	waitPasses(t, l, 5)
	for _, r := range e.limit.of("acct-day") {
		assert.Equal(t, end1.UnixMilli(), r.UntilMs, "a flag for the new day before crossing again")
	}
	assert.LessOrEqual(t, lim.UntilMs, e.clk.Now().UnixMilli(), "yesterday's flag has lifted")
	assert.Len(t, e.mb.to("day@example.com"), 1)

	addUsage(t, e.st, "acct-day", e.clk.Now(), 0, 100_001)
	day2, end2 := dayBounds(e.clk.Now())
	require.NotEqual(t, day1, day2)
	require.Eventually(t, func() bool {
		r, _, ok := e.limit.latest("acct-day")
		return ok && r.UntilMs == end2.UnixMilli()
	}, 20*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool { return len(e.mb.to("day@example.com")) == 2 }, 20*time.Second, 10*time.Millisecond)
	assert.Contains(t, e.mb.to("day@example.com")[1].data, day2)
	require.Eventually(t, func() bool { return len(e.hk.of("acct-day")) == 2 }, 20*time.Second, 10*time.Millisecond)
	assert.Equal(t, day2, e.hk.of("acct-day")[1].Day)
}

// TestNoticeRetried: a mail server and a webhook that fail at first still
// get exactly one notice, from the same limiter.
func TestNoticeRetried(t *testing.T) {
	e := newEnv(t)
	e.mb.fail, e.hk.fail = 3, 5 // the webhook's own retries eat 3 of these per Send
	createAccount(t, e.cat, "acct-retry", "Retry", fsm.TierFree)
	l := e.start(t, "a", nil)
	activeOf(t, l)
	addUsage(t, e.st, "acct-retry", e.clk.Now(), 0, 200_000)
	require.Eventually(t, func() bool {
		return len(e.mb.to("owner+acct-retry@example.com")) == 1 && len(e.hk.of("acct-retry")) == 1
	}, 30*time.Second, 10*time.Millisecond)
	waitPasses(t, l, 5)
	assert.Len(t, e.mb.to("owner+acct-retry@example.com"), 1)
	assert.Len(t, e.hk.of("acct-retry"), 1)
	assert.Zero(t, l.pendingCount())
}

// TestClaimIsExclusive: of many concurrent claims for one (account, day),
// exactly one is claimed; a retry under the same request ID is answered
// the same; the next day can be claimed again.
func TestClaimIsExclusive(t *testing.T) {
	cat := startCatalog(t)
	ctx := context.Background()
	const n = 16
	ls := make([]*Limiter, n)
	for i := range ls {
		ls[i] = &Limiter{cfg: Config{Catalog: cat, Holder: "h" + strings.Repeat("x", i), Now: time.Now}}
	}
	notice := Notice{AccountID: "acct-1", Day: "2026-12-01"}
	var wg sync.WaitGroup
	won := make([]bool, n)
	for i := range ls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ok, _, err := ls[i].claim(ctx, notice)
			assert.NoError(t, err)
			won[i] = ok
		}()
	}
	wg.Wait()
	winners := 0
	for i, w := range won {
		if w {
			winners++
			ok, _, err := ls[i].claim(ctx, notice) // the same RequestID
			require.NoError(t, err)
			assert.True(t, ok, "a retry of the winning proposal")
		}
	}
	assert.Equal(t, 1, winners)
	ok, _, err := ls[0].claim(ctx, Notice{AccountID: "acct-1", Day: "2026-11-30"})
	require.NoError(t, err)
	assert.False(t, ok, "an earlier day after a later one")
	ok, _, err = ls[1].claim(ctx, Notice{AccountID: "acct-1", Day: "2026-12-02"})
	require.NoError(t, err)
	assert.True(t, ok, "the next day")
}
