// Package storage is the storage consumer of Shoal's background plane: it
// reads database sizes from the storage topic (event.Size, keyed by
// database UUID) and writes them into the catalog in batches
// (raftmeta.Client.SetDatabaseStats), where the FSM turns each kept size
// into a delta and the leader's drain folds the deltas into the account
// totals that heartbeats read.
//
// Delivery: at least once in, exact effect out. Offsets are committed only
// after the catalog acknowledged the write that contains their records, so
// a crash redelivers, never skips; a redelivered or reordered size has a
// seq the catalog has already passed, and the catalog ignores it (counted
// as stale), so no total ever moves backwards or double counts.
//
// See pipeline/DESIGN.md ("Storage consumer") for the cap on consumers
// and the batching choices.
package storage

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"golang.org/x/sync/errgroup"

	"github.com/shoaldb/shoal/pipeline/event"
	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// Defaults and bounds of Config.
const (
	DefaultGroup    = "shoal-storage"
	DefaultMaxBatch = 5_000
	DefaultMaxWait  = 100 * time.Millisecond
	// MaxConsumers caps the group members one process runs. Each member
	// has at most one catalog write in flight, so the catalog sees at most
	// (members, and never more than the topic's partitions) concurrent
	// writes of at most MaxBatch sizes: see pipeline/DESIGN.md.
	MaxConsumers = 8
)

// Config configures a Consumer. Zero values take the documented defaults.
type Config struct {
	// Brokers are the seed brokers (host:port), required.
	Brokers []string
	// ClientOptions are appended to the consumer's own kgo options (SASL,
	// TLS, a dialer, session timeouts). Options that change commit
	// semantics (auto-commit) break the delivery guarantee.
	ClientOptions []kgo.Opt
	// Topic is the storage topic (default event.TopicStorage).
	Topic string
	// Group is the consumer group (default DefaultGroup).
	Group string
	// Consumers is the number of group members this process runs (default
	// 1, at most MaxConsumers). Members beyond the topic's partition count
	// get no partitions and stand by.
	Consumers int
	// MaxBatch bounds the sizes polled for one catalog write (default
	// 5,000, at most fsm.MaxStatsPerCommand); MaxWait is how long a batch
	// waits to fill after its first record (default 100 ms).
	MaxBatch int
	MaxWait  time.Duration
	// RetryMin and RetryMax bound the backoff between failed catalog
	// writes (defaults 100 ms and 5 s, doubling). A batch is retried until
	// it is acknowledged or the consumer stops; nothing is committed past
	// it meanwhile.
	RetryMin, RetryMax time.Duration

	// Catalog receives the sizes (a *raftmeta.Client), required.
	Catalog Catalog
	// Registerer receives the consumer's metrics (shoal_storage_consumer_*);
	// they are unregistered by Close. Nil: the consumer owns a registry,
	// see Consumer.Registry.
	Registerer prometheus.Registerer
	// Logger receives catalog and Kafka failures. Default: discarded.
	Logger *slog.Logger
	// Now is the clock for the applied-age metric (default time.Now).
	Now func() time.Time
	// Stalled, when set, is asked before every poll: while it returns
	// true the members poll, write and commit nothing (they stay in the
	// group, holding their partitions) — a consumer that hangs while the
	// brokers are up. Fault tests only (SHOAL_FAILPOINTS
	// consumers:stall); nil in production.
	Stalled func() bool
}

