package validate

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/shoaldb/shoal/test/robustness/traffic"
)

// The limit checks must fail on the violations they exist for: a refusal
// while the account cannot be over its limit, a write acknowledged past
// the bound, a write lost or let through.
func TestLimitEnforcedCatchesViolations(t *testing.T) {
	acct := LimitedAccount{Account: "f", Limit: 3, DBs: []string{"a"}, SetupRows: 1}
	w := func(v int64, out traffic.Outcome, call, ret int) traffic.Op {
		o := op(traffic.FreeInsert, "a", v, out, call, ret)
		if out == traffic.OK {
			o.Rows = 1
		}
		return o
	}
	ok, limited := traffic.OK, traffic.Limited
	const bound = 100 * time.Millisecond
	// Set-up 1 row, then 3 acknowledged: over (4 > 3) at 40 ms; deadline 140 ms.
	over := []traffic.Op{w(1, ok, 0, 10), w(2, ok, 10, 20), w(3, ok, 30, 40)}
	good := append(append([]traffic.Op{}, over...), w(4, ok, 50, 60), w(5, limited, 100, 110), w(6, limited, 150, 160))
	r, tl := LimitEnforced(good, acct, nil, nil, bound)
	assert.True(t, r.OK(), "%s", r)
	assert.Equal(t, 40*time.Millisecond, tl.Over)
	assert.Equal(t, 140*time.Millisecond, tl.Deadline)
	assert.Equal(t, 110*time.Millisecond, tl.FirstRefusal)

	early := append([]traffic.Op{w(1, ok, 0, 10), w(2, limited, 10, 20)}, w(3, ok, 30, 40), w(4, ok, 40, 50), w(5, limited, 200, 210))
	r, _ = LimitEnforced(early, acct, nil, nil, bound)
	assert.Len(t, r.Violations, 1, "refused with at most 2 rows of a limit of 3: %s", r)

	unknownCounts := []traffic.Op{w(1, ok, 0, 10), w(2, traffic.Unknown, 10, 20), w(3, ok, 20, 30), w(4, limited, 30, 40), w(5, ok, 40, 50), w(6, limited, 200, 210)}
	r, _ = LimitEnforced(unknownCounts, acct, nil, nil, bound)
	assert.True(t, r.OK(), "an unknown write may have written its row: the refusal at 4 rows is due: %s", r)

	late := append(append([]traffic.Op{}, over...), w(7, ok, 150, 160))
	r, _ = LimitEnforced(late, acct, nil, nil, bound)
	assert.Len(t, r.Violations, 1, "acknowledged past the deadline: %s", r)

	fault := []Window{{Name: "kill", From: 100 * time.Millisecond, To: 300 * time.Millisecond}}
	r, tl = LimitEnforced(late, acct, nil, fault, bound)
	assert.Equal(t, 400*time.Millisecond, tl.Deadline, "a fault after going over moves the deadline past its heal")
	assert.Len(t, r.Violations, 1, "and then nothing was called past the deadline: %s", r)

	crash := map[string][]Window{"a": {{From: 35 * time.Millisecond, To: 45 * time.Millisecond}}}
	r, _ = LimitEnforced(late, acct, crash, nil, bound)
	assert.Len(t, r.Violations, 1, "a write in a crash's loss window does not count: never certainly over: %s", r)
	// The limiter saw that write all the same and refused the next: the
	// refusal (due: at most 4 rows) marks the account over.
	refusedFirst := append(append([]traffic.Op{}, over...), w(8, limited, 50, 60), w(9, limited, 200, 210))
	r, tl = LimitEnforced(refusedFirst, acct, crash, nil, bound)
	assert.True(t, r.OK(), "%s", r)
	assert.True(t, tl.ByRefusal)
	assert.Equal(t, 160*time.Millisecond, tl.Deadline)
	r, _ = LimitEnforced(append(refusedFirst, w(10, ok, 170, 180)), acct, crash, nil, bound)
	assert.Len(t, r.Violations, 1, "acknowledged past the refusal's deadline: %s", r)

	r, _ = LimitEnforced(over, acct, nil, nil, bound)
	assert.Len(t, r.Violations, 1, "no write past the deadline: nothing checked is a failure: %s", r)

	rows := map[string]map[int64]bool{"a": {1: true, 2: true, 3: true, 4: true}}
	assert.True(t, LimitedRowsKept(good, rows).OK())
	assert.Len(t, LimitedRowsKept(good, map[string]map[int64]bool{"a": {1: true, 2: true, 3: true}}).Violations, 1, "an acknowledged write lost")
	assert.Len(t, LimitedRowsKept(good, map[string]map[int64]bool{"a": {1: true, 2: true, 3: true, 4: true, 5: true}}).Violations, 1, "a refused write applied")
	assert.Len(t, LimitedRowsKept(good, map[string]map[int64]bool{"a": {1: true, 2: true, 3: true, 4: true, 99: true}}).Violations, 1, "a value nobody wrote")
}
