package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"

	"github.com/shoaldb/shoal/edge"
	"github.com/shoaldb/shoal/internal/binding"
	"github.com/shoaldb/shoal/internal/pki"
	"github.com/shoaldb/shoal/internal/srvruntime"
	v4 "github.com/shoaldb/shoal/internal/v4"
	"github.com/shoaldb/shoal/objecthost"
	"github.com/shoaldb/shoal/raftmeta"
)

// devState is what `shoal dev` remembers between runs in DIR/dev.json: the
// secrets it generated and the default account, so a restart prints the same
// token and the client config stays valid.
type devState struct {
	AdminToken string `json:"admin_token"`
	BindingKey string `json:"binding_key"`
	AccountID  string `json:"account_id"`
	Token      string `json:"token"`
	APIURL     string `json:"api_url"`
}

func newDevCmd() *cobra.Command {
	var (
		dir       string
		reset     bool
		nodes     int
		addr      string
		basePort  int
		quietRaft bool
		logs      logFlags
		archive   bool
	)
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run the whole platform in one process on embedded defaults (catalog, edge, object host)",
		Long: `Run a complete Shoal in one process: a Raft catalog (one voter, or three with
--nodes 3, over real TCP on loopback), an object host and an edge serving the
D1-compatible API on --addr. Data lives under --dir and survives restarts;
--reset wipes it first. On first start a default account and API token are
created and saved in DIR/dev.json. Stop with Ctrl-C (or SIGTERM).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			srvruntime.Apply(true)
			if nodes != 1 && nodes != 3 {
				return errors.New("--nodes must be 1 or 3")
			}
			if reset {
				if err := os.RemoveAll(dir); err != nil {
					return fmt.Errorf("reset %s: %w", dir, err)
				}
			}
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return runDev(ctx, cmd.OutOrStdout(), devOptions{dir: dir, nodes: nodes, addr: addr, basePort: basePort, quietRaft: quietRaft, archive: archive, logs: logs})
		},
	}
	cmd.Flags().StringVar(&dir, "dir", ".shoal", "data directory")
	cmd.Flags().BoolVar(&reset, "reset", false, "wipe the data directory before starting")
	cmd.Flags().IntVar(&nodes, "nodes", 1, "catalog voters in this process (1 or 3)")
	cmd.Flags().StringVar(&addr, "addr", "127.0.0.1:8787", "address of the public D1-compatible API")
	cmd.Flags().IntVar(&basePort, "base-port", 17000, "first of the internal loopback ports (raft base+i, catalog base+100+i, object host base+200, Kafka-protocol broker base+300)")
	cmd.Flags().BoolVar(&quietRaft, "quiet", true, "only warnings from the Raft library (--quiet=false: its info lines too, at --log-level info)")
	logs.register(cmd.Flags(), "warn")
	cmd.Flags().BoolVar(&archive, "archive", true, "capture every commit into DIR/archive (time travel, restores); --archive=false turns history off")
	return cmd
}

type devOptions struct {
	dir       string
	archive   bool // history into <dir>/archive (time travel)
	nodes     int
	addr      string
	basePort  int
	quietRaft bool
	logs      logFlags // default level warn: the banner is the output; --log-level info adds the edge's access log
}

// runDev starts the catalog, the object host and the edge, prints how to use
// them, and blocks until ctx ends; then it stops them in reverse order.
func runDev(ctx context.Context, out io.Writer, o devOptions) error {
	logger, err := o.logs.logger()
	if err != nil {
		return err
	}
	st, err := loadDevState(o.dir)
	if err != nil {
		return err
	}

	// 0. The cluster CA and each component's certificate (DIR/pki): every
	// internal call below is mutual TLS with role checks, as in a cluster.
	certs, err := openDevPKI(o.dir, o.nodes)
	if err != nil {
		return fmt.Errorf("dev certificates: %w", err)
	}
	tlsOf := func(name string) (*pki.Loader, error) {
		l, err := certs.loader(name)
		if err != nil {
			return nil, fmt.Errorf("dev certificate %s: %w", name, err)
		}
		return l, nil
	}

	// 1. The catalog: node 1 bootstraps; the others join it. On a restart the
	// Raft state exists and both flags are ignored.
	var rnodes []*raftmeta.Node
	defer func() {
		for i := len(rnodes) - 1; i >= 0; i-- {
			_ = rnodes[i].Close()
		}
	}()
	var catalogAddrs []string
	for i := 0; i < o.nodes; i++ {
		id := "c" + strconv.Itoa(i+1)
		cfg := raftmeta.Config{
			ID:       id,
			Dir:      filepath.Join(o.dir, "catalog", id),
			RaftAddr: fmt.Sprintf("127.0.0.1:%d", o.basePort+i),
			HTTPAddr: fmt.Sprintf("127.0.0.1:%d", o.basePort+100+i),
			Logger:   logger,
			// Each catalog node's /metrics, like the catalog role's.
			Collectors: runtimeCollectors(),
		}
		if !o.quietRaft {
			cfg.RaftLogLevel = "info"
		}
		if cfg.TLS, err = tlsOf(id); err != nil {
			return err
		}
		if i == 0 {
			cfg.Bootstrap = true
		} else {
			cfg.Join = []string{catalogAddrs[0]}
		}
		n, err := raftmeta.NewNode(cfg)
		if err != nil {
			return fmt.Errorf("start catalog node %s: %w", id, err)
		}
		rnodes = append(rnodes, n)
		catalogAddrs = append(catalogAddrs, cfg.HTTPAddr)
	}
	// One catalog client per component, each with its own certificate
	// (the catalog authorises each command by the caller's role).
	clients := map[string]*raftmeta.Client{}
	loaders := map[string]*pki.Loader{}
	for name := range devComponents {
		l, err := tlsOf(name)
		if err != nil {
			return err
		}
		c, err := raftmeta.NewClient(catalogAddrs, raftmeta.WithTLS(l))
		if err != nil {
			return err
		}
		defer c.Close()
		clients[name], loaders[name] = c, l
	}
	client := clients["operator"]
	if err := waitCatalog(ctx, client); err != nil {
		return err
	}

	// 2. The background plane: broker, topics, the host's producer and
	// aggregators, the route publisher, the storage consumer. Closed after
	// the host and the edge (deferred first, so it runs last).
	const hostID = "dev-host-1"
	hostReg, edgeReg := prometheus.NewRegistry(), prometheus.NewRegistry()
	registerRuntime(hostReg)
	registerRuntime(edgeReg)
	pipe, err := startDevPipeline(ctx, o.dir, fmt.Sprintf("127.0.0.1:%d", o.basePort+300),
		fmt.Sprintf("127.0.0.1:%d", o.basePort+310), hostID, clients["pipeline"], clients["limiter"], hostReg, edgeReg, logger)
	if err != nil {
		return err
	}
	defer pipe.Close()

	// 3. The object host. It verifies binding tokens with the edge's key:
	// without it the host has no bound-query endpoint and every binding
	// token the edge mints is refused.
	keys, err := binding.KeyringFromSecrets(st.BindingKey)
	if err != nil {
		return err
	}
	hostAddr := fmt.Sprintf("127.0.0.1:%d", o.basePort+200)
	hcfg := objecthost.Config{
		ID:       hostID,
		Dir:      filepath.Join(o.dir, "objecthost"),
		Address:  hostAddr,
		Region:   "weur",
		Catalog:  objecthost.RaftmetaCatalog{C: clients["host"]},
		Logger:   logger,
		Registry: hostReg,
		TLS:      loaders["host"],
		Bindings: keys,
	}
	if o.archive {
		// The archive stands in for off-host storage: beside the object
		// host's data directory, not inside it.
		if hcfg.History, err = dirHistory(filepath.Join(o.dir, "archive"), hcfg.Dir); err != nil {
			return err
		}
	}
	pipe.hostSinks(&hcfg)
	host, err := objecthost.Open(hcfg)
	if err != nil {
		return fmt.Errorf("start object host: %w", err)
	}
	defer host.Close()
	hostSrv, err := serveHTTP(hostAddr, host.Handler(), loaders["host"], nil)
	if err != nil {
		return fmt.Errorf("object host: %w", err)
	}
	defer shutdownHTTP(hostSrv)

	// 4. The edge, fed routes by the route feed.
	srv, err := edge.New(edge.Options{
		Catalog:        edge.RaftmetaCatalog{C: clients["edge"]},
		HostTLS:        loaders["edge"],
		Dir:            filepath.Join(o.dir, "edge"),
		Region:         "weur",
		AdminToken:     st.AdminToken,
		BindingKeys:    keys,
		RouteFeed:      pipe.routeFeed(),
		Insights:       pipe.insights(),
		AccountChanged: pipe.accountChanged,
		Registry:       edgeReg,
		Logger:         logger,
	})
	if err != nil {
		return fmt.Errorf("start edge: %w", err)
	}
	defer srv.Close()
	edgeSrv, err := serveHTTP(o.addr, srv.Handler(), nil, srv.LeanRoute) // the public API, query routes on the lean path
	if err != nil {
		return fmt.Errorf("edge: %w (is another shoal dev running? use --addr)", err)
	}
	defer shutdownHTTP(edgeSrv)
	registerLeanMetrics(edgeReg, edgeSrv)
	st.APIURL = "http://" + o.addr

	// 5. First start: the default account and its token, through the admin API
	// like an operator would. The saved state is the checkpoint: a crash
	// before it leaves an unused account, and the next start makes another.
	if st.AccountID == "" {
		if err := waitHostRegistered(ctx, client); err != nil {
			return err
		}
		if err := createDevAccount(ctx, st); err != nil {
			return err
		}
		if err := saveDevState(o.dir, st); err != nil {
			return err
		}
	}
	printDevBanner(out, st, o, pipe, certs, catalogAddrs[0])

	<-ctx.Done()
	fmt.Fprintln(out, "\nshutting down…")
	return nil
}

func serveHTTP(addr string, h http.Handler, tlsL *pki.Loader, lean func(method, path string) bool) (*v4.Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	s := v4.NewServer(h, v4.ServerOptions{Lean: lean})
	go func() { _ = serveTLS(s, ln, tlsL) }()
	return s, nil
}

func shutdownHTTP(s *v4.Server) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = s.Shutdown(ctx)
}

func waitCatalog(ctx context.Context, c *raftmeta.Client) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := c.Hosts(ctx, raftmeta.ReadOptions{Consistency: raftmeta.Linearizable, NoCache: true})
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("catalog did not elect a leader: %w", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitHostRegistered waits until the object host's registration is in the
// catalog, so the first create can be placed.
func waitHostRegistered(ctx context.Context, c *raftmeta.Client) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		hosts, err := c.Hosts(ctx, raftmeta.ReadOptions{Consistency: raftmeta.Linearizable, NoCache: true})
		if err == nil && len(hosts) > 0 {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("object host did not register in the catalog: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func createDevAccount(ctx context.Context, st *devState) error {
	var acct edge.AccountJSON
	if err := adminCall(ctx, st.APIURL, st.AdminToken, http.MethodPost, "/admin/v1/accounts", map[string]any{"name": "dev", "tier": "paid"}, &acct); err != nil {
		return fmt.Errorf("create default account: %w", err)
	}
	var tok edge.TokenJSON
	if err := adminCall(ctx, st.APIURL, st.AdminToken, http.MethodPost, "/admin/v1/accounts/"+acct.ID+"/tokens", map[string]any{"name": "dev"}, &tok); err != nil {
		return fmt.Errorf("create default token: %w", err)
	}
	st.AccountID, st.Token = acct.ID, tok.Token
	return nil
}

func loadDevState(dir string) (*devState, error) {
	st := &devState{}
	b, err := os.ReadFile(filepath.Join(dir, "dev.json"))
	switch {
	case err == nil:
		if err := json.Unmarshal(b, st); err != nil {
			return nil, fmt.Errorf("%s: %w (use --reset to start over)", filepath.Join(dir, "dev.json"), err)
		}
	case errors.Is(err, os.ErrNotExist):
	default:
		return nil, err
	}
	if st.AdminToken == "" {
		st.AdminToken = "shoal_admin_" + randomHex(16)
		st.BindingKey = randomHex(32)
		// Persist the secrets before anything uses them.
		if err := saveDevState(dir, st); err != nil {
			return nil, err
		}
	}
	return st, nil
}

func saveDevState(dir string, st *devState) error {
	b, _ := json.MarshalIndent(st, "", "  ")
	tmp := filepath.Join(dir, "dev.json.tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, "dev.json"))
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	return hex.EncodeToString(b)
}

func printDevBanner(out io.Writer, st *devState, o devOptions, pipe *devPipeline, certs *devPKI, catalogAddr string) {
	base := st.APIURL + "/client/v4/accounts/" + st.AccountID + "/d1/database"
	// The client command as this binary was invoked (bin/shoal under make dev).
	d1 := os.Args[0] + " d1"
	if o.dir != ".shoal" {
		d1 += " --dev-dir " + o.dir
	}
	fmt.Fprintf(out, `
Shoal is running (catalog voters: %d, data in %s).

  API URL     %s
  Account ID  %s
  API token   %s
  Admin token %s   (admin API: %s/admin/v1/…)
`, o.nodes, o.dir, st.APIURL, st.AccountID, st.Token, st.AdminToken, st.APIURL)
	if pipe != nil {
		pipe.analyticsLine(out)
	}
	fmt.Fprintf(out, `
Try it:

  export SHOAL_API_URL=%s SHOAL_ACCOUNT_ID=%s SHOAL_API_TOKEN=%s

  # create a database
  curl -s -X POST "%s" -H "Authorization: Bearer $SHOAL_API_TOKEN" -d '{"name":"my-first-db"}'

  # run a query (use the uuid printed by create)
  curl -s -X POST "%s/<uuid>/query" -H "Authorization: Bearer $SHOAL_API_TOKEN" \
       -d '{"sql":"CREATE TABLE t(x); INSERT INTO t VALUES (1),(2); SELECT * FROM t"}'

  # list databases
  curl -s "%s" -H "Authorization: Bearer $SHOAL_API_TOKEN"

Or with the wrangler-like client (it reads %s/dev.json):

  %s create my-second-db
  %s execute my-second-db --command "CREATE TABLE t(x); INSERT INTO t VALUES (1); SELECT * FROM t"
  %s list

Internal calls use mutual TLS with the dev CA in %s; operator commands:

  %s cluster status --addr %s --tls-ca %s --tls-cert %s --tls-key %s

Press Ctrl-C to stop; data survives restarts (--reset wipes it).
`, st.APIURL, st.AccountID, st.Token, base, base, base, o.dir, d1, d1, d1,
		certs.dir, os.Args[0], catalogAddr, certs.files("operator").CA, certs.files("operator").Cert, certs.files("operator").Key)
}
