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
	"strings"
	"time"

	"github.com/shoaldb/shoal/raftmeta"
)

// Ports every role listens on, on its own node's address (each node has its
// own namespace, so they never collide).
const (
	catalogHTTPPort = 4001
	raftPort        = 4002
	hostPort        = 4003
	edgePort        = 8787
	pipelinePort    = 4005
	kafkaPort       = 9092
	// ClickHousePort is the managed clickhouse-server's native port on
	// the pipeline node's own loopback (reach it with ClickHouseQuery).
	ClickHousePort = 9000
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
	// Pipeline adds the background plane: node p1 runs `shoal pipeline
	// serve` with the embedded Kafka-protocol broker, a managed
	// clickhouse-server, the storage consumer, the ClickHouse sink and the
	// reconciler; hosts produce usage, storage and routes to it and edges
	// read the route feed from it.
	Pipeline bool
}

// Member is one process of the cluster and the address it serves on.
type Member struct {
	*Proc
	Addr string // host:port of its HTTP API
	Dir  string // its data directory
}

// Health is the URL answering 200 once the member serves.
func (m *Member) Health() string {
	if strings.HasPrefix(m.Name, "n") {
		return "http://" + m.Addr + "/readyz"
	}
	return "http://" + m.Addr + "/healthz"
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
	Admin    string
	mounts   []string // tmpfs data directories, unmounted by Stop
}

// Start creates the nodes on net and starts every member, waiting until each
// is healthy and the hosts are registered. On error the caller still owns
// Stop (members started so far are in the Cluster).
func Start(ctx context.Context, net *Net, o Options) (*Cluster, error) {
	o = o.withDefaults()
	c := &Cluster{Net: net, Admin: o.Admin}
	var env []string
	add := func(list *[]*Member, name string, port int, args func(addr string) []string) error {
		nd, err := net.AddNode(name)
		if err != nil {
			return err
		}
		addr := fmt.Sprintf("%s:%d", nd.IP, port)
		p, err := StartProcEnv(nd, name, env, o.Bin, args(addr)...)
		if p != nil {
			*list = append(*list, &Member{Proc: p, Addr: addr, Dir: filepath.Join(o.Dir, name)})
		}
		if err != nil {
			return err
		}
		return waitHealthy(ctx, (*list)[len(*list)-1], 60*time.Second)
	}
	for i := range o.Voters {
		id := fmt.Sprintf("n%d", i+1)
		err := add(&c.Catalog, id, catalogHTTPPort, func(addr string) []string {
			a := []string{"raftmeta", "serve", "--id", id, "--dir", filepath.Join(o.Dir, id),
				"--raft-addr", strings.TrimSuffix(addr, fmt.Sprint(catalogHTTPPort)) + fmt.Sprint(raftPort),
				"--http-addr", addr, "--log-level", "warn"}
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
	if o.Pipeline {
		var ps []*Member
		err := add(&ps, "p1", pipelinePort, func(addr string) []string {
			ip := strings.TrimSuffix(addr, fmt.Sprintf(":%d", pipelinePort))
			kafka = []string{"--kafka-brokers", fmt.Sprintf("%s:%d", ip, kafkaPort)}
			return []string{"pipeline", "serve", "--http-addr", addr, "--dir", filepath.Join(o.Dir, "p1"),
				"--catalog", catalog, kafka[0], kafka[1], "--embedded-broker",
				"--managed-clickhouse", "--managed-clickhouse-addr", fmt.Sprintf("127.0.0.1:%d", ClickHousePort),
				"--reconcile-interval", "2s", "--log-level", "warn"}
		})
		if len(ps) > 0 {
			c.Pipeline = ps[0]
		}
		if err != nil {
			return c, err
		}
	}
	for i := range o.Hosts {
		id := fmt.Sprintf("h%d", i+1)
		if o.HostDisk != "" {
			dir := filepath.Join(o.Dir, id)
			if err := mountTmpfs(dir, o.HostDisk); err != nil {
				return c, err
			}
			c.mounts = append(c.mounts, dir)
		}
		err := add(&c.Hosts, id, hostPort, func(addr string) []string {
			return append([]string{"objecthost", "serve", "--id", id, "--dir", filepath.Join(o.Dir, id),
				"--http-addr", addr, "--region", "weur", "--catalog", catalog, "--log-level", "warn",
				"--heartbeat-interval", o.Heartbeat.String(), "--creation-grace", o.Grace.String()}, kafka...)
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
			return append([]string{"edge", "serve", "--http-addr", addr, "--dir", filepath.Join(o.Dir, id),
				"--region", "weur", "--catalog", catalog, "--admin-token", o.Admin, "--log-level", "warn",
				"--account-rate", "100000", "--database-rate", "100000"}, kafka...)
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
	return o
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
	return raftmeta.NewClient(c.CatalogAddrs(), raftmeta.WithCacheTTL(0))
}

// EdgeURLs are the edges' base URLs.
func (c *Cluster) EdgeURLs() []string {
	var out []string
	for _, m := range c.Edges {
		out = append(out, "http://"+m.Addr)
	}
	return out
}

// Members is every member, catalog first, then the pipeline node.
func (c *Cluster) Members() []*Member {
	ms := append([]*Member(nil), c.Catalog...)
	if c.Pipeline != nil {
		ms = append(ms, c.Pipeline)
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
			st, err := raftmeta.NewAdmin(m.Addr, 2*time.Second).Status(sctx)
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
	hc := &http.Client{Timeout: 2 * time.Second}
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
