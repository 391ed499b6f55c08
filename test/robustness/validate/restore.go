package validate

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/shoaldb/shoal/test/robustness/model"
	"github.com/shoaldb/shoal/test/robustness/traffic"
)

// CatalogRestore is one rewind of the catalog, on the history's clock: a
// backup taken (`shoal cluster backup`, from its call to its return) and,
// later, the whole catalog restored from it (`shoal cluster restore`).
// The backup's point (its snapshot of the catalog) is inside the backup
// call; the restore's (the raft user restore's commit) inside the restore
// call.
type CatalogRestore struct {
	BackupCall, BackupReturn   time.Duration
	RestoreCall, RestoreReturn time.Duration
}

// RestoreSets classifies the databases a catalog restore concerns, from
// the acknowledged creates and deletes around it.
type RestoreSets struct {
	// Lost: acknowledged creates called after the backup returned and
	// answered before the restore was called — certainly committed after
	// the backup's point and before the restore's: the restore drops them
	// from the catalog. LostMaybe adds the creates overlapping the backup
	// or the restore call (on either side of one of the two points).
	Lost, LostMaybe map[string]bool
	// Resurrected: databases created before the backup was called (so
	// active in it) whose delete was called after the backup returned and
	// acknowledged before the restore was called — the restore makes them
	// active in the catalog again. ResurrectedMaybe adds the acknowledged
	// deletes overlapping either call, and the databases whose create
	// overlapped the backup call (with a delete after the backup's point
	// possible).
	Resurrected, ResurrectedMaybe map[string]bool
	// Deleted: databases with an acknowledged delete (any time).
	Deleted map[string]bool
}

// Excluded is every database whose catalog state the restore may have
// rewound (LostMaybe and ResurrectedMaybe): the checks that assume one
// catalog history leave them to the restore's own checks.
func (s RestoreSets) Excluded() map[string]bool {
	out := map[string]bool{}
	for db := range s.LostMaybe {
		out[db] = true
	}
	for db := range s.ResurrectedMaybe {
		out[db] = true
	}
	return out
}

// Sets classifies ops' databases around r.
func (r CatalogRestore) Sets(ops []traffic.Op) RestoreSets {
	s := RestoreSets{Lost: map[string]bool{}, LostMaybe: map[string]bool{}, Resurrected: map[string]bool{}, ResurrectedMaybe: map[string]bool{}, Deleted: map[string]bool{}}
	created := map[string]traffic.Op{}
	for _, op := range ops {
		if op.Kind == traffic.Create && op.Outcome == traffic.OK {
			created[op.DB] = op
			if op.Return >= r.BackupCall && op.Call <= r.RestoreReturn {
				s.LostMaybe[op.DB] = true
				if op.Call >= r.BackupReturn && op.Return <= r.RestoreCall {
					s.Lost[op.DB] = true
				}
			}
		}
	}
	for _, op := range ops {
		if op.Kind != traffic.Delete || op.Outcome != traffic.OK {
			continue
		}
		s.Deleted[op.DB] = true
		c, ok := created[op.DB]
		// Possibly active in the backup (created before its point, deleted
		// after it) and deleted before the restore's point. A create and
		// delete both inside the backup call can straddle its point too:
		// such a database comes back although the history never saw it
		// active before the backup (found by the resurrected_databases
		// check, 2026-12-03: the hosts named one this missed).
		if !ok || c.Call > r.BackupReturn || op.Return < r.BackupCall || op.Call > r.RestoreReturn {
			continue
		}
		s.ResurrectedMaybe[op.DB] = true
		if c.Return < r.BackupCall && op.Call >= r.BackupReturn && op.Return <= r.RestoreCall {
			s.Resurrected[op.DB] = true
		}
	}
	return s
}

