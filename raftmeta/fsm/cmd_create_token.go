package fsm

import (
	"context"
	"database/sql"
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
}

// createTokenCommand answers the new Token. An unknown account is
// ErrAccountNotFound; a used ID or hash is ErrExists.
var createTokenCommand = command[CreateToken, *createTokenStmts]{
	prepareS: func(p *preparer) *createTokenStmts {
		return &createTokenStmts{
			hashExists: p.prep(`SELECT 1 FROM api_tokens WHERE hash = ?`),
			insert: p.prep(`INSERT INTO api_tokens (id, account_id, hash, name, admin, revoked, created_at)
				VALUES (?, ?, ?, ?, ?, 0, ?)`),
		}
	},
	validate: validateCreateToken,
	apply:    applyCreateToken,
	refuses:  []error{ErrAccountNotFound, ErrExists},
}

type createTokenStmts struct{ hashExists, insert *sql.Stmt }

func validateCreateToken(b *CreateToken) error {
	if err := firstErr(checkID("token id", b.ID), checkHash(b.Hash), checkText("token name", b.Name, maxTextBytes)); err != nil {
		return err
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
	if _, err := exec(ctx, st.insert, b.ID, b.AccountID, b.Hash, b.Name, b.Admin, c.Time); err != nil {
		return nil, err
	}
	return f.getToken(ctx, b.ID)
}
