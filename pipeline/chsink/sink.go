package chsink

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/shoaldb/shoal/pipeline/event"
)

// DefaultGroup is the consumer group of the ClickHouse sink.
const DefaultGroup = "shoal-chsink"

// Config configures a Sink. Zero values take the documented defaults.
type Config struct {
	// Brokers are the seed brokers (host:port), required.
	Brokers []string
	// ClientOptions are appended to the sink's own kgo options (SASL, TLS,
	// a dialer, session timeouts). Options that re-enable autocommit or
	// drop BlockRebalanceOnPoll break the guarantees documented on Sink.
	ClientOptions []kgo.Opt
	// Group is the consumer group (default DefaultGroup). Every sink of
	// one ClickHouse database shares it; a second group would insert every
	// event again (still counted once, at twice the cost).
	Group string
	// Topic is the usage topic (default event.TopicUsage).
	Topic string
	// Store is where batches go (required). The Sink does not close it.
	Store *Store

	// MaxBatch is the most events in one insert (default 100,000).
	MaxBatch int
	// FlushInterval is the longest the first event of a batch waits for
	// the batch to fill (default 1 s).
	FlushInterval time.Duration
	// InsertTimeout bounds one insert attempt (default 30 s).
	InsertTimeout time.Duration
	// RetryMin and RetryMax bound the backoff between failed attempts
	// (defaults 100 ms and 5 s).
	RetryMin, RetryMax time.Duration
	// ShutdownTimeout is how long Close keeps trying to insert and commit
	// the batch in hand (default 10 s); what it cannot, the group
	// redelivers.
	ShutdownTimeout time.Duration
	// DedupeWindow is how many of each producer's most recent sequences
	// the sink remembers having inserted, to drop repeats before inserting
	// them (default 262,144, rounded up to a power of two: 32 KiB per
	// producer, at most 256 producers, and as much again for the batch in
	// hand; negative disables). Correctness does not depend on it.
	DedupeWindow int

	// Registerer receives shoal_pipeline_chsink_* metrics (optional).
	Registerer prometheus.Registerer
	Logger     *slog.Logger
	// Now is the time source of the age gauges (default time.Now).
	Now func() time.Time
	// Stalled, when set, is asked before every poll: while it returns
	// true the sink polls, inserts and commits nothing, holding the batch
	// in hand (it stays in the
	// group) — a sink that hangs while the brokers are up. Fault tests
	// only (SHOAL_FAILPOINTS consumers:stall); nil in production.
	Stalled func() bool

	// afterInsert, when set (tests only), runs after a batch's insert
	// and before its commit; returning true makes the loop stop there as
	// if the process had died.
	afterInsert func(events int) bool
}

// Sink consumes the usage topic in a consumer group and writes every
// event into ClickHouse through a Store.
//
// Contract: an offset is committed only after every event before it in
// its partition was inserted (acknowledged by ClickHouse) or deliberately
// skipped; autocommit is off and rebalances are held off from a poll to
// its commit (BlockRebalanceOnPoll), so a batch is never committed by a
// member that did not insert it. A failed insert is retried with backoff,
// forever, without committing and without consuming further; a sink that
// dies between insert and commit leaves its batch to be redelivered and
// inserted again, which the tables' keys make harmless. Totals read
// through the Store are therefore exact under any mix of crashes,
// retries and redeliveries. Records that can never be inserted
// (undecodable, newer schema) are counted and committed past.
//
// One goroutine runs the loop; Close stops it and returns when it and the
// Kafka client are gone.
type Sink struct {
	cfg   Config
	cl    *kgo.Client
	store *Store
	c     counters
	dedup *recentIDs
	cols  []prometheus.Collector

	// runCtx ends at Close: stop polling. flushCtx ends ShutdownTimeout
	// later: stop retrying the batch in hand.
	runCtx, flushCtx       context.Context
	cancelRun, cancelFlush context.CancelFunc
	done                   chan struct{}
	closeOnce              sync.Once

	lagMu sync.Mutex
	parts map[partKey]*partState
}

type partKey struct {
	topic     string
	partition int32
}

// partState is what the lag gauge is computed from.
type partState struct {
	hwm       int64 // high watermark of the last fetch
	committed int64 // next offset after the last committed record (or the first one seen)
}