// ExistenceOperationsSplit is ExistenceOperations split at the restore:
// linearizability of the catalog's history across an operator's rewind
// cannot hold (databases created after the backup vanish, deleted ones
// come back), so the history is checked in two parts — before, against
// model.Existence; after, against model.ExistenceResumed, where each
// database starts as the backup left it (unknown to the history). Reads
// overlapping the restore call are in neither part (they may have seen
// either side). A create or delete overlapping it, or of unknown outcome
// called before it, may have taken effect on either side: before, it is
// open to the end of its part; after, it is open from the restore's
// return to the end (linearizable anywhere in the part, or last, where
// nothing observes it).
func ExistenceOperationsSplit(ops []traffic.Op, r CatalogRestore) (before, after []porcupine.Operation) {
	for _, o := range ExistenceOperations(ops) {
		in := o.Input.(model.ExistenceInput)
		mutates := in.Op == model.Created || in.Op == model.Deleted
		switch {
		case o.Return < int64(r.RestoreCall):
			before = append(before, o)
		case o.Call > int64(r.RestoreReturn):
			after = append(after, o)
		case mutates:
			b := o
			if o.Call < int64(r.RestoreCall) {
				b.Return = math.MaxInt64
				before = append(before, b)
			}
			a := o
			a.Call, a.Return = int64(r.RestoreReturn), math.MaxInt64
			after = append(after, a)
		}
	}
	return before, after
}

// LostKept: a database whose create was acknowledged and that the restore
// dropped from the catalog (Lost) is not deleted by any host on the
// catalog's older word: its host keeps its object live, with every
// acknowledged insert in its file; the catalog does not know it
// (linearizable get, and the final list) — the restore's documented effect
// (docs/operations.md, "Backup and restore"). For LostMaybe databases
// (created across the backup or the restore call) either side is right:
// known and active with a live object, or unknown with a live object.
// Databases whose delete was acknowledged are left out (they are gone
// either way; AckedDeletesGone and the orphan checks hold them).
//
// values reads an object's table t from its file (FileValues); catalog is
// the linearizable answer for every database the hosts hold.
func LostKept(ops []traffic.Op, s RestoreSets, objs []Object, catalog map[string]CatalogRow, listed map[string]bool, values func(Object) (map[int64]bool, error)) Result {
	r := Result{Check: "catalog restored from an older backup: databases created after the backup keep their live object and data on their host, unknown to the catalog"}
	live := map[string]Object{}
	for _, o := range objs {
		if o.Live() {
			live[o.DatabaseUUID] = o
		}
	}
	acked := map[string][]int64{}
	for _, op := range ops {
		if op.Kind == traffic.Insert && op.Outcome == traffic.OK {
			acked[op.DB] = append(acked[op.DB], op.Value)
		}
	}
	rows := 0
	for db := range s.LostMaybe {
		if s.Deleted[db] {
			continue
		}
		r.Checked++
		o, ok := live[db]
		if !ok {
			r.Violations = append(r.Violations, fmt.Sprintf("%s: acknowledged, no live object on any host (deleted on the restored catalog's word?)", db))
			continue
		}
		row := catalog[db]
		if s.Lost[db] && (row.Found || listed[db]) {
			r.Violations = append(r.Violations, fmt.Sprintf("%s: created after the backup, still in the catalog after the restore (found=%v listed=%v)", db, row.Found, listed[db]))
		}
		if row.Found && (!row.Active || row.ObjectID != o.ObjectID) {
			r.Violations = append(r.Violations, fmt.Sprintf("%s: the catalog names object %s (active=%v), the live one is %s/%s", db, row.ObjectID, row.Active, o.Host, o.ObjectID))
		}
		vals, err := values(o)
		if err != nil {
			r.Violations = append(r.Violations, fmt.Sprintf("%s: reading %s/%s: %v", db, o.Host, o.ObjectID, err))
			continue
		}
		for _, v := range acked[db] {
			rows++
			if !vals[v] {
				r.Violations = append(r.Violations, fmt.Sprintf("%s: acknowledged value %d not in %s/%s", db, v, o.Host, o.ObjectID))
			}
		}
	}
	r.Note = fmt.Sprintf("%d certainly dropped from the catalog, %d across a call; %d acknowledged rows read from their files", len(s.Lost), len(s.LostMaybe)-len(s.Lost), rows)
	sort.Strings(r.Violations)
	return r
}

// LostServed: the databases the restore dropped from the catalog (Lost,
// not deleted) keep answering queries through the edges (routes the edges
// cached, docs/operations.md): the final read of their rows succeeded.
// errs is the final observation's failures (Final.Errors), queried the
// databases observe read.
func LostServed(s RestoreSets, rows map[string]map[int64]bool, errs map[string]string) Result {
	r := Result{Check: "catalog restored from an older backup: databases created after the backup still answer queries through the edges"}
	for db := range s.Lost {
		if s.Deleted[db] {
			continue
		}
		if _, ok := rows[db]; ok {
			r.Checked++
			continue
		}
		if e, ok := errs[db]; ok {
			r.Checked++
			r.Violations = append(r.Violations, fmt.Sprintf("%s: final query: %s", db, e))
		}
	}
	sort.Strings(r.Violations)
	return r
}

