package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"

	"github.com/shoaldb/shoal/internal/config"
	"github.com/shoaldb/shoal/internal/pki"
	"github.com/shoaldb/shoal/internal/plane"
	"github.com/shoaldb/shoal/internal/profiling"
	"github.com/shoaldb/shoal/internal/srvruntime"
	v4 "github.com/shoaldb/shoal/internal/v4"
	"github.com/shoaldb/shoal/pipeline/broker"
	"github.com/shoaldb/shoal/pipeline/chlocal"
	"github.com/shoaldb/shoal/raftmeta"
)

func newPipelineCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "pipeline", Short: "Run or inspect the background plane (Kafka → ClickHouse, catalog sizes)"}
	cmd.AddCommand(newPipelineServeCmd(), newPipelineStatusCmd())
	return cmd
}

type pipelineServeOpts struct {
	tls            tlsFlags
	httpAddr, dir  string
	catalog        []string
	kafka          kafkaFlags
	embeddedBroker bool
	clickhouseDSN  string
	managedCH      bool
	managedCHAddr  string
	storageMembers int
	snapInterval   time.Duration
	reconInterval  time.Duration
	configPath     string
	nodeID         string
	logs           logFlags
}

func newPipelineServeCmd() *cobra.Command {
	var o pipelineServeOpts
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve the pipeline role until SIGINT/SIGTERM",
		Long: `Serve the pipeline role: the storage consumer (sizes from the storage topic
into the catalog) and the ClickHouse sink (usage into requests and
query_shapes; insights are read from requests), the storage snapshotter and the
reconciler, plus /metrics, /healthz and /v1/status on --http-addr.

Kafka: --kafka-brokers (with SASL/TLS flags), or cluster.hcl's kafka block;
with kafka { embedded = true } this process also runs the embedded
Kafka-protocol broker (one node, development only) on the first broker
address. ClickHouse: --clickhouse-dsn (clickhouse://user:pass@host:9000/shoal),
or clickhouse { managed = true } / --managed-clickhouse, which runs a local
clickhouse-server as a child process under --dir. Without ClickHouse the
storage consumer runs and analytics is off (said once at start).

Object hosts publish to the same brokers (shoal objecthost serve
--kafka-brokers …), and edges read the route feed from them.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			srvruntime.Apply(true)
			return runPipelineServe(cmd, &o)
		},
	}
	f := cmd.Flags()
	o.tls.register(f, true)
	f.StringVar(&o.httpAddr, "http-addr", "", "listen address of /metrics, /healthz and /v1/status")
	f.StringVar(&o.dir, "dir", "", "data directory (embedded broker and managed ClickHouse data)")
	f.StringSliceVar(&o.catalog, "catalog", nil, "catalog nodes' HTTP addresses (ADDR[,ADDR])")
	o.kafka.register(f)
	f.BoolVar(&o.embeddedBroker, "embedded-broker", false, "run the embedded Kafka-protocol broker on the first --kafka-brokers address (development only)")
	f.StringVar(&o.clickhouseDSN, "clickhouse-dsn", "", "ClickHouse DSN (native protocol); the path names the tables' database (default shoal)")
	f.BoolVar(&o.managedCH, "managed-clickhouse", false, "run a local clickhouse-server child process under --dir")
	f.StringVar(&o.managedCHAddr, "managed-clickhouse-addr", "127.0.0.1:0", "native-protocol address of the managed clickhouse-server (HTTP on port+1)")
	f.IntVar(&o.storageMembers, "storage-consumers", 1, "storage consumer group members in this process (at most 8)")
	f.DurationVar(&o.reconInterval, "reconcile-interval", time.Minute, "how often ClickHouse is reconciled with the hosts' usage sequences (missing events → shoal_pipeline_reconcile_missing_events)")
	f.DurationVar(&o.snapInterval, "snapshot-interval", time.Hour, "storage snapshots (catalog sizes into ClickHouse storage_snapshots) every this long, aligned on UTC")
	f.StringVar(&o.configPath, "config", "", "cluster.hcl")
	f.StringVar(&o.nodeID, "node", "", "this node's ID in --config")
	o.logs.register(f, "info")
	return cmd
}

func runPipelineServe(cmd *cobra.Command, o *pipelineServeOpts) error {
	set := func(flag string) bool { return cmd.Flags().Changed(flag) }
	var cl *config.Cluster
	if o.configPath != "" {
		c, n, err := loadNode(o.configPath, o.nodeID, config.RolePipeline)
		if err != nil {
			return err
		}
		cl = c
		if !set("http-addr") {
			o.httpAddr = n.PipelineAddr
		}
		if !set("dir") && n.DataDir != "" {
			o.dir = filepath.Join(n.DataDir, "pipeline")
		}
		if !set("catalog") {
			o.catalog = c.CatalogAddrs(n.Region)
		}
		if !set("embedded-broker") && c.Kafka != nil {
			o.embeddedBroker = c.Kafka.Embedded
		}
		if ch := c.ClickHouse; ch != nil {
			if !set("clickhouse-dsn") && !set("managed-clickhouse") {
				o.clickhouseDSN, o.managedCH = ch.DSN, ch.Managed
			}
			if ch.Addr != "" && !set("managed-clickhouse-addr") {
				o.managedCHAddr = ch.Addr
			}
		}
	}
	k, err := o.kafka.resolve(cl, set)
	if err != nil {
		return err
	}
	switch {
	case o.httpAddr == "" || o.dir == "" || len(o.catalog) == 0:
		return errors.New("--http-addr, --dir and --catalog are required (or --config with --node)")
	case !k.Enabled():
		return errors.New("--kafka-brokers is required (or a kafka block in --config)")
	case o.managedCH && o.clickhouseDSN != "":
		return errors.New("give --clickhouse-dsn or --managed-clickhouse, not both")
	}
	logger, err := o.logs.logger()
	if err != nil {
		return err
	}
	out := cmd.OutOrStdout()
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	var b *broker.Broker
	if o.embeddedBroker {
		if b, err = plane.StartBroker(k.Brokers[0], filepath.Join(o.dir, "kafka"), logger); err != nil {
			return err
		}
		defer b.Close()
	}
	var ch *plane.ClickHouse
	var chSrv *chlocal.Server
	switch {
	case o.clickhouseDSN != "":
		c, err := plane.ParseClickHouseDSN(o.clickhouseDSN)
		if err != nil {
			return err
		}
		ch = &c
	case o.managedCH:
		chDir := filepath.Join(o.dir, "clickhouse")
		if cl != nil && cl.ClickHouse != nil && cl.ClickHouse.DataDir != "" {
			chDir = cl.ClickHouse.DataDir
		}
		srv, c, err := plane.StartClickHouse(ctx, o.managedCHAddr, chDir, logger)
		if err != nil {
			fmt.Fprintf(out, "pipeline: analytics OFF: %v; the storage consumer runs\n", err)
		} else {
			chSrv, ch = srv, &c
			defer func() { _ = chSrv.Close() }()
		}
	default:
		fmt.Fprintln(out, "pipeline: analytics OFF: no ClickHouse configured (--clickhouse-dsn or --managed-clickhouse); the storage consumer runs")
	}
	tlsL, err := o.tls.roleTLS(cl, nodeIDOr(o.nodeID, "pipeline"), logger, "pipeline")
	if err != nil {
		return err
	}
	client, err := raftmeta.NewClient(o.catalog, raftmeta.WithTLS(tlsL))
	if err != nil {
		return err
	}
	defer client.Close()
	reg := prometheus.NewRegistry()
	registerRuntime(reg)
	// The fault tests' stopped consumer (SHOAL_FAILPOINTS=consumers:stall=100%,
	// armed and disarmed by SIGUSR1): unset in production, no hook.
	fp, err := envFailpoints(ctx, logger)
	if err != nil {
		return err
	}
	var stalled func() bool
	if fp != nil {
		stalled = func() bool { return fp("consumers:stall") != nil }
	}
	tctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	cons, err := plane.StartConsumers(tctx, plane.ConsumersConfig{Kafka: k, Catalog: client, ClickHouse: ch,
		StorageConsumers: o.storageMembers, SnapshotInterval: o.snapInterval, ReconcileInterval: o.reconInterval, Registerer: reg, Logger: logger,
		Stalled: stalled})
	cancel()
	if err != nil {
		return err
	}
	// Go profiles beside them, for operators (internal/profiling).
	srv := v4.NewServer(profiling.Wrap(pipelineHandler(reg, cons, k), tlsL != nil), v4.ServerOptions{})
	return serveRole(ctx, o.httpAddr, srv, tlsL, func(a net.Addr) {
		what := "storage consumer"
		if ch != nil {
			what += ", ClickHouse sink and storage snapshots every " + o.snapInterval.String() + " (" + strings.Join(ch.Options.Addr, ",") + "/" + ch.Database + ")"
		}
		o.logs.announce(out, logger, "pipeline: http %s, brokers %s, catalog %v: %s", a, strings.Join(k.Brokers, ","), o.catalog, what)
	}, func() error { cons.Close(); return nil })
}

// pipelineStatus is /v1/status of the pipeline role.
type pipelineStatus struct {
	plane.Status
	Kafka      *plane.KafkaReport `json:"kafka,omitempty"`
	KafkaError string             `json:"kafka_error,omitempty"`
}

func pipelineHandler(reg *prometheus.Registry, cons *plane.Consumers, k plane.Kafka) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
		defer cancel()
		st := pipelineStatus{Status: cons.Status(ctx)}
		if rep, err := plane.KafkaStatus(ctx, k); err != nil {
			st.KafkaError = err.Error()
		} else {
			st.Kafka = &rep
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(st)
	})
	return mux
}

func newPipelineStatusCmd() *cobra.Command {
	var (
		addr, configPath, nodeID string
		kafka                    kafkaFlags
		asJSON                   bool
		tlsf                     tlsFlags
	)
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the background plane: topics, consumer groups' lag, ClickHouse",
		Long: `Show the background plane as the brokers and the pipeline role see it:
each topic's partitions and retained records, each consumer group's state,
members and lag, and (with --addr, the pipeline role's --http-addr) the
consumers' counters and whether ClickHouse answers.

Exit status 1 when the brokers or the pipeline role cannot be reached.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			set := func(flag string) bool { return cmd.Flags().Changed(flag) }
			var cl *config.Cluster
			if configPath != "" {
				c, err := config.Load(configPath)
				if err != nil {
					return err
				}
				cl = c
				if !set("addr") {
					for _, n := range c.Nodes {
						if n.Has(config.RolePipeline) && (nodeID == "" || n.ID == nodeID) {
							addr = n.PipelineAddr
							break
						}
					}
				}
			}
			k, err := kafka.resolve(cl, set)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 10*time.Second)
			defer cancel()
			var st pipelineStatus
			var errs []error
			if addr != "" {
				tlsL, err := tlsf.clientTLS()
				if err != nil {
					return err
				}
				if err := getJSON(ctx, tlsL, tlsL.Scheme()+"://"+addr+"/v1/status", &st); err != nil {
					errs = append(errs, fmt.Errorf("pipeline role %s: %w", addr, err))
				}
			}
			if st.Kafka == nil && k.Enabled() {
				if rep, err := plane.KafkaStatus(ctx, k); err != nil {
					errs = append(errs, err)
				} else {
					st.Kafka = &rep
				}
			}
			if addr == "" && !k.Enabled() {
				return errors.New("--addr (the pipeline role) or --kafka-brokers is required (or --config)")
			}
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				if err := enc.Encode(st); err != nil {
					return err
				}
			} else {
				printPipelineStatus(cmd.OutOrStdout(), st, addr != "" && len(errs) == 0)
			}
			return errors.Join(errs...)
		},
	}
	f := cmd.Flags()
	tlsf.register(f, false)
	f.StringVar(&addr, "addr", "", "the pipeline role's HTTP address (its --http-addr)")
	kafka.register(f)
	f.StringVar(&configPath, "config", "", "cluster.hcl (brokers and the pipeline node's address)")
	f.StringVar(&nodeID, "node", "", "the pipeline node in --config (default: the first with the pipeline role)")
	f.BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func getJSON(ctx context.Context, tlsL *pki.Loader, url string, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	hc := http.DefaultClient
	if tlsL != nil {
		hc = &http.Client{Transport: tlsL.Transport(&http.Transport{}, pki.RolePipeline)}
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(b)))
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

