// Package validate checks a recorded history, and the state observed after
// the faults healed, against what Shoal promises its users: nothing
// acknowledged is lost, and what must be linearizable is (porcupine, with the
// models of package model).
package validate

import (
	"fmt"
	"github.com/shoaldb/shoal/objecthost/history"
	"math"
	"runtime"
	"slices"
	"sort"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/shoaldb/shoal/test/robustness/model"
	"github.com/shoaldb/shoal/test/robustness/traffic"
)

// Result is one check's verdict.
type Result struct {
	Check      string
	Checked    int      // how many items (databases, rows, operations) it checked
	Violations []string // empty: passed
	Note       string   // what the check excused or could not see, for the summary
}

// OK reports whether the check passed.
func (r Result) OK() bool { return len(r.Violations) == 0 }

func (r Result) String() string {
	note := ""
	if r.Note != "" {
		note = "; " + r.Note
	}
	if r.OK() {
		return fmt.Sprintf("%s: ok (%d checked%s)", r.Check, r.Checked, note)
	}
	shown := r.Violations[:min(len(r.Violations), 10)]
	s := fmt.Sprintf("%s: %d VIOLATIONS of %d checked%s", r.Check, len(r.Violations), r.Checked, note)
	for _, v := range shown {
		s += "\n    " + v
	}
	return s
}

// Final is what the test observed once every fault had healed and the
// system had settled.
type Final struct {
	Listed  map[string]bool            // UUIDs the account's list shows
	Rows    map[string]map[int64]bool  // per queried database, the values of table t
	Errors  map[string]string          // per database, why its final query failed
	EdgeGet map[string]traffic.Outcome // per database, the final edge GET's outcome
	Probe   map[string]string          // per listed database, why SELECT 1 failed ("" when it answered)
	// Measured is, per listed database, the file_size its host measured
	// for a GET after every other final query (file + WAL; 0: no file).
	Measured map[string]int64
}

// deleteAttempted is the set of databases any delete was sent for, whatever
// its answer: they may be gone.
func deleteAttempted(ops []traffic.Op) map[string]bool {
	out := map[string]bool{}
	for _, op := range ops {
		if op.Kind == traffic.Delete {
			out[op.DB] = true
		}
	}
	return out
}

// AckedCreatesPresent: every acknowledged create never deleted is listed,
// found by the edge and answers queries. A live database is never deleted.
func AckedCreatesPresent(ops []traffic.Op, f Final) Result {
	r := Result{Check: "acknowledged creates listed, found and queryable"}
	deleted := deleteAttempted(ops)
	for _, op := range ops {
		if op.Kind != traffic.Create || op.Outcome != traffic.OK || deleted[op.DB] {
			continue
		}
		r.Checked++
		var why []string
		if !f.Listed[op.DB] {
			why = append(why, "not in the list")
		}
		if o, ok := f.EdgeGet[op.DB]; ok && o != traffic.OK {
			why = append(why, "edge GET: "+string(o))
		}
		if e, ok := f.Errors[op.DB]; ok {
			why = append(why, "query: "+e)
		}
		if len(why) > 0 {
			r.Violations = append(r.Violations, fmt.Sprintf("%s (%s, acknowledged at %s): %v", op.DB, op.Name, op.Return.Round(time.Millisecond), why))
		}
	}
	sort.Strings(r.Violations)
	return r
}

// AckedDeletesGone: a database whose delete was acknowledged is not listed.
func AckedDeletesGone(ops []traffic.Op, f Final) Result {
	r := Result{Check: "acknowledged deletes not listed"}
	for _, op := range ops {
		if op.Kind == traffic.Delete && op.Outcome == traffic.OK {
			r.Checked++
			if f.Listed[op.DB] {
				r.Violations = append(r.Violations, op.DB+": deleted (acknowledged) but still listed")
			}
		}
	}
	return r
}

