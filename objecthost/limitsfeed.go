package objecthost

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/shoaldb/shoal/pipeline"
	"github.com/shoaldb/shoal/pipeline/event"
)

// LimitsFeedOptions configure the host's consumer of the compacted limits
// topic (the limiter's flags, event.Limit keyed by account ID). Either
// Brokers or NewClient is required.
type LimitsFeedOptions struct {
	Brokers []string // seed brokers, for the default client
	// NewClient builds the Kafka client from the feed's consumer options
	// (append your own: TLS, SASL, client ID), e.g. plane.Kafka.Client.
	// Default: kgo.NewClient with kgo.SeedBrokers(Brokers...). The feed owns
	// the client and closes it.
	NewClient func(opts ...kgo.Opt) (*kgo.Client, error)
	Topic     string // default event.TopicLimits
	// RefreshInterval is how often partitions are re-discovered and the lag
	// measured against the brokers' end offsets; default 10s. While the
	// topic does not exist yet it is looked for every RetryBackoff.
	RefreshInterval time.Duration
	// RetryBackoff is the first delay after a failed discovery, doubling up
	// to RefreshInterval; default 500ms.
	RetryBackoff time.Duration
	// StartWait is how long Open waits for the feed to read the topic up to
	// its end, so a restarted host refuses a limited account from its first
	// query; default 5s, negative: do not wait. When the brokers do not
	// answer in time Open returns anyway (queries never wait for Kafka) and
	// the flags apply as soon as the feed has read them.
	StartWait time.Duration
}

// LimitsFeedStats is a snapshot of the limits feed's counters.
type LimitsFeedStats struct {
	Applied    int64 // records applied (flags set or cleared)
	Invalid    int64 // records skipped as undecodable or inconsistent
	Errors     int64 // discovery and fetch errors
	Partitions int   // partitions being consumed
	Lag        int64 // records between the read positions and the end offsets
	// CaughtUp is set once the end offsets were measured and every
	// partition was read up to them (or the topic does not exist yet).
	CaughtUp bool
}

// limitsFeed consumes the limits topic into the host's account flags. Every
// host runs its own, with no consumer group and no stored positions: the
// topic is compacted and small (one record per limited account), so every
// start reads every partition from its log start, which is what makes a
// restarted host keep refusing a limited account. Records of one account
// share a partition (key = account ID) and are applied in offset order: the
// latest one wins. Expiry needs no record: the flag holds an end time that
// the query path compares with the host's clock.
//
// Lifecycle: newLimitsFeed builds the client (it does not connect); run is
// one goroutine owned by the host (its WaitGroup), stopped by the host's
// context; it closes the client when it returns.
type limitsFeed struct {
	o   LimitsFeedOptions
	h   *Host
	cl  *kgo.Client
	adm *kadm.Client
	log *slog.Logger

	applied, invalid, errs atomic.Int64
	lastRecordMs           atomic.Int64 // Kafka timestamp of the last record applied

	caughtUp chan struct{} // closed the first time the feed is caught up
	once     sync.Once

	mu        sync.Mutex
	assigned  map[int32]bool
	next      map[int32]int64 // next offset to read
	end       map[int32]int64 // end offsets: last listing or fetch high watermark
	refreshed bool
	noTopic   bool
}

func newLimitsFeed(o LimitsFeedOptions, h *Host) (*limitsFeed, error) {
	if o.Topic == "" {
		o.Topic = event.TopicLimits
	}
	if o.RefreshInterval <= 0 {
		o.RefreshInterval = 10 * time.Second
	}
	if o.RetryBackoff <= 0 {
		o.RetryBackoff = 500 * time.Millisecond
	}
	if o.StartWait == 0 {
		o.StartWait = 5 * time.Second
	}
	if o.NewClient == nil {
		if len(o.Brokers) == 0 {
			return nil, fmt.Errorf("%w: limits feed needs Brokers or NewClient", ErrInvalid)
		}
		brokers := o.Brokers
		o.NewClient = func(opts ...kgo.Opt) (*kgo.Client, error) {
			return kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...)}, opts...)...)
		}
	}
	// A position the log no longer holds resumes at the log start:
	// re-reading flags is harmless, skipping them is not.
	cl, err := o.NewClient(kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		return nil, fmt.Errorf("limits feed client: %w", err)
	}
	return &limitsFeed{
		o: o, h: h, cl: cl, adm: kadm.NewClient(cl), log: h.log, caughtUp: make(chan struct{}),
		assigned: map[int32]bool{}, next: map[int32]int64{}, end: map[int32]int64{},
	}, nil
}

