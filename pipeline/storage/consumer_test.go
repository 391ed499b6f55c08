package storage

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/shoaldb/shoal/pipeline/event"
	"github.com/shoaldb/shoal/raftmeta"
	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// fakeCatalog applies the catalog's seq rule to a map, and can be made
// unavailable or to refuse stats of chosen databases.
type fakeCatalog struct {
	mu      sync.Mutex
	sizes   map[string]fsm.DatabaseStat
	calls   []int // stats per call
	down    bool
	refuse  map[string]bool
	failed  int
	onWrite func()
}

func newFakeCatalog() *fakeCatalog {
	return &fakeCatalog{sizes: map[string]fsm.DatabaseStat{}, refuse: map[string]bool{}}
}

func (f *fakeCatalog) SetDatabaseStats(_ context.Context, stats []fsm.DatabaseStat) (fsm.StatsResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down {
		f.failed++
		return fsm.StatsResult{}, fmt.Errorf("%w: test says so", raftmeta.ErrUnavailable)
	}
	for _, st := range stats {
		if f.refuse[st.UUID] {
			return fsm.StatsResult{}, &fsm.Error{Code: fsm.CodeInvalid, Message: "invalid command: refused " + st.UUID}
		}
	}
	f.calls = append(f.calls, len(stats))
	var r fsm.StatsResult
	for _, st := range stats {
		old, ok := f.sizes[st.UUID]
		if ok && st.Seq <= old.Seq {
			r.Stale++
			continue
		}
		f.sizes[st.UUID] = st
		r.Applied++
	}
	if f.onWrite != nil {
		f.onWrite()
	}
	return r, nil
}

func (f *fakeCatalog) setDown(v bool) {
	f.mu.Lock()
	f.down = v
	f.mu.Unlock()
}

func (f *fakeCatalog) snapshot() (map[string]fsm.DatabaseStat, []int, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	m := make(map[string]fsm.DatabaseStat, len(f.sizes))
	for k, v := range f.sizes {
		m[k] = v
	}
	return m, append([]int(nil), f.calls...), f.failed
}

// committed is the group's committed offset summed over the partitions.
func committed(t *testing.T, brokers []string, group string) int64 {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	require.NoError(t, err)
	defer cl.Close()
	offs, err := kadm.NewClient(cl).FetchOffsets(context.Background(), group)
	require.NoError(t, err)
	var n int64
	offs.Each(func(o kadm.OffsetResponse) {
		if o.Err == nil && o.At > 0 {
			n += o.At
		}
	})
	return n
}

func testConfig(brokers []string, cat Catalog) Config {
	return Config{Brokers: brokers, Catalog: cat, Group: "g-" + time.Now().Format("150405.000000"),
		RetryMin: 20 * time.Millisecond, RetryMax: 100 * time.Millisecond}
}

// TestCommitsOnlyAfterTheCatalogAcknowledges: while the catalog is down the
// batch is retried with backoff and no offset moves; once it is back the
// batch is written and then committed.
func TestCommitsOnlyAfterTheCatalogAcknowledges(t *testing.T) {
	brokers := startBroker(t, 2)
	cat := newFakeCatalog()
	cat.setDown(true)
	cfg := testConfig(brokers, cat)
	c, _ := runConsumer(t, cfg)
	p := newSizeProducer(t, brokers)
	var sizes []event.Size
	for i := 0; i < 100; i++ {
		sizes = append(sizes, event.Size{DatabaseUUID: uuidN(i), SizeBytes: int64(i), Seq: 1})
	}
	p.produce(sizes...)

	require.Eventually(t, func() bool { return c.Stats().CatalogErrors >= 3 }, 20*time.Second, 10*time.Millisecond)
	assert.Zero(t, committed(t, brokers, cfg.Group), "nothing committed while the catalog is down")
	assert.Zero(t, c.Stats().Committed)

	cat.setDown(false)
	require.Eventually(t, func() bool { return committed(t, brokers, cfg.Group) == 100 }, 10*time.Second, 20*time.Millisecond)
	got, _, failed := cat.snapshot()
	assert.Len(t, got, 100)
	assert.GreaterOrEqual(t, failed, 3)
	s := c.Stats()
	assert.EqualValues(t, 100, s.Consumed)
	assert.EqualValues(t, 100, s.Applied)
	assert.EqualValues(t, 100, s.Committed)
	assert.Zero(t, s.Lag)
}

// TestBatchesByCountAndTime: a backlog goes in writes of at most MaxBatch;
// a trickle waits up to MaxWait to share a write.
func TestBatchesByCountAndTime(t *testing.T) {
	brokers := startBroker(t, 1)
	cat := newFakeCatalog()
	p := newSizeProducer(t, brokers)
	var sizes []event.Size
	for i := 0; i < 2500; i++ {
		sizes = append(sizes, event.Size{DatabaseUUID: uuidN(i), SizeBytes: 1, Seq: 1})
	}
	p.produce(sizes...) // a backlog before the consumer starts
	cfg := testConfig(brokers, cat)
	cfg.MaxBatch = 1000
	cfg.MaxWait = 300 * time.Millisecond
	c, _ := runConsumer(t, cfg)
	require.Eventually(t, func() bool { return c.Stats().Committed == 2500 }, 20*time.Second, 10*time.Millisecond)
	_, calls, _ := cat.snapshot()
	for _, n := range calls {
		assert.LessOrEqual(t, n, 1000)
	}
	assert.GreaterOrEqual(t, len(calls), 3)

	// A trickle: ten sizes, each produced only once the consumer has taken
	// the one before (so each arrives in a poll of its own), share one
	// write — the batch stays open for more up to MaxWait (an hour here,
	// so no timing decides it) and closes at MaxBatch. A consumer that
	// did not wait would write each alone. (This was ten sizes 10 ms
	// apart against a 300 ms MaxWait, asserting at most three writes: a
	// race with the machine's load.)
	brokers = startBroker(t, 1)
	cat = newFakeCatalog()
	p = newSizeProducer(t, brokers)
	cfg = testConfig(brokers, cat)
	cfg.MaxBatch = 10
	cfg.MaxWait = time.Hour
	c, _ = runConsumer(t, cfg)
	for i := 0; i < 10; i++ {
		p.produce(event.Size{DatabaseUUID: uuidN(5000 + i), SizeBytes: 1, Seq: 1})
		require.Eventually(t, func() bool { return c.Stats().Consumed == uint64(i+1) }, time.Minute, 5*time.Millisecond, "size %d taken", i)
	}
	require.Eventually(t, func() bool { return c.Stats().Committed == 10 }, time.Minute, 10*time.Millisecond)
	_, calls, _ = cat.snapshot()
	assert.Equal(t, []int{10}, calls, "a trickle shares one write")
}

