package objecthost

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gorilla/mux"

	v4 "github.com/shoaldb/shoal/internal/v4"
	"github.com/shoaldb/shoal/objecthost/dump"
)

// dumpAPI serves the export and import endpoints (see docs/objecthost-api.md,
// "Export and import"). Exports are stateless: the dump is streamed from a
// read snapshot when it is downloaded. Imports are jobs: uploaded files live
// under <dir>/imports/<object id>/ and each ingest runs in a goroutine
// started by Host.startJob, so Host.Close waits for it; the job notices
// h.closed at its next progress report and rolls back. One dumpAPI per Host
// (h.dump), however many times Handler is called.
//
// Concurrency: jobs is guarded by mu; one import runs per object at a time.
type dumpAPI struct {
	h    *Host
	mu   sync.Mutex
	jobs map[string]*importJob // object ID → its latest import
	// resolving: object ID → file name → a recovered import whose
	// final_bookmark is being looked up outside mu (importjobs.go,
	// recoverJob). Guarded by mu; made on first use.
	resolving map[string]map[string]*importJob
	// hooks: tests only (nil in production).
	hooks importHooks

	incOnce sync.Once
	inc     string // this process's name in import job files (importjobs.go)
}

// dumpRoutes registers the export/import endpoints on the host's router.
func (h *Host) dumpRoutes(r *mux.Router) {
	d := h.dump // made by Open
	r.HandleFunc("/v1/objects/{id}/export", d.handleExportStart).Methods(http.MethodPost)
	r.HandleFunc("/v1/objects/{id}/export/download", d.handleExportDownload).Methods(http.MethodGet)
	r.HandleFunc("/v1/objects/{id}/import/upload/{filename}", d.handleUpload).Methods(http.MethodPut)
	r.HandleFunc("/v1/objects/{id}/import/ingest", d.handleIngest).Methods(http.MethodPost)
	r.HandleFunc("/v1/objects/{id}/import/poll", d.handlePoll).Methods(http.MethodPost)
}

// checkObject applies the query path's rules to a dump call: the identity
// headers are required and must match the object's metadata (else 421),
// and the object must be active (else 410).
func (d *dumpAPI) checkObject(r *http.Request, id string) (*object, *Meta, error) {
	if d.h.closed.Load() {
		return nil, nil, ErrClosed
	}
	o, m, err := d.h.lookup(id)
	if err != nil {
		return nil, nil, err
	}
	if r.Header.Get(HeaderDatabase) != m.DatabaseUUID || r.Header.Get(HeaderAccount) != m.AccountID {
		return nil, nil, ErrWrongHost
	}
	if m.deleted() {
		return nil, nil, ErrDeleted
	}
	return o, m, nil
}

// ExportCheck is the result of POST /v1/objects/{id}/export.
type ExportCheck struct {
	Tables []string `json:"tables"` // the database's user tables
}

func (d *dumpAPI) handleExportStart(w http.ResponseWriter, r *http.Request) {
	id := mux.Vars(r)["id"]
	if _, _, err := d.checkObject(r, id); err != nil {
		writeErr(w, err)
		return
	}
	b, err := d.h.readBody(w, r)
	if err != nil {
		writeErr(w, err)
		return
	}
	var opts struct {
		dump.Options
		Bookmark      string `json:"bookmark"`
		RetentionDays string `json:"retention_days"`
	}
	if len(b) > 0 {
		if err := json.Unmarshal(b, &opts); err != nil {
			writeErr(w, fmt.Errorf("%w: %v", ErrInvalid, err))
			return
		}
	}
	path := d.h.path(id)
	if opts.Bookmark != "" {
		// An export at a bookmark: checked now (format, retention, in the
		// archive), dumped from a restored copy at download.
		days, _ := strconv.Atoi(opts.RetentionDays)
		p, cleanup, err := d.h.copyAt(r.Context(), id, opts.Bookmark, time.Duration(days)*24*time.Hour)
		if err != nil {
			writeHistoryErr(w, err)
			return
		}
		defer cleanup()
		path = p
	}
	tables, err := dump.Tables(r.Context(), path)
	if err != nil {
		writeErr(w, err)
		return
	}
	for _, t := range opts.Tables {
		if !containsFold(tables, t) {
			v4.WriteError(w, http.StatusBadRequest, v4.CodeInvalidRequest, "no such table: "+t)
			return
		}
	}
	v4.WriteResult(w, ExportCheck{Tables: tables})
}

func containsFold(list []string, s string) bool {
	for _, x := range list {
		if strings.EqualFold(x, s) {
			return true
		}
	}
	return false
}

// handleExportDownload streams the dump. Errors found before the first
// byte is sent (unknown table) are a normal error answer; an error after
// that aborts the connection, so the client sees a truncated transfer
// rather than a silently short dump.
func (d *dumpAPI) handleExportDownload(w http.ResponseWriter, r *http.Request) {
	id := mux.Vars(r)["id"]
	if _, _, err := d.checkObject(r, id); err != nil {
		writeErr(w, err)
		return
	}
	q := r.URL.Query()
	opts := dump.Options{NoData: q.Get("no_data") == "1", NoSchema: q.Get("no_schema") == "1", Tables: q["table"]}
	path := d.h.path(id)
	if bm := q.Get("bookmark"); bm != "" {
		p, cleanup, err := d.h.copyAt(r.Context(), id, bm, 0)
		if err != nil {
			writeHistoryErr(w, err)
			return
		}
		defer cleanup()
		path = p
	}
	lw := &lazyWriter{w: w}
	err := dump.Export(r.Context(), path, lw, opts, nil)
	if err == nil {
		lw.start()
		return
	}
	if !lw.started {
		if errors.Is(err, dump.ErrNoSuchTable) {
			v4.WriteError(w, http.StatusBadRequest, v4.CodeInvalidRequest, err.Error())
			return
		}
		writeErr(w, err) // a 5xx is logged once, with err, by apiHandler
		return
	}
	d.h.log.Warn("export aborted", "object", id, "err", err)
	panic(http.ErrAbortHandler)
}

// lazyWriter sends the 200 header with the first byte.
type lazyWriter struct {
	w       http.ResponseWriter
	started bool
}

func (l *lazyWriter) start() {
	if !l.started {
		l.started = true
		l.w.Header().Set("Content-Type", "application/sql")
		l.w.WriteHeader(http.StatusOK)
	}
}

func (l *lazyWriter) Write(p []byte) (int, error) {
	l.start()
	return l.w.Write(p)
}

var filenameRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

func validFilename(s string) bool { return filenameRe.MatchString(s) && !strings.Contains(s, "..") }
