// Package config loads cluster.hcl, the cluster definition shared by every
// role: the nodes and their roles, regions and addresses, the catalog's
// settings, Kafka, ClickHouse, the tiers' limits and the secrets.
//
// Errors name the file, the line and the field ("cluster.hcl:14: node
// \"n2\": raft_addr: …") so an operator can fix them without guessing.
package config

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/gohcl"
	"github.com/hashicorp/hcl/v2/hclparse"
	"github.com/hashicorp/hcl/v2/hclsyntax"
)

// Roles a node can take.
const (
	RoleRaftmeta   = "raftmeta"
	RoleEdge       = "edge"
	RoleObjecthost = "objecthost"
	RolePipeline   = "pipeline"
	RoleLimiter    = "limiter"
)

// D1's location hints (regions) and jurisdictions.
var (
	Regions       = []string{"wnam", "enam", "weur", "eeur", "apac", "oc"}
	Jurisdictions = []string{"eu", "fedramp", "us"}
)

// Cluster is the decoded cluster.hcl.
type Cluster struct {
	Name       string      `hcl:"name,optional"`
	Region     string      `hcl:"region,optional"` // default region of nodes that name none
	Catalog    *Catalog    `hcl:"catalog,block"`
	Nodes      []*Node     `hcl:"node,block"`
	Kafka      *Kafka      `hcl:"kafka,block"`
	ClickHouse *ClickHouse `hcl:"clickhouse,block"`
	Archive    *Archive    `hcl:"archive,block"`
	Tiers      []*Tier     `hcl:"tier,block"`
	Limiter    *Limiter    `hcl:"limiter,block"`
	Secrets    *Secrets    `hcl:"secrets,block"`
	// TLS authenticates every component to every other (mutual TLS from
	// the cluster CA, internal/pki). Without it the file is refused unless
	// Insecure is set, and then every role warns at start.
	TLS      *TLS `hcl:"tls,block"`
	Insecure bool `hcl:"insecure,optional"`

	file string
}

// TLS names the cluster's certificates: the CA bundle every node trusts,
// and the directory where node ID's certificate and key are ID.crt and
// ID.key (what `shoal cluster cert issue --out DIR` writes).
type TLS struct {
	CAFile  string `hcl:"ca_file"`
	CertDir string `hcl:"cert_dir"`
}

// NodeTLS returns node id's credential files, or empty Files without a tls
// block.
func (c *Cluster) NodeTLS(id string) (ca, cert, key string) {
	if c.TLS == nil {
		return "", "", ""
	}
	return c.TLS.CAFile, filepath.Join(c.TLS.CertDir, id+".crt"), filepath.Join(c.TLS.CertDir, id+".key")
}

// Catalog holds the Raft catalog's settings.
type Catalog struct {
	MaxStale          string `hcl:"max_stale,optional"`          // stale reads refused past this since last leader contact; default 5s
	CacheTTL          string `hcl:"cache_ttl,optional"`          // client result cache for stale reads; default 2s
	SnapshotThreshold int    `hcl:"snapshot_threshold,optional"` // log entries between snapshots; default 8192
	SnapshotInterval  string `hcl:"snapshot_interval,optional"`  // default 30s
	LogStore          string `hcl:"log_store,optional"`          // "wal" (raft-wal, default) or "bolt" (raft-boltdb/v2), for new data dirs
}

// Node is one process of the cluster.
type Node struct {
	ID           string   `hcl:"id,label"`
	Roles        []string `hcl:"roles"`
	Region       string   `hcl:"region,optional"`
	Jurisdiction string   `hcl:"jurisdiction,optional"`
	DataDir      string   `hcl:"data_dir,optional"`
	// raftmeta
	RaftAddr    string `hcl:"raft_addr,optional"`
	CatalogAddr string `hcl:"catalog_addr,optional"` // internal HTTP API of the catalog node
	Voter       *bool  `hcl:"voter,optional"`        // default true; false = non-voting read follower
	// edge
	EdgeAddr      string `hcl:"edge_addr,optional"`
	EdgeDebugAddr string `hcl:"edge_debug_addr,optional"` // the edge's /debug/pprof listener (operators, mutual TLS); none: off
	// objecthost
	ObjecthostAddr string `hcl:"objecthost_addr,optional"`
	Capacity       int64  `hcl:"capacity,optional"` // databases this host should hold; default 100000
	// pipeline
	PipelineAddr string `hcl:"pipeline_addr,optional"` // the pipeline role's HTTP API (/metrics, /v1/status)
	// limiter
	LimiterAddr string `hcl:"limiter_addr,optional"` // the limiter role's HTTP API (/metrics, /v1/status)
}

