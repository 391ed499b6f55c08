package objecthost

import (
	"context"
	"errors"
	"net/http"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	v4 "github.com/shoaldb/shoal/internal/v4"
	"github.com/shoaldb/shoal/objecthost/sqlexec"
	"github.com/shoaldb/shoal/pipeline"
	"github.com/shoaldb/shoal/pipeline/broker"
	"github.com/shoaldb/shoal/pipeline/event"
)

// limitsBroker is a real broker over TCP with the limits topic created as
// the plane creates it, and a producer client writing to it.
func limitsBroker(t *testing.T) (addr string, produce func(key string, v *event.Limit)) {
	t.Helper()
	b, err := broker.Start(broker.Config{})
	require.NoError(t, err)
	t.Cleanup(b.Close)
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.Addr()))
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var spec []pipeline.TopicSpec
	for _, s := range pipeline.DefaultTopics() {
		if s.Name == event.TopicLimits {
			spec = append(spec, s)
		}
	}
	require.NoError(t, pipeline.EnsureTopics(ctx, cl, spec...))
	seq := uint64(0)
	return b.Addr(), func(key string, v *event.Limit) {
		t.Helper()
		rec := &kgo.Record{Topic: event.TopicLimits, Key: []byte(key)}
		if v != nil {
			seq++
			v.V, v.EventID = event.Version, event.ID{Producer: "test-limiter", Seq: seq}
			b, err := event.Encode(v)
			require.NoError(t, err)
			rec.Value = b
		}
		require.NoError(t, cl.ProduceSync(context.Background(), rec).FirstErr())
	}
}

// eventually polls cond every 5 ms for up to 20 s and returns how long it
// took to hold.
func eventually(t *testing.T, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		require.Less(t, time.Since(start), 20*time.Second, "timed out waiting: %s", what)
		time.Sleep(5 * time.Millisecond) // poll interval of a wait for the condition above (the event itself)
	}
	return time.Since(start)
}

func selectOne(th *testHost, d db) error {
	_, err := th.Query(context.Background(), d.obj, d.id(), sqlexec.Request{Statements: []sqlexec.Statement{{SQL: "SELECT 1"}}})
	return err
}

