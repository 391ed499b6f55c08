package pipeline

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/shoaldb/shoal/pipeline/event"
)

// TopicSpec is how one topic of the background plane is created.
type TopicSpec struct {
	Name       string
	Partitions int32
	// ReplicationFactor: -1 takes the broker's default.replication.factor.
	ReplicationFactor int16
	// Configs are topic configs (cleanup.policy, retention.ms, …).
	Configs map[string]string
}

func ms(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }

// DefaultTopics are the six topics of the background plane with their
// documented settings:
//
//	topic     partitions  cleanup  retention  key
//	usage     16          delete   7 days     account ID
//	storage   8           delete   7 days     database UUID
//	routes    8           compact  —          database UUID (tombstones kept 1 day)
//	limits    4           compact  —          account ID (tombstones kept 1 day)
//	accounts  4           delete   7 days     account ID
//	ratelimits 8          delete   1 hour     account ID
//
// Partition counts bound consumer parallelism (usage is the high-rate
// topic); they are never changed on an existing topic, because adding
// partitions remaps keys and breaks per-key order.
func DefaultTopics() []TopicSpec {
	week := ms(7 * 24 * time.Hour)
	day := ms(24 * time.Hour)
	return []TopicSpec{
		{Name: event.TopicUsage, Partitions: 16, ReplicationFactor: -1,
			Configs: map[string]string{"cleanup.policy": "delete", "retention.ms": week}},
		{Name: event.TopicStorage, Partitions: 8, ReplicationFactor: -1,
			Configs: map[string]string{"cleanup.policy": "delete", "retention.ms": week}},
		{Name: event.TopicRoutes, Partitions: 8, ReplicationFactor: -1,
			Configs: map[string]string{"cleanup.policy": "compact", "delete.retention.ms": day}},
		{Name: event.TopicLimits, Partitions: 4, ReplicationFactor: -1,
			Configs: map[string]string{"cleanup.policy": "compact", "delete.retention.ms": day}},
		{Name: event.TopicAccounts, Partitions: 4, ReplicationFactor: -1,
			Configs: map[string]string{"cleanup.policy": "delete", "retention.ms": week}},
		// The edges' rate-limit reports are read from the end by every
		// edge within a second of being written; an hour is for kcat.
		{Name: event.TopicRateLimits, Partitions: 8, ReplicationFactor: -1,
			Configs: map[string]string{"cleanup.policy": "delete", "retention.ms": ms(time.Hour)}},
	}
}

// EnsureTopics creates the given topics (DefaultTopics when none are
// given) if they are missing, and sets the configs of the spec on topics
// that exist with other values. It is idempotent and safe to run from
// every process at start-up. Partition counts of existing topics are left
// alone. cl is only borrowed (not closed).
func EnsureTopics(ctx context.Context, cl *kgo.Client, topics ...TopicSpec) error {
	if len(topics) == 0 {
		topics = DefaultTopics()
	}
	adm := kadm.NewClient(cl) // not closed: that would close cl
	var errs []error
	var existing []TopicSpec
	for _, t := range topics {
		configs := make(map[string]*string, len(t.Configs))
		for k, v := range t.Configs {
			configs[k] = kadm.StringPtr(v)
		}
		_, err := adm.CreateTopic(ctx, t.Partitions, t.ReplicationFactor, configs, t.Name)
		switch {
		case err == nil:
		case errors.Is(err, kerr.TopicAlreadyExists):
			existing = append(existing, t)
		default:
			errs = append(errs, fmt.Errorf("create topic %s: %w", t.Name, err))
		}
	}
	for _, t := range existing {
		if err := reconcileConfigs(ctx, adm, t); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func reconcileConfigs(ctx context.Context, adm *kadm.Client, t TopicSpec) error {
	if len(t.Configs) == 0 {
		return nil
	}
	rcs, err := adm.DescribeTopicConfigs(ctx, t.Name)
	if err != nil {
		return fmt.Errorf("describe topic %s: %w", t.Name, err)
	}
	rc, err := rcs.On(t.Name, nil)
	if err == nil {
		err = rc.Err
	}
	if err != nil {
		return fmt.Errorf("describe topic %s: %w", t.Name, err)
	}
	have := make(map[string]string, len(rc.Configs))
	for _, c := range rc.Configs {
		have[c.Key] = c.MaybeValue()
	}
	var alter []kadm.AlterConfig
	for k, v := range t.Configs {
		if have[k] != v {
			alter = append(alter, kadm.AlterConfig{Op: kadm.SetConfig, Name: k, Value: kadm.StringPtr(v)})
		}
	}
	if len(alter) == 0 {
		return nil
	}
	resps, err := adm.AlterTopicConfigs(ctx, alter, t.Name)
	if err == nil {
		var r kadm.AlterConfigsResponse
		if r, err = resps.On(t.Name, nil); err == nil {
			err = r.Err
		}
	}
	if err != nil {
		return fmt.Errorf("alter configs of topic %s: %w", t.Name, err)
	}
	return nil
}

// PartitionOffsets lists topic's start and end offsets per partition,
// leaving out partitions the brokers answered with an error: what the
// feeds that read every partition themselves (edge route feed, object
// host limits feed) measure their lag and skip compacted-away ranges with.
func PartitionOffsets(ctx context.Context, adm *kadm.Client, topic string) (starts, ends map[int32]int64, err error) {
	ls, err := adm.ListStartOffsets(ctx, topic)
	if err != nil {
		return nil, nil, err
	}
	le, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		return nil, nil, err
	}
	pick := func(l kadm.ListedOffsets) map[int32]int64 {
		m := make(map[int32]int64, len(l[topic]))
		for p, o := range l[topic] {
			if o.Err == nil {
				m[p] = o.Offset
			}
		}
		return m
	}
	return pick(ls), pick(le), nil
}