// Start validates cfg, creates the Kafka client and starts the loop. It
// does not wait for Kafka or ClickHouse: the loop creates the schema
// (retrying while ClickHouse is down) before it consumes.
func Start(cfg Config) (*Sink, error) {
	if len(cfg.Brokers) == 0 {
		return nil, errors.New("chsink: Config.Brokers is required")
	}
	if cfg.Store == nil {
		return nil, errors.New("chsink: Config.Store is required")
	}
	cfg.setDefaults()
	s := &Sink{
		cfg:   cfg,
		store: cfg.Store,
		dedup: newRecentIDs(cfg.DedupeWindow),
		done:  make(chan struct{}),
		parts: make(map[partKey]*partState),
	}
	forget := func(_ context.Context, _ *kgo.Client, m map[string][]int32) { s.forgetPartitions(m) }
	opts := []kgo.Opt{
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.ConsumerGroup(cfg.Group),
		kgo.ConsumeTopics(cfg.Topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), // a new group bills from the beginning
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		kgo.OnPartitionsRevoked(forget),
		kgo.OnPartitionsLost(forget),
	}
	opts = append(opts, cfg.ClientOptions...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("chsink: kafka client: %w", err)
	}
	s.cl = cl
	if cfg.Registerer != nil {
		s.cols = s.collectors()
		for i, c := range s.cols {
			if err := cfg.Registerer.Register(c); err != nil {
				for _, r := range s.cols[:i] {
					cfg.Registerer.Unregister(r)
				}
				cl.Close()
				return nil, fmt.Errorf("chsink: register metrics: %w", err)
			}
		}
	}
	s.runCtx, s.cancelRun = context.WithCancel(context.Background())
	s.flushCtx, s.cancelFlush = context.WithCancel(context.Background())
	go s.run()
	return s, nil
}

func (c *Config) setDefaults() {
	if c.Group == "" {
		c.Group = DefaultGroup
	}
	if c.Topic == "" {
		c.Topic = event.TopicUsage
	}
	if c.MaxBatch <= 0 {
		c.MaxBatch = 100_000
	}
	if c.FlushInterval <= 0 {
		c.FlushInterval = time.Second
	}
	if c.InsertTimeout <= 0 {
		c.InsertTimeout = 30 * time.Second
	}
	if c.RetryMin <= 0 {
		c.RetryMin = 100 * time.Millisecond
	}
	if c.RetryMax < c.RetryMin {
		c.RetryMax = max(5*time.Second, c.RetryMin)
	}
	if c.ShutdownTimeout <= 0 {
		c.ShutdownTimeout = 10 * time.Second
	}
	if c.DedupeWindow == 0 {
		c.DedupeWindow = 1 << 18
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}

// Close stops consuming, tries for up to ShutdownTimeout to insert and
// commit the batch in hand, then leaves the group. It returns when the
// loop and the Kafka client are gone; calling it again is a no-op.
func (s *Sink) Close() error {
	s.closeOnce.Do(func() {
		s.cancelRun()
		t := time.AfterFunc(s.cfg.ShutdownTimeout, s.cancelFlush)
		<-s.done
		t.Stop()
		s.cancelFlush()
		s.cl.Close()
		for _, c := range s.cols {
			s.cfg.Registerer.Unregister(c)
		}
	})
	return nil
}

// Done is closed when the loop has stopped (after Close, or after a test
// failpoint).
func (s *Sink) Done() <-chan struct{} { return s.done }

func (s *Sink) run() {
	defer close(s.done)
	if !s.ensureSchema() {
		return
	}
	b := &batch{events: make([]event.Usage, 0, min(s.cfg.MaxBatch, 1<<16)), last: make(map[partKey]*kgo.Record)}
	if s.dedup != nil {
		b.ids = newRecentIDs(s.cfg.DedupeWindow)
	}
	for s.runCtx.Err() == nil {
		if !s.cycle(b) {
			return
		}
	}
}

// ensureSchema creates the tables, retrying until it works or Close.
func (s *Sink) ensureSchema() bool {
	bo := s.newBackoff()
	for {
		ctx, cancel := context.WithTimeout(s.runCtx, s.cfg.InsertTimeout)
		err := s.store.EnsureSchema(ctx)
		cancel()
		if err == nil {
			return true
		}
		s.c.schemaErrors.Add(1)
		s.cfg.Logger.Warn("clickhouse schema not created, retrying", "err", err)
		if !bo.wait(s.runCtx) {
			return false
		}
	}
}

// batch is the work in hand: the decoded events and, per partition, the
// last record consumed (what the commit names).
type batch struct {
	events []event.Usage
	ids    *recentIDs // the IDs of this batch: repeats within it are dropped (nil: no filter)
	last   map[partKey]*kgo.Record
}

func (b *batch) reset() {
	clear(b.events)
	b.events = b.events[:0]
	b.ids.clear()
	clear(b.last)
}

// cycle polls one batch (until MaxBatch events or FlushInterval after the
// first record), inserts it, commits it and allows a rebalance. It
// returns false when the loop must stop.
func (s *Sink) cycle(b *batch) bool {
	defer s.cl.AllowRebalance()
	defer b.reset()
	var flushAt time.Time
	for len(b.events) < s.cfg.MaxBatch && s.runCtx.Err() == nil {
		if !s.stallWhile() {
			return false
		}
		pollCtx, cancel := s.runCtx, context.CancelFunc(func() {})
		switch {
		case !flushAt.IsZero():
			pollCtx, cancel = context.WithDeadline(s.runCtx, flushAt)
		case s.cfg.Stalled != nil:
			// A stall must take effect within 100 ms even when the topic
			// is quiet: the first record's wait is bounded.
			pollCtx, cancel = context.WithTimeout(s.runCtx, 100*time.Millisecond)
		}
		fetches := s.cl.PollRecords(pollCtx, s.cfg.MaxBatch-len(b.events))
		expired := pollCtx.Err() != nil
		cancel()
		if fetches.IsClientClosed() {
			return false
		}
		fetches.EachError(func(topic string, p int32, err error) {
			if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
				return
			}
			s.c.fetchErrors.Add(1)
			s.cfg.Logger.Warn("kafka fetch error", "topic", topic, "partition", p, "err", err)
		})
		fetches.EachPartition(func(p kgo.FetchTopicPartition) { s.take(b, p) })
		if flushAt.IsZero() && len(b.last) > 0 {
			flushAt = time.Now().Add(s.cfg.FlushInterval)
		}
		if expired {
			break
		}
	}
	if len(b.last) == 0 {
		return s.runCtx.Err() == nil
	}
	return s.flush(b)
}

