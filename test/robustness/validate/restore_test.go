package validate

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/shoaldb/shoal/test/robustness/model"
	"github.com/shoaldb/shoal/test/robustness/traffic"
)

// A catalog restore at [100, 110], from a backup taken at [20, 30].
var rewind = CatalogRestore{BackupCall: 20 * time.Millisecond, BackupReturn: 30 * time.Millisecond,
	RestoreCall: 100 * time.Millisecond, RestoreReturn: 110 * time.Millisecond}

func TestRestoreSets(t *testing.T) {
	ok := traffic.OK
	ops := []traffic.Op{
		op(traffic.Create, "old", 0, ok, 0, 10),     // in the backup
		op(traffic.Create, "new", 0, ok, 40, 50),    // after it: dropped
		op(traffic.Create, "edge", 0, ok, 15, 25),   // across the backup call
		op(traffic.Create, "late", 0, ok, 120, 130), // after the restore
		op(traffic.Create, "gone", 0, ok, 0, 10),
		op(traffic.Delete, "gone", 0, ok, 60, 70), // deleted after the backup: back
		op(traffic.Create, "dead", 0, ok, 0, 10),
		op(traffic.Delete, "dead", 0, ok, 11, 12), // deleted before it
		op(traffic.Create, "flash", 0, ok, 21, 23),
		op(traffic.Delete, "flash", 0, ok, 24, 26), // both inside the backup call: may straddle its point
		op(traffic.Create, "after", 0, ok, 31, 33),
		op(traffic.Delete, "after", 0, ok, 34, 36), // both after the backup: gone with the restore
	}
	s := rewind.Sets(ops)
	assert.Equal(t, map[string]bool{"new": true, "after": true}, s.Lost)
	assert.Equal(t, map[string]bool{"new": true, "edge": true, "flash": true, "after": true}, s.LostMaybe)
	assert.Equal(t, map[string]bool{"gone": true}, s.Resurrected)
	assert.Equal(t, map[string]bool{"gone": true, "flash": true}, s.ResurrectedMaybe)
	assert.Equal(t, map[string]bool{"new": true, "edge": true, "gone": true, "flash": true, "after": true}, s.Excluded())
}

// Across the restore the catalog's history is not linearizable (a
// database created after the backup vanishes; one deleted after it comes
// back) — the split history is, while violations on either side are still
// found.
func TestExistenceSplitAtRestore(t *testing.T) {
	ok := traffic.OK
	get := func(db string, found bool, call, ret int) traffic.Op {
		o := op(traffic.LinGet, db, 0, ok, call, ret)
		o.Found = found
		return o
	}
	rewound := []traffic.Op{
		op(traffic.Create, "new", 0, ok, 40, 50), get("new", true, 60, 70), get("new", false, 120, 130),
		op(traffic.Create, "gone", 0, ok, 0, 10), op(traffic.Delete, "gone", 0, ok, 60, 70), get("gone", false, 80, 90), get("gone", true, 120, 130),
	}
	whole, _ := Linearizable("existence", model.Existence, ExistenceOperations(rewound), 10*time.Second)
	assert.False(t, whole.OK(), "one history across the rewind is not linearizable")
	check := func(ops []traffic.Op) bool {
		b, a := ExistenceOperationsSplit(ops, rewind)
		rb, _ := Linearizable("before", model.Existence, b, 10*time.Second)
		ra, _ := Linearizable("after", model.ExistenceResumed, a, 10*time.Second)
		return rb.OK() && ra.OK()
	}
	assert.True(t, check(rewound), "each side of the restore is")
	assert.False(t, check(append(rewound, get("new", true, 140, 150))), "after: gone, then found again without a create")
	assert.False(t, check(append(rewound, op(traffic.Delete, "gone", 0, ok, 140, 150), get("gone", true, 160, 170))), "after: deleted, then found")
	assert.False(t, check(append(rewound, get("new", false, 75, 85))), "before: an acknowledged create not found")
	assert.True(t, check(append(rewound, op(traffic.Delete, "new", 0, traffic.Unknown, 95, 105), get("new", false, 140, 150))),
		"a delete across the restore may land on either side")
}

