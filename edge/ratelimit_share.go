package edge

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/shoaldb/shoal/pipeline/event"
)

// The ratelimits topic as the rate share creates it when it is missing; the
// same spec is in pipeline.DefaultTopics (a test checks they agree).
const (
	rateShareTopicPartitions = 8
	rateShareTopicRetention  = time.Hour
)

// RateShareOptions configure the exchange of admitted-request counts between
// edges over the ratelimits topic (DESIGN.md "Rate limits across edges").
// Either Brokers or NewClient is required.
type RateShareOptions struct {
	Brokers []string // seed brokers, for the default client
	// NewClient builds the Kafka client from the share's options (append
	// your own: TLS, SASL). Default: kgo.NewClient with
	// kgo.SeedBrokers(Brokers...). The share owns the client and closes it.
	NewClient func(opts ...kgo.Opt) (*kgo.Client, error)
	Topic     string // default event.TopicRateLimits
	// Interval is how often this edge reports what it admitted since its
	// last report; default 250ms. It is most of the tolerance: other edges
	// see this edge's traffic up to Interval plus the propagation late.
	Interval time.Duration
	// MaxAge drops reports older than this when they arrive (a consumer
	// that fell behind, a broker that was down); default 10s. Dropping only
	// loosens the limit, so stale debts never lock an account out.
	MaxAge time.Duration
	// EdgeID names this edge in its reports, so it skips its own; it must
	// differ between edges. Default: host name, process ID and a random
	// suffix.
	EdgeID string
}

// RateShareStats is a snapshot of the rate share's counters.
type RateShareStats struct {
	ReportsSent     int64 // reports the brokers acknowledged
	ReportsReceived int64 // other edges' reports charged to the local buckets
	Ignored         int64 // reports skipped: this edge's own, or older than MaxAge
	Errors          int64 // produce, fetch, decode and topic-creation errors
	// Lag is how old the last report charged was when it arrived (its
	// window end to its arrival): the propagation part of the tolerance.
	Lag time.Duration
}

// rateShare makes the per-key token buckets of every edge replicas of one
// fleet-wide bucket. The query path only counts what it admits (record, a
// map update under a mutex; no network); one goroutine publishes the counts
// every Interval, another reads every other edge's reports and charges them
// to the local buckets (limiters.charge), which may drive them negative.
//
// Lifecycle: newRateShare builds the client (it does not connect); start
// runs the two goroutines; close stops them and closes the client. With the
// brokers unreachable reports neither leave nor arrive, and every edge
// enforces the limits on its own (the behaviour without a share).
type rateShare struct {
	o          RateShareOptions
	acct, db   *limiters
	cl         *kgo.Client
	log        *slog.Logger
	now        func() time.Time
	cancel     context.CancelFunc
	wg         sync.WaitGroup
	topicReady chan struct{} // closed once the topic is known to exist

	mu          sync.Mutex
	pending     map[string]*pendingUsage // account → admitted since the last report
	windowStart time.Time
	seq         uint64 // guarded by mu (flush only)

	sent, received, ignored, errs atomic.Int64
	lagMs                         atomic.Int64
}

type pendingUsage struct {
	requests int64
	dbs      map[string]int64
}

func newRateShare(o RateShareOptions, acct, db *limiters, log *slog.Logger, now func() time.Time) (*rateShare, error) {
	if o.Topic == "" {
		o.Topic = event.TopicRateLimits
	}
	if o.Interval <= 0 {
		o.Interval = 250 * time.Millisecond
	}
	if o.MaxAge <= 0 {
		o.MaxAge = 10 * time.Second
	}
	if o.EdgeID == "" {
		o.EdgeID = defaultEdgeID()
	}
	if o.NewClient == nil {
		if len(o.Brokers) == 0 {
			return nil, errors.New("edge: rate share needs Brokers or NewClient")
		}
		brokers := o.Brokers
		o.NewClient = func(opts ...kgo.Opt) (*kgo.Client, error) {
			return kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...)}, opts...)...)
		}
	}
	// No consumer group: every edge needs every other edge's reports. Only
	// reports written from now on matter (they are deltas of live traffic),
	// so partitions start at their end. A report that cannot be delivered
	// within a few intervals is useless to the others: fail it fast.
	cl, err := o.NewClient(
		kgo.ConsumeTopics(o.Topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtEnd()),
		kgo.FetchMaxWait(time.Second),
		kgo.MetadataMaxAge(10*time.Second),
		kgo.ProducerLinger(0),
		kgo.RecordDeliveryTimeout(max(2*time.Second, 4*o.Interval)),
		kgo.MaxBufferedRecords(100_000),
	)
	if err != nil {
		return nil, fmt.Errorf("edge: rate share client: %w", err)
	}
	return &rateShare{o: o, acct: acct, db: db, cl: cl, log: log, now: now,
		topicReady: make(chan struct{}), pending: make(map[string]*pendingUsage), windowStart: now()}, nil
}

