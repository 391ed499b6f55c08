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
//  4. the job file rewritten with the final status (and final_bookmark),
//     then the job answers it. If that write fails the job answers
//     complete all the same (it committed; the commit block and the tag
//     say so to a later process), but until a retried write succeeds the
//     tag is the only record of the COMMIT, so imports and restores of the
//     database are refused (rewriteUnsaved, errJobNotRewritten).
//
// A host that died between 2 and 4 finds the file still "active" with a
// commit block and no job running: the header decides — its tag there, the
// import applied (complete, with the status of the commit block); not
// there, it did not (all or nothing). Only an import's own transaction and
// a time-travel restore change application_id, and both first resolve the
// object's job files left by a dead process (resolveDead), so a later
// import cannot hide an earlier one's tag. The decision is made under
// dumpAPI.mu; a committed import's final_bookmark, when it must come from
// the archive (≤ 5 s), is looked up outside it, the job "resolving"
// meanwhile, and an import or restore of that database waits for it
// (recoverJob, awaitResolved). The checkpoint stays the COMMIT: a crash
// during the lookup or before the rewrite is decided the same way again.
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
	if d.hooks.saveJob != nil {
		if err := d.hooks.saveJob(j.filename); err != nil {
			return err
		}
	}
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

// bookmarkLookupWait bounds how long a recovered import's bookmark
// lookup waits for the archive to ship the import's commit.
const bookmarkLookupWait = 5 * time.Second

// recoveredMsg ends the messages of an import whose COMMIT a restarted
// host found in the database header.
const recoveredMsg = "(status recovered after an object host restart: the import committed before the host stopped)"

// recoveringMsg follows recoveredMsg while the import's final_bookmark is
// looked up in the archive: the status stays "active" until then. The
// messages answered meanwhile are a prefix of the final ones (the edge
// hands clients only the messages they have not seen, by count).
const recoveringMsg = "Its status is being recovered: looking up the import's final bookmark in the archive"

// liveBookmark is the final_bookmark of an import that committed while its
// host died before saying so, when it needs no archive: the upload's name
// without history; the live capturer's position when nothing committed
// since the import (the history position right after jc's). ok is false
// when the archive must be asked (archiveBookmark); key is then the
// database's history key. Quick (it opens the database if it is not
// open): called under d.mu.
func (d *dumpAPI) liveBookmark(m *Meta, filename string, jc *jobCommit) (bm, key string, ok bool) {
	if d.h.hist == nil || jc.PrevGen == "" {
		return filename, "", true
	}
	c, release, err := d.h.current(m.ObjectID)
	if err != nil {
		return filename, "", true
	}
	defer release()
	prev := history.Position{Gen: jc.PrevGen, Txid: jc.PrevTxid}
	if cur, err := c.Exact(); err == nil && cur.Gen == prev.Gen && cur.Txid == prev.Txid+1 {
		return string(history.MakeBookmark(c.Key(), cur)), "", true
	}
	return "", c.Key(), false
}

// archiveBookmark is the final_bookmark liveBookmark could not give: the
// record after jc's position in the archive, waited for up to
// bookmarkLookupWait (shipping runs behind the commits), else the upload's
// name, as for a host without history. Slow: never called under d.mu.
// ok is false when the host closed meanwhile (nothing is known).
func (d *dumpAPI) archiveBookmark(m *Meta, filename, key string, jc *jobCommit) (bm string, ok bool) {
	if d.hooks.archiveLookup != nil {
		d.hooks.archiveLookup()
	}
	prev := history.Position{Gen: jc.PrevGen, Txid: jc.PrevTxid}
	ctx, cancel := context.WithTimeout(context.Background(), bookmarkLookupWait)
	defer cancel()
	for {
		p, err := d.h.hist.archive.Next(ctx, key, prev)
		if err == nil {
			return string(history.MakeBookmark(key, p)), true
		}
		if d.h.closed.Load() {
			return "", false
		}
		if ctx.Err() != nil {
			d.h.log.Warn("recovered import: its bookmark is not in the archive yet; final_bookmark is the upload's name", "object", m.ObjectID, "file", filename, "err", err)
			return filename, true
		}
		t := time.NewTimer(100 * time.Millisecond)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
	}
}

