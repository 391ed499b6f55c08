package harness

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/pipeline/broker"
	"github.com/shoaldb/shoal/pipeline/chlocal"
)

// StartClickHouse runs a clickhouse-server for one test on dir (ports 0:
// free ones). A missing server skips the test, unless
// SHOAL_REQUIRE_CLICKHOUSE=1 (CI), which fails it. The caller closes it.
func StartClickHouse(t testing.TB, dir string, tcpPort, httpPort int) *chlocal.Server {
	t.Helper()
	srv, err := chlocal.Start(context.Background(), chlocal.Config{DataDir: dir, TCPPort: tcpPort, HTTPPort: httpPort})
	if errors.Is(err, chlocal.ErrNotInstalled) && os.Getenv("SHOAL_REQUIRE_CLICKHOUSE") != "1" {
		t.Skipf("clickhouse-server not installed (scripts/deps.sh installs it): %v", err)
	}
	require.NoError(t, err, "clickhouse-server")
	return srv
}

// PipelineCluster is the background plane as a cluster runs it: a catalog
// node, an object host and an edge as processes publishing to a
// Kafka-protocol broker over TCP (in the test process, so it can be closed
// and restarted on its data), the pipeline role as a process consuming into
// a clickhouse-server the test owns (so it can be stopped). The fields are
// the test's to use for faults: close and restart Broker (StartBroker on
// BrokerAddr) or CH (StartClickHouse on Dir/clickhouse, CHTCP, CHHTTP),
// signal or restart the processes.
type PipelineCluster struct {
	Dir              string // every role's data directory is under it
	BrokerAddr       string
	Broker           *broker.Broker
	CH               *chlocal.Server
	CHTCP, CHHTTP    int // ClickHouse's ports, to restart it on the same ones
	Cat, Host, Edge  *Proc
	Pipe             *Proc  // the pipeline role
	EdgeURL, Admin   string // http://host:port of the edge; its admin token
	CatAddr, PipeURL string // the catalog's HTTP host:port; http://host:port of the pipeline role
	HostURL          string // http://host:port of the object host
}

// NewPipelineCluster starts the cluster for t, running bin (Binary.Path),
// and returns once the catalog is ready and the pipeline role, host and
// edge are healthy. ClickHouse missing skips t (see StartClickHouse). The
// roles log at warn; the pipeline role snapshots every 2 s and reconciles
// every 1 s; the edge's rate limits are 100,000/s. Everything is stopped
// when t ends.
func NewPipelineCluster(t testing.TB, bin string) *PipelineCluster {
	c := &PipelineCluster{Dir: t.TempDir(), Admin: "pipeline-admin-token"}
	c.CH = StartClickHouse(t, filepath.Join(c.Dir, "clickhouse"), 0, 0)
	t.Cleanup(func() { _ = c.CH.Close() })
	c.CHTCP, c.CHHTTP = c.CH.TCPPort(), c.CH.HTTPPort()
	c.StartBroker(t, "127.0.0.1:0")
	c.BrokerAddr = c.Broker.Addr()

	c.CatAddr = FreeAddr(t)
	c.Cat = StartProc(t, bin, "n1", "raftmeta", "serve", "--insecure", "--id", "n1", "--dir", filepath.Join(c.Dir, "n1"),
		"--raft-addr", FreeAddr(t), "--http-addr", c.CatAddr, "--bootstrap", "--log-level", "warn")
	WaitHTTP200(t, "http://"+c.CatAddr+"/readyz", 30*time.Second, "catalog never ready: %s", c.Cat.Log)

	pipeAddr := FreeAddr(t)
	c.PipeURL = "http://" + pipeAddr
	c.Pipe = StartProc(t, bin, "pipeline", "pipeline", "serve", "--insecure", "--http-addr", pipeAddr, "--dir", filepath.Join(c.Dir, "pipeline"),
		"--catalog", c.CatAddr, "--kafka-brokers", c.BrokerAddr, "--clickhouse-dsn", "clickhouse://default:@"+c.CH.Addr()+"/shoal", "--snapshot-interval", "2s", "--reconcile-interval", "1s", "--log-level", "warn")
	hostAddr := FreeAddr(t)
	c.HostURL = "http://" + hostAddr
	c.Host = StartProc(t, bin, "h1", "objecthost", "serve", "--insecure", "--id", "h1", "--dir", filepath.Join(c.Dir, "h1"),
		"--http-addr", hostAddr, "--region", "weur", "--catalog", c.CatAddr, "--kafka-brokers", c.BrokerAddr, "--log-level", "warn")
	edgeAddr := FreeAddr(t)
	c.EdgeURL = "http://" + edgeAddr
	c.Edge = StartProc(t, bin, "e1", "edge", "serve", "--insecure", "--http-addr", edgeAddr, "--dir", filepath.Join(c.Dir, "e1"),
		"--region", "weur", "--catalog", c.CatAddr, "--admin-token", c.Admin, "--kafka-brokers", c.BrokerAddr,
		"--account-rate", "100000", "--database-rate", "100000", "--log-level", "warn")
	for _, p := range []struct {
		url  string
		proc *Proc
	}{{c.PipeURL, c.Pipe}, {"http://" + hostAddr, c.Host}, {c.EdgeURL, c.Edge}} {
		WaitHTTP200(t, p.url+"/healthz", 30*time.Second, "%s never healthy: %s", p.proc.Name, p.proc.Log)
	}
	return c
}

// StartBroker starts the in-process broker on addr ("127.0.0.1:0": a free
// port) over Dir/kafka, so a restart on BrokerAddr finds its data, and sets
// Broker. When t ends, whichever broker Broker then holds is closed.
func (c *PipelineCluster) StartBroker(t testing.TB, addr string) {
	t.Helper()
	b, err := broker.Start(broker.Config{Addr: addr, DataDir: filepath.Join(c.Dir, "kafka")})
	require.NoError(t, err)
	c.Broker = b
	t.Cleanup(func() { c.Broker.Close() })
}

// PipelineDB is one database the tests send traffic to: its account, an
// API token of that account (without "Bearer ") and its UUID.
type PipelineDB struct{ Acct, Token, UUID string }
