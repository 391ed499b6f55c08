package storage

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/shoaldb/shoal/internal/ids"
	"github.com/shoaldb/shoal/pipeline/event"
	"github.com/shoaldb/shoal/raftmeta"
	"github.com/shoaldb/shoal/raftmeta/fsm"
)

func quietLogger() *slog.Logger {
	if os.Getenv("SHOAL_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// startBroker runs a kfake cluster (one broker, over loopback TCP) with the
// storage topic in partitions partitions.
func startBroker(t testing.TB, partitions int32) []string {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, event.TopicStorage))
	require.NoError(t, err)
	t.Cleanup(c.Close)
	return c.ListenAddrs()
}

// sizeProducer is a plain kgo producer: the tests decide the order of the
// records, reordered and duplicated ones included.
type sizeProducer struct {
	t  testing.TB
	cl *kgo.Client
	n  uint64
}

func newSizeProducer(t testing.TB, brokers []string) *sizeProducer {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(event.TopicStorage),
		kgo.ProducerLinger(time.Millisecond), kgo.MaxBufferedRecords(1<<20))
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	return &sizeProducer{t: t, cl: cl}
}

func (p *sizeProducer) record(s event.Size) *kgo.Record {
	p.n++
	s.V = event.Version
	s.EventID = event.ID{Producer: "test", Seq: p.n}
	if s.Time == 0 {
		s.Time = time.Now().UnixMilli()
	}
	b, err := event.Encode(s)
	require.NoError(p.t, err)
	return &kgo.Record{Key: []byte(s.DatabaseUUID), Value: b}
}

// produce sends sizes in order and waits until the broker has them all.
func (p *sizeProducer) produce(sizes ...event.Size) {
	p.t.Helper()
	recs := make([]*kgo.Record, len(sizes))
	for i, s := range sizes {
		recs[i] = p.record(s)
	}
	p.produceRecords(recs...)
}

func (p *sizeProducer) produceRecords(recs ...*kgo.Record) {
	p.t.Helper()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	wg.Add(len(recs))
	for _, r := range recs {
		p.cl.Produce(context.Background(), r, func(_ *kgo.Record, err error) {
			if err != nil {
				mu.Lock()
				if first == nil {
					first = err
				}
				mu.Unlock()
			}
			wg.Done()
		})
	}
	wg.Wait()
	require.NoError(p.t, first)
}

// catalog is a 3-voter raftmeta cluster in-process over loopback TCP and a
// client of it.
type catalog struct {
	nodes  []*raftmeta.Node
	client *raftmeta.Client
}

func startCatalog(t testing.TB, drain time.Duration) *catalog {
	t.Helper()
	c := &catalog{}
	for i := 0; i < 3; i++ {
		cfg := raftmeta.Config{
			ID: fmt.Sprintf("n%d", i), Dir: t.TempDir(), RaftAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
			DrainInterval: drain, JoinTimeout: 20 * time.Second,
			Logger: slog.New(slog.DiscardHandler), RaftLogOutput: io.Discard,
		}
		if i == 0 {
			cfg.Bootstrap = true
		} else {
			cfg.Join = []string{c.nodes[0].HTTPAddr()}
		}
		n, err := raftmeta.NewNode(cfg)
		require.NoError(t, err)
		t.Cleanup(func() { n.Close() })
		c.nodes = append(c.nodes, n)
		if i == 0 {
			require.Eventually(t, n.IsLeader, 15*time.Second, 20*time.Millisecond, "bootstrap node never led")
		}
	}
	var addrs []string
	for _, n := range c.nodes {
		addrs = append(addrs, n.HTTPAddr())
	}
	cl, err := raftmeta.NewClient(addrs, raftmeta.WithCacheTTL(0))
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	c.client = cl
	require.Eventually(t, func() bool {
		st, err := c.nodes[0].Status(context.Background())
		return err == nil && len(st.Members) == 3
	}, 20*time.Second, 50*time.Millisecond, "cluster never had three members")
	return c
}

// populate creates accounts with perAccount databases each and returns the
// database UUIDs and their accounts.
func (c *catalog) populate(t testing.TB, accounts, perAccount int) (uuids []string, owner map[string]string) {
	t.Helper()
	ctx := context.Background()
	owner = map[string]string{}
	type job struct{ acct, uuid, name string }
	jobs := make(chan job)
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for w := 0; w < 32; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				_, err := c.client.CreateDatabase(ctx, fsm.CreateDatabase{UUID: j.uuid, AccountID: j.acct, Name: j.name,
					ObjectID: ids.New(), HostID: "h1", Region: "weur", ReadReplication: fsm.ReadReplicationDisabled})
				if err != nil {
					select {
					case errs <- err:
					default:
					}
				}
			}
		}()
	}
	for a := 0; a < accounts; a++ {
		acct := fmt.Sprintf("acct-%03d", a)
		_, err := c.client.CreateAccount(ctx, fsm.CreateAccount{ID: acct, Name: acct, Tier: fsm.TierPaid,
			Limits: fsm.Limits{MaxDatabases: int64(perAccount), MaxStorageBytes: 1 << 40, MaxDatabaseBytes: 1 << 30}})
		require.NoError(t, err)
	}
	for a := 0; a < accounts; a++ {
		acct := fmt.Sprintf("acct-%03d", a)
		for i := 0; i < perAccount; i++ {
			u := ids.New()
			uuids = append(uuids, u)
			owner[u] = acct
			jobs <- job{acct, u, fmt.Sprintf("db-%d", i)}
		}
	}
	close(jobs)
	wg.Wait()
	select {
	case err := <-errs:
		require.NoError(t, err)
	default:
	}
	return uuids, owner
}

// totals reads every account's drained storage total (linearizable).
func (c *catalog) totals(t testing.TB, accounts []string) map[string]int64 {
	t.Helper()
	out := make(map[string]int64, len(accounts))
	for _, a := range accounts {
		acct, err := c.client.Account(context.Background(), a, raftmeta.LinearizableRead())
		require.NoError(t, err)
		out[a] = acct.StorageBytes
	}
	return out
}

// runConsumer starts a consumer; stop closes it and waits for Run.
func runConsumer(t testing.TB, cfg Config) (c *Consumer, stop func()) {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = quietLogger()
	}
	c, err := New(cfg)
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- c.Run(context.Background()) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			require.NoError(t, c.Close())
			require.NoError(t, <-done)
		})
	}
	t.Cleanup(stop)
	return c, stop
}
