package validate

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"time"

	_ "github.com/mattn/go-sqlite3" // PRAGMA integrity_check on copies of the hosts' files

	"github.com/shoaldb/shoal/objecthost"
)

// Object is one object an object host keeps in its index (objecthost.Meta:
// the fields the checks need), and where its SQLite file is.
type Object struct {
	Host         string
	ObjectID     string `json:"object_id"`
	DatabaseUUID string `json:"database_uuid"`
	AccountID    string `json:"account_id"`
	State        string `json:"state"`
	Confirmed    bool   `json:"confirmed"`
	// CreatedAt and DeletedAt are the host's clock at the object's init
	// and at its marking deleted (zero: not deleted).
	CreatedAt time.Time `json:"created_at"`
	DeletedAt time.Time `json:"deleted_at"`
	Path      string
}

// Live reports whether the host serves the object (state active).
func (o Object) Live() bool { return o.State == "active" }

// HostObjects reads the object index a host left in dir (index.db, bbolt,
// and its journal: objecthost.ReadIndex, what the host loads at its next
// start). The host must not be running: bbolt's lock is exclusive.
func HostObjects(host, dir string) ([]Object, error) {
	var out []Object
	err := objecthost.ReadIndex(dir, func(m *objecthost.Meta) error {
		o := Object{Host: host, ObjectID: m.ObjectID, DatabaseUUID: m.DatabaseUUID, AccountID: m.AccountID,
			State: m.State, Confirmed: m.Confirmed, CreatedAt: m.CreatedAt, DeletedAt: m.DeletedAt}
		if len(o.ObjectID) >= 4 {
			o.Path = filepath.Join(dir, "dbs", o.ObjectID[0:2], o.ObjectID[2:4], o.ObjectID+".db")
		}
		out = append(out, o)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("%s index: %w", host, err)
	}
	return out, nil
}

// Integrity is PRAGMA integrity_check of one object's file.
type Integrity struct {
	Object Object
	When   string // e.g. "after kill -9 of h1 at 12.3s", "final"
	Answer string // "ok" when clean; "no file" for an object never opened
	Err    error  // the file could not be checked
}

// IntegrityCheck copies the object's file with its WAL (the host's own files
// stay untouched, and a WAL left by a kill is replayed into the copy as a
// restart would) and runs PRAGMA integrity_check on the copy.
func IntegrityCheck(o Object, when string) Integrity {
	res := Integrity{Object: o, When: when}
	tmp, err := os.MkdirTemp("", "shoal-integrity-")
	if err != nil {
		res.Err = err
		return res
	}
	defer os.RemoveAll(tmp)
	dst := filepath.Join(tmp, "copy.db")
	if _, err := os.Stat(o.Path); os.IsNotExist(err) {
		// An object is a file only once it is first opened (its first
		// query): an orphan, or a database whose create answer was lost
		// and that nobody queried, has none. A file lost after serving
		// shows as lost rows ("acknowledged rows readable").
		res.Answer = "no file"
		return res
	}
	for _, suffix := range []string{"", "-wal"} {
		if err := copyFile(o.Path+suffix, dst+suffix); err != nil && !(suffix != "" && os.IsNotExist(err)) {
			res.Err = err
			return res
		}
	}
	db, err := sql.Open("sqlite3", "file:"+dst)
	if err != nil {
		res.Err = err
		return res
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res.Err = db.QueryRowContext(ctx, "PRAGMA integrity_check").Scan(&res.Answer)
	return res
}

// FileValues reads column v of table t from a copy of the object's file
// with its WAL (the host must be down): what it holds after a kill -9,
// WAL replayed. An object never opened has no file: no values, no error.
func FileValues(o Object) (map[int64]bool, error) {
	out := map[int64]bool{}
	if _, err := os.Stat(o.Path); os.IsNotExist(err) {
		return out, nil
	}
	tmp, err := os.MkdirTemp("", "shoal-values-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	dst := filepath.Join(tmp, "copy.db")
	for _, suffix := range []string{"", "-wal"} {
		if err := copyFile(o.Path+suffix, dst+suffix); err != nil && !(suffix != "" && os.IsNotExist(err)) {
			return nil, err
		}
	}
	db, err := sql.Open("sqlite3", "file:"+dst)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	// A database without table t (an import's: traffic.Import) holds no
	// value of t; a database of the load that lost its table is caught by
	// its acknowledged values, absent from the empty answer.
	var tables int
	if err := db.QueryRow("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 't'").Scan(&tables); err != nil {
		return nil, fmt.Errorf("%s/%s: %w", o.Host, o.ObjectID, err)
	}
	if tables == 0 {
		return out, nil
	}
	rows, err := db.Query("SELECT v FROM t")
	if err != nil {
		return nil, fmt.Errorf("%s/%s: %w", o.Host, o.ObjectID, err)
	}
	defer rows.Close()
	for rows.Next() {
		var v int64
		if err := rows.Scan(&v); err != nil {
			return nil, err
		}
		out[v] = true
	}
	return out, rows.Err()
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// IntegrityClean: every checked file answered "ok".
func IntegrityClean(checks []Integrity) Result {
	r := Result{Check: "PRAGMA integrity_check clean on every live object's file after every host kill and at the end"}
	for _, c := range checks {
		if c.Err == nil && c.Answer == "no file" {
			continue
		}
		r.Checked++
		switch {
		case c.Err != nil:
			r.Violations = append(r.Violations, fmt.Sprintf("%s %s (%s): %v", c.Object.Host, c.Object.ObjectID, c.When, c.Err))
		case c.Answer != "ok":
			r.Violations = append(r.Violations, fmt.Sprintf("%s %s (%s): %s", c.Object.Host, c.Object.ObjectID, c.When, c.Answer))
		}
	}
	sort.Strings(r.Violations)
	return r
}

// CatalogRow is what the catalog's linearizable read says of a database.
type CatalogRow struct {
	Found    bool
	Active   bool
	ObjectID string
	HostID   string
}

// OneLiveObject: no database has two live objects on the hosts.
func OneLiveObject(objs []Object) Result {
	r := Result{Check: "never two live objects for one database"}
	live := map[string][]Object{}
	for _, o := range objs {
		if o.Live() {
			live[o.DatabaseUUID] = append(live[o.DatabaseUUID], o)
		}
	}
	for db, os := range live {
		r.Checked++
		if len(os) > 1 {
			var where []string
			for _, o := range os {
				where = append(where, o.Host+"/"+o.ObjectID)
			}
			r.Violations = append(r.Violations, fmt.Sprintf("%s: %d live objects %v", db, len(os), where))
		}
	}
	sort.Strings(r.Violations)
	return r
}

// OrphansConverged: once the creation grace and heartbeats have passed,
// every live object is the one the catalog names for an active database
// (the orphans of failed create attempts and the objects of deleted
// databases have marked themselves deleted); and every active database the
// catalog names has its object live on its host (a live database is never
// deleted). catalog holds the catalog's linearizable answer for every
// database UUID of the checked accounts; objects of other accounts are
// ignored.
//
// held is, per host, how many verdicts its last pass held with a
// mass_orphans alarm (the brake of objecthost/DESIGN.md: a mass of
// destructive verdicts waits for an operator): that many of its live,
// never-confirmed orphans are accepted, and counted in the check's name.
func OrphansConverged(objs []Object, catalog map[string]CatalogRow, accounts map[string]bool, held map[string]int) Result {
	r := Result{Check: "orphans converged, and every active database has its live object"}
	excused := 0
	liveByObject := map[string]Object{}
	for _, o := range objs {
		if !accounts[o.AccountID] {
			continue
		}
		if o.Live() {
			liveByObject[o.ObjectID] = o
			r.Checked++
			row, ok := catalog[o.DatabaseUUID]
			switch {
			case !ok:
				r.Violations = append(r.Violations, fmt.Sprintf("%s/%s (database %s): live, the catalog was not asked", o.Host, o.ObjectID, o.DatabaseUUID))
			case (!row.Found || !row.Active) && !o.Confirmed && held[o.Host] > 0:
				held[o.Host]--
				excused++
			case !row.Found || !row.Active:
				r.Violations = append(r.Violations, fmt.Sprintf("%s/%s (database %s): live orphan, catalog found=%v active=%v", o.Host, o.ObjectID, o.DatabaseUUID, row.Found, row.Active))
			case row.ObjectID != o.ObjectID:
				r.Violations = append(r.Violations, fmt.Sprintf("%s/%s (database %s): live, but the catalog names object %s", o.Host, o.ObjectID, o.DatabaseUUID, row.ObjectID))
			}
		}
	}
	for db, row := range catalog {
		if !row.Active {
			continue
		}
		r.Checked++
		o, ok := liveByObject[row.ObjectID]
		switch {
		case !ok:
			r.Violations = append(r.Violations, fmt.Sprintf("database %s: active in the catalog, its object %s is not live on any host", db, row.ObjectID))
		case o.Host != row.HostID:
			r.Violations = append(r.Violations, fmt.Sprintf("database %s: object %s live on %s, the catalog says %s", db, row.ObjectID, o.Host, row.HostID))
		}
	}
	if excused > 0 {
		r.Check += fmt.Sprintf(" (%d orphans held by a host's mass-orphan brake, alarm raised)", excused)
	}
	sort.Strings(r.Violations)
	return r
}

// UsedBytes is the object's size as its host publishes it — the pages in
// use, (page_count − freelist_count) × page_size, sqlexec's size_after —
// read from a copy of its file with its WAL (the host must be down): what
// it holds after a kill -9, WAL replayed. An object never opened has no
// file: 0, no error.
func UsedBytes(o Object) (int64, error) {
	if _, err := os.Stat(o.Path); os.IsNotExist(err) {
		return 0, nil
	}
	tmp, err := os.MkdirTemp("", "shoal-size-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(tmp)
	dst := filepath.Join(tmp, "copy.db")
	for _, suffix := range []string{"", "-wal"} {
		if err := copyFile(o.Path+suffix, dst+suffix); err != nil && !(suffix != "" && os.IsNotExist(err)) {
			return 0, err
		}
	}
	db, err := sql.Open("sqlite3", "file:"+dst)
	if err != nil {
		return 0, err
	}
	defer db.Close()
	var n int64
	err = db.QueryRow("SELECT (p.page_count - f.freelist_count) * s.page_size FROM pragma_page_count() p, pragma_freelist_count() f, pragma_page_size() s").Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("%s/%s: %w", o.Host, o.ObjectID, err)
	}
	return n, nil
}