// recoverJob answers for an import this process does not hold in memory
// (the host restarted) from its job file: final, it is the answer; left
// "active" by a dead process, the database header decides (see above). A
// job resolved here has its file rewritten final, so later polls answer
// the same without reading the database. nil: no such import on this
// database (never run on this host, or expired).
//
// The caller holds d.mu. The DECISION — reading the file and the header —
// is made under it: it must not interleave with an ingest that starts an
// import or a restore (both change the header) or with another resolution.
// The slow part, a committed import's final_bookmark from the archive
// (≤ bookmarkLookupWait), runs outside d.mu (resolveBookmark), so the
// host's other imports and polls never wait on it: meanwhile the job is
// "resolving" — in d.resolving and d.jobs, answered "active" (a second
// poll gets the same job, no second lookup), and an ingest of another file
// or a restore of that database waits for it (handleIngest, awaitResolved;
// resolveDead reports it open): until the job file is rewritten, the
// header is the only record of the COMMIT.
// ErrClosed: the host is closing and could not start the lookup.
func (d *dumpAPI) recoverJob(m *Meta, filename string) (*importJob, error) {
	if j := d.resolving[m.ObjectID][filename]; j != nil {
		return j, nil // its lookup is running: never a second one
	}
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
	if !committed {
		j.status = jf.Status
		j.status.Status, j.status.Error = "error", interruptedMsg
		j.status.Messages = append(j.status.Messages, interruptedMsg)
		// The upload a killed job left behind is never ingested again
		// (its job failed): free the space now.
		path := filepath.Join(d.uploadDir(m.ObjectID), filename)
		_ = os.Remove(path)
		_ = os.Remove(path + ".md5")
		// Best effort: without it the next resolution decides the same
		// (the header does not carry this job's tag, and no later tag
		// is this one's).
		if err := d.saveJob(m.ObjectID, m.DatabaseUUID, j); err != nil {
			d.h.log.Warn("import job file not rewritten", "object", m.ObjectID, "err", err)
		}
		return j, nil
	}
	// Decided: the import committed (the header carries its tag; its
	// COMMIT is the checkpoint, and stays the only record of it until the
	// job file is rewritten below or in resolveBookmark).
	jc := jf.Commit
	final := jc.Status
	final.Messages = append(append([]string(nil), final.Messages...), recoveredMsg)
	if final.Result == nil {
		return d.recovered(m, j, final, jc), nil
	}
	bm, key, ok := d.liveBookmark(m, filename, jc)
	if ok {
		r := *final.Result
		r.FinalBookmark = bm
		final.Result = &r
		return d.recovered(m, j, final, jc), nil
	}
	// The bookmark is the archive's: look it up outside d.mu. Meanwhile
	// the job answers "active" with the messages it will end with (its
	// progress too), so far.
	final.Messages = append(final.Messages, recoveringMsg)
	j.status = final
	j.status.Status, j.status.Result = "active", nil
	j.status.Messages = append([]string(nil), final.Messages...)
	j.resolved = make(chan struct{})
	if !d.h.startJob(func() { d.resolveBookmark(m, j, final, key, jc) }) {
		return nil, ErrClosed
	}
	if d.resolving == nil {
		d.resolving = map[string]map[string]*importJob{}
	}
	if d.resolving[m.ObjectID] == nil {
		d.resolving[m.ObjectID] = map[string]*importJob{}
	}
	d.resolving[m.ObjectID][filename] = j
	if cur := d.jobs[m.ObjectID]; cur == nil || cur.snapshot().Status != "active" {
		d.jobs[m.ObjectID] = j
	}
	return j, nil
}

// recovered ends the resolution of a committed job (under d.mu from
// recoverJob; outside it from resolveBookmark, the job file being its
// alone while it is in d.resolving): final is its status; the job file is
// rewritten with it. A rewrite that fails
// is kept in the job (saveErr): the header is then still the only record
// of the COMMIT, so resolveDead refuses whatever would change it
// (errJobNotRewritten).
func (d *dumpAPI) recovered(m *Meta, j *importJob, final ImportStatus, jc *jobCommit) *importJob {
	// The file first, then the answer: a poll that reads "complete" finds
	// the job file saying so (unless its write failed).
	done := &importJob{filename: j.filename, status: final, finished: time.UnixMicro(jc.FinishedUs), commit: jc}
	err := d.saveJob(m.ObjectID, m.DatabaseUUID, done)
	if err != nil {
		d.h.log.Warn("import job file not rewritten", "object", m.ObjectID, "err", err)
	}
	j.mu.Lock()
	j.status, j.finished, j.saveErr = final, done.finished, err
	j.mu.Unlock()
	return j
}

// resolveBookmark is the part of a committed job's resolution that runs
// outside d.mu (recoverJob): the archive lookup, then the job's final
// status, then its job file rewritten, then the resolution closed
// (d.resolving, j.resolved), in that order, so whoever waited for it finds
// the file final. A crash anywhere here leaves the file "active" and the
// header with the tag: the next process decides the same (the COMMIT is the
// checkpoint; this rewrite only records it). The host closing mid-lookup
// leaves the file as it is, for the next process.
func (d *dumpAPI) resolveBookmark(m *Meta, j *importJob, final ImportStatus, key string, jc *jobCommit) {
	defer func() {
		d.mu.Lock()
		delete(d.resolving[m.ObjectID], j.filename)
		if len(d.resolving[m.ObjectID]) == 0 {
			delete(d.resolving, m.ObjectID)
		}
		d.mu.Unlock()
		close(j.resolved)
	}()
	bm, ok := d.archiveBookmark(m, j.filename, key, jc)
	if !ok {
		j.mu.Lock()
		j.saveErr = ErrClosed
		j.mu.Unlock()
		return
	}
	r := *final.Result
	r.FinalBookmark = bm
	final.Result = &r
	d.recovered(m, j, final, jc)
}