func TestLimitsFeedRefusesLimitedAccountUntilItLifts(t *testing.T) {
	addr, produce := limitsBroker(t)
	th := newTestHost(t, func(c *Config) { c.LimitsFeed = &LimitsFeedOptions{Brokers: []string{addr}} })
	limited, other := newDB("acct-limited"), newDB("acct-other")
	th.mustInit(t, limited)
	th.mustInit(t, other)
	require.NoError(t, selectOne(th, limited))

	// The limiter's flag: until the end of the host's (fake) UTC day.
	endOfDay := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	produce(limited.account, &event.Limit{AccountID: limited.account, Reason: "rows_written_per_day", UntilMs: endOfDay.UnixMilli()})
	took := eventually(t, "the flag to apply", func() bool { return selectOne(th, limited) != nil })
	t.Logf("limit record → refusal: %v", took)

	err := selectOne(th, limited)
	require.ErrorIs(t, err, ErrRowLimit)
	status, code, msg := statusOf(err)
	assert.Equal(t, http.StatusTooManyRequests, status)
	assert.Equal(t, v4.CodeRowLimit, code)
	assert.Contains(t, msg, "rows written per day limit")
	assert.Contains(t, msg, "lifts at 2026-11-30T00:00:00Z")
	assert.NoError(t, selectOne(th, other), "another account is unaffected")
	assert.Equal(t, 1.0, gaugeValue(t, th, "shoal_objecthost_limits_limited_accounts"))

	// A restart re-reads the topic: the first query is already refused.
	th.reopen(t)
	assert.ErrorIs(t, selectOne(th, limited), ErrRowLimit, "a restarted host keeps the flag")
	assert.NoError(t, selectOne(th, other))

	// A tombstone clears the flag (an upgrade).
	start := time.Now()
	produce(limited.account, nil)
	eventually(t, "the tombstone to clear", func() bool { return selectOne(th, limited) == nil })
	t.Logf("tombstone → unblocked: %v", time.Since(start))

	// A record whose end time has passed clears too.
	produce(limited.account, &event.Limit{AccountID: limited.account, Reason: "rows_read_per_day", UntilMs: endOfDay.UnixMilli()})
	eventually(t, "the second flag", func() bool { return selectOne(th, limited) != nil })
	assert.Contains(t, selectOne(th, limited).Error(), "rows read per day limit")
	produce(limited.account, &event.Limit{AccountID: limited.account, Reason: "rows_read_per_day", UntilMs: th.clock.Now().Add(-time.Second).UnixMilli()})
	eventually(t, "an expired record to clear", func() bool { return selectOne(th, limited) == nil })

	// Expiry needs no record: the clock passing UntilMs lifts the flag.
	produce(limited.account, &event.Limit{AccountID: limited.account, Reason: "rows_written_per_day", UntilMs: endOfDay.UnixMilli()})
	eventually(t, "the third flag", func() bool { return selectOne(th, limited) != nil })
	th.clock.Advance(endOfDay.Sub(th.clock.Now()) - time.Millisecond)
	assert.ErrorIs(t, selectOne(th, limited), ErrRowLimit, "still limited just before the end of the day")
	th.clock.Advance(time.Millisecond)
	assert.NoError(t, selectOne(th, limited), "the new UTC day lifts the flag")
	assert.Equal(t, 0.0, gaugeValue(t, th, "shoal_objecthost_limits_limited_accounts"))

	// Invalid records are skipped and counted, and do not stop the feed.
	produce("acct-x", &event.Limit{AccountID: "acct-y", UntilMs: endOfDay.Add(time.Hour).UnixMilli()})
	produce(other.account, &event.Limit{AccountID: other.account, Reason: "rows_read_per_day", UntilMs: endOfDay.Add(time.Hour).UnixMilli()})
	eventually(t, "the record after an invalid one", func() bool { return selectOne(th, other) != nil })
	st, ok := th.LimitsFeedStats()
	require.True(t, ok)
	assert.Equal(t, int64(1), st.Invalid)
	assert.True(t, st.CaughtUp)
	assert.Zero(t, st.Lag)
}

// TestLimitsFeedLatency measures record → refusal and clear → unblocked
// over several rounds (reported, not asserted: shared machines are noisy).
func TestLimitsFeedLatency(t *testing.T) {
	addr, produce := limitsBroker(t)
	th := newTestHost(t, func(c *Config) { c.LimitsFeed = &LimitsFeedOptions{Brokers: []string{addr}} })
	d := newDB("acct-lat")
	th.mustInit(t, d)
	until := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC).UnixMilli()
	var block, clear []time.Duration
	for range 20 {
		start := time.Now()
		produce(d.account, &event.Limit{AccountID: d.account, Reason: "rows_written_per_day", UntilMs: until})
		eventually(t, "refused", func() bool { return errors.Is(selectOne(th, d), ErrRowLimit) })
		block = append(block, time.Since(start))
		start = time.Now()
		produce(d.account, nil)
		eventually(t, "unblocked", func() bool { return selectOne(th, d) == nil })
		clear = append(clear, time.Since(start))
	}
	t.Logf("limit → refused: %s; clear → unblocked: %s", quantiles(block), quantiles(clear))
}

func quantiles(ds []time.Duration) string {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	q := func(p float64) time.Duration { return s[min(len(s)-1, int(p*float64(len(s))))] }
	return "p50 " + q(0.50).Round(time.Millisecond/10).String() + " p99 " + q(0.99).Round(time.Millisecond/10).String() + " (n=" + strconv.Itoa(len(s)) + ")"
}

// gaugeValue reads one of the host's gauges by name.
func gaugeValue(t *testing.T, th *testHost, name string) float64 {
	t.Helper()
	mfs, err := th.Registry().Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}
