package pipeline

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/shoaldb/shoal/pipeline/broker"
	"github.com/shoaldb/shoal/pipeline/event"
)

// startBroker starts an embedded broker (real TCP) with the default topics.
func startBroker(t *testing.T, addr, dir string) *broker.Broker {
	t.Helper()
	b, err := broker.Start(broker.Config{Addr: addr, DataDir: dir})
	require.NoError(t, err)
	t.Cleanup(b.Close)
	return b
}

func ensureTopics(t *testing.T, addr string) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr))
	require.NoError(t, err)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	require.NoError(t, EnsureTopics(ctx, cl))
}

// freeAddr returns a loopback address nothing listens on (a broker that is
// down).
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

func newProducer(t *testing.T, cfg Config) *Producer {
	t.Helper()
	p, err := New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		p.Close(ctx)
	})
	return p
}

// consumed is what a test consumer read: values per key, in offset order
// (one key lives on one partition, so this is the key's delivery order).
type consumed struct {
	byKey map[string][]string
	ids   map[string]int // value → times seen
}

// consumeUntil reads topic from the start until every value in want has
// been seen (duplicates allowed), or fails after timeout.
func consumeUntil(t *testing.T, addr, topic string, want map[string]bool, timeout time.Duration) consumed {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	require.NoError(t, err)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	c := consumed{byKey: map[string][]string{}, ids: map[string]int{}}
	missing := len(want)
	for missing > 0 {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("consumed %d distinct values, %d of the wanted ones missing", len(c.ids), missing)
		}
		fs.EachRecord(func(r *kgo.Record) {
			v := string(r.Value)
			c.byKey[string(r.Key)] = append(c.byKey[string(r.Key)], v)
			if c.ids[v] == 0 && want[v] {
				missing--
			}
			c.ids[v]++
		})
	}
	return c
}

// checkOrder asserts that, per key and producer, the first deliveries of
// values ("producer/seq") come in increasing seq order: duplicates may come
// later, but nothing overtakes.
func checkOrder(t *testing.T, c consumed) {
	t.Helper()
	for k, vs := range c.byKey {
		seen := map[string]bool{}
		last := map[string]uint64{}
		for _, v := range vs {
			if seen[v] {
				continue
			}
			seen[v] = true
			id, err := event.ParseID(v)
			require.NoError(t, err)
			require.Greater(t, id.Seq, last[id.Producer], "key %s: %s delivered after seq %d", k, v, last[id.Producer])
			last[id.Producer] = id.Seq
		}
	}
}

// traffic publishes "producer/seq" values over nkeys keys and remembers
// what was accepted.
type traffic struct {
	ids      *Sequencer
	nkeys    int
	accepted map[string]bool
	dropped  int
}

func newTraffic(producer string, nkeys int) *traffic {
	return &traffic{ids: NewSequencer(producer), nkeys: nkeys, accepted: map[string]bool{}}
}

func (tr *traffic) publish(p *Producer, n int) {
	for range n {
		id := tr.ids.Next()
		key := "acct-" + strconv.FormatUint(id.Seq%uint64(tr.nkeys), 10)
		v := id.String()
		if err := p.Publish(event.TopicUsage, []byte(key), []byte(v)); err != nil {
			tr.dropped++
			continue
		}
		tr.accepted[v] = true
	}
}

// recPub is a Publisher that records what the aggregators publish (the
// aggregators' own tests; the Kafka path is tested end to end separately).
type recPub struct {
	mu   sync.Mutex
	recs []pubRec
	fail func(topic string, key []byte) bool
}

type pubRec struct {
	topic, key string
	value      []byte
}

func (r *recPub) Publish(topic string, key, value []byte) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fail != nil && r.fail(topic, key) {
		return ErrSpillFull
	}
	r.recs = append(r.recs, pubRec{topic, string(key), value})
	return nil
}

func (r *recPub) take() []pubRec {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.recs
	r.recs = nil
	return out
}

// fakeClock is a Clock moved by Advance. Its tickers deliver on an
// unbuffered channel, so Advance returns only when the ticked loop has
// taken the tick (and, at the next Advance, finished handling it).
type fakeClock struct {
	mu      sync.Mutex
	now     time.Time
	tickers []*fakeTicker
}

type fakeTicker struct {
	c       chan time.Time
	d       time.Duration
	next    time.Time
	stopped chan struct{}
	once    sync.Once
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) NewTicker(d time.Duration) Ticker {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTicker{c: make(chan time.Time), d: d, next: c.now.Add(d), stopped: make(chan struct{})}
	c.tickers = append(c.tickers, t)
	return t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	now := c.now
	ts := append([]*fakeTicker(nil), c.tickers...)
	c.mu.Unlock()
	for _, t := range ts {
		for !t.next.After(now) {
			select {
			case t.c <- now:
			case <-t.stopped:
			}
			t.next = t.next.Add(t.d)
		}
	}
}

func (t *fakeTicker) C() <-chan time.Time { return t.c }
func (t *fakeTicker) Stop()               { t.once.Do(func() { close(t.stopped) }) }

func keyOf(i int) string { return fmt.Sprintf("k%03d", i) }

// describeTopics returns the topics' metadata and their configs by name.
// (The client caches metadata briefly, so the names are given.)
func describeTopics(ctx context.Context, t *testing.T, p *Producer, names ...string) (kadm.TopicDetails, map[string]map[string]string) {
	t.Helper()
	adm := kadm.NewClient(p.Client())
	details, err := adm.ListTopics(ctx, names...)
	require.NoError(t, err)
	rcs, err := adm.DescribeTopicConfigs(ctx, names...)
	require.NoError(t, err)
	configs := map[string]map[string]string{}
	for _, rc := range rcs {
		configs[rc.Name] = map[string]string{}
		for _, c := range rc.Configs {
			configs[rc.Name][c.Key] = c.MaybeValue()
		}
	}
	return details, configs
}

func startBrokerB(b *testing.B) string {
	br, err := broker.Start(broker.Config{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(br.Close)
	return br.Addr()
}

func ensureTopicsB(b *testing.B, addr string) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr))
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	if err := EnsureTopics(context.Background(), cl); err != nil {
		b.Fatal(err)
	}
}
