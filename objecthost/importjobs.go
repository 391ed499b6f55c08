package objecthost

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/shoaldb/shoal/internal/durable"
	"github.com/shoaldb/shoal/objecthost/sqlexec"
)

// Import jobs outlive the process that ran them (objecthost/DESIGN.md,
// "import jobs"). Two durable records, each the checkpoint of one fact:
//
//   - the job file <dir>/imports/<object>/jobs/<filename>.json, written with
//     fsync when the ingest is accepted (status "active": the job exists)
//     and again when it ends (its final status and meta);
//   - the row of the database's own table _shoal_imports, written INSIDE the
//     import's transaction (sqlexec ScriptOptions.Record): "the import
//     committed" and "its record says complete" are one SQLite commit and
//     can never disagree.
//
// A host that died between the COMMIT and the job file's final write finds
// the file still "active" with no job running: the row decides — there, the
// import applied (complete, with the meta the row holds); absent, it did not
// (all or nothing) and the job is failed with a message saying so. The row
// travels with the database (time travel, the archive, a relocation), so a
// poll on the database's new host answers a committed import as complete.

// jobRetention is how long a finished import's status is answered: in
// memory, in its job file and in the database's _shoal_imports (rows older
// than it are pruned by the next import's transaction and ignored when
// read). D1's upload URLs live an hour; a day covers any client's polling.
const jobRetention = 24 * time.Hour

// importsTable is the database's record of its imports: one row per import
// that committed, reserved (_shoal_*: user SQL can neither read nor write
// it, exports skip it, num_tables does not count it).
const importsTable = "_shoal_imports"

// interruptedMsg is the error of a job its host stopped running without
// finishing it (a crash or kill mid-ingest, found at the next poll).
const interruptedMsg = "import interrupted: the object host stopped before the import committed; nothing was imported (an import is all or nothing): run it again"

// jobFile is the content of an import's job file.
type jobFile struct {
	DatabaseUUID string `json:"database_uuid"`
	// Incarnation names the host process that wrote the file: an active
	// job of this process is running (or its start failed as the host
	// closed), never "interrupted".
	Incarnation string       `json:"incarnation"`
	FinishedUs  int64        `json:"finished_us,omitempty"` // 0 while active
	Status      ImportStatus `json:"status"`
}

// incarnation is this process's name in job files (random, made once).
func (d *dumpAPI) incarnation() string {
	d.incOnce.Do(func() {
		var b [8]byte
		_, _ = rand.Read(b[:])
		d.inc = hex.EncodeToString(b[:])
	})
	return d.inc
}

func (d *dumpAPI) jobPath(id, filename string) string {
	return filepath.Join(d.uploadDir(id), "jobs", filename+".json")
}

// saveJob writes j's job file durably (temp file, fsync, rename, fsync of
// the directory): after it returns, a restart finds this status.
func (d *dumpAPI) saveJob(id, uuid string, j *importJob) error {
	st := j.snapshot()
	jf := jobFile{DatabaseUUID: uuid, Incarnation: d.incarnation(), Status: st}
	if st.Status != "active" {
		jf.FinishedUs = j.finished.UnixMicro()
	}
	b, err := json.Marshal(jf)
	if err != nil {
		return err
	}
	return writeFileSync(d.jobPath(id, j.filename), b)
}

// loadJob reads a job file; nil when there is none (or it expired).
func (d *dumpAPI) loadJob(id, filename string) *jobFile {
	b, err := os.ReadFile(d.jobPath(id, filename))
	if err != nil {
		return nil
	}
	var jf jobFile
	if json.Unmarshal(b, &jf) != nil || jf.Status.Type != "import" {
		return nil
	}
	if jf.FinishedUs != 0 && d.h.now().Sub(time.UnixMicro(jf.FinishedUs)) > jobRetention {
		return nil
	}
	return &jf
}

// importRecord is the job's row in _shoal_imports, committed by the import's
// own transaction: table created on first use, rows past jobRetention
// pruned, this one written with the status the job will end with.
func importRecord(uuid, filename string, finished time.Time, st ImportStatus) []sqlexec.InternalStatement {
	b, _ := json.Marshal(st) // plain structs: cannot fail
	us := finished.UnixMicro()
	return []sqlexec.InternalStatement{
		{SQL: "CREATE TABLE IF NOT EXISTS " + importsTable + " (filename TEXT PRIMARY KEY, database_uuid TEXT NOT NULL, finished_us INTEGER NOT NULL, status TEXT NOT NULL)"},
		{SQL: "DELETE FROM " + importsTable + " WHERE finished_us < CAST(? AS INTEGER)", Args: []string{strconv.FormatInt(us-jobRetention.Microseconds(), 10)}},
		{SQL: "INSERT OR REPLACE INTO " + importsTable + " (filename, database_uuid, finished_us, status) VALUES (?, ?, CAST(? AS INTEGER), ?)",
			Args: []string{filename, uuid, strconv.FormatInt(us, 10), string(b)}},
	}
}

