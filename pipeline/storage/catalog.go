package storage

import (
	"context"

	"github.com/shoaldb/shoal/raftmeta"
	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// Catalog is what the storage consumer needs of the catalog.
//
// Contract: a nil error means the command was committed by a quorum and
// applied (durable: the consumer commits Kafka offsets on it), and the
// result counts every stat once (applied, stale or skipped). A catalog
// refusal is a *fsm.Error (the command changed nothing); any other error
// means the write may or may not have been applied, and the consumer
// retries it, which is safe because a size applied twice is stale the
// second time. Called from several goroutines at once (one per group
// member), each with at most one call in flight.
type Catalog interface {
	SetDatabaseStats(ctx context.Context, stats []fsm.DatabaseStat) (fsm.StatsResult, error)
}

var _ Catalog = (*raftmeta.Client)(nil)