// Limiter configures the limiter role: how often it looks and how it
// notifies an account that crossed its daily row limits.
type Limiter struct {
	Interval          string `hcl:"interval,optional"`  // default 10s
	SMTPAddr          string `hcl:"smtp_addr,optional"` // HOST:PORT; none: no mail
	SMTPFrom          string `hcl:"smtp_from,optional"`
	SMTPTo            string `hcl:"smtp_to,optional"` // template: {account_id}, {account_name}
	SMTPUser          string `hcl:"smtp_user,optional"`
	SMTPPasswordFile  string `hcl:"smtp_password_file,optional"`
	SMTPStartTLS      bool   `hcl:"smtp_starttls,optional"`
	WebhookURL        string `hcl:"webhook_url,optional"`         // none: no webhook
	WebhookSecretFile string `hcl:"webhook_secret_file,optional"` // HMAC-SHA256 key of X-Shoal-Signature
}

// Kafka names the brokers, or asks for the embedded Kafka-protocol broker.
//
// Embedded: the pipeline role (or `shoal dev`) runs an in-process
// Kafka-protocol broker (kfake: one node, not replicated; development and
// tests only) listening on Brokers[0] (default 127.0.0.1:9092).
type Kafka struct {
	Embedded bool     `hcl:"embedded,optional"`
	Brokers  []string `hcl:"brokers,optional"`
	DataDir  string   `hcl:"data_dir,optional"` // embedded broker's data (default: the pipeline node's data_dir/kafka)
	// SASL: mechanism "plain", "scram-sha-256" or "scram-sha-512".
	SASLMechanism    string `hcl:"sasl_mechanism,optional"`
	SASLUser         string `hcl:"sasl_user,optional"`
	SASLPassword     string `hcl:"sasl_password,optional"`
	SASLPasswordFile string `hcl:"sasl_password_file,optional"` // instead of sasl_password
	// TLS to the brokers; the CA, client certificate and server name are optional.
	TLS           bool   `hcl:"tls,optional"`
	TLSCAFile     string `hcl:"tls_ca_file,optional"`
	TLSCertFile   string `hcl:"tls_cert_file,optional"`
	TLSKeyFile    string `hcl:"tls_key_file,optional"`
	TLSServerName string `hcl:"tls_server_name,optional"`
}

// ClickHouse names the server, or asks for a managed local clickhouse-server.
type ClickHouse struct {
	Managed bool   `hcl:"managed,optional"`
	DSN     string `hcl:"dsn,optional"`
	DataDir string `hcl:"data_dir,optional"`
	// Addr is the managed server's native-protocol address (HTTP on the
	// next port); default a free loopback port.
	Addr string `hcl:"addr,optional"`
}

// Archive is where object hosts ship every commit's pages (time travel,
// restores; objecthost/history): a directory outside every data dir (dev,
// tests) or an S3-compatible bucket. Without the block, history is off.
type Archive struct {
	Dir string `hcl:"dir,optional"`
	// S3: endpoint host:port (no scheme), bucket, optional prefix ("" or
	// ending in /), region, credentials (the secret from a file, or
	// $SHOAL_ARCHIVE_SECRET_KEY), TLS (default true) and path-style
	// requests (most self-hosted S3 servers need them).
	Endpoint      string `hcl:"endpoint,optional"`
	Bucket        string `hcl:"bucket,optional"`
	Prefix        string `hcl:"prefix,optional"`
	Region        string `hcl:"region,optional"`
	AccessKey     string `hcl:"access_key,optional"`
	SecretKeyFile string `hcl:"secret_key_file,optional"`
	TLS           *bool  `hcl:"tls,optional"`
	PathStyle     bool   `hcl:"path_style,optional"`
	// Durability: "default" (acknowledge at the local commit, ship within
	// max_lag) or "archived" (acknowledge once the commit is in the store).
	Durability string `hcl:"durability,optional"`
	MaxLag     string `hcl:"max_lag,optional"`   // default 1s
	AlarmLag   string `hcl:"alarm_lag,optional"` // default 10s
	// DeletedArchiveMassFloor: the sweep of deleted databases' archives
	// deletes none in a pass where more than max(this, 1 % of the host's
	// databases) are due, and raises "mass_archive_deletes" (default 50;
	// raise it to let an expected mass through).
	DeletedArchiveMassFloor int `hcl:"deleted_archive_mass_floor,optional"`
	// BucketSweepInterval: how often one host (the active host with the
	// smallest ID) lists the whole archive and deletes the archives of
	// databases deleted longer than their retention ago that no host's
	// staging area remembers (their host was lost with its disk). A
	// positive duration (default 24h) or "off".
	BucketSweepInterval string `hcl:"bucket_sweep_interval,optional"`
	// ScrubInterval: how long one pass of the archive scrubber over every
	// live database of a host takes (paced evenly; default 24h) or "off".
	// ScrubSample: archived objects read in full and verified per
	// database per pass (default 1; -1: all of them).
	ScrubInterval string `hcl:"scrub_interval,optional"`
	ScrubSample   int    `hcl:"scrub_sample,optional"`
}