// AckedRowsReadable: every acknowledged insert's value is in its database's
// table, for every database queried at the end; and no value appears that
// no insert (acknowledged or of unknown outcome) wrote.
func AckedRowsReadable(ops []traffic.Op, f Final) Result {
	r := Result{Check: "acknowledged rows readable, no phantom rows"}
	attempted := map[string]map[int64]bool{}
	for _, op := range ops {
		if op.Kind != traffic.Insert {
			continue
		}
		if attempted[op.DB] == nil {
			attempted[op.DB] = map[int64]bool{}
		}
		if op.Outcome != traffic.Refused {
			attempted[op.DB][op.Value] = true
		}
		rows, queried := f.Rows[op.DB]
		if op.Outcome != traffic.OK || !queried {
			continue
		}
		r.Checked++
		if !rows[op.Value] {
			r.Violations = append(r.Violations, fmt.Sprintf("%s: value %d acknowledged at %s, not in the table", op.DB, op.Value, op.Return.Round(time.Millisecond)))
		}
	}
	for db, rows := range f.Rows {
		for v := range rows {
			if !attempted[db][v] {
				r.Violations = append(r.Violations, fmt.Sprintf("%s: value %d in the table, never written", db, v))
			}
		}
	}
	sort.Strings(r.Violations)
	return r
}

// OpID is the history operation (traffic.Op.ID) a porcupine operation was
// made from, carried as its Metadata: porcupine's visualization shows it,
// and the report's timeline uses it to name the operations a failed check
// got stuck on.
type OpID int

func (o OpID) String() string { return fmt.Sprintf("op %d", int(o)) }

// RegisterOperations turns the register writes, reads, bookmarks and
// restores into porcupine's form. A write or a restore of unknown outcome
// may have taken effect at any time after its call, or never
// (RegisterInput.Maybe): it stays open until the end, or until its
// EffectBy. Reads and bookmarks that failed observed nothing and are left
// out; so are writes and restores refused outright. Bookmarks are numbered
// from 1 in order of first appearance (model.RegisterInput).
func RegisterOperations(ops []traffic.Op) []porcupine.Operation {
	// Only bookmarks some restore goes back to constrain anything: the
	// others are left out of the model (each bookmark held in the state
	// multiplies the states porcupine must tell apart). A bookmark is
	// forgotten by the restore that is certainly the last to go back to
	// it (every other one returned before it was called).
	targets := map[string][]int{} // bookmark → indexes of the restores to it
	for i, op := range ops {
		if op.Kind == traffic.Restore {
			targets[op.Bookmark] = append(targets[op.Bookmark], i)
		}
	}
	lastUse := func(i int) bool {
		for _, j := range targets[ops[i].Bookmark] {
			if j != i && (ops[j].Outcome == traffic.Unknown || ops[j].Return >= ops[i].Call) {
				return false
			}
		}
		return true
	}
	// A write of unknown outcome whose value no read ever returned is left
	// out: it is unobservable, so leaving it out changes no verdict. In a
	// legal order with it, it is never the last write before a read (that
	// read would return its value), nor before a bookmark or a restore's
	// previous point that a read later sees through a restore (that read
	// would return it too); so dropping it keeps every output legal, and a
	// legal order without it is one in which it never happened. Each such
	// write kept open to the end doubles the orders porcupine must try
	// (seed 1796281627258977640: 20 unknown writes, 6 GiB of heap).
	read := map[int64]bool{}
	for _, op := range ops {
		if op.Kind == traffic.RegRead && op.Outcome == traffic.OK {
			read[op.Value] = true
		}
	}
	ids := map[string]int{}
	id := func(b string) int {
		if b == "" || len(targets[b]) == 0 {
			return 0
		}
		if _, ok := ids[b]; !ok {
			ids[b] = len(ids) + 1
		}
		return ids[b]
	}
	var out []porcupine.Operation
	for i, op := range ops {
		ret := int64(op.Return)
		in := model.RegisterInput{DB: op.DB}
		var res model.RegisterOutput
		switch {
		case op.Kind == traffic.RegWrite && op.Outcome == traffic.Unknown && !read[op.Value]:
			continue
		case op.Kind == traffic.RegWrite && (op.Outcome == traffic.OK || op.Outcome == traffic.Unknown):
			in.Op, in.Value = model.RegWrite, op.Value
		case op.Kind == traffic.RegRead && op.Outcome == traffic.OK:
			in.Op, res.Value = model.RegRead, op.Value
		case op.Kind == traffic.Bookmark && op.Outcome == traffic.OK && len(targets[op.Bookmark]) > 0:
			in.Op, res.Bookmark = model.RegBookmark, id(op.Bookmark)
		case op.Kind == traffic.Restore && op.Outcome == traffic.OK:
			in.Op, in.Bookmark, in.Forget = model.RegRestore, id(op.Bookmark), lastUse(i)
			res.Prev, res.After = id(op.Prev), id(op.After)
		case op.Kind == traffic.Restore && op.Outcome == traffic.Unknown:
			in.Op, in.Bookmark = model.RegRestore, id(op.Bookmark)
		default:
			continue
		}
		if op.Outcome == traffic.Unknown {
			// It may have happened, later than its answer even: until
			// EffectBy when that is known, else until the end.
			in.Maybe = true
			ret = math.MaxInt64
			if op.EffectBy > 0 {
				ret = int64(max(op.EffectBy, op.Return))
			}
		}
		out = append(out, porcupine.Operation{ClientId: op.Client, Call: int64(op.Call), Return: ret, Input: in, Output: res, Metadata: OpID(op.ID)})
	}
	return out
}

