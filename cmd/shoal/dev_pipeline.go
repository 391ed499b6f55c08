package main

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/shoaldb/shoal/edge"
	"github.com/shoaldb/shoal/objecthost"
	"github.com/shoaldb/shoal/pipeline"
	"github.com/shoaldb/shoal/pipeline/broker"
	"github.com/shoaldb/shoal/pipeline/storage"
	"github.com/shoaldb/shoal/raftmeta"
)

// devPipeline is the background plane of `shoal dev`: an embedded
// Kafka-protocol broker (kfake over TCP, data under DIR/kafka), the topics,
// the object host's producer (spill under DIR/objecthost/pipeline/spill) with its
// usage and size aggregators and its route publisher, and the storage
// consumer writing sizes into the catalog. The edge's route feed is
// configured from Brokers.
type devPipeline struct {
	log      *slog.Logger
	broker   *broker.Broker
	producer *pipeline.Producer
	usage    *pipeline.UsageAggregator
	sizes    *pipeline.SizeAggregator
	routesCl *kgo.Client
	routes   *objecthost.KafkaRoutes
	storage  *storage.Consumer
	cancel   context.CancelFunc
	done     chan struct{}
}

// startDevPipeline starts the broker on addr and everything that needs
// only the broker and the catalog. On error everything started is stopped.
func startDevPipeline(ctx context.Context, dir, addr, hostID string, catalog *raftmeta.Client, logger *slog.Logger) (_ *devPipeline, err error) {
	p := &devPipeline{log: logger, done: make(chan struct{})}
	defer func() {
		if err != nil {
			p.Close()
		}
	}()
	p.broker, err = broker.Start(broker.Config{Addr: addr, DataDir: filepath.Join(dir, "kafka"), Logger: logger})
	if err != nil {
		return nil, fmt.Errorf("embedded Kafka-protocol broker on %s: %w", addr, err)
	}
	brokers := []string{p.broker.Addr()}
	admin, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return nil, err
	}
	tctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	err = pipeline.EnsureTopics(tctx, admin, pipeline.DefaultTopics()...)
	cancel()
	admin.Close()
	if err != nil {
		return nil, fmt.Errorf("create topics: %w", err)
	}

	pdir := filepath.Join(dir, "objecthost", "pipeline")
	spill := filepath.Join(pdir, "spill")
	ids, err := pipeline.OpenSequencer(pdir, hostID)
	if err != nil {
		return nil, err
	}
	p.producer, err = pipeline.New(pipeline.Config{Brokers: brokers, SpillDir: spill, Logger: logger})
	if err != nil {
		return nil, fmt.Errorf("usage producer: %w", err)
	}
	p.usage = pipeline.NewUsageAggregator(p.producer, ids, pipeline.UsageConfig{Host: hostID, Logger: logger})
	p.sizes = pipeline.NewSizeAggregator(p.producer, ids, pipeline.SizeConfig{Host: hostID, Logger: logger})
	p.routesCl, err = kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return nil, err
	}
	p.routes, err = objecthost.NewKafkaRoutes(p.routesCl, objecthost.KafkaRoutesOptions{IDs: ids})
	if err != nil {
		return nil, err
	}
	p.storage, err = storage.New(storage.Config{Brokers: brokers, Catalog: catalog, Logger: logger})
	if err != nil {
		return nil, fmt.Errorf("storage consumer: %w", err)
	}
	rctx, rcancel := context.WithCancel(context.WithoutCancel(ctx))
	p.cancel = rcancel
	go func() {
		defer close(p.done)
		if err := p.storage.Run(rctx); err != nil {
			logger.Error("storage consumer stopped", "err", err)
		}
	}()
	return p, nil
}

// hostSinks are the object host's usage, size and route sinks.
func (p *devPipeline) hostSinks(c *objecthost.Config) {
	sinks := objecthost.PipelineSinks{Usage: p.usage, Sizes: p.sizes}
	c.Usage, c.Sizes, c.Routes = sinks, sinks, p.routes
}

// routeFeed is the edge's route feed configuration.
func (p *devPipeline) routeFeed() *edge.RouteFeedOptions {
	return &edge.RouteFeedOptions{Brokers: []string{p.broker.Addr()}}
}

// Close stops the plane after the host and the edge are closed: the
// aggregators flush their last window into the producer, the producer
// flushes (or spills) within a bound, then the consumer and the broker stop.
func (p *devPipeline) Close() {
	if p.usage != nil {
		p.usage.Close()
	}
	if p.sizes != nil {
		p.sizes.Close()
	}
	if p.producer != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := p.producer.Close(ctx); err != nil {
			p.log.Warn("usage producer closed with records spilled", "err", err)
		}
		cancel()
	}
	if p.routesCl != nil {
		p.routesCl.Close()
	}
	if p.storage != nil {
		_ = p.storage.Close()
		if p.cancel != nil {
			p.cancel()
			<-p.done
		}
	}
	if p.broker != nil {
		p.broker.Close()
	}
}
