package validate

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/shoaldb/shoal/objecthost/history"
	"github.com/shoaldb/shoal/test/robustness/traffic"
)

// ArchiveCheck is one live database's archive (objecthost/history) held
// against the file its host left: the archive verifies (no gap, doubled or
// corrupt record in any generation) and a restore of its last point has
// exactly the file's content.
type ArchiveCheck struct {
	Object    Object
	Verify    history.VerifyStats
	Latest    history.Position
	Mismatch  string // how the restored content differs from the file's
	Integrity string // integrity_check of the restored copy
	Err       error  // the archive could not be read, verified or restored
	NoFile    bool   // the object was never opened: no file, no history
}

// CheckArchive verifies o's archive, restores its last point into a
// temporary file and compares that with a copy of o's file (with its WAL,
// replayed as a restart would). o's host must be down.
//
// With d (what o's host reported of its archive's damage after the store
// lost objects), the archive is verified around exactly that damage
// (history.Archive.VerifyExcept): from the healed point on in a damaged
// generation, everywhere else as always.
func CheckArchive(ctx context.Context, a *history.Archive, o Object, d *Damage) ArchiveCheck {
	res := ArchiveCheck{Object: o}
	if _, err := os.Stat(o.Path); errors.Is(err, os.ErrNotExist) {
		res.NoFile = true // never opened (see IntegrityCheck)
		return res
	}
	var lost []history.LostRange
	var damaged []string
	if d != nil {
		lost, damaged = d.Lost, d.Damaged
	}
	if res.Verify, res.Err = a.VerifyExcept(ctx, o.DatabaseUUID, lost, damaged); res.Err != nil {
		res.Err = fmt.Errorf("verify: %w", res.Err)
		return res
	}
	// The last point Verify reached: the chain from the oldest kept
	// snapshot, without a hole, to the newest record (what Latest names).
	res.Latest = res.Verify.Last
	if res.Verify.Skipped > 0 && res.Latest.Gen == "" {
		res.Err = fmt.Errorf("nothing restores after the damage its host reported (%d generations without a healed point)", res.Verify.Skipped)
		return res
	}
	tmp, err := os.MkdirTemp("", "shoal-archive-check-")
	if err != nil {
		res.Err = err
		return res
	}
	defer os.RemoveAll(tmp)
	restored := filepath.Join(tmp, "restored.db")
	if _, err := a.Restore(ctx, o.DatabaseUUID, res.Latest, restored); err != nil {
		res.Err = fmt.Errorf("restore of %s/%d: %w", res.Latest.Gen, res.Latest.Txid, err)
		return res
	}
	live := filepath.Join(tmp, "live.db")
	for _, suffix := range []string{"", "-wal"} {
		if err := copyFile(o.Path+suffix, live+suffix); err != nil && !(suffix != "" && os.IsNotExist(err)) {
			res.Err = err
			return res
		}
	}
	want, err := dumpDB(ctx, live)
	if err != nil {
		res.Err = fmt.Errorf("reading the host's file: %w", err)
		return res
	}
	got, err := dumpDB(ctx, restored)
	if err != nil {
		res.Err = fmt.Errorf("reading the restore: %w", err)
		return res
	}
	res.Mismatch = diffDumps(want, got)
	res.Integrity, res.Err = integrity(ctx, restored)
	return res
}