// waitCaughtUp blocks until the feed first caught up, ctx ends or d passed.
func (f *limitsFeed) waitCaughtUp(ctx context.Context, d time.Duration) bool {
	if d < 0 {
		return false
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-f.caughtUp:
		return true
	case <-ctx.Done():
	case <-t.C:
	}
	return false
}

func (f *limitsFeed) run(ctx context.Context) {
	defer f.cl.Close()
	var nextRefresh time.Time
	backoff := f.o.RetryBackoff
	for ctx.Err() == nil {
		if now := time.Now(); !now.Before(nextRefresh) {
			if err := f.refresh(ctx); err != nil {
				if ctx.Err() != nil {
					return
				}
				f.errs.Add(1)
				f.log.Warn("limits feed: partition discovery failed; retrying", "topic", f.o.Topic, "in", backoff, "err", err)
				nextRefresh = now.Add(backoff)
				backoff = min(2*backoff, f.o.RefreshInterval)
			} else {
				backoff = f.o.RetryBackoff
				f.mu.Lock()
				missing := f.noTopic
				f.mu.Unlock()
				if missing { // the limiter has not published yet: look again soon
					nextRefresh = now.Add(f.o.RetryBackoff)
				} else {
					nextRefresh = now.Add(f.o.RefreshInterval)
				}
			}
			f.noteCaughtUp()
		}
		f.mu.Lock()
		n := len(f.assigned)
		f.mu.Unlock()
		if n == 0 {
			t := time.NewTimer(time.Until(nextRefresh))
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			continue
		}
		pctx, cancel := context.WithDeadline(ctx, nextRefresh)
		fs := f.cl.PollFetches(pctx)
		cancel()
		f.handle(fs)
		f.noteCaughtUp()
	}
}

func (f *limitsFeed) noteCaughtUp() {
	if f.stats().CaughtUp {
		f.once.Do(func() { close(f.caughtUp) })
	}
}

// refresh discovers the topic's partitions, starts reading new ones from
// their log start and measures the end offsets.
func (f *limitsFeed) refresh(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, f.o.RefreshInterval)
	defer cancel()
	topics, err := f.adm.ListTopics(ctx, f.o.Topic)
	if err != nil {
		return err
	}
	td, ok := topics[f.o.Topic]
	if !ok || errors.Is(td.Err, kerr.UnknownTopicOrPartition) {
		f.mu.Lock()
		f.noTopic = true
		f.mu.Unlock()
		return nil
	}
	if td.Err != nil {
		return td.Err
	}
	add := map[int32]kgo.Offset{}
	f.mu.Lock()
	f.noTopic = false
	for p := range td.Partitions {
		if !f.assigned[p] {
			f.assigned[p] = true
			add[p] = kgo.NewOffset().AtStart()
		}
	}
	f.mu.Unlock()
	if len(add) > 0 {
		f.cl.AddConsumePartitions(map[string]map[int32]kgo.Offset{f.o.Topic: add})
	}
	starts, ends, err := pipeline.PartitionOffsets(ctx, f.adm, f.o.Topic)
	if err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for p, off := range ends {
		if f.assigned[p] {
			f.end[p] = off
		}
	}
	for p, off := range starts {
		if f.assigned[p] && f.next[p] < off {
			f.next[p] = off // nothing left to read below the log start
		}
	}
	f.refreshed = true
	return nil
}

