package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/shoaldb/shoal/pipeline/event"
)

// Errors Publish returns. A record is dropped only when one of these is
// returned (or, for records already accepted, when Close can neither
// deliver nor spill them); every drop is counted by reason.
var (
	// ErrClosed: Publish after Close.
	ErrClosed = errors.New("pipeline: producer closed")
	// ErrSpillFull: the broker is not taking records and the spill is at
	// its bound (or its write queue is: the disk is not keeping up); the
	// record was dropped.
	ErrSpillFull = errors.New("pipeline: spill full, record dropped")
	// ErrRecordTooLarge: the record is over Config.MaxRecordBytes.
	ErrRecordTooLarge = errors.New("pipeline: record too large")
)

// Config configures a Producer. Zero values take the documented defaults.
type Config struct {
	// Brokers are the seed brokers (host:port), required.
	Brokers []string
	// ClientOptions are appended to the producer's own kgo options (SASL,
	// TLS, a dialer). Options that change delivery semantics (disabling
	// idempotence, record retries, delivery timeouts) break the
	// guarantees documented on Producer.
	ClientOptions []kgo.Opt

	// SpillDir is the directory of the spill (required). One Producer at
	// a time may use it (it is locked); BootEpoch may keep its epoch file
	// there too.
	SpillDir string
	// MaxSpillBytes bounds the unreplayed bytes in the spill (default
	// 1 GiB). At the bound new records are dropped and counted. Disk use
	// can exceed it by the consumed part of one segment.
	MaxSpillBytes int64
	// SpillSegmentBytes is the size at which a spill segment is rolled
	// (default 64 MiB).
	SpillSegmentBytes int64
	// SpillQueueBytes bounds the memory of records waiting for the spill
	// writer (default 8 MiB); a disk too slow to keep up drops records
	// rather than blocking Publish.
	SpillQueueBytes int64
	// SpillSyncInterval is how often the spill is fsynced (default 1 s):
	// on power loss up to this much of the spill is lost; a process crash
	// loses nothing written. SpillSyncEveryWrite fsyncs each write batch
	// instead.
	SpillSyncInterval   time.Duration
	SpillSyncEveryWrite bool

	// MaxBufferedBytes and MaxBufferedRecords bound the records handed to
	// the Kafka client and not yet acknowledged (defaults 32 MiB and
	// 100,000). A record that would exceed them goes to the spill.
	MaxBufferedBytes   int64
	MaxBufferedRecords int
	// ReplayBufferBytes bounds the spilled records in flight to the broker
	// during replay (default 8 MiB).
	ReplayBufferBytes int64
	// StallTimeout: when records are outstanding and the broker has
	// acknowledged none for this long, new records go to the spill
	// (default 5 s), so a hung broker costs disk, not memory.
	StallTimeout time.Duration
	// Linger is how long a partition waits to fill a batch (default 10 ms).
	Linger time.Duration
	// MaxRecordBytes refuses larger records (key + value; default 1 MiB,
	// Kafka's default max.message.bytes).
	MaxRecordBytes int

	// Registerer receives the producer's metrics (shoal_pipeline_producer_*);
	// they are unregistered by Close. Nil: the producer owns a registry,
	// see Producer.Registry.
	Registerer prometheus.Registerer
	// Logger receives state changes (spilling, replay failures) and the
	// Kafka client's warnings. Default: discarded.
	Logger *slog.Logger
	// Now is the clock for record timestamps and stall detection (default
	// time.Now).
	Now func() time.Time
}

