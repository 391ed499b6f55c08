package objecthost

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/shoaldb/shoal/internal/durable"
	"github.com/shoaldb/shoal/objecthost/history"
	"github.com/shoaldb/shoal/objecthost/sqlexec"
)

// Import jobs outlive the process that ran them (objecthost/DESIGN.md,
// "import jobs"). Each step's durable record, and what a crash after it
// leaves:
//
//  1. ingest accepted: the job file <dir>/imports/<object>/jobs/<file>.json,
//     written with fsync, status "active" (checkpoint: the job exists).
//     A crash before step 3 is answered "interrupted: nothing was
//     imported".
//  2. every statement ran, just before the COMMIT, inside the import's
//     transaction (sqlexec ScriptOptions.Record): the job file again, now
//     with its commit block — the status the job ends with if it commits
//     (complete, its meta), a random tag and the history position before
//     the import — fsynced; then the transaction sets the database
//     header's application_id to the tag. If the file cannot be written
//     the import rolls back.
//  3. the COMMIT (checkpoint: the import applied). "The import committed"
//     and "the header carries its tag" are one SQLite commit and can never
//     disagree, and the header is nowhere user SQL can see it (PRAGMA
//     application_id is not allowed; no table, nothing in sqlite_schema,
//     no page of its own).
//  4. the job file rewritten with the final status (and final_bookmark).
//
// A host that died between 2 and 4 finds the file still "active" with a
// commit block and no job running: the header decides — its tag there, the
// import applied (complete, with the status of the commit block); not
// there, it did not (all or nothing). Only an import's own transaction and
// a time-travel restore change application_id, and both first resolve the
// object's job files left by a dead process (resolveDead), so a later
// import cannot hide an earlier one's tag.
//
// The job file is the host's: a database restored on another host (a
// relocation off a lost host) or forked does not answer its imports.

// jobRetention is how long a finished import's status is answered, counted
// from the job's end (in memory and in its job file). A job that has not
// ended is never expired.
const jobRetention = 24 * time.Hour

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
	// Commit is written just before the import's COMMIT (step 2 above).
	Commit *jobCommit `json:"commit,omitempty"`
}

// jobCommit is what a job file says once its import is about to commit.
type jobCommit struct {
	// Tag is the database's application_id the import's transaction sets
	// (never 0, never the value before the import).
	Tag int32 `json:"tag"`
	// FinishedUs and Status are the job's end and final status if the
	// COMMIT happens (final_bookmark is not known before it).
	FinishedUs int64        `json:"finished_us"`
	Status     ImportStatus `json:"status"`
	// PrevGen/PrevTxid is the database's history position just before the
	// import's transaction (with history): its commit is the next one, so
	// a recovered job finds its final_bookmark in the archive.
	PrevGen  string `json:"prev_gen,omitempty"`
	PrevTxid uint64 `json:"prev_txid,omitempty"`
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
	j.mu.Lock()
	jf := jobFile{DatabaseUUID: uuid, Incarnation: d.incarnation(), Status: st, Commit: j.commit}
	if st.Status != "active" {
		jf.FinishedUs = j.finished.UnixMicro()
	}
	j.mu.Unlock()
	b, err := json.Marshal(jf)
	if err != nil {
		return err
	}
	return writeFileSync(d.jobPath(id, j.filename), b)
}

// readJob reads a job file as it is (nil if missing or unreadable).
func readJob(path string) *jobFile {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var jf jobFile
	if json.Unmarshal(b, &jf) != nil || jf.Status.Type != "import" {
		return nil
	}
	return &jf
}

// expired reports whether a job file's job ended over jobRetention ago.
func (d *dumpAPI) expired(jf *jobFile) bool {
	return jf.FinishedUs != 0 && d.h.now().Sub(time.UnixMicro(jf.FinishedUs)) > jobRetention
}

// loadJob reads a job file; nil when there is none (or it expired).
func (d *dumpAPI) loadJob(id, filename string) *jobFile {
	jf := readJob(d.jobPath(id, filename))
	if jf == nil || d.expired(jf) {
		return nil
	}
	return jf
}

// importTag picks the application_id an import's transaction sets: random,
// never 0 (a fresh database's) nor before (the database's value now).
func importTag(before int32) int32 {
	for {
		var b [4]byte
		_, _ = rand.Read(b[:])
		t := int32(binary.BigEndian.Uint32(b[:]))
		if t != 0 && t != before {
			return t
		}
	}
}

// appID reads the database's application_id (0 for a database file that
// does not exist: it is never created here).
func (d *dumpAPI) appID(m *Meta) (int32, error) {
	if _, err := os.Stat(d.h.path(m.ObjectID)); errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	hd, err := d.h.handles.acquire(m.ObjectID)
	if err != nil {
		return 0, err
	}
	defer d.h.handles.release(hd)
	return dbAppID(hd.db.DB)
}

// dbAppID reads db's application_id on a reader connection.
func dbAppID(db *sqlexec.DB) (int32, error) {
	v, err := db.InternalStrings("SELECT application_id FROM pragma_application_id WHERE ? = ''", "")
	if err != nil {
		return 0, err
	}
	if len(v) != 1 {
		return 0, fmt.Errorf("application_id: %d values", len(v))
	}
	n, err := strconv.ParseInt(v[0], 10, 32)
	return int32(n), err
}

