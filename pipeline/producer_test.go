package pipeline

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/shoaldb/shoal/pipeline/event"
)

func flush(t *testing.T, p *Producer) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	require.NoError(t, p.Flush(ctx), "stats: %+v", p.Stats())
}

// With a healthy broker every record arrives once, in per-key order, and
// nothing touches the spill.
func TestProducerDeliversInOrder(t *testing.T) {
	b := startBroker(t, "", "")
	ensureTopics(t, b.Addr())
	p := newProducer(t, Config{Brokers: []string{b.Addr()}, SpillDir: t.TempDir()})
	tr := newTraffic("host-a@1", 37)
	tr.publish(p, 20_000)
	require.Zero(t, tr.dropped)
	flush(t, p)

	c := consumeUntil(t, b.Addr(), event.TopicUsage, tr.accepted, 30*time.Second)
	checkOrder(t, c)
	for v, n := range c.ids {
		assert.Equal(t, 1, n, "%s delivered %d times", v, n)
	}
	st := p.Stats()
	assert.EqualValues(t, 20_000, st.Enqueued)
	assert.EqualValues(t, 20_000, st.Produced)
	assert.Zero(t, st.SpilledRecords)
	assert.Zero(t, st.Dropped)
	assert.False(t, st.Spilling)
}

// The broker dies mid-stream: records pile up, then go to the spill; the
// broker comes back on the same port and data dir; the spill is replayed
// and direct publishing resumes. Every accepted record is delivered (a
// duplicate only ever under its own event ID), per-key order holds.
func TestProducerBrokerKilledMidStreamReplays(t *testing.T) {
	dataDir := t.TempDir()
	b := startBroker(t, "", dataDir)
	addr := b.Addr()
	ensureTopics(t, addr)
	var copts []kgo.Opt
	if f := os.Getenv("SHOAL_TEST_KGO_LOG"); f != "" {
		lf, err := os.Create(f)
		require.NoError(t, err)
		defer lf.Close()
		copts = append(copts, kgo.WithLogger(kgo.BasicLogger(lf, kgo.LogLevelInfo, nil)))
	}
	// The stall is judged on the producer's clock (Config.Now): moved past
	// StallTimeout by hand rather than slept past it.
	clk := newFakeClock()
	p := newProducer(t, Config{
		Brokers: []string{addr}, SpillDir: t.TempDir(),
		MaxBufferedBytes: 64 << 10, StallTimeout: 200 * time.Millisecond,
		ClientOptions: copts, Now: clk.Now,
	})
	tr := newTraffic("host-a@1", 16)

	tr.publish(p, 3000)
	b.Close()          // mid-stream: some of those are still in flight
	tr.publish(p, 500) // outstanding: nothing acknowledges them now
	clk.Advance(time.Second)
	tr.publish(p, 500)
	require.Eventually(t, func() bool { return p.Stats().SpilledRecords > 0 }, 10*time.Second, 10*time.Millisecond)
	st := p.Stats()
	assert.True(t, st.Spilling)
	t.Logf("broker down: %+v", st)

	b2 := startBroker(t, addr, dataDir)
	tr.publish(p, 3000) // behind the spill
	flush(t, p)
	require.Zero(t, tr.dropped)

	c := consumeUntil(t, b2.Addr(), event.TopicUsage, tr.accepted, 60*time.Second)
	checkOrder(t, c)
	for v := range c.ids {
		assert.True(t, tr.accepted[v], "delivered %s which was never accepted", v)
	}
	st = p.Stats()
	t.Logf("after replay: %+v", st)
	assert.Greater(t, st.Replayed, uint64(0))
	assert.Zero(t, st.Dropped)
	assert.False(t, st.Spilling)
	assert.Zero(t, st.SpillBytes)
	assert.GreaterOrEqual(t, st.Produced, uint64(len(tr.accepted)))

	// Direct again: new records skip the spill.
	spilled := st.SpilledRecords
	tr.publish(p, 100)
	flush(t, p)
	assert.Equal(t, spilled, p.Stats().SpilledRecords)
	// The spill directory holds no segment once replayed (the active one
	// is retired on the writer's next tick).
	require.Eventually(t, func() bool {
		segs, _ := filepath.Glob(filepath.Join(p.cfg.SpillDir, "*.seg"))
		return len(segs) == 0
	}, 5*time.Second, 50*time.Millisecond)
}

