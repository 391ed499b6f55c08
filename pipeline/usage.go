package pipeline

import (
	"hash/maphash"
	"log/slog"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shoaldb/shoal/pipeline/event"
)

// UsageConfig configures a UsageAggregator. Zero values take the
// documented defaults.
type UsageConfig struct {
	Host   string        // host ID stamped on every event
	Window time.Duration // pre-aggregation window (default 1 s)
	Clock  Clock         // default SystemClock
	// Shards is the number of independently locked maps Record spreads
	// keys over (default 64, rounded up to a power of two).
	Shards int
	// Registerer receives shoal_pipeline_usage_* metrics (optional).
	Registerer prometheus.Registerer
	Logger     *slog.Logger
}

// UsageAggregator pre-aggregates query usage per (account, database, query
// shape) on one host and publishes one event.Usage per key and window, so
// the event rate follows the number of active keys, not the query rate.
//
// Concurrency contract: Record is called on the query path from many
// goroutines at once; it takes one shard mutex for a map update and never
// waits on the network or on a flush (a flush holds each shard's lock only
// to swap its map). Flush and the window loop are serialised. Every Record
// before Close lands in exactly one window: no count is lost or counted
// twice by the aggregator (delivery is then at least once, deduplicated
// downstream by event ID).
type UsageAggregator struct {
	pub   Publisher
	ids   *Sequencer
	cfg   UsageConfig
	seed  maphash.Seed
	mask  uint64
	shard []usageShard

	flushMu     sync.Mutex
	windowStart time.Time

	closed atomic.Bool
	stop   chan struct{}
	done   chan struct{}
	once   sync.Once

	windows, events, dropped, late atomic.Uint64
	lastFlush                      atomic.Int64 // Unix ms of the last window end
	cols                           []prometheus.Collector
}

type usageKey struct {
	account, database string
	shapeHash         uint64
}

type usageAcc struct {
	shape                                  string
	queries, errors, rowsRead, rowsWritten int64
	durNs, maxNs                           int64
}

type usageShard struct {
	mu     sync.Mutex
	closed bool // set by the final flush: later Records are discarded
	m      map[usageKey]*usageAcc
	spare  map[usageKey]*usageAcc
	_      [32]byte // keep neighbouring shards' locks off one cache line
}

