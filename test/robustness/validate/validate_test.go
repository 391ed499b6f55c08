package validate

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/shoaldb/shoal/test/robustness/model"
	"github.com/shoaldb/shoal/test/robustness/traffic"
)

func at(call, ret int) (time.Duration, time.Duration) {
	return time.Duration(call) * time.Millisecond, time.Duration(ret) * time.Millisecond
}

func op(kind traffic.Kind, db string, value int64, out traffic.Outcome, call, ret int) traffic.Op {
	c, r := at(call, ret)
	return traffic.Op{Kind: kind, DB: db, Value: value, Outcome: out, Call: c, Return: r, Client: call % 3}
}

// The checkers must fail on the violations they exist for: each case is a
// history that loses something or is not linearizable.
func TestCheckersCatchViolations(t *testing.T) {
	ok, unknown := traffic.OK, traffic.Unknown
	created := []traffic.Op{op(traffic.Create, "a", 0, ok, 0, 1), op(traffic.Create, "b", 0, ok, 0, 1), op(traffic.Delete, "b", 0, ok, 2, 3)}
	good := Final{Listed: map[string]bool{"a": true}, EdgeGet: map[string]traffic.Outcome{"a": ok}}
	assert.True(t, AckedCreatesPresent(created, good).OK())
	assert.True(t, AckedDeletesGone(created, good).OK())
	lost := Final{Listed: map[string]bool{"b": true}, EdgeGet: map[string]traffic.Outcome{"a": traffic.NotFound}}
	assert.Len(t, AckedCreatesPresent(created, lost).Violations, 1, "an acknowledged database missing from the list and edge")
	assert.Len(t, AckedDeletesGone(created, lost).Violations, 1, "a deleted database still listed")

	inserts := []traffic.Op{op(traffic.Insert, "a", 1, ok, 0, 1), op(traffic.Insert, "a", 2, unknown, 0, 1), op(traffic.Insert, "a", 3, ok, 1, 2)}
	assert.True(t, AckedRowsReadable(inserts, Final{Rows: map[string]map[int64]bool{"a": {1: true, 2: true, 3: true}}}).OK(), "an unknown write may have happened")
	assert.True(t, AckedRowsReadable(inserts, Final{Rows: map[string]map[int64]bool{"a": {1: true, 3: true}}}).OK(), "an unknown write may not have happened")
	assert.Len(t, AckedRowsReadable(inserts, Final{Rows: map[string]map[int64]bool{"a": {1: true}}}).Violations, 1, "an acknowledged row lost")
	assert.Len(t, AckedRowsReadable(inserts, Final{Rows: map[string]map[int64]bool{"a": {1: true, 3: true, 9: true}}}).Violations, 1, "a row nobody wrote")
}

func TestRegisterLinearizability(t *testing.T) {
	ok, unknown := traffic.OK, traffic.Unknown
	read := func(db string, v int64, call, ret int) traffic.Op { return op(traffic.RegRead, db, v, ok, call, ret) }
	write := func(db string, v int64, out traffic.Outcome, call, ret int) traffic.Op {
		return op(traffic.RegWrite, db, v, out, call, ret)
	}
	for name, tc := range map[string]struct {
		ops  []traffic.Op
		want bool
	}{
		"read after write":              {[]traffic.Op{write("a", 1, ok, 0, 10), read("a", 1, 20, 30)}, true},
		"stale read after ack":          {[]traffic.Op{write("a", 1, ok, 0, 10), read("a", 0, 20, 30)}, false},
		"lost acknowledged write":       {[]traffic.Op{write("a", 1, ok, 0, 10), write("a", 2, ok, 20, 30), read("a", 1, 40, 50)}, false},
		"unknown write seen late":       {[]traffic.Op{write("a", 1, unknown, 0, 10), read("a", 0, 20, 30), read("a", 1, 40, 50)}, true},
		"unknown write, value flips":    {[]traffic.Op{write("a", 1, unknown, 0, 10), read("a", 1, 20, 30), read("a", 0, 40, 50)}, false},
		"databases are independent":     {[]traffic.Op{write("a", 1, ok, 0, 10), read("b", 0, 20, 30), read("a", 1, 20, 30)}, true},
		"concurrent reads either order": {[]traffic.Op{write("a", 1, ok, 0, 50), read("a", 0, 10, 20), read("a", 1, 30, 40)}, true},
	} {
		res, _ := Linearizable("register", model.Register, RegisterOperations(tc.ops), 10*time.Second)
		assert.Equal(t, tc.want, res.OK(), "%s: %s", name, res)
	}
}

func TestExistenceLinearizability(t *testing.T) {
	ok := traffic.OK
	get := func(found bool, call, ret int) traffic.Op {
		o := op(traffic.LinGet, "a", 0, ok, call, ret)
		o.Found = found
		return o
	}
	create := op(traffic.Create, "a", 0, ok, 0, 10)
	del := op(traffic.Delete, "a", 0, ok, 40, 50)
	for name, tc := range map[string]struct {
		ops  []traffic.Op
		want bool
	}{
		"found after create, gone after delete": {[]traffic.Op{create, get(true, 20, 30), del, get(false, 60, 70)}, true},
		"acknowledged create not found":         {[]traffic.Op{create, get(false, 20, 30)}, false},
		"deleted database found again":          {[]traffic.Op{create, del, get(false, 60, 70), get(true, 80, 90)}, false},
		"get concurrent with delete":            {[]traffic.Op{create, get(true, 45, 55), del}, true},
	} {
		res, _ := Linearizable("existence", model.Existence, ExistenceOperations(tc.ops), 10*time.Second)
		assert.Equal(t, tc.want, res.OK(), "%s: %s", name, res)
	}
}
