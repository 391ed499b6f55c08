// Package pipeline owns the producing side of Shoal's background plane:
// the Kafka usage producer other services import (Producer: idempotent,
// batched, bounded memory, never blocking its caller, with a bounded local
// spill that is replayed in order when the broker returns), the per-host
// pre-aggregation of query usage and database sizes into events
// (UsageAggregator, SizeAggregator), the event identities that make
// at-least-once delivery deduplicable (BootEpoch, Sequencer), and the
// topics of the plane (DefaultTopics, EnsureTopics).
//
// Data flows one way: object hosts Record into the aggregators on the
// query path; every window the aggregators publish event records
// (package event) through the Producer to Kafka; consumers (pipeline/chsink
// into ClickHouse, pipeline/storage into the catalog, the edge's route
// feed) read them. The embedded broker of dev mode and tests is in
// pipeline/broker. See DESIGN.md for invariants and the spill format.
package pipeline