func defaultEdgeID() string {
	h, _ := os.Hostname()
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "edge-" + h + "-" + strconv.Itoa(os.Getpid()) + "-" + hex.EncodeToString(b[:])
}

func (rs *rateShare) start() {
	ctx, cancel := context.WithCancel(context.Background())
	rs.cancel = cancel
	rs.wg.Add(2)
	go func() { defer rs.wg.Done(); rs.report(ctx) }()
	go func() { defer rs.wg.Done(); rs.consume(ctx) }()
}

// close stops both goroutines, waits for them and closes the client.
// Counts not yet reported are dropped.
func (rs *rateShare) close() {
	if rs.cancel != nil {
		rs.cancel()
		rs.wg.Wait()
	}
	rs.cl.Close()
}

// record counts one admitted request: a token taken from acct's bucket and,
// when db is not "", one from db's. It is the only call on the query path;
// a nil share records nothing.
func (rs *rateShare) record(acct, db string) {
	if rs == nil || (rs.acct.limit.Rate <= 0 && (db == "" || rs.db.limit.Rate <= 0)) {
		return
	}
	rs.mu.Lock()
	p := rs.pending[acct]
	if p == nil {
		p = &pendingUsage{}
		rs.pending[acct] = p
	}
	if rs.acct.limit.Rate > 0 {
		p.requests++
	}
	if db != "" && rs.db.limit.Rate > 0 {
		if p.dbs == nil {
			p.dbs = make(map[string]int64)
		}
		p.dbs[db]++
	}
	rs.mu.Unlock()
}

// take returns the reports of the window that ends now (one per account
// with traffic) and starts the next window.
func (rs *rateShare) take() []event.RateUsage {
	now := rs.now()
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if len(rs.pending) == 0 {
		rs.windowStart = now
		return nil
	}
	out := make([]event.RateUsage, 0, len(rs.pending))
	for acct, p := range rs.pending {
		rs.seq++
		out = append(out, event.RateUsage{V: event.Version, EventID: event.ID{Producer: rs.o.EdgeID, Seq: rs.seq},
			Edge: rs.o.EdgeID, AccountID: acct, Requests: p.requests, Databases: p.dbs,
			WindowStart: rs.windowStart.UnixMilli(), WindowEnd: now.UnixMilli()})
	}
	rs.pending = make(map[string]*pendingUsage, len(out))
	rs.windowStart = now
	return out
}

// report publishes the counts every Interval. It never blocks on the
// brokers: a report that cannot be buffered or delivered is counted as an
// error and dropped (the others then under-count this edge, as without a
// share).
func (rs *rateShare) report(ctx context.Context) {
	if !rs.ensureTopic(ctx) {
		return
	}
	t := time.NewTicker(rs.o.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, u := range rs.take() {
			b, err := event.Encode(u)
			if err != nil {
				rs.errs.Add(1)
				continue
			}
			rs.cl.TryProduce(ctx, &kgo.Record{Topic: rs.o.Topic, Key: []byte(u.AccountID), Value: b}, func(_ *kgo.Record, err error) {
				if err != nil {
					if !ignorableFetchErr(err) {
						rs.errs.Add(1)
					}
					return
				}
				rs.sent.Add(1)
			})
		}
	}
}