// HostAlarms is what one object host showed about the restore once the
// traffic stopped: its /v1/status lost_databases alarm (and its sample),
// whether `shoal cluster status` named it, its lost_held heartbeat
// counter, and its output (one log line per lost database per pass); and
// the same for resurrected_databases: the alarm (count, sample), its full
// list (GET /v1/resurrected), the gauge and `shoal cluster status`.
type HostAlarms struct {
	Host        string
	Alarm       bool
	Sample      []string
	CLI         bool
	LostHeld    float64
	Output      string
	StatusError string

	ResurrectedAlarm  bool
	ResurrectedCount  int      // the alarm's Databases
	ResurrectedSample []string // the alarm's sample
	ResurrectedList   []string // GET /v1/resurrected
	ResurrectedGauge  float64  // shoal_objecthost_resurrected_databases (-1: unreadable)
	ResurrectedCLI    bool     // `shoal cluster status` shows "ALARM <host> resurrected_databases"
}

// LostAlarmed: every host holding a live object of a database the restore
// dropped from the catalog raised lost_databases, visible in its
// /v1/status, in `shoal cluster status` and in its heartbeat counter
// (outcome lost_held), its sample names only such databases, and its log
// names each of them; a host holding none raised nothing.
func LostAlarmed(s RestoreSets, objs []Object, hosts []HostAlarms) Result {
	r := Result{Check: "catalog restored from an older backup: the hosts raise lost_databases (status, `shoal cluster status`, metrics, log) for exactly the databases it dropped"}
	holds := map[string][]string{}
	for _, o := range objs {
		if o.Live() && s.Lost[o.DatabaseUUID] && !s.Deleted[o.DatabaseUUID] {
			holds[o.Host] = append(holds[o.Host], o.DatabaseUUID)
		}
	}
	for _, h := range hosts {
		r.Checked++
		if h.StatusError != "" {
			r.Violations = append(r.Violations, fmt.Sprintf("%s: status: %s", h.Host, h.StatusError))
			continue
		}
		lost := holds[h.Host]
		if len(lost) == 0 {
			if h.Alarm {
				// A database created across a call may have been dropped
				// too: only a sample outside LostMaybe is wrong.
				for _, db := range h.Sample {
					if !s.LostMaybe[db] {
						r.Violations = append(r.Violations, fmt.Sprintf("%s: lost_databases names %s, which the restore did not drop", h.Host, db))
					}
				}
			}
			continue
		}
		if !h.Alarm {
			r.Violations = append(r.Violations, fmt.Sprintf("%s: holds %d databases the restore dropped, no lost_databases alarm in /v1/status", h.Host, len(lost)))
		}
		if !h.CLI {
			r.Violations = append(r.Violations, fmt.Sprintf("%s: `shoal cluster status` shows no lost_databases alarm for it", h.Host))
		}
		if h.LostHeld <= 0 {
			r.Violations = append(r.Violations, fmt.Sprintf("%s: shoal_objecthost_heartbeats{outcome=\"lost_held\"} is %v", h.Host, h.LostHeld))
		}
		for _, db := range h.Sample {
			if !s.LostMaybe[db] {
				r.Violations = append(r.Violations, fmt.Sprintf("%s: lost_databases names %s, which the restore did not drop", h.Host, db))
			}
		}
		for _, db := range lost {
			r.Checked++
			if !strings.Contains(h.Output, db) {
				r.Violations = append(r.Violations, fmt.Sprintf("%s: its log never names %s as unknown to the catalog", h.Host, db))
			}
		}
	}
	sort.Strings(r.Violations)
	return r
}