func (c *Config) setDefaults() {
	def64 := func(v *int64, d int64) {
		if *v <= 0 {
			*v = d
		}
	}
	def64(&c.MaxSpillBytes, 1<<30)
	def64(&c.SpillSegmentBytes, 64<<20)
	def64(&c.SpillQueueBytes, 8<<20)
	def64(&c.MaxBufferedBytes, 32<<20)
	def64(&c.ReplayBufferBytes, 8<<20)
	if c.SpillSyncInterval <= 0 {
		c.SpillSyncInterval = time.Second
	}
	if c.MaxBufferedRecords <= 0 {
		c.MaxBufferedRecords = 100_000
	}
	if c.StallTimeout <= 0 {
		c.StallTimeout = 5 * time.Second
	}
	if c.Linger <= 0 {
		c.Linger = 10 * time.Millisecond
	}
	if c.MaxRecordBytes <= 0 {
		c.MaxRecordBytes = 1 << 20
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}

// Producer publishes records to Kafka without ever blocking its caller.
//
// Delivery contract:
//   - Publish returns at once. The record is handed to an idempotent kgo
//     producer (batched, lingering), or — while the broker is down, slow
//     (nothing acknowledged for StallTimeout) or behind (over
//     MaxBufferedBytes/Records), or while older records wait in the spill —
//     appended to the spill on local disk. It is dropped, and counted, only
//     when the spill is full.
//   - At least once: a spilled record is replayed until the broker
//     acknowledges it, across broker outages and producer restarts (a new
//     Producer on the same SpillDir replays what the last one left).
//     Replays can duplicate a record; consumers drop duplicates by the
//     event ID inside the value.
//   - Order: records published from one goroutine reach each partition in
//     Publish order, spilled or not: while the spill holds anything, every
//     new record goes behind it, direct publishing resumes only when the
//     spill is replayed and acknowledged, and records the client fails
//     (at Close, or when it gives up on a topic that does not exist) go to
//     the head of the spill. (Records of one key share a partition.) The
//     one gap: records handed to the client in the moment between it
//     failing a partition's records and the producer learning of it can be
//     delivered ahead of them.
//   - Memory is bounded: MaxBufferedBytes + ReplayBufferBytes +
//     SpillQueueBytes of records.
//
// The producer does not stamp event IDs: the value is the caller's, and so
// is its event.ID. Producer IDs must be unique and stable per process
// lifetime (see BootEpoch and Sequencer) so that (producer, seq) never
// repeats.
//
// Publish, PublishUsage and PublishSize are safe for concurrent use. Close
// must be called once, after the last Publish.
type Producer struct {
	cfg   Config
	cl    *kgo.Client
	spill *spill
	log   *slog.Logger
	c     counters
	reg   *prometheus.Registry // owned registry, or nil
	regr  prometheus.Registerer
	cols  []prometheus.Collector

	// mu orders publishing: the mode decision and the hand-off (to the
	// client or the spill) happen under it, so records reach both in
	// Publish order.
	mu       sync.Mutex
	closed   bool
	spilling atomic.Bool // written under mu

	directBytes  atomic.Int64
	directRecs   atomic.Int64
	pendingSince atomic.Int64 // Unix ns when directRecs last left 0
	lastAck      atomic.Int64 // Unix ns of the last acknowledgement

	// Direct records the client failed, collected in failure order to
	// become the spill's head (see directDone).
	closing  atomic.Bool
	headMu   sync.Mutex
	head     []byte
	headLen  atomic.Int64
	settled  chan struct{} // kicked by promises while closing
	replayed chan struct{} // closed when the replay goroutine exits

	// replay (ring is guarded by rmu; the rest are atomics)
	rmu          sync.Mutex
	ring         []*replayEntry
	replayBytes  atomic.Int64
	replayRecs   atomic.Int64
	replayFailed atomic.Bool
	wakeReplay   chan struct{}
	stopReplay   chan struct{}
}

type replayEntry struct {
	pos  spillPos
	done bool
}

var _ Publisher = (*Producer)(nil)

// New starts a Producer: it opens and locks the spill directory and, if a
// previous Producer left records there, starts replaying them (new
// records queue behind them). It does not wait for the broker.
func New(cfg Config) (*Producer, error) {
	if len(cfg.Brokers) == 0 {
		return nil, errors.New("pipeline: producer needs at least one broker")
	}
	if cfg.SpillDir == "" {
		return nil, errors.New("pipeline: producer needs a spill directory")
	}
	cfg.setDefaults()
	p := &Producer{
		cfg:        cfg,
		log:        cfg.Logger,
		settled:    make(chan struct{}, 1),
		replayed:   make(chan struct{}),
		wakeReplay: make(chan struct{}, 1),
		stopReplay: make(chan struct{}),
	}
	syncEvery := cfg.SpillSyncInterval
	if cfg.SpillSyncEveryWrite {
		syncEvery = 0
	}
	sp, err := openSpill(cfg.SpillDir, spillConfig{
		maxBytes: cfg.MaxSpillBytes, segBytes: cfg.SpillSegmentBytes,
		queueMax: cfg.SpillQueueBytes, syncEvery: syncEvery,
	}, &p.c, p.kickReplay)
	if err != nil {
		return nil, err
	}
	p.spill = sp
	opts := []kgo.Opt{
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.ProducerLinger(cfg.Linger),
		// The client's own bounds sit above ours, so TryProduce never
		// refuses: our accounting decides what goes to the spill.
		kgo.MaxBufferedBytes(int(cfg.MaxBufferedBytes + 2*cfg.ReplayBufferBytes + int64(cfg.MaxRecordBytes))),
		kgo.MaxBufferedRecords(cfg.MaxBufferedRecords + int(cfg.ReplayBufferBytes/16) + 1024),
		// Unlimited retries and no delivery timeout (kgo's defaults,
		// stated): a record leaves the client only acknowledged, or
		// failed by Close, so per-partition order survives outages.
		kgo.RecordRetries(0x7fffffff),
		// An EOF on a connection's first read (a broker killed
		// mid-request) is otherwise taken for a SASL/TLS mistake and
		// fails every buffered record of the partition at once.
		kgo.AlwaysRetryEOF(),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.WithLogger(kgoLogger{cfg.Logger}),
	}
	opts = append(opts, cfg.ClientOptions...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		sp.close(nil)
		return nil, fmt.Errorf("pipeline: kafka client: %w", err)
	}
	p.cl = cl
	if sp.backlog() > 0 {
		p.spilling.Store(true)
		p.log.Info("pipeline producer: replaying spill left by a previous run", "bytes", sp.backlog())
	}
	p.cols = p.collectors()
	p.regr = cfg.Registerer
	if p.regr == nil {
		p.reg = prometheus.NewRegistry()
		p.regr = p.reg
	}
	for _, c := range p.cols {
		if err := p.regr.Register(c); err != nil {
			p.unregister()
			cl.Close()
			sp.close(nil)
			return nil, fmt.Errorf("pipeline: register metrics: %w", err)
		}
	}
	go p.replayLoop()
	return p, nil
}

// Registry is the producer's own metrics registry when Config.Registerer
// was nil (nil otherwise).
func (p *Producer) Registry() *prometheus.Registry { return p.reg }

// Client is the producer's Kafka client, for admin calls such as
// EnsureTopics. Do not produce through it.
func (p *Producer) Client() *kgo.Client { return p.cl }

// PublishUsage publishes u to event.TopicUsage, keyed by account.
func (p *Producer) PublishUsage(u event.Usage) error {
	b, err := event.Encode(u)
	if err != nil {
		return err
	}
	return p.Publish(event.TopicUsage, []byte(u.AccountID), b)
}

// PublishSize publishes s to event.TopicStorage, keyed by database.
func (p *Producer) PublishSize(s event.Size) error {
	b, err := event.Encode(s)
	if err != nil {
		return err
	}
	return p.Publish(event.TopicStorage, []byte(s.DatabaseUUID), b)
}

// Publish hands one record to the producer and returns at once. A nil
// error means the record was accepted (sent, buffered or spilled); it is
// then delivered at least once. ErrSpillFull, ErrRecordTooLarge and
// ErrClosed mean it was dropped (and counted). The producer keeps key and
// value: the caller must not modify them afterwards.
func (p *Producer) Publish(topic string, key, value []byte) error {
	p.c.enqueued.Add(1)
	size := int64(len(key) + len(value))
	if size > int64(p.cfg.MaxRecordBytes) || len(topic) > 0xFFFF {
		p.c.dropped(dropTooLarge, 1)
		return ErrRecordTooLarge
	}
	now := p.cfg.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		p.c.dropped(dropClosed, 1)
		return ErrClosed
	}
	if !p.spilling.Load() {
		reason := p.spillReason(size, now)
		if reason == "" {
			p.directBytes.Add(size)
			if p.directRecs.Add(1) == 1 {
				p.pendingSince.Store(now.UnixNano())
			}
			p.cl.TryProduce(context.Background(), &kgo.Record{Topic: topic, Key: key, Value: value, Timestamp: now}, p.directDone)
			return nil
		}
		p.startSpilling(reason)
	}
	return p.spillLocked(topic, key, value, now.UnixMilli())
}

