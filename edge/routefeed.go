package edge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
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

// RouteGenerationHeader is the record header carrying the routing generation
// on the tombstone that follows a deleted route (objecthost.RouteGenerationHeader
// writes it; the names must agree).
const RouteGenerationHeader = "shoal-generation"

// RouteFeedOptions configure the edge's consumer of the routes topic. Either
// Brokers or NewClient is required.
type RouteFeedOptions struct {
	Brokers []string // seed brokers, for the default client
	// NewClient builds the Kafka client from the feed's consumer options
	// (append your own: TLS, SASL, client ID). Default: kgo.NewClient with
	// kgo.SeedBrokers(Brokers...). The feed owns the client and closes it.
	NewClient func(opts ...kgo.Opt) (*kgo.Client, error)
	Topic     string // default event.TopicRoutes
	// RefreshInterval is how often partitions are re-discovered and the lag
	// measured against the brokers' end offsets; default 10s.
	RefreshInterval time.Duration
	// RetryBackoff is the first delay after a failed discovery, doubling up
	// to RefreshInterval; default 500ms.
	RetryBackoff time.Duration
	// MaxPollRecords bounds one batch (one bbolt transaction); default 5000.
	MaxPollRecords int
}

// RouteFeedStats is a snapshot of the route feed's counters.
type RouteFeedStats struct {
	Applied    int64 // records stored in the cache (new routes, newer generations, refreshes)
	Stale      int64 // records ignored: the cache held a newer version
	Invalid    int64 // records that could not be decoded or validated (skipped)
	Errors     int64 // discovery, fetch and store errors
	Partitions int   // partitions being consumed
	Lag        int64 // records between the stored positions and the brokers' end offsets
	// CaughtUp is set once the end offsets have been measured and every
	// partition has been read up to them (also when the topic does not
	// exist yet: there is nothing to read).
	CaughtUp bool
}

// routeFeed consumes the compacted routes topic into the route cache. Every
// edge runs its own: no consumer group (every edge needs every route), the
// partitions are assigned directly, and the positions are the edge's own,
// stored in its bbolt file with the routes they produced (routefeedstore.go).
//
// Lifecycle: newRouteFeed builds the client (it does not connect); start
// runs one goroutine; close cancels it, waits for it and closes the client.
type routeFeed struct {
	o     RouteFeedOptions
	cache *RouteCache
	cl    *kgo.Client
	adm   *kadm.Client
	log   *slog.Logger

	cancel context.CancelFunc
	done   chan struct{}

	applied, stale, invalid, errs atomic.Int64
	lastRecordMs                  atomic.Int64 // Kafka timestamp of the last record read

	mu        sync.Mutex
	topicID   [16]byte
	assigned  map[int32]bool
	next      map[int32]int64 // next offset to read, as last applied
	end       map[int32]int64 // end offsets: last listing or fetch high watermark
	refreshed bool            // end offsets measured at least once
	noTopic   bool            // the last discovery found no such topic
}

func newRouteFeed(o RouteFeedOptions, cache *RouteCache, log *slog.Logger) (*routeFeed, error) {
	if o.Topic == "" {
		o.Topic = event.TopicRoutes
	}
	if o.RefreshInterval <= 0 {
		o.RefreshInterval = 10 * time.Second
	}
	if o.RetryBackoff <= 0 {
		o.RetryBackoff = 500 * time.Millisecond
	}
	if o.MaxPollRecords <= 0 {
		o.MaxPollRecords = 5000
	}
	if o.NewClient == nil {
		if len(o.Brokers) == 0 {
			return nil, errors.New("edge: route feed needs Brokers or NewClient")
		}
		brokers := o.Brokers
		o.NewClient = func(opts ...kgo.Opt) (*kgo.Client, error) {
			return kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...)}, opts...)...)
		}
	}
	// A position the log no longer holds (below the log start after
	// retention, or past its end after the broker lost data) resumes at the
	// log start: re-reading routes is harmless, skipping them is not.
	cl, err := o.NewClient(kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		return nil, fmt.Errorf("edge: route feed client: %w", err)
	}
	return &routeFeed{
		o: o, cache: cache, cl: cl, adm: kadm.NewClient(cl), log: log, done: make(chan struct{}),
		assigned: make(map[int32]bool), next: make(map[int32]int64), end: make(map[int32]int64),
	}, nil
}

