package validate

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// The timed orphan check must fail on an orphan or a deleted database's
// object that took longer than its bound, and only then.
func TestOrphansConvergedInTime(t *testing.T) {
	start := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	s := func(sec float64) time.Time { return start.Add(time.Duration(sec * float64(time.Second))) }
	b := OrphanBounds{Orphan: 5 * time.Second, Deleted: 2 * time.Second, AfterFault: 6 * time.Second}
	acct := map[string]bool{"a": true}
	obj := func(id, db string, created, deleted float64) Object {
		return Object{Host: "h1", ObjectID: id, DatabaseUUID: db, AccountID: "a", State: "deleted", CreatedAt: s(created), DeletedAt: s(deleted)}
	}
	catalog := map[string]CatalogRow{
		"live":    {Found: true, Active: true, ObjectID: "o-live", HostID: "h1"},
		"removed": {Found: true, Active: false, ObjectID: "o-removed"},
	}
	deletes := map[string]time.Duration{"removed": 10 * time.Second}
	check := func(objs []Object, faults []Window) Result {
		return OrphansConvergedInTime(objs, catalog, acct, deletes, start, faults, b)
	}

	inTime := []Object{
		obj("o1", "never-recorded", 1, 5.5),  // 4.5 s ≤ 5 s
		obj("o2", "live", 1, 4),              // the catalog names another object for its database
		obj("o-removed", "removed", 0, 11.5), // 1.5 s after the delete's answer
		{Host: "h1", ObjectID: "o-live", DatabaseUUID: "live", AccountID: "a", State: "active", CreatedAt: s(1)}, // live: not timed
	}
	r := check(inTime, nil)
	assert.True(t, r.OK(), "%s", r)
	assert.Equal(t, 3, r.Checked)

	late := []Object{obj("o1", "never-recorded", 1, 6.5)}
	assert.Len(t, check(late, nil).Violations, 1, "an orphan 5.5 s old, bound 5 s")
	lateDelete := []Object{obj("o-removed", "removed", 0, 12.5)}
	assert.Len(t, check(lateDelete, nil).Violations, 1, "2.5 s after the delete, bound 2 s")

	fault := []Window{{Name: "catalog cut off", From: 2 * time.Second, To: 4 * time.Second}}
	assert.True(t, check(late, fault).OK(), "a fault before the bound ran out moves it to the fault's end + 6 s = 10 s")
	assert.Len(t, check([]Object{obj("o1", "never-recorded", 1, 10.5)}, fault).Violations, 1, "past the fault's end + 6 s")
	earlier := []Window{{Name: "before", From: 0, To: 500 * time.Millisecond}}
	assert.Len(t, check(late, earlier).Violations, 1, "a fault that ended before the orphan was made extends nothing")
}
