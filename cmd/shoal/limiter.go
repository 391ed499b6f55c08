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
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"

	"github.com/shoaldb/shoal/internal/config"
	"github.com/shoaldb/shoal/internal/plane"
	"github.com/shoaldb/shoal/internal/profiling"
	"github.com/shoaldb/shoal/internal/srvruntime"
	v4 "github.com/shoaldb/shoal/internal/v4"
	"github.com/shoaldb/shoal/limiter"
	"github.com/shoaldb/shoal/pipeline/chsink"
	"github.com/shoaldb/shoal/raftmeta"
)

func newLimiterCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "limiter", Short: "Run the limiter: free-tier daily row limits (flags, notices, clears)"}
	cmd.AddCommand(newLimiterServeCmd())
	return cmd
}

type limiterServeOpts struct {
	tls           tlsFlags
	httpAddr      string
	catalog       []string
	kafka         kafkaFlags
	clickhouseDSN string
	interval      time.Duration
	rowsRead      int64
	rowsWritten   int64
	floorRead     int64
	floorWritten  int64
	group         string

	smtpAddr, smtpFrom, smtpTo string
	smtpUser, smtpPassFile     string
	smtpStartTLS               bool

	webhookURL, webhookSecretFile string

	configPath, nodeID string
	logs               logFlags
}

