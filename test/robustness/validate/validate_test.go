package validate

import (
	"fmt"
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
		// Unknown writes no read ever returns are left out of the model
		// (RegisterOperations): the verdicts must not change.
		"unread unknown writes, acknowledged one lost": {[]traffic.Op{write("a", 1, ok, 0, 10), write("a", 7, unknown, 5, 15), write("a", 8, unknown, 12, 18), read("a", 0, 20, 30)}, false},
		"unread unknown write between ack and read":    {[]traffic.Op{write("a", 1, ok, 0, 10), write("a", 7, unknown, 11, 12), read("a", 1, 20, 30)}, true},
		"read unknown write kept, then flips":          {[]traffic.Op{write("a", 7, unknown, 0, 10), write("a", 9, unknown, 0, 10), read("a", 7, 20, 30), read("a", 0, 40, 50)}, false},
	} {
		res, _ := Linearizable("register", model.Register, RegisterOperations(tc.ops), 10*time.Second)
		assert.Equal(t, tc.want, res.OK(), "%s: %s", name, res)
	}
}

// Time travel in the register model: a restore sets the register to its
// value when the bookmark was taken, entirely or (answer lost) perhaps not
// at all, never to anything else.
func TestRegisterRestoreLinearizability(t *testing.T) {
	ok, unknown := traffic.OK, traffic.Unknown
	read := func(v int64, call, ret int) traffic.Op { return op(traffic.RegRead, "a", v, ok, call, ret) }
	write := func(v int64, call, ret int) traffic.Op { return op(traffic.RegWrite, "a", v, ok, call, ret) }
	bookmark := func(b string, call, ret int) traffic.Op {
		o := op(traffic.Bookmark, "a", 0, ok, call, ret)
		o.Bookmark = b
		return o
	}
	restore := func(to, prev, after string, out traffic.Outcome, call, ret int) traffic.Op {
		o := op(traffic.Restore, "a", 0, out, call, ret)
		o.Bookmark, o.Prev, o.After = to, prev, after
		return o
	}
	base := []traffic.Op{write(1, 0, 10), bookmark("b1", 20, 30), write(2, 40, 50)}
	with := func(ops ...traffic.Op) []traffic.Op { return append(append([]traffic.Op(nil), base...), ops...) }
	for name, tc := range map[string]struct {
		ops  []traffic.Op
		want bool
	}{
		"restore brings the bookmark's value back":   {with(restore("b1", "p", "n", ok, 60, 70), read(1, 80, 90)), true},
		"restore acknowledged, value not restored":   {with(restore("b1", "p", "n", ok, 60, 70), read(2, 80, 90)), false},
		"restore to the previous bookmark undoes":    {with(restore("b1", "p", "n", ok, 60, 70), read(1, 80, 90), restore("p", "q", "m", ok, 100, 110), read(2, 120, 130)), true},
		"new bookmark names the restored value":      {with(restore("b1", "p", "n", ok, 60, 70), write(3, 80, 90), restore("n", "q", "m", ok, 100, 110), read(1, 120, 130)), true},
		"restore of unknown outcome: done":           {with(restore("b1", "", "", unknown, 60, 70), read(1, 80, 90)), true},
		"restore of unknown outcome: not done":       {with(restore("b1", "", "", unknown, 60, 70), read(2, 80, 90)), true},
		"restore of unknown outcome: half, flipping": {with(restore("b1", "", "", unknown, 60, 70), read(1, 80, 90), read(2, 100, 110)), false},
		"restore to a value never at the bookmark":   {with(restore("b1", "p", "n", ok, 60, 70), read(0, 80, 90)), false},
		"one bookmark, two values":                   {with(bookmark("b1", 60, 70), restore("b1", "p", "n", ok, 80, 90)), false},
		"restore to a bookmark not taken yet":        {[]traffic.Op{write(1, 0, 10), restore("b9", "p", "n", ok, 20, 30), bookmark("b9", 40, 50)}, false},
	} {
		res, _ := Linearizable("register", model.Register, RegisterOperations(tc.ops), 10*time.Second)
		assert.Equal(t, tc.want, res.OK(), "%s: %s", name, res)
	}
	refused := with(restore("b1", "", "", traffic.Refused, 60, 70))
	assert.Len(t, RestoresAnswered(refused, nil).Violations, 1, "a restore to a bookmark the API gave, refused")
	assert.True(t, RestoresAnswered(with(restore("b1", "", "", unknown, 60, 70)), nil).OK(), "a restore that failed retryably")
}