// With the broker down and a tiny spill, Publish keeps returning at once:
// records are spilled until the spill is full, then dropped — and every
// drop is one Publish that said so, and one count in the metric.
func TestProducerFullSpillDropsAndNeverBlocks(t *testing.T) {
	reg := prometheus.NewRegistry()
	p := newProducer(t, Config{
		Brokers: []string{freeAddr(t)}, SpillDir: t.TempDir(),
		MaxBufferedBytes: 16 << 10, MaxSpillBytes: 256 << 10, SpillSegmentBytes: 64 << 10,
		Registerer: reg,
	})
	value := make([]byte, 200)
	const n = 50_000
	var dropped int
	lat := make([]time.Duration, 0, n)
	for i := range n {
		start := time.Now()
		err := p.Publish(event.TopicUsage, []byte(keyOf(i%100)), value)
		lat = append(lat, time.Since(start))
		if err != nil {
			require.ErrorIs(t, err, ErrSpillFull)
			dropped++
		}
	}
	slices.Sort(lat)
	t.Logf("Publish with the broker down, %d calls: p50 %v, p99 %v, p99.9 %v, max %v; %d dropped",
		n, lat[n/2], lat[n*99/100], lat[n*999/1000], lat[n-1], dropped)
	require.Positive(t, dropped)
	require.Eventually(t, func() bool { return p.Stats().SpilledRecords > 0 }, 5*time.Second, 10*time.Millisecond)
	st := p.Stats()
	assert.EqualValues(t, dropped, st.DroppedBy[dropSpillFull])
	assert.EqualValues(t, dropped, st.Dropped)
	assert.EqualValues(t, n, st.Enqueued)
	assert.LessOrEqual(t, st.SpillBytes, int64(256<<10))
	assert.Equal(t, float64(dropped), gathered(t, reg, "shoal_pipeline_producer_dropped_total", "spill_full"))

	// Close with the broker still down: it must return (bounded by its
	// context) and lose nothing more.
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	require.NoError(t, p.Close(ctx))
	t.Logf("Close with the broker down took %v", time.Since(start))
	assert.EqualValues(t, dropped, p.Stats().Dropped)
	assert.ErrorIs(t, p.Publish(event.TopicUsage, nil, value), ErrClosed)
	// Closed: the metrics are unregistered.
	mfs, err := reg.Gather()
	require.NoError(t, err)
	assert.Empty(t, mfs)
}

// gathered returns the value of a counter with the given reason label, as
// the registry exports it.
func gathered(t *testing.T, reg *prometheus.Registry, name, reason string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" && l.GetValue() == reason {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("metric %s{reason=%q} not found", name, reason)
	return 0
}

// A producer closed while the broker is down leaves everything in the
// spill (what the client held goes ahead of what was spilled, being
// older); a new producer on the same directory replays it, in order,
// before the records published to it.
func TestProducerRestartReplaysSpill(t *testing.T) {
	spillDir := t.TempDir()
	addr := freeAddr(t)
	p1, err := New(Config{Brokers: []string{addr}, SpillDir: spillDir,
		MaxBufferedBytes: 32 << 10, StallTimeout: time.Hour})
	require.NoError(t, err)
	tr := newTraffic("host-a@1", 8)
	tr.publish(p1, 5000) // the first ~32 KiB sit in the client, the rest spill
	require.Zero(t, tr.dropped)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	require.NoError(t, p1.Close(ctx))
	st := p1.Stats()
	t.Logf("first producer: %+v", st)
	assert.Zero(t, st.Dropped)
	assert.EqualValues(t, 5000, st.SpilledRecords, "everything is on disk after Close")

	b := startBroker(t, addr, "")
	ensureTopics(t, addr)
	p2 := newProducer(t, Config{Brokers: []string{addr}, SpillDir: spillDir})
	assert.True(t, p2.Stats().Spilling, "a spill left on disk puts new records behind it")
	tr2 := newTraffic("host-a@2", 8)
	tr2.publish(p2, 1000)
	flush(t, p2)

	want := map[string]bool{}
	for v := range tr.accepted {
		want[v] = true
	}
	for v := range tr2.accepted {
		want[v] = true
	}
	c := consumeUntil(t, b.Addr(), event.TopicUsage, want, 60*time.Second)
	checkOrder(t, c)
	// Per key, every record of the first run comes before any of the second.
	for k, vs := range c.byKey {
		inSecond := false
		for _, v := range vs {
			id, err := event.ParseID(v)
			require.NoError(t, err)
			if id.Producer == "host-a@2" {
				inSecond = true
			} else {
				require.False(t, inSecond, "key %s: %s after a record of the new run", k, v)
			}
		}
	}
	st = p2.Stats()
	// The new run's records queued behind the spill, so they were
	// replayed from it too.
	assert.EqualValues(t, 6000, st.Replayed)
	assert.Zero(t, st.Dropped)
}