// NewUsageAggregator starts an aggregator publishing to pub with IDs from
// ids. Close it to stop the window loop (after a final flush).
func NewUsageAggregator(pub Publisher, ids *Sequencer, cfg UsageConfig) *UsageAggregator {
	if cfg.Window <= 0 {
		cfg.Window = time.Second
	}
	if cfg.Clock == nil {
		cfg.Clock = SystemClock{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	n := shardCount(cfg.Shards)
	a := &UsageAggregator{
		pub: pub, ids: ids, cfg: cfg,
		seed:  maphash.MakeSeed(),
		mask:  uint64(n - 1),
		shard: make([]usageShard, n),
		stop:  make(chan struct{}),
		done:  make(chan struct{}),
	}
	for i := range a.shard {
		a.shard[i].m = make(map[usageKey]*usageAcc)
	}
	a.windowStart = cfg.Clock.Now()
	a.lastFlush.Store(a.windowStart.UnixMilli())
	if cfg.Registerer != nil {
		a.cols = aggregatorCollectors("usage", &a.windows, &a.events, &a.dropped, &a.late, &a.lastFlush)
		registerAll(cfg.Registerer, a.cols, cfg.Logger)
	}
	t := cfg.Clock.NewTicker(cfg.Window)
	go a.run(t)
	return a
}

func shardCount(n int) int {
	if n <= 0 {
		n = 64
	}
	return 1 << bits.Len(uint(n-1))
}

// Record adds one query's usage. shape is the normalised statement and
// shapeHash its stable hash (the key; shape is kept from the first Record
// of a key in a window). Calls after Close are discarded and counted.
func (a *UsageAggregator) Record(account, database string, shapeHash uint64, shape string,
	rowsRead, rowsWritten int64, duration time.Duration, isError bool) {
	h := maphash.String(a.seed, database) ^ (shapeHash * 0x9E3779B97F4A7C15)
	s := &a.shard[h&a.mask]
	k := usageKey{account: account, database: database, shapeHash: shapeHash}
	ns := int64(duration)
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		a.late.Add(1)
		return
	}
	acc := s.m[k]
	if acc == nil {
		acc = &usageAcc{shape: shape}
		s.m[k] = acc
	}
	acc.queries++
	if isError {
		acc.errors++
	}
	acc.rowsRead += rowsRead
	acc.rowsWritten += rowsWritten
	acc.durNs += ns
	if ns > acc.maxNs {
		acc.maxNs = ns
	}
	s.mu.Unlock()
}

func (a *UsageAggregator) run(t Ticker) {
	defer close(a.done)
	defer t.Stop()
	for {
		select {
		case <-t.C():
			a.Flush()
		case <-a.stop:
			return
		}
	}
}

// Flush closes the current window now: it publishes one event per key
// recorded since the last flush, with the window [last flush, now). The
// window loop calls it every Window; tests and Close call it directly.
func (a *UsageAggregator) Flush() {
	a.flushMu.Lock()
	defer a.flushMu.Unlock()
	end := a.cfg.Clock.Now()
	start := a.windowStart
	final := a.closed.Load()
	if !end.After(start) && !final {
		return // a window has positive length: keep accumulating
	}
	a.windowStart = end
	// Swap every shard first, so the window's cut is as sharp as the
	// swaps are fast; publish afterwards without any shard lock.
	full := make([]map[usageKey]*usageAcc, len(a.shard))
	for i := range a.shard {
		s := &a.shard[i]
		fresh := s.spare
		if fresh == nil {
			fresh = make(map[usageKey]*usageAcc)
		}
		s.mu.Lock()
		full[i], s.m, s.spare = s.m, fresh, nil
		s.closed = s.closed || final
		s.mu.Unlock()
	}
	startMs, endMs := start.UnixMilli(), end.UnixMilli()
	for i, m := range full {
		for k, acc := range m {
			u := event.Usage{
				V:            event.Version,
				EventID:      a.ids.Next(),
				Host:         a.cfg.Host,
				AccountID:    k.account,
				DatabaseUUID: k.database,
				Shape:        acc.shape,
				ShapeHash:    k.shapeHash,
				WindowStart:  startMs,
				WindowEnd:    endMs,
				Queries:      acc.queries,
				Errors:       acc.errors,
				RowsRead:     acc.rowsRead,
				RowsWritten:  acc.rowsWritten,
				DurationUs:   acc.durNs / 1000,
				MaxDuration:  acc.maxNs / 1000,
			}
			a.publish(event.TopicUsage, k.account, u)
		}
		clear(m)
		s := &a.shard[i]
		s.mu.Lock()
		s.spare = m
		s.mu.Unlock()
	}
	a.windows.Add(1)
	a.lastFlush.Store(endMs)
}

func (a *UsageAggregator) publish(topic, key string, v any) {
	b, err := event.Encode(v)
	if err == nil {
		err = a.pub.Publish(topic, []byte(key), b)
	}
	if err != nil {
		a.dropped.Add(1)
		return
	}
	a.events.Add(1)
}

// Close stops the window loop and publishes the last window. Records after
// Close are discarded.
func (a *UsageAggregator) Close() {
	a.once.Do(func() {
		a.closed.Store(true)
		close(a.stop)
		<-a.done
		a.Flush()
		unregisterAll(a.cfg.Registerer, a.cols)
	})
}

// aggregatorCollectors builds the metrics shared by both aggregators.
func aggregatorCollectors(kind string, windows, events, dropped, late *atomic.Uint64, lastFlush *atomic.Int64) []prometheus.Collector {
	counter := func(name, help string, v *atomic.Uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "shoal_pipeline_" + kind + "_" + name, Help: help},
			func() float64 { return float64(v.Load()) })
	}
	return []prometheus.Collector{
		counter("windows_total", "Pre-aggregation windows closed.", windows),
		counter("events_total", "Events published.", events),
		counter("dropped_total", "Events the producer refused (counted there by reason too).", dropped),
		counter("late_records_total", "Records after Close, discarded.", late),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "shoal_pipeline_" + kind + "_last_window_end_timestamp_seconds",
			Help: "End of the last closed window, Unix seconds (aggregate freshness)."},
			func() float64 { return float64(lastFlush.Load()) / 1000 }),
	}
}

func registerAll(r prometheus.Registerer, cs []prometheus.Collector, log *slog.Logger) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			log.Warn("pipeline: metric not registered", "err", err)
		}
	}
}

func unregisterAll(r prometheus.Registerer, cs []prometheus.Collector) {
	if r == nil {
		return
	}
	for _, c := range cs {
		r.Unregister(c)
	}
}