func TestExistenceLinearizability(t *testing.T) {
	ok := traffic.OK
	list := func(call, ret int, dbs ...string) traffic.Op {
		o := op(traffic.List, "", 0, ok, call, ret)
		o.Listed = dbs
		return o
	}
	failedList := func(call, ret int) traffic.Op { return op(traffic.List, "", 0, traffic.Unknown, call, ret) }
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
		"listed after create, not after delete": {[]traffic.Op{create, list(20, 30, "a"), del, list(60, 70)}, true},
		"list missing an acknowledged create":   {[]traffic.Op{create, list(20, 30)}, false},
		"list showing a deleted database":       {[]traffic.Op{create, del, list(60, 70, "a")}, false},
		"list concurrent with the create":       {[]traffic.Op{list(0, 5), create, list(5, 15, "a")}, true},
		"list then get disagree in order":       {[]traffic.Op{create, del, get(false, 60, 70), list(80, 90, "a")}, false},
		"list shows one not yet created":        {[]traffic.Op{list(0, 1, "a"), op(traffic.Create, "a", 0, ok, 2, 10)}, false},
		"failed list observes nothing":          {[]traffic.Op{create, failedList(20, 30)}, true},
	} {
		res, _ := Linearizable("existence", model.Existence, ExistenceOperations(tc.ops), 10*time.Second)
		assert.Equal(t, tc.want, res.OK(), "%s: %s", name, res)
	}
}

func TestQueriesAvailableDuringAStoreOutage(t *testing.T) {
	ok, unknown := traffic.OK, traffic.Unknown
	w := []Window{{Name: "store down", From: 100 * time.Millisecond, To: 200 * time.Millisecond}}
	created := op(traffic.Create, "a", 0, ok, 0, 10)
	restore := op(traffic.Restore, "a", 0, unknown, 140, 180)
	failed := op(traffic.RegWrite, "a", 1, unknown, 120, 130)
	assert.Len(t, QueriesAvailable("the store is down", []traffic.Op{created, failed}, w).Violations, 1, "a query failed during the outage")
	duringRestore := op(traffic.RegWrite, "a", 1, unknown, 150, 160)
	res := QueriesAvailable("the store is down", []traffic.Op{created, restore, duringRestore, op(traffic.RegRead, "a", 0, ok, 150, 160)}, w)
	assert.True(t, res.OK(), "a query that failed while its database was being restored: %s", res)
	assert.Equal(t, 1, res.Checked, "the query that succeeded is still counted")
}

func TestArchiveLagAlarm(t *testing.T) {
	ok := traffic.OK
	w := Window{Name: "store down", From: time.Second, To: 5 * time.Second}
	early := op(traffic.Insert, "a", 1, ok, 1100, 1200) // on h1, ≥ AlarmLag before the heal
	late := op(traffic.Insert, "b", 2, ok, 4800, 4900)  // on h2, too late to raise it
	dbHost := map[string]string{"a": "h1", "b": "h2"}
	outage := func(h1, h2 HostLag) []StoreOutage {
		return []StoreOutage{{Window: w, AlarmLag: 2 * time.Second, Hosts: map[string]*HostLag{"h1": &h1, "h2": &h2}}}
	}
	ops := []traffic.Op{early, late}
	assert.True(t, ArchiveLagAlarm(ops, outage(HostLag{Alarm: true, Recovered: true}, HostLag{Recovered: true}), dbHost).OK())
	assert.Len(t, ArchiveLagAlarm(ops, outage(HostLag{Recovered: true}, HostLag{Recovered: true}), dbHost).Violations, 1, "h1 wrote early in the outage: its alarm must rise")
	assert.Len(t, ArchiveLagAlarm(ops, outage(HostLag{Alarm: true}, HostLag{Recovered: true}), dbHost).Violations, 1, "h1's lag never recovered")
}