// Only one producer at a time owns a spill directory.
func TestProducerSpillLocked(t *testing.T) {
	dir := t.TempDir()
	p := newProducer(t, Config{Brokers: []string{freeAddr(t)}, SpillDir: dir})
	_, err := New(Config{Brokers: []string{freeAddr(t)}, SpillDir: dir})
	assert.ErrorIs(t, err, ErrSpillLocked)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	require.NoError(t, p.Close(ctx))
	p2, err := New(Config{Brokers: []string{freeAddr(t)}, SpillDir: dir})
	require.NoError(t, err, "Close releases the directory")
	require.NoError(t, p2.Close(ctx))
}

func TestProducerRefusesOversizedRecord(t *testing.T) {
	p := newProducer(t, Config{Brokers: []string{freeAddr(t)}, SpillDir: t.TempDir(), MaxRecordBytes: 100})
	err := p.Publish(event.TopicUsage, nil, make([]byte, 101))
	assert.ErrorIs(t, err, ErrRecordTooLarge)
	assert.EqualValues(t, 1, p.Stats().DroppedBy[dropTooLarge])
}

// A spill with a torn tail (a crash mid-write) and a corrupted frame in an
// older segment replays every intact record before the damage and counts
// the skipped bytes.
func TestSpillSurvivesTornAndCorruptSegments(t *testing.T) {
	dir := t.TempDir()
	var st counters
	s, err := openSpill(dir, spillConfig{maxBytes: 1 << 20, segBytes: 1 << 10, queueMax: 1 << 20, syncEvery: 0}, &st, nil)
	require.NoError(t, err)
	for i := range 100 {
		require.NoError(t, s.append("t", []byte(keyOf(i)), []byte(keyOf(i)), int64(i)))
	}
	require.NoError(t, s.close(nil))
	segs, _ := filepath.Glob(filepath.Join(dir, "*.seg"))
	require.Greater(t, len(segs), 2)
	// Flip a byte in the middle of the second segment's first frame body,
	// and tear the last segment's final frame.
	raw, err := os.ReadFile(segs[1])
	require.NoError(t, err)
	raw[segHeaderLen+frameHeaderLen+3] ^= 0xFF
	require.NoError(t, os.WriteFile(segs[1], raw, 0o644))
	fi, err := os.Stat(segs[len(segs)-1])
	require.NoError(t, err)
	require.NoError(t, os.Truncate(segs[len(segs)-1], fi.Size()-3))

	s, err = openSpill(dir, spillConfig{maxBytes: 1 << 20, segBytes: 1 << 10, queueMax: 1 << 20}, &st, nil)
	require.NoError(t, err)
	var got []string
	var last int64 = -1
	for {
		rec, pos, status := s.next()
		if status == readNone {
			break
		}
		s.commit(pos)
		if status == readOK {
			require.Greater(t, rec.ts, last, "order")
			last = rec.ts
			got = append(got, string(rec.value))
			assert.Equal(t, rec.key, rec.value)
			assert.Equal(t, "t", rec.topic)
		}
	}
	perSeg := len(got) / (len(segs) - 1)
	t.Logf("%d segments, %d records read back, %d corrupt bytes skipped", len(segs), len(got), st.corruptBytes.Load())
	assert.Less(t, len(got), 100)
	assert.Greater(t, len(got), 100-2*perSeg-2)
	assert.Positive(t, st.corruptBytes.Load())
	assert.Zero(t, s.backlog(), "the skipped stretches are consumed too")
	require.NoError(t, s.close(nil))
}