// spillReason says why a record of size cannot go to the client now ("" if
// it can).
func (p *Producer) spillReason(size int64, now time.Time) string {
	recs := p.directRecs.Load()
	if recs > 0 {
		if p.directBytes.Load()+size > p.cfg.MaxBufferedBytes || recs >= int64(p.cfg.MaxBufferedRecords) {
			return "buffer full"
		}
		last := max(p.lastAck.Load(), p.pendingSince.Load())
		if now.UnixNano()-last > int64(p.cfg.StallTimeout) {
			return "broker stalled"
		}
	}
	return ""
}

// startSpilling switches new records to the spill; p.mu is held.
func (p *Producer) startSpilling(reason string) {
	p.spilling.Store(true)
	p.log.Warn("pipeline producer: spilling to disk", "reason", reason,
		"buffered_bytes", p.directBytes.Load(), "buffered_records", p.directRecs.Load())
	p.kickReplay()
}

// spillLocked appends a record to the spill; p.mu is held.
func (p *Producer) spillLocked(topic string, key, value []byte, tsMs int64) error {
	if err := p.spill.append(topic, key, value, tsMs); err != nil {
		if errors.Is(err, errSpillQueueFull) {
			p.c.dropped(dropSpillSlow, 1)
		} else {
			p.c.dropped(dropSpillFull, 1)
		}
		return ErrSpillFull
	}
	return nil
}

