package edge

import (
	"context"

	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// Catalog is the part of the catalog service (raftmeta.Client) the edge uses.
//
// Reads (Database, DatabaseByName, ListDatabases, Account, TokenByHash, Hosts)
// may be served by followers and be slightly stale; the edge only uses them
// where staleness is acceptable and never on the query path of a cached route.
// Writes (CreateDatabase, DeleteDatabase, UpdateDatabase and the admin
// commands) go through Raft: when they return nil the change is committed.
//
// Errors: refusals are fsm's sentinel errors (fsm.ErrNotFound,
// fsm.ErrNameTaken, fsm.ErrDatabaseLimit, fsm.ErrAccountNotFound, …) matched
// with errors.Is. Any other error means the catalog could not answer (no
// leader, nodes unreachable, too stale) and is treated as retryable; for a
// write it also means the outcome is unknown — the command may have been
// committed.
//
// Implementations must be safe for concurrent use.
type Catalog interface {
	CreateDatabase(ctx context.Context, cmd fsm.CreateDatabase) (fsm.Database, error)
	DeleteDatabase(ctx context.Context, cmd fsm.DeleteDatabase) (fsm.Database, error)
	UpdateDatabase(ctx context.Context, cmd fsm.UpdateDatabase) (fsm.Database, error)

	Database(ctx context.Context, uuid string) (fsm.Database, error)
	DatabaseByName(ctx context.Context, accountID, name string) (fsm.Database, error)
	ListDatabases(ctx context.Context, accountID string, q fsm.ListQuery) ([]fsm.Database, int64, error)
	Account(ctx context.Context, id string) (fsm.Account, error)
	TokenByHash(ctx context.Context, hash string) (fsm.Token, error)
	Hosts(ctx context.Context) ([]fsm.Host, error)

	CreateAccount(ctx context.Context, cmd fsm.CreateAccount) (fsm.Account, error)
	UpdateAccount(ctx context.Context, cmd fsm.UpdateAccount) (fsm.Account, error)
	CreateToken(ctx context.Context, cmd fsm.CreateToken) (fsm.Token, error)
	RevokeToken(ctx context.Context, cmd fsm.RevokeToken) (fsm.Token, error)
}