// Tier is one pricing tier's default limits (D1's figures by default).
type Tier struct {
	Name              string `hcl:"name,label"`
	MaxDatabases      int64  `hcl:"max_databases,optional"`
	MaxStorageBytes   int64  `hcl:"max_storage_bytes,optional"`
	MaxDatabaseBytes  int64  `hcl:"max_database_bytes,optional"`
	RowsReadPerDay    int64  `hcl:"rows_read_per_day,optional"`
	RowsWrittenPerDay int64  `hcl:"rows_written_per_day,optional"`
}

// Secrets are read from the file or, when a value is "env:NAME", from the
// environment variable NAME (so the file can be committed).
type Secrets struct {
	AdminToken string `hcl:"admin_token,optional"`
	BindingKey string `hcl:"binding_key,optional"`
}

// ErrInvalid wraps every validation error.
var ErrInvalid = errors.New("invalid cluster configuration")

// Load reads and validates path.
func Load(path string) (*Cluster, error) {
	src, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read cluster config: %w", err)
	}
	return Parse(path, src)
}

// Parse decodes and validates src; filename appears in errors.
func Parse(filename string, src []byte) (*Cluster, error) {
	p := hclparse.NewParser()
	f, diags := p.ParseHCL(src, filename)
	if diags.HasErrors() {
		return nil, fmt.Errorf("%w: %s", ErrInvalid, diagString(diags))
	}
	var c Cluster
	if diags := gohcl.DecodeBody(f.Body, nil, &c); diags.HasErrors() {
		return nil, fmt.Errorf("%w: %s", ErrInvalid, diagString(diags))
	}
	c.file = filename
	body, _ := f.Body.(*hclsyntax.Body)
	if err := c.validate(body); err != nil {
		return nil, err
	}
	return &c, nil
}

func diagString(diags hcl.Diagnostics) string {
	var parts []string
	for _, d := range diags {
		if d.Severity != hcl.DiagError {
			continue
		}
		loc := ""
		if d.Subject != nil {
			loc = fmt.Sprintf("%s:%d: ", d.Subject.Filename, d.Subject.Start.Line)
		}
		parts = append(parts, loc+d.Summary+": "+d.Detail)
	}
	return strings.Join(parts, "; ")
}

// validator collects field errors with their positions.
type validator struct {
	file string
	body *hclsyntax.Body
	errs []string
}

// at finds the line of an attribute inside a block (blockType/label), or of
// a top-level attribute when blockType is "", falling back to the block's
// line, then to line 1.
func (v *validator) at(blockType, label, attr string) int {
	if v.body == nil {
		return 1
	}
	if blockType == "" {
		if a, ok := v.body.Attributes[attr]; ok {
			return a.SrcRange.Start.Line
		}
		return 1
	}
	for _, b := range v.body.Blocks {
		if b.Type != blockType || (label != "" && (len(b.Labels) == 0 || b.Labels[0] != label)) {
			continue
		}
		if a, ok := b.Body.Attributes[attr]; ok {
			return a.SrcRange.Start.Line
		}
		return b.DefRange().Start.Line
	}
	return 1
}

