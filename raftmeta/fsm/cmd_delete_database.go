package fsm

import (
	"context"
	"database/sql"
)

// CmdDeleteDatabase marks a database deleted (its UUID is never reused; its
// name is free again).
const CmdDeleteDatabase CommandType = "delete_database"

type DeleteDatabase struct {
	AccountID string `json:"account_id"`
	UUID      string `json:"uuid"`
}

// deleteDatabaseCommand answers the deleted Database. A database that is
// deleted or belongs to another account is ErrNotFound.
var deleteDatabaseCommand = command[DeleteDatabase, *deleteDatabaseStmts]{
	prepareS: func(p *preparer) *deleteDatabaseStmts {
		return &deleteDatabaseStmts{
			delete: p.prep(`UPDATE databases SET state = 'deleted', deleted_at = ?2,
			routing_generation = routing_generation + 1 WHERE uuid = ?1 AND state = 'active'`),
			statsDelete: p.prep(`DELETE FROM database_stats WHERE uuid = ?`),
		}
	},
	validate: func(b *DeleteDatabase) error { return checkDatabaseRef(b.AccountID, b.UUID) },
	apply:    applyDeleteDatabase,
	refuses:  []error{ErrNotFound},
	audit: func(b *DeleteDatabase, v any) auditRow {
		d, _ := v.(Database)
		return auditRow{account: b.AccountID, subject: b.UUID, detail: map[string]any{"name": d.Name}}
	},
}

type deleteDatabaseStmts struct{ delete, statsDelete *sql.Stmt }

func applyDeleteDatabase(f *FSM, ctx context.Context, c *Command, st *deleteDatabaseStmts, b *DeleteDatabase) (any, error) {
	d, err := f.activeDatabaseOf(ctx, b.AccountID, b.UUID)
	if err != nil {
		return nil, err
	}
	if _, err := exec(ctx, st.delete, d.UUID, c.Time); err != nil {
		return nil, err
	}
	// No longer active: out of its host's heartbeat digest (hbdigest.go).
	f.digestAdd(d.HostID, d.UUID, d.ObjectID, d.RoutingGeneration, -1)
	if _, err := exec(ctx, f.stmts.accountIncr, d.AccountID, -1); err != nil {
		return nil, err
	}
	// The delete trigger appends -size to the change log, so the account's
	// storage total drops by the database's last size once drained.
	if _, err := exec(ctx, st.statsDelete, d.UUID); err != nil {
		return nil, err
	}
	return f.getDatabase(ctx, d.UUID)
}