// directDone is the promise of records handed to the client by Publish. It
// runs on the client's promise goroutine and must not block.
func (p *Producer) directDone(r *kgo.Record, err error) {
	if err == nil {
		p.c.produced.Add(1)
		p.lastAck.Store(p.cfg.Now().UnixNano())
	} else {
		p.c.produceErrors.Add(1)
		switch {
		case recordRejected(err):
			p.c.dropped(dropRejected, 1)
			p.log.Warn("pipeline producer: broker rejected record", "topic", r.Topic, "err", err)
		default:
			// A direct record is older than everything in the spill
			// (direct publishing resumes only with an empty spill), so
			// it goes to the spill's head: collected here in failure
			// order (the client fails a partition's records in order),
			// written as the first segment once every direct record
			// has settled (by the replay goroutine, or by Close).
			if !p.closing.Load() && !p.spilling.Load() {
				p.mu.Lock()
				if !p.spilling.Load() && !p.closed {
					p.startSpilling("produce error: " + err.Error())
				}
				p.mu.Unlock()
			}
			p.headMu.Lock()
			p.head = appendFrame(p.head, r.Topic, r.Key, r.Value, r.Timestamp.UnixMilli())
			p.headLen.Store(int64(len(p.head)))
			p.headMu.Unlock()
		}
	}
	p.directBytes.Add(-int64(len(r.Key) + len(r.Value)))
	if p.directRecs.Add(-1) == 0 {
		p.kickReplay()
	}
	if p.closing.Load() {
		kick(p.settled)
	}
}

// takeHead returns and clears the collected head.
func (p *Producer) takeHead() []byte {
	p.headMu.Lock()
	defer p.headMu.Unlock()
	h := p.head
	p.head = nil
	p.headLen.Store(0)
	return h
}

