package validate

import (
	"fmt"
	"sort"
	"time"

	"github.com/shoaldb/shoal/test/robustness/traffic"
)

// LimitedAccount is one free-tier account of the limiter's traffic, as the
// limit checks need it.
type LimitedAccount struct {
	Account string
	// Limit is the account's own rows-written-per-day limit: the limiter
	// flags it once ClickHouse holds more than Limit rows written today.
	Limit int64
	DBs   []string
	// SetupRows is what its set-up wrote (acknowledged answers);
	// SetupUnacked how many set-up requests were not acknowledged (each
	// may have written up to the largest write seen).
	SetupRows    int64
	SetupUnacked int
}

// LimitTimeline is what the limit checks derive from one account's writes:
// when it certainly went over its limit, and by when every write must be
// refused.
type LimitTimeline struct {
	// Over is the return of the acknowledged write that took the rows the
	// account certainly wrote past its limit (0 with OK false: never).
	Over time.Duration
	OK   bool
	// ByRefusal: Over is the return of the first refusal for the limit,
	// which came before the rows certainly written were over it.
	ByRefusal bool
	// Deadline is Over plus the convergence bound, pushed past every
	// fault in effect after Over (to the fault's end plus the bound).
	Deadline time.Duration
	// FirstRefusal is the first refusal for the limit returned after Over
	// (0: none); LastAccepted the call of the last write acknowledged
	// after Over (0: none). The account's refusal took effect between the
	// two (on each host: they learn the flag separately).
	FirstRefusal, LastAccepted time.Duration
	// MaxRows is the most rows one write was seen to write (at least 1):
	// what a write of unknown outcome may have written.
	MaxRows int64
}

// Timeline computes acct's LimitTimeline from ops (only its FreeInsert
// operations count). Rows of acknowledged writes that returned inside one
// of crashes' windows of their database (what a host killed -9 may have
// lost of its usage, as UsageExact excuses) are not counted as certainly
// written: the limiter may never have seen them. If a refusal for the
// limit came first, it marks the account over instead. faults are the windows the
// convergence bound is extended past (a fault healing at T moves the
// deadline to at least T + converge); converge is the bound itself.
func Timeline(ops []traffic.Op, acct LimitedAccount, crashes map[string][]Window, faults []Window, converge time.Duration) LimitTimeline {
	mine := limitOps(ops, acct)
	tl := LimitTimeline{MaxRows: 1}
	for _, op := range mine {
		tl.MaxRows = max(tl.MaxRows, op.Rows)
	}
	sort.SliceStable(mine, func(i, j int) bool { return mine[i].Return < mine[j].Return })
	certain := acct.SetupRows
	for _, op := range mine {
		if op.Outcome != traffic.OK || inWindows(op.Return, crashes[op.DB]) {
			continue
		}
		certain += op.Rows
		if certain > acct.Limit {
			tl.Over, tl.OK = op.Return, true
			break
		}
	}
	// A refusal for the limit also shows the account over (in ClickHouse's
	// count, which may hold writes the count above could not be sure of:
	// those returned in a crash window): the flag existed by its return.
	// LimitEnforced checks separately that it was not premature.
	for _, op := range mine {
		if op.Outcome == traffic.Limited {
			if !tl.OK || op.Return < tl.Over {
				tl.Over, tl.OK, tl.ByRefusal = op.Return, true, true
			}
			break
		}
	}
	if !tl.OK {
		return tl
	}
	tl.Deadline = tl.Over + converge
	fs := append([]Window(nil), faults...)
	sort.Slice(fs, func(i, j int) bool { return fs[i].From < fs[j].From })
	for _, f := range fs {
		if f.From < tl.Deadline && f.To > tl.Over {
			tl.Deadline = max(tl.Deadline, f.To+converge)
		}
	}
	for _, op := range mine {
		if op.Outcome == traffic.Limited && op.Return >= tl.Over && (tl.FirstRefusal == 0 || op.Return < tl.FirstRefusal) {
			tl.FirstRefusal = op.Return
		}
		if op.Outcome == traffic.OK && op.Call >= tl.Over {
			tl.LastAccepted = max(tl.LastAccepted, op.Call)
		}
	}
	return tl
}

func limitOps(ops []traffic.Op, acct LimitedAccount) []traffic.Op {
	dbs := map[string]bool{}
	for _, db := range acct.DBs {
		dbs[db] = true
	}
	var out []traffic.Op
	for _, op := range ops {
		if op.Kind == traffic.FreeInsert && dbs[op.DB] {
			out = append(out, op)
		}
	}
	return out
}

func inWindows(at time.Duration, ws []Window) bool {
	for _, w := range ws {
		if at >= w.From && at <= w.To {
			return true
		}
	}
	return false
}

