package main

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/shoaldb/shoal/internal/config"
	"github.com/shoaldb/shoal/internal/srvruntime"
	"github.com/shoaldb/shoal/raftmeta"
)

func newRaftmetaCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "raftmeta", Short: "Run a catalog (Raft) node"}
	cmd.AddCommand(newRaftmetaServeCmd())
	return cmd
}

func newRaftmetaServeCmd() *cobra.Command {
	var (
		cfg        raftmeta.Config
		join       []string
		configPath string
		nodeID     string
		logs       logFlags
		tlsf       tlsFlags
	)
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve one catalog node until SIGINT/SIGTERM",
		Long: `Serve one catalog node: its Raft member and internal HTTP API.

A new cluster starts with one node run with --bootstrap; the others run with
--join pointing at any member's HTTP address (they follow it to the leader).
Restarts need neither: the node resumes from its data directory.

With --config cluster.hcl --node ID the node's addresses, data dir, suffrage
and catalog settings come from the file; without --bootstrap or --join the
node joins the other catalog nodes of the file. Flags given explicitly win.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// First, before anything is opened: the runtime's monitor kept
			// out of its deep sleep (srvruntime.MonitorAwake, as the edge
			// and the object host do). On failure the node runs without it.
			if err := srvruntime.MonitorAwake(); err != nil {
				fmt.Fprintln(os.Stderr, "warning: runtime monitor setting not applied:", err)
			}
			srvruntime.Apply(true)
			var cl *config.Cluster
			if configPath != "" {
				var err error
				if cl, err = applyClusterConfig(cmd, configPath, nodeID, &cfg, &join); err != nil {
					return err
				}
			}
			cfg.Join = join
			logger, err := logs.logger()
			if err != nil {
				return err
			}
			cfg.Logger = logger
			cfg.Collectors = runtimeCollectors()
			if cfg.TLS, err = tlsf.roleTLS(cl, cfg.ID, logger, "catalog node"); err != nil {
				return err
			}
			if cfg.ID == "" || cfg.Dir == "" || cfg.RaftAddr == "" || cfg.HTTPAddr == "" {
				return errors.New("--id, --dir, --raft-addr and --http-addr are required (or --config with --node)")
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			n, err := raftmeta.NewNode(cfg)
			if err != nil {
				return err
			}
			logs.announce(cmd.OutOrStdout(), logger, "raftmeta node %s: raft %s, http %s", n.ID(), n.RaftAddr(), n.HTTPAddr())
			<-ctx.Done()
			closed := make(chan error, 1)
			go func() { closed <- n.Close() }()
			select {
			case err := <-closed:
				return err
			case <-time.After(30 * time.Second):
				return errors.New("node did not close within 30s")
			}
		},
	}
	f := cmd.Flags()
	tlsf.register(f, true)
	f.StringVar(&cfg.ID, "id", "", "node ID (unique, stable)")
	f.StringVar(&cfg.Dir, "dir", "", "data directory")
	f.StringVar(&cfg.LogStore, "log-store", "", "Raft log store for a new data directory: wal (raft-wal, default) or bolt (raft-boltdb/v2); an existing directory keeps its own")
	f.StringVar(&cfg.RaftAddr, "raft-addr", "", "Raft bind address host:port")
	f.StringVar(&cfg.RaftAdvertise, "raft-advertise", "", "Raft address peers dial (default --raft-addr)")
	f.StringVar(&cfg.HTTPAddr, "http-addr", "", "internal HTTP API bind address host:port")
	f.StringVar(&cfg.HTTPAdvertise, "http-advertise", "", "HTTP address other nodes use (default the bound address)")
	f.BoolVar(&cfg.Bootstrap, "bootstrap", false, "bootstrap a new cluster with this node as its only voter")
	f.StringSliceVar(&join, "join", nil, "HTTP address(es) of existing members to join")
	f.BoolVar(&cfg.NonVoter, "nonvoter", false, "join as a non-voting read follower")
	f.DurationVar(&cfg.MaxStale, "max-stale", 5*time.Second, "refuse stale reads after this long without leader contact")
	f.Uint64Var(&cfg.SnapshotThreshold, "snapshot-threshold", 8192, "log entries between snapshots")
	f.DurationVar(&cfg.SnapshotInterval, "snapshot-interval", 30*time.Second, "how often the snapshot threshold is checked")
	f.StringVar(&cfg.RaftLogLevel, "raft-log-level", "warn", "hashicorp/raft log level")
	logs.register(f, "info")
	f.StringVar(&configPath, "config", "", "cluster.hcl to read this node's settings from")
	f.StringVar(&nodeID, "node", "", "node ID in --config")
	return cmd
}

// applyClusterConfig fills cfg from the node's block in cluster.hcl, except
// where a flag was given explicitly.
func applyClusterConfig(cmd *cobra.Command, path, id string, cfg *raftmeta.Config, join *[]string) (*config.Cluster, error) {
	c, n, err := loadNode(path, id, config.RoleRaftmeta)
	if err != nil {
		return nil, err
	}
	set := func(flag string) bool { return cmd.Flags().Changed(flag) }
	if !set("id") {
		cfg.ID = n.ID
	}
	if !set("dir") && n.DataDir != "" {
		cfg.Dir = n.DataDir + "/raftmeta"
	}
	if !set("raft-addr") {
		cfg.RaftAddr = n.RaftAddr
	}
	if !set("http-addr") {
		cfg.HTTPAddr = n.CatalogAddr
	}
	if !set("nonvoter") {
		cfg.NonVoter = !n.IsVoter()
	}
	if cat := c.Catalog; cat != nil {
		if !set("max-stale") && cat.MaxStale != "" {
			cfg.MaxStale = config.Duration(cat.MaxStale)
		}
		if !set("snapshot-threshold") && cat.SnapshotThreshold > 0 {
			cfg.SnapshotThreshold = uint64(cat.SnapshotThreshold)
		}
		if !set("snapshot-interval") && cat.SnapshotInterval != "" {
			cfg.SnapshotInterval = config.Duration(cat.SnapshotInterval)
		}
		if !set("log-store") && cat.LogStore != "" {
			cfg.LogStore = cat.LogStore
		}
	}
	if !cfg.Bootstrap && !set("join") {
		for _, other := range c.Nodes {
			if other.ID != n.ID && other.Has(config.RoleRaftmeta) && other.CatalogAddr != "" {
				*join = append(*join, other.CatalogAddr)
			}
		}
	}
	return c, nil
}