// A write of unknown outcome whose host was killed before its answer came
// took effect before the host restarted, or never: bounded there, a value
// that appears only after the restart is a violation.
func TestBoundByHostKills(t *testing.T) {
	ok, unknown := traffic.OK, traffic.Unknown
	kills := map[string][]Window{"h1": {{From: 200 * time.Millisecond, To: 300 * time.Millisecond}}}
	dbHost := map[string]string{"a": "h1"}
	lostThenSeen := []traffic.Op{
		op(traffic.RegWrite, "a", 5, unknown, 100, 250),
		op(traffic.RegRead, "a", 0, ok, 350, 360),
		op(traffic.RegRead, "a", 5, ok, 400, 410),
	}
	res, _ := Linearizable("register", model.Register, RegisterOperations(lostThenSeen), 10*time.Second)
	assert.True(t, res.OK(), "unbounded, the write may land late: %s", res)
	bounded, n := BoundByHostKills(lostThenSeen, dbHost, kills)
	assert.Equal(t, 1, n)
	res, _ = Linearizable("register", model.Register, RegisterOperations(bounded), 10*time.Second)
	assert.False(t, res.OK(), "its host died and restarted before the value appeared")

	answeredLate := op(traffic.RegWrite, "a", 5, unknown, 100, 350) // answered after the restart: may have reached the new process
	_, n = BoundByHostKills([]traffic.Op{answeredLate}, dbHost, kills)
	assert.Zero(t, n)
	whileDown := op(traffic.RegWrite, "a", 5, unknown, 220, 230) // called while its host was down
	b, n := BoundByHostKills([]traffic.Op{whileDown}, dbHost, kills)
	assert.Equal(t, 1, n)
	assert.Equal(t, 300*time.Millisecond, b[0].EffectBy)
	afterRestart := op(traffic.RegWrite, "a", 5, unknown, 310, 320)
	_, n = BoundByHostKills([]traffic.Op{afterRestart}, dbHost, kills)
	assert.Zero(t, n, "no kill after it")
}

// A bookmark is forgotten only by the restore certainly last to use it.
func TestRestoreForgetsOnlyAfterTheLastUse(t *testing.T) {
	ok := traffic.OK
	w := func(v int64, c, r int) traffic.Op { return op(traffic.RegWrite, "a", v, ok, c, r) }
	rd := func(v int64, c, r int) traffic.Op { return op(traffic.RegRead, "a", v, ok, c, r) }
	bm := func(b string, c, r int) traffic.Op {
		o := op(traffic.Bookmark, "a", 0, ok, c, r)
		o.Bookmark = b
		return o
	}
	rs := func(b string, c, r int) traffic.Op {
		o := op(traffic.Restore, "a", 0, ok, c, r)
		o.Bookmark, o.Prev, o.After = b, fmt.Sprintf("p%d", c), fmt.Sprintf("n%d", c)
		return o
	}
	// Two restores to b1, the second concurrent with the first's answer:
	// neither may forget b1 before the other used it.
	h := []traffic.Op{w(1, 0, 10), bm("b1", 20, 30), w(2, 40, 50), rs("b1", 60, 80), w(3, 85, 90), rs("b1", 70, 100), rd(1, 110, 120)}
	ops := RegisterOperations(h)
	forgets := 0
	for _, o := range ops {
		if in := o.Input.(model.RegisterInput); in.Op == model.RegRestore && in.Forget {
			forgets++
		}
	}
	assert.Zero(t, forgets, "concurrent restores to one bookmark: neither is certainly last")
	res, _ := Linearizable("register", model.Register, ops, 10*time.Second)
	assert.True(t, res.OK(), "%s", res)
	// Sequential: the second forgets it, and the history still checks.
	h = []traffic.Op{w(1, 0, 10), bm("b1", 20, 30), w(2, 40, 50), rs("b1", 60, 70), rd(1, 75, 78), w(3, 80, 90), rs("b1", 100, 110), rd(1, 120, 130)}
	ops = RegisterOperations(h)
	res, _ = Linearizable("register", model.Register, ops, 10*time.Second)
	assert.True(t, res.OK(), "%s", res)
	assert.True(t, ops[len(ops)-2].Input.(model.RegisterInput).Forget)
}

