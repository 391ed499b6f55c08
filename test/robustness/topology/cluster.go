// Package topology runs a Shoal deployment as real processes, one per
// network namespace on a private bridge, so that the robustness suite's
// failpoints act on real processes and real links: kill -9, SIGSTOP, a port
// taken off the bridge, a throttled or delayed link.
package topology

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/shoaldb/shoal/internal/pki"
	"github.com/shoaldb/shoal/objecthost/history"
	"github.com/shoaldb/shoal/raftmeta"
)

// Ports every role listens on, on its own node's address (each node has its
// own namespace, so they never collide).
const (
	catalogHTTPPort = 4001
	raftPort        = 4002
	// RaftPort is the catalog voters' raft port (the follower-lag relay
	// sits in front of it).
	RaftPort     = raftPort
	hostPort     = 4003
	edgePort     = 8787
	pipelinePort = 4005
	limiterPort  = 4007
	s3Port       = 4006
	kafkaPort    = 9092
	// LimiterInterval is the limiter's --interval: the time between its
	// passes.
	LimiterInterval = 2 * time.Second
	// ClickHousePort is the managed clickhouse-server's native port on
	// the pipeline node's own loopback (reach it with ClickHouseQuery).
	ClickHousePort = 9000
	// InsightsPort is where the pipeline node's managed ClickHouse is
	// reachable from the other nodes (Options.EdgeInsights: a Forward in
	// the test process, since the server listens on loopback only).
	InsightsPort = 9010
)

// Options size a Cluster.
type Options struct {
	Bin       string // the shoal binary
	Dir       string // data directories go under it
	Voters    int    // catalog voters (default 3)
	Hosts     int    // object hosts (default 2)
	Edges     int    // edges (default 1)
	Heartbeat time.Duration
	Grace     time.Duration // object hosts' creation grace
	Admin     string        // the edges' admin token
	// HostDisk, when set (e.g. "64m"), gives every object host a tmpfs
	// of that size as its data directory, so the disk-full failpoint
	// fills a small disk rather than the machine's.
	HostDisk string
	// EdgeEnv is added to the edges' environment (e.g. SHOAL_FAILPOINTS).
	EdgeEnv []string
	// Limiter adds the limiter role (`shoal limiter serve`, member l1) in
	// the pipeline node's namespace, where the managed ClickHouse it reads
	// listens on loopback (needs Pipeline).
	Limiter bool
	// LimiterArgs are added to the limiter's command line (e.g.
	// --floor-rows-written-per-day, so free accounts whose own limits are
	// below the tier's are found).
	LimiterArgs []string
	// ArchivedHosts names the object hosts that run with `durability =
	// "archived"` (a write is acknowledged only once the archive store has
	// it; Options.Archive): they read a second cluster file,
	// cluster-archived.hcl, identical but for that line.
	ArchivedHosts []string
	// BindingKey, when set, is the binding-token secret the edges and the
	// object hosts share (--binding-key): POST …/database/{id}/binding
	// mints tokens that route and authenticate without the catalog.
	BindingKey string
	// PipelineEnv is added to the pipeline node's environment (e.g.
	// SHOAL_FAILPOINTS=consumers:stall=100%, toggled by ToggleConsumers).
	PipelineEnv []string
	// Pipeline adds the background plane: node p1 runs `shoal pipeline
	// serve` with the embedded Kafka-protocol broker, a managed
	// clickhouse-server, the storage consumer, the ClickHouse sink and the
	// reconciler; hosts produce usage, storage and routes to it and edges
	// read the route feed from it.
	Pipeline bool
	// Archive adds the object store: node s3 runs S3Bin (cmd/s3node, an
	// S3-protocol server over HTTP keeping its objects in a bbolt file),
	// and every object host captures each commit into it through
	// cluster.hcl's archive block (S3, path style, durability default),
	// read with --config.
	Archive bool
	S3Bin   string
	// ArchiveAlarmLag is the archive block's alarm_lag (default "2s": an
	// object-store outage of a few seconds raises the hosts' lag alarm).
	ArchiveAlarmLag string
	// TLS runs the internal plane as deployed: mutual TLS from a cluster
	// CA made for the run (internal/pki), each member with its role's
	// certificate (--tls-ca/--tls-cert/--tls-key instead of --insecure),
	// and the test's own catalog and HTTP clients with a certificate of
	// every role. The edges' public API stays plain HTTP (clients are D1
	// clients), and so do the Kafka-protocol broker (the embedded broker
	// speaks no TLS) and the object store (an external S3 service).
	TLS bool
	// EdgeInsights gives the edges the pipeline node's ClickHouse as their
	// insights source (--clickhouse-dsn, through a Forward on
	// InsightsPort): GET …/insights answers from the usage the hosts
	// produced. Without it the edges have none and answer insights 503.
	EdgeInsights bool
}