func (c *Config) setDefaults() error {
	if len(c.Brokers) == 0 {
		return errors.New("storage consumer: no brokers")
	}
	if c.Catalog == nil {
		return errors.New("storage consumer: no catalog")
	}
	if c.Topic == "" {
		c.Topic = event.TopicStorage
	}
	if c.Group == "" {
		c.Group = DefaultGroup
	}
	if c.Consumers <= 0 {
		c.Consumers = 1
	}
	if c.Consumers > MaxConsumers {
		return fmt.Errorf("storage consumer: %d consumers, at most %d (the cap protects the catalog)", c.Consumers, MaxConsumers)
	}
	if c.MaxBatch <= 0 {
		c.MaxBatch = DefaultMaxBatch
	}
	if c.MaxBatch > fsm.MaxStatsPerCommand {
		return fmt.Errorf("storage consumer: batch of %d, at most %d", c.MaxBatch, fsm.MaxStatsPerCommand)
	}
	if c.MaxWait <= 0 {
		c.MaxWait = DefaultMaxWait
	}
	if c.RetryMin <= 0 {
		c.RetryMin = 100 * time.Millisecond
	}
	if c.RetryMax < c.RetryMin {
		c.RetryMax = max(5*time.Second, c.RetryMin)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return nil
}

// Consumer runs the storage consumer group members of one process. Run
// blocks until Close (or its context); Stats and the metrics are safe from
// any goroutine.
type Consumer struct {
	cfg  Config
	log  *slog.Logger
	c    *counters
	reg  *prometheus.Registry // owned registry, or nil
	regr prometheus.Registerer
	cols []prometheus.Collector

	ctx    context.Context
	cancel context.CancelFunc
	mu     sync.Mutex
	done   chan struct{} // closed when Run returns; nil before Run
	closed bool

	// afterWrite, when set (tests), runs after a batch's catalog write was
	// acknowledged and before its offsets are committed.
	afterWrite func(stats int)
}

// New returns a consumer; Run starts it.
func New(cfg Config) (*Consumer, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	c := &Consumer{cfg: cfg, log: cfg.Logger, c: newCounters()}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.cols = c.c.collectors()
	c.regr = cfg.Registerer
	if c.regr == nil {
		c.reg = prometheus.NewRegistry()
		c.regr = c.reg
	}
	for _, col := range c.cols {
		if err := c.regr.Register(col); err != nil {
			c.unregister()
			return nil, fmt.Errorf("storage consumer: register metrics: %w", err)
		}
	}
	return c, nil
}

func (c *Consumer) unregister() {
	for _, col := range c.cols {
		c.regr.Unregister(col)
	}
}

// Registry is the consumer's own metrics registry when Config.Registerer
// was nil (nil otherwise).
func (c *Consumer) Registry() *prometheus.Registry { return c.reg }

// Stats returns the consumer's counters.
func (c *Consumer) Stats() Stats { return c.c.stats() }

// Run joins the group with Config.Consumers members and writes sizes to
// the catalog until ctx is done or Close is called; it then leaves the
// group (without committing anything not yet acknowledged) and returns
// nil. It returns an error only if a Kafka client cannot be created. Run
// may be called once.
func (c *Consumer) Run(ctx context.Context) error {
	c.mu.Lock()
	if c.closed || c.done != nil {
		c.mu.Unlock()
		return errors.New("storage consumer: Run called twice or after Close")
	}
	c.done = make(chan struct{})
	c.mu.Unlock()
	defer close(c.done)

	// The members run under c.ctx, so Close (and the tests' kill) cancels
	// them synchronously; the caller's ctx is followed too.
	runCtx, stop := context.WithCancel(c.ctx)
	defer stop()
	defer context.AfterFunc(ctx, stop)()
	ctx = runCtx
	var clients []*kgo.Client
	for i := 0; i < c.cfg.Consumers; i++ {
		cl, err := c.newClient()
		if err != nil {
			for _, cl := range clients {
				cl.Close()
			}
			return fmt.Errorf("storage consumer: kafka client: %w", err)
		}
		clients = append(clients, cl)
	}
	g, gctx := errgroup.WithContext(ctx)
	for _, cl := range clients {
		g.Go(func() error {
			defer cl.Close() // leaves the group; commits nothing (auto-commit is off)
			c.member(gctx, cl)
			return nil
		})
	}
	return g.Wait()
}

// Close stops Run, waits for it to return, and unregisters the metrics.
func (c *Consumer) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	done := c.done
	c.mu.Unlock()
	c.cancel()
	if done != nil {
		<-done
	}
	c.unregister()
	return nil
}

func (c *Consumer) newClient() (*kgo.Client, error) {
	drop := func(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
		c.c.dropLag(lost[c.cfg.Topic])
	}
	opts := []kgo.Opt{
		kgo.SeedBrokers(c.cfg.Brokers...),
		kgo.ConsumerGroup(c.cfg.Group),
		kgo.ConsumeTopics(c.cfg.Topic),
		// A new group starts from the oldest retained size: sizes are
		// sent only when they change, so skipping any would leave a
		// database's size wrong until its next change.
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.DisableAutoCommit(),
		// No rebalance between a poll and its commit: a member commits
		// only partitions it still owns (fewer redeliveries; correctness
		// does not depend on it, see the package comment).
		kgo.BlockRebalanceOnPoll(),
		kgo.OnPartitionsRevoked(drop),
		kgo.OnPartitionsLost(drop),
		kgo.WithLogger(kgoLogger{c.log}),
	}
	return kgo.NewClient(append(opts, c.cfg.ClientOptions...)...)
}

// member is one group member's loop: poll a batch, write it, commit it.
func (c *Consumer) member(ctx context.Context, cl *kgo.Client) {
	for ctx.Err() == nil {
		if stallWhile(ctx, c.cfg.Stalled) {
			return
		}
		// With a stall hook, a poll waits at most 100 ms for its first
		// record, so a stall takes effect within that even when the topic
		// is quiet (a poll blocked before it would otherwise take records
		// arriving during it).
		pctx, cancel := ctx, context.CancelFunc(func() {})
		if c.cfg.Stalled != nil {
			pctx, cancel = context.WithTimeout(ctx, 100*time.Millisecond)
		}
		recs := c.poll(pctx, cl)
		cancel()
		if len(recs) == 0 {
			cl.AllowRebalance()
			continue
		}
		b := collapse(recs, func(r *kgo.Record, err error) {
			c.log.Warn("storage consumer: skipping record", "partition", r.Partition, "offset", r.Offset, "err", err)
		})
		c.c.invalid.Add(uint64(b.invalid))
		c.c.superseded.Add(uint64(b.superseded))
		if err := c.write(ctx, b.stats); err != nil {
			cl.AllowRebalance()
			return // stopping: nothing is committed past what was acknowledged
		}
		if b.oldestMs > 0 {
			c.c.appliedAgeNs.Store(int64(c.cfg.Now().Sub(time.UnixMilli(b.oldestMs))))
		}
		if c.afterWrite != nil {
			c.afterWrite(len(b.stats))
		}
		if ctx.Err() != nil {
			// Stopping between the write and the commit: the batch is
			// redelivered to the next owner, where it is stale.
			cl.AllowRebalance()
			return
		}
		if err := cl.CommitRecords(ctx, recs...); err != nil {
			c.c.commitErrors.Add(1)
			c.log.Warn("storage consumer: offset commit failed; the batch will be redelivered", "records", len(recs), "err", err)
		} else {
			c.c.committed.Add(uint64(len(recs)))
		}
		cl.AllowRebalance()
	}
}

