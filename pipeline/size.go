package pipeline

import (
	"hash/maphash"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shoaldb/shoal/pipeline/event"
)

// SizeConfig configures a SizeAggregator. Zero values take the documented
// defaults.
type SizeConfig struct {
	Host   string        // host ID stamped on every event
	Window time.Duration // default 1 s
	// ResendInterval re-publishes every known database's latest size this
	// often even if unchanged (default 10 minutes; negative: never), the
	// backstop for an event dropped by a full spill. Consumers ignore a
	// repeated Seq, so a resend changes nothing downstream but repairs.
	ResendInterval time.Duration
	Clock          Clock // default SystemClock
	Shards         int   // default 64, rounded up to a power of two
	// Registerer receives shoal_pipeline_size_* metrics (optional).
	Registerer prometheus.Registerer
	Logger     *slog.Logger
}

// SizeAggregator keeps the latest size of each database on one host —
// the measurement with the highest seq wins, so sizes recorded out of order
// by concurrent queries cannot go backwards — and every window publishes
// one event.Size for each database whose size changed since it was last
// published (topic storage, key database).
//
// Concurrency contract: as UsageAggregator's: Record is cheap (one shard
// lock) and safe for concurrent use; flushes are serialised.
type SizeAggregator struct {
	pub   Publisher
	ids   *Sequencer
	cfg   SizeConfig
	seed  maphash.Seed
	mask  uint64
	shard []sizeShard

	flushMu    sync.Mutex
	lastResend time.Time
	// resendNow: the next window resends every database (ResendAll).
	resendNow atomic.Bool

	closed atomic.Bool
	stop   chan struct{}
	done   chan struct{}
	once   sync.Once

	windows, events, dropped, late, stale atomic.Uint64
	lastFlush                             atomic.Int64
	cols                                  []prometheus.Collector
}

type sizeEntry struct {
	account  string
	size     int64
	seq      int64
	timeMs   int64
	sentSize int64
	sent     bool // sentSize is what consumers were last sent
	dirty    bool // in the shard's dirty list
	forget   bool // delete after the next emission
}

type sizeShard struct {
	mu     sync.Mutex
	closed bool
	m      map[string]*sizeEntry
	dirty  []string
	_      [24]byte
}

// NewSizeAggregator starts an aggregator publishing to pub with IDs from
// ids. Close it to stop the window loop (after a final flush).
func NewSizeAggregator(pub Publisher, ids *Sequencer, cfg SizeConfig) *SizeAggregator {
	if cfg.Window <= 0 {
		cfg.Window = time.Second
	}
	if cfg.ResendInterval == 0 {
		cfg.ResendInterval = 10 * time.Minute
	}
	if cfg.Clock == nil {
		cfg.Clock = SystemClock{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	n := shardCount(cfg.Shards)
	a := &SizeAggregator{
		pub: pub, ids: ids, cfg: cfg,
		seed:  maphash.MakeSeed(),
		mask:  uint64(n - 1),
		shard: make([]sizeShard, n),
		stop:  make(chan struct{}),
		done:  make(chan struct{}),
	}
	for i := range a.shard {
		a.shard[i].m = make(map[string]*sizeEntry)
	}
	a.lastResend = cfg.Clock.Now()
	a.lastFlush.Store(a.lastResend.UnixMilli())
	if cfg.Registerer != nil {
		a.cols = aggregatorCollectors("size", &a.windows, &a.events, &a.dropped, &a.late, &a.lastFlush)
		a.cols = append(a.cols, prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "shoal_pipeline_size_stale_records_total",
			Help: "Size measurements ignored because a higher seq was already recorded."},
			func() float64 { return float64(a.stale.Load()) }))
		registerAll(cfg.Registerer, a.cols, cfg.Logger)
	}
	t := cfg.Clock.NewTicker(cfg.Window)
	go a.run(t)
	return a
}

// Record notes database's size as measured with sequence seq (increasing
// per database on this host). A seq not above the last recorded one is
// ignored.
func (a *SizeAggregator) Record(account, database string, size, seq int64) {
	s := &a.shard[maphash.String(a.seed, database)&a.mask]
	now := a.cfg.Clock.Now().UnixMilli()
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		a.late.Add(1)
		return
	}
	e := s.m[database]
	if e == nil {
		e = &sizeEntry{seq: math.MinInt64}
		s.m[database] = e
	}
	if seq <= e.seq {
		s.mu.Unlock()
		a.stale.Add(1)
		return
	}
	e.account, e.size, e.seq, e.timeMs = account, size, seq, now
	e.forget = false
	if !e.dirty {
		e.dirty = true
		s.dirty = append(s.dirty, database)
	}
	s.mu.Unlock()
}