// ensureTopic creates the topic when it is missing (pipeline.EnsureTopics
// does the same where the pipeline runs), retrying until it exists or ctx
// ends. Reports cannot be produced before: the brokers do not auto-create.
func (rs *rateShare) ensureTopic(ctx context.Context) bool {
	adm := kadm.NewClient(rs.cl) // not closed: that would close cl
	backoff := 250 * time.Millisecond
	for {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := adm.CreateTopic(cctx, rateShareTopicPartitions, -1, map[string]*string{
			"cleanup.policy": kadm.StringPtr("delete"),
			"retention.ms":   kadm.StringPtr(strconv.FormatInt(rateShareTopicRetention.Milliseconds(), 10)),
		}, rs.o.Topic)
		cancel()
		if err == nil || errors.Is(err, kerr.TopicAlreadyExists) {
			close(rs.topicReady)
			rs.cl.ForceMetadataRefresh()
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		rs.errs.Add(1)
		rs.log.Warn("rate share: creating the topic failed; limits are per edge until it exists", "topic", rs.o.Topic, "in", backoff, "err", err)
		select {
		case <-ctx.Done():
			return false
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 10*time.Second)
	}
}

// consume charges every other edge's reports to the local buckets.
func (rs *rateShare) consume(ctx context.Context) {
	select {
	case <-ctx.Done():
		return
	case <-rs.topicReady:
	}
	for ctx.Err() == nil {
		fs := rs.cl.PollRecords(ctx, 10_000)
		fs.EachError(func(topic string, p int32, err error) {
			if ignorableFetchErr(err) {
				return
			}
			rs.errs.Add(1)
			rs.log.Warn("rate share: fetch failed", "topic", topic, "partition", p, "err", err)
		})
		fs.EachRecord(func(rec *kgo.Record) { rs.apply(rec.Value) })
	}
}

// apply charges one report; it is the whole of the consumer's logic.
func (rs *rateShare) apply(value []byte) {
	var u event.RateUsage
	if err := event.Decode(value, &u); err != nil {
		rs.errs.Add(1)
		rs.log.Warn("rate share: undecodable report skipped", "err", err)
		return
	}
	if u.Edge == rs.o.EdgeID {
		rs.ignored.Add(1)
		return
	}
	age := rs.now().Sub(time.UnixMilli(u.WindowEnd))
	if age > rs.o.MaxAge {
		rs.ignored.Add(1)
		return
	}
	rs.acct.charge(u.AccountID, u.Requests)
	for db, n := range u.Databases {
		rs.db.charge(db, n)
	}
	rs.received.Add(1)
	rs.lagMs.Store(max(0, age.Milliseconds()))
}

func (rs *rateShare) stats() RateShareStats {
	return RateShareStats{ReportsSent: rs.sent.Load(), ReportsReceived: rs.received.Load(), Ignored: rs.ignored.Load(),
		Errors: rs.errs.Load(), Lag: time.Duration(rs.lagMs.Load()) * time.Millisecond}
}

// collectors are the share's series (registered only when a share runs).
func (rs *rateShare) collectors() []prometheus.Collector {
	counter := func(name, help string, v *atomic.Int64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 { return float64(v.Load()) })
	}
	return []prometheus.Collector{
		counter("shoal_edge_rate_share_reports_sent_total", "Rate-limit reports (admitted counts of one account) this edge published.", &rs.sent),
		counter("shoal_edge_rate_share_reports_received_total", "Other edges' rate-limit reports charged to this edge's buckets.", &rs.received),
		counter("shoal_edge_rate_share_reports_ignored_total", "Rate-limit reports skipped: this edge's own, or older than MaxAge.", &rs.ignored),
		counter("shoal_edge_rate_share_errors_total", "Rate share produce, fetch, decode and topic-creation errors.", &rs.errs),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "shoal_edge_rate_share_lag_seconds",
			Help: "Age of the last rate-limit report charged when it arrived (window end to arrival)."},
			func() float64 { return float64(rs.lagMs.Load()) / 1000 }),
	}
}
