package plane

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/shoaldb/shoal/pipeline"
	"github.com/shoaldb/shoal/pipeline/chsink"
	"github.com/shoaldb/shoal/pipeline/snapshot"
	"github.com/shoaldb/shoal/pipeline/storage"
	"github.com/shoaldb/shoal/raftmeta"
)

// ClickHouse is where the analytics tables live.
type ClickHouse struct {
	Options  *clickhouse.Options
	Database string // default chsink.DefaultDatabase
}

// ParseClickHouseDSN reads clickhouse://user:pass@host:9000/db?… (the
// driver's DSN). The path names the database of Shoal's tables (default
// "shoal"); the connection itself starts in the server's default
// database, since the tables' database is created by the schema.
func ParseClickHouseDSN(dsn string) (ClickHouse, error) {
	o, err := clickhouse.ParseDSN(dsn)
	if err != nil {
		return ClickHouse{}, fmt.Errorf("clickhouse dsn: %w", err)
	}
	db := o.Auth.Database
	if db == "" || db == "default" {
		db = chsink.DefaultDatabase
	}
	o.Auth.Database = ""
	return ClickHouse{Options: o, Database: db}, nil
}

// ConsumersConfig configures the pipeline role's consumers.
type ConsumersConfig struct {
	Kafka   Kafka
	Catalog *raftmeta.Client
	// ClickHouse, when set, starts the ClickHouse sink (usage → requests,
	// query_shapes) and the storage snapshotter. Nil: analytics off; the storage consumer still runs.
	ClickHouse *ClickHouse
	// StorageConsumers is the number of storage consumer members (default 1).
	StorageConsumers int
	// SnapshotInterval is the storage snapshotter's period (catalog sizes
	// into storage_snapshots; default 1 h). Runs with ClickHouse only.
	SnapshotInterval time.Duration
	// ReconcileInterval is how often ClickHouse is reconciled with the
	// producers' sequences (default 1 min; reconcile.go).
	ReconcileInterval time.Duration
	Registerer        prometheus.Registerer
	Logger            *slog.Logger
	// Stalled, when set, stalls the storage consumer and the ClickHouse
	// sink while it returns true (storage.Config.Stalled): the fault
	// tests' stopped consumer with the brokers up. Nil in production.
	Stalled func() bool
}

// Consumers are the consumer groups of one pipeline process: the storage
// consumer (sizes → catalog) and, with ClickHouse, the ClickHouse sink and
// the storage snapshotter (catalog sizes → storage_snapshots).
type Consumers struct {
	log     *slog.Logger
	storage *storage.Consumer
	store   *chsink.Store
	sink    *chsink.Sink
	snap    *snapshot.Snapshotter
	recon   *reconciler
	chDB    string

	cancel context.CancelFunc
	done   chan struct{}

	mu      sync.Mutex
	stopped bool
}

