package broker

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

func client(t *testing.T, addr string, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(addr)}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	return cl
}

func consume(t *testing.T, addr, topic string, n int) []string {
	t.Helper()
	cl := client(t, addr, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var got []string
	for len(got) < n {
		fs := cl.PollFetches(ctx)
		require.NoError(t, ctx.Err(), "consumed %d of %d", len(got), n)
		fs.EachRecord(func(r *kgo.Record) { got = append(got, string(r.Value)) })
	}
	return got
}

// A broker restarted on the same address and data dir keeps its topics and
// records, and clients that knew the old one carry on.
func TestBrokerRestartKeepsRecords(t *testing.T) {
	dir := t.TempDir()
	b, err := Start(Config{DataDir: dir, Partitions: 3})
	require.NoError(t, err)
	addr := b.Addr()
	assert.Regexp(t, `^127\.0\.0\.1:\d+$`, addr)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	prod := client(t, addr)
	_, err = kadm.NewClient(prod).CreateTopic(ctx, -1, -1, nil, "t")
	require.NoError(t, err)
	for i := range 100 {
		require.NoError(t, prod.ProduceSync(ctx, &kgo.Record{Topic: "t", Value: fmt.Appendf(nil, "a%d", i)}).FirstErr())
	}
	b.Close()
	b.Close() // idempotent

	b, err = Start(Config{Addr: addr, DataDir: dir})
	require.NoError(t, err)
	defer b.Close()
	assert.Equal(t, addr, b.Addr())
	// The same client reconnects to the restarted broker.
	for i := range 100 {
		require.NoError(t, prod.ProduceSync(ctx, &kgo.Record{Topic: "t", Value: fmt.Appendf(nil, "b%d", i)}).FirstErr())
	}
	got := consume(t, addr, "t", 200)
	assert.Len(t, got, 200)
	topics, err := kadm.NewClient(prod).ListTopics(ctx, "t")
	require.NoError(t, err)
	assert.Len(t, topics["t"].Partitions, 3, "partition count survives the restart")
}

// Without a data dir the broker is empty after a restart; a wildcard listen
// address is advertised as loopback.
func TestBrokerInMemoryWildcard(t *testing.T) {
	b, err := Start(Config{Addr: "0.0.0.0:0", AutoCreateTopics: true})
	require.NoError(t, err)
	defer b.Close()
	assert.Regexp(t, `^127\.0\.0\.1:\d+$`, b.Addr())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cl := client(t, b.Addr(), kgo.AllowAutoTopicCreation())
	require.NoError(t, cl.ProduceSync(ctx, &kgo.Record{Topic: "auto", Value: []byte("x")}).FirstErr())
	assert.Equal(t, []string{"x"}, consume(t, b.Addr(), "auto", 1))
}

func TestBrokerAddressInUse(t *testing.T) {
	b, err := Start(Config{})
	require.NoError(t, err)
	defer b.Close()
	_, err = Start(Config{Addr: b.Addr()})
	assert.Error(t, err)
}