// recoveredBookmark is the final_bookmark of an import that committed
// while its host died before saying so: the history position right after
// jc's (the import's own commit), from the live capturer when nothing
// committed since, else from the archive (waited for briefly: shipping
// runs behind the commits). Without history, or when neither knows it, the
// upload's name, as for a host without history.
func (d *dumpAPI) recoveredBookmark(m *Meta, filename string, jc *jobCommit) string {
	hh := d.h.hist
	if hh == nil || jc.PrevGen == "" {
		return filename
	}
	c, release, err := d.h.current(m.ObjectID)
	if err != nil {
		return filename
	}
	defer release()
	prev := history.Position{Gen: jc.PrevGen, Txid: jc.PrevTxid}
	if cur, err := c.Exact(); err == nil && cur.Gen == prev.Gen && cur.Txid == prev.Txid+1 {
		return string(history.MakeBookmark(c.Key(), cur))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for {
		p, err := hh.archive.Next(ctx, c.Key(), prev)
		if err == nil {
			return string(history.MakeBookmark(c.Key(), p))
		}
		if ctx.Err() != nil {
			d.h.log.Warn("recovered import: its bookmark is not in the archive yet; final_bookmark is the upload's name", "object", m.ObjectID, "file", filename, "err", err)
			return filename
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// recoverJob answers for an import this process does not hold in memory
// (the host restarted) from its job file: final, it is the answer; left
// "active" by a dead process, the database header decides (see above). A
// job resolved here has its file rewritten final, so later polls answer
// the same without reading the database. nil: no such import on this
// database (never run on this host, or expired).
//
// The caller holds d.mu, for the whole resolution: reading the file and
// the header, and rewriting the file, must not interleave with an ingest
// that starts an import (which changes the header) or another resolution.
// A resolution may open the database and, for a committed import's
// bookmark, wait up to 5 s for the archive: rare (a crash between an
// import's commit step and its end), and only then.
func (d *dumpAPI) recoverJob(m *Meta, filename string) (*importJob, error) {
	jf := d.loadJob(m.ObjectID, filename)
	if jf == nil || jf.DatabaseUUID != m.DatabaseUUID {
		return nil, nil
	}
	if jf.Status.Status == "active" && jf.Incarnation == d.incarnation() {
		// Started by this process: it is the job in memory (a poll that
		// raced its ingest finds it once the ingest released d.mu), or
		// none if its start failed because the host is closing. Never
		// resolved as interrupted while it may be running.
		if j := d.jobs[m.ObjectID]; j != nil && j.filename == filename {
			return j, nil
		}
		return nil, nil
	}
	if jf.Status.Status != "active" {
		return &importJob{filename: filename, status: jf.Status, finished: time.UnixMicro(jf.FinishedUs), commit: jf.Commit}, nil
	}
	j := &importJob{filename: filename, finished: d.h.now(), commit: jf.Commit}
	committed := false
	if jc := jf.Commit; jc != nil { // it reached its COMMIT step: did the COMMIT happen?
		id, err := d.appID(m)
		if err != nil {
			return nil, err
		}
		committed = id == jc.Tag
	}
	if committed {
		jc := jf.Commit
		j.status, j.finished = jc.Status, time.UnixMicro(jc.FinishedUs)
		if j.status.Result != nil {
			r := *j.status.Result
			r.FinalBookmark = d.recoveredBookmark(m, filename, jc)
			j.status.Result = &r
		}
		j.status.Messages = append(j.status.Messages, "(status recovered after an object host restart: the import committed before the host stopped)")
	} else {
		j.status = jf.Status
		j.status.Status, j.status.Error = "error", interruptedMsg
		j.status.Messages = append(j.status.Messages, interruptedMsg)
		// The upload a killed job left behind is never ingested again
		// (its job failed): free the space now.
		path := filepath.Join(d.uploadDir(m.ObjectID), filename)
		_ = os.Remove(path)
		_ = os.Remove(path + ".md5")
	}
	// Best effort: without it the next restart resolves the same way.
	if err := d.saveJob(m.ObjectID, m.DatabaseUUID, j); err != nil {
		d.h.log.Warn("import job file not rewritten", "object", m.ObjectID, "err", err)
	}
	return j, nil
}

// resolveDead resolves every job file of the object left "active" by a
// dead process (recoverJob), before anything that changes the database's
// application_id — an import, a time-travel restore — could hide whether
// those imports committed. Normally there is none: a cheap directory read.
// The caller holds d.mu.
func (d *dumpAPI) resolveDead(m *Meta) error {
	dir := filepath.Join(d.uploadDir(m.ObjectID), "jobs")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil // no jobs directory: nothing to resolve
	}
	for _, e := range ents {
		name, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || !validFilename(name) {
			continue
		}
		jf := readJob(filepath.Join(dir, e.Name()))
		if jf == nil || jf.Status.Status != "active" || jf.Incarnation == d.incarnation() || jf.DatabaseUUID != m.DatabaseUUID {
			continue
		}
		if _, err := d.recoverJob(m, name); err != nil {
			return fmt.Errorf("import job %s: %w", name, err)
		}
	}
	return nil
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