// take decodes one partition's records into the batch.
func (s *Sink) take(b *batch, p kgo.FetchTopicPartition) {
	if len(p.Records) == 0 {
		return
	}
	k := partKey{p.Topic, p.Partition}
	s.noteFetch(k, p.HighWatermark, p.Records[0].Offset)
	for _, r := range p.Records {
		s.c.consumed.Add(1)
		b.last[k] = r
		var u event.Usage
		if err := decodeUsage(r.Value, &u); err != nil {
			s.c.skip(skipUndecodable)
			s.cfg.Logger.Warn("skipping undecodable usage record", "partition", p.Partition, "offset", r.Offset, "err", err)
			continue
		}
		if u.V > event.Version {
			s.c.skip(skipNewerVersion)
			s.cfg.Logger.Warn("skipping usage record of a newer schema version", "v", u.V, "partition", p.Partition, "offset", r.Offset)
			continue
		}
		if s.duplicate(b, u.EventID) {
			s.c.dupes.Add(1)
			continue
		}
		if ms := s.c.oldestPendingMs.Load(); ms == 0 || u.WindowEnd < ms {
			s.c.oldestPendingMs.Store(max(u.WindowEnd, 1))
		}
		b.events = append(b.events, u)
	}
}

// duplicate reports whether id was inserted recently by this sink or is
// already in the batch, and records it in the batch.
func (s *Sink) duplicate(b *batch, id event.ID) bool {
	if s.dedup == nil {
		return false
	}
	if s.dedup.seen(id) || b.ids.seen(id) {
		return true
	}
	b.ids.add(id)
	return false
}