// ArchiveBucket and ArchivePrefix are where the object hosts ship their
// history in the s3 node's store.
const (
	ArchiveBucket = "archive"
	ArchivePrefix = "shoal/"
)

// Member is one process of the cluster and the address it serves on.
type Member struct {
	*Proc
	Addr string // host:port of its HTTP API
	Dir  string // its data directory
	// Scheme is how its HTTP API is reached ("https" on the internal
	// plane under Options.TLS); HTTP is a client that can (the test's
	// certificate).
	Scheme string
	HTTP   *http.Client
}

// URL is the member's HTTP API at path.
func (m *Member) URL(path string) string { return m.Scheme + "://" + m.Addr + path }

// Health is the URL answering 200 once the member serves.
func (m *Member) Health() string {
	if strings.HasPrefix(m.Name, "n") {
		return m.URL("/readyz")
	}
	return m.URL("/healthz")
}

// Cluster is the deployment of docs/operations.md: the catalog bootstrapped
// on n1 and joined by n2…, object hosts h1… and edges e1… whose --catalog
// lists start with a follower (n2) and end with the bootstrap leader.
type Cluster struct {
	Net     *Net
	Catalog []*Member
	Hosts   []*Member
	Edges   []*Member
	// Pipeline is the background plane's node (Options.Pipeline), or nil.
	Pipeline *Member
	// ObjectStore is the s3 node (Options.Archive), or nil.
	ObjectStore *Member
	// Limiter is the limiter role (Options.Limiter), or nil: a process of
	// its own on the pipeline node's namespace.
	Limiter *Member
	// Config is the cluster.hcl the object hosts read (Options.Archive);
	// ArchivedConfig the one of Options.ArchivedHosts.
	Config, ArchivedConfig string
	Admin                  string
	mounts                 []string   // tmpfs data directories, unmounted by Stop
	forwards               []*Forward // closed by Stop
	// tls is the test's own certificate (every role) under Options.TLS,
	// nil otherwise (pki.Loader's methods take nil as "no TLS").
	tls     *pki.Loader
	certDir string // where the members' certificates are (Options.TLS)
	// bin is the shoal binary; cliSec the security flags of the test's
	// own `shoal` commands (its certificate under Options.TLS, none
	// otherwise): CLI.
	bin    string
	cliSec []string
}

// TLS is the test's own certificate loader (nil without Options.TLS).
func (c *Cluster) TLS() *pki.Loader { return c.tls }

