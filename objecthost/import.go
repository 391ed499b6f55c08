package objecthost

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gorilla/mux"

	v4 "github.com/shoaldb/shoal/internal/v4"
	"github.com/shoaldb/shoal/objecthost/dump"
	"github.com/shoaldb/shoal/objecthost/history"
	"github.com/shoaldb/shoal/objecthost/sqlexec"
)

// MaxImportBytes is D1's import size limit.
const MaxImportBytes = 5 << 30

// UploadResult is the answer to an upload.
type UploadResult struct {
	Filename string `json:"filename"`
	Size     int64  `json:"size"`
	Etag     string `json:"etag"` // MD5 hex of the received bytes
}

// ImportStatus is D1's import polling answer (plus a progress object).
type ImportStatus struct {
	Type       string         `json:"type"`   // "import"
	Status     string         `json:"status"` // "active" | "complete" | "error"
	AtBookmark string         `json:"at_bookmark"`
	Messages   []string       `json:"messages"`
	Error      string         `json:"error,omitempty"`
	Result     *ImportSummary `json:"result,omitempty"`
	Progress   ImportProgress `json:"progress"`
}

// ImportSummary is the result of a completed import.
type ImportSummary struct {
	FinalBookmark string     `json:"final_bookmark"`
	NumQueries    int64      `json:"num_queries"`
	Meta          ImportMeta `json:"meta"`
}

// ImportMeta mirrors D1's meta object of an import.
type ImportMeta struct {
	ServedBy    string  `json:"served_by"`
	Duration    float64 `json:"duration"`
	Changes     int64   `json:"changes"`
	ChangedDB   bool    `json:"changed_db"`
	SizeAfter   int64   `json:"size_after"`
	RowsRead    int64   `json:"rows_read"`
	RowsWritten int64   `json:"rows_written"`
}

// ImportProgress lets clients draw a progress bar.
type ImportProgress struct {
	Bytes      int64 `json:"bytes"`
	TotalBytes int64 `json:"total_bytes"`
	Statements int64 `json:"statements"`
}

// importJob is one ingest. Fields after mu are guarded by it.
type importJob struct {
	filename string
	mu       sync.Mutex
	status   ImportStatus
	finished time.Time  // when status left "active" (host clock)
	commit   *jobCommit // set just before the import's COMMIT (importjobs.go)
	// saveErr: a committed job's final job file could not be written —
	// a job of this process (run) or a recovered one (importjobs.go,
	// recovered) — or the host closed before it was.
	saveErr error

	// resolved is closed when a recovered job's bookmark lookup, run
	// outside dumpAPI.mu, has ended (importjobs.go, recoverJob); nil for
	// every other job. Set before the job is shared, never changed.
	resolved chan struct{}
}

// isResolved reports whether j is not a recovered job still looking up its
// bookmark.
func (j *importJob) isResolved() bool {
	if j.resolved == nil {
		return true
	}
	select {
	case <-j.resolved:
		return true
	default:
		return false
	}
}

// commitBlock is commit, read under j.mu.
func (j *importJob) commitBlock() *jobCommit {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.commit
}

// rewriteErr is saveErr, read under j.mu.
func (j *importJob) rewriteErr() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.saveErr
}

func (j *importJob) snapshot() ImportStatus {
	j.mu.Lock()
	defer j.mu.Unlock()
	s := j.status
	s.Messages = append([]string(nil), s.Messages...)
	return s
}

func (d *dumpAPI) uploadDir(id string) string { return filepath.Join(d.h.cfg.Dir, "imports", id) }