// ResurrectedStayDeleted: a database deleted (acknowledged) after the
// backup comes back active in the restored catalog — the backup's word —
// but its acknowledged delete stands on the data plane: no host serves it
// again (no live object anywhere: a host never revives a deleted object on
// the catalog's word), queries to it fail (the final probe of each listed
// one answers not found), and deleting it again through the API — the
// operator's remedy — is acknowledged and removes it from the catalog.
// redeleted is, per such database, the outcome of that second delete and
// whether a linearizable get found it afterwards.
func ResurrectedStayDeleted(s RestoreSets, objs []Object, f Final, redeleted map[string]Redelete) Result {
	r := Result{Check: "catalog restored from an older backup: databases deleted after the backup come back in the catalog, stay deleted on their hosts, and a second delete clears them"}
	live := map[string]Object{}
	for _, o := range objs {
		if o.Live() {
			live[o.DatabaseUUID] = o
		}
	}
	listed := 0
	for db := range s.ResurrectedMaybe {
		r.Checked++
		if o, ok := live[db]; ok {
			r.Violations = append(r.Violations, fmt.Sprintf("%s: deleted (acknowledged), live again on %s/%s", db, o.Host, o.ObjectID))
		}
		if !f.Listed[db] {
			if s.Resurrected[db] {
				r.Violations = append(r.Violations, fmt.Sprintf("%s: deleted after the backup, not listed after the restore (the catalog should hold the backup's active row)", db))
			}
			continue
		}
		listed++
		if why, ok := f.Probe[db]; ok && why == "" {
			r.Violations = append(r.Violations, fmt.Sprintf("%s: deleted (acknowledged), answers queries again", db))
		}
		rd, ok := redeleted[db]
		switch {
		case !ok:
			r.Violations = append(r.Violations, fmt.Sprintf("%s: listed again, not deleted a second time", db))
		case rd.Outcome != traffic.OK:
			r.Violations = append(r.Violations, fmt.Sprintf("%s: second delete answered %s %s", db, rd.Outcome, rd.Answer))
		case rd.FoundAfter:
			r.Violations = append(r.Violations, fmt.Sprintf("%s: still in the catalog after its second delete", db))
		}
	}
	r.Note = fmt.Sprintf("%d deleted after the backup, %d across a call; %d listed again (zombies until deleted again: ResurrectedAlarmed holds the hosts to naming them)", len(s.Resurrected), len(s.ResurrectedMaybe)-len(s.Resurrected), listed)
	sort.Strings(r.Violations)
	return r
}

// Redelete is the operator's second delete of a database the restore
// brought back.
type Redelete struct {
	Outcome    traffic.Outcome
	Answer     string
	FoundAfter bool
}