// committedRecord reads the import's row from the object's database: its
// status (complete) when the import committed on this database, nil when
// it did not (or the row expired, or belongs to the database this one was
// forked from). It never creates the database file.
func (d *dumpAPI) committedRecord(o *object, m *Meta, filename string) (*ImportStatus, error) {
	if _, err := os.Stat(d.h.path(m.ObjectID)); errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	hd, err := d.h.handles.acquire(m.ObjectID)
	if err != nil {
		return nil, err
	}
	defer d.h.handles.release(hd)
	n, err := hd.db.InternalStrings("SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = ?", importsTable)
	if err != nil || len(n) != 1 || n[0] == "0" {
		return nil, err
	}
	row, err := hd.db.InternalStrings("SELECT database_uuid, finished_us, status FROM "+importsTable+" WHERE filename = ?", filename)
	if err != nil || len(row) != 3 {
		return nil, err
	}
	us, _ := strconv.ParseInt(row[1], 10, 64)
	if row[0] != m.DatabaseUUID || d.h.now().Sub(time.UnixMicro(us)) > jobRetention {
		return nil, nil
	}
	var st ImportStatus
	if err := json.Unmarshal([]byte(row[2]), &st); err != nil {
		return nil, fmt.Errorf("import record of %s: %w", filename, err)
	}
	return &st, nil
}

// recoverJob answers for an import this process does not hold in memory
// (the host restarted, or the database moved here): from its job file, and
// for a job file left "active" or missing, from the database's own record.
// A job resolved here is kept in memory (and its file rewritten final), so
// later polls answer the same without reading the database. nil: no such
// import on this database (never, expired, or not committed on this copy
// of a relocated or restored database and never run on this host). With
// needFile, an import without a job file is nil without reading the
// database (an ingest's cheap check: every new job has none).
//
// locked says the caller holds d.mu (the ingest does, the poll does not).
func (d *dumpAPI) recoverJob(o *object, m *Meta, filename string, needFile, locked bool) (*importJob, error) {
	jf := d.loadJob(m.ObjectID, filename)
	if jf != nil && jf.DatabaseUUID != m.DatabaseUUID {
		jf = nil
	}
	if jf == nil && needFile {
		return nil, nil
	}
	if jf != nil && jf.Status.Status == "active" && jf.Incarnation == d.incarnation() {
		// Started by this process: it is the job in memory (a poll that
		// raced its ingest finds it once the ingest released d.mu), or
		// none if its start failed because the host is closing. Never
		// resolved as interrupted while it may be running.
		if !locked {
			d.mu.Lock()
			defer d.mu.Unlock()
		}
		if j := d.jobs[m.ObjectID]; j != nil && j.filename == filename {
			return j, nil
		}
		return nil, nil
	}
	if jf != nil && jf.Status.Status != "active" {
		return &importJob{filename: filename, status: jf.Status, finished: time.UnixMicro(jf.FinishedUs)}, nil
	}
	st, err := d.committedRecord(o, m, filename)
	if err != nil {
		return nil, err
	}
	j := &importJob{filename: filename, finished: d.h.now()}
	switch {
	case st != nil: // committed; the host died before the job file said so
		j.status = *st
		j.status.Messages = append(j.status.Messages, "(status recovered from the database's record of the import after an object host restart)")
	case jf != nil: // active in the file, not running, not committed
		j.status = jf.Status
		j.status.Status, j.status.Error = "error", interruptedMsg
		j.status.Messages = append(j.status.Messages, interruptedMsg)
		// The upload a killed job left behind is never ingested again
		// (its job failed): free the space now.
		path := filepath.Join(d.uploadDir(m.ObjectID), filename)
		_ = os.Remove(path)
		_ = os.Remove(path + ".md5")
	default:
		return nil, nil
	}
	if jf != nil {
		// Best effort: without it the next restart resolves the same way.
		if err := d.saveJob(m.ObjectID, m.DatabaseUUID, j); err != nil {
			d.h.log.Warn("import job file not rewritten", "object", m.ObjectID, "err", err)
		}
	}
	return j, nil
}

// expireJobs drops finished jobs older than jobRetention from memory
// (d.mu held). Called at each ingest: imports are rare, the map small.
func (d *dumpAPI) expireJobs() {
	now := d.h.now()
	for id, j := range d.jobs {
		j.mu.Lock()
		old := j.status.Status != "active" && now.Sub(j.finished) > jobRetention
		j.mu.Unlock()
		if old {
			delete(d.jobs, id)
		}
	}
}

// writeFileSync replaces path with b durably (internal/durable), creating
// its directory first.
func writeFileSync(path string, b []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return durable.WriteBytes(path, b)
}