// resolveDead resolves every job file of the object left "active" by a
// dead process (recoverJob), before anything that changes the database's
// application_id — an import, a time-travel restore — could hide whether
// those imports committed. Normally there is none: a cheap directory read.
// The caller holds d.mu. open is a resolution still running on the object
// (its bookmark lookup, outside d.mu): a caller about to change the
// header must not until it ended (awaitResolved does both). An error: a
// committed job's file could not be rewritten, or the database could not
// be read.
func (d *dumpAPI) resolveDead(m *Meta) (open *importJob, err error) {
	if err := d.rewriteUnsaved(m); err != nil {
		return nil, err
	}
	dir := filepath.Join(d.uploadDir(m.ObjectID), "jobs")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil // no jobs directory: nothing to resolve
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
		j, err := d.recoverJob(m, name)
		if err != nil {
			return nil, fmt.Errorf("import job %s: %w", name, err)
		}
		if j == nil {
			continue
		}
		if j.resolved != nil && !j.isResolved() {
			open = j
			continue
		}
		if err := j.rewriteErr(); err != nil && j.snapshot().Status == "complete" {
			return nil, fmt.Errorf("import job %s: %w: %w", name, errJobNotRewritten, err)
		}
	}
	return open, nil
}

// rewriteUnsaved retries the final job-file write of the object's import
// held in memory when it failed (saveErr) for a job that committed: until
// the file is final, the header's tag is the only record of that COMMIT
// (the file says "active" with its commit block), so the caller — about to
// let an import or a restore change the header — gets errJobNotRewritten
// while the write still fails. A job that did not commit needs no retry
// (run: nothing to hide). The caller holds d.mu.
func (d *dumpAPI) rewriteUnsaved(m *Meta) error {
	j := d.jobs[m.ObjectID]
	if j == nil || !j.isResolved() {
		return nil // none, or a resolution still running (it writes the file itself)
	}
	j.mu.Lock()
	unsaved := j.saveErr != nil && j.status.Status == "complete"
	done := &importJob{filename: j.filename, status: j.status, finished: j.finished, commit: j.commit}
	j.mu.Unlock()
	if !unsaved {
		return nil
	}
	if err := d.saveJob(m.ObjectID, m.DatabaseUUID, done); err != nil {
		return fmt.Errorf("import job %s: %w: %w", j.filename, errJobNotRewritten, err)
	}
	j.mu.Lock()
	j.saveErr = nil
	j.mu.Unlock()
	return nil
}

// errJobNotRewritten: an import committed but its job file could not be
// written final (its host died before, or the write failed); until it
// is, whatever changes the database's application_id (an import, a
// restore) is refused.
var errJobNotRewritten = errors.New("an import's job file could not be rewritten; retry")

// awaitResolved takes d.mu with every job a dead process left on the
// object resolved (resolveDead), waiting — without d.mu — for resolutions
// still looking up their bookmark. On success d.mu is held; on error it is
// not. Waits are bounded by bookmarkLookupWait and ctx.
func (d *dumpAPI) awaitResolved(ctx context.Context, m *Meta) error {
	for {
		d.mu.Lock()
		open, err := d.resolveDead(m)
		if err != nil {
			d.mu.Unlock()
			return err
		}
		if open == nil {
			return nil
		}
		d.mu.Unlock()
		if err := d.awaitOpen(ctx, open); err != nil {
			return err
		}
	}
}

// awaitOpen waits, without d.mu, for the open resolution j to end
// (resolveDead); an error if its job file was not rewritten.
func (d *dumpAPI) awaitOpen(ctx context.Context, j *importJob) error {
	if d.hooks.awaitResolution != nil {
		d.hooks.awaitResolution()
	}
	select {
	case <-j.resolved:
	case <-ctx.Done():
		return ctx.Err()
	}
	if err := j.rewriteErr(); err != nil {
		return fmt.Errorf("import job %s: %w: %w", j.filename, errJobNotRewritten, err)
	}
	return nil
}

// importHooks let tests stop a flow at a point (nil in production).
type importHooks struct {
	// archiveLookup runs as a recovered import's archive lookup starts
	// (outside d.mu).
	archiveLookup func()
	// awaitResolution runs as an import or a restore starts waiting for a
	// resolution still looking up its bookmark.
	awaitResolution func()
	// saveJob, when it returns an error, fails a job file's write.
	saveJob func(filename string) error
}

// expireJobs drops finished jobs older than jobRetention from memory
// (d.mu held). Called at each ingest: imports are rare, the map small. A
// committed job whose final write failed stays (rewriteUnsaved: memory is
// then what keeps the header from changing).
func (d *dumpAPI) expireJobs() {
	now := d.h.now()
	for id, j := range d.jobs {
		j.mu.Lock()
		old := j.status.Status != "active" && now.Sub(j.finished) > jobRetention && j.saveErr == nil
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
