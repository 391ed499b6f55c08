// Package broker runs an embedded Kafka-protocol broker for `shoal dev` and
// for tests: franz-go's kfake, one node, listening on real TCP, with an
// optional data directory so that a restart on the same address and
// directory keeps topics, records, committed offsets and idempotent
// producer state.
//
// Production never uses this package: cluster.hcl names real brokers. The
// broker speaks the same protocol, so the producer, the consumers and kcat
// cannot tell the difference, and the background plane's fault tests can
// kill and restart it (Close, then Start with the same Config).
package broker

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
)

// Config configures an embedded broker. Zero values take the documented
// defaults.
type Config struct {
	// Addr is the TCP address to listen on (default "127.0.0.1:0", a free
	// loopback port; read it back with Broker.Addr). To restart a broker
	// where clients expect it, pass the previous Broker.Addr.
	Addr string
	// Advertise is the host:port clients are told to connect to (default:
	// the listening address, with an unspecified IP such as 0.0.0.0
	// replaced by 127.0.0.1).
	Advertise string
	// DataDir persists the broker's state there and reloads it on Start
	// ("" keeps everything in memory and loses it on Close).
	DataDir string
	// SyncWrites fsyncs every produced batch before acknowledging it
	// (default false: segments are synced on roll and on Close, like
	// Kafka's default flush policy).
	SyncWrites bool
	// Partitions is the partition count of a topic created with -1
	// partitions (default 8).
	Partitions int
	// CompactionInterval is how often compacted topics are compacted and
	// retention is applied (default 10 minutes; kfake's own default is an
	// hour).
	CompactionInterval time.Duration
	// AutoCreateTopics lets a metadata request create a missing topic
	// (default false: pipeline.EnsureTopics creates them with their
	// documented settings).
	AutoCreateTopics bool
	// Logger receives kfake's warnings and errors (default: discarded).
	Logger *slog.Logger
}

// Broker is a running embedded broker. Close stops it; its goroutines and
// listener are gone when Close returns.
type Broker struct {
	cluster *kfake.Cluster
	addr    string
}

// Start starts a broker listening on cfg.Addr.
func Start(cfg Config) (*Broker, error) {
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1:0"
	}
	if cfg.Partitions <= 0 {
		cfg.Partitions = 8
	}
	if cfg.CompactionInterval <= 0 {
		cfg.CompactionInterval = 10 * time.Minute
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("broker listen %s: %w", cfg.Addr, err)
	}
	adv, err := advertised(ln.Addr(), cfg.Advertise)
	if err != nil {
		ln.Close()
		return nil, err
	}
	wrapped := &advertisedListener{Listener: ln, adv: adv}
	used := false
	opts := []kfake.Opt{
		kfake.NumBrokers(1),
		// kfake asks for a listener per broker; we hand it the one we
		// opened on the caller's address (it would otherwise always
		// bind 127.0.0.1).
		kfake.ListenFn(func(string, string) (net.Listener, error) {
			if used {
				return nil, errors.New("broker: one listener only")
			}
			used = true
			return wrapped, nil
		}),
		kfake.DefaultNumPartitions(cfg.Partitions),
		kfake.BrokerConfigs(map[string]string{
			"log.cleaner.backoff.ms": strconv.FormatInt(cfg.CompactionInterval.Milliseconds(), 10),
		}),
		kfake.ClusterID("shoal-dev"),
	}
	if cfg.DataDir != "" {
		opts = append(opts, kfake.DataDir(cfg.DataDir))
	}
	if cfg.SyncWrites {
		opts = append(opts, kfake.SyncWrites())
	}
	if cfg.AutoCreateTopics {
		opts = append(opts, kfake.AllowAutoTopicCreation())
	}
	if cfg.Logger != nil {
		opts = append(opts, kfake.WithLogger(slogLogger{cfg.Logger}))
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		ln.Close() // NewCluster closes it on most failures; closing twice is harmless
		return nil, fmt.Errorf("start embedded broker: %w", err)
	}
	return &Broker{cluster: c, addr: adv.String()}, nil
}

// Addr is the advertised host:port: the seed broker to give clients, and
// the Addr to restart this broker on.
func (b *Broker) Addr() string { return b.addr }

// Cluster exposes the kfake cluster for tests that inject faults
// (Control, SleepControl) or force compaction (Compact).
func (b *Broker) Cluster() *kfake.Cluster { return b.cluster }

// Close stops the broker: the listener closes, open connections drop, and
// with a DataDir the state is saved before Close returns. Safe to call more
// than once.
func (b *Broker) Close() { b.cluster.Close() }

// advertisedListener reports the advertised address as its Addr: kfake
// puts Addr() into metadata responses, and a wildcard IP there would send
// clients nowhere.
type advertisedListener struct {
	net.Listener
	adv *net.TCPAddr
}

func (l *advertisedListener) Addr() net.Addr { return l.adv }

func advertised(listen net.Addr, override string) (*net.TCPAddr, error) {
	if override != "" {
		a, err := net.ResolveTCPAddr("tcp", override)
		if err != nil {
			return nil, fmt.Errorf("broker advertise %q: %w", override, err)
		}
		return a, nil
	}
	tcp, ok := listen.(*net.TCPAddr)
	if !ok {
		return nil, fmt.Errorf("broker: listener address %v is not TCP", listen)
	}
	a := *tcp
	if a.IP == nil || a.IP.IsUnspecified() {
		a.IP = net.IPv4(127, 0, 0, 1)
	}
	return &a, nil
}

// slogLogger forwards kfake's logs to slog; info and debug (one line per
// request) are dropped.
type slogLogger struct{ l *slog.Logger }

func (s slogLogger) Logf(level kfake.LogLevel, format string, args ...any) {
	switch level {
	case kfake.LogLevelError:
		s.l.Error("kfake: " + fmt.Sprintf(format, args...))
	case kfake.LogLevelWarn:
		s.l.Warn("kfake: " + fmt.Sprintf(format, args...))
	}
}
