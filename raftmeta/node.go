package raftmeta

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	"golang.org/x/sync/singleflight"

	"github.com/shoaldb/shoal/internal/ids"
	"github.com/shoaldb/shoal/internal/logging"
	"github.com/shoaldb/shoal/internal/pki"
	v4 "github.com/shoaldb/shoal/internal/v4"
	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// Node is one member of the catalog's Raft group: the Raft instance, its
// stores and transport, the catalog FSM, the internal HTTP API and the
// leader's background loops. All methods are safe for concurrent use.
type Node struct {
	cfg Config
	log interface {
		Info(string, ...any)
		Warn(string, ...any)
		Error(string, ...any)
	}

	cat *fsm.FSM
	fsm *instrumentedFSM
	// noBatchEntries (tests only: the A/B of TestBenchBatchEntry) makes
	// the leader propose batches as N entries even at catalog level 3.
	noBatchEntries atomic.Bool
	raft           *raft.Raft
	store          logStore
	snaps          *raft.FileSnapshotStore
	trans          *commitWatch // Raft's NetworkTransport, watching leader commit indexes
	mux            *muxLayer
	metrics        *metrics

	httpLn   net.Listener
	httpSrv  *http.Server
	inflight sync.WaitGroup // HTTP handlers running
	httpAddr string
	hc       *http.Client

	metaMu sync.Mutex
	meta   map[string]nodeMeta // raft address → metadata, learned on demand

	readyTerm   atomic.Uint64 // term whose leader no-op this node has applied
	readyGroup  singleflight.Group
	readyTarget atomic.Uint64 // commit index to reach before /readyz says ready
	readySeen   atomic.Bool

	// levelMu serialises the leader's level raise with joins (level.go).
	levelMu sync.Mutex

	ctx       context.Context
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error
}

