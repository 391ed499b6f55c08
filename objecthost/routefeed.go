package objecthost

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/shoaldb/shoal/pipeline/event"
)

// RouteGenerationHeader is the Kafka record header that carries the routing
// generation on the tombstone following a deleted route, so a consumer that
// only sees the tombstone (the deleted record was compacted away) still
// learns the delete and its generation. The edge's route feed reads the same
// name (edge.RouteGenerationHeader; test/route_feed_test.go checks they
// agree).
const RouteGenerationHeader = "shoal-generation"

// KafkaRoutes is the RouteSink of the Kafka route feed: it produces one
// event.Route per publication to the compacted routes topic, keyed by
// database UUID (so every version of a database's route lands in one
// partition, in publication order), and after a deleted route a tombstone
// (nil value, RouteGenerationHeader set) so compaction eventually drops the
// database's key altogether. Edges consume the topic into their route caches
// (edge/routefeed.go) and keep the highest generation per database.
//
// Contract (RouteSink): PublishRoute waits for the broker's acknowledgement
// for at most Timeout (default 2 s) and returns an error if the route record
// was not acknowledged by then; the host then marks the route dirty and the
// next heartbeat republishes it (a record that was in flight may still land:
// republishing is harmless, consumers ignore a version they already hold).
// A failed tombstone is counted, not returned: the edges already learned the
// delete from the deleted record, and a missing tombstone only leaves one
// record in the compacted topic. Safe for concurrent use; it starts no
// goroutines, and the *kgo.Client stays the caller's to close.
type KafkaRoutes struct {
	cl      *kgo.Client
	topic   string
	ids     EventIDs
	timeout time.Duration
	now     func() time.Time

	records *prometheus.CounterVec // kind (route, tombstone), outcome (ok, error, timeout)
	latency prometheus.Histogram
}

var (
	_ RouteSink            = (*KafkaRoutes)(nil)
	_ prometheus.Collector = (*KafkaRoutes)(nil)
)

// EventIDs hands out event IDs: one producer identity, increasing
// sequences. pipeline.Sequencer (a durable boot epoch per host) implements
// it. Safe for concurrent use.
type EventIDs interface {
	Next() event.ID
}

// KafkaRoutesOptions configures a KafkaRoutes.
type KafkaRoutesOptions struct {
	// IDs gives the records' event IDs, e.g. the host's pipeline.Sequencer
	// shared with its other producers. Default: producer
	// "<Producer>@<boot time in Unix ns>" with sequences 1, 2, 3, …
	IDs EventIDs
	// Producer names this publisher when IDs is nil (the host ID); one of
	// the two is required.
	Producer string
	Topic    string           // default event.TopicRoutes
	Timeout  time.Duration    // per PublishRoute; default 2s
	Now      func() time.Time // event times and the default boot epoch; default time.Now
}

// clockIDs is the default EventIDs: the boot time makes a restarted
// host's producer identity new, so its (producer, sequence) pairs never
// repeat an earlier run's.
type clockIDs struct {
	producer string
	seq      atomic.Uint64
}

func (c *clockIDs) Next() event.ID { return event.ID{Producer: c.producer, Seq: c.seq.Add(1)} }