func (f *routeFeed) start() {
	ctx, cancel := context.WithCancel(context.Background())
	f.cancel = cancel
	go f.run(ctx)
}

// close stops the consumer and waits for it. The cache stays open.
func (f *routeFeed) close() {
	if f.cancel != nil {
		f.cancel()
		<-f.done
	}
	f.cl.Close()
}

func (f *routeFeed) run(ctx context.Context) {
	defer close(f.done)
	var nextRefresh time.Time
	backoff := f.o.RetryBackoff
	for ctx.Err() == nil {
		if now := time.Now(); !now.Before(nextRefresh) {
			if err := f.refresh(ctx); err != nil {
				if ctx.Err() != nil {
					return
				}
				f.errs.Add(1)
				f.log.Warn("route feed: partition discovery failed; retrying", "topic", f.o.Topic, "in", backoff, "err", err)
				nextRefresh = now.Add(backoff)
				backoff = min(2*backoff, f.o.RefreshInterval)
			} else {
				nextRefresh = now.Add(f.o.RefreshInterval)
				backoff = f.o.RetryBackoff
			}
		}
		f.mu.Lock()
		n := len(f.assigned)
		f.mu.Unlock()
		if n == 0 { // no topic yet (or discovery failing): wait for the next try
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
		fs := f.cl.PollRecords(pctx, f.o.MaxPollRecords)
		cancel()
		f.handle(fs)
	}
}

// refresh discovers the topic's partitions, starts consuming new ones from
// their stored positions (the log start when none), notices a topic that
// was deleted and created again, and measures the lag.
func (f *routeFeed) refresh(ctx context.Context) error {
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
		return nil // nothing published yet: not an error, look again later
	}
	if td.Err != nil {
		return td.Err
	}
	storedID, stored, err := f.cache.feedPositions(f.o.Topic)
	if err != nil {
		return err
	}
	var zero [16]byte
	if td.ID != zero && td.ID != storedID {
		recreated := storedID != zero
		if err := f.cache.setFeedTopic(f.o.Topic, td.ID, recreated); err != nil {
			return err
		}
		if recreated {
			// Same name, new log: the stored offsets mean nothing there.
			f.log.Warn("route feed: topic was recreated; re-reading it from the start", "topic", f.o.Topic)
			stored = map[int32]int64{}
			f.rewind()
		}
	}
	add := map[int32]kgo.Offset{}
	f.mu.Lock()
	f.noTopic = false
	f.topicID = td.ID
	for p := range td.Partitions {
		if f.assigned[p] {
			continue
		}
		f.assigned[p] = true
		if n, ok := stored[p]; ok {
			add[p] = kgo.NewOffset().At(n)
			f.next[p] = n
		} else {
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

// rewind makes every consumed partition start over from the log start (a
// purge of the cache, a recreated topic).
func (f *routeFeed) rewind() {
	set := map[int32]kgo.EpochOffset{}
	f.mu.Lock()
	for p := range f.assigned {
		set[p] = kgo.EpochOffset{Epoch: -1, Offset: 0} // below the start: resumes at the start
		f.next[p] = 0
	}
	f.mu.Unlock()
	if len(set) > 0 {
		f.cl.SetOffsets(map[string]map[int32]kgo.EpochOffset{f.o.Topic: set})
	}
}

func ignorableFetchErr(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, kgo.ErrClientClosed)
}

// handle applies one poll's records, one bbolt transaction per partition.
func (f *routeFeed) handle(fs kgo.Fetches) {
	fs.EachError(func(topic string, p int32, err error) {
		if ignorableFetchErr(err) {
			return
		}
		f.errs.Add(1)
		f.log.Warn("route feed: fetch failed", "topic", topic, "partition", p, "err", err)
	})
	fs.EachPartition(func(fp kgo.FetchTopicPartition) {
		if len(fp.Records) == 0 {
			return
		}
		entries := make([]feedEntry, 0, len(fp.Records))
		for _, rec := range fp.Records {
			if e, ok := f.decode(rec); ok {
				entries = append(entries, e)
			}
		}
		last := fp.Records[len(fp.Records)-1]
		applied, stale, err := f.cache.applyFeed(fp.Topic, fp.Partition, entries, last.Offset+1)
		if err != nil {
			// Not stored: read these records again from the stored position.
			f.errs.Add(1)
			f.log.Error("route feed: storing routes failed; re-reading the batch", "partition", fp.Partition, "err", err)
			f.seekStored(fp.Partition)
			return
		}
		f.applied.Add(int64(applied))
		f.stale.Add(int64(stale))
		f.lastRecordMs.Store(last.Timestamp.UnixMilli())
		f.mu.Lock()
		f.next[fp.Partition] = last.Offset + 1
		f.end[fp.Partition] = max(f.end[fp.Partition], fp.HighWatermark)
		f.mu.Unlock()
	})
}

// seekStored moves partition p back to its stored position.
func (f *routeFeed) seekStored(p int32) {
	at := int64(0)
	if _, stored, err := f.cache.feedPositions(f.o.Topic); err == nil {
		at = stored[p]
	}
	f.cl.SetOffsets(map[string]map[int32]kgo.EpochOffset{f.o.Topic: {p: {Epoch: -1, Offset: at}}})
}

// decode turns a record into a feed entry; invalid records are counted,
// logged and skipped (their offset still advances: one bad record must not
// stop every edge's feed).
func (f *routeFeed) decode(rec *kgo.Record) (feedEntry, bool) {
	uuid := string(rec.Key)
	bad := func(why string, err error) (feedEntry, bool) {
		f.invalid.Add(1)
		f.log.Warn("route feed: invalid record skipped", "partition", rec.Partition, "offset", rec.Offset, "key", uuid, "why", why, "err", err)
		return feedEntry{}, false
	}
	if uuid == "" {
		return bad("no key", nil)
	}
	if rec.Value == nil {
		var gen int64
		for _, h := range rec.Headers {
			if h.Key == RouteGenerationHeader {
				g, err := strconv.ParseInt(string(h.Value), 10, 64)
				if err != nil || g < 0 {
					return bad("bad generation header", err)
				}
				gen = g
			}
		}
		// Without a header the tombstone deletes nothing newer than
		// generation 0: a bare deleted marker where nothing is cached.
		return feedEntry{tombstone: true, route: Route{DatabaseUUID: uuid, State: "deleted", Generation: gen}}, true
	}
	var er event.Route
	if err := event.Decode(rec.Value, &er); err != nil {
		return bad("decode", err)
	}
	switch {
	case er.DatabaseUUID != uuid:
		return bad("key and database_uuid differ", nil)
	case er.State != "active" && er.State != "deleted":
		return bad("unknown state "+strconv.Quote(er.State), nil)
	case er.State == "active" && (er.ObjectID == "" || er.HostAddress == "" || er.AccountID == "" || er.Generation <= 0):
		return bad("incomplete active route", nil)
	}
	return feedEntry{route: Route{DatabaseUUID: er.DatabaseUUID, ObjectID: er.ObjectID, HostAddress: er.HostAddress,
		AccountID: er.AccountID, State: er.State, Generation: er.Generation}}, true
}

func (f *routeFeed) stats() RouteFeedStats {
	st := RouteFeedStats{Applied: f.applied.Load(), Stale: f.stale.Load(), Invalid: f.invalid.Load(), Errors: f.errs.Load()}
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

// collectors are the feed's series (registered only when a feed runs).
func (f *routeFeed) collectors() []prometheus.Collector {
	counter := func(name, help string, v *atomic.Int64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 { return float64(v.Load()) })
	}
	return []prometheus.Collector{
		counter("shoal_edge_route_feed_applied_total", "Route feed records stored in the route cache.", &f.applied),
		counter("shoal_edge_route_feed_stale_total", "Route feed records ignored because the cache held a newer generation.", &f.stale),
		counter("shoal_edge_route_feed_invalid_total", "Route feed records skipped as undecodable or invalid.", &f.invalid),
		counter("shoal_edge_route_feed_errors_total", "Route feed discovery, fetch and store errors.", &f.errs),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "shoal_edge_route_feed_lag_records",
			Help: "Records of the routes topic not yet applied (end offsets minus stored positions)."},
			func() float64 { return float64(f.stats().Lag) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "shoal_edge_route_feed_last_record_timestamp_seconds",
			Help: "Kafka timestamp of the last route feed record applied (0 before the first)."},
			func() float64 { return float64(f.lastRecordMs.Load()) / 1000 }),
	}
}