// NewNode opens (or creates) the node's state in cfg.Dir, starts Raft and
// the HTTP API, bootstraps or joins as configured, and returns. On error
// everything started is stopped again.
func NewNode(c Config) (_ *Node, err error) {
	cfg, err := c.withDefaults()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("create data dir: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	// n is a local, not the named result: `return nil, err` clears the
	// result before the deferred cleanup, whose closers still need n.
	n := &Node{cfg: cfg, log: cfg.Logger, meta: map[string]nodeMeta{}, ctx: ctx, cancel: cancel}
	var closers []func()
	defer func() {
		if err != nil {
			cancel()
			for i := len(closers) - 1; i >= 0; i-- {
				closers[i]()
			}
		}
	}()

	n.cat, err = fsm.New(filepath.Join(cfg.Dir, "fsm"), cfg.FSMOptions...)
	if err != nil {
		return nil, fmt.Errorf("open catalog fsm: %w", err)
	}
	closers = append(closers, func() { n.cat.Close() })
	n.fsm = newInstrumentedFSM(n.cat, func() *metrics { return n.metrics }, cfg.Logger)

	hlog := logging.HCLog(cfg.Logger, "raft", hclog.LevelFromString(cfg.RaftLogLevel))
	if cfg.RaftLogOutput != nil {
		hlog = hclog.New(&hclog.LoggerOptions{
			Name: "raft." + cfg.ID, Output: cfg.RaftLogOutput, Level: hclog.LevelFromString(cfg.RaftLogLevel),
		})
	}
	kind, err := chooseLogStore(cfg.Dir, cfg.LogStore)
	if err != nil {
		return nil, err
	}
	n.store, err = openLogStore(cfg.Dir, kind, hlog)
	if err != nil {
		return nil, fmt.Errorf("open raft log store (%s): %w", kind, err)
	}
	closers = append(closers, func() { n.store.Close() })

	n.snaps, err = raft.NewFileSnapshotStoreWithLogger(cfg.Dir, 2, hlog)
	if err != nil {
		return nil, fmt.Errorf("open snapshot store: %w", err)
	}

	// The HTTP listener first: the Raft port's metadata answer names it.
	n.httpLn, err = net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return nil, fmt.Errorf("listen http %s: %w", cfg.HTTPAddr, err)
	}
	closers = append(closers, func() { n.httpLn.Close() })
	n.httpAddr = cfg.HTTPAdvertise
	if n.httpAddr == "" {
		n.httpAddr = n.httpLn.Addr().String()
	}

	raftLn, err := net.Listen("tcp", cfg.RaftAddr)
	if err != nil {
		return nil, fmt.Errorf("listen raft %s: %w", cfg.RaftAddr, err)
	}
	adv := cfg.RaftAdvertise
	if adv == cfg.RaftAddr {
		adv = raftLn.Addr().String() // resolves ":0" in tests
	}
	n.mux, err = newMuxLayer(raftLn, adv, n.selfMeta, cfg.TLS)
	if err != nil {
		raftLn.Close()
		return nil, err
	}
	closers = append(closers, func() { n.mux.Close() })
	n.trans = newCommitWatch(raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream: n.mux, MaxPool: 8, Timeout: 10 * time.Second, Logger: hlog,
	}), cfg.Now)
	closers = append(closers, func() { n.trans.Close() })

	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(cfg.ID)
	rc.Logger = hlog
	rc.HeartbeatTimeout = cfg.HeartbeatTimeout
	rc.ElectionTimeout = cfg.ElectionTimeout
	rc.LeaderLeaseTimeout = cfg.LeaderLeaseTimeout
	rc.CommitTimeout = cfg.CommitTimeout
	rc.MaxAppendEntries = cfg.MaxAppendEntries
	rc.BatchApplyCh = true // concurrent proposals share one log append + fsync
	rc.SnapshotThreshold = cfg.SnapshotThreshold
	rc.SnapshotInterval = cfg.SnapshotInterval
	rc.TrailingLogs = cfg.TrailingLogs
	if err := raft.ValidateConfig(rc); err != nil {
		return nil, fmt.Errorf("raft config: %w", err)
	}

	hasState, err := raft.HasExistingState(n.store, n.store, n.snaps)
	if err != nil {
		return nil, fmt.Errorf("inspect raft state: %w", err)
	}
	// The log cache keeps the newest entries in memory: replication to
	// followers re-reads every entry it sends, and without the cache each
	// read is a system call into the log store (6% of the leader's CPU at
	// 16 writers, measured).
	logs, err := raft.NewLogCache(logCacheEntries, n.store)
	if err != nil {
		return nil, fmt.Errorf("log cache: %w", err)
	}
	// Metrics before Raft: the FSM goroutine (replaying the log at start)
	// records batch sizes through n.metrics. Its gauges read n.raft only
	// when scraped, after the HTTP server starts below.
	n.metrics = newMetrics(n)
	tried, err := n.snaps.List() // what Raft will try to restore (restore.go)
	if err != nil {
		return nil, fmt.Errorf("list snapshots: %w", err)
	}
	n.raft, err = raft.NewRaft(rc, n.fsm, logs, n.store, n.snaps, n.trans)
	if err != nil {
		return nil, fmt.Errorf("start raft: %w", err)
	}
	closers = append(closers, func() { _ = n.raft.Shutdown().Error() })
	n.setAsideFailedSnapshots(tried)
	n.trans.raft.Store(n.raft)
	n.hc = &http.Client{
		Timeout:   cfg.ApplyTimeout + 2*time.Second,
		Transport: cfg.TLS.Transport(&http.Transport{MaxIdleConnsPerHost: 256, IdleConnTimeout: 90 * time.Second}, pki.RoleCatalog),
	}

	// Timeouts, limits and protocol errors as on every Shoal listener
	// (internal/v4, docs/security.md); with TLS, the TLS listener wraps
	// v4's (net/http must see the *tls.Conn to know the peer), so protocol
	// errors stay net/http's plain text there (internal listeners only).
	srvOpts := v4.ServerOptions{}
	n.httpSrv = v4.NewServer(n.handler(), srvOpts).Server
	n.httpSrv.ErrorLog = slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelDebug) // failed TLS handshakes: debug
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		if err := n.httpSrv.Serve(cfg.TLS.Listen(v4.WrapListener(n.httpLn, srvOpts))); err != nil && !errors.Is(err, http.ErrServerClosed) {
			n.log.Error("http server stopped", "err", err)
		}
	}()
	closers = append(closers, func() { n.httpSrv.Close(); n.wg.Wait() })

	if cfg.Bootstrap && !hasState {
		if err := n.BootstrapCluster(nil); err != nil {
			return nil, err
		}
	}
	if len(cfg.Join) > 0 && !hasState {
		jctx, jcancel := context.WithTimeout(ctx, cfg.JoinTimeout)
		err := joinCluster(jctx, n.hc, cfg.TLS.Scheme(), cfg.Join, JoinRequest{ID: cfg.ID, RaftAddr: string(n.trans.LocalAddr()), Voter: !cfg.NonVoter})
		jcancel()
		if err != nil {
			return nil, fmt.Errorf("join %v: %w", cfg.Join, err)
		}
	}

	n.wg.Add(1)
	go n.leaderLoop()
	if cfg.LevelCheckInterval > 0 {
		n.wg.Add(1)
		go n.levelLoop()
	}
	n.log.Info("raftmeta node started", "raft", n.trans.LocalAddr(), "http", n.httpAddr, "existing_state", hasState)
	return n, nil
}