// BoundByHostKills sets EffectBy on every write and restore of unknown
// outcome whose database's host was killed -9 (and not yet restarted) when
// it was called or afterwards, and whose answer came before that host was
// restarted: the request reached the killed process or none (the edge
// answered it, so no copy of it was left to reach the new process), so it
// took effect before the restart or never. That covers writes answered
// 503 because their host was down: never sent, but the client cannot tell.
// (A request answered after the restart may have reached the new process:
// left open.) dbHost maps a database to its host; kills lists each host's
// kill windows, Start to Healed (restarted), in order. It returns a copy
// of ops, and how many it bounded.
func BoundByHostKills(ops []traffic.Op, dbHost map[string]string, kills map[string][]Window) ([]traffic.Op, int) {
	out := append([]traffic.Op(nil), ops...)
	n := 0
	for i, op := range out {
		if op.Outcome != traffic.Unknown || (op.Kind != traffic.RegWrite && op.Kind != traffic.Restore) {
			continue
		}
		for _, k := range kills[dbHost[op.DB]] {
			if k.To < op.Call {
				continue // restarted before the call
			}
			if op.Return <= k.To {
				out[i].EffectBy = k.To
				n++
			}
			break // the first kill not healed at the call decides
		}
	}
	return out, n
}

// RestoresAnswered: no restore to a bookmark the API itself handed out was
// refused (4xx: "invalid bookmark", "no restorable state at that point"
// would mean the archive lost or never had that point). Restores of
// unknown outcome (a fault, the store down: 5xx) are the model's business.
//
// A restore to a point its host reported lost (damages: the store lost
// archive objects, the points in the reported ranges no longer restore)
// may be refused; those are counted in the note, not excused otherwise.
func RestoresAnswered(ops []traffic.Op, damages map[string]Damage) Result {
	r := Result{Check: "every time-travel restore to a bookmark the API gave was carried out or failed retryably (but to a point its host reported lost)"}
	excused := 0
	for _, op := range ops {
		if op.Kind != traffic.Restore {
			continue
		}
		r.Checked++
		if op.Outcome == traffic.Refused || op.Outcome == traffic.NotFound {
			if d, ok := damages[op.DB]; ok {
				if p, err := history.ParseBookmark(op.DB, history.Bookmark(op.Bookmark)); err == nil && inLost(d.Lost, p) {
					excused++
					continue
				}
			}
			r.Violations = append(r.Violations, fmt.Sprintf("%s: restore to %s at %s refused: %s", op.DB, op.Bookmark, op.Call.Round(time.Millisecond), op.Answer))
		}
	}
	if excused > 0 {
		r.Note = fmt.Sprintf("%d restores to points their host reported lost were refused", excused)
	}
	return r
}

func inLost(lost []history.LostRange, p history.Position) bool {
	for _, l := range lost {
		if l.Gen == p.Gen && l.FirstTxid <= p.Txid && p.Txid <= l.LastTxid {
			return true
		}
	}
	return false
}

