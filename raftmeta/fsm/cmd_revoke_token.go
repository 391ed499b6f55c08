package fsm

import (
	"context"
	"database/sql"
)

// CmdRevokeToken revokes an API token.
const CmdRevokeToken CommandType = "revoke_token"

type RevokeToken struct {
	ID string `json:"id"`
}

// revokeTokenCommand answers the revoked Token; an unknown ID is
// ErrNotFound. Revoking a revoked token is a no-op (keeps the first
// revoked_at).
var revokeTokenCommand = command[RevokeToken, *revokeTokenStmts]{
	prepareS: func(p *preparer) *revokeTokenStmts {
		return &revokeTokenStmts{revoke: p.prep(`UPDATE api_tokens SET revoked = 1, revoked_at = ?2
			WHERE id = ?1 AND revoked = 0`)}
	},
	validate: func(b *RevokeToken) error { return checkID("token id", b.ID) },
	apply:    applyRevokeToken,
	refuses:  []error{ErrNotFound},
	audit: func(b *RevokeToken, v any) auditRow {
		t, _ := v.(Token)
		return auditRow{account: t.AccountID, subject: "token:" + b.ID}
	},
}

type revokeTokenStmts struct{ revoke *sql.Stmt }

func applyRevokeToken(f *FSM, ctx context.Context, c *Command, st *revokeTokenStmts, b *RevokeToken) (any, error) {
	if _, err := f.getToken(ctx, b.ID); err != nil {
		return nil, err
	}
	if _, err := exec(ctx, st.revoke, b.ID, c.Time); err != nil {
		return nil, err
	}
	return f.getToken(ctx, b.ID)
}