// Close stops the HTTP API, the background loops and Raft, then closes the
// stores. It returns when every goroutine it owns has exited.
func (n *Node) Close() error {
	n.closeOnce.Do(func() {
		n.cancel()
		shCtx, c := context.WithTimeout(context.Background(), 2*time.Second)
		_ = n.httpSrv.Shutdown(shCtx)
		c()
		n.httpSrv.Close()
		errs := []error{n.raft.Shutdown().Error()}
		n.trans.fenceHeartbeats() // no heartbeat inside Raft when the stores close
		// Handlers still running (past the Shutdown grace) fail fast now that
		// Raft is down; wait for them before closing the stores they read.
		n.inflight.Wait()
		n.wg.Wait()
		n.trans.CloseStreams()
		errs = append(errs, n.trans.Close(), n.mux.Close(), n.store.Close(), n.cat.Close())
		n.hc.CloseIdleConnections()
		n.closeErr = errors.Join(errs...)
	})
	return n.closeErr
}

// ID is the node's Raft server ID.
func (n *Node) ID() string { return n.cfg.ID }

// HTTPAddr is the advertised address of the node's HTTP API.
func (n *Node) HTTPAddr() string { return n.httpAddr }

// RaftAddr is the advertised Raft address.
func (n *Node) RaftAddr() string { return string(n.trans.LocalAddr()) }

// FSM gives direct access to the local catalog, for reads after ReadBarrier.
func (n *Node) FSM() *fsm.FSM { return n.cat }

// Raft exposes the Raft instance (tests, status).
func (n *Node) Raft() *raft.Raft { return n.raft }

// IsLeader reports whether this node is the leader now.
func (n *Node) IsLeader() bool { return n.raft.State() == raft.Leader }

// AppliedIndex is the highest log index reflected in the local catalog.
func (n *Node) AppliedIndex() uint64 { return n.fsm.appliedIndex() }

func (n *Node) selfMeta() nodeMeta {
	return nodeMeta{ID: n.cfg.ID, RaftAddr: string(n.mux.Addr().String()), HTTPAddr: n.httpAddr}
}

// BootstrapCluster makes this node (with no Raft state) the first member of
// a new cluster. servers may list the whole initial membership; empty means
// this node alone as a voter.
func (n *Node) BootstrapCluster(servers []raft.Server) error {
	if len(servers) == 0 {
		servers = []raft.Server{{ID: raft.ServerID(n.cfg.ID), Address: n.trans.LocalAddr(), Suffrage: raft.Voter}}
	}
	if err := n.raft.BootstrapCluster(raft.Configuration{Servers: servers}).Error(); err != nil {
		if errors.Is(err, raft.ErrCantBootstrap) {
			return fmt.Errorf("bootstrap: node already has raft state: %w", err)
		}
		return fmt.Errorf("bootstrap: %w", err)
	}
	return nil
}