func (v *validator) fail(blockType, label, attr, format string, args ...any) {
	where := attr
	if blockType != "" {
		if label != "" {
			where = fmt.Sprintf("%s %q: %s", blockType, label, attr)
		} else {
			where = fmt.Sprintf("%s: %s", blockType, attr)
		}
	}
	v.errs = append(v.errs, fmt.Sprintf("%s:%d: %s: %s", v.file, v.at(blockType, label, attr), where, fmt.Sprintf(format, args...)))
}

func (c *Cluster) validate(body *hclsyntax.Body) error {
	v := &validator{file: c.file, body: body}
	if c.Region == "" {
		c.Region = "weur"
	}
	if !contains(Regions, c.Region) {
		v.fail("", "", "region", "unknown region %q (one of %s)", c.Region, strings.Join(Regions, ", "))
	}
	if c.Catalog == nil {
		c.Catalog = &Catalog{}
	}
	for _, d := range []struct {
		name string
		val  *string
		def  string
	}{{"max_stale", &c.Catalog.MaxStale, "5s"}, {"cache_ttl", &c.Catalog.CacheTTL, "2s"}, {"snapshot_interval", &c.Catalog.SnapshotInterval, "30s"}} {
		if *d.val == "" {
			*d.val = d.def
		}
		if dur, err := time.ParseDuration(*d.val); err != nil || dur <= 0 {
			v.fail("catalog", "", d.name, "not a positive duration: %q", *d.val)
		}
	}
	if c.Catalog.SnapshotThreshold == 0 {
		c.Catalog.SnapshotThreshold = 8192
	}
	switch c.Catalog.LogStore {
	case "":
		c.Catalog.LogStore = "bolt"
	case "bolt", "wal":
	default:
		v.fail("catalog", "", "log_store", "unknown log store %q (bolt or wal)", c.Catalog.LogStore)
	}
	if c.Catalog.SnapshotThreshold < 0 {
		v.fail("catalog", "", "snapshot_threshold", "must be positive")
	}

	if len(c.Nodes) == 0 {
		v.fail("", "", "node", "at least one node block is required")
	}
	seen := map[string]bool{}
	addrs := map[string]string{}
	voters := 0
	for _, n := range c.Nodes {
		if seen[n.ID] {
			v.fail("node", n.ID, "id", "duplicate node id")
		}
		seen[n.ID] = true
		if n.Region == "" {
			n.Region = c.Region
		}
		if !contains(Regions, n.Region) {
			v.fail("node", n.ID, "region", "unknown region %q (one of %s)", n.Region, strings.Join(Regions, ", "))
		}
		if n.Jurisdiction != "" && !contains(Jurisdictions, n.Jurisdiction) {
			v.fail("node", n.ID, "jurisdiction", "unknown jurisdiction %q (one of %s)", n.Jurisdiction, strings.Join(Jurisdictions, ", "))
		}
		if len(n.Roles) == 0 {
			v.fail("node", n.ID, "roles", "a node needs at least one role")
		}
		for _, r := range n.Roles {
			if !contains([]string{RoleRaftmeta, RoleEdge, RoleObjecthost, RolePipeline, RoleLimiter}, r) {
				v.fail("node", n.ID, "roles", "unknown role %q", r)
			}
		}
		if n.DataDir == "" {
			n.DataDir = ".shoal/" + n.ID
		}
		if n.Capacity == 0 {
			n.Capacity = 100000
		}
		need := func(role, attr, val string) {
			if !n.Has(role) {
				return
			}
			if val == "" {
				if attr != "edge_debug_addr" { // optional
					v.fail("node", n.ID, attr, "required for role %s", role)
				}
				return
			}
			if _, _, err := net.SplitHostPort(val); err != nil {
				v.fail("node", n.ID, attr, "not a host:port address: %q", val)
				return
			}
			if other, dup := addrs[val]; dup {
				v.fail("node", n.ID, attr, "address %s already used by %s", val, other)
			}
			addrs[val] = n.ID + "." + attr
		}
		need(RoleRaftmeta, "raft_addr", n.RaftAddr)
		need(RoleRaftmeta, "catalog_addr", n.CatalogAddr)
		need(RoleEdge, "edge_addr", n.EdgeAddr)
		need(RoleEdge, "edge_debug_addr", n.EdgeDebugAddr)
		need(RoleObjecthost, "objecthost_addr", n.ObjecthostAddr)
		need(RolePipeline, "pipeline_addr", n.PipelineAddr)
		need(RoleLimiter, "limiter_addr", n.LimiterAddr)
		if n.Has(RoleRaftmeta) && n.IsVoter() {
			voters++
		}
	}
	if len(c.Nodes) > 0 && voters == 0 {
		v.fail("", "", "node", "no voting raftmeta node: the catalog needs at least one")
	}
	if c.Kafka == nil {
		c.Kafka = &Kafka{Embedded: true}
	}
	if !c.Kafka.Embedded && len(c.Kafka.Brokers) == 0 {
		v.fail("kafka", "", "brokers", "required unless embedded = true")
	}
	if c.Kafka.Embedded && len(c.Kafka.Brokers) == 0 {
		c.Kafka.Brokers = []string{"127.0.0.1:9092"}
	}
	if c.Kafka.Embedded && len(c.Kafka.Brokers) > 1 {
		v.fail("kafka", "", "brokers", "the embedded broker is one node: name one address, or set embedded = false")
	}
	switch c.Kafka.SASLMechanism {
	case "", "plain", "scram-sha-256", "scram-sha-512":
	default:
		v.fail("kafka", "", "sasl_mechanism", "unknown mechanism %q (plain, scram-sha-256 or scram-sha-512)", c.Kafka.SASLMechanism)
	}
	if c.Kafka.SASLMechanism != "" && c.Kafka.SASLUser == "" {
		v.fail("kafka", "", "sasl_user", "required with sasl_mechanism")
	}
	if c.Kafka.SASLPassword != "" && c.Kafka.SASLPasswordFile != "" {
		v.fail("kafka", "", "sasl_password_file", "give sasl_password or sasl_password_file, not both")
	}
	if (c.Kafka.TLSCertFile == "") != (c.Kafka.TLSKeyFile == "") {
		v.fail("kafka", "", "tls_cert_file", "tls_cert_file and tls_key_file go together")
	}
	if c.ClickHouse == nil {
		c.ClickHouse = &ClickHouse{Managed: true}
	}
	if !c.ClickHouse.Managed && c.ClickHouse.DSN == "" {
		v.fail("clickhouse", "", "dsn", "required unless managed = true")
	}
	switch {
	case c.TLS == nil && !c.Insecure:
		v.fail("", "", "tls", "no tls block: every internal endpoint would answer anyone on the network; add tls { ca_file, cert_dir } (shoal cluster ca init, shoal cluster cert issue; docs/operations.md) or, for a trusted test network only, insecure = true")
	case c.TLS != nil && c.Insecure:
		v.fail("", "", "insecure", "insecure = true with a tls block: remove one")
	case c.TLS != nil && (c.TLS.CAFile == "" || c.TLS.CertDir == ""):
		v.fail("tls", "", "ca_file", "ca_file and cert_dir are required")
	}
	if a := c.Archive; a != nil {
		switch {
		case a.Dir == "" && a.Bucket == "":
			v.fail("archive", "", "dir", "give dir (a directory outside every data_dir) or bucket (S3)")
		case a.Dir != "" && a.Bucket != "":
			v.fail("archive", "", "dir", "give dir or bucket, not both")
		case a.Bucket != "" && a.Endpoint == "":
			v.fail("archive", "", "endpoint", "required with bucket")
		}
		if a.Prefix != "" && !strings.HasSuffix(a.Prefix, "/") {
			v.fail("archive", "", "prefix", "must end in / (got %q)", a.Prefix)
		}
		if a.Durability != "" && a.Durability != "default" && a.Durability != "archived" {
			v.fail("archive", "", "durability", "default or archived, not %q", a.Durability)
		}
		if a.DeletedArchiveMassFloor < 0 {
			v.fail("archive", "", "deleted_archive_mass_floor", "must not be negative (got %d)", a.DeletedArchiveMassFloor)
		}
		if a.ScrubSample < -1 {
			v.fail("archive", "", "scrub_sample", "a count, or -1 for all (got %d)", a.ScrubSample)
		}
		for _, f := range [][2]string{{"max_lag", a.MaxLag}, {"alarm_lag", a.AlarmLag}, {"bucket_sweep_interval", a.BucketSweepInterval}, {"scrub_interval", a.ScrubInterval}} {
			if f[1] == "" || (f[0] == "bucket_sweep_interval" || f[0] == "scrub_interval") && f[1] == "off" {
				continue
			}
			if d, err := time.ParseDuration(f[1]); err != nil || d <= 0 {
				v.fail("archive", "", f[0], "not a positive duration: %q", f[1])
			}
		}
	}
	if l := c.Limiter; l != nil && l.Interval != "" {
		if d, err := time.ParseDuration(l.Interval); err != nil || d <= 0 {
			v.fail("limiter", "", "interval", "not a positive duration: %q", l.Interval)
		}
	}
	c.Tiers = withDefaultTiers(c.Tiers)
	for _, t := range c.Tiers {
		if t.Name != "free" && t.Name != "paid" {
			v.fail("tier", t.Name, "name", "unknown tier %q (free or paid)", t.Name)
		}
	}
	if c.Secrets == nil {
		c.Secrets = &Secrets{}
	}
	for _, s := range []struct {
		name string
		val  *string
	}{{"admin_token", &c.Secrets.AdminToken}, {"binding_key", &c.Secrets.BindingKey}} {
		if env, ok := strings.CutPrefix(*s.val, "env:"); ok {
			*s.val = os.Getenv(env)
			if *s.val == "" {
				v.fail("secrets", "", s.name, "environment variable %s is empty or unset", env)
			}
		}
	}
	if len(v.errs) > 0 {
		sort.Strings(v.errs)
		return fmt.Errorf("%w:\n  %s", ErrInvalid, strings.Join(v.errs, "\n  "))
	}
	return nil
}

