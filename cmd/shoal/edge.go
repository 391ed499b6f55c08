package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/shoaldb/shoal/edge"
	"github.com/shoaldb/shoal/edge/chinsights"
	"github.com/shoaldb/shoal/internal/config"
	"github.com/shoaldb/shoal/internal/plane"
	"github.com/shoaldb/shoal/internal/profiling"
	"github.com/shoaldb/shoal/internal/srvruntime"
	v4 "github.com/shoaldb/shoal/internal/v4"
	"github.com/shoaldb/shoal/pipeline/chsink"
	"github.com/shoaldb/shoal/raftmeta"
	"github.com/shoaldb/shoal/raftmeta/fsm"
)

func newEdgeCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "edge", Short: "Run the public D1-compatible API (edge node)"}
	cmd.AddCommand(newEdgeServeCmd())
	return cmd
}

func newEdgeServeCmd() *cobra.Command {
	var (
		httpAddr, dir, region, adminToken, bindingKey string
		debugAddr, hostTransport                      string
		bindingPrevious                               []string
		catalog                                       []string
		configPath, nodeID                            string
		logs                                          logFlags
		tokenTTL                                      time.Duration
		acctRate, dbRate                              float64
		fallbackCap                                   int64
		createBatch, createBatchInflight              int
		createGather                                  time.Duration
		createGroupDelay, createInitGroupDelay        time.Duration
		kafka                                         kafkaFlags
		clickhouseDSN                                 string
		lostHostAfter                                 time.Duration
		tlsf                                          tlsFlags
	)
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve the D1-compatible HTTP API until SIGINT/SIGTERM",
		Long: `Serve the edge: the D1-compatible REST API (/client/v4/accounts/{account}/d1/database/...),
the admin API (/admin/v1/...), /metrics and /healthz.

The admin token and binding key default to $SHOAL_ADMIN_TOKEN and $SHOAL_BINDING_KEY.
With --config cluster.hcl --node ID the address, data dir, region, catalog nodes and
secrets come from the file; flags given explicitly win.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// First, before anything is opened: the runtime's monitor kept
			// out of its deep sleep (a re-exec of this binary with GODEBUG
			// set; the edge's CPU per point SELECT 0.76-0.86x in the deploy
			// benchmark, docs/benchmarks.md). On failure the edge runs
			// without it.
			if err := srvruntime.MonitorAwake(); err != nil {
				fmt.Fprintln(os.Stderr, "warning: runtime monitor setting not applied:", err)
			}
			srvruntime.Apply(false)
			set := func(flag string) bool { return cmd.Flags().Changed(flag) }
			// Secrets from the environment, read here rather than as flag
			// defaults so --help never prints them.
			if !set("admin-token") {
				adminToken = os.Getenv("SHOAL_ADMIN_TOKEN")
			}
			if !set("binding-key") {
				bindingKey = os.Getenv("SHOAL_BINDING_KEY")
			}
			var tiers map[string]fsm.Limits
			var knownHosts []string // cluster.hcl's object hosts: the last-resort route lookup's (edge/hostroute.go)
			var cl *config.Cluster
			if configPath != "" {
				c, n, err := loadNode(configPath, nodeID, config.RoleEdge)
				if err != nil {
					return err
				}
				cl = c
				if ch := c.ClickHouse; ch != nil && !set("clickhouse-dsn") {
					clickhouseDSN = ch.DSN
					if ch.Managed && ch.Addr != "" {
						clickhouseDSN = "clickhouse://default:@" + ch.Addr + "/shoal"
					}
				}
				if !set("http-addr") {
					httpAddr = n.EdgeAddr
				}
				if !set("debug-addr") {
					debugAddr = n.EdgeDebugAddr
				}
				if !set("dir") && n.DataDir != "" {
					dir = n.DataDir + "/edge"
				}
				if !set("region") && n.Region != "" {
					region = n.Region
				}
				if !set("catalog") {
					catalog = c.CatalogAddrs(n.Region)
				}
				if s := c.Secrets; s != nil {
					if !set("admin-token") && s.AdminToken != "" {
						adminToken = s.AdminToken
					}
					if !set("binding-key") && s.BindingKey != "" {
						bindingKey = s.BindingKey
					}
				}
				tiers = clusterTiers(c)
				for _, h := range c.Nodes {
					if h.Has(config.RoleObjecthost) && h.ObjecthostAddr != "" {
						knownHosts = append(knownHosts, h.ObjecthostAddr)
					}
				}
			}
			if httpAddr == "" || dir == "" || len(catalog) == 0 {
				return errors.New("--http-addr, --dir and --catalog are required (or --config with --node)")
			}
			logger, err := logs.logger()
			if err != nil {
				return err
			}
			keys, err := bindingKeys(bindingKey, bindingPrevious)
			if err != nil {
				return err
			}
			tlsL, err := tlsf.roleTLS(cl, nodeIDOr(nodeID, "edge"), logger, "edge")
			if err != nil {
				return err
			}
			client, err := raftmeta.NewClient(catalog, raftmeta.WithTLS(tlsL))
			if err != nil {
				return err
			}
			defer client.Close()
			k, err := kafka.resolve(cl, set)
			if err != nil {
				return err
			}
			// The route feed: every route the hosts publish, into the
			// local cache, so databases this edge never saw route with
			// the catalog down.
			var feed *edge.RouteFeedOptions
			// The rate share: admitted counts exchanged over the
			// ratelimits topic, so the rate limits hold across edges.
			var share *edge.RateShareOptions
			if k.Enabled() {
				if _, err := k.Options(); err != nil {
					return err
				}
				feed = &edge.RouteFeedOptions{Brokers: k.Brokers, NewClient: func(opts ...kgo.Opt) (*kgo.Client, error) { return k.Client(opts...) }}
				share = &edge.RateShareOptions{Brokers: k.Brokers, NewClient: func(opts ...kgo.Opt) (*kgo.Client, error) { return k.Client(opts...) }}
			}
			// Query insights read ClickHouse (the ClickHouse sink's tables).
			var insights edge.InsightsSource
			if clickhouseDSN != "" {
				ch, err := plane.ParseClickHouseDSN(clickhouseDSN)
				if err != nil {
					return err
				}
				st, err := chsink.Open(chsink.StoreConfig{Options: ch.Options, Database: ch.Database})
				if err != nil {
					return err
				}
				defer st.Close()
				insights = chinsights.NewSource(st)
			}
			var accountChanged func(context.Context, fsm.Account) error
			if k.Enabled() {
				pub, err := plane.NewAccountPublisher(k, "edge-"+httpAddr)
				if err != nil {
					return err
				}
				defer pub.Close()
				accountChanged = pub.Publish
			}
			fp, err := envFailpoints(cmd.Context(), logger)
			if err != nil {
				return err
			}
			reg := edgeRegistry()
			srv, err := edge.New(edge.Options{
				Failpoint:      fp,
				RouteFeed:      feed,
				RateShare:      share,
				AccountChanged: accountChanged,
				Insights:       insights,
				Catalog:        edge.RaftmetaCatalog{C: client}, Dir: dir, Region: region, HostTLS: tlsL, HostTransport: hostTransport,
				AdminToken: adminToken, BindingKeys: keys, TokenTTL: tokenTTL,
				AccountRate:  edge.RateLimit{Rate: acctRate, Burst: int(2 * acctRate)},
				DatabaseRate: edge.RateLimit{Rate: dbRate, Burst: int(2 * dbRate)},
				FallbackCap:  fallbackCap, Tiers: tiers, Logger: logger, KnownHosts: knownHosts,
				Registry:    reg,
				CreateBatch: createBatch, CreateBatchInflight: createBatchInflight, CreateGather: createGather,
				CreateGroupDelay: createGroupDelay, CreateInitGroupDelay: createInitGroupDelay,
			})
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			if lostHostAfter > 0 {
				// Automatic lost-host recovery (edge/relocate.go): a host
				// silent longer than the bound is declared lost and its
				// databases restored elsewhere from the archive.
				hc := edge.NewHostClient(0, tlsL)
				defer hc.Close()
				rc := edge.NewRecoverer(edge.RaftmetaRecovery{C: client}, hc, edge.RecoverOptions{Logger: logger})
				go rc.AutoRecover(ctx, edge.AutoOptions{After: lostHostAfter})
			}
			if debugAddr != "" {
				// Go profiles on a listener of their own, behind the
				// cluster's mutual TLS like every internal endpoint
				// (operators only): never on the public API.
				dln, err := net.Listen("tcp", debugAddr)
				if err != nil {
					return fmt.Errorf("--debug-addr: %w", err)
				}
				dsrv := v4.NewServer(profiling.Handler(tlsL != nil), v4.ServerOptions{})
				go func() { _ = serveTLS(dsrv, dln, tlsL) }()
				defer dsrv.Close()
				logs.announce(cmd.OutOrStdout(), logger, "edge: profiles (/debug/pprof/, operators) on %s", dln.Addr())
			}
			// The query routes on the lean HTTP/1.1 path (internal/v4
			// lean.go), everything else on net/http.
			hs := v4.NewServer(srv, v4.ServerOptions{Lean: srv.LeanRoute})
			registerLeanMetrics(reg, hs)
			// The public API: no cluster TLS (clients are D1 clients;
			// terminate TLS in front of the edge).
			return serveRole(ctx, httpAddr, hs, nil, func(a net.Addr) {
				note := "route feed off (no --kafka-brokers)"
				if feed != nil {
					note = "route feed and rate share from " + strings.Join(k.Brokers, ",")
				}
				logs.announce(cmd.OutOrStdout(), logger, "edge: http %s, region %s, catalog %v, %s", a, region, catalog, note)
			}, srv.Close)
		},
	}
	f := cmd.Flags()
	tlsf.register(f, true)
	f.StringVar(&httpAddr, "http-addr", "", "public HTTP bind address host:port")
	f.StringVar(&debugAddr, "debug-addr", "", "listen address of /debug/pprof/ (Go profiles; mutual TLS and the operator role when TLS is on; cluster.hcl: edge_debug_addr); none: off")
	f.StringVar(&dir, "dir", "", "data directory (the bbolt route cache)")
	f.StringVar(&hostTransport, "host-transport", edge.TransportFrames, "how queries reach object hosts: frames (multiplexed connections; HTTP with hosts that do not speak them) or http (an HTTP/1.1 exchange per query)")
	f.StringVar(&region, "region", "weur", "this edge's region: placement default (wnam, enam, weur, eeur, apac, oc)")
	f.StringSliceVar(&catalog, "catalog", nil, "catalog (raftmeta) node HTTP addresses; stale reads are spread over all of them")
	f.StringVar(&adminToken, "admin-token", "", "operator token for /admin/v1 (default $SHOAL_ADMIN_TOKEN)")
	f.StringVar(&bindingKey, "binding-key", "", "secret for binding tokens, shared with object hosts (default $SHOAL_BINDING_KEY)")
	f.StringSliceVar(&bindingPrevious, "binding-key-previous", nil, "earlier binding-token secrets still accepted while tokens they sealed live (key rotation, docs/security.md)")
	f.DurationVar(&tokenTTL, "token-ttl", 10*time.Second, "how long a token check is trusted (revocation delay)")
	f.Float64Var(&acctRate, "account-rate", 1000, "requests per second per account (burst twice that); fleet-wide with --kafka-brokers")
	f.Float64Var(&dbRate, "database-rate", 500, "requests per second per database (burst twice that); fleet-wide with --kafka-brokers")
	f.Int64Var(&fallbackCap, "fallback-cap", 64, "max concurrent catalog reads for route cache misses")
	f.IntVar(&createBatch, "create-batch", 0, "max concurrent creates sharing one init, catalog or confirm request (0: 128; -1: one request per create)")
	f.DurationVar(&createGather, "create-gather", 0, "longest wait of a catalog batch of creates for the creates of init batches that came back, still on their way to it (0: 1ms; negative: none)")
	f.DurationVar(&createGroupDelay, "create-group-delay", 0, "longest wait of the catalog batcher, after a batch of several creates came back, for as many creates again before it sends the next (0: 2ms; negative: none)")
	f.DurationVar(&createInitGroupDelay, "create-init-group-delay", 0, "the same group-commit delay for each object host's init batcher (0: 2ms; negative: none)")
	f.IntVar(&createBatchInflight, "create-batch-inflight", 0, "requests of one coalesced create step in flight at once, per host and to the catalog (0: 1)")
	f.DurationVar(&lostHostAfter, "lost-host-after", 0, "declare an object host lost after it has not reported for this long (at least 1m), and restore its databases on other hosts from the archive; 0 (default): only `shoal cluster host lost` does")
	kafka.register(f)
	f.StringVar(&clickhouseDSN, "clickhouse-dsn", "", "ClickHouse DSN of the usage tables, for query insights (none: insights answer 503)")
	f.StringVar(&configPath, "config", "", "cluster.hcl to read this node's settings from")
	f.StringVar(&nodeID, "node", "", "node ID in --config")
	logs.register(f, "info")
	return cmd
}

// registerLeanMetrics exports the public listener's lean-path counters
// (internal/v4 lean.go): how many requests it served and how many
// connections it handed to net/http.
func registerLeanMetrics(reg prometheus.Registerer, hs *v4.Server) {
	reg.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "shoal_edge_lean_requests_total",
			Help: "Requests served on the public listener's lean HTTP/1.1 path (the query routes)."},
			func() float64 { n, _ := hs.LeanStats(); return float64(n) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "shoal_edge_lean_handovers_total",
			Help: "Connections the lean path handed to net/http (a request that was not plainly simple, or not a query route)."},
			func() float64 { _, n := hs.LeanStats(); return float64(n) }))
}

// edgeRegistry is the edge role's Prometheus registry, with the runtime
// collectors every role has.
func edgeRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	registerRuntime(reg)
	return reg
}
