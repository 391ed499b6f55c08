package fsm

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"
)

// CmdClaimLimitNotice claims the right to send an account's over-limit
// notice for one UTC day. It is the limiter's durable, linearizable
// dedupe (limiter/DESIGN.md, "Dedupe"): of every limiter that proposes a
// claim for (account, day), exactly one is answered Claimed; a retry of
// that same proposal (same RequestID) is answered the original result.
const CmdClaimLimitNotice CommandType = "claim_limit_notice"

// ClaimLimitNotice asks for the notice of AccountID's limit on Day
// (YYYY-MM-DD, UTC). Holder names the proposing limiter instance (kept for
// operators; the answer does not depend on it).
type ClaimLimitNotice struct {
	AccountID string `json:"account_id"`
	Day       string `json:"day"`
	Holder    string `json:"holder"`
}

// LimitNoticeClaim answers a ClaimLimitNotice. Claimed is true for the one
// proposal that took the day; otherwise Day and Holder are the claim
// already recorded (the same day or a later one).
type LimitNoticeClaim struct {
	Claimed bool   `json:"claimed"`
	Day     string `json:"day"`
	Holder  string `json:"holder"`
}

// claimLimitNoticeCommand keeps one row per account in meta, key
// "limit_notice/<account>", value "<day> <holder>": the latest day claimed.
// A claim for a day not after the recorded one is answered unclaimed; days
// compare as text, which orders YYYY-MM-DD. It refuses nothing beyond the
// envelope refusals: an account the catalog does not know can still be
// claimed (usage can name an account deleted since).
var claimLimitNoticeCommand = command[ClaimLimitNotice, *claimLimitNoticeStmts]{
	prepareS: func(p *preparer) *claimLimitNoticeStmts {
		return &claimLimitNoticeStmts{
			get: p.prep(`SELECT value FROM meta WHERE key = ?1`),
			put: p.prep(`INSERT INTO meta (key, value) VALUES (?1, ?2)
				ON CONFLICT (key) DO UPDATE SET value = excluded.value`),
		}
	},
	validate: func(b *ClaimLimitNotice) error {
		if err := checkID("account id", b.AccountID); err != nil {
			return err
		}
		if _, err := time.Parse(time.DateOnly, b.Day); err != nil || len(b.Day) != len(time.DateOnly) {
			return fmt.Errorf("%w: day %.40q is not YYYY-MM-DD", ErrInvalid, b.Day)
		}
		return checkText("holder", b.Holder, maxIDBytes)
	},
	apply: applyClaimLimitNotice,
}

type claimLimitNoticeStmts struct{ get, put *sql.Stmt }

func applyClaimLimitNotice(_ *FSM, ctx context.Context, _ *Command, st *claimLimitNoticeStmts, b *ClaimLimitNotice) (any, error) {
	key := "limit_notice/" + b.AccountID
	var v string
	switch err := st.get.QueryRowContext(ctx, key).Scan(&v); {
	case errors.Is(err, sql.ErrNoRows):
	case err != nil:
		return nil, storageErr(err)
	default:
		day, holder, _ := strings.Cut(v, " ")
		if day >= b.Day {
			return LimitNoticeClaim{Day: day, Holder: holder}, nil
		}
	}
	if _, err := exec(ctx, st.put, key, b.Day+" "+b.Holder); err != nil {
		return nil, err
	}
	return LimitNoticeClaim{Claimed: true, Day: b.Day, Holder: b.Holder}, nil
}