// recordRejected reports errors about the record itself: retrying cannot
// help, so the record is dropped. Everything else (the broker down, a
// missing topic, the client closing) keeps the record.
func recordRejected(err error) bool {
	for _, e := range []error{kerr.MessageTooLarge, kerr.RecordListTooLarge, kerr.InvalidRecord,
		kerr.CorruptMessage, kerr.InvalidTimestamp, kerr.InvalidRequiredAcks} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

func kick(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

func (p *Producer) kickReplay() { kick(p.wakeReplay) }

// replayLoop moves spilled records to the client in spill order, at most
// ReplayBufferBytes in flight, and switches publishing back to direct once
// the spill is replayed and acknowledged. A failed replay rewinds to the
// first unacknowledged record after everything in flight has settled.
func (p *Producer) replayLoop() {
	defer close(p.replayed)
	poll := time.NewTicker(250 * time.Millisecond) // belt and braces for a missed kick
	defer poll.Stop()
	wait := func(d time.Duration) bool {
		var t <-chan time.Time
		if d > 0 {
			tm := time.NewTimer(d)
			defer tm.Stop()
			t = tm.C
		}
		select {
		case <-p.stopReplay:
			return false
		case <-p.wakeReplay:
		case <-poll.C:
		case <-t:
		}
		return true
	}
	backoff := time.Duration(0)
	var replayedAtRewind uint64
	for {
		select {
		case <-p.stopReplay:
			return
		default:
		}
		failed, headed := p.replayFailed.Load(), p.headLen.Load() > 0
		if failed || headed {
			// Restart replay from the first unacknowledged record, once
			// everything in flight has settled — with a head, once every
			// direct record has too, so the head is complete.
			if p.replayRecs.Load() > 0 || (headed && p.directRecs.Load() > 0) {
				if !wait(0) {
					return
				}
				continue
			}
			p.rmu.Lock()
			p.ring = nil
			p.rmu.Unlock()
			if head := p.takeHead(); len(head) > 0 {
				if err := p.spill.prepend(head); err != nil {
					p.c.dropped(dropSpillError, countFrames(head))
					p.log.Error("pipeline producer: could not spill failed records", "err", err)
				} else {
					p.c.spilled(countFrames(head), int64(len(head)))
				}
			}
			p.spill.rewind()
			p.replayFailed.Store(false)
			if !failed {
				continue
			}
			if n := p.c.replayed.Load(); n != replayedAtRewind {
				backoff, replayedAtRewind = 0, n
			}
			backoff = min(max(2*backoff, 100*time.Millisecond), 5*time.Second)
			p.log.Warn("pipeline producer: replay failed; retrying", "backoff", backoff)
			// Sleep the whole backoff (kicks do not shorten it).
			deadline := time.Now().Add(backoff)
			for d := time.Until(deadline); d > 0; d = time.Until(deadline) {
				if !wait(d) {
					return
				}
			}
			continue
		}
		if p.replayBytes.Load() >= p.cfg.ReplayBufferBytes {
			if !wait(0) {
				return
			}
			continue
		}
		rec, pos, st := p.spill.next()
		switch st {
		case readNone:
			if p.replayRecs.Load() == 0 {
				p.tryResumeDirect()
			}
			if !wait(0) {
				return
			}
			continue
		case readSkip:
			p.rmu.Lock()
			p.ring = append(p.ring, &replayEntry{pos: pos, done: true})
			p.advanceLocked()
			p.rmu.Unlock()
			continue
		}
		e := &replayEntry{pos: pos}
		p.rmu.Lock()
		p.ring = append(p.ring, e)
		p.rmu.Unlock()
		size := int64(len(rec.key) + len(rec.value))
		p.replayBytes.Add(size)
		p.replayRecs.Add(1)
		p.cl.TryProduce(context.Background(), &kgo.Record{
			Topic: rec.topic, Key: rec.key, Value: rec.value, Timestamp: time.UnixMilli(rec.ts),
		}, func(r *kgo.Record, err error) { p.replayDone(e, size, r, err) })
	}
}

// replayDone is the promise of replayed records (client promise goroutine).
func (p *Producer) replayDone(e *replayEntry, size int64, r *kgo.Record, err error) {
	ok := err == nil
	switch {
	case ok:
		p.c.produced.Add(1)
		p.c.replayed.Add(1)
		p.lastAck.Store(p.cfg.Now().UnixNano())
	case recordRejected(err):
		p.c.produceErrors.Add(1)
		p.c.dropped(dropRejected, 1)
		p.log.Warn("pipeline producer: broker rejected replayed record", "topic", r.Topic, "err", err)
		ok = true // consumed: retrying cannot help
	default:
		p.c.produceErrors.Add(1)
		p.replayFailed.Store(true)
	}
	if ok {
		p.rmu.Lock()
		e.done = true
		p.advanceLocked()
		p.rmu.Unlock()
	}
	p.replayBytes.Add(-size)
	p.replayRecs.Add(-1)
	p.kickReplay()
	if p.closing.Load() {
		kick(p.settled)
	}
}

// advanceLocked commits the acknowledged prefix of the ring; rmu is held.
// The prefix can span segments: each segment's last entry is committed.
func (p *Producer) advanceLocked() {
	i := 0
	for i < len(p.ring) && p.ring[i].done {
		if i+1 == len(p.ring) || !p.ring[i+1].done || p.ring[i+1].pos.seg != p.ring[i].pos.seg {
			p.spill.commit(p.ring[i].pos)
		}
		i++
	}
	if i == 0 {
		return
	}
	clear(p.ring[:i])
	p.ring = p.ring[i:]
}

// tryResumeDirect switches publishing back to the client when everything
// ever spilled has been replayed and acknowledged. Called by the replay
// goroutine with nothing of its own in flight.
func (p *Producer) tryResumeDirect() {
	if !p.spilling.Load() {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.replayRecs.Load() != 0 || p.headLen.Load() != 0 || !p.spill.drained() {
		return
	}
	p.spilling.Store(false)
	p.log.Info("pipeline producer: spill replayed; publishing directly again",
		"replayed_total", p.c.replayed.Load())
}

// Flush waits until every record published so far has been acknowledged —
// the spill replayed included — or ctx is done. It does not stop new
// publishing; it is for tests, dev tooling and orderly shutdowns that want
// an empty spill.
func (p *Producer) Flush(ctx context.Context) error {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		if !p.spilling.Load() && p.directRecs.Load() == 0 && p.replayRecs.Load() == 0 &&
			p.headLen.Load() == 0 && p.spill.drained() {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// Close stops the producer. It flushes what the client holds until ctx is
// done, then closes the client; records it could not deliver are written
// to the spill in order (ahead of what was already spilled: they are
// older), along with the spill's write queue. Replay stops at once; what
// remains in the spill is replayed by the next Producer on SpillDir. Close
// returns when the producer's goroutines have exited; an error means
// records were lost (and counted) or the spill could not be saved.
func (p *Producer) Close(ctx context.Context) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.mu.Unlock()

	close(p.stopReplay)
	<-p.replayed
	flushErr := p.cl.Flush(ctx)
	p.closing.Store(true)
	p.cl.Close() // fails whatever is still buffered, via the promises
	// The client calls the last promises on its own goroutine after Close
	// returns; wait for them (bounded: a promise that never comes is a
	// lost record, counted below).
	deadline := time.NewTimer(5 * time.Second)
	defer deadline.Stop()
	poll := time.NewTicker(10 * time.Millisecond)
	defer poll.Stop()
settle:
	for p.directRecs.Load() > 0 || p.replayRecs.Load() > 0 {
		select {
		case <-p.settled:
		case <-poll.C:
		case <-deadline.C:
			lost := p.directRecs.Load()
			p.c.dropped(dropShutdown, int(lost))
			p.log.Error("pipeline producer: records neither delivered nor spilled at close", "records", lost)
			break settle
		}
	}
	head := p.takeHead()
	var errs []error
	if err := p.spill.close(head); err != nil {
		errs = append(errs, fmt.Errorf("pipeline: close spill: %w", err))
	}
	if flushErr != nil {
		p.log.Info("pipeline producer: closed before the broker acknowledged everything; the rest is in the spill",
			"spilled_at_close", countFrames(head), "spill_bytes", p.spill.backlog(), "err", flushErr)
	}
	p.unregister()
	return errors.Join(errs...)
}

func (p *Producer) unregister() {
	for _, c := range p.cols {
		p.regr.Unregister(c)
	}
}

// kgoLogger forwards the Kafka client's warnings and errors to slog.
type kgoLogger struct{ l *slog.Logger }

func (k kgoLogger) Level() kgo.LogLevel { return kgo.LogLevelWarn }

func (k kgoLogger) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	switch level {
	case kgo.LogLevelError:
		k.l.Error("kgo: "+msg, keyvals...)
	case kgo.LogLevelWarn:
		k.l.Warn("kgo: "+msg, keyvals...)
	}
}