func TestRestoreChecksCatchViolations(t *testing.T) {
	ok := traffic.OK
	ops := []traffic.Op{
		op(traffic.Create, "new", 0, ok, 40, 50), op(traffic.Insert, "new", 7, ok, 55, 56),
		op(traffic.Create, "gone", 0, ok, 0, 10), op(traffic.Delete, "gone", 0, ok, 60, 70),
	}
	s := rewind.Sets(ops)
	live := []Object{{Host: "h1", ObjectID: "o-new", DatabaseUUID: "new", State: "active"}, {Host: "h2", ObjectID: "o-gone", DatabaseUUID: "gone", State: "deleted"}}
	values := func(v ...int64) func(Object) (map[int64]bool, error) {
		return func(Object) (map[int64]bool, error) {
			m := map[int64]bool{}
			for _, x := range v {
				m[x] = true
			}
			return m, nil
		}
	}
	unknown := map[string]CatalogRow{"new": {}}
	assert.True(t, LostKept(ops, s, live, unknown, nil, values(7)).OK())
	assert.Len(t, LostKept(ops, s, live, unknown, nil, values()).Violations, 1, "an acknowledged row lost")
	killed := []Object{{Host: "h1", ObjectID: "o-new", DatabaseUUID: "new", State: "deleted"}}
	assert.Len(t, LostKept(ops, s, killed, unknown, nil, values(7)).Violations, 1, "the host deleted it on the restored catalog's word")
	assert.Len(t, LostKept(ops, s, live, map[string]CatalogRow{"new": {Found: true, Active: true, ObjectID: "o-new"}}, nil, values(7)).Violations, 1,
		"created after the backup, still in the catalog: no restore happened")
	assert.Len(t, LostKept(ops, s, live, unknown, nil, func(Object) (map[int64]bool, error) { return nil, errors.New("gone") }).Violations, 1)

	alarmed := HostAlarms{Host: "h1", Alarm: true, CLI: true, LostHeld: 3, Sample: []string{"new"}, Output: "… database=new …"}
	assert.True(t, LostAlarmed(s, live, []HostAlarms{alarmed, {Host: "h2"}}).OK())
	for name, h := range map[string]HostAlarms{
		"no alarm":          {Host: "h1", CLI: true, LostHeld: 3, Output: "new"},
		"not in the CLI":    {Host: "h1", Alarm: true, LostHeld: 3, Output: "new"},
		"no metric":         {Host: "h1", Alarm: true, CLI: true, Output: "new"},
		"not in the log":    {Host: "h1", Alarm: true, CLI: true, LostHeld: 3},
		"wrong sample":      {Host: "h1", Alarm: true, CLI: true, LostHeld: 3, Sample: []string{"other"}, Output: "new"},
		"status unreadable": {Host: "h1", StatusError: "refused"},
	} {
		assert.False(t, LostAlarmed(s, live, []HostAlarms{h}).OK(), name)
	}
	assert.False(t, LostAlarmed(s, live, []HostAlarms{alarmed, {Host: "h2", Alarm: true, Sample: []string{"old"}}}).OK(), "an alarm naming a database the restore did not drop")

	back := Final{Listed: map[string]bool{"gone": true}, Probe: map[string]string{"gone": "not-found"}}
	redone := map[string]Redelete{"gone": {Outcome: ok}}
	assert.True(t, ResurrectedStayDeleted(s, live, back, redone).OK())
	revived := append([]Object{}, live...)
	revived[1].State = "active"
	assert.False(t, ResurrectedStayDeleted(s, revived, back, redone).OK(), "a deleted object live again")
	assert.False(t, ResurrectedStayDeleted(s, live, Final{Listed: back.Listed, Probe: map[string]string{"gone": ""}}, redone).OK(), "answers queries again")
	assert.False(t, ResurrectedStayDeleted(s, live, back, nil).OK(), "not deleted a second time")
	assert.False(t, ResurrectedStayDeleted(s, live, back, map[string]Redelete{"gone": {Outcome: ok, FoundAfter: true}}).OK(), "still there after the second delete")
	assert.False(t, ResurrectedStayDeleted(s, live, Final{}, redone).OK(), "not back in the catalog: the restore did not restore")
}

// ResurrectedAlarmed holds each host to naming exactly the deleted
// databases the restored catalog lists again whose tombstone it holds.
func TestResurrectedAlarmed(t *testing.T) {
	s := RestoreSets{Resurrected: map[string]bool{"z1": true, "z2": true}, ResurrectedMaybe: map[string]bool{"z1": true, "z2": true, "z3": true}}
	objs := []Object{
		{Host: "h1", DatabaseUUID: "z1", State: "deleted"},
		{Host: "h2", DatabaseUUID: "z2", State: "deleted"},
		{Host: "h2", DatabaseUUID: "z3", State: "deleted"}, // across a call, not listed: not a zombie
		{Host: "h1", DatabaseUUID: "live", State: "active"},
		{Host: "h1", DatabaseUUID: "old", State: "deleted"},
	}
	f := Final{Listed: map[string]bool{"z1": true, "z2": true, "live": true}}
	good := func() []HostAlarms {
		return []HostAlarms{
			{Host: "h1", ResurrectedAlarm: true, ResurrectedCount: 1, ResurrectedSample: []string{"z1"}, ResurrectedList: []string{"z1"}, ResurrectedGauge: 1, ResurrectedCLI: true},
			{Host: "h2", ResurrectedAlarm: true, ResurrectedCount: 1, ResurrectedSample: []string{"z2"}, ResurrectedList: []string{"z2"}, ResurrectedGauge: 1, ResurrectedCLI: true},
		}
	}
	cli := []string{"z1", "z2"}
	assert.Empty(t, ResurrectedAlarmed(nil, s, objs, f, good(), cli).Violations)

	missing := good()
	missing[1] = HostAlarms{Host: "h2"}
	assert.Len(t, ResurrectedAlarmed(nil, s, objs, f, missing, cli).Violations, 3, "not listed, no alarm, no CLI status")
	extra := good()
	extra[0].ResurrectedList = []string{"z1", "old"}
	extra[0].ResurrectedCount, extra[0].ResurrectedGauge = 2, 2
	assert.Len(t, ResurrectedAlarmed(nil, s, objs, f, extra, cli).Violations, 1, "names a database deleted before the backup")
	assert.Empty(t, ResurrectedAlarmed([]traffic.Op{op(traffic.Delete, "old", 0, traffic.Unknown, 60, 70)}, s, objs, f, extra, cli).Violations,
		"a delete of unknown outcome may have been after the backup")
	assert.Len(t, ResurrectedAlarmed(nil, s, objs, f, good(), []string{"z1"}).Violations, 1, "the CLI misses one")

	assert.Empty(t, ResurrectedAlarmCleared([]HostAlarms{{Host: "h1"}, {Host: "h2"}}).Violations)
	assert.Len(t, ResurrectedAlarmCleared(good()).Violations, 2)
}