func printPipelineStatus(w io.Writer, st pipelineStatus, fromRole bool) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if st.Kafka != nil {
		fmt.Fprintf(tw, "brokers\t%s\n\n", strings.Join(st.Kafka.Brokers, ","))
		fmt.Fprintln(tw, "TOPIC\tPARTITIONS\tRECORDS\t")
		for _, t := range st.Kafka.Topics {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%s\n", t.Name, t.Partitions, t.Records, t.Error)
		}
		fmt.Fprintln(tw, "\nGROUP\tTOPIC\tSTATE\tMEMBERS\tLAG\t")
		for _, g := range st.Kafka.Groups {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\n", g.Group, g.Topic, g.State, g.Members, g.Lag, g.Error)
		}
	} else if st.KafkaError != "" {
		fmt.Fprintf(tw, "brokers\tunreachable: %s\n", st.KafkaError)
	}
	if fromRole {
		s := st.Storage
		fmt.Fprintf(tw, "\nstorage consumer\tconsumed %d, applied %d, stale %d, skipped %d, catalog errors %d, lag %d, applied age %s\n",
			s.Consumed, s.Applied, s.Stale, s.Skipped, s.CatalogErrors, s.Lag, s.AppliedAge.Round(time.Millisecond))
		if c := st.ClickHouse; c != nil {
			state := "reachable"
			if !c.Reachable {
				state = "UNREACHABLE: " + c.Error
			}
			fresh := "-"
			if c.Sink.LastCommittedMs > 0 {
				fresh = time.Since(time.UnixMilli(c.Sink.LastCommittedMs)).Round(time.Second).String() + " ago"
			}
			fmt.Fprintf(tw, "clickhouse\t%s (database %s)\n", state, c.Database)
			fmt.Fprintf(tw, "clickhouse sink\tinserted %d events in %d batches, duplicates dropped %d, insert errors %d, lag %d, newest committed window %s\n",
				c.Sink.Inserted, c.Sink.Batches, c.Sink.DuplicatesDropped, c.Sink.InsertErrors, c.Sink.Lag, fresh)
			last := "none yet"
			if c.Snapshots.LastSuccess > 0 {
				last = time.Unix(c.Snapshots.LastSuccess, 0).UTC().Format(time.RFC3339)
			}
			rec := fmt.Sprintf("%d usage events missing over %d producers (last 48 h), checked %s ago", c.Reconcile.Missing, c.Reconcile.Producers,
				time.Since(c.Reconcile.At).Round(time.Second))
			if c.Reconcile.Error != "" {
				rec += "; last check failed: " + c.Reconcile.Error
			}
			fmt.Fprintf(tw, "reconciliation\t%s\n", rec)
			fmt.Fprintf(tw, "storage snapshots\t%d passes, %d rows, newest bucket %s, %d failed attempts (retried), %d buckets missed\n",
				c.Snapshots.Passes, c.Snapshots.Rows, last, c.Snapshots.PassErrors, c.Snapshots.MissedBuckets)
		} else {
			fmt.Fprintln(tw, "clickhouse\tnot configured (analytics off)")
		}
	}
	_ = tw.Flush()
}