// leader returns the leader's metadata, or ok=false when none is known.
// The leader's HTTP address is learned from its Raft port and cached.
func (n *Node) leader() (nodeMeta, bool) {
	addr, id := n.raft.LeaderWithID()
	if addr == "" {
		return nodeMeta{}, false
	}
	if string(addr) == n.RaftAddr() {
		return n.selfMeta(), true
	}
	nm, err := n.peerMeta(string(addr))
	if err != nil {
		return nodeMeta{ID: string(id), RaftAddr: string(addr)}, true
	}
	return nm, true
}

func (n *Node) peerMeta(raftAddr string) (nodeMeta, error) {
	n.metaMu.Lock()
	nm, ok := n.meta[raftAddr]
	n.metaMu.Unlock()
	if ok {
		return nm, nil
	}
	nm, err := lookupMeta(raftAddr, time.Second, n.cfg.TLS)
	if err != nil {
		return nodeMeta{}, err
	}
	n.metaMu.Lock()
	n.meta[raftAddr] = nm
	n.metaMu.Unlock()
	return nm, nil
}

func (n *Node) forgetPeer(raftAddr string) {
	n.metaMu.Lock()
	delete(n.meta, raftAddr)
	n.metaMu.Unlock()
}

func (n *Node) notLeader() error {
	if l, ok := n.leader(); ok {
		return &NotLeaderError{Leader: l.HTTPAddr, LeaderID: l.ID}
	}
	return &NotLeaderError{}
}

// staleness is how long ago this node last heard from a leader; zero on
// the leader, and "forever" (an hour+) on a node that never did.
func (n *Node) staleness() time.Duration {
	if n.raft.State() == raft.Leader {
		return 0
	}
	lc := n.raft.LastContact()
	if lc.IsZero() {
		return time.Duration(1<<62 - 1)
	}
	d := n.cfg.Now().Sub(lc)
	if d < 0 {
		return 0
	}
	return d
}

// leaderLoop runs for the node's life: on gaining leadership it applies a
// catalog no-op (so linearizable reads can start and the applied index
// passes Raft's own no-op), and every DrainInterval, as leader, proposes a
// stats drain when the change log is not empty.
func (n *Node) leaderLoop() {
	defer n.wg.Done()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	lastDrain, lastPrune := time.Now(), time.Time{}
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-tick.C:
		}
		n.trackReadyTarget()
		if n.raft.State() != raft.Leader {
			continue
		}
		if n.readyTerm.Load() != n.raft.CurrentTerm() {
			ctx, c := context.WithTimeout(n.ctx, n.cfg.ApplyTimeout)
			if err := n.ensureLeaderReady(ctx); err != nil && n.ctx.Err() == nil {
				n.log.Warn("leader no-op failed", "err", err)
			}
			c()
		}
		if n.cfg.DrainInterval > 0 && time.Since(lastDrain) >= n.cfg.DrainInterval {
			lastDrain = time.Now()
			n.drainStats()
		}
		if n.cfg.AuditRetention > 0 && time.Since(lastPrune) >= time.Hour {
			lastPrune = time.Now()
			n.pruneAudit()
		}
	}
}

// pruneAudit proposes prune_audit for the rows older than AuditRetention.
func (n *Node) pruneAudit() {
	ctx, c := context.WithTimeout(n.ctx, n.cfg.ApplyTimeout)
	defer c()
	now := n.cfg.Now()
	cmd, err := fsm.NewCommand(fsm.CmdPruneAudit, ids.New(), now.UnixNano(), fsm.PruneAudit{Before: now.Add(-n.cfg.AuditRetention).UnixNano()})
	if err != nil {
		return
	}
	if _, err := n.applyLocal(ctx, cmd); err != nil && n.ctx.Err() == nil {
		n.log.Warn("audit log prune failed", "err", err)
	}
}

// peerName names a request's caller for the audit log: its certificate's
// node ("cert:<node>"), or "unknown" without TLS.
func peerName(r *http.Request) string {
	if id, ok := pki.PeerIdentity(r.TLS); ok {
		return "cert:" + id.Node
	}
	return "unknown"
}