// The cursor persists how far replay got: a reopened spill does not
// replay what was acknowledged.
func TestSpillCursorPersists(t *testing.T) {
	dir := t.TempDir()
	var st counters
	cfg := spillConfig{maxBytes: 1 << 20, segBytes: 4 << 10, queueMax: 1 << 20}
	s, err := openSpill(dir, cfg, &st, nil)
	require.NoError(t, err)
	for i := range 200 {
		require.NoError(t, s.append("t", nil, []byte(keyOf(i)), int64(i)))
	}
	require.NoError(t, s.close(nil))
	s, err = openSpill(dir, cfg, &st, nil)
	require.NoError(t, err)
	for range 150 {
		_, pos, status := s.next()
		require.Equal(t, readOK, status)
		s.commit(pos)
	}
	require.NoError(t, s.close(nil))
	s, err = openSpill(dir, cfg, &st, nil)
	require.NoError(t, err)
	rec, _, status := s.next()
	require.Equal(t, readOK, status)
	assert.Equal(t, keyOf(150), string(rec.value))
	assert.Nil(t, rec.key)
	require.NoError(t, s.close(nil))
}

func TestBootEpochAndSequencer(t *testing.T) {
	dir := t.TempDir()
	e1, err := BootEpoch(dir)
	require.NoError(t, err)
	e2, err := BootEpoch(dir)
	require.NoError(t, err)
	assert.Equal(t, uint64(1), e1)
	assert.Equal(t, uint64(2), e2)

	s, err := OpenSequencer(dir, "host-a")
	require.NoError(t, err)
	assert.Equal(t, "host-a@3", s.Producer())
	assert.Equal(t, event.ID{Producer: "host-a@3", Seq: 1}, s.Next())
	assert.Equal(t, event.ID{Producer: "host-a@3", Seq: 2}, s.Next())

	require.NoError(t, os.WriteFile(filepath.Join(dir, epochFile), []byte("garbage"), 0o644))
	_, err = BootEpoch(dir)
	assert.Error(t, err, "a damaged epoch is never guessed")
	_, err = OpenSequencer(dir, "")
	assert.Error(t, err)
}

func TestEnsureTopicsIdempotent(t *testing.T) {
	b := startBroker(t, "", "")
	ensureTopics(t, b.Addr())
	ensureTopics(t, b.Addr()) // again: no error
	p := newProducer(t, Config{Brokers: []string{b.Addr()}, SpillDir: t.TempDir()})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var names []string
	for _, spec := range DefaultTopics() {
		names = append(names, spec.Name)
	}
	details, configs := describeTopics(ctx, t, p, names...)
	for _, spec := range DefaultTopics() {
		assert.Len(t, details[spec.Name].Partitions, int(spec.Partitions), spec.Name)
		for k, v := range spec.Configs {
			assert.Equal(t, v, configs[spec.Name][k], "%s %s", spec.Name, k)
		}
	}
	assert.Equal(t, "compact", configs[event.TopicRoutes]["cleanup.policy"])
	assert.Equal(t, "compact", configs[event.TopicLimits]["cleanup.policy"])

	// A topic that exists with the wrong policy is corrected.
	wrong := TopicSpec{Name: "scratch", Partitions: 2, ReplicationFactor: -1, Configs: map[string]string{"cleanup.policy": "delete"}}
	require.NoError(t, EnsureTopics(ctx, p.Client(), wrong))
	wrong.Configs["cleanup.policy"] = "compact"
	require.NoError(t, EnsureTopics(ctx, p.Client(), wrong))
	_, configs = describeTopics(ctx, t, p, "scratch")
	assert.Equal(t, "compact", configs["scratch"]["cleanup.policy"])
	// Errors are reported, not swallowed.
	done, cancelDone := context.WithCancel(ctx)
	cancelDone()
	assert.ErrorIs(t, EnsureTopics(done, p.Client(), TopicSpec{Name: "late", Partitions: 1, ReplicationFactor: -1}), context.Canceled)
}

