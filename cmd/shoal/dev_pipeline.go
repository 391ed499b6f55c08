package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shoaldb/shoal/edge"
	"github.com/shoaldb/shoal/edge/chinsights"
	"github.com/shoaldb/shoal/internal/plane"
	"github.com/shoaldb/shoal/limiter"
	"github.com/shoaldb/shoal/objecthost"
	"github.com/shoaldb/shoal/pipeline/broker"
	"github.com/shoaldb/shoal/pipeline/chlocal"
	"github.com/shoaldb/shoal/raftmeta"
	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// devPipeline is the background plane of `shoal dev`: an embedded
// Kafka-protocol broker (kfake over TCP, data under DIR/kafka) with the
// topics, a managed clickhouse-server (data under DIR/clickhouse; when it
// cannot start, analytics is off and everything else runs), the object
// host's producer side (spill under DIR/objecthost/pipeline), and the
// pipeline role's consumers (storage consumer, ClickHouse sink, storage
// snapshotter) and the limiter. The edge's route feed, insights and
// account-change publication are configured from it.
type devPipeline struct {
	log        *slog.Logger
	broker     *broker.Broker
	clickhouse *chlocal.Server
	chErr      error // why analytics is off
	host       *plane.Host
	consumers  *plane.Consumers
	limiter    *limiter.Limiter
	accounts   *plane.AccountPublisher
	kafka      plane.Kafka
}

// startDevPipeline starts the broker on brokerAddr, ClickHouse on chAddr,
// the host side registering on hostReg and the consumers on reg. On error
// everything started is stopped.
func startDevPipeline(ctx context.Context, dir, brokerAddr, chAddr, hostID string, catalog, limiterCatalog *raftmeta.Client,
	hostReg, reg prometheus.Registerer, logger *slog.Logger) (_ *devPipeline, err error) {
	p := &devPipeline{log: logger}
	defer func() {
		if err != nil {
			p.Close()
		}
	}()
	if p.broker, err = plane.StartBroker(brokerAddr, filepath.Join(dir, "kafka"), logger); err != nil {
		return nil, err
	}
	p.kafka = plane.Kafka{Brokers: []string{p.broker.Addr()}}

	var ch *plane.ClickHouse
	srv, chc, err := plane.StartClickHouse(ctx, chAddr, filepath.Join(dir, "clickhouse"), logger)
	if err != nil {
		p.chErr = err
	} else {
		p.clickhouse, ch = srv, &chc
	}

	p.host, err = plane.StartHost(plane.HostConfig{Kafka: p.kafka, Dir: filepath.Join(dir, "objecthost", "pipeline"),
		HostID: hostID, Registerer: hostReg, Logger: logger})
	if err != nil {
		return nil, err
	}
	p.consumers, err = plane.StartConsumers(ctx, plane.ConsumersConfig{Kafka: p.kafka, Catalog: catalog,
		ClickHouse: ch, Registerer: reg, Logger: logger})
	if err != nil {
		return nil, err
	}
	if p.accounts, err = plane.NewAccountPublisher(p.kafka, "dev-edge"); err != nil {
		return nil, err
	}
	// The limiter needs the usage in ClickHouse: free-tier daily row
	// limits (notices go to the log: no SMTP or webhook in dev).
	if st := p.consumers.Store(); st != nil {
		p.limiter, err = limiter.Start(limiter.Config{Kafka: p.kafka, Store: st, Catalog: limiterCatalog, Registerer: reg, Logger: logger})
		if err != nil {
			return nil, fmt.Errorf("limiter: %w", err)
		}
	}
	return p, nil
}

// accountChanged is the edge's AccountChanged hook: tier changes on the
// accounts topic.
func (p *devPipeline) accountChanged(ctx context.Context, a fsm.Account) error {
	return p.accounts.Publish(ctx, a)
}

// hostSinks are the object host's usage, size and route sinks.
func (p *devPipeline) hostSinks(c *objecthost.Config) { p.host.Apply(c) }

// routeFeed is the edge's route feed configuration.
func (p *devPipeline) routeFeed() *edge.RouteFeedOptions {
	return &edge.RouteFeedOptions{Brokers: p.kafka.Brokers}
}

// insights is the edge's query-insights source (nil: analytics off).
func (p *devPipeline) insights() edge.InsightsSource {
	if st := p.consumers.Store(); st != nil {
		return chinsights.NewSource(st)
	}
	return nil
}

// analyticsLine is the banner's one line about ClickHouse.
func (p *devPipeline) analyticsLine(out io.Writer) {
	switch {
	case p.clickhouse != nil:
		fmt.Fprintf(out, "  Analytics   ClickHouse %s (database shoal: requests, query_shapes, storage_snapshots); limiter on (free-tier daily row limits)\n", p.clickhouse.Addr())
	case errors.Is(p.chErr, chlocal.ErrNotInstalled):
		fmt.Fprintf(out, "  Analytics   OFF: clickhouse-server is not installed (sudo apt-get install clickhouse-server, or make deps); everything else runs\n")
	default:
		fmt.Fprintf(out, "  Analytics   OFF: clickhouse-server did not start (%v); everything else runs\n", p.chErr)
	}
}

// Close stops the plane after the host and the edge are closed: the host
// side flushes (or spills) its last window, the consumers commit what they
// wrote, then ClickHouse and the broker stop.
func (p *devPipeline) Close() {
	if p.host != nil {
		p.host.Close()
	}
	if p.limiter != nil {
		p.limiter.Close()
	}
	if p.accounts != nil {
		p.accounts.Close()
	}
	if p.consumers != nil {
		p.consumers.Close()
	}
	if p.clickhouse != nil {
		if err := p.clickhouse.Close(); err != nil {
			p.log.Warn("clickhouse-server stopped with an error", "err", err)
		}
	}
	if p.broker != nil {
		p.broker.Close()
	}
}