// ExistenceOperations turns acknowledged creates, deletes, linearizable
// gets and linearizable lists into porcupine's form, for the databases
// whose create was acknowledged (an unacknowledged create has no UUID to
// follow).
//
// A list observes every database of the account at once; the model is
// partitioned by database, so each list is projected onto each database
// it can speak of — those whose create was called before the list
// returned, and any it showed — as a get of that database (found: listed),
// on the list's own call and return. A list missing a database whose
// create was acknowledged before it was called, or showing one whose
// delete was acknowledged before it, is then not linearizable. (The
// projection checks each database alone: that one list's databases form
// a single snapshot is not checked.)
func ExistenceOperations(ops []traffic.Op) []porcupine.Operation {
	acked := map[string]bool{}
	createCall := map[string]time.Duration{}
	for _, op := range ops {
		if op.Kind == traffic.Create && op.Outcome == traffic.OK {
			acked[op.DB] = true
			createCall[op.DB] = op.Call
		}
	}
	var out []porcupine.Operation
	for _, op := range ops {
		if op.Kind == traffic.List {
			if op.Outcome != traffic.OK {
				continue
			}
			listed := map[string]bool{}
			for _, db := range op.Listed {
				listed[db] = true
			}
			for db := range acked {
				if createCall[db] >= op.Return && !listed[db] {
					continue
				}
				out = append(out, porcupine.Operation{ClientId: op.Client, Call: int64(op.Call), Return: int64(op.Return), Metadata: OpID(op.ID),
					Input: model.ExistenceInput{DB: db, Op: model.Listed}, Output: model.ExistenceOutput{Found: listed[db]}})
			}
			continue
		}
		if !acked[op.DB] {
			continue
		}
		o := porcupine.Operation{ClientId: op.Client, Call: int64(op.Call), Return: int64(op.Return), Metadata: OpID(op.ID)}
		switch {
		case op.Kind == traffic.Create && op.Outcome == traffic.OK:
			o.Input = model.ExistenceInput{DB: op.DB, Op: model.Created}
		case op.Kind == traffic.Delete && (op.Outcome == traffic.OK || op.Outcome == traffic.NotFound):
			o.Input, o.Output = model.ExistenceInput{DB: op.DB, Op: model.Deleted}, model.ExistenceOutput{NotFound: op.Outcome == traffic.NotFound}
		case op.Kind == traffic.Delete && op.Outcome == traffic.Unknown:
			o.Input, o.Return = model.ExistenceInput{DB: op.DB, Op: model.Deleted}, math.MaxInt64
			o.Output = model.ExistenceOutput{}
		case op.Kind == traffic.LinGet && op.Outcome == traffic.OK:
			o.Input, o.Output = model.ExistenceInput{DB: op.DB, Op: model.Got}, model.ExistenceOutput{Found: op.Found}
		default:
			continue
		}
		out = append(out, o)
	}
	return out
}

// Linearizable checks ops against m. A check that times out is a failure
// too: nothing is waved through.
func Linearizable(name string, m porcupine.Model, ops []porcupine.Operation, timeout time.Duration) (Result, porcupine.LinearizationInfo) {
	return LinearizableWithin(name, m, ops, timeout, 0)
}

// LinearizableWithin is Linearizable with a guard on the checker's memory:
// porcupine can be stopped only by its timeout, and a history with many
// operations of unknown outcome can make its search grow by gigabytes a
// minute. Past maxHeap bytes of heap (0: no guard) the process panics with
// the reason rather than take the machine's memory (these machines are
// shared). Call it once the cluster is stopped: a panic runs no cleanup.
func LinearizableWithin(name string, m porcupine.Model, ops []porcupine.Operation, timeout time.Duration, maxHeap uint64) (Result, porcupine.LinearizationInfo) {
	if maxHeap > 0 {
		done := make(chan struct{})
		defer close(done)
		go func() {
			tick := time.NewTicker(time.Second)
			defer tick.Stop()
			for {
				select {
				case <-done:
					return
				case <-tick.C:
				}
				var ms runtime.MemStats
				runtime.ReadMemStats(&ms)
				if ms.HeapInuse > maxHeap {
					panic(fmt.Sprintf("robustness: the %s check (porcupine, %d operations) passed %d MiB of heap: stopped to protect the machine; the history is not judged", name, len(ops), maxHeap>>20))
				}
			}
		}()
	}
	res, info := porcupine.CheckOperationsVerbose(m, ops, timeout)
	r := Result{Check: name + " linearizable (porcupine)", Checked: len(ops)}
	switch res {
	case porcupine.Ok:
	case porcupine.Illegal:
		r.Violations = append(r.Violations, "history is not linearizable: see the visualization in the report")
	default:
		r.Violations = append(r.Violations, fmt.Sprintf("check did not finish within %s (result %q)", timeout, res))
	}
	return r, info
}