// Start creates the nodes on net and starts every member, waiting until each
// is healthy and the hosts are registered. On error the caller still owns
// Stop (members started so far are in the Cluster).
func Start(ctx context.Context, net *Net, o Options) (*Cluster, error) {
	o = o.withDefaults()
	c := &Cluster{Net: net, Admin: o.Admin, bin: o.Bin}
	// sec are a member's security flags: its certificate under
	// Options.TLS, else --insecure.
	sec := func(string, ...string) []string { return []string{"--insecure"} }
	var certErr error // a certificate sec could not issue
	plain := &http.Client{Timeout: 2 * time.Second}
	internal := plain
	if o.TLS {
		caDir, certs := filepath.Join(o.Dir, "pki", "ca"), filepath.Join(o.Dir, "pki", "nodes")
		c.certDir = certs
		if _, err := pki.InitCA(caDir, "robustness CA", 24*time.Hour); err != nil {
			return c, err
		}
		sec = func(node string, roles ...string) []string {
			f, err := pki.Issue(caDir, certs, pki.IssueRequest{Node: node, Roles: roles, Validity: 24 * time.Hour}, false)
			if err != nil {
				certErr = fmt.Errorf("certificate of %s: %w", node, err)
				return nil
			}
			return []string{"--tls-ca", f.CA, "--tls-cert", f.Cert, "--tls-key", f.Key}
		}
		f, err := pki.Issue(caDir, certs, pki.IssueRequest{Node: "robustness-test", Roles: pki.AllRoles, Validity: 24 * time.Hour}, false)
		if err != nil {
			return c, err
		}
		if c.tls, err = pki.NewLoader(f); err != nil {
			return c, err
		}
		c.cliSec = []string{"--tls-ca", f.CA, "--tls-cert", f.Cert, "--tls-key", f.Key}
		internal = &http.Client{Timeout: 2 * time.Second, Transport: c.tls.Transport(&http.Transport{})}
	}
	var env []string
	named := func(list *[]*Member, name string, nd *Node, port int, bin string, args func(addr string) []string) error {
		addr := fmt.Sprintf("%s:%d", nd.IP, port)
		argv := args(addr)
		if certErr != nil {
			return certErr
		}
		p, err := StartProcEnv(nd, name, env, bin, argv...)
		if p != nil {
			m := &Member{Proc: p, Addr: addr, Dir: filepath.Join(o.Dir, name), Scheme: c.tls.Scheme(), HTTP: internal}
			if port == edgePort || bin == o.S3Bin {
				m.Scheme, m.HTTP = "http", plain // the public API; the object store
			}
			*list = append(*list, m)
		}
		if err != nil {
			return err
		}
		return waitHealthy(ctx, (*list)[len(*list)-1], 60*time.Second)
	}
	addOn := func(list *[]*Member, nd *Node, port int, bin string, args func(addr string) []string) error {
		return named(list, nd.Name, nd, port, bin, args)
	}
	add := func(list *[]*Member, name string, port int, args func(addr string) []string) error {
		nd, err := net.AddNode(name)
		if err != nil {
			return err
		}
		return addOn(list, nd, port, o.Bin, args)
	}
	for i := range o.Voters {
		id := fmt.Sprintf("n%d", i+1)
		err := add(&c.Catalog, id, catalogHTTPPort, func(addr string) []string {
			a := append([]string{"raftmeta", "serve", "--id", id, "--dir", filepath.Join(o.Dir, id),
				"--raft-addr", strings.TrimSuffix(addr, fmt.Sprint(catalogHTTPPort)) + fmt.Sprint(raftPort),
				"--http-addr", addr, "--log-level", "warn"}, sec(id, pki.RoleCatalog)...)
			if i == 0 {
				return append(a, "--bootstrap")
			}
			return append(a, "--join", c.Catalog[0].Addr)
		})
		if err != nil {
			return c, err
		}
	}
	catalog := c.catalogList()
	var kafka []string
	var insightsDSN string // the edges' --clickhouse-dsn (Options.EdgeInsights)
	if o.Pipeline {
		var ps []*Member
		env = o.PipelineEnv
		err := add(&ps, "p1", pipelinePort, func(addr string) []string {
			ip := strings.TrimSuffix(addr, fmt.Sprintf(":%d", pipelinePort))
			kafka = []string{"--kafka-brokers", fmt.Sprintf("%s:%d", ip, kafkaPort)}
			return append([]string{"pipeline", "serve", "--http-addr", addr, "--dir", filepath.Join(o.Dir, "p1"),
				"--catalog", catalog, kafka[0], kafka[1], "--embedded-broker",
				"--managed-clickhouse", "--managed-clickhouse-addr", fmt.Sprintf("127.0.0.1:%d", ClickHousePort),
				"--reconcile-interval", "2s", "--log-level", "warn"}, sec("p1", pki.RolePipeline)...)
		})
		env = nil
		if len(ps) > 0 {
			c.Pipeline = ps[0]
		}
		if err != nil {
			return c, err
		}
		if o.EdgeInsights {
			fw, err := c.Pipeline.Node().ForwardLoopback(InsightsPort, ClickHousePort)
			if err != nil {
				return c, err
			}
			c.forwards = append(c.forwards, fw)
			insightsDSN = fmt.Sprintf("clickhouse://%s:%d/shoal", c.Pipeline.Node().IP, InsightsPort)
		}
		if o.Limiter {
			var ls []*Member
			err := named(&ls, "l1", c.Pipeline.Node(), limiterPort, o.Bin, func(addr string) []string {
				return append(append([]string{"limiter", "serve", "--http-addr", addr, "--catalog", catalog, kafka[0], kafka[1],
					"--clickhouse-dsn", fmt.Sprintf("clickhouse://127.0.0.1:%d/shoal", ClickHousePort), "--interval", LimiterInterval.String(), "--log-level", "warn"},
					o.LimiterArgs...), sec("l1", pki.RoleLimiter)...)
			})
			if len(ls) > 0 {
				c.Limiter = ls[0]
			}
			if err != nil {
				return c, err
			}
		}
	}
	var hostNodes []*Node
	for i := range o.Hosts {
		nd, err := net.AddNode(fmt.Sprintf("h%d", i+1))
		if err != nil {
			return c, err
		}
		hostNodes = append(hostNodes, nd)
	}
	var hostConfig []string
	if o.Archive {
		var ss []*Member
		if o.S3Bin == "" {
			return c, errors.New("Options.Archive needs S3Bin (cmd/s3node)")
		}
		if err := os.MkdirAll(filepath.Join(o.Dir, "s3"), 0o755); err != nil {
			return c, err
		}
		nd, err := net.AddNode("s3")
		if err != nil {
			return c, err
		}
		err = addOn(&ss, nd, s3Port, o.S3Bin, func(addr string) []string {
			return []string{"--addr", addr, "--db", filepath.Join(o.Dir, "s3", "s3.bolt"), "--bucket", ArchiveBucket}
		})
		if len(ss) > 0 {
			c.ObjectStore = ss[0]
		}
		if err != nil {
			return c, err
		}
		if c.Config, err = c.writeConfig(o, hostNodes, kafka, "default"); err != nil {
			return c, err
		}
		hostConfig = []string{"--config", c.Config}
		if len(o.ArchivedHosts) > 0 {
			if c.ArchivedConfig, err = c.writeConfig(o, hostNodes, kafka, "archived"); err != nil {
				return c, err
			}
		}
	}
	for _, nd := range hostNodes {
		id := nd.Name
		if o.HostDisk != "" {
			dir := filepath.Join(o.Dir, id)
			if err := mountTmpfs(dir, o.HostDisk); err != nil {
				return c, err
			}
			c.mounts = append(c.mounts, dir)
		}
		err := addOn(&c.Hosts, nd, hostPort, o.Bin, func(addr string) []string {
			a := append(append([]string{"objecthost", "serve", "--id", id, "--dir", filepath.Join(o.Dir, id),
				"--http-addr", addr, "--region", "weur", "--catalog", catalog, "--log-level", "warn",
				"--heartbeat-interval", o.Heartbeat.String(), "--creation-grace", o.Grace.String()}, kafka...), sec(id, pki.RoleHost)...)
			if o.BindingKey != "" {
				a = append(a, "--binding-key", o.BindingKey)
			}
			if len(hostConfig) > 0 {
				conf := hostConfig
				if slices.Contains(o.ArchivedHosts, id) {
					conf = []string{"--config", c.ArchivedConfig}
				}
				a = append(append(a, conf...), "--node", id)
				if len(kafka) == 0 {
					a = append(a, "--kafka-brokers=") // the file's kafka block is not this topology's
				}
			}
			return a
		})
		if err != nil {
			return c, err
		}
	}
	env = o.EdgeEnv
	for i := range o.Edges {
		id := fmt.Sprintf("e%d", i+1)
		err := add(&c.Edges, id, edgePort, func(addr string) []string {
			// Rate limits far above what the generators send: they are
			// not what the suite is about.
			a := append(append([]string{"edge", "serve", "--http-addr", addr, "--dir", filepath.Join(o.Dir, id),
				"--region", "weur", "--catalog", catalog, "--admin-token", o.Admin, "--log-level", "warn",
				"--account-rate", "100000", "--database-rate", "100000"}, kafka...), sec(id, pki.RoleEdge)...)
			if o.BindingKey != "" {
				a = append(a, "--binding-key", o.BindingKey)
			}
			if insightsDSN != "" {
				a = append(a, "--clickhouse-dsn", insightsDSN)
			}
			return a
		})
		if err != nil {
			return c, err
		}
	}
	reader, err := c.CatalogClient()
	if err != nil {
		return c, err
	}
	defer reader.Close()
	for ctx.Err() == nil {
		hs, err := reader.Hosts(ctx, raftmeta.LinearizableRead())
		if err == nil && len(hs) == o.Hosts {
			return c, nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return c, fmt.Errorf("object hosts never registered: %w", ctx.Err())
}

func (o Options) withDefaults() Options {
	if o.Voters == 0 {
		o.Voters = 3
	}
	if o.Hosts == 0 {
		o.Hosts = 2
	}
	if o.Edges == 0 {
		o.Edges = 1
	}
	if o.Heartbeat == 0 {
		o.Heartbeat = time.Second
	}
	if o.Grace == 0 {
		o.Grace = 3 * time.Second
	}
	if o.Admin == "" {
		o.Admin = "robustness-admin-token"
	}
	if o.ArchiveAlarmLag == "" {
		o.ArchiveAlarmLag = "2s"
	}
	return o
}

// archiveSecret is the s3 node's secret key (gofakes3 checks no signature;
// the hosts sign with it all the same, as against a real store).
const archiveSecret = "robustness-archive-secret"

// writeConfig writes the cluster.hcl the object hosts read: the catalog,
// the pipeline node and the hosts as started here, the embedded broker,
// and the archive block naming the s3 node. (Edges take flags only; every
// flag a host is given explicitly wins over the file.)
func (c *Cluster) writeConfig(o Options, hosts []*Node, kafka []string, durability string) (string, error) {
	secret := filepath.Join(o.Dir, "s3", "secret")
	if err := os.WriteFile(secret, []byte(archiveSecret+"\n"), 0o600); err != nil {
		return "", err
	}
	var b strings.Builder
	b.WriteString("# Written by test/robustness/topology for one run. Object hosts read it\n")
	b.WriteString("# (--config FILE --node hN) for its archive block; their flags win.\n")
	b.WriteString("region = \"weur\"\n")
	if c.tls == nil {
		b.WriteString("insecure = true # the internal plane without TLS (Options.TLS runs it with mutual TLS)\n")
	} else {
		fmt.Fprintf(&b, "tls {\n  ca_file  = %q\n  cert_dir = %q\n}\n", filepath.Join(c.certDir, "ca.crt"), c.certDir)
	}
	b.WriteString("\n")
	for _, m := range c.Catalog {
		raft := strings.TrimSuffix(m.Addr, fmt.Sprint(catalogHTTPPort)) + fmt.Sprint(raftPort)
		fmt.Fprintf(&b, "node %q {\n  roles = [\"raftmeta\"]\n  raft_addr = %q\n  catalog_addr = %q\n}\n", m.Name, raft, m.Addr)
	}
	if c.Pipeline != nil {
		fmt.Fprintf(&b, "node %q {\n  roles = [\"pipeline\"]\n  pipeline_addr = %q\n}\n", c.Pipeline.Name, c.Pipeline.Addr)
	}
	for _, nd := range hosts {
		fmt.Fprintf(&b, "node %q {\n  roles = [\"objecthost\"]\n  objecthost_addr = \"%s:%d\"\n}\n", nd.Name, nd.IP, hostPort)
	}
	if len(kafka) == 2 {
		fmt.Fprintf(&b, "\nkafka {\n  embedded = true\n  brokers = [%q]\n}\n", kafka[1])
	}
	fmt.Fprintf(&b, `
archive {
  endpoint        = %q
  bucket          = %q
  prefix          = %q
  region          = "us-east-1"
  access_key      = "robustness"
  secret_key_file = %q
  tls             = false
  path_style      = true
  durability      = %q
  alarm_lag       = %q
  scrub_interval  = "20s"
}
`, c.ObjectStore.Addr, ArchiveBucket, ArchivePrefix, secret, durability, o.ArchiveAlarmLag)
	path := filepath.Join(o.Dir, "cluster.hcl")
	if durability != "default" {
		path = filepath.Join(o.Dir, "cluster-"+durability+".hcl")
	}
	return path, os.WriteFile(path, []byte(b.String()), 0o644)
}

// ArchiveStore is a client of the s3 node's archive (the bucket and prefix
// the hosts ship to), for the test's own reads: Verify and Restore.
func (c *Cluster) ArchiveStore() (*history.S3Store, error) {
	if c.ObjectStore == nil {
		return nil, errors.New("no object store in this topology")
	}
	return history.NewS3Store(history.S3Config{Endpoint: c.ObjectStore.Addr, Bucket: ArchiveBucket, Prefix: ArchivePrefix,
		Region: "us-east-1", AccessKey: "robustness", SecretKey: archiveSecret, PathStyle: true, MaxRetries: 3})
}

// catalogList is the --catalog flag of hosts and edges: n2, n3, …, n1.
func (c *Cluster) catalogList() string {
	var addrs []string
	for _, m := range c.Catalog[1:] {
		addrs = append(addrs, m.Addr)
	}
	return strings.Join(append(addrs, c.Catalog[0].Addr), ",")
}

// CatalogAddrs are the catalog members' HTTP addresses, n1 first.
func (c *Cluster) CatalogAddrs() []string {
	var out []string
	for _, m := range c.Catalog {
		out = append(out, m.Addr)
	}
	return out
}

// CatalogClient is a catalog client for the test's own view (the caller
// closes it).
func (c *Cluster) CatalogClient() (*raftmeta.Client, error) {
	return raftmeta.NewClient(c.CatalogAddrs(), raftmeta.WithCacheTTL(0), raftmeta.WithTLS(c.tls))
}

// EdgeURLs are the edges' base URLs.
func (c *Cluster) EdgeURLs() []string {
	var out []string
	for _, m := range c.Edges {
		out = append(out, "http://"+m.Addr)
	}
	return out
}

// Members is every member, catalog first, then the pipeline node and the
// object store.
func (c *Cluster) Members() []*Member {
	ms := append([]*Member(nil), c.Catalog...)
	if c.Pipeline != nil {
		ms = append(ms, c.Pipeline)
	}
	if c.ObjectStore != nil {
		ms = append(ms, c.ObjectStore)
	}
	if c.Limiter != nil {
		ms = append(ms, c.Limiter)
	}
	return append(append(ms, c.Hosts...), c.Edges...)
}

// ClickHouseQuery runs query on the pipeline node's managed ClickHouse
// (clickhouse-client inside its namespace) and returns the TSV answer.
func (c *Cluster) ClickHouseQuery(ctx context.Context, query string) (string, error) {
	if c.Pipeline == nil {
		return "", errors.New("no pipeline node")
	}
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", c.Pipeline.Node().NS, "clickhouse-client",
		"--port", fmt.Sprint(ClickHousePort), "--query", query)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("clickhouse-client: %w: %s", err, out)
	}
	return string(out), nil
}

