package plane

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/shoaldb/shoal/pipeline/event"
	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// AccountPublisher publishes account changes (tier upgrades) on the
// `accounts` topic, where the limiter lifts daily-limit flags at once. One
// per edge process; Publish waits for the broker's acknowledgement
// (bounded by its context and 2 s).
type AccountPublisher struct {
	cl       *kgo.Client
	producer string
	seq      atomic.Uint64
}

// NewAccountPublisher connects to the brokers; name identifies the process
// in event IDs (with its start time, so IDs never repeat across restarts).
func NewAccountPublisher(k Kafka, name string) (*AccountPublisher, error) {
	cl, err := k.Client(kgo.RequiredAcks(kgo.AllISRAcks()))
	if err != nil {
		return nil, err
	}
	return &AccountPublisher{cl: cl, producer: name + "@" + strconv.FormatInt(time.Now().UnixNano(), 10)}, nil
}

// Publish sends a's tier (event.Account, keyed by account ID).
func (p *AccountPublisher) Publish(ctx context.Context, a fsm.Account) error {
	now := time.Now()
	b, err := event.Encode(event.Account{V: event.Version, EventID: event.ID{Producer: p.producer, Seq: p.seq.Add(1)},
		AccountID: a.ID, Tier: a.Tier, Time: now.UnixMilli()})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := p.cl.ProduceSync(ctx, &kgo.Record{Topic: event.TopicAccounts, Key: []byte(a.ID), Value: b}).FirstErr(); err != nil {
		return fmt.Errorf("publish account %s: %w", a.ID, err)
	}
	return nil
}

// Close closes the client.
func (p *AccountPublisher) Close() { p.cl.Close() }