// flush inserts the batch until it works, then commits it. It returns
// false when the loop must stop (shutdown or a test failpoint).
func (s *Sink) flush(b *batch) bool {
	if len(b.events) > 0 {
		bo := s.newBackoff()
		for {
			ctx, cancel := context.WithTimeout(s.flushCtx, s.cfg.InsertTimeout)
			err := s.store.Insert(ctx, b.events)
			cancel()
			if err == nil {
				break
			}
			s.c.insertErrors.Add(1)
			s.cfg.Logger.Warn("clickhouse insert failed, retrying (offsets not committed)", "events", len(b.events), "err", err)
			if !bo.wait(s.flushCtx) {
				s.cfg.Logger.Warn("giving up on a batch at shutdown; it will be redelivered", "events", len(b.events))
				return false
			}
		}
		s.c.inserted.Add(uint64(len(b.events)))
		var insights uint64
		for i := range b.events {
			if hasShape(&b.events[i]) {
				insights++
			}
		}
		s.c.insightRows.Add(insights)
		if s.cfg.afterInsert != nil && s.cfg.afterInsert(len(b.events)) {
			return false
		}
		for i := range b.events {
			s.dedup.add(b.events[i].EventID)
		}
	}
	recs := make([]*kgo.Record, 0, len(b.last))
	for _, r := range b.last {
		recs = append(recs, r)
	}
	bo := s.newBackoff()
	for {
		err := s.cl.CommitRecords(s.flushCtx, recs...)
		if err == nil {
			break
		}
		s.c.commitErrors.Add(1)
		if rebalanced(err) {
			// Another member owns (some of) these partitions now and will
			// redeliver from the last commit; what we inserted is
			// deduplicated.
			s.cfg.Logger.Info("offset commit refused after a rebalance; batch will be redelivered", "err", err)
			s.c.oldestPendingMs.Store(0)
			return s.runCtx.Err() == nil
		}
		s.cfg.Logger.Warn("offset commit failed, retrying", "err", err)
		if !bo.wait(s.flushCtx) {
			return false
		}
	}
	s.noteCommit(b.last)
	s.c.batches.Add(1)
	var newest int64
	for i := range b.events {
		newest = max(newest, b.events[i].WindowEnd)
	}
	if newest > s.c.lastCommittedMs.Load() {
		s.c.lastCommittedMs.Store(newest)
	}
	s.c.oldestPendingMs.Store(0)
	return s.runCtx.Err() == nil
}

// rebalanced reports a commit refused because this member's generation is
// over: retrying cannot succeed.
func rebalanced(err error) bool {
	for _, e := range []error{kerr.IllegalGeneration, kerr.UnknownMemberID, kerr.RebalanceInProgress,
		kerr.FencedInstanceID, kerr.StaleMemberEpoch, kerr.FencedMemberEpoch} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

func (s *Sink) noteFetch(k partKey, hwm, firstOffset int64) {
	s.lagMu.Lock()
	defer s.lagMu.Unlock()
	st := s.parts[k]
	if st == nil {
		st = &partState{committed: firstOffset}
		s.parts[k] = st
	}
	st.hwm = hwm
	s.c.lag.Store(s.lagLocked())
}

func (s *Sink) noteCommit(last map[partKey]*kgo.Record) {
	s.lagMu.Lock()
	defer s.lagMu.Unlock()
	for k, r := range last {
		if st := s.parts[k]; st != nil {
			st.committed = r.Offset + 1
		}
	}
	s.c.lag.Store(s.lagLocked())
}

func (s *Sink) forgetPartitions(m map[string][]int32) {
	s.lagMu.Lock()
	defer s.lagMu.Unlock()
	for t, ps := range m {
		for _, p := range ps {
			delete(s.parts, partKey{t, p})
		}
	}
	s.c.lag.Store(s.lagLocked())
}

func (s *Sink) lagLocked() int64 {
	var lag int64
	for _, st := range s.parts {
		lag += max(st.hwm-st.committed, 0)
	}
	return lag
}

// backoff is capped exponential backoff with full jitter. Hand-rolled
// because the only loops using it must wait on the sink's own contexts
// and retry forever; no dependency in go.mod offers that.
type backoff struct {
	min, max, cur time.Duration
}

func (s *Sink) newBackoff() *backoff { return &backoff{min: s.cfg.RetryMin, max: s.cfg.RetryMax} }

// wait sleeps for the next interval; false if ctx ended first.
func (b *backoff) wait(ctx context.Context) bool {
	if b.cur == 0 {
		b.cur = b.min
	} else {
		b.cur = min(b.cur*2, b.max)
	}
	d := b.cur/2 + rand.N(b.cur/2+1)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// stallWhile waits while Config.Stalled says so, holding the batch in hand
// (nothing inserted or committed); false once the sink is stopping.
func (s *Sink) stallWhile() bool {
	for s.cfg.Stalled != nil && s.cfg.Stalled() {
		select {
		case <-s.runCtx.Done():
			return false
		case <-time.After(50 * time.Millisecond):
		}
	}
	return true
}