// TestRefusedSizesAreIsolated: if the catalog refuses a batch as invalid
// (the consumer's own validation should make that impossible), the batch is
// split until the refused size is alone and dropped; everything else lands.
// Undecodable records are skipped and committed past.
func TestRefusedSizesAreIsolated(t *testing.T) {
	brokers := startBroker(t, 1)
	cat := newFakeCatalog()
	cat.refuse[uuidN(37)] = true
	p := newSizeProducer(t, brokers)
	var sizes []event.Size
	for i := 0; i < 64; i++ {
		sizes = append(sizes, event.Size{DatabaseUUID: uuidN(i), SizeBytes: int64(i), Seq: 1})
	}
	p.produce(sizes...)
	p.produceRecords(&kgo.Record{Value: []byte("garbage")}, &kgo.Record{Value: []byte(`{"v":99}`)})
	c, _ := runConsumer(t, testConfig(brokers, cat))
	require.Eventually(t, func() bool { return c.Stats().Committed == 66 }, 20*time.Second, 10*time.Millisecond)
	got, _, _ := cat.snapshot()
	assert.Len(t, got, 63)
	assert.NotContains(t, got, uuidN(37))
	s := c.Stats()
	assert.EqualValues(t, 3, s.Invalid, "two undecodable records and the refused size")
	assert.EqualValues(t, 63, s.Applied)
}

// TestConsumersAreCapped: the cap is enforced at construction.
func TestConsumersAreCapped(t *testing.T) {
	_, err := New(Config{Brokers: []string{"127.0.0.1:1"}, Catalog: newFakeCatalog(), Consumers: MaxConsumers + 1})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "the cap protects the catalog")
	_, err = New(Config{Brokers: []string{"127.0.0.1:1"}, Catalog: newFakeCatalog(), MaxBatch: fsm.MaxStatsPerCommand + 1})
	require.Error(t, err)
	_, err = New(Config{Catalog: newFakeCatalog()})
	require.Error(t, err)
}

// TestCloseStopsRunWithoutCommitting: Close during a catalog outage
// returns without waiting out the retry backoff, with nothing committed.
// The backoff is an hour, so only Close's cancellation can end the wait (a
// regression hangs here until go test's -timeout); no clock is read (the
// broker is kfake on real sockets: synctest cannot run this).
func TestCloseStopsRunWithoutCommitting(t *testing.T) {
	brokers := startBroker(t, 1)
	cat := newFakeCatalog()
	cat.setDown(true)
	cfg := testConfig(brokers, cat)
	cfg.RetryMin, cfg.RetryMax = time.Hour, time.Hour
	c, stop := runConsumer(t, cfg)
	newSizeProducer(t, brokers).produce(event.Size{DatabaseUUID: uuidN(1), SizeBytes: 1, Seq: 1})
	require.Eventually(t, func() bool { return c.Stats().CatalogErrors >= 1 }, 20*time.Second, 10*time.Millisecond)
	stop() // the write loop is in its hour-long backoff
	assert.Zero(t, committed(t, brokers, cfg.Group))
	assert.Error(t, c.Run(context.Background()), "Run cannot be called again")
}

// TestStalledConsumesNothingUntilReleased: while Config.Stalled says so the
// member polls nothing (the fault tests' stopped consumer); released, it
// takes the backlog the broker kept.
func TestStalledConsumesNothingUntilReleased(t *testing.T) {
	brokers := startBroker(t, 2)
	cat := newFakeCatalog()
	var stalled atomic.Bool
	var asked atomic.Int64
	stalled.Store(true)
	cfg := testConfig(brokers, cat)
	cfg.Stalled = func() bool { asked.Add(1); return stalled.Load() }
	c, _ := runConsumer(t, cfg)
	p := newSizeProducer(t, brokers)
	var sizes []event.Size
	for i := 0; i < 100; i++ {
		sizes = append(sizes, event.Size{DatabaseUUID: uuidN(i), SizeBytes: int64(i), Seq: 1})
	}
	p.produce(sizes...)
	// Asked again after the records were produced: the member is held at
	// the stall, not merely slow.
	seen := asked.Load()
	require.Eventually(t, func() bool { return asked.Load() > seen+3 }, 20*time.Second, 10*time.Millisecond)
	assert.Zero(t, c.Stats().Consumed, "a stalled consumer polled")
	assert.Zero(t, committed(t, brokers, cfg.Group))

	stalled.Store(false)
	require.Eventually(t, func() bool { return committed(t, brokers, cfg.Group) == 100 }, 20*time.Second, 20*time.Millisecond)
	got, _, _ := cat.snapshot()
	assert.Len(t, got, 100)
}
