package validate

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/shoaldb/shoal/test/robustness/traffic"
)

func export(db string, out traffic.Outcome, call, from, ret int, vals ...int64) traffic.Op {
	o := op(traffic.Export, db, 0, out, call, ret)
	o.From, o.Values = time.Duration(from)*time.Millisecond, vals
	return o
}

// Each case is a history ExportsComplete must pass or fail.
func TestExportsComplete(t *testing.T) {
	ok, unknown := traffic.OK, traffic.Unknown
	inserts := []traffic.Op{
		op(traffic.Insert, "a", 1, ok, 0, 10),
		op(traffic.Insert, "a", 2, unknown, 0, 10),
		op(traffic.Insert, "a", 3, traffic.Refused, 0, 10),
		op(traffic.Insert, "a", 4, ok, 20, 30), // acknowledged after the download was asked: may be missing
		op(traffic.Insert, "a", 5, ok, 200, 210),
	}
	malformed := export("a", ok, 50, 60, 70, 1)
	malformed.Malformed = "200 dump of 40 bytes cut short (no final newline)"
	notD1 := export("a", unknown, 50, 0, 70)
	notD1.Malformed = "status 502 without the v4 envelope: Bad Gateway"
	for name, tc := range map[string]struct {
		ops        []traffic.Op
		violations int
	}{
		"every acknowledged row":                {append(inserts, export("a", ok, 15, 25, 40, 1)), 0},
		"an unknown insert may be there":        {append(inserts, export("a", ok, 15, 25, 40, 1, 2, 4)), 0},
		"an acknowledged insert missing":        {append(inserts, export("a", ok, 15, 35, 40, 2, 4)), 1},
		"acknowledged before the call missing":  {append(inserts, export("a", ok, 15, 0, 40)), 1},
		"a refused insert in the dump":          {append(inserts, export("a", ok, 15, 25, 40, 1, 3)), 1},
		"a value nobody wrote":                  {append(inserts, export("a", ok, 15, 25, 40, 1, 99)), 1},
		"a value written after the export":      {append(inserts, export("a", ok, 15, 25, 40, 1, 5)), 1},
		"another database's value":              {append(inserts, op(traffic.Insert, "b", 7, ok, 0, 1), export("a", ok, 15, 25, 40, 1, 7)), 1},
		"a failed export lacks rows, no matter": {append(inserts, export("a", unknown, 15, 25, 40)), 0},
		"a truncated dump presented as success": {append(inserts, malformed), 1},
		"an error without the envelope":         {append(inserts, notD1), 1},
	} {
		t.Run(name, func(t *testing.T) {
			res := ExportsComplete(tc.ops)
			assert.Len(t, res.Violations, tc.violations, "%s", res)
		})
	}
}

// Each case is an import and the read after it that ImportsAtomic must
// pass or fail.
func TestImportsAtomic(t *testing.T) {
	imp := func(out traffic.Outcome, vals ...int64) traffic.Op {
		o := op(traffic.Import, "i", 0, out, 0, 10)
		o.Values = vals
		return o
	}
	read := func(found bool, vals ...int64) traffic.Op {
		o := op(traffic.ImportRead, "i", 0, traffic.OK, 20, 30)
		o.Found, o.Values = found, vals
		return o
	}
	pending := func(vals ...int64) traffic.Op {
		o := imp(traffic.OK, vals...)
		o.Answer = traffic.ImportArchivePending + "; poll: 200/0 {…}"
		return o
	}
	malformed := imp(traffic.Unknown, 1, 2)
	malformed.Malformed = "status 500 without the v4 envelope: internal error"
	for name, tc := range map[string]struct {
		ops        []traffic.Op
		violations int
	}{
		"complete, every row":                  {[]traffic.Op{imp(traffic.OK, 1, 2, 3), read(true, 3, 1, 2)}, 0},
		"complete, a row missing":              {[]traffic.Op{imp(traffic.OK, 1, 2, 3), read(true, 1, 2)}, 1},
		"complete, an extra row":               {[]traffic.Op{imp(traffic.OK, 1, 2), read(true, 1, 2, 9)}, 1},
		"complete, no table":                   {[]traffic.Op{imp(traffic.OK, 1, 2), read(false)}, 1},
		"failed, no table":                     {[]traffic.Op{imp(traffic.Refused, 1, 2), read(false)}, 0},
		"failed, a partial table":              {[]traffic.Op{imp(traffic.Refused, 1, 2), read(true, 1)}, 1},
		"failed, an empty table":               {[]traffic.Op{imp(traffic.Failed, 1, 2), read(true)}, 1},
		"failed, yet every row":                {[]traffic.Op{imp(traffic.Refused, 1, 2), read(true, 1, 2)}, 1},
		"unknown, nothing":                     {[]traffic.Op{imp(traffic.Unknown, 1, 2), read(false)}, 0},
		"unknown, everything":                  {[]traffic.Op{imp(traffic.Unknown, 1, 2), read(true, 1, 2)}, 0},
		"unknown, partial":                     {[]traffic.Op{imp(traffic.Unknown, 1, 2), read(true, 2)}, 1},
		"complete, archive pending, every row": {[]traffic.Op{pending(1, 2), read(true, 2, 1)}, 0},
		"complete, archive pending, lost":      {[]traffic.Op{pending(1, 2), read(false)}, 0},
		"complete, archive pending, partial":   {[]traffic.Op{pending(1, 2), read(true, 1)}, 1},
		"a read that failed says nothing":      {[]traffic.Op{imp(traffic.OK, 1, 2), op(traffic.ImportRead, "i", 0, traffic.Unknown, 20, 30)}, 0},
		"an error without the envelope":        {[]traffic.Op{malformed, read(false)}, 1},
	} {
		t.Run(name, func(t *testing.T) {
			res := ImportsAtomic(tc.ops)
			assert.Len(t, res.Violations, tc.violations, "%s", res)
		})
	}
}

func TestInsightsAnswered(t *testing.T) {
	good := []traffic.Op{op(traffic.Insights, "a", 3, traffic.OK, 0, 1), op(traffic.Insights, "a", 0, traffic.Unknown, 2, 3)}
	assert.True(t, InsightsAnswered(good).OK(), "shapes, or a 503 in the envelope")
	bad := op(traffic.Insights, "a", 0, traffic.Unknown, 4, 5)
	bad.Malformed = "status 502 without the v4 envelope: <html>"
	res := InsightsAnswered(append(good, bad))
	assert.Len(t, res.Violations, 1, "%s", res)
}

func TestDumpsAvailableDuring(t *testing.T) {
	ok := traffic.OK
	w := []Window{{Name: "cut", From: 100 * time.Millisecond, To: 200 * time.Millisecond}}
	ops := []traffic.Op{op(traffic.Create, "a", 0, ok, 0, 10), op(traffic.Create, "late", 0, ok, 110, 120),
		op(traffic.Export, "a", 0, ok, 150, 160), op(traffic.Insights, "a", 0, ok, 150, 160),
		op(traffic.Export, "late", 0, traffic.Unknown, 150, 160), // created inside the window: not counted
		op(traffic.Insert, "a", 1, traffic.Unknown, 150, 160)}    // a query: QueriesAvailable's
	res := DumpsAvailableDuring("cut", ops, w)
	assert.True(t, res.OK(), "%s", res)
	assert.Equal(t, 2, res.Checked)
	res = DumpsAvailableDuring("cut", append(ops, op(traffic.Import, "a", 0, traffic.Unknown, 150, 190)), w)
	assert.Len(t, res.Violations, 1, "%s", res)
}