// ResendAll makes the next window publish every database's latest size,
// as the periodic resend (ResendInterval) does, whether it changed or
// not: for a host that learns the catalog's sizes went back to a backup's
// (objecthost's noteCatalogRestores), since a size equal to the last one
// sent is otherwise not sent again.
func (a *SizeAggregator) ResendAll() { a.resendNow.Store(true) }

// Forget drops database from the aggregator (after it was deleted and its
// final size recorded, or moved away): a pending change is still
// published first.
func (a *SizeAggregator) Forget(database string) {
	s := &a.shard[maphash.String(a.seed, database)&a.mask]
	s.mu.Lock()
	if e := s.m[database]; e != nil {
		if e.dirty {
			e.forget = true
		} else {
			delete(s.m, database)
		}
	}
	s.mu.Unlock()
}

func (a *SizeAggregator) run(t Ticker) {
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

type sizeOut struct {
	database string
	e        sizeEntry // copy
	ptr      *sizeEntry
}

// Flush publishes now what the window loop would publish at its next
// tick: every database whose latest size differs from the last one
// published (and, once per ResendInterval, every database).
func (a *SizeAggregator) Flush() {
	a.flushMu.Lock()
	defer a.flushMu.Unlock()
	now := a.cfg.Clock.Now()
	resend := a.resendNow.Swap(false) || a.cfg.ResendInterval > 0 && now.Sub(a.lastResend) >= a.cfg.ResendInterval
	if resend {
		a.lastResend = now
	}
	final := a.closed.Load()
	var out []sizeOut
	for i := range a.shard {
		s := &a.shard[i]
		s.mu.Lock()
		if resend {
			for db, e := range s.m {
				out = append(out, sizeOut{db, *e, e})
				e.sent, e.sentSize, e.dirty = true, e.size, false
				if e.forget {
					delete(s.m, db)
				}
			}
		} else {
			for _, db := range s.dirty {
				e := s.m[db]
				if e == nil {
					continue
				}
				e.dirty = false
				if !e.sent || e.sentSize != e.size {
					out = append(out, sizeOut{db, *e, e})
					e.sent, e.sentSize = true, e.size
				}
				if e.forget {
					delete(s.m, db)
				}
			}
		}
		clear(s.dirty)
		s.dirty = s.dirty[:0]
		s.closed = s.closed || final
		s.mu.Unlock()
	}
	for _, o := range out {
		ev := event.Size{
			V:            event.Version,
			EventID:      a.ids.Next(),
			Host:         a.cfg.Host,
			AccountID:    o.e.account,
			DatabaseUUID: o.database,
			SizeBytes:    o.e.size,
			Seq:          o.e.seq,
			Time:         o.e.timeMs,
		}
		b, err := event.Encode(ev)
		if err == nil {
			err = a.pub.Publish(event.TopicStorage, []byte(o.database), b)
		}
		if err != nil {
			a.dropped.Add(1)
			a.retry(o)
			continue
		}
		a.events.Add(1)
	}
	a.windows.Add(1)
	a.lastFlush.Store(now.UnixMilli())
}

// retry marks a database whose event was refused as unsent, so the next
// window publishes it again (if nothing newer replaced it meanwhile, the
// same size and seq; otherwise the newer one).
func (a *SizeAggregator) retry(o sizeOut) {
	s := &a.shard[maphash.String(a.seed, o.database)&a.mask]
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.m[o.database]
	if e != o.ptr || s.closed {
		return // forgotten, or closing: nothing more will be published
	}
	e.sent = false
	if !e.dirty {
		e.dirty = true
		s.dirty = append(s.dirty, o.database)
	}
}

// Close stops the window loop and publishes the last changes. Records
// after Close are discarded.
func (a *SizeAggregator) Close() {
	a.once.Do(func() {
		a.closed.Store(true)
		close(a.stop)
		<-a.done
		a.Flush()
		unregisterAll(a.cfg.Registerer, a.cols)
	})
}