// poll returns up to MaxBatch records: it waits for the first one, then up
// to MaxWait for more. It returns nothing once ctx is done.
func (c *Consumer) poll(ctx context.Context, cl *kgo.Client) []*kgo.Record {
	recs := c.pollOnce(ctx, cl, c.cfg.MaxBatch, nil)
	if len(recs) == 0 || len(recs) >= c.cfg.MaxBatch {
		return recs
	}
	wctx, cancel := context.WithTimeout(ctx, c.cfg.MaxWait)
	defer cancel()
	for len(recs) < c.cfg.MaxBatch && wctx.Err() == nil {
		recs = c.pollOnce(wctx, cl, c.cfg.MaxBatch-len(recs), recs)
	}
	return recs
}

func (c *Consumer) pollOnce(ctx context.Context, cl *kgo.Client, n int, recs []*kgo.Record) []*kgo.Record {
	fs := cl.PollRecords(ctx, n)
	fs.EachError(func(topic string, partition int32, err error) {
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, kgo.ErrClientClosed) {
			return
		}
		c.log.Warn("storage consumer: fetch error", "topic", topic, "partition", partition, "err", err)
	})
	fs.EachPartition(func(p kgo.FetchTopicPartition) {
		if len(p.Records) > 0 && p.Topic == c.cfg.Topic {
			last := p.Records[len(p.Records)-1]
			c.c.setLag(p.Partition, p.HighWatermark-(last.Offset+1))
		}
	})
	before := len(recs)
	fs.EachRecord(func(r *kgo.Record) { recs = append(recs, r) })
	c.c.consumed.Add(uint64(len(recs) - before))
	return recs
}

// write sends stats to the catalog until it acknowledges them, backing off
// while it is unavailable. A batch the catalog refuses as invalid (which
// decodeSize should make impossible) is split until the refused stats are
// isolated and dropped, so one bad size cannot stall the stream. It returns
// an error only when ctx is done.
func (c *Consumer) write(ctx context.Context, stats []fsm.DatabaseStat) error {
	if len(stats) == 0 {
		return nil
	}
	wait := c.cfg.RetryMin
	for attempt := 1; ; attempt++ {
		start := time.Now()
		res, err := c.cfg.Catalog.SetDatabaseStats(ctx, stats)
		if err == nil {
			c.c.writeSeconds.Observe(time.Since(start).Seconds())
			c.c.batchSize.Observe(float64(len(stats)))
			c.c.attemptCount.Observe(float64(attempt))
			c.c.result(res)
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var fe *fsm.Error
		if errors.As(err, &fe) && fe.Code == fsm.CodeInvalid {
			if len(stats) == 1 {
				c.c.invalid.Add(1)
				c.log.Warn("storage consumer: catalog refused a size; dropping it", "uuid", stats[0].UUID, "err", err)
				return nil
			}
			half := len(stats) / 2
			if err := c.write(ctx, stats[:half]); err != nil {
				return err
			}
			return c.write(ctx, stats[half:])
		}
		// Unavailable, a timeout, or a catalog that does not speak this
		// command yet (a rolling upgrade): retry the same batch.
		c.c.catalogErrors.Add(1)
		c.log.Warn("storage consumer: catalog write failed; retrying", "stats", len(stats), "attempt", attempt, "backoff", wait, "err", err)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		wait = min(2*wait, c.cfg.RetryMax)
	}
}

// kgoLogger adapts slog to kgo's logger (warnings and errors only).
type kgoLogger struct{ l *slog.Logger }

func (k kgoLogger) Level() kgo.LogLevel { return kgo.LogLevelWarn }

func (k kgoLogger) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	switch level {
	case kgo.LogLevelError:
		k.l.Error("kafka: "+msg, keyvals...)
	case kgo.LogLevelWarn:
		k.l.Warn("kafka: "+msg, keyvals...)
	}
}

// stallWhile waits while stalled reports true (Config.Stalled); it reports
// whether ctx ended meanwhile.
func stallWhile(ctx context.Context, stalled func() bool) bool {
	for stalled != nil && stalled() {
		select {
		case <-ctx.Done():
			return true
		case <-time.After(50 * time.Millisecond):
		}
	}
	return ctx.Err() != nil
}