// LimitEnforced: the free tier's daily row limit is enforced, and only
// when due. For acct's writes:
//
//   - never refused under the limit: a write refused for the limit
//     (429/7505) returned when the rows the account can have written at
//     most — its set-up, plus every write called before that refusal
//     returned that was acknowledged or of unknown outcome (the largest
//     write seen, for those) — were not over the limit is a violation (the
//     limiter flagged an account ClickHouse could not hold over it);
//   - refused once over, within the bound: every write called after the
//     Timeline's Deadline (the account certainly over its limit, plus
//     converge, pushed past the faults in effect meanwhile) that was
//     acknowledged is a violation;
//   - the check saw something: the account went over, and some write was
//     called after the deadline.
//
// What the account's writes left in its tables (acknowledged kept, refused
// absent) is LimitedRowsKept's.
func LimitEnforced(ops []traffic.Op, acct LimitedAccount, crashes map[string][]Window, faults []Window, converge time.Duration) (Result, LimitTimeline) {
	r := Result{Check: "free-tier daily row limit enforced: never refused under it, every write refused within the bound once over"}
	tl := Timeline(ops, acct, crashes, faults, converge)
	mine := limitOps(ops, acct)
	sort.SliceStable(mine, func(i, j int) bool { return mine[i].Call < mine[j].Call })
	// At most: set-up, then every write not refused, by call.
	for _, op := range mine {
		if op.Outcome != traffic.Limited {
			continue
		}
		r.Checked++
		most := acct.SetupRows + int64(acct.SetupUnacked)*tl.MaxRows
		for _, w := range mine {
			if w.Call >= op.Return {
				break
			}
			switch w.Outcome {
			case traffic.OK:
				most += w.Rows
			case traffic.Unknown:
				most += tl.MaxRows
			}
		}
		if most <= acct.Limit {
			r.Violations = append(r.Violations, fmt.Sprintf("account %s: write of %d to %s refused for its daily limit at %s with at most %d rows written of a limit of %d",
				acct.Account, op.Value, op.DB, op.Return.Round(time.Millisecond), most, acct.Limit))
		}
	}
	after := 0
	if tl.OK {
		for _, op := range mine {
			if op.Call <= tl.Deadline {
				continue
			}
			after++
			r.Checked++
			if op.Outcome == traffic.OK {
				r.Violations = append(r.Violations, fmt.Sprintf("account %s: write of %d to %s acknowledged at %s, the account over its limit of %d since %s (deadline %s)",
					acct.Account, op.Value, op.DB, op.Return.Round(time.Millisecond), acct.Limit, tl.Over.Round(time.Millisecond), tl.Deadline.Round(time.Millisecond)))
			}
		}
	}
	switch {
	case !tl.OK:
		r.Violations = append(r.Violations, fmt.Sprintf("account %s never certainly went over its limit of %d: nothing was checked", acct.Account, acct.Limit))
	case after == 0:
		r.Violations = append(r.Violations, fmt.Sprintf("account %s: no write called after its deadline %s: nothing was checked", acct.Account, tl.Deadline.Round(time.Millisecond)))
	}
	since := func(at time.Duration) string {
		if at == 0 {
			return "none"
		}
		return "+" + (at - tl.Over).Round(time.Millisecond).String()
	}
	by := ""
	if tl.ByRefusal {
		by = " (by its first refusal)"
	}
	r.Note = fmt.Sprintf("limit %d rows: over at %s%s, last write accepted %s, first refusal %s, deadline %s (bound %s)",
		acct.Limit, tl.Over.Round(time.Millisecond), by, since(tl.LastAccepted), since(tl.FirstRefusal), since(tl.Deadline), converge)
	sort.Strings(r.Violations)
	return r, tl
}

// LimitedRowsKept: the limiter loses no acknowledged write and lets no
// refused one through. rows holds, per database of the limited accounts,
// the values its table t holds in the file its host left (read after the
// final kill: the account's queries are refused by then). Every
// acknowledged write's value is there; no value refused for the limit (or
// otherwise) is; every value there was written by some write.
func LimitedRowsKept(ops []traffic.Op, rows map[string]map[int64]bool) Result {
	r := Result{Check: "free-tier limited accounts: acknowledged writes kept, refused writes absent (the hosts' files)"}
	attempted := map[string]map[int64]bool{}
	for _, op := range ops {
		if op.Kind != traffic.FreeInsert {
			continue
		}
		if attempted[op.DB] == nil {
			attempted[op.DB] = map[int64]bool{}
		}
		attempted[op.DB][op.Value] = true
		vals, ok := rows[op.DB]
		if !ok {
			continue
		}
		switch op.Outcome {
		case traffic.OK:
			r.Checked++
			if !vals[op.Value] {
				r.Violations = append(r.Violations, fmt.Sprintf("%s: value %d acknowledged at %s, not in the file", op.DB, op.Value, op.Return.Round(time.Millisecond)))
			}
		case traffic.Limited, traffic.Refused:
			r.Checked++
			if vals[op.Value] {
				r.Violations = append(r.Violations, fmt.Sprintf("%s: value %d refused (%s) at %s, in the file", op.DB, op.Value, op.Outcome, op.Return.Round(time.Millisecond)))
			}
		}
	}
	for db, vals := range rows {
		for v := range vals {
			if !attempted[db][v] {
				r.Violations = append(r.Violations, fmt.Sprintf("%s: value %d in the file, never written", db, v))
			}
		}
	}
	sort.Strings(r.Violations)
	return r
}