// StartConsumers ensures the topics (retrying while the brokers are away,
// within ctx) and starts every consumer. It does not wait for ClickHouse:
// the sink creates its schema when the server answers.
func StartConsumers(ctx context.Context, cfg ConsumersConfig) (_ *Consumers, err error) {
	if !cfg.Kafka.Enabled() {
		return nil, errors.New("plane: no Kafka brokers")
	}
	if cfg.Catalog == nil {
		return nil, errors.New("plane: no catalog")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	c := &Consumers{log: cfg.Logger, done: make(chan struct{})}
	defer func() {
		if err != nil {
			c.Close()
		}
	}()
	if err := EnsureTopics(ctx, cfg.Kafka, cfg.Logger); err != nil {
		return nil, err
	}
	opts, err := cfg.Kafka.Options()
	if err != nil {
		return nil, err
	}
	// A member that dies without leaving (kill -9, a lost machine) holds
	// its partitions until the group's session timeout: 10 s (Kafka's
	// classic default) instead of franz-go's 45 s, so a restarted or
	// surviving member resumes within seconds. Heartbeats go every 3 s.
	opts = append(opts, kgo.SessionTimeout(10*time.Second))
	c.storage, err = storage.New(storage.Config{Brokers: cfg.Kafka.Brokers, ClientOptions: opts, Catalog: cfg.Catalog,
		Consumers: cfg.StorageConsumers, Registerer: cfg.Registerer, Logger: cfg.Logger, Stalled: cfg.Stalled})
	if err != nil {
		return nil, fmt.Errorf("storage consumer: %w", err)
	}
	if ch := cfg.ClickHouse; ch != nil {
		c.chDB = ch.Database
		c.store, err = chsink.Open(chsink.StoreConfig{Options: ch.Options, Database: ch.Database, Logger: quietDriver(cfg.Logger)})
		if err != nil {
			return nil, err
		}
		// Best effort, bounded: the tables exist before the readers
		// (snapshotter, reconciler, limiter, insights) first ask; the sink
		// creates them itself anyway, retrying while ClickHouse is down.
		sctx, scancel := context.WithTimeout(ctx, 5*time.Second)
		if err := c.store.EnsureSchema(sctx); err != nil {
			cfg.Logger.Warn("clickhouse schema not created yet (the sink retries)", "err", err)
		}
		scancel()
		c.sink, err = chsink.Start(chsink.Config{Brokers: cfg.Kafka.Brokers, ClientOptions: opts, Store: c.store,
			Registerer: cfg.Registerer, Logger: cfg.Logger, Stalled: cfg.Stalled})
		if err != nil {
			return nil, fmt.Errorf("clickhouse sink: %w", err)
		}
		c.snap, err = snapshot.Start(snapshot.Config{Catalog: cfg.Catalog, Store: c.store, Interval: cfg.SnapshotInterval,
			Registerer: cfg.Registerer, Logger: cfg.Logger})
		if err != nil {
			return nil, fmt.Errorf("storage snapshotter: %w", err)
		}
		c.recon = startReconciler(c.store, cfg.ReconcileInterval, cfg.Registerer, cfg.Logger)
	}
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	c.cancel = cancel
	go func() {
		defer close(c.done)
		if err := c.storage.Run(rctx); err != nil {
			cfg.Logger.Error("storage consumer stopped", "err", err)
		}
	}()
	return c, nil
}

// quietDriver drops clickhouse-go's debug chatter (it logs at Warn that
// 18.16 is below its supported minimum on every connection).
func quietDriver(l *slog.Logger) *slog.Logger {
	return slog.New(levelFloor{l.Handler(), slog.LevelError})
}

// EnsureTopics creates the plane's topics (pipeline.DefaultTopics) that do
// not exist, retrying while the brokers do not answer, until ctx ends.
func EnsureTopics(ctx context.Context, k Kafka, log *slog.Logger) error {
	cl, err := k.Client()
	if err != nil {
		return err
	}
	defer cl.Close()
	for attempt := 0; ; attempt++ {
		tctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err = pipeline.EnsureTopics(tctx, cl, pipeline.DefaultTopics()...)
		cancel()
		if err == nil {
			return nil
		}
		if attempt == 0 {
			log.Warn("creating the pipeline's topics failed; retrying", "brokers", strings.Join(k.Brokers, ","), "err", err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("create topics on %s: %w", strings.Join(k.Brokers, ","), err)
		case <-time.After(time.Second):
		}
	}
}

// Store is the ClickHouse store (nil without ClickHouse): the edge's
// insights and the limiter read through it.
func (c *Consumers) Store() *chsink.Store { return c.store }

// Status is what `shoal pipeline status` and /v1/status show.
type Status struct {
	Storage    storage.Stats `json:"storage"`
	ClickHouse *SinkStatus   `json:"clickhouse,omitempty"`
}

// SinkStatus is the ClickHouse sink's state.
type SinkStatus struct {
	Database  string       `json:"database"`
	Reachable bool         `json:"reachable"`
	Error     string       `json:"error,omitempty"`
	Sink      chsink.Stats `json:"sink"`
	// Snapshots is the storage snapshotter (catalog sizes into
	// storage_snapshots).
	Snapshots snapshot.Stats `json:"snapshots"`
	// Reconcile is the last comparison of ClickHouse with the producers'
	// sequences (reconcile.go).
	Reconcile ReconcileStatus `json:"reconcile"`
}

// Status reports the consumers' counters and pings ClickHouse (bounded by
// ctx).
func (c *Consumers) Status(ctx context.Context) Status {
	st := Status{Storage: c.storage.Stats()}
	if c.sink != nil {
		s := &SinkStatus{Database: c.chDB, Sink: c.sink.Stats(), Snapshots: c.snap.Stats(), Reconcile: c.recon.status(), Reachable: true}
		if err := c.store.Ping(ctx); err != nil {
			s.Reachable, s.Error = false, err.Error()
		}
		st.ClickHouse = s
	}
	return st
}

// Close stops the ClickHouse sink (it inserts and commits the batch in
// hand within its shutdown timeout), then the storage consumer.
func (c *Consumers) Close() {
	c.mu.Lock()
	if c.stopped {
		c.mu.Unlock()
		return
	}
	c.stopped = true
	c.mu.Unlock()
	if c.recon != nil {
		c.recon.close()
	}
	if c.snap != nil {
		if err := c.snap.Close(); err != nil {
			c.log.Warn("storage snapshotter closed with an error", "err", err)
		}
	}
	if c.sink != nil {
		if err := c.sink.Close(); err != nil {
			c.log.Warn("clickhouse sink closed with an error", "err", err)
		}
	}
	if c.store != nil {
		_ = c.store.Close()
	}
	if c.storage != nil {
		_ = c.storage.Close()
		if c.cancel != nil {
			c.cancel()
			<-c.done
		}
	}
}

// levelFloor passes records at or above min to h.
type levelFloor struct {
	h   slog.Handler
	min slog.Level
}

func (f levelFloor) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= f.min && f.h.Enabled(ctx, l)
}
func (f levelFloor) Handle(ctx context.Context, r slog.Record) error { return f.h.Handle(ctx, r) }
func (f levelFloor) WithAttrs(a []slog.Attr) slog.Handler {
	return levelFloor{f.h.WithAttrs(a), f.min}
}
func (f levelFloor) WithGroup(n string) slog.Handler { return levelFloor{f.h.WithGroup(n), f.min} }
