package plane

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strconv"

	"github.com/shoaldb/shoal/pipeline/broker"
	"github.com/shoaldb/shoal/pipeline/chlocal"
	"github.com/shoaldb/shoal/pipeline/chsink"
)

// StartBroker runs the embedded Kafka-protocol broker (kfake over TCP, data
// under dir) on addr: `shoal dev`, and a pipeline role with
// `kafka { embedded = true }`. One node, not replicated: development and
// tests only.
func StartBroker(addr, dir string, log *slog.Logger) (*broker.Broker, error) {
	b, err := broker.Start(broker.Config{Addr: addr, DataDir: dir, Logger: log})
	if err != nil {
		return nil, fmt.Errorf("embedded Kafka-protocol broker on %s: %w", addr, err)
	}
	return b, nil
}

// StartClickHouse runs a managed local clickhouse-server (Debian's, as a
// child process, data under dir) with its native protocol on addr
// (127.0.0.1:PORT; its HTTP port is PORT+1; port 0 picks free ones).
// chlocal.ErrNotInstalled when the server is not installed.
func StartClickHouse(ctx context.Context, addr, dir string, log *slog.Logger) (*chlocal.Server, ClickHouse, error) {
	port := 0
	if addr != "" {
		_, p, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, ClickHouse{}, fmt.Errorf("clickhouse addr %q: %w", addr, err)
		}
		if port, err = strconv.Atoi(p); err != nil {
			return nil, ClickHouse{}, fmt.Errorf("clickhouse addr %q: %w", addr, err)
		}
	}
	cfg := chlocal.Config{DataDir: dir, TCPPort: port, Logger: log}
	if port != 0 {
		cfg.HTTPPort = port + 1
	}
	srv, err := chlocal.Start(ctx, cfg)
	if err != nil {
		return nil, ClickHouse{}, err
	}
	return srv, ClickHouse{Options: srv.Options(), Database: chsink.DefaultDatabase}, nil
}
