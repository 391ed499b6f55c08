package fsm

import (
	"context"
	"database/sql"
	"fmt"
)

// CmdDrainStats folds pending size changes into the accounts' storage
// totals (proposed by the leader's loop).
const CmdDrainStats CommandType = "drain_stats"

// DrainStats moves up to Max change-log rows (0: all) into
// account_database_stats, one update per account.
type DrainStats struct {
	Max int `json:"max"`
}

// DrainResult is Result.Value of DrainStats.
type DrainResult struct {
	Changes  int64 `json:"changes"`  // change-log rows consumed
	Accounts int64 `json:"accounts"` // account totals updated (one update each)
}

// drainStatsCommand answers a DrainResult; it refuses only invalid bodies.
var drainStatsCommand = command[DrainStats, *drainStatsStmts]{
	prepareS: func(p *preparer) *drainStatsStmts {
		return &drainStatsStmts{
			changesMax: p.prep(`SELECT COALESCE(MAX(id), 0) FROM account_database_stats_changes`),
			changesMin: p.prep(`SELECT COALESCE(MIN(id), 0) FROM account_database_stats_changes`),
			upsert: p.prep(`INSERT INTO account_database_stats (account_id, storage_bytes, updated_at)
		SELECT account_id, SUM(delta), ?2 FROM account_database_stats_changes WHERE id <= ?1
		GROUP BY account_id
		ON CONFLICT (account_id) DO UPDATE SET storage_bytes = storage_bytes + excluded.storage_bytes,
		updated_at = excluded.updated_at`),
			delete: p.prep(`DELETE FROM account_database_stats_changes WHERE id <= ?`),
		}
	},
	validate: func(b *DrainStats) error {
		if b.Max < 0 {
			return fmt.Errorf("%w: drain max %d", ErrInvalid, b.Max)
		}
		return nil
	},
	apply: applyDrainStats,
}

type drainStatsStmts struct{ changesMax, changesMin, upsert, delete *sql.Stmt }

func applyDrainStats(f *FSM, ctx context.Context, c *Command, s *drainStatsStmts, b *DrainStats) (any, error) {
	var minID, maxID int64
	if err := s.changesMin.QueryRowContext(ctx).Scan(&minID); err != nil {
		return nil, storageErr(err)
	}
	if minID == 0 {
		return DrainResult{}, nil
	}
	if err := s.changesMax.QueryRowContext(ctx).Scan(&maxID); err != nil {
		return nil, storageErr(err)
	}
	// Change ids are contiguous (drains delete a prefix and inserts take
	// max+1), so the first Max rows are exactly minID..minID+Max-1.
	cutoff := maxID
	if b.Max > 0 && minID+int64(b.Max)-1 < maxID {
		cutoff = minID + int64(b.Max) - 1
	}
	accounts, err := exec(ctx, s.upsert, cutoff, c.Time)
	if err != nil {
		return nil, err
	}
	changes, err := exec(ctx, s.delete, cutoff)
	if err != nil {
		return nil, err
	}
	return DrainResult{Changes: changes, Accounts: accounts}, nil
}