// Window is a span of the history's clock during which a fault was in
// effect.
type Window struct {
	Name       string
	From, To   time.Duration
	Exceptions map[string]bool // databases the promise does not cover (e.g. created during the fault)
}

// QueriesAvailableDuring: every query (insert, register write and read) to
// an existing database called while the catalog was cut off succeeded — the
// seed design's promise that no query needs the catalog. A database counts
// as existing if its create was acknowledged before the window opened.
func QueriesAvailableDuring(ops []traffic.Op, windows []Window) Result {
	return QueriesAvailable("the catalog is cut off", ops, windows)
}

// QueriesAvailable: every query (insert, register write and read, bound read) to an
// existing database called inside one of windows succeeded (what names the
// fault, e.g. "the object store is down"). A database counts as existing
// if its create was acknowledged before the window opened. A query that
// failed while a time-travel restore of its database was in flight is not
// counted: a restore holds its database's queries (503, retry) by design,
// until it is done or fails — with the store down, until the store answers
// or the request gives up.
func QueriesAvailable(what string, ops []traffic.Op, windows []Window) Result {
	return available("100% of queries to existing databases succeed while "+what,
		[]traffic.Kind{traffic.Insert, traffic.RegWrite, traffic.RegRead, traffic.BoundRead}, ops, windows)
}

// available is QueriesAvailable for the operations of kinds.
func available(check string, kinds []traffic.Kind, ops []traffic.Op, windows []Window) Result {
	r := Result{Check: check}
	createdAt := map[string]time.Duration{}
	restoring := map[string][]Window{}
	for _, op := range ops {
		if op.Kind == traffic.Create && op.Outcome == traffic.OK {
			createdAt[op.DB] = op.Return
		}
		if op.Kind == traffic.Restore {
			restoring[op.DB] = append(restoring[op.DB], Window{From: op.Call, To: op.Return})
		}
	}
	excused := 0
	for _, w := range windows {
		for _, op := range ops {
			if op.Call < w.From || op.Call > w.To {
				continue
			}
			if !slices.Contains(kinds, op.Kind) {
				continue
			}
			if at, ok := createdAt[op.DB]; (ok && at > w.From) || w.Exceptions[op.DB] {
				continue
			}
			if op.Outcome != traffic.OK && overlaps(op, restoring[op.DB]) {
				excused++
				continue
			}
			r.Checked++
			if op.Outcome != traffic.OK {
				r.Violations = append(r.Violations, fmt.Sprintf("%s at %s on %s (%s): %s %s", op.Kind, op.Call.Round(time.Millisecond), op.DB, w.Name, op.Outcome, op.Answer))
			}
		}
	}
	if excused > 0 {
		r.Note = fmt.Sprintf("%d queries failed during a restore of their database, not counted", excused)
	}
	return r
}

// overlaps reports whether op ran (call to return) inside any of ws.
func overlaps(op traffic.Op, ws []Window) bool {
	for _, w := range ws {
		if op.Call <= w.To && op.Return >= w.From {
			return true
		}
	}
	return false
}

// ListedQueryable: every database the final list shows answers a query (no
// zombie: listed, while every query answers 404).
func ListedQueryable(f Final) Result {
	r := Result{Check: "every listed database answers queries"}
	for db := range f.Listed {
		r.Checked++
		if why, ok := f.Probe[db]; ok && why != "" {
			r.Violations = append(r.Violations, db+": "+why)
		}
	}
	sort.Strings(r.Violations)
	return r
}