// With records outstanding and nothing acknowledged, the producer spills
// once StallTimeout has passed on its clock, and not before: the stall
// path alone (buffers far larger than the records), on a fake clock.
func TestProducerSpillsOnlyPastStallTimeout(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	dead := ln.Addr().String()
	ln.Close() // nothing listens: every record stays outstanding
	clk := newFakeClock()
	p := newProducer(t, Config{Brokers: []string{dead}, SpillDir: t.TempDir(), Now: clk.Now,
		MaxBufferedBytes: 64 << 20, MaxBufferedRecords: 1 << 20, StallTimeout: 5 * time.Second})
	tr := newTraffic("host-s@1", 4)
	tr.publish(p, 10)
	clk.Advance(5 * time.Second) // at the timeout, not past it
	tr.publish(p, 10)
	assert.False(t, p.Stats().Spilling, "spilling before StallTimeout passed")
	assert.Zero(t, p.Stats().SpilledRecords)
	clk.Advance(time.Millisecond)
	tr.publish(p, 10)
	assert.True(t, p.Stats().Spilling, "not spilling past StallTimeout with nothing acknowledged")
	require.Eventually(t, func() bool { return p.Stats().SpilledRecords >= 10 }, time.Minute, 5*time.Millisecond, "the records after the stall go to the spill")
	require.Zero(t, tr.dropped)
}

// Close of the producer and the aggregators leaves no goroutine behind.
func TestCloseLeavesNoGoroutines(t *testing.T) {
	b := startBroker(t, "", "")
	ensureTopics(t, b.Addr())
	time.Sleep(50 * time.Millisecond) // let the admin client's goroutines go
	before := runtime.NumGoroutine()

	p, err := New(Config{Brokers: []string{b.Addr()}, SpillDir: t.TempDir()})
	require.NoError(t, err)
	ids := NewSequencer("h@1")
	ua := NewUsageAggregator(p, ids, UsageConfig{})
	sa := NewSizeAggregator(p, ids, SizeConfig{})
	ua.Record("a", "d", 1, "q", 1, 1, time.Millisecond, false)
	sa.Record("a", "d", 100, 1)
	ua.Close()
	sa.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, p.Close(ctx))
	assert.EqualValues(t, 2, p.Stats().Produced)
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond) // poll interval: goroutines counted until they are gone (deadline above)
	}
	if n := runtime.NumGoroutine(); n > before {
		buf := make([]byte, 1<<20)
		t.Fatalf("goroutines: %d before, %d after:\n%s", before, n, buf[:runtime.Stack(buf, true)])
	}
}

// Records for a topic that does not exist yet fail in the client; they go
// to the spill, replay keeps failing and rewinding (with backoff) until the
// topic is created, and then everything is delivered.
func TestProducerMissingTopicSpillsAndRecovers(t *testing.T) {
	b := startBroker(t, "", "")
	p := newProducer(t, Config{Brokers: []string{b.Addr()}, SpillDir: t.TempDir(),
		ClientOptions: []kgo.Opt{kgo.MetadataMinAge(50 * time.Millisecond), kgo.UnknownTopicRetries(1)}})
	tr := newTraffic("h@1", 4)
	tr.publish(p, 500)
	require.Eventually(t, func() bool { return p.Stats().SpilledRecords == 500 }, 20*time.Second, 10*time.Millisecond,
		"the client fails records of an unknown topic after its retries; they are spilled")
	require.Eventually(t, func() bool { return p.Stats().ProduceErrors > 500 }, 20*time.Second, 10*time.Millisecond,
		"replay fails too while the topic is missing")
	ensureTopics(t, b.Addr())
	flush(t, p)
	c := consumeUntil(t, b.Addr(), event.TopicUsage, tr.accepted, 30*time.Second)
	assert.Len(t, c.ids, 500)
	st := p.Stats()
	t.Logf("%+v", st)
	assert.Zero(t, st.Dropped)
	assert.False(t, st.Spilling)
}
