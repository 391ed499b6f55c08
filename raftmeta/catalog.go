package raftmeta

import (
	"context"

	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// CatalogReader is the catalog's read side as the other components see it.
//
// Contract: every method is safe for concurrent use. Each takes the read's
// consistency (the zero ReadOptions is linearizable); a Stale read may be
// answered from a short-lived cache shared by all callers of the same
// query, so it can be up to cache TTL + the node's staleness old. Missing
// rows are fsm.ErrNotFound / fsm.ErrAccountNotFound; no reachable node is
// ErrUnavailable (retryable); a Stale read no node could serve within the
// staleness bound is ErrTooStale.
type CatalogReader interface {
	Database(ctx context.Context, uuid string, o ReadOptions) (fsm.Database, error)
	DatabaseByName(ctx context.Context, accountID, name string, o ReadOptions) (fsm.Database, error)
	ListDatabases(ctx context.Context, accountID string, q fsm.ListQuery, o ReadOptions) ([]fsm.Database, int64, error)
	Account(ctx context.Context, id string, o ReadOptions) (fsm.Account, error)
	TokenByHash(ctx context.Context, hash string, o ReadOptions) (fsm.Token, error)
	Hosts(ctx context.Context, o ReadOptions) ([]fsm.Host, error)
	Heartbeat(ctx context.Context, uuids []string, o ReadOptions) (fsm.HeartbeatAnswer, error)
}

// CatalogWriter is the catalog's write side.
//
// Contract: safe for concurrent use. A nil error means the command is
// committed by a quorum and applied on the leader: it is the checkpoint of
// the caller's flow and survives any single node's crash. A write is retried
// across nodes with one request ID, so it applies at most once; when the
// retries are exhausted the error is ErrUnavailable and the write may or may
// not have happened (retrying with fresh IDs is the caller's choice).
// Catalog refusals are fsm's sentinel errors (fsm.IsRefusal tells them from
// failures to reach the catalog), final, and left the catalog unchanged;
// each command's are listed in its definition (raftmeta/fsm/cmd_<type>.go).
type CatalogWriter interface {
	CreateAccount(ctx context.Context, a fsm.CreateAccount) (fsm.Account, error)
	UpdateAccount(ctx context.Context, a fsm.UpdateAccount) (fsm.Account, error)
	CreateToken(ctx context.Context, t fsm.CreateToken) (fsm.Token, error)
	RevokeToken(ctx context.Context, id string) (fsm.Token, error)
	RegisterHost(ctx context.Context, h fsm.RegisterHost) (fsm.Host, error)
	ReportHostLoad(ctx context.Context, h fsm.ReportHostLoad) (fsm.Host, error)
	CreateDatabase(ctx context.Context, d fsm.CreateDatabase) (fsm.Database, error)
	DeleteDatabase(ctx context.Context, accountID, uuid string) (fsm.Database, error)
	UpdateDatabase(ctx context.Context, d fsm.UpdateDatabase) (fsm.Database, error)
	SetDatabaseStats(ctx context.Context, stats []fsm.DatabaseStat) (fsm.StatsResult, error)
}

// Catalog is both sides.
type Catalog interface {
	CatalogReader
	CatalogWriter
}

var _ Catalog = (*Client)(nil)