// handleUpload streams the request body to <dir>/imports/<id>/<filename>
// (through a .part file renamed at the end, so a cut upload never looks
// complete), computing its MD5 on the way; memory use is one copy buffer.
func (d *dumpAPI) handleUpload(w http.ResponseWriter, r *http.Request) {
	id, name := mux.Vars(r)["id"], mux.Vars(r)["filename"]
	_, m, err := d.checkObject(r, id)
	if err != nil {
		writeErr(w, err)
		return
	}
	if !validFilename(name) {
		writeErr(w, fmt.Errorf("%w: bad filename", ErrInvalid))
		return
	}
	dir := d.uploadDir(id)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		writeErr(w, err)
		return
	}
	// Job files a dead process left "active" end here (resolved), so that
	// removeStale counts their retention from an end too.
	// A resolution still looking up its bookmark is not waited for: an
	// upload changes no header, and removeStale keeps active job files.
	d.mu.Lock()
	_, err = d.resolveDead(m)
	d.mu.Unlock()
	if err != nil && !errors.Is(err, errJobNotRewritten) {
		writeErr(w, err)
		return
	}
	d.removeStale(dir)
	final := filepath.Join(dir, name)
	f, err := os.CreateTemp(dir, name+".*.part")
	if err != nil {
		writeErr(w, err)
		return
	}
	defer os.Remove(f.Name())
	hash := md5.New()
	n, err := io.Copy(io.MultiWriter(f, hash), http.MaxBytesReader(w, r.Body, MaxImportBytes))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		var mb *http.MaxBytesError
		if errors.As(err, &mb) {
			v4.WriteError(w, http.StatusRequestEntityTooLarge, v4.CodeTooLarge, "import file over 5 GB")
			return
		}
		writeErr(w, fmt.Errorf("%w: upload: %v", ErrInvalid, err))
		return
	}
	etag := hex.EncodeToString(hash.Sum(nil))
	// Checkpoint: the rename. The sidecar holds the MD5 so ingest need not
	// re-read a 5 GB file.
	if err := os.WriteFile(final+".md5", []byte(etag), 0o644); err != nil {
		writeErr(w, err)
		return
	}
	if err := os.Rename(f.Name(), final); err != nil {
		writeErr(w, err)
		return
	}
	v4.WriteResult(w, UploadResult{Filename: name, Size: n, Etag: etag})
}

type ingestBody struct {
	Etag     string `json:"etag"`
	Filename string `json:"filename"`
}

// handleIngest verifies the uploaded file's MD5 against the client's etag
// and starts the import job. Ingesting the file that is already running or
// done returns that job's status (a retried request is harmless).
func (d *dumpAPI) handleIngest(w http.ResponseWriter, r *http.Request) {
	id := mux.Vars(r)["id"]
	o, m, err := d.checkObject(r, id)
	if err != nil {
		writeErr(w, err)
		return
	}
	// The account limits user SQL obeys apply to imports too: an account
	// over its storage limit cannot grow, one over its daily rows cannot write.
	acct := d.h.account(m.AccountID)
	if err := acct.rowLimited(d.h.now()); err != nil {
		writeErr(w, err)
		return
	}
	if acct.blockGrowth {
		writeErr(w, &sqlexec.Error{Code: v4.CodeStorageLimit, Statement: -1,
			Message: "the account is over its storage limit: imports are refused until usage drops"})
		return
	}
	b, err := d.h.readBody(w, r)
	if err != nil {
		writeErr(w, err)
		return
	}
	var req ingestBody
	if err := json.Unmarshal(b, &req); err != nil || !validFilename(req.Filename) {
		writeErr(w, fmt.Errorf("%w: body must be {etag, filename}", ErrInvalid))
		return
	}
	for {
		d.mu.Lock()
		d.expireJobs()
		if j := d.jobs[id]; j != nil {
			st := j.snapshot()
			if j.filename == req.Filename {
				d.mu.Unlock()
				v4.WriteResult(w, st)
				return
			}
			if st.Status == "active" && !j.isResolved() {
				// Not an import running: one a dead process committed,
				// looking up its bookmark (importjobs.go). Waited for
				// (≤ bookmarkLookupWait) rather than answered 409.
				d.mu.Unlock()
				if err := d.awaitOpen(r.Context(), j); err != nil {
					writeErr(w, err)
					return
				}
				continue
			}
			if st.Status == "active" {
				d.mu.Unlock()
				v4.WriteError(w, http.StatusConflict, v4.CodeInvalidRequest, "another import is running on this database")
				return
			}
		}
		// A retried ingest of a job an earlier process of this host ran
		// answers that job (its job file says it exists): one file is one
		// import, run at most once.
		if j, err := d.recoverJob(m, req.Filename); err != nil {
			d.mu.Unlock()
			writeErr(w, err)
			return
		} else if j != nil {
			d.jobs[id] = j
			d.mu.Unlock()
			v4.WriteResult(w, j.snapshot())
			return
		}
		path := filepath.Join(d.uploadDir(id), req.Filename)
		sum, err := os.ReadFile(path + ".md5")
		if err != nil {
			d.mu.Unlock()
			v4.WriteError(w, http.StatusBadRequest, v4.CodeInvalidRequest, "no uploaded file "+req.Filename+"; upload it first")
			return
		}
		if !strings.EqualFold(strings.TrimSpace(string(sum)), strings.Trim(req.Etag, `"`)) {
			d.mu.Unlock()
			v4.WriteError(w, http.StatusBadRequest, v4.CodeInvalidRequest, "etag mismatch: the uploaded file's MD5 is "+string(sum))
			return
		}
		fi, err := os.Stat(path)
		if err != nil {
			d.mu.Unlock()
			writeErr(w, err)
			return
		}
		// Imports a dead process left unresolved are resolved before this one
		// may change the database's application_id (importjobs.go). One of
		// them still looking up its bookmark (outside d.mu) is waited for
		// (≤ bookmarkLookupWait), then everything above is checked again.
		if open, err := d.resolveDead(m); err != nil {
			d.mu.Unlock()
			writeErr(w, err)
			return
		} else if open != nil {
			d.mu.Unlock()
			if err := d.awaitOpen(r.Context(), open); err != nil {
				writeErr(w, err)
				return
			}
			continue
		}
		j := &importJob{filename: req.Filename, status: ImportStatus{
			Type: "import", Status: "active", AtBookmark: req.Filename, Messages: []string{"Import started"},
			Progress: ImportProgress{TotalBytes: fi.Size()},
		}}
		// Checkpoint: the job file. Once it is on disk the job exists for
		// every later process of this host: a crash from here on is answered
		// "complete" (the database's record says it committed) or "failed, not
		// applied" — never "no such import". Written under d.mu, as the job's
		// entry below, so a concurrent ingest cannot start a second job.
		if err := d.saveJob(id, m.DatabaseUUID, j); err != nil {
			d.mu.Unlock()
			writeErr(w, fmt.Errorf("import job file: %w", err))
			return
		}
		// The job is a goroutine owned by the Host: Close waits for it (and the
		// job notices h.closed at its next progress report and rolls back).
		if !d.h.startJob(func() { d.run(o, m, j, path) }) {
			d.mu.Unlock()
			writeErr(w, ErrClosed)
			return
		}
		d.jobs[id] = j
		d.mu.Unlock()
		v4.WriteResult(w, j.snapshot())
		return
	}
}