// A write on an archived host acknowledged inside a window when the store
// could take nothing is a violation; one refused there, one on a default
// host, and one that straddles the window's edge are not.
func TestArchivedWritesHeld(t *testing.T) {
	w := []Window{{Name: "object-store-down", From: 100 * time.Millisecond, To: 500 * time.Millisecond}}
	archived := map[string]bool{"a": true}
	ops := []traffic.Op{
		op(traffic.RegWrite, "a", 1, traffic.OK, 200, 300),      // violation
		op(traffic.RegWrite, "a", 2, traffic.Unknown, 200, 300), // held: fine
		op(traffic.Insert, "b", 3, traffic.OK, 200, 300),        // default host
		op(traffic.Insert, "a", 4, traffic.OK, 50, 150),         // called before the outage
		op(traffic.Insert, "a", 5, traffic.OK, 400, 600),        // answered after the heal
		op(traffic.RegRead, "a", 6, traffic.OK, 200, 300),       // a read
	}
	r := ArchivedWritesHeld(ops, archived, w)
	assert.Equal(t, 2, r.Checked)
	assert.Len(t, r.Violations, 1)
	assert.Contains(t, r.Violations[0], "reg-write of 1")
}

// A list must show one instant across databases: showing a database
// created late while leaving out one created (and never deleted) earlier
// is a violation even though each database alone is fine with the list's
// window; so is showing one deleted (acknowledged) before another listed
// one was created. Lists that fit an instant, and lists after `until`, are
// not.
func TestListsOneInstant(t *testing.T) {
	list := func(id int, call, ret int, dbs ...string) traffic.Op {
		c, r := at(call, ret)
		return traffic.Op{ID: id, Kind: traffic.List, Outcome: traffic.OK, Call: c, Return: r, Listed: dbs}
	}
	ops := []traffic.Op{
		op(traffic.Create, "a", 0, traffic.OK, 10, 20),
		op(traffic.Create, "b", 0, traffic.OK, 30, 40),
		op(traffic.Create, "c", 0, traffic.OK, 5, 8),
		op(traffic.Delete, "c", 0, traffic.OK, 12, 14),
		list(1, 0, 100, "b"),      // b created (called 30), a left out (acked 20, never deleted): violation
		list(2, 0, 100, "a", "b"), // fine
		list(3, 0, 100, "c", "b"), // c deleted (acked 14) before b's create was called (30): violation
		list(4, 0, 100, "a"),      // fine: an instant in [10, 30)
		list(5, 0, 15),            // fine: an instant before a's create took effect (acked at 20)
		list(6, 200, 300, "b"),    // after until: not checked
	}
	r := ListsOneInstant(ops, 150*time.Millisecond)
	assert.Equal(t, 5, r.Checked)
	if !assert.Len(t, r.Violations, 2, "%v", r.Violations) {
		return
	}
	assert.Contains(t, r.Violations[0], "list op 1")
	assert.Contains(t, r.Violations[0], "leaves out a")
	assert.Contains(t, r.Violations[1], "list op 3")
	assert.Contains(t, r.Violations[1], "delete was acknowledged")
}

// TestUnreadUnknownWritesLeftOut: a write of unknown outcome enters the
// model only if some read returned its value; many unread ones (seed
// 1796281627258977640: 20, porcupine passed 6 GiB) no longer multiply the
// orders to try.
func TestUnreadUnknownWritesLeftOut(t *testing.T) {
	ops := []traffic.Op{op(traffic.RegWrite, "a", 1, traffic.OK, 0, 10)}
	for v := int64(100); v < 140; v++ {
		ops = append(ops, op(traffic.RegWrite, "a", v, traffic.Unknown, 5, 15))
	}
	ops = append(ops, op(traffic.RegWrite, "a", 140, traffic.Unknown, 5, 15), op(traffic.RegRead, "a", 140, traffic.OK, 20, 30))
	reg := RegisterOperations(ops)
	assert.Len(t, reg, 3, "the acknowledged write, the unknown one a read returned, the read")
	res, _ := Linearizable("register", model.Register, reg, 10*time.Second)
	assert.True(t, res.OK(), "%s", res)
}