// audit records an action of this node's HTTP API (a membership change, a
// restore) in the audit log, best effort: the action is done either way.
func (n *Node) audit(r *http.Request, action, subject string, detail map[string]string) {
	n.auditAs(fsm.Audit{Actor: peerName(r), Source: r.RemoteAddr}, action, subject, detail)
}

// auditAs is audit for an action with no HTTP caller (the leader's own
// level raise): the actor is given.
func (n *Node) auditAs(a fsm.Audit, action, subject string, detail map[string]string) {
	cmd, err := fsm.NewCommand(fsm.CmdRecordAudit, ids.New(), n.cfg.Now().UnixNano(), fsm.RecordAudit{Action: action, Subject: subject, Detail: detail})
	if err != nil {
		return
	}
	cmd.Audit = &a
	ctx, c := context.WithTimeout(n.ctx, n.cfg.ApplyTimeout)
	defer c()
	if _, err := n.Apply(ctx, cmd); err != nil {
		n.log.Warn("audit record failed", "action", action, "err", err)
	}
}

func (n *Node) drainStats() {
	ctx, c := context.WithTimeout(n.ctx, n.cfg.ApplyTimeout)
	defer c()
	pending, err := n.cat.PendingStatsChanges(ctx)
	if err != nil || pending == 0 {
		return
	}
	cmd, err := fsm.NewCommand(fsm.CmdDrainStats, ids.New(), n.cfg.Now().UnixNano(), fsm.DrainStats{})
	if err != nil {
		return
	}
	if _, err := n.applyLocal(ctx, cmd); err != nil {
		if n.ctx.Err() == nil {
			n.log.Warn("stats drain failed", "err", err)
		}
		return
	}
	n.metrics.drains.Inc()
}

// ensureLeaderReady applies a catalog no-op in the current term once. Until
// an entry of its own term commits, a new leader's commit index may lag the
// cluster's, so a read index taken before it would be wrong.
func (n *Node) ensureLeaderReady(ctx context.Context) error {
	term := n.raft.CurrentTerm()
	if n.readyTerm.Load() == term {
		return nil
	}
	_, err, _ := n.readyGroup.Do(fmt.Sprint(term), func() (interface{}, error) {
		cmd, err := fsm.NewCommand(fsm.CmdNoop, ids.New(), n.cfg.Now().UnixNano(), struct{}{})
		if err != nil {
			return nil, err
		}
		if _, err := n.applyLocal(ctx, cmd); err != nil {
			return nil, err
		}
		n.readyTerm.Store(term)
		return nil, nil
	})
	return err
}

// trackReadyTarget captures, once, the commit index to catch up to before
// /readyz reports ready: the first commit index seen while a leader is known.
func (n *Node) trackReadyTarget() {
	if n.readySeen.Load() {
		return
	}
	if addr, _ := n.raft.LeaderWithID(); addr == "" {
		return
	}
	// A follower's own commit index is capped by its log and is not moved by
	// heartbeats, so the target is the leader's commit index as carried by
	// the first AppendEntries since start (see commitWatch).
	ci := n.raft.CommitIndex()
	if n.raft.State() != raft.Leader {
		commit, at := n.trans.last()
		if at.IsZero() {
			return
		}
		ci = max(ci, commit)
	}
	if ci > 0 {
		n.readyTarget.Store(ci)
		n.readySeen.Store(true)
	}
}

// Ready reports whether the node has a leader and has applied the log up to
// the commit index it saw when it first found one.
func (n *Node) Ready() (bool, string) {
	if addr, _ := n.raft.LeaderWithID(); addr == "" {
		return false, "no leader"
	}
	n.trackReadyTarget()
	if !n.readySeen.Load() {
		return false, "waiting for commit index"
	}
	if t, a := n.readyTarget.Load(), n.AppliedIndex(); a < t {
		return false, fmt.Sprintf("applied %d of %d", a, t)
	}
	return true, "ready"
}

// marshalCommand encodes a command for the log.
func marshalCommand(cmd fsm.Command) ([]byte, error) { return json.Marshal(cmd) }
