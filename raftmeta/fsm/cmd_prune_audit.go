package fsm

import (
	"context"
	"fmt"
)

// CmdPruneAudit deletes audit rows older than Before (Unix ns), at most Max
// (default 100,000) of the oldest; the leader proposes it hourly.
const CmdPruneAudit CommandType = "prune_audit"

type PruneAudit struct {
	Before int64 `json:"before"`
	Max    int   `json:"max,omitempty"`
}

var pruneAuditCommand = command[PruneAudit, noStmts]{
	validate: func(b *PruneAudit) error {
		if b.Before <= 0 || b.Max < 0 {
			return fmt.Errorf("%w: prune_audit before %d, max %d", ErrInvalid, b.Before, b.Max)
		}
		if b.Max == 0 {
			b.Max = 100_000
		}
		return nil
	},
	apply: func(f *FSM, ctx context.Context, _ *Command, _ noStmts, b *PruneAudit) (any, error) {
		// The oldest Max rows by id (ids follow commit order, so time
		// order up to proposers' clock skew), those older than Before.
		_, err := exec(ctx, f.stmts.auditPrune, b.Max, b.Before)
		return nil, err
	},
}