// withDefaultTiers fills D1's published limits (Free / Workers Paid) for any
// field left at zero.
func withDefaultTiers(ts []*Tier) []*Tier {
	defs := map[string]Tier{
		"free": {Name: "free", MaxDatabases: 10, MaxStorageBytes: 5 << 30, MaxDatabaseBytes: 500 << 20, RowsReadPerDay: 5_000_000, RowsWrittenPerDay: 100_000},
		"paid": {Name: "paid", MaxDatabases: 50_000, MaxStorageBytes: 1 << 40, MaxDatabaseBytes: 10 << 30},
	}
	have := map[string]bool{}
	for _, t := range ts {
		have[t.Name] = true
		d, ok := defs[t.Name]
		if !ok {
			continue
		}
		if t.MaxDatabases == 0 {
			t.MaxDatabases = d.MaxDatabases
		}
		if t.MaxStorageBytes == 0 {
			t.MaxStorageBytes = d.MaxStorageBytes
		}
		if t.MaxDatabaseBytes == 0 {
			t.MaxDatabaseBytes = d.MaxDatabaseBytes
		}
		if t.RowsReadPerDay == 0 {
			t.RowsReadPerDay = d.RowsReadPerDay
		}
		if t.RowsWrittenPerDay == 0 {
			t.RowsWrittenPerDay = d.RowsWrittenPerDay
		}
	}
	for _, name := range []string{"free", "paid"} {
		if !have[name] {
			d := defs[name]
			ts = append(ts, &d)
		}
	}
	return ts
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// Has reports whether the node takes role.
func (n *Node) Has(role string) bool { return contains(n.Roles, role) }

// IsVoter reports whether a raftmeta node votes (the default).
func (n *Node) IsVoter() bool { return n.Voter == nil || *n.Voter }

// Node returns the node with id.
func (c *Cluster) Node(id string) (*Node, error) {
	for _, n := range c.Nodes {
		if n.ID == id {
			return n, nil
		}
	}
	return nil, fmt.Errorf("%w: %s: no node %q", ErrInvalid, c.file, id)
}

// CatalogAddrs lists the catalog nodes' internal HTTP addresses, those in
// region first (stale reads go to a nearby follower).
func (c *Cluster) CatalogAddrs(region string) []string {
	var near, far []string
	for _, n := range c.Nodes {
		if !n.Has(RoleRaftmeta) {
			continue
		}
		if n.Region == region {
			near = append(near, n.CatalogAddr)
		} else {
			far = append(far, n.CatalogAddr)
		}
	}
	return append(near, far...)
}

// Tier returns the named tier's limits.
func (c *Cluster) Tier(name string) (Tier, bool) {
	for _, t := range c.Tiers {
		if t.Name == name {
			return *t, true
		}
	}
	return Tier{}, false
}

// Duration parses one of the catalog's validated duration fields.
func Duration(s string) time.Duration {
	d, _ := time.ParseDuration(s)
	return d
}