// dumpDB is the database's whole logical content: its schema rows and
// every row of every table, each rendered as text, sorted.
func dumpDB(ctx context.Context, path string) ([]string, error) {
	db, err := sql.Open("sqlite3", "file:"+path)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var tables []string
	var out []string
	rows, err := db.QueryContext(ctx, "SELECT type, name, tbl_name, COALESCE(sql, '') FROM sqlite_schema ORDER BY name")
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var typ, name, tbl, ddl string
		if err := rows.Scan(&typ, &name, &tbl, &ddl); err != nil {
			rows.Close()
			return nil, err
		}
		out = append(out, fmt.Sprintf("schema %s %s %s %s", typ, name, tbl, ddl))
		if typ == "table" {
			tables = append(tables, name)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	for _, t := range tables {
		rows, err := db.QueryContext(ctx, `SELECT * FROM "`+strings.ReplaceAll(t, `"`, `""`)+`"`)
		if err != nil {
			return nil, fmt.Errorf("table %s: %w", t, err)
		}
		cols, _ := rows.Columns()
		vals := make([]any, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		for rows.Next() {
			if err := rows.Scan(ptrs...); err != nil {
				rows.Close()
				return nil, err
			}
			var b strings.Builder
			b.WriteString("row " + t)
			for _, v := range vals {
				if bs, ok := v.([]byte); ok {
					fmt.Fprintf(&b, " %x", bs)
				} else {
					fmt.Fprintf(&b, " %v", v)
				}
			}
			out = append(out, b.String())
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, err
		}
	}
	sort.Strings(out)
	return out, nil
}

// diffDumps describes how got differs from want ("" when equal).
func diffDumps(want, got []string) string {
	w, g := map[string]int{}, map[string]int{}
	for _, s := range want {
		w[s]++
	}
	for _, s := range got {
		g[s]++
	}
	var missing, extra []string
	for s, n := range w {
		if g[s] < n {
			missing = append(missing, s)
		}
	}
	for s, n := range g {
		if w[s] < n {
			extra = append(extra, s)
		}
	}
	if len(missing) == 0 && len(extra) == 0 {
		return ""
	}
	sort.Strings(missing)
	sort.Strings(extra)
	return fmt.Sprintf("%d rows of the file missing from the restore %v, %d rows the file lacks %v",
		len(missing), missing[:min(len(missing), 5)], len(extra), extra[:min(len(extra), 5)])
}

func integrity(ctx context.Context, path string) (string, error) {
	db, err := sql.Open("sqlite3", "file:"+path)
	if err != nil {
		return "", err
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var ans string
	return ans, db.QueryRowContext(ctx, "PRAGMA integrity_check").Scan(&ans)
}

// ArchiveConsistent: for every live object's file, its archive verifies
// and a restore of its last archived point equals the file, content for
// content (so the archive holds every acknowledged commit, in order, once:
// the file holds them, "acknowledged rows readable" says) and is a sound
// database.
func ArchiveConsistent(checks []ArchiveCheck) Result {
	r := Result{Check: "archive of every live database verifies (no gap, doubled or corrupt record) and its last point restores to the file's exact content"}
	for _, c := range checks {
		if c.NoFile {
			continue
		}
		r.Checked++
		where := fmt.Sprintf("%s %s (database %s)", c.Object.Host, c.Object.ObjectID, c.Object.DatabaseUUID)
		switch {
		case c.Err != nil:
			r.Violations = append(r.Violations, fmt.Sprintf("%s: %v", where, c.Err))
		case c.Mismatch != "":
			r.Violations = append(r.Violations, fmt.Sprintf("%s: restore of %s/%d differs from the file: %s", where, c.Latest.Gen, c.Latest.Txid, c.Mismatch))
		case c.Integrity != "ok":
			r.Violations = append(r.Violations, fmt.Sprintf("%s: restore of %s/%d: integrity_check %s", where, c.Latest.Gen, c.Latest.Txid, c.Integrity))
		}
	}
	sort.Strings(r.Violations)
	return r
}

// HostLag is what one object host's GET /v1/history/status showed while
// the object store was down and until its lag recovered.
type HostLag struct {
	MaxLag    float64 // seconds
	Alarm     bool    // the lag alarm was seen raised
	Recovered bool    // after the heal: alarm cleared, lag under the alarm threshold
	Samples   int
	Err       string // the last status read error, if no sample was read
}

// StoreOutage is one object-store outage and what the hosts showed.
type StoreOutage struct {
	Window   Window
	AlarmLag time.Duration
	Hosts    map[string]*HostLag
}

// ArchiveLagAlarm: during every object-store outage long enough for it,
// each host that acknowledged a write at least AlarmLag (plus half a
// second of sampling slack) before the store came back raised its lag
// alarm — the write could not be archived, so the lag passed the
// threshold; and after the heal every host's lag came back under the
// threshold (the backlog shipped). dbHost maps a database to the host of
// its live object.
func ArchiveLagAlarm(ops []traffic.Op, outages []StoreOutage, dbHost map[string]string) Result {
	r := Result{Check: "history lag alarm raised during each object-store outage (hosts with writes), lag recovered after it"}
	var seen []string
	for _, o := range outages {
		latest := o.Window.To - o.AlarmLag - 500*time.Millisecond
		wrote := map[string]bool{}
		for _, op := range ops {
			if (op.Kind == traffic.Insert || op.Kind == traffic.RegWrite) && op.Outcome == traffic.OK &&
				op.Return >= o.Window.From && op.Return <= latest {
				if h, ok := dbHost[op.DB]; ok {
					wrote[h] = true
				}
			}
		}
		var hosts []string
		for h := range o.Hosts {
			hosts = append(hosts, h)
		}
		sort.Strings(hosts)
		for _, h := range hosts {
			l := o.Hosts[h]
			r.Checked++
			seen = append(seen, fmt.Sprintf("%s %s max lag %.1fs alarm %v writes %v", o.Window.Name, h, l.MaxLag, l.Alarm, wrote[h]))
			if wrote[h] && !l.Alarm {
				r.Violations = append(r.Violations, fmt.Sprintf("%s: %s: writes acknowledged ≥ %s before the heal, lag alarm never raised (max lag %.1fs over %d samples%s)",
					o.Window.Name, h, o.AlarmLag, l.MaxLag, l.Samples, errNote(l.Err)))
			}
			if !l.Recovered {
				r.Violations = append(r.Violations, fmt.Sprintf("%s: %s: lag not back under %s after the heal%s", o.Window.Name, h, o.AlarmLag, errNote(l.Err)))
			}
		}
	}
	r.Note = strings.Join(seen, "; ")
	return r
}

func errNote(e string) string {
	if e == "" {
		return ""
	}
	return "; status: " + e
}

// ArchivedAtKill is what the archive held of an archived host's databases
// (durability = "archived") while the host was down after a kill -9,
// read before it restarted: the host can ship nothing more, so each write
// it acknowledged must already be there. Only the databases with
// acknowledged inserts are read (table t's column v at the archive's
// newest point); register databases are left out (time-travel restores
// rewind them, so their newest value says little).
type ArchivedAtKill struct {
	Host string
	When string
	// Acked: per database, the values of the inserts acknowledged by the
	// time of the read (the host was down, so all of them before the
	// kill).
	Acked map[string][]int64
	// Values: per database, v of table t at the archive's newest point;
	// Errs: the databases whose archive could not be read or restored.
	Values map[string]map[int64]bool
	Errs   map[string]string
	// Excused: not checked, and why (the object store was stopped at the
	// kill). SkippedDBs: databases left out because the store lost
	// objects of their archive earlier in the schedule (their newest
	// point can lie behind a hole until the host heals it, after its
	// restart).
	Excused    string
	SkippedDBs int
}

// ArchivedValues reads v of table t at db's newest archived point: a
// restore of that point into a temporary file (history.Archive.Restore).
// A database whose newest point has no table t reads as no values.
func ArchivedValues(ctx context.Context, a *history.Archive, db string) (map[int64]bool, error) {
	p, err := a.Latest(ctx, db)
	if err != nil {
		return nil, fmt.Errorf("latest: %w", err)
	}
	tmp, err := os.MkdirTemp("", "shoal-archived-values-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	dst := filepath.Join(tmp, "restored.db")
	if _, err := a.Restore(ctx, db, p, dst); err != nil {
		return nil, fmt.Errorf("restore of %s/%d: %w", p.Gen, p.Txid, err)
	}
	return FileValues(Object{Path: dst})
}

// ArchivedWritesKept: at every kill -9 of an archived host, every insert
// it had acknowledged is in the archive's newest point of its database,
// read before the host restarted — what tells "archived" from the default
// durability, whose backlog of acknowledged writes waits on the host's
// disk and ships after the restart (the end-of-run archive comparison
// cannot tell the two apart).
func ArchivedWritesKept(kills []ArchivedAtKill) Result {
	r := Result{Check: "durability = archived: every insert the archived host acknowledged is in the archive at each kill -9 of it, before its restart"}
	excused, skipped := 0, 0
	for _, k := range kills {
		skipped += k.SkippedDBs
		if k.Excused != "" {
			excused++
			continue
		}
		dbs := make([]string, 0, len(k.Acked))
		for db := range k.Acked {
			dbs = append(dbs, db)
		}
		sort.Strings(dbs)
		for _, db := range dbs {
			if e, ok := k.Errs[db]; ok {
				r.Checked++
				r.Violations = append(r.Violations, fmt.Sprintf("%s %s: database %s: archive unreadable: %s", k.Host, k.When, db, e))
				continue
			}
			var missing []int64
			for _, v := range k.Acked[db] {
				r.Checked++
				if !k.Values[db][v] {
					missing = append(missing, v)
				}
			}
			if len(missing) > 0 {
				r.Violations = append(r.Violations, fmt.Sprintf("%s %s: database %s: %d acknowledged inserts not in the archive (values %v)", k.Host, k.When, db, len(missing), head(missing, 10)))
			}
		}
	}
	r.Note = fmt.Sprintf("%d kills of the archived host read, %d excused (the store stopped), %d databases left out (the store had lost objects of their archive)", len(kills)-excused, excused, skipped)
	return r
}

func head(vs []int64, n int) []int64 {
	if len(vs) > n {
		return vs[:n]
	}
	return vs
}
