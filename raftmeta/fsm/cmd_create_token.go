package fsm

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
)

// CmdCreateToken stores an API token (its hash; the secret is never stored).
const CmdCreateToken CommandType = "create_token"

type CreateToken struct {
	ID        string `json:"id"`
	AccountID string `json:"account_id"` // empty for an admin token
	Hash      string `json:"hash"`       // hex SHA-256 of the secret; the secret is never stored
	Name      string `json:"name"`
	Admin     bool   `json:"admin"`
	// Scope (ScopeEdit when empty), Databases (UUIDs; empty: all of the
	// account's) and ExpiresAt (Unix ns; 0: never): Token's.
	Scope     string   `json:"scope,omitempty"`
	Databases []string `json:"databases,omitempty"`
	ExpiresAt int64    `json:"expires_at,omitempty"`
}

// createTokenCommand answers the new Token. An unknown account is
// ErrAccountNotFound; a used ID or hash is ErrExists.
var createTokenCommand = command[CreateToken, *createTokenStmts]{
	prepareS: func(p *preparer) *createTokenStmts {
		return &createTokenStmts{
			hashExists: p.prep(`SELECT 1 FROM api_tokens WHERE hash = ?`),
			insert: p.prep(`INSERT INTO api_tokens (id, account_id, hash, name, admin, revoked, created_at, scope, databases, expires_at)
				VALUES (?, ?, ?, ?, ?, 0, ?, ?, ?, ?)`),
		}
	},
	validate: validateCreateToken,
	apply:    applyCreateToken,
	refuses:  []error{ErrAccountNotFound, ErrExists},
	audit: func(b *CreateToken, v any) auditRow {
		return auditRow{account: b.AccountID, subject: "token:" + b.ID, detail: map[string]any{"name": b.Name, "admin": b.Admin, "scope": b.Scope, "databases": b.Databases, "expires_at": b.ExpiresAt}}
	},
}

type createTokenStmts struct{ hashExists, insert *sql.Stmt }

func validateCreateToken(b *CreateToken) error {
	if err := firstErr(checkID("token id", b.ID), checkHash(b.Hash), checkText("token name", b.Name, maxTextBytes)); err != nil {
		return err
	}
	switch b.Scope {
	case "":
		b.Scope = ScopeEdit
	case ScopeEdit, ScopeRead:
	default:
		return fmt.Errorf("%w: token scope %.32q (read or edit)", ErrInvalid, b.Scope)
	}
	if len(b.Databases) > maxTokenDatabases {
		return fmt.Errorf("%w: a token is limited to at most %d databases", ErrInvalid, maxTokenDatabases)
	}
	for _, u := range b.Databases {
		if err := checkUUID(u); err != nil {
			return err
		}
	}
	if b.ExpiresAt < 0 {
		return fmt.Errorf("%w: expires_at %d", ErrInvalid, b.ExpiresAt)
	}
	switch {
	case b.AccountID == "" && !b.Admin:
		return fmt.Errorf("%w: a non-admin token needs an account", ErrInvalid)
	case b.AccountID != "":
		return checkID("account id", b.AccountID)
	}
	return nil
}

func applyCreateToken(f *FSM, ctx context.Context, c *Command, st *createTokenStmts, b *CreateToken) (any, error) {
	if b.AccountID != "" {
		if _, err := f.getAccount(ctx, b.AccountID); err != nil {
			return nil, err
		}
	}
	if _, err := f.getToken(ctx, b.ID); err == nil {
		return nil, fmt.Errorf("%w: token %q", ErrExists, b.ID)
	} else if !errors.Is(err, ErrNotFound) {
		return nil, err
	}
	if taken, err := exists(ctx, st.hashExists, b.Hash); err != nil {
		return nil, err
	} else if taken {
		return nil, fmt.Errorf("%w: token hash", ErrExists)
	}
	dbs := ""
	if len(b.Databases) > 0 {
		j, err := json.Marshal(b.Databases)
		if err != nil {
			return nil, err
		}
		dbs = string(j)
	}
	if _, err := exec(ctx, st.insert, b.ID, b.AccountID, b.Hash, b.Name, b.Admin, c.Time, b.Scope, dbs, b.ExpiresAt); err != nil {
		return nil, err
	}
	return f.getToken(ctx, b.ID)
}
