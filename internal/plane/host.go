package plane

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/shoaldb/shoal/objecthost"
	"github.com/shoaldb/shoal/pipeline"
)

// HostConfig configures an object host's side of the plane.
type HostConfig struct {
	Kafka Kafka
	// Dir holds the plane's state of this host: the event-ID sequencer and
	// the producer's spill (Dir/spill). Keep it on the host's data disk
	// (objecthost data dir/pipeline).
	Dir    string
	HostID string
	// Registerer receives the producer's, the aggregators' and the route
	// publisher's metrics (optional; the host's registry, so they are on
	// its /metrics).
	Registerer prometheus.Registerer
	Logger     *slog.Logger
	// SpillMaxBytes bounds the producer's spill (0: the producer's default).
	SpillMaxBytes int64
}

// Host is an object host's producer side: the usage and size aggregators
// feeding one producer, and the route publisher. Nothing here waits for the
// brokers: the producer spills while they are away.
type Host struct {
	log      *slog.Logger
	reg      prometheus.Registerer
	producer *pipeline.Producer
	usage    *pipeline.UsageAggregator
	sizes    *pipeline.SizeAggregator
	routesCl *kgo.Client
	routes   *objecthost.KafkaRoutes
	kafka    Kafka // for the limits feed's client (Apply)
}

// StartHost opens the sequencer and the spill and starts the producer.
// On error everything started is stopped.
func StartHost(cfg HostConfig) (_ *Host, err error) {
	if !cfg.Kafka.Enabled() {
		return nil, fmt.Errorf("plane: no Kafka brokers")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	h := &Host{log: cfg.Logger, reg: cfg.Registerer, kafka: cfg.Kafka}
	defer func() {
		if err != nil {
			h.Close()
		}
	}()
	opts, err := cfg.Kafka.Options()
	if err != nil {
		return nil, err
	}
	ids, err := pipeline.OpenSequencer(cfg.Dir, cfg.HostID)
	if err != nil {
		return nil, err
	}
	h.producer, err = pipeline.New(pipeline.Config{Brokers: cfg.Kafka.Brokers, ClientOptions: opts,
		SpillDir: filepath.Join(cfg.Dir, "spill"), MaxSpillBytes: cfg.SpillMaxBytes,
		Logger: cfg.Logger, Registerer: cfg.Registerer})
	if err != nil {
		return nil, fmt.Errorf("usage producer: %w", err)
	}
	// Usage events get a sequence of their own (contiguous per producer
	// identity), so the reconciler can count, in ClickHouse, the events
	// that never arrived (chsink.Store.Gaps); sizes and routes share ids.
	usageIDs := pipeline.NewSequencer(ids.Producer() + "/usage")
	h.usage = pipeline.NewUsageAggregator(h.producer, usageIDs, pipeline.UsageConfig{Host: cfg.HostID, Logger: cfg.Logger, Registerer: cfg.Registerer})
	h.sizes = pipeline.NewSizeAggregator(h.producer, ids, pipeline.SizeConfig{Host: cfg.HostID, Logger: cfg.Logger, Registerer: cfg.Registerer})
	if h.routesCl, err = cfg.Kafka.Client(); err != nil {
		return nil, err
	}
	if h.routes, err = objecthost.NewKafkaRoutes(h.routesCl, objecthost.KafkaRoutesOptions{IDs: ids}); err != nil {
		return nil, err
	}
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(h.routes); err != nil {
			return nil, fmt.Errorf("route publisher metrics: %w", err)
		}
	}
	return h, nil
}

// Apply sets the host configuration's usage, size and route sinks and its
// limits feed (the host consumes the limiter's flags with a client of its
// own, built with the plane's connection options).
func (h *Host) Apply(c *objecthost.Config) {
	sinks := objecthost.PipelineSinks{Usage: h.usage, Sizes: h.sizes}
	c.Usage, c.Sizes, c.Routes = sinks, sinks, h.routes
	c.LimitsFeed = &objecthost.LimitsFeedOptions{NewClient: h.kafka.Client}
}

// Producer is the host's producer (for status and tests).
func (h *Host) Producer() *pipeline.Producer { return h.producer }

// Close runs after the object host is closed: the aggregators flush their
// last window into the producer, the producer delivers (or spills) within
// 5 s, then the route publisher's client closes.
func (h *Host) Close() {
	if h.usage != nil {
		h.usage.Close()
	}
	if h.sizes != nil {
		h.sizes.Close()
	}
	if h.producer != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := h.producer.Close(ctx); err != nil {
			h.log.Warn("usage producer closed with records spilled; they are replayed at the next start", "err", err)
		}
		cancel()
	}
	if h.routes != nil && h.reg != nil {
		h.reg.Unregister(h.routes)
	}
	if h.routesCl != nil {
		h.routesCl.Close()
	}
}