// Leader returns the catalog member a majority of the reachable members name
// as leader (an isolated old leader may still believe it leads).
func (c *Cluster) Leader(ctx context.Context) (*Member, error) {
	for ctx.Err() == nil {
		votes := map[string]int{}
		for _, m := range c.Catalog {
			sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			st, err := raftmeta.NewAdmin(m.Addr, 2*time.Second, c.tls).Status(sctx)
			cancel()
			if err == nil && st.Leader != "" {
				votes[st.Leader]++
			}
		}
		for _, m := range c.Catalog {
			if votes[m.Name] > len(c.Catalog)/2 {
				return m, nil
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	return nil, fmt.Errorf("no catalog leader named by a majority: %w", ctx.Err())
}

// WaitHealthy waits until m serves again (after a restart or a heal).
func (c *Cluster) WaitHealthy(ctx context.Context, m *Member, within time.Duration) error {
	return waitHealthy(ctx, m, within)
}

func waitHealthy(ctx context.Context, m *Member, within time.Duration) error {
	hc := m.HTTP
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if !m.Running() {
			return fmt.Errorf("%s exited: %s", m.Name, tailOf(m.Output(), 2000))
		}
		resp, err := hc.Get(m.Health())
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("%s not healthy within %s: %s", m.Name, within, tailOf(m.Output(), 2000))
}

// Stop kills every member (edges first) and returns when all have exited.
func (c *Cluster) Stop() error {
	var errs []error
	ms := c.Members()
	for i := len(ms) - 1; i >= 0; i-- {
		if err := ms[i].Kill(); err != nil {
			errs = append(errs, err)
		}
	}
	for _, dir := range c.mounts {
		if err := run("umount", dir); err != nil {
			errs = append(errs, err)
		}
	}
	c.mounts = nil
	for _, f := range c.forwards {
		if err := f.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	c.forwards = nil
	return errors.Join(errs...)
}

// mountTmpfs mounts a tmpfs of size at dir (created if missing).
func mountTmpfs(dir, size string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return run("mount", "-t", "tmpfs", "-o", "size="+size+",mode=0755", "tmpfs", dir)
}

func tailOf(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}
