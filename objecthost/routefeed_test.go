package objecthost

import (
	"context"
	"net"
	"strconv"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/shoaldb/shoal/pipeline/event"
	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// readTopic returns every record of topic, from the start to the end
// offsets at the time of the call.
func readTopic(t *testing.T, addrs []string, topic string) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	require.NoError(t, err)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, topic)
	require.NoError(t, err)
	remaining := map[int32]int64{}
	ends.Each(func(lo kadm.ListedOffset) {
		if lo.Offset > 0 {
			remaining[lo.Partition] = lo.Offset
		}
	})
	var out []*kgo.Record
	for len(remaining) > 0 {
		fs := cl.PollFetches(ctx)
		require.NoError(t, ctx.Err(), "read %d records, partitions left: %v", len(out), remaining)
		fs.EachRecord(func(r *kgo.Record) {
			out = append(out, r)
			if r.Offset+1 >= remaining[r.Partition] {
				delete(remaining, r.Partition)
			}
		})
	}
	return out
}

func newRoutesBroker(t *testing.T, opts ...kfake.Opt) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(1)}, opts...)...) // 127.0.0.1
	require.NoError(t, err)
	t.Cleanup(c.Close)
	if c.TopicInfo(event.TopicRoutes) == nil {
		require.NoError(t, c.CreateTopic(event.TopicRoutes, 3, map[string]string{"cleanup.policy": "compact"}))
	}
	return c
}

func TestKafkaRoutesPublishesRoutesAndTombstones(t *testing.T) {
	broker := newRoutesBroker(t)
	cl, err := kgo.NewClient(kgo.SeedBrokers(broker.ListenAddrs()...))
	require.NoError(t, err)
	defer cl.Close()
	epoch := time.Unix(1_800_000_000, 0)
	kr, err := NewKafkaRoutes(cl, KafkaRoutesOptions{Producer: "host-1", Now: func() time.Time { return epoch }})
	require.NoError(t, err)
	producer := "host-1@" + strconv.FormatInt(epoch.UnixNano(), 10)

	ctx := context.Background()
	const uuid = "0190a4c2-0000-7000-8000-000000000001"
	live := Route{DatabaseUUID: uuid, ObjectID: "obj", HostAddress: "127.0.0.1:9", AccountID: "acct", State: StateActive, Generation: 3}
	require.NoError(t, kr.PublishRoute(ctx, live))
	del := live
	del.State = StateDeleted
	require.NoError(t, kr.PublishRoute(ctx, del))

	recs := readTopic(t, broker.ListenAddrs(), event.TopicRoutes)
	require.Len(t, recs, 3)
	for _, r := range recs {
		assert.Equal(t, uuid, string(r.Key))
		assert.Equal(t, recs[0].Partition, r.Partition, "one key, one partition")
	}
	var got []event.Route
	for _, r := range recs[:2] {
		var er event.Route
		require.NoError(t, event.Decode(r.Value, &er))
		got = append(got, er)
	}
	assert.Equal(t, event.Route{V: event.Version, EventID: event.ID{Producer: producer, Seq: 1}, DatabaseUUID: uuid,
		ObjectID: "obj", HostAddress: "127.0.0.1:9", AccountID: "acct", State: "active", Generation: 3, Time: epoch.UnixMilli()}, got[0])
	assert.Equal(t, "deleted", got[1].State)
	assert.Equal(t, uint64(2), got[1].EventID.Seq)
	assert.Nil(t, recs[2].Value, "a deleted route is followed by a tombstone")
	require.Len(t, recs[2].Headers, 1)
	assert.Equal(t, RouteGenerationHeader, recs[2].Headers[0].Key)
	assert.Equal(t, "3", string(recs[2].Headers[0].Value))
	assert.Equal(t, 2.0, counterValue(t, kr, "route", "ok"))
	assert.Equal(t, 1.0, counterValue(t, kr, "tombstone", "ok"))

	_, err = NewKafkaRoutes(cl, KafkaRoutesOptions{})
	assert.ErrorIs(t, err, ErrInvalid, "a producer id is required")
	shared := &clockIDs{producer: "host-1@7"}
	shared.Next()
	kr2, err := NewKafkaRoutes(cl, KafkaRoutesOptions{IDs: shared})
	require.NoError(t, err)
	require.NoError(t, kr2.PublishRoute(ctx, live))
	assert.Equal(t, event.ID{Producer: "host-1@7", Seq: 3}, shared.Next(), "a shared sequencer's IDs are used")
	assert.ErrorIs(t, kr.PublishRoute(ctx, Route{}), ErrInvalid)
}

// counterValue reads kr's records counter of (kind, outcome).
func counterValue(t *testing.T, kr *KafkaRoutes, kind, outcome string) float64 {
	t.Helper()
	var m dto.Metric
	require.NoError(t, kr.records.WithLabelValues(kind, outcome).Write(&m))
	return m.GetCounter().GetValue()
}

// freePort returns a loopback port nobody listens on now.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	require.NoError(t, ln.Close())
	return port
}

// TestKafkaRoutesBrokerDownHeartbeatRepublishes: with the broker down a
// publication fails within its timeout, the host marks the route dirty,
// and the first heartbeat after the broker is back republishes it.
func TestKafkaRoutesBrokerDownHeartbeatRepublishes(t *testing.T) {
	port, dataDir := freePort(t), t.TempDir()
	broker := newRoutesBroker(t, kfake.Ports(port), kfake.DataDir(dataDir))
	addr := "127.0.0.1:" + strconv.Itoa(port)
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.RetryBackoffFn(func(int) time.Duration { return 50 * time.Millisecond }))
	require.NoError(t, err)
	defer cl.Close()
	kr, err := NewKafkaRoutes(cl, KafkaRoutesOptions{Producer: "host-1", Timeout: 300 * time.Millisecond})
	require.NoError(t, err)
	th := hbHost(t, func(c *Config) { c.Routes = kr })
	th.Registry().MustRegister(kr)

	ctx := context.Background()
	up := newDB("a")
	th.mustInit(t, up)
	_, err = th.Confirm(ctx, up.obj, 1)
	require.NoError(t, err)

	broker.Close()
	down := newDB("a")
	th.mustInit(t, down)
	th.cat.set(up.uuid, "a", fsm.StateActive, 1)
	th.cat.set(down.uuid, "a", fsm.StateActive, 1)
	start := time.Now()
	_, err = th.Confirm(ctx, down.obj, 1) // confirmed locally; the publication fails
	require.NoError(t, err)
	t.Logf("publication with the broker down returned after %s", time.Since(start).Round(time.Millisecond))
	assert.Equal(t, 1.0, counterValue(t, kr, "route", "timeout"))

	// Broker back on the same address with its data.
	newRoutesBroker(t, kfake.Ports(port), kfake.DataDir(dataDir))
	require.Eventually(t, func() bool {
		rep := th.beat() // until the broker answers, each beat retries (and fails again)
		assert.Equal(t, 1, rep.RoutesRepaired, "only the dirty route is republished")
		return counterValue(t, kr, "route", "ok") == 2
	}, 20*time.Second, 10*time.Millisecond)
	recs := readTopic(t, []string{addr}, event.TopicRoutes)
	keys := map[string]int{}
	for _, r := range recs {
		keys[string(r.Key)]++
	}
	assert.Equal(t, 1, keys[up.uuid])
	// The record PublishRoute gave up on may land too once the broker is
	// back (at least once: consumers keep the highest generation, so a
	// duplicate changes nothing).
	assert.GreaterOrEqual(t, keys[down.uuid], 1, "the dirty route reached the topic")
}