// NewKafkaRoutes returns a publisher producing through cl. The client should
// be idempotent (franz-go's default) so that a deleted record and its
// tombstone are never reordered by retries.
func NewKafkaRoutes(cl *kgo.Client, o KafkaRoutesOptions) (*KafkaRoutes, error) {
	if cl == nil {
		return nil, fmt.Errorf("%w: kafka routes: nil client", ErrInvalid)
	}
	if o.IDs == nil && o.Producer == "" {
		return nil, fmt.Errorf("%w: kafka routes: producer id or event ids are required", ErrInvalid)
	}
	if o.Topic == "" {
		o.Topic = event.TopicRoutes
	}
	if o.Timeout <= 0 {
		o.Timeout = 2 * time.Second
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.IDs == nil {
		o.IDs = &clockIDs{producer: o.Producer + "@" + strconv.FormatInt(o.Now().UnixNano(), 10)}
	}
	return &KafkaRoutes{
		cl: cl, topic: o.Topic, ids: o.IDs, timeout: o.Timeout, now: o.Now,
		records: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shoal_objecthost_route_feed_records_total",
			Help: "Route feed records produced, by kind (route, tombstone) and outcome (ok, error, timeout: PublishRoute gave up waiting)."}, []string{"kind", "outcome"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "shoal_objecthost_route_feed_publish_duration_seconds",
			Help: "Time PublishRoute waited for the broker.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)}),
	}, nil
}

// Describe and Collect make KafkaRoutes a prometheus.Collector; register it
// on the host's registry (Host.Registry) to export its series.
func (k *KafkaRoutes) Describe(ch chan<- *prometheus.Desc) {
	k.records.Describe(ch)
	k.latency.Describe(ch)
}

// Collect implements prometheus.Collector.
func (k *KafkaRoutes) Collect(ch chan<- prometheus.Metric) {
	k.records.Collect(ch)
	k.latency.Collect(ch)
}

// errPublishTimeout is returned when the broker did not acknowledge the
// route record within the timeout.
var errPublishTimeout = errors.New("route record not acknowledged in time")

// PublishRoute produces r (and, for a deleted route, its tombstone) and
// waits for the route record's acknowledgement, bounded by the timeout and
// ctx.
func (k *KafkaRoutes) PublishRoute(ctx context.Context, r Route) error {
	if r.DatabaseUUID == "" {
		return fmt.Errorf("%w: route without database uuid", ErrInvalid)
	}
	now := k.now()
	v, err := event.Encode(event.Route{
		V: event.Version, EventID: k.ids.Next(),
		DatabaseUUID: r.DatabaseUUID, ObjectID: r.ObjectID, HostAddress: r.HostAddress,
		AccountID: r.AccountID, State: r.State, Generation: r.Generation, Time: now.UnixMilli(),
	})
	if err != nil {
		return fmt.Errorf("encode route: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, k.timeout)
	defer cancel()
	start := time.Now()
	defer func() { k.latency.Observe(time.Since(start).Seconds()) }()

	// The promises write into buffered channels and return, so nothing is
	// left waiting when PublishRoute gives up at the deadline; a record
	// still in flight then completes into a channel nobody reads.
	routeDone, tombDone := make(chan error, 1), make(chan error, 1)
	key := []byte(r.DatabaseUUID)
	k.cl.Produce(ctx, &kgo.Record{Topic: k.topic, Key: key, Value: v}, func(_ *kgo.Record, err error) { routeDone <- err })
	if r.State == StateDeleted {
		// Same key, so same partition, produced after the deleted record:
		// the idempotent producer keeps them in this order.
		k.cl.Produce(ctx, &kgo.Record{Topic: k.topic, Key: key, Value: nil,
			Headers: []kgo.RecordHeader{{Key: RouteGenerationHeader, Value: strconv.AppendInt(nil, r.Generation, 10)}},
		}, func(_ *kgo.Record, err error) {
			k.records.WithLabelValues("tombstone", produced(err)).Inc()
			tombDone <- err
		})
	}
	select {
	case err := <-routeDone:
		k.records.WithLabelValues("route", produced(err)).Inc()
		if err != nil {
			return fmt.Errorf("publish route of %s: %w", r.DatabaseUUID, err)
		}
	case <-ctx.Done():
		k.records.WithLabelValues("route", "timeout").Inc()
		return fmt.Errorf("publish route of %s: %w: %w", r.DatabaseUUID, errPublishTimeout, ctx.Err())
	}
	if r.State == StateDeleted {
		// Give the tombstone the rest of the deadline (returning cancels
		// its context, which would fail it if it were still buffered); its
		// outcome is counted, not returned (see the type's contract).
		select {
		case <-tombDone:
		case <-ctx.Done():
		}
	}
	return nil
}

// produced is the outcome label of a produce promise.
func produced(err error) string {
	if err != nil {
		return "error"
	}
	return "ok"
}
