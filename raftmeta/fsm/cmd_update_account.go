package fsm

import (
	"context"
	"database/sql"
)

// CmdUpdateAccount changes an account's tier and/or limits.
const CmdUpdateAccount CommandType = "update_account"

// UpdateAccount changes the fields that are set.
type UpdateAccount struct {
	ID     string  `json:"id"`
	Tier   *string `json:"tier,omitempty"`
	Limits *Limits `json:"limits,omitempty"`
}

// updateAccountCommand answers the updated Account. The tier and limits are
// checked after the account is found (an unknown account is
// ErrAccountNotFound whatever else the body holds), so those checks are in
// apply, not validate.
var updateAccountCommand = command[UpdateAccount, *updateAccountStmts]{
	prepareS: func(p *preparer) *updateAccountStmts {
		return &updateAccountStmts{update: p.prep(`UPDATE accounts SET tier = ?2, max_databases = ?3,
			max_storage_bytes = ?4, max_database_bytes = ?5, rows_read_per_day = ?6,
			rows_written_per_day = ?7, heartbeat_interval_ms = ?8, updated_at = ?9 WHERE id = ?1`)}
	},
	validate: func(b *UpdateAccount) error { return checkID("account id", b.ID) },
	apply:    applyUpdateAccount,
	refuses:  []error{ErrAccountNotFound},
	audit: func(b *UpdateAccount, v any) auditRow {
		d := map[string]any{}
		if b.Tier != nil {
			d["tier"] = *b.Tier
		}
		if b.Limits != nil {
			d["limits"] = *b.Limits
		}
		return auditRow{account: b.ID, subject: b.ID, detail: d}
	},
}

type updateAccountStmts struct{ update *sql.Stmt }

func applyUpdateAccount(f *FSM, ctx context.Context, c *Command, st *updateAccountStmts, b *UpdateAccount) (any, error) {
	a, err := f.getAccount(ctx, b.ID)
	if err != nil {
		return nil, err
	}
	if b.Tier != nil {
		if err := checkTier(*b.Tier); err != nil {
			return nil, err
		}
		a.Tier = *b.Tier
	}
	if b.Limits != nil {
		if err := checkLimits(*b.Limits); err != nil {
			return nil, err
		}
		a.Limits = *b.Limits
	}
	l := a.Limits
	if _, err := exec(ctx, st.update, a.ID, a.Tier, l.MaxDatabases, l.MaxStorageBytes,
		l.MaxDatabaseBytes, l.RowsReadPerDay, l.RowsWrittenPerDay, l.HeartbeatIntervalMs, c.Time); err != nil {
		return nil, err
	}
	return f.getAccount(ctx, b.ID)
}
