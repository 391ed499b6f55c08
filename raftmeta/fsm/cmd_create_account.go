package fsm

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// CmdCreateAccount creates an account with its tier and limits.
const CmdCreateAccount CommandType = "create_account"

type CreateAccount struct {
	ID     string `json:"id"`
	Name   string `json:"name"`
	Tier   string `json:"tier"` // "free" | "paid"
	Limits Limits `json:"limits"`
}

// createAccountCommand answers the new Account; an existing ID is ErrExists.
var createAccountCommand = command[CreateAccount, *createAccountStmts]{
	prepareS: func(p *preparer) *createAccountStmts {
		return &createAccountStmts{insert: p.prep(`INSERT INTO accounts (id, name, tier, max_databases,
			max_storage_bytes, max_database_bytes, rows_read_per_day, rows_written_per_day,
			heartbeat_interval_ms, active_databases, created_at, updated_at)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 0, ?, ?)`)}
	},
	validate: validateCreateAccount,
	apply:    applyCreateAccount,
	refuses:  []error{ErrExists},
	audit: func(b *CreateAccount, v any) auditRow {
		return auditRow{account: b.ID, subject: b.ID, detail: map[string]any{"name": b.Name, "tier": b.Tier, "limits": b.Limits}}
	},
}

type createAccountStmts struct{ insert *sql.Stmt }

func validateCreateAccount(b *CreateAccount) error {
	return firstErr(checkID("account id", b.ID), checkText("account name", b.Name, maxTextBytes),
		checkTier(b.Tier), checkLimits(b.Limits))
}

func applyCreateAccount(f *FSM, ctx context.Context, c *Command, st *createAccountStmts, b *CreateAccount) (any, error) {
	if _, err := f.getAccount(ctx, b.ID); err == nil {
		return nil, fmt.Errorf("%w: account %q", ErrExists, b.ID)
	} else if !errors.Is(err, ErrAccountNotFound) {
		return nil, err
	}
	l := b.Limits
	if _, err := exec(ctx, st.insert, b.ID, b.Name, b.Tier, l.MaxDatabases, l.MaxStorageBytes,
		l.MaxDatabaseBytes, l.RowsReadPerDay, l.RowsWrittenPerDay, l.HeartbeatIntervalMs, c.Time, c.Time); err != nil {
		return nil, err
	}
	return f.getAccount(ctx, b.ID)
}