// handle applies one poll's records in offset order.
func (f *limitsFeed) handle(fs kgo.Fetches) {
	fs.EachError(func(topic string, p int32, err error) {
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, kgo.ErrClientClosed) {
			return
		}
		f.errs.Add(1)
		f.log.Warn("limits feed: fetch failed", "topic", topic, "partition", p, "err", err)
	})
	fs.EachPartition(func(fp kgo.FetchTopicPartition) {
		if len(fp.Records) == 0 {
			f.mu.Lock()
			f.end[fp.Partition] = max(f.end[fp.Partition], fp.HighWatermark)
			f.mu.Unlock()
			return
		}
		for _, rec := range fp.Records {
			f.apply(rec)
		}
		last := fp.Records[len(fp.Records)-1]
		f.lastRecordMs.Store(last.Timestamp.UnixMilli())
		f.mu.Lock()
		f.next[fp.Partition] = last.Offset + 1
		f.end[fp.Partition] = max(f.end[fp.Partition], fp.HighWatermark)
		f.mu.Unlock()
	})
}

// apply sets or clears one account's flag. A tombstone, or a flag whose end
// time has passed on the host's clock, clears; an invalid record is counted,
// logged and skipped (one bad record must not stop every host's feed).
func (f *limitsFeed) apply(rec *kgo.Record) {
	account := string(rec.Key)
	bad := func(why string, err error) {
		f.invalid.Add(1)
		f.log.Warn("limits feed: invalid record skipped", "partition", rec.Partition, "offset", rec.Offset, "key", account, "why", why, "err", err)
	}
	if account == "" {
		bad("no key", nil)
		return
	}
	if rec.Value == nil {
		f.h.setAccountLimit(account, "", time.Time{})
		f.applied.Add(1)
		return
	}
	var l event.Limit
	if err := event.Decode(rec.Value, &l); err != nil {
		bad("decode", err)
		return
	}
	if l.AccountID != account {
		bad("key and account_id differ", nil)
		return
	}
	until := time.UnixMilli(l.UntilMs)
	if l.UntilMs <= 0 || !until.After(f.h.now()) {
		until = time.Time{}
	}
	f.h.setAccountLimit(account, l.Reason, until)
	f.applied.Add(1)
}

func (f *limitsFeed) stats() LimitsFeedStats {
	st := LimitsFeedStats{Applied: f.applied.Load(), Invalid: f.invalid.Load(), Errors: f.errs.Load()}
	f.mu.Lock()
	defer f.mu.Unlock()
	st.Partitions = len(f.assigned)
	for p := range f.assigned {
		if d := f.end[p] - f.next[p]; d > 0 {
			st.Lag += d
		}
	}
	st.CaughtUp = (f.refreshed && st.Lag == 0) || (f.noTopic && len(f.assigned) == 0)
	return st
}

// collectors are the feed's series, on the host's registry.
func (f *limitsFeed) collectors() []prometheus.Collector {
	counter := func(name, help string, v *atomic.Int64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 { return float64(v.Load()) })
	}
	return []prometheus.Collector{
		counter("shoal_objecthost_limits_records_applied_total", "Limits feed records applied (account flags set or cleared).", &f.applied),
		counter("shoal_objecthost_limits_records_invalid_total", "Limits feed records skipped as undecodable or inconsistent.", &f.invalid),
		counter("shoal_objecthost_limits_errors_total", "Limits feed discovery and fetch errors.", &f.errs),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "shoal_objecthost_limits_limited_accounts",
			Help: "Accounts whose queries are refused now (daily row limit flag set and not expired)."},
			func() float64 { return float64(f.h.limitedAccounts(f.h.now())) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "shoal_objecthost_limits_lag_records",
			Help: "Records of the limits topic not yet applied (end offsets minus read positions)."},
			func() float64 { return float64(f.stats().Lag) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "shoal_objecthost_limits_last_record_timestamp_seconds",
			Help: "Kafka timestamp of the last limits record applied (0 before the first)."},
			func() float64 { return float64(f.lastRecordMs.Load()) / 1000 }),
	}
}

// LimitsFeedStats returns the limits feed's counters; ok is false when the
// host runs no feed (Config.LimitsFeed unset).
func (h *Host) LimitsFeedStats() (LimitsFeedStats, bool) {
	if h.limits == nil {
		return LimitsFeedStats{}, false
	}
	return h.limits.stats(), true
}