// ResurrectedAlarmed: after the restore, every host names in its
// resurrected_databases alarm exactly the databases that are listed again
// although their delete was acknowledged after the backup
// (ResurrectedMaybe, listed in the final observation) and whose deleted
// object (tombstone) it holds — in /v1/status (count and sample), in GET
// /v1/resurrected, in the gauge shoal_objecthost_resurrected_databases and
// in `shoal cluster status` — and nothing else; a host holding none raises
// none. cli is what `shoal cluster resurrected` listed as active: the same
// set, across hosts. objs are the hosts' objects (read after the final
// kill: a tombstone stays until the sweep, 24 h in the topology). A
// database whose delete's outcome is unknown may have been deleted after
// the backup too: naming it is allowed, not required.
func ResurrectedAlarmed(ops []traffic.Op, s RestoreSets, objs []Object, f Final, hosts []HostAlarms, cli []string) Result {
	r := Result{Check: "catalog restored from an older backup: the hosts raise resurrected_databases (status, /v1/resurrected, metrics, `shoal cluster status`, `shoal cluster resurrected`) for exactly the deleted databases it lists again"}
	want := map[string]map[string]bool{} // host → databases
	all := map[string]bool{}
	maybe := map[string]bool{} // deleted with an unknown outcome: may be named
	for _, op := range ops {
		if op.Kind == traffic.Delete && op.Outcome == traffic.Unknown {
			maybe[op.DB] = true
		}
	}
	for _, o := range objs {
		if o.Live() || !s.ResurrectedMaybe[o.DatabaseUUID] || !f.Listed[o.DatabaseUUID] {
			continue
		}
		if want[o.Host] == nil {
			want[o.Host] = map[string]bool{}
		}
		want[o.Host][o.DatabaseUUID] = true
		all[o.DatabaseUUID] = true
	}
	for db := range s.ResurrectedMaybe {
		if f.Listed[db] && !all[db] {
			r.Violations = append(r.Violations, fmt.Sprintf("%s: listed again after its delete, no host holds its tombstone", db))
		}
	}
	named := 0
	for _, h := range hosts {
		r.Checked++
		if h.StatusError != "" {
			r.Violations = append(r.Violations, fmt.Sprintf("%s: status: %s", h.Host, h.StatusError))
			continue
		}
		w := want[h.Host]
		got := map[string]bool{}
		for _, db := range h.ResurrectedList {
			got[db] = true
		}
		named += len(got)
		for db := range w {
			r.Checked++
			if !got[db] {
				r.Violations = append(r.Violations, fmt.Sprintf("%s: holds the tombstone of %s, listed again after its delete, not in GET /v1/resurrected", h.Host, db))
			}
		}
		for db := range got {
			if !w[db] && !maybe[db] {
				r.Violations = append(r.Violations, fmt.Sprintf("%s: GET /v1/resurrected names %s, which is not a database deleted after the backup and listed again by the restored catalog on this host", h.Host, db))
			}
		}
		for _, db := range h.ResurrectedSample {
			if !w[db] && !maybe[db] {
				r.Violations = append(r.Violations, fmt.Sprintf("%s: the resurrected_databases alarm's sample names %s, not one of its resurrected databases", h.Host, db))
			}
		}
		if len(w) == 0 {
			if len(got) == 0 && (h.ResurrectedAlarm || h.ResurrectedGauge != 0) {
				r.Violations = append(r.Violations, fmt.Sprintf("%s: holds no resurrected database, alarm=%v gauge=%v", h.Host, h.ResurrectedAlarm, h.ResurrectedGauge))
			}
			continue
		}
		if !h.ResurrectedAlarm {
			r.Violations = append(r.Violations, fmt.Sprintf("%s: holds %d resurrected databases, no resurrected_databases alarm in /v1/status", h.Host, len(w)))
		} else if h.ResurrectedCount != len(got) {
			r.Violations = append(r.Violations, fmt.Sprintf("%s: the alarm counts %d databases, its list has %d", h.Host, h.ResurrectedCount, len(got)))
		}
		if h.ResurrectedGauge != float64(len(got)) {
			r.Violations = append(r.Violations, fmt.Sprintf("%s: shoal_objecthost_resurrected_databases is %v, its list has %d", h.Host, h.ResurrectedGauge, len(got)))
		}
		if !h.ResurrectedCLI {
			r.Violations = append(r.Violations, fmt.Sprintf("%s: `shoal cluster status` shows no resurrected_databases alarm for it", h.Host))
		}
	}
	got := map[string]bool{}
	for _, db := range cli {
		got[db] = true
		if !all[db] && !maybe[db] {
			r.Violations = append(r.Violations, fmt.Sprintf("`shoal cluster resurrected` lists %s as active, which is not a resurrected database", db))
		}
	}
	for db := range all {
		if !got[db] {
			r.Violations = append(r.Violations, fmt.Sprintf("`shoal cluster resurrected` does not list %s as active", db))
		}
	}
	r.Note = fmt.Sprintf("%d databases listed again after their delete, %d named by the hosts", len(all), named)
	sort.Strings(r.Violations)
	return r
}

// ResurrectedAlarmCleared: once the resurrected databases were deleted a
// second time, every host's resurrected_databases alarm cleared and its
// gauge went back to 0 (waited for up to a bound: the hosts re-check every
// heartbeat interval). hosts is what they showed at the end of the wait.
func ResurrectedAlarmCleared(hosts []HostAlarms) Result {
	r := Result{Check: "catalog restored from an older backup: the resurrected_databases alarm clears once the databases are deleted again"}
	for _, h := range hosts {
		r.Checked++
		switch {
		case h.StatusError != "":
			r.Violations = append(r.Violations, fmt.Sprintf("%s: status: %s", h.Host, h.StatusError))
		case h.ResurrectedAlarm || h.ResurrectedGauge != 0 || len(h.ResurrectedList) > 0:
			r.Violations = append(r.Violations, fmt.Sprintf("%s: after the second delete: alarm=%v (%d databases, sample %v), gauge %v, listed %v", h.Host,
				h.ResurrectedAlarm, h.ResurrectedCount, h.ResurrectedSample, h.ResurrectedGauge, h.ResurrectedList))
		}
	}
	sort.Strings(r.Violations)
	return r
}