func newLimiterServeCmd() *cobra.Command {
	var o limiterServeOpts
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve the limiter role until SIGINT/SIGTERM",
		Long: `Serve the limiter role. Every --interval (default 10s) the active limiter asks
ClickHouse for today's (UTC) rows read and written per account over the free
tier's thresholds (5,000,000 read / 100,000 written per day, or cluster.hcl's
tier "free" block, or --rows-read-per-day / --rows-written-per-day), checks
each candidate's tier and own limits in the catalog (only the free tier is
limited), publishes a limited flag on the compacted limits topic that lifts
at the end of the UTC day, and notifies the account once per day: by mail
(--smtp-addr, --smtp-from, --smtp-to) and/or by webhook (--webhook-url,
--webhook-secret-file signs the body: X-Shoal-Signature: sha256=HMAC).
An accounts event moving an account off the free tier publishes a clearing
record at once.

Run several for availability: they share the consumer group --group on the
accounts topic and the member owning its partition 0 acts (failover within
the 10 s session timeout); the catalog's claim_limit_notice command keeps
the notice once per account and day whatever happens (limiter/DESIGN.md).

Accounts have no e-mail address in the catalog: --smtp-to is a template
with {account_id} and {account_name} (default "{account_name}", for
accounts named by their address).

/metrics (shoal_limiter_*), /healthz and /v1/status on --http-addr.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			srvruntime.Apply(true)
			return runLimiterServe(cmd, &o)
		},
	}
	f := cmd.Flags()
	o.tls.register(f, true)
	f.StringVar(&o.httpAddr, "http-addr", "", "listen address of /metrics, /healthz and /v1/status (required)")
	f.StringSliceVar(&o.catalog, "catalog", nil, "catalog nodes' HTTP addresses (ADDR[,ADDR])")
	o.kafka.register(f)
	f.StringVar(&o.clickhouseDSN, "clickhouse-dsn", "", "ClickHouse DSN (native protocol); the path names the tables' database (default shoal)")
	f.DurationVar(&o.interval, "interval", 10*time.Second, "time between passes")
	f.Int64Var(&o.rowsRead, "rows-read-per-day", 0, "free tier's rows read per UTC day (default 5000000, or cluster.hcl's tier \"free\")")
	f.Int64Var(&o.rowsWritten, "rows-written-per-day", 0, "free tier's rows written per UTC day (default 100000, or cluster.hcl's tier \"free\")")
	f.Int64Var(&o.floorRead, "floor-rows-read-per-day", 0, "lowest rows-read limit any free account has of its own (accounts with their own lower limits are found only above this; default the tier's)")
	f.Int64Var(&o.floorWritten, "floor-rows-written-per-day", 0, "lowest rows-written limit any free account has of its own (default the tier's)")
	f.StringVar(&o.group, "group", limiter.DefaultGroup, "consumer group of the accounts topic shared by the limiters (leadership)")
	f.StringVar(&o.smtpAddr, "smtp-addr", "", "SMTP server HOST:PORT for notices (none: no mail)")
	f.StringVar(&o.smtpFrom, "smtp-from", "", "sender address of notices")
	f.StringVar(&o.smtpTo, "smtp-to", "{account_name}", "recipient template: {account_id} and {account_name} are replaced")
	f.StringVar(&o.smtpUser, "smtp-user", "", "SMTP AUTH PLAIN user (sent only over TLS or to localhost)")
	f.StringVar(&o.smtpPassFile, "smtp-password-file", "", "file holding the SMTP password (default $SHOAL_SMTP_PASSWORD)")
	f.BoolVar(&o.smtpStartTLS, "smtp-starttls", false, "require STARTTLS (certificate checked against the system pool)")
	f.StringVar(&o.webhookURL, "webhook-url", "", "URL notices are POSTed to as JSON (none: no webhook)")
	f.StringVar(&o.webhookSecretFile, "webhook-secret-file", "", "file holding the HMAC-SHA256 key of X-Shoal-Signature (default $SHOAL_WEBHOOK_SECRET)")
	f.StringVar(&o.configPath, "config", "", "cluster.hcl (catalog, kafka, clickhouse, tier blocks)")
	f.StringVar(&o.nodeID, "node", "", "this node's ID in --config (a node with the limiter role)")
	o.logs.register(f, "info")
	return cmd
}

func readSecret(file, env string) (string, error) {
	if file == "" {
		return os.Getenv(env), nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", err
	}
	return strings.TrimRight(string(b), "\r\n"), nil
}

func runLimiterServe(cmd *cobra.Command, o *limiterServeOpts) error {
	set := func(flag string) bool { return cmd.Flags().Changed(flag) }
	free := limiter.FreeTier
	var cl *config.Cluster
	if o.configPath != "" {
		c, n, err := loadNode(o.configPath, o.nodeID, config.RoleLimiter)
		if err != nil {
			return err
		}
		cl = c
		if !set("catalog") {
			o.catalog = c.CatalogAddrs(n.Region)
		}
		if ch := c.ClickHouse; ch != nil && !set("clickhouse-dsn") {
			o.clickhouseDSN = ch.DSN
			if ch.Managed && ch.Addr != "" {
				o.clickhouseDSN = "clickhouse://default:@" + ch.Addr + "/shoal" // the pipeline role's managed server
			}
		}
		if !set("http-addr") {
			o.httpAddr = n.LimiterAddr
		}
		if l := c.Limiter; l != nil {
			str := func(flag string, dst *string, v string) {
				if !set(flag) && v != "" {
					*dst = v
				}
			}
			if !set("interval") && l.Interval != "" {
				o.interval, _ = time.ParseDuration(l.Interval) // validated by config.Load
			}
			str("smtp-addr", &o.smtpAddr, l.SMTPAddr)
			str("smtp-from", &o.smtpFrom, l.SMTPFrom)
			str("smtp-to", &o.smtpTo, l.SMTPTo)
			str("smtp-user", &o.smtpUser, l.SMTPUser)
			str("smtp-password-file", &o.smtpPassFile, l.SMTPPasswordFile)
			str("webhook-url", &o.webhookURL, l.WebhookURL)
			str("webhook-secret-file", &o.webhookSecretFile, l.WebhookSecretFile)
			if !set("smtp-starttls") && l.SMTPStartTLS {
				o.smtpStartTLS = true
			}
		}
		if t := clusterTiers(c)["free"]; t.RowsReadPerDay > 0 || t.RowsWrittenPerDay > 0 {
			free.RowsReadPerDay, free.RowsWrittenPerDay = t.RowsReadPerDay, t.RowsWrittenPerDay
		}
	}
	if o.rowsRead > 0 {
		free.RowsReadPerDay = o.rowsRead
	}
	if o.rowsWritten > 0 {
		free.RowsWrittenPerDay = o.rowsWritten
	}
	k, err := o.kafka.resolve(cl, set)
	if err != nil {
		return err
	}
	switch {
	case o.httpAddr == "" || len(o.catalog) == 0:
		return errors.New("--http-addr and --catalog are required (--catalog may come from --config with --node)")
	case !k.Enabled():
		return errors.New("--kafka-brokers is required (or a kafka block in --config)")
	case o.clickhouseDSN == "":
		return errors.New("--clickhouse-dsn is required (or a clickhouse block with a dsn in --config)")
	}
	var notify limiter.NotifyConfig
	if o.smtpAddr != "" {
		pass, err := readSecret(o.smtpPassFile, "SHOAL_SMTP_PASSWORD")
		if err != nil {
			return fmt.Errorf("--smtp-password-file: %w", err)
		}
		notify.SMTP = &limiter.SMTPConfig{Addr: o.smtpAddr, From: o.smtpFrom, To: o.smtpTo, Username: o.smtpUser,
			Password: pass, StartTLS: o.smtpStartTLS}
	}
	if o.webhookURL != "" {
		secret, err := readSecret(o.webhookSecretFile, "SHOAL_WEBHOOK_SECRET")
		if err != nil {
			return fmt.Errorf("--webhook-secret-file: %w", err)
		}
		notify.Webhook = &limiter.WebhookConfig{URL: o.webhookURL, Secret: secret}
	}
	logger, err := o.logs.logger()
	if err != nil {
		return err
	}
	out := cmd.OutOrStdout()
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	ch, err := plane.ParseClickHouseDSN(o.clickhouseDSN)
	if err != nil {
		return err
	}
	store, err := chsink.Open(chsink.StoreConfig{Options: ch.Options, Database: ch.Database, Logger: logger})
	if err != nil {
		return err
	}
	defer store.Close()
	tlsL, err := o.tls.roleTLS(cl, nodeIDOr(o.nodeID, "limiter"), logger, "limiter")
	if err != nil {
		return err
	}
	client, err := raftmeta.NewClient(o.catalog, raftmeta.WithTLS(tlsL))
	if err != nil {
		return err
	}
	defer client.Close()
	tctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	err = plane.EnsureTopics(tctx, k, logger)
	cancel()
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	registerRuntime(reg)
	lim, err := limiter.Start(limiter.Config{Kafka: k, Store: store, Catalog: client, Free: free, FloorRead: o.floorRead, FloorWritten: o.floorWritten, Interval: o.interval,
		Notify: notify, Group: o.group, Registerer: reg, Logger: logger})
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(lim.Status())
	})
	// Go profiles beside them, for operators (internal/profiling).
	srv := v4.NewServer(profiling.Wrap(mux, tlsL != nil), v4.ServerOptions{})
	return serveRole(ctx, o.httpAddr, srv, tlsL, func(a net.Addr) {
		ch := []string{}
		if notify.SMTP != nil {
			ch = append(ch, "smtp "+o.smtpAddr)
		}
		if notify.Webhook != nil {
			ch = append(ch, "webhook "+o.webhookURL)
		}
		if len(ch) == 0 {
			ch = append(ch, "none (flags only)")
		}
		o.logs.announce(out, logger, "limiter: http %s, brokers %s, catalog %v, every %s, free tier %d read / %d written per day, notices: %s",
			a, strings.Join(k.Brokers, ","), o.catalog, o.interval, free.RowsReadPerDay, free.RowsWrittenPerDay, strings.Join(ch, ", "))
	}, func() error { lim.Close(); return nil })
}
