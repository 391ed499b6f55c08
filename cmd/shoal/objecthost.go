package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"

	"github.com/shoaldb/shoal/internal/config"
	"github.com/shoaldb/shoal/internal/plane"
	"github.com/shoaldb/shoal/internal/srvruntime"
	v4 "github.com/shoaldb/shoal/internal/v4"
	"github.com/shoaldb/shoal/objecthost"
	"github.com/shoaldb/shoal/raftmeta"
)

func newObjecthostCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "objecthost", Short: "Run an object host (owner of SQLite files)"}
	cmd.AddCommand(newObjecthostServeCmd())
	return cmd
}

func newObjecthostServeCmd() *cobra.Command {
	var (
		cfg         objecthost.Config
		httpAddr    string
		catalog     []string
		bindingKey  string
		bindingPrev []string
		configPath  string
		nodeID      string
		logs        logFlags
		kafka       kafkaFlags
		archiveDir  string
		durability  string
		tlsf        tlsFlags
	)
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve one object host until SIGINT/SIGTERM",
		Long: `Serve one object host: its SQLite files under --dir, the internal HTTP API
the edge forwards queries to, heartbeats to the catalog and the sweeper.

Queries never need the catalog: the host serves its databases while every
catalog node is down and registers itself once the catalog answers.

With --config cluster.hcl --node ID the addresses, region, jurisdiction,
data dir, capacity, catalog nodes and binding key come from the file; flags
given explicitly win.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// First, before anything is opened: the runtime's monitor kept
			// out of its deep sleep (a re-exec of this binary with GODEBUG
			// set; the hosts' CPU per point SELECT 0.74-0.85x and per
			// create 0.85-0.88x in the deploy benchmark,
			// docs/benchmarks.md). On failure the host runs without it.
			if err := srvruntime.MonitorAwake(); err != nil {
				fmt.Fprintln(os.Stderr, "warning: runtime monitor setting not applied:", err)
			}
			srvruntime.Apply(true)
			set := func(flag string) bool { return cmd.Flags().Changed(flag) }
			var cl *config.Cluster
			if configPath != "" {
				c, n, err := loadNode(configPath, nodeID, config.RoleObjecthost)
				if err != nil {
					return err
				}
				cl = c
				if !set("id") {
					cfg.ID = n.ID
				}
				if !set("http-addr") {
					httpAddr = n.ObjecthostAddr
				}
				if !set("dir") && n.DataDir != "" {
					cfg.Dir = n.DataDir + "/objecthost"
				}
				if !set("region") && n.Region != "" {
					cfg.Region = n.Region
				}
				if !set("jurisdiction") && n.Jurisdiction != "" {
					cfg.Jurisdiction = n.Jurisdiction
				}
				if !set("capacity") && n.Capacity > 0 {
					cfg.Capacity = n.Capacity
				}
				if !set("catalog") {
					catalog = c.CatalogAddrs(n.Region)
				}
				if s := c.Secrets; s != nil && !set("binding-key") && s.BindingKey != "" {
					bindingKey = s.BindingKey
				}
			}
			if cfg.ID == "" || cfg.Dir == "" || httpAddr == "" || len(catalog) == 0 {
				return errors.New("--id, --dir, --http-addr and --catalog are required (or --config with --node)")
			}
			if cfg.Address == "" {
				cfg.Address = httpAddr
			}
			var err error
			if cfg.Logger, err = logs.logger(); err != nil {
				return err
			}
			cfg.Registry = prometheus.NewRegistry()
			registerRuntime(cfg.Registry)
			if cfg.Bindings, err = bindingKeys(bindingKey, bindingPrev); err != nil {
				return err
			}
			if cfg.TLS, err = tlsf.roleTLS(cl, cfg.ID, cfg.Logger, "object host"); err != nil {
				return err
			}
			client, err := raftmeta.NewClient(catalog, raftmeta.WithTLS(cfg.TLS))
			if err != nil {
				return err
			}
			defer client.Close()
			cfg.Catalog = objecthost.RaftmetaCatalog{C: client}
			k, err := kafka.resolve(cl, set)
			if err != nil {
				return err
			}
			// The background plane: usage, sizes and routes to Kafka. Its
			// state (event-ID sequencer, spill) lives beside the databases.
			var hp *plane.Host
			if k.Enabled() {
				hp, err = plane.StartHost(plane.HostConfig{Kafka: k, Dir: filepath.Join(cfg.Dir, "pipeline"), HostID: cfg.ID,
					Registerer: cfg.Registry, Logger: cfg.Logger})
				if err != nil {
					return err
				}
				hp.Apply(&cfg)
			}

			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			switch {
			case archiveDir != "":
				if cfg.History, err = dirHistory(archiveDir, cfg.Dir); err != nil {
					return err
				}
				switch durability {
				case "", "default":
				case "archived":
					cfg.History.Archived = true
				default:
					return fmt.Errorf("--durability %q: want default or archived", durability)
				}
			case cl != nil && cl.Archive != nil:
				if cfg.History, err = archiveHistory(cl.Archive, cfg.Dir); err != nil {
					return err
				}
			}
			h, err := objecthost.Open(cfg)
			if err != nil {
				if hp != nil {
					hp.Close()
				}
				return err
			}
			closeAll := func() error {
				err := h.Close()
				if hp != nil {
					hp.Close() // after the host: its last window is flushed
				}
				return err
			}
			planeNote := "background plane off (no --kafka-brokers)"
			if hp != nil {
				planeNote = "brokers " + strings.Join(k.Brokers, ",")
			}
			srv := v4.NewServer(h.Handler(), v4.ServerOptions{})
			// In-flight queries finish before the files close.
			return serveRole(ctx, httpAddr, srv, cfg.TLS, func(a net.Addr) {
				st := h.Stats()
				logs.announce(cmd.OutOrStdout(), cfg.Logger, "objecthost %s: http %s, %d active / %d deleted databases, %s", cfg.ID, a, st.Active, st.Deleted, planeNote)
			}, closeAll)
		},
	}
	f := cmd.Flags()
	tlsf.register(f, true)
	f.StringVar(&cfg.ID, "id", "", "host ID in the catalog (unique, stable)")
	f.StringVar(&cfg.Dir, "dir", "", "data directory (index.db and dbs/)")
	f.StringVar(&archiveDir, "archive-dir", "", "archive every commit's pages into this directory, outside --dir (time travel and restores; objecthost/history); default: cluster.hcl's archive block, none: no history")
	f.StringVar(&durability, "durability", "default", "with --archive-dir: default (a write is acknowledged once captured locally; archived within about a second) or archived (acknowledged only once in the archive)")
	f.StringVar(&httpAddr, "http-addr", "", "listen address of the internal API")
	f.StringVar(&cfg.Address, "advertise", "", "address edges reach this host at (default --http-addr)")
	f.StringVar(&cfg.Region, "region", "", "region (wnam, enam, weur, eeur, apac, oc)")
	f.StringVar(&cfg.Jurisdiction, "jurisdiction", "", "jurisdiction (eu, fedramp, us), if any")
	f.Int64Var(&cfg.Capacity, "capacity", 100000, "databases this host accepts")
	f.StringSliceVar(&catalog, "catalog", nil, "catalog nodes' HTTP addresses (ADDR[,ADDR]); stale reads are spread over all of them")
	f.StringVar(&bindingKey, "binding-key", "", "binding token secret (enables /v1/bound/*); shared with every edge")
	f.StringSliceVar(&bindingPrev, "binding-key-previous", nil, "earlier binding-token secrets still accepted (key rotation, docs/security.md)")
	f.IntVar(&cfg.MaxOpen, "max-open", 1000, "open database handles kept (LRU)")
	f.IntVar(&cfg.ReadConns, "read-conns", 1, "read connections per open database (-1: none)")
	f.DurationVar(&cfg.HeartbeatInterval, "heartbeat-interval", 30*time.Second, "default heartbeat interval per database")
	f.IntVar(&cfg.HeartbeatBatch, "heartbeat-batch", 5000, "databases per heartbeat call to the catalog (the catalog accepts up to 10,000)")
	f.DurationVar(&cfg.CreationGrace, "creation-grace", 2*time.Minute, "age after which a database unknown to the catalog is an orphan")
	f.DurationVar(&cfg.DeletedRetention, "deleted-retention", 24*time.Hour, "how long deleted databases' files are kept")
	f.DurationVar(&cfg.SweepInterval, "sweep-interval", time.Minute, "how often deleted databases are swept")
	kafka.register(f)
	f.StringVar(&configPath, "config", "", "cluster.hcl")
	f.StringVar(&nodeID, "node", "", "this node's ID in --config")
	logs.register(f, "info")
	return cmd
}