// run executes one import job.
func (d *dumpAPI) run(o *object, m *Meta, j *importJob, path string) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := time.Now()
	// finish makes a failed job's final status durable (its job file);
	// the in-memory status is final already. A failed write is logged:
	// harmless, as nothing was imported — a restart resolves the job
	// from the database's header, which never carries its tag (the
	// import did not commit, and every later tag is drawn anew), as
	// "interrupted: nothing was imported". A committed job's final
	// write is another matter (below: unsaved).
	finish := func() {
		if err := d.saveJob(m.ObjectID, m.DatabaseUUID, j); err != nil {
			d.h.log.Warn("import job file not written", "object", m.ObjectID, "err", err)
		}
	}
	fail := func(msg string) {
		j.mu.Lock()
		j.status.Status, j.status.Error = "error", msg
		j.status.Messages = append(j.status.Messages, msg)
		j.finished = d.h.now()
		j.mu.Unlock()
		d.h.log.Warn("import failed", "object", m.ObjectID, "err", msg)
		finish()
	}
	f, err := os.Open(path)
	if err != nil {
		fail("cannot open the uploaded file")
		return
	}
	defer func() {
		f.Close()
		os.Remove(path)
		os.Remove(path + ".md5")
	}()
	// The import runs on the object's own sqlexec.DB (its writer, in user
	// SQL's sandbox and limits, rows counted): the handle stays pinned for
	// the whole import, so it is neither evicted nor reopened meanwhile.
	hd, err := d.h.handles.acquire(m.ObjectID)
	if err != nil {
		fail("cannot open the database")
		return
	}
	defer d.h.handles.release(hd)
	if m = o.meta.Load(); m == nil || m.deleted() {
		fail("the database was deleted")
		return
	}
	// Growth is blocked as for queries (see Host.Query): the account is
	// over its storage total, or this database is at its size limit.
	acct := d.h.account(m.AccountID)
	blockGrowth := acct.blockGrowth || (acct.maxDatabaseBytes > 0 && o.size.Load() >= acct.maxDatabaseBytes)
	// complete is the job's final status for an import that did res: the
	// same text for the job file's commit block and for the job.
	complete := func(res dump.ImportResult, finalBookmark string, at time.Time) ImportStatus {
		st := j.snapshot()
		st.Status = "complete"
		st.Progress.Bytes, st.Progress.Statements = res.Bytes, res.Statements
		st.Messages = append(st.Messages, fmt.Sprintf("Imported %d statements (%d bytes)", res.Statements, res.Bytes))
		st.Result = &ImportSummary{FinalBookmark: finalBookmark, NumQueries: res.Statements, Meta: ImportMeta{
			ServedBy: d.h.cfg.ID, Duration: float64(at.Sub(start).Microseconds()) / 1000, Changes: res.Changes,
			ChangedDB: res.RowsWritten > 0 || res.Statements > 0, SizeAfter: res.SizeAfter, RowsRead: res.RowsRead, RowsWritten: res.RowsWritten,
		}}
		return st
	}
	// The tag the import's transaction sets as the database's
	// application_id (importjobs.go): only imports change it, and this is
	// the object's one running import.
	before, err := dbAppID(hd.db.DB)
	if err != nil {
		fail("import failed: " + err.Error())
		return
	}
	tag := importTag(before)
	var committedAt *history.Position // the import's commit (AfterCommit)
	res, err := dump.ImportDB(ctx, hd.db.DB, f, dump.ImportOptions{
		BlockGrowth: blockGrowth,
		// Step 2 (importjobs.go): every statement ran, the transaction is
		// open. The job file says how the job ends if it commits, fsynced,
		// before the transaction tags the header; a file that cannot be
		// written rolls the import back. Checkpoint: the COMMIT right
		// after, which commits the tag with the import.
		Record: func(r dump.ImportResult) ([]sqlexec.InternalStatement, error) {
			jc := &jobCommit{Tag: tag, FinishedUs: d.h.now().UnixMicro(), Status: complete(r, "", time.Now())}
			if c := hd.db.cap; c != nil {
				// The writer is alone: the last commit captured is the
				// last before the import, and the import's is the next.
				if p, err := c.Exact(); err == nil {
					jc.PrevGen, jc.PrevTxid = p.Gen, p.Txid
				}
			}
			j.mu.Lock()
			j.commit = jc
			j.mu.Unlock()
			if err := d.saveJob(m.ObjectID, m.DatabaseUUID, j); err != nil {
				return nil, fmt.Errorf("import job file: %w", err)
			}
			return []sqlexec.InternalStatement{{SQL: "PRAGMA application_id=" + strconv.FormatInt(int64(tag), 10)}}, nil
		},
		// Right after the COMMIT, still alone on the writer: the
		// capturer's position is exactly the import's commit (a write
		// queued behind the import has not committed yet).
		AfterCommit: func() {
			if c := hd.db.cap; c != nil {
				if p, err := c.Exact(); err == nil {
					committedAt = &p
				}
			}
		},
		Progress: func(p dump.Progress) {
			// Runs on the DB's writer goroutine: only cheap checks here.
			if d.h.closed.Load() {
				cancel() // Host.Close: roll back at the next check
			}
			if cur := o.meta.Load(); cur == nil || cur.deleted() {
				// Deleted meanwhile: stop, so the purge loop (waiting for
				// this pinned handle) is not held up by the import.
				cancel()
			}
			j.mu.Lock()
			j.status.Progress.Bytes, j.status.Progress.Statements = p.Bytes, p.Statements
			j.mu.Unlock()
		},
	})
	var committed *sqlexec.CommittedError
	if err != nil && !errors.As(err, &committed) {
		var se *dump.StatementError
		var te *dump.TextError
		switch {
		case errors.As(err, &se):
			fail(se.Error())
		case errors.As(err, &te):
			fail(te.Error())
		case errors.Is(err, context.Canceled), errors.Is(err, sqlexec.ErrClosed):
			why := "object host shutting down"
			if cur := o.meta.Load(); cur == nil || cur.deleted() {
				why = "the database was deleted"
			}
			fail("import interrupted: " + why + "; nothing was imported")
		case errors.Is(err, dump.ErrStatementTooLarge):
			fail(err.Error())
		default:
			fail("import failed: " + err.Error())
		}
		return
	}
	now := d.h.now()
	d.h.cfg.Usage.RecordUsage(UsageEvent{AccountID: m.AccountID, DatabaseUUID: m.DatabaseUUID, RowsRead: res.RowsRead, RowsWritten: res.RowsWritten, Time: now})
	d.h.noteSize(o, m, func() int64 { return res.SizeAfter })
	// D1's final_bookmark is the time-travel bookmark just after the
	// import (restoring to it gets the imported state back, and nothing
	// written after it); a host without history has no bookmarks, and
	// keeps answering the upload's name.
	final := j.filename
	if c := hd.db.cap; c != nil {
		p := c.Current() // capture failing at the commit: the best known
		if committedAt != nil {
			p = *committedAt
		}
		final = string(history.MakeBookmark(c.Key(), p))
	}
	st := complete(res, final, time.Now())
	if committed != nil {
		// Durability "archived" and the archive store did not confirm:
		// the import IS applied on the host (its transaction committed),
		// so it is complete in D1's vocabulary — an "error" would make
		// the client retry into "table exists". The capture keeps the
		// commit's frames in the WAL and retries until the store takes
		// them, as for a query write answered 7503.
		st.Messages = append(st.Messages, "Warning: the import is committed on the object host but the archive store has not confirmed it yet (durability = archived); it will be archived when the store is back")
		d.h.log.Warn("import committed, archive not confirmed", "object", m.ObjectID, "err", committed.Err)
	}
	// The file first, then the answer (as for a recovered job): the job
	// stays "active" in memory until its final write was tried, so nothing
	// sees it complete with that write still to come. If the write fails,
	// the job is complete all the same — it committed, and its commit
	// block and the header's tag say so to any later process — but the
	// header is now the only record of its COMMIT: the job keeps the
	// error (saveErr), and imports and restores of the database, which
	// change the header, are refused until a retried write succeeds
	// (resolveDead, rewriteUnsaved).
	done := &importJob{filename: j.filename, status: st, finished: d.h.now(), commit: j.commitBlock()}
	err = d.saveJob(m.ObjectID, m.DatabaseUUID, done)
	if err != nil {
		d.h.log.Warn("import job file not written; imports and restores of the database are refused until it is", "object", m.ObjectID, "err", err)
	}
	j.mu.Lock()
	j.status, j.finished, j.saveErr = st, done.finished, err
	j.mu.Unlock()
}