// ArchivedWritesHeld: with durability = "archived" a write is acknowledged
// only once the archive store has it, so no write to a database of an
// archived host (onArchived) called after a window opened and answered
// before it closed was acknowledged — the windows being those when the
// store could take nothing (killed, stopped, cut off, answering 503;
// not merely slow), from the injection's return to the heal's start
// (failpoint.Injection's Effective and HealStart: an `ip link` or a signal
// takes effect only once its command ran).
func ArchivedWritesHeld(ops []traffic.Op, onArchived map[string]bool, windows []Window) Result {
	r := Result{Check: "durability = archived: no write acknowledged while the object store could store nothing"}
	held := 0
	for _, w := range windows {
		for _, op := range ops {
			if (op.Kind != traffic.Insert && op.Kind != traffic.RegWrite) || !onArchived[op.DB] || op.Call <= w.From || op.Return >= w.To {
				continue
			}
			r.Checked++
			if op.Outcome == traffic.OK {
				r.Violations = append(r.Violations, fmt.Sprintf("%s of %d on %s acknowledged at %s during %s", op.Kind, op.Value, op.DB, op.Return.Round(time.Millisecond), w.Name))
			} else {
				held++
			}
		}
	}
	r.Note = fmt.Sprintf("%d writes answered not acknowledged", held)
	return r
}

// ListsOneInstant: each acknowledged list shows the account's databases at
// one instant of its call, across databases — what the per-database
// existence model cannot see (it projects a list onto each database
// alone). For each list it bounds that instant from below by its call and
// by the call of every listed database's acknowledged create (a database
// shows only once its create took effect), and from above by its return,
// by the return of every listed database's acknowledged delete, and by the
// return of the acknowledged create of every database it leaves out for
// which no delete was called before the list returned (left out, so the
// instant came before that create took effect). A list whose lower bound
// passes its upper bound mixes two moments: a violation naming the two
// databases. Only lists that returned before until count (0: all; a
// catalog restore rewinds what a later list may show).
func ListsOneInstant(ops []traffic.Op, until time.Duration) Result {
	r := Result{Check: "each list shows the account at one instant (across databases)"}
	createCall := map[string]time.Duration{}
	createRet := map[string]time.Duration{}
	delRet := map[string]time.Duration{}  // earliest acknowledged delete's return
	delCall := map[string]time.Duration{} // earliest delete call, whatever its outcome
	for _, op := range ops {
		switch {
		case op.Kind == traffic.Create && op.Outcome == traffic.OK:
			createCall[op.DB], createRet[op.DB] = op.Call, op.Return
		case op.Kind == traffic.Delete:
			if c, ok := delCall[op.DB]; !ok || op.Call < c {
				delCall[op.DB] = op.Call
			}
			if op.Outcome == traffic.OK {
				if d, ok := delRet[op.DB]; !ok || op.Return < d {
					delRet[op.DB] = op.Return
				}
			}
		}
	}
	for _, op := range ops {
		if op.Kind != traffic.List || op.Outcome != traffic.OK || (until > 0 && op.Return >= until) {
			continue
		}
		r.Checked++
		lo, loWhy := op.Call, "the list's call"
		hi, hiWhy := op.Return, "the list's return"
		listed := map[string]bool{}
		for _, db := range op.Listed {
			listed[db] = true
			if c, ok := createCall[db]; ok && c > lo {
				lo, loWhy = c, fmt.Sprintf("it shows %s, whose create was called at %s", db, c.Round(time.Millisecond))
			}
			if d, ok := delRet[db]; ok && d < hi {
				hi, hiWhy = d, fmt.Sprintf("it shows %s, whose delete was acknowledged at %s", db, d.Round(time.Millisecond))
			}
		}
		for db, ret := range createRet {
			if listed[db] || ret >= hi {
				continue
			}
			if c, ok := delCall[db]; ok && c < op.Return {
				continue
			}
			hi, hiWhy = ret, fmt.Sprintf("it leaves out %s, whose create was acknowledged at %s and never deleted", db, ret.Round(time.Millisecond))
		}
		if lo > hi {
			r.Violations = append(r.Violations, fmt.Sprintf("list op %d (%s → %s): no one instant: %s, but %s", op.ID,
				op.Call.Round(time.Millisecond), op.Return.Round(time.Millisecond), loWhy, hiWhy))
		}
	}
	sort.Strings(r.Violations)
	return r
}
