package validate

import (
	"fmt"
	"slices"
	"sort"
	"time"
)

// OrphanBounds are the times within which objects must mark themselves
// deleted, derived from the hosts' configuration by the caller.
type OrphanBounds struct {
	// Orphan: from an orphan's init (an object of a create attempt the
	// catalog never recorded) — the creation grace, then the next
	// heartbeat (one interval plus the database's jitter), plus the
	// processing slack the caller allows.
	Orphan time.Duration
	// Deleted: from the acknowledgement of its database's delete — the
	// next heartbeat at the latest (the edge also tells the host at once,
	// best effort), plus the slack.
	Deleted time.Duration
	// AfterFault: from the end of a fault in effect meanwhile — a host's
	// heartbeat retry after a failed catalog call, its jitter, the slack.
	AfterFault time.Duration
}

// OrphansConvergedInTime times every object of accounts that marked
// itself deleted and is not its database's live object: an orphan of a
// create attempt the catalog never recorded (or recorded with another
// object), from its init (CreatedAt), or the object of a database whose
// delete was acknowledged (deletes: the delete's return on the history's
// clock), from that acknowledgement. Each must have marked itself deleted
// (DeletedAt) within its bound, or within AfterFault of the end of every
// fault in effect before that bound ran out (faults, on the history's
// clock; start is the history's wall-clock origin, to place the hosts'
// timestamps on it — hosts and test share the machine's clock). Orphans
// still live are OrphansConverged's business.
func OrphansConvergedInTime(objs []Object, catalog map[string]CatalogRow, accounts map[string]bool, deletes map[string]time.Duration,
	start time.Time, faults []Window, b OrphanBounds) Result {
	r := Result{Check: "orphans and deleted databases' objects marked deleted within the bound (grace + heartbeat + jitter + slack; after a fault, its end + retry + jitter + slack)"}
	fs := append([]Window(nil), faults...)
	sort.Slice(fs, func(i, j int) bool { return fs[i].From < fs[j].From })
	type figures struct {
		took     []time.Duration
		extended int
	}
	kinds := map[string]*figures{"orphan": {}, "deleted": {}}
	untimed := 0
	for _, o := range objs {
		if !accounts[o.AccountID] || o.Live() {
			continue
		}
		row := catalog[o.DatabaseUUID]
		if row.Found && row.Active && row.ObjectID == o.ObjectID {
			continue // the live database's own object, deleted: OrphansConverged reports it
		}
		if o.DeletedAt.IsZero() {
			untimed++
			continue
		}
		var kind string
		var born, bound time.Duration
		if at, ok := deletes[o.DatabaseUUID]; ok && !(row.Found && row.Active) {
			kind, born, bound = "deleted", at, b.Deleted
		} else if !row.Found || row.ObjectID != o.ObjectID {
			kind, born, bound = "orphan", o.CreatedAt.Sub(start), b.Orphan
		} else {
			untimed++ // deleted in the catalog without an acknowledged delete: no instant to time from
			continue
		}
		deadline := born + bound
		extended := false
		for _, f := range fs {
			if f.From < deadline && f.To > born && f.To+b.AfterFault > deadline {
				deadline, extended = f.To+b.AfterFault, true
			}
		}
		done := o.DeletedAt.Sub(start)
		r.Checked++
		k := kinds[kind]
		k.took = append(k.took, done-born)
		if extended {
			k.extended++
		}
		if done > deadline {
			r.Violations = append(r.Violations, fmt.Sprintf("%s/%s (database %s, %s): marked deleted at %s, %s after %s; deadline %s",
				o.Host, o.ObjectID, o.DatabaseUUID, kind, done.Round(time.Millisecond), (done-born).Round(time.Millisecond), born.Round(time.Millisecond), deadline.Round(time.Millisecond)))
		}
	}
	note := fmt.Sprintf("bounds: orphan %s from its init, deleted %s from the delete's answer, %s after a fault", b.Orphan, b.Deleted, b.AfterFault)
	for _, name := range []string{"orphan", "deleted"} {
		k := kinds[name]
		if len(k.took) == 0 {
			continue
		}
		slices.Sort(k.took)
		note += fmt.Sprintf("; %s: %d, took p50 %s, max %s (%d with the bound extended past a fault)", name, len(k.took),
			k.took[len(k.took)/2].Round(time.Millisecond), k.took[len(k.took)-1].Round(time.Millisecond), k.extended)
	}
	if untimed > 0 {
		note += fmt.Sprintf("; %d deleted objects not timed (no acknowledged delete, or no deletion time)", untimed)
	}
	r.Note = note
	sort.Strings(r.Violations)
	return r
}