type pollBody struct {
	CurrentBookmark string `json:"current_bookmark"`
}

func (d *dumpAPI) handlePoll(w http.ResponseWriter, r *http.Request) {
	id := mux.Vars(r)["id"]
	_, m, err := d.checkObject(r, id)
	if err != nil {
		writeErr(w, err)
		return
	}
	b, err := d.h.readBody(w, r)
	if err != nil {
		writeErr(w, err)
		return
	}
	var req pollBody
	if len(b) > 0 {
		if err := json.Unmarshal(b, &req); err != nil {
			writeErr(w, fmt.Errorf("%w: %v", ErrInvalid, err))
			return
		}
	}
	d.mu.Lock()
	j := d.jobs[id]
	if j == nil || (req.CurrentBookmark != "" && req.CurrentBookmark != j.filename) {
		j = nil
		if req.CurrentBookmark != "" && validFilename(req.CurrentBookmark) {
			// Not in memory: a restart (recoverJob, under d.mu: see there).
			if j, err = d.recoverJob(m, req.CurrentBookmark); err != nil {
				d.mu.Unlock()
				writeErr(w, err)
				return
			}
			if j != nil && d.jobs[id] == nil {
				d.jobs[id] = j
			}
		}
	}
	d.mu.Unlock()
	if j == nil {
		v4.WriteError(w, http.StatusBadRequest, v4.CodeInvalidRequest, "no import with that bookmark on this database (an import's status is kept for 24 hours after it ends)")
		return
	}
	v4.WriteResult(w, j.snapshot())
}

