package fsm

import (
	"context"
	"database/sql"
)

// CmdUpdateDatabase changes a database's settings (read replication).
const CmdUpdateDatabase CommandType = "update_database"

// UpdateDatabase changes the fields that are set.
type UpdateDatabase struct {
	AccountID       string  `json:"account_id"`
	UUID            string  `json:"uuid"`
	ReadReplication *string `json:"read_replication,omitempty"`
}

// updateDatabaseCommand answers the updated Database. A database that is
// deleted or belongs to another account is ErrNotFound; the mode is
// checked after the database is found, so that check is in apply.
var updateDatabaseCommand = command[UpdateDatabase, *updateDatabaseStmts]{
	prepareS: func(p *preparer) *updateDatabaseStmts {
		return &updateDatabaseStmts{setRR: p.prep(`UPDATE databases SET read_replication = ?2 WHERE uuid = ?1`)}
	},
	validate: func(b *UpdateDatabase) error { return checkDatabaseRef(b.AccountID, b.UUID) },
	apply:    applyUpdateDatabase,
	refuses:  []error{ErrNotFound},
	audit: func(b *UpdateDatabase, v any) auditRow {
		d := map[string]any{}
		if b.ReadReplication != nil {
			d["read_replication"] = *b.ReadReplication
		}
		return auditRow{account: b.AccountID, subject: b.UUID, detail: d}
	},
}

type updateDatabaseStmts struct{ setRR *sql.Stmt }

func applyUpdateDatabase(f *FSM, ctx context.Context, c *Command, st *updateDatabaseStmts, b *UpdateDatabase) (any, error) {
	d, err := f.activeDatabaseOf(ctx, b.AccountID, b.UUID)
	if err != nil {
		return nil, err
	}
	if b.ReadReplication != nil {
		if err := checkReadReplication(*b.ReadReplication); err != nil {
			return nil, err
		}
		if _, err := exec(ctx, st.setRR, d.UUID, *b.ReadReplication); err != nil {
			return nil, err
		}
	}
	return f.getDatabase(ctx, d.UUID)
}
