package raftmeta

import (
	"errors"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shoaldb/shoal/internal/pki"
	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// Config configures a Node. Zero durations and counts take the defaults
// documented on each field.
type Config struct {
	ID  string // Raft server ID, unique and stable for the node's life
	Dir string // data directory: raft-wal/ (or raft.db), snapshots/, fsm/

	// LogStore is the Raft log: LogStoreWAL (raft-wal, the default for a
	// new directory) or LogStoreBolt (raft-boltdb/v2). A directory that
	// already holds one keeps it; naming the other kind for it is
	// ErrLogStoreMismatch.
	LogStore string

	// TLS, when set, authenticates every peer with the cluster's
	// certificates (internal/pki): the HTTP API and the Raft port require
	// a client certificate, the Raft port and joins the catalog role, and
	// each HTTP route the roles of authz.go. Nil: plain TCP (insecure).
	TLS *pki.Loader

	RaftAddr      string // bind address of the Raft port (Raft RPCs + node metadata)
	RaftAdvertise string // address peers dial; default RaftAddr
	HTTPAddr      string // bind address of the internal HTTP API
	HTTPAdvertise string // address other nodes and clients use; default the bound address

	// Bootstrap makes a node with no Raft state the single voter of a new
	// cluster. Ignored when state exists (a restart).
	Bootstrap bool
	// Join lists HTTP addresses of existing members; a node with no Raft
	// state asks them (following the leader) to add it. Ignored on restart.
	Join []string
	// NonVoter joins as a non-voting read follower.
	NonVoter bool

	// MaxStale bounds stale reads in time: a follower whose last
	// AppendEntries from the leader (which carries the leader's commit
	// index) is older refuses them with ErrTooStale. Default 5 s. A request
	// may ask for a tighter bound, never a looser one. Stale reads are also
	// bounded in log position: see StaleCatchUp.
	MaxStale time.Duration
	// StaleCatchUp is how long a stale read waits for the node to apply the
	// commit index the leader last told it before refusing with
	// ErrNotReady (a node replaying its log after a restart, or catching up
	// after a partition). Default 100 ms: in steady state the gap is one
	// batch in flight and closes in well under that.
	StaleCatchUp time.Duration

	SnapshotThreshold uint64        // log entries between snapshots; default 8192
	SnapshotInterval  time.Duration // how often the threshold is checked; default 30 s
	TrailingLogs      uint64        // entries kept after a snapshot; default 10240

	HeartbeatTimeout   time.Duration // default 1 s (loopback/LAN)
	ElectionTimeout    time.Duration // default 1 s
	LeaderLeaseTimeout time.Duration // default 500 ms
	CommitTimeout      time.Duration // default 10 ms: followers learn the commit index quickly
	MaxAppendEntries   int           // default 512

	ApplyTimeout  time.Duration // one proposal's enqueue+commit bound; default 10 s
	ReadTimeout   time.Duration // default bound on waiting for a read index; 5 s
	DrainInterval time.Duration // stats drain loop period; default 1 s; <0 disables
	// AuditRetention is how long the audit log keeps rows (default 90
	// days; <0 keeps them forever). The leader prunes hourly.
	AuditRetention time.Duration
	JoinTimeout    time.Duration // default 30 s
	// LevelCheckInterval is how often the leader asks every server for the
	// catalog level its build knows and raises the cluster's level when all
	// know a higher one (level.go); also after every leadership change.
	// Default 10 s; <0 disables.
	LevelCheckInterval time.Duration
	// LevelCheckTimeout bounds each server's answer to that question
	// (default 2 s): a server slower than that counts as not answering.
	LevelCheckTimeout time.Duration

	FSMOptions []fsm.Option

	// Now is the clock used for staleness; default time.Now. Raft's own
	// timers use the real clock.
	Now func() time.Time
	// Logger receives the node's own logs; default slog to stderr.
	Logger *slog.Logger
	// hashicorp/raft's logs (and its log store's) go through Logger, with
	// component=raft and the node's id, at RaftLogLevel (default "warn";
	// Logger's own level applies too): one format for the whole process.
	// RaftLogOutput, when set, sends them to that writer in hclog's own
	// text format instead (tests pass io.Discard).
	RaftLogOutput io.Writer
	RaftLogLevel  string
	// Collectors are registered on the node's Prometheus registry (served
	// at /metrics) besides its own metrics: the binary adds the Go runtime,
	// process and build_info collectors, as on every role.
	Collectors []prometheus.Collector
}

const (
	// logCacheEntries is how many of the newest Raft log entries are kept
	// in memory for replication: comfortably more than a few batches in
	// flight (MaxAppendEntries is 512).
	logCacheEntries = 4096
	defaultMaxStale = 5 * time.Second
	maxBodyBytes    = 1 << 20
)

func (c *Config) withDefaults() (Config, error) {
	cfg := *c
	if cfg.ID == "" {
		return cfg, errors.New("raftmeta: node ID required")
	}
	if cfg.Dir == "" {
		return cfg, errors.New("raftmeta: data directory required")
	}
	if cfg.RaftAddr == "" {
		return cfg, errors.New("raftmeta: raft address required")
	}
	if cfg.HTTPAddr == "" {
		return cfg, errors.New("raftmeta: HTTP address required")
	}
	if cfg.Bootstrap && len(cfg.Join) > 0 {
		return cfg, errors.New("raftmeta: bootstrap and join are exclusive")
	}
	if cfg.Bootstrap && cfg.NonVoter {
		return cfg, errors.New("raftmeta: a non-voter cannot bootstrap a cluster")
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&cfg.MaxStale, defaultMaxStale)
	def(&cfg.StaleCatchUp, 100*time.Millisecond)
	def(&cfg.SnapshotInterval, 30*time.Second)
	def(&cfg.HeartbeatTimeout, time.Second)
	def(&cfg.ElectionTimeout, time.Second)
	def(&cfg.LeaderLeaseTimeout, 500*time.Millisecond)
	def(&cfg.CommitTimeout, 10*time.Millisecond)
	def(&cfg.ApplyTimeout, 10*time.Second)
	def(&cfg.ReadTimeout, 5*time.Second)
	def(&cfg.DrainInterval, time.Second)
	def(&cfg.AuditRetention, 90*24*time.Hour)
	def(&cfg.JoinTimeout, 30*time.Second)
	def(&cfg.LevelCheckInterval, 10*time.Second)
	def(&cfg.LevelCheckTimeout, 2*time.Second)
	if cfg.SnapshotThreshold == 0 {
		cfg.SnapshotThreshold = 8192
	}
	if cfg.TrailingLogs == 0 {
		cfg.TrailingLogs = 10240
	}
	if cfg.MaxAppendEntries == 0 {
		cfg.MaxAppendEntries = 512
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	if cfg.RaftLogLevel == "" {
		cfg.RaftLogLevel = "warn"
	}
	if cfg.RaftAdvertise == "" {
		cfg.RaftAdvertise = cfg.RaftAddr
	}
	cfg.Logger = cfg.Logger.With("node", cfg.ID)
	return cfg, nil
}