// staleUpload is how long an uploaded file that was never ingested (or a
// leftover .part) is kept; D1's upload URLs live one hour.
const staleUpload = 24 * time.Hour

// removeStale deletes an object's old uploads, so abandoned imports do not
// accumulate, and (in jobs/) the job files of imports that ENDED over
// jobRetention ago: a job's retention counts from its end (the file says
// when), so a job that has not ended — running, however long — is never
// expired (an import running past a day used to lose its job file here,
// the file's age being the job's start). A job file that does not parse
// goes by its age.
func (d *dumpAPI) removeStale(dir string) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	cutoff := d.h.now().Add(-staleUpload)
	for _, e := range ents {
		if e.IsDir() && e.Name() == "jobs" {
			d.removeStaleJobs(filepath.Join(dir, e.Name()))
			continue
		}
		if fi, err := e.Info(); err == nil && fi.ModTime().Before(cutoff) {
			_ = os.Remove(filepath.Join(dir, e.Name()))
		}
	}
}

// removeStaleJobs is removeStale's part for the jobs/ directory.
func (d *dumpAPI) removeStaleJobs(dir string) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	cutoff := d.h.now().Add(-jobRetention)
	for _, e := range ents {
		path := filepath.Join(dir, e.Name())
		if jf := readJob(path); jf != nil {
			if d.expired(jf) {
				_ = os.Remove(path)
			}
			continue
		}
		if fi, err := e.Info(); err == nil && fi.ModTime().Before(cutoff) {
			_ = os.Remove(path) // unreadable, or a temp file a crash left
		}
	}
}
