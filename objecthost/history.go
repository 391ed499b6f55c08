package objecthost

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/gorilla/mux"

	"github.com/shoaldb/shoal/internal/pki"
	v4 "github.com/shoaldb/shoal/internal/v4"
	"github.com/shoaldb/shoal/objecthost/history"
	"github.com/shoaldb/shoal/objecthost/sqlexec"
)

// HistoryConfig turns on the page-level change log of every database on
// the host (objecthost/history, its DESIGN.md): each commit is captured
// into local staging and shipped to Store; the time-travel endpoints
// serve bookmarks and restores from it.
type HistoryConfig struct {
	Store history.Store // required: the off-host archive
	// StagingDir is the local staging area (default <Dir>/history: on the
	// data disk, it survives restarts).
	StagingDir string
	Shipper    history.ShipperOptions
	// Archived is `durability = "archived"`: a write is acknowledged only
	// once its record is in Store.
	Archived bool
	// Retention is the oldest point a restore may go back to (default 30
	// days); a request may narrow it (?retention_days=, the account's tier).
	Retention time.Duration
	// MaxRestores per RestoreWindow per database (default 10 per 10 min,
	// D1's limit).
	MaxRestores   int
	RestoreWindow time.Duration
	// DrainTimeout bounds the last shipment when the host closes (default
	// 10 s).
	DrainTimeout time.Duration
	// SweepInterval: how often the retention sweeper deletes archived
	// history older than Retention for every active database (default 1 h;
	// negative disables).
	SweepInterval time.Duration
	// DeletedArchiveMassFloor and DeletedArchiveMassFraction: the brake of
	// the sweep of deleted databases' archives (archivesweep.go). More
	// archives due in one pass than max(floor, fraction × the databases
	// this host knows) deletes none and raises "mass_archive_deletes".
	// Defaults 50 and 0.01.
	DeletedArchiveMassFloor    int
	DeletedArchiveMassFraction float64
	// BucketSweepInterval: how often the coordinating host (the active
	// host with the smallest ID) runs the bucket-wide pass over every
	// database in the archive (archivesweep.go, sweepBucketArchives;
	// default 24 h, the first pass at the first sweep tick; negative
	// disables).
	BucketSweepInterval time.Duration
	// ScrubInterval: one pass of the archive scrubber over every live
	// database of the host, paced evenly (default 24 h; negative
	// disables). See scrub.go.
	ScrubInterval time.Duration
	// ScrubSample: archived objects read in full and verified per
	// database per pass (default 1; negative: all of them).
	ScrubSample int
}

// hostHistory is the host's side of history: one shipper, the capturer of
// every open handle, and the restores in progress.
type hostHistory struct {
	cfg     HistoryConfig
	ship    *history.Shipper
	archive *history.Archive

	mu        sync.Mutex
	caps      map[string]*history.Capturer // objectID → capturer of its open handle
	restoring map[string]bool              // objectID → restore in progress: no open
	restores  map[string][]time.Time       // objectID → recent restores (rate limit)
	// reopen: objectID → the staging state its last handle left when it
	// closed cleanly in this process (history.Reopen), so the next open
	// skips the staging recovery. Memory only: a process start has none
	// and recovers every area from disk. Dropped before anything else
	// touches the area (a restore, the archive sweep's removal); at most
	// maxReopen entries (a dropped one only costs a recovery).
	reopen map[string]history.Reopen

	stop context.CancelFunc
	done chan struct{}
	// markCh: a delete marker pass is due (deletemark.go); made by start.
	markCh chan struct{}
	// markMu: one marker pass at a time, and none while the deleted
	// archives' sweep deletes (a pass that read its work before the
	// sweep would write a marker back after the sweep deleted the
	// database's archive).
	markMu sync.Mutex
	// lastBucket: when the last bucket-wide pass ran (sweep goroutine
	// only; zero: not yet, so the first sweep tick runs one).
	lastBucket time.Time

	// archiveMu: the retention sweep of one database and the scrub of
	// one database do not run at once (scrub.go).
	archiveMu sync.Mutex
	scrubMu   sync.Mutex
	scrub     scrubState
	sm        *scrubMetrics
	// checks: archives a restore found damaged, checked at once
	// (restoredamage.go).
	checks chan damageCheck
}

// ErrRestoring is returned while a database is being restored.
var ErrRestoring = errors.New("database is being restored, retry")

func newHostHistory(h *Host, cfg HistoryConfig) (*hostHistory, error) {
	if cfg.Store == nil {
		return nil, fmt.Errorf("%w: history needs a store", ErrInvalid)
	}
	if cfg.StagingDir == "" {
		cfg.StagingDir = filepath.Join(h.cfg.Dir, "history")
	}
	if cfg.Retention <= 0 {
		cfg.Retention = 30 * 24 * time.Hour
	}
	if cfg.MaxRestores <= 0 {
		cfg.MaxRestores = 10
	}
	if cfg.RestoreWindow <= 0 {
		cfg.RestoreWindow = 10 * time.Minute
	}
	if cfg.DrainTimeout <= 0 {
		cfg.DrainTimeout = 10 * time.Second
	}
	if cfg.SweepInterval == 0 {
		cfg.SweepInterval = time.Hour
	}
	if cfg.DeletedArchiveMassFloor <= 0 {
		cfg.DeletedArchiveMassFloor = 50
	}
	if cfg.BucketSweepInterval == 0 {
		cfg.BucketSweepInterval = 24 * time.Hour
	}
	if cfg.ScrubInterval == 0 {
		cfg.ScrubInterval = 24 * time.Hour
	}
	if cfg.ScrubSample == 0 {
		cfg.ScrubSample = 1
	}
	if cfg.DeletedArchiveMassFraction <= 0 {
		cfg.DeletedArchiveMassFraction = 0.01
	}
	if cfg.Shipper.Registerer == nil {
		cfg.Shipper.Registerer = h.m.reg
	}
	if cfg.Shipper.Logger == nil {
		cfg.Shipper.Logger = h.log
	}
	hh := &hostHistory{
		cfg: cfg, ship: history.NewShipper(cfg.Store, cfg.Shipper), archive: history.NewArchive(cfg.Store),
		caps: map[string]*history.Capturer{}, restoring: map[string]bool{}, restores: map[string][]time.Time{},
		reopen: map[string]history.Reopen{},
		scrub:  scrubState{damaged: map[string]*ArchiveDamage{}},
		sm:     newScrubMetrics(h.m.reg),
		checks: make(chan damageCheck, maxDamageChecks),
	}
	if err := os.MkdirAll(cfg.StagingDir, 0o755); err != nil {
		return nil, fmt.Errorf("history staging dir: %w", err)
	}
	// What an earlier run left unshipped: seal it now (no database is open
	// yet) and let the shipper send it. Staging is per object
	// (<staging>/<uuid>/<object>/): two objects of one database can be on
	// this host (relocated away and back), each with its own log. A
	// per-database area of the former layout moves into its object's when
	// the host has only one object of that database; otherwise it is only
	// shipped (the objects start new generations).
	byUUID := map[string][]string{}
	for id, o := range h.objects {
		if m := o.meta.Load(); m != nil {
			byUUID[m.DatabaseUUID] = append(byUUID[m.DatabaseUUID], id)
		}
	}
	areas, err := history.StagingAreas(cfg.StagingDir)
	if err != nil {
		return nil, err
	}
	for _, a := range areas {
		if a.Name == "" && len(byUUID[a.Key]) == 1 {
			if _, err := history.MigrateStaging(cfg.StagingDir, a.Key, byUUID[a.Key][0]); err != nil {
				h.log.Warn("history: staging not migrated to the per-object layout", "db", a.Key, "err", err)
			}
		}
	}
	if areas, err = history.StagingAreas(cfg.StagingDir); err != nil {
		return nil, err
	}
	for _, a := range areas {
		path := "" // a swept object: ship what is left, nothing to restore into
		if _, ok := h.objects[a.Name]; ok && a.Name != "" {
			path = h.path(a.Name)
		} else if ids := byUUID[a.Key]; a.Name == "" && len(ids) == 1 {
			path = h.path(ids[0])
		}
		c, err := history.NewCapturer(a.Key, path, history.CaptureOptions{StagingDir: cfg.StagingDir, StagingName: a.Name})
		if err != nil {
			h.log.Warn("history: staging area skipped", "db", a.Key, "object", a.Name, "err", err)
			continue
		}
		if err := c.SealForShipping(); err != nil {
			h.log.Warn("history: staging area not sealed", "db", a.Key, "object", a.Name, "err", err)
			continue
		}
		hh.ship.Retire(c)
	}
	return hh, nil
}

// start runs the shipper (and the retention sweeper) until close.
func (hh *hostHistory) start(h *Host) {
	ctx, cancel := context.WithCancel(context.Background())
	hh.stop, hh.done = cancel, make(chan struct{})
	hh.markCh = make(chan struct{}, 1)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); hh.ship.Run(ctx) }()
	wg.Add(1)
	go func() { defer wg.Done(); hh.markLoop(ctx, h) }()
	if hh.cfg.SweepInterval > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.NewTicker(hh.cfg.SweepInterval)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
					hh.sweep(ctx, h)
				}
			}
		}()
	}
	if hh.cfg.ScrubInterval > 0 {
		wg.Add(1)
		go func() { defer wg.Done(); hh.scrubLoop(ctx, h) }()
	}
	wg.Add(1)
	go func() { defer wg.Done(); hh.runDamageChecks(ctx, h) }()
	go func() { wg.Wait(); close(hh.done) }()
}

// sweep deletes, for every active database, the archived history no
// restore inside Retention can need (history.Archive.Sweep).
func (hh *hostHistory) sweep(ctx context.Context, h *Host) {
	h.mu.RLock()
	uuids := make([]string, 0, len(h.objects))
	for _, o := range h.objects {
		if m := o.meta.Load(); m != nil && !m.deleted() {
			uuids = append(uuids, m.DatabaseUUID)
		}
	}
	h.mu.RUnlock()
	cutoff := h.now().Add(-hh.cfg.Retention)
	deleted := 0
	for _, u := range uuids {
		if ctx.Err() != nil {
			return
		}
		hh.archiveMu.Lock()
		st, err := hh.archive.Sweep(ctx, u, cutoff)
		hh.archiveMu.Unlock()
		if err != nil {
			h.log.Warn("history: retention sweep failed", "db", u, "err", err)
			continue
		}
		deleted += st.Deleted
	}
	if deleted > 0 {
		h.log.Info("history: retention sweep", "databases", len(uuids), "objects_deleted", deleted)
	}
	rep, err := hh.sweepDeletedArchives(ctx, h)
	if err != nil {
		h.log.Warn("history: sweep of deleted databases' archives failed; retried next pass", "err", err)
	}
	if rep.Deleted > 0 || rep.Held > 0 || rep.Failures > 0 {
		h.log.Info("history: deleted databases' archives", "deleted", rep.Deleted, "objects", rep.Objects, "held", rep.Held, "failures", rep.Failures, "not_due", rep.NotDue)
	}
	if hh.cfg.BucketSweepInterval > 0 && (hh.lastBucket.IsZero() || h.now().Sub(hh.lastBucket) >= hh.cfg.BucketSweepInterval) {
		brep, err := hh.sweepBucketArchives(ctx, h)
		switch {
		case err != nil:
			h.log.Warn("history: bucket-wide sweep of deleted databases' archives failed; retried at the next sweep", "err", err)
		default:
			hh.lastBucket = h.now()
			if brep.Coordinator && (brep.Deleted > 0 || brep.Held > 0 || brep.Failures > 0) {
				h.log.Info("history: bucket-wide sweep of deleted databases' archives", "databases", brep.Listed, "deleted", brep.Deleted, "objects", brep.Objects, "held", brep.Held, "failures", brep.Failures, "not_due", brep.NotDue, "unknown", brep.Unknown)
			}
		}
	}
}

// close runs after every handle closed: one last shipment of what is
// local (bounded), then the shipper stops.
func (hh *hostHistory) close(log interface{ Warn(string, ...any) }) {
	ctx, cancel := context.WithTimeout(context.Background(), hh.cfg.DrainTimeout)
	defer cancel()
	if err := hh.ship.Drain(ctx); err != nil {
		log.Warn("history: not everything was archived before closing; it ships after the next start", "err", err)
	}
	hh.stop()
	<-hh.done
}

// liveDB is an open handle: the database and, with history on, its
// capturer, closed after it (the capturer's descriptor of the database
// file must outlive SQLite's, see history.Capturer.Close).
type liveDB struct {
	*sqlexec.DB
	cap *history.Capturer
	hh  *hostHistory
	id  string
}

func (l *liveDB) Close() error {
	err := l.DB.Close() // the writer calls cap.Closing (Flush) before the final checkpoint
	if l.cap != nil {
		if cerr := l.cap.Close(); err == nil {
			err = cerr
		}
		r, clean := l.cap.Reopen()
		l.hh.mu.Lock()
		if l.hh.caps[l.id] == l.cap {
			delete(l.hh.caps, l.id)
		}
		if clean && err == nil && !l.hh.restoring[l.id] {
			l.hh.keepReopen(l.id, r)
		}
		l.hh.mu.Unlock()
		l.hh.ship.Retire(l.cap) // ships what is left, then drops it
	}
	return err
}

// open opens objectID's database with its capturer attached.
func (hh *hostHistory) open(h *Host, objectID, path string) (*liveDB, error) {
	_, m, err := h.lookup(objectID)
	if err != nil {
		return nil, err
	}
	hh.mu.Lock()
	restoring := hh.restoring[objectID]
	hh.mu.Unlock()
	if restoring || m.Restoring != nil {
		return nil, ErrRestoring
	}
	opts := history.CaptureOptions{StagingDir: hh.cfg.StagingDir, StagingName: objectID, OnAppend: hh.ship.Notify, Now: h.now}
	hh.mu.Lock()
	if r, ok := hh.reopen[objectID]; ok {
		// Taken, not copied: the capturer opened now owns the area; only
		// its own clean close hands a state back.
		delete(hh.reopen, objectID)
		opts.Reopen = &r
	}
	hh.mu.Unlock()
	if hh.cfg.Archived {
		opts.WaitArchived = hh.ship.WaitArchived
	}
	c, err := history.NewCapturer(m.DatabaseUUID, path, opts)
	if err != nil {
		return nil, err
	}
	sopts := sqlexec.Options{Limits: h.cfg.Limits, ReadConns: h.cfg.ReadConns, Region: h.cfg.Region, Host: h.cfg.ID}
	// Attached by Open itself, before the handle serves anything: no round
	// trip to the writer goroutine on a cold open.
	c.AttachAtOpen(&sopts)
	db, err := sqlexec.Open(path, sopts)
	if err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("open with history: %w", err)
	}
	hh.ship.Add(c)
	if hh.cfg.Archived {
		c.ArmArchived() // only now: the shipper knows c (see CaptureOptions.WaitArchived)
	}
	hh.mu.Lock()
	hh.caps[objectID] = c
	hh.mu.Unlock()
	return &liveDB{DB: db, cap: c, hh: hh, id: objectID}, nil
}

// maxReopen bounds hostHistory.reopen (a few hundred bytes each).
const maxReopen = 1 << 16

// keepReopen remembers objectID's clean staging state (hh.mu held).
func (hh *hostHistory) keepReopen(objectID string, r history.Reopen) {
	if _, ok := hh.reopen[objectID]; !ok && len(hh.reopen) >= maxReopen {
		for id := range hh.reopen { // any one: it only costs a recovery
			delete(hh.reopen, id)
			break
		}
	}
	hh.reopen[objectID] = r
}

// forgetReopen drops objectID's remembered staging state: something other
// than its capturer is about to change the area.
func (hh *hostHistory) forgetReopen(objectID string) {
	hh.mu.Lock()
	delete(hh.reopen, objectID)
	hh.mu.Unlock()
}

// historyRoutes registers the time-travel endpoints (404 without history).
func (h *Host) historyRoutes(r *mux.Router) {
	r.HandleFunc("/v1/objects/{id}/time_travel/bookmark", h.handleBookmark).Methods(http.MethodGet)
	r.HandleFunc("/v1/objects/{id}/time_travel/restore", h.handleRestore).Methods(http.MethodPost)
	r.HandleFunc("/v1/history/status", func(w http.ResponseWriter, _ *http.Request) {
		st := h.HistoryStatus()
		if st == nil {
			writeHistoryErr(w, &errHistory{status: http.StatusNotFound, code: v4.CodeNotFound, msg: "time travel is not enabled on this host"})
			return
		}
		v4.WriteResult(w, map[string]any{"lag_seconds": st.Lag.Seconds(), "alarm": st.Alarm, "backlog_databases": st.Backlog, "last_error": st.LastError,
			"scrub": h.ScrubStatus()})
	}).Methods(http.MethodGet)
	// A scrub of every live database now (?sample=N objects read per
	// database; -1: all), answered when done: scrub.go. Operator work (it
	// reads the whole archive of every database with -1): only the
	// operator role under mutual TLS, as /debug/pprof (internal/
	// profiling); an edge's certificate, which peerAllowed admits to the
	// object routes, is refused. Without TLS (--insecure) open, like
	// every internal endpoint then.
	r.Handle("/v1/history/scrub", h.cfg.TLS.Require(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sample := 0
		if s := r.URL.Query().Get("sample"); s != "" {
			n, err := strconv.Atoi(s)
			if err != nil || n < -1 {
				writeHistoryErr(w, invalidHistory("sample is a count of objects per database, or -1 for all"))
				return
			}
			sample = n
		}
		if err := h.ScrubNow(r.Context(), sample); err != nil {
			writeHistoryErr(w, err)
			return
		}
		v4.WriteResult(w, h.ScrubStatus())
	}), pki.RoleOperator)).Methods(http.MethodPost)
}

// BookmarkResult is GET …/time_travel/bookmark's result (D1's shape).
type BookmarkResult struct {
	Bookmark string `json:"bookmark"`
}

// RestoreResult is POST …/time_travel/restore's result (D1's shape).
type RestoreResult struct {
	Bookmark         string `json:"bookmark"`
	PreviousBookmark string `json:"previous_bookmark"`
	Message          string `json:"message"`
}

func (h *Host) handleBookmark(w http.ResponseWriter, r *http.Request) {
	id := mux.Vars(r)["id"]
	if err := h.checkIdentity(r, id); err != nil {
		writeErr(w, err)
		return
	}
	res, err := h.Bookmark(r.Context(), id, r.URL.Query().Get("timestamp"), retentionParam(r))
	if err != nil {
		writeHistoryErr(w, err)
		return
	}
	v4.WriteResult(w, res)
}

func (h *Host) handleRestore(w http.ResponseWriter, r *http.Request) {
	id := mux.Vars(r)["id"]
	if err := h.checkIdentity(r, id); err != nil {
		writeErr(w, err)
		return
	}
	q := r.URL.Query()
	res, err := h.Restore(r.Context(), id, q.Get("bookmark"), q.Get("timestamp"), retentionParam(r))
	if err != nil {
		writeHistoryErr(w, err)
		return
	}
	v4.WriteResult(w, res)
}

func retentionParam(r *http.Request) time.Duration {
	d, err := strconv.Atoi(r.URL.Query().Get("retention_days"))
	if err != nil || d <= 0 {
		return 0
	}
	return time.Duration(d) * 24 * time.Hour
}

// errHistory is a time-travel refusal with its D1-style code and status.
type errHistory struct {
	status, code int
	msg          string // what the client reads
	cause        error  // why, for the host's log (never sent)
}

func (e *errHistory) Error() string {
	if e.cause != nil {
		return e.msg + ": " + e.cause.Error()
	}
	return e.msg
}

func (e *errHistory) Unwrap() error { return e.cause }

func writeHistoryErr(w http.ResponseWriter, err error) {
	var he *errHistory
	switch {
	case errors.As(err, &he):
		noteReason(w, err)
		v4.WriteError(w, he.status, he.code, he.msg)
	case errors.Is(err, history.ErrBadBookmark):
		v4.WriteError(w, http.StatusBadRequest, v4.CodeInvalidRequest, "invalid bookmark")
	case errors.Is(err, history.ErrNoHistory):
		v4.WriteError(w, http.StatusBadRequest, v4.CodeInvalidRequest, "no restorable state at that point (before the database's history or past its retention)")
	case errors.Is(err, history.ErrStoreFailed):
		noteReason(w, err)
		v4.WriteRetryAfter(w, http.StatusServiceUnavailable, v4.CodeUnavailable, "the archive store is unavailable, nothing was changed; retry", time.Second)
	case errors.Is(err, ErrRestoring):
		noteReason(w, err)
		v4.WriteError(w, http.StatusServiceUnavailable, v4.CodeUnavailable, ErrRestoring.Error())
	default:
		writeErr(w, err)
	}
}

func invalidHistory(format string, a ...any) error {
	return &errHistory{status: http.StatusBadRequest, code: v4.CodeInvalidRequest, msg: fmt.Sprintf(format, a...)}
}

// parseTimestamp reads D1's two formats: Unix seconds, or an ISO-8601
// date-time (JavaScript's Date string format).
func parseTimestamp(s string) (time.Time, error) {
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		return time.Unix(n, 0).UTC(), nil
	}
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04:05.000Z07:00", "2006-01-02T15:04:05Z07:00", "2006-01-02T15:04Z07:00", "2006-01-02"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t.UTC(), nil
		}
	}
	return time.Time{}, invalidHistory("invalid timestamp %q: use Unix seconds or an ISO-8601 date-time", s)
}

func (h *Host) historyOn() (*hostHistory, error) {
	if h.hist == nil {
		// Not 404: an edge reads a 404 as a stale route and the client
		// would be told the database does not exist.
		return nil, &errHistory{status: http.StatusBadRequest, code: v4.CodeInvalidRequest, msg: "time travel is not enabled on this database's object host (it runs without an archive: objecthost serve --archive-dir)"}
	}
	return h.hist, nil
}

// current returns the live capturer of objectID, opening the database if
// needed; release must be called.
func (h *Host) current(objectID string) (*history.Capturer, func(), error) {
	_, m, err := h.lookup(objectID)
	if err != nil {
		return nil, nil, err
	}
	if m.deleted() {
		return nil, nil, ErrDeleted
	}
	hd, err := h.handles.acquire(objectID)
	if err != nil {
		return nil, nil, err
	}
	return hd.db.cap, func() { h.handles.release(hd) }, nil
}

// errCaptureBehind: the database's history capture is failing (e.g. its
// staging log cannot be written: the host's disk is full), so no point that
// holds every acknowledged write exists yet. Bookmarks and restores wait
// for it rather than name a stale point.
var errCaptureBehind = &errHistory{status: http.StatusServiceUnavailable, code: v4.CodeUnavailable,
	msg: "time travel is behind on this database (the host cannot write its history log yet); retry"}

// captureBehindRestoreMsg is errCaptureBehind's message for a restore.
const captureBehindRestoreMsg = "time travel is behind on this database (the host cannot write its history log yet); nothing was changed; retry"

// Bookmark is GET …/time_travel/bookmark: the current bookmark, or with a
// timestamp the bookmark of the last commit at or before it.
func (h *Host) Bookmark(ctx context.Context, objectID, timestamp string, retention time.Duration) (BookmarkResult, error) {
	hh, err := h.historyOn()
	if err != nil {
		return BookmarkResult{}, err
	}
	c, release, err := h.current(objectID)
	if err != nil {
		return BookmarkResult{}, err
	}
	defer release()
	// The current point must hold every write acknowledged before this
	// call: while capture fails (e.g. the staging disk is full) there is
	// no such point yet — retry, rather than a bookmark that restores to
	// a state without them.
	cur, err := c.Exact()
	if err != nil {
		return BookmarkResult{}, errCaptureBehind
	}
	if timestamp == "" {
		return BookmarkResult{Bookmark: string(history.MakeBookmark(c.Key(), cur))}, nil
	}
	t, err := parseTimestamp(timestamp)
	if err != nil {
		return BookmarkResult{}, err
	}
	if err := hh.checkRetention(h, t, retention); err != nil {
		return BookmarkResult{}, err
	}
	if !t.Before(cur.Time()) {
		return BookmarkResult{Bookmark: string(history.MakeBookmark(c.Key(), cur))}, nil
	}
	// Commits up to t may still be local only: archive them first.
	if err := hh.ship.Sync(ctx, c); err != nil {
		return BookmarkResult{}, &errHistory{status: http.StatusServiceUnavailable, code: v4.CodeUnavailable, msg: "the archive store is unavailable, retry", cause: err}
	}
	p, err := hh.archive.Resolve(ctx, c.Key(), t)
	if err != nil {
		return BookmarkResult{}, hh.restoreDamaged(h, "bookmark", c.Key(), objectID, history.Position{}, "no bookmark can be given for that time", err)
	}
	return BookmarkResult{Bookmark: string(history.MakeBookmark(c.Key(), p))}, nil
}

func (hh *hostHistory) checkRetention(h *Host, t time.Time, retention time.Duration) error {
	if retention <= 0 || retention > hh.cfg.Retention {
		retention = hh.cfg.Retention
	}
	if oldest := h.now().Add(-retention); t.Before(oldest) {
		return invalidHistory("%s is older than the retention period (%d days)", t.Format(time.RFC3339), int(retention.Hours()/24))
	}
	return nil
}

// Restore is POST …/time_travel/restore: the database becomes its state at
// the bookmark (or the last commit at or before the timestamp); the
// previous bookmark undoes it. Queries meanwhile get 503 (retry).
//
// Steps: take the restore slot (no handle can open) → close the handle →
// archive what is local (the previous bookmark must be restorable; store
// down: refused, nothing changed) → history.RestoreInPlace (*its tip is
// the checkpoint*: a crash after it completes the restore at the next
// open) → release the slot.
func (h *Host) Restore(ctx context.Context, objectID, bookmark, timestamp string, retention time.Duration) (RestoreResult, error) {
	hh, err := h.historyOn()
	if err != nil {
		return RestoreResult{}, err
	}
	if (bookmark == "") == (timestamp == "") {
		return RestoreResult{}, invalidHistory("give exactly one of bookmark and timestamp")
	}
	o, m, err := h.lookup(objectID)
	if err != nil {
		return RestoreResult{}, err
	}
	if m.deleted() {
		return RestoreResult{}, ErrDeleted
	}
	// Imports a dead process left unresolved are resolved on the database
	// as it is, before the restore may change its application_id (the
	// tag that says they committed: importjobs.go) — waiting for one still
	// looking up its bookmark (≤ 5 s; its job file is rewritten after).
	if err := h.dump.awaitResolved(ctx, m); err != nil {
		return RestoreResult{}, err
	}
	h.dump.mu.Unlock()
	key := m.DatabaseUUID
	var target history.Position
	if bookmark != "" {
		if target, err = history.ParseBookmark(key, history.Bookmark(bookmark)); err != nil {
			return RestoreResult{}, err
		}
		if err := hh.checkRetention(h, target.Time(), retention); err != nil {
			return RestoreResult{}, err
		}
	}
	var tsTime time.Time
	if timestamp != "" {
		if tsTime, err = parseTimestamp(timestamp); err != nil {
			return RestoreResult{}, err
		}
		if err := hh.checkRetention(h, tsTime, retention); err != nil {
			return RestoreResult{}, err
		}
	}

	now := h.now()
	hh.mu.Lock()
	if hh.restoring[objectID] {
		hh.mu.Unlock()
		return RestoreResult{}, ErrRestoring
	}
	recent := hh.restores[objectID][:0]
	for _, t := range hh.restores[objectID] {
		if now.Sub(t) < hh.cfg.RestoreWindow {
			recent = append(recent, t)
		}
	}
	hh.restores[objectID] = recent
	if len(recent) >= hh.cfg.MaxRestores {
		hh.mu.Unlock()
		return RestoreResult{}, &errHistory{status: http.StatusTooManyRequests, code: v4.CodeRateLimited,
			msg: fmt.Sprintf("at most %d restores per %s per database", hh.cfg.MaxRestores, hh.cfg.RestoreWindow)}
	}
	hh.restoring[objectID] = true
	hh.mu.Unlock()
	defer func() {
		hh.mu.Lock()
		delete(hh.restoring, objectID)
		hh.mu.Unlock()
	}()
	o.mu.Lock() // no delete or other mutation of this object meanwhile
	defer o.mu.Unlock()

	// Close the handle (waits for requests using it) and archive what the
	// closed capturer still has locally.
	hh.mu.Lock()
	c := hh.caps[objectID]
	hh.mu.Unlock()
	<-h.handles.evict(objectID)
	// The restore rewrites the staging area: the next open recovers it.
	// (The closed handle did not keep a state: restoring is set.)
	hh.forgetReopen(objectID)
	if c == nil {
		// Not open: open it once so its staging is recovered and sealed.
		c, err = history.NewCapturer(key, h.path(objectID), history.CaptureOptions{StagingDir: hh.cfg.StagingDir, StagingName: objectID})
		if err == nil {
			err = c.SealForShipping()
		}
		if err != nil {
			return RestoreResult{}, err
		}
	}
	if err := hh.ship.Sync(ctx, c); err != nil {
		return RestoreResult{}, &errHistory{status: http.StatusServiceUnavailable, code: v4.CodeUnavailable, msg: "the archive store is unavailable, nothing was changed; retry", cause: err}
	}
	// The undo point must hold every write acknowledged before the restore
	// (see Bookmark): while capture fails, refuse before changing anything.
	previous, err := c.Exact()
	if err != nil {
		return RestoreResult{}, &errHistory{status: http.StatusServiceUnavailable, code: v4.CodeUnavailable, msg: captureBehindRestoreMsg}
	}
	if previous.Gen == "" {
		if previous, err = hh.archive.Latest(ctx, key); err != nil {
			return RestoreResult{}, err
		}
	}
	const unchanged = "nothing was changed: the database keeps its current content"
	// Everything through previous was shipped (Sync above). If the store
	// lost some of it since, the undo point does not restore: a restore
	// now would lose the current content for good. Refused; the check it
	// queues heals the archive (a snapshot of the current point), after
	// which a restore elsewhere is accepted again (restoredamage.go).
	if lt := hh.lostTail(ctx, key, previous); lt != nil {
		inTail := timestamp == "" && target.Gen == lt.Gen && target.Txid >= lt.FirstTxid ||
			timestamp != "" && !tsTime.Before(lt.After.Time())
		err := hh.restoreDamaged(h, "restore", key, objectID, target, unchanged, lt)
		if !inTail {
			return RestoreResult{}, &errHistory{status: http.StatusServiceUnavailable, code: v4.CodeUnavailable,
				msg: "the archive lost this database's newest history, so the restore could not be undone; the host is archiving its current state again; nothing was changed; retry", cause: err}
		}
		return RestoreResult{}, err
	}
	if timestamp != "" {
		if target, err = hh.archive.Resolve(ctx, key, tsTime); err != nil {
			return RestoreResult{}, hh.restoreDamaged(h, "restore", key, objectID, history.Position{}, unchanged, err)
		}
	}
	restored, err := history.RestoreInPlace(ctx, hh.archive, key, h.path(objectID), target, history.CaptureOptions{StagingDir: hh.cfg.StagingDir, StagingName: objectID, Now: h.now})
	if err != nil {
		return RestoreResult{}, hh.restoreDamaged(h, "restore", key, objectID, target, unchanged, err)
	}
	hh.mu.Lock()
	hh.restores[objectID] = append(hh.restores[objectID], now)
	hh.mu.Unlock()
	h.noteStoredSize(o, m) // the restored file's size, the same measure a write publishes
	h.log.Info("database restored", "db", key, "object", objectID, "to", history.MakeBookmark(key, target), "previous", history.MakeBookmark(key, previous))
	nb := string(history.MakeBookmark(key, restored))
	return RestoreResult{
		Bookmark:         nb,
		PreviousBookmark: string(history.MakeBookmark(key, previous)),
		Message:          fmt.Sprintf("Database restored to %s (bookmark %s); restore to the previous bookmark to undo", target.Time().Format(time.RFC3339), history.MakeBookmark(key, target)),
	}, nil
}

// HistoryStatus is the shipper's state for /v1/status (nil without history).
func (h *Host) HistoryStatus() *history.ShipperStatus {
	if h.hist == nil {
		return nil
	}
	st := h.hist.ship.Status()
	return &st
}

// waitArchived waits, briefly, until the archive holds key's position p
// (shipping runs ≤ MaxLag behind the commits a bookmark names); then 503.
func (hh *hostHistory) waitArchived(ctx context.Context, key string, p history.Position) error {
	for deadline := time.Now().Add(5 * time.Second); ; {
		latest, err := hh.archive.Latest(ctx, key)
		if err == nil && latest.TimeUs >= p.TimeUs {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return &errHistory{status: http.StatusServiceUnavailable, code: v4.CodeUnavailable,
				msg: "that bookmark is not in the archive yet (or the archive is unavailable); retry", cause: err}
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// copyAt writes the database as it was at bookmark into a temporary file
// (an export at a bookmark reads it) and returns its path and the function
// that removes it. The live database is untouched. A bookmark newer than
// what the archive holds yet (shipping runs ≤ MaxLag behind) is waited for
// briefly, then answered 503 (retry).
func (h *Host) copyAt(ctx context.Context, objectID, bookmark string, retention time.Duration) (string, func(), error) {
	hh, err := h.historyOn()
	if err != nil {
		return "", nil, err
	}
	_, m, err := h.lookup(objectID)
	if err != nil {
		return "", nil, err
	}
	target, err := history.ParseBookmark(m.DatabaseUUID, history.Bookmark(bookmark))
	if err != nil {
		return "", nil, err
	}
	if err := hh.checkRetention(h, target.Time(), retention); err != nil {
		return "", nil, err
	}
	// A point this host shipped that the archive no longer reaches (the
	// store lost the newest segments) would otherwise be waited for as
	// "not archived yet" and answered 503 forever.
	if sh, err := history.ShippedOf(hh.cfg.StagingDir, history.StagingArea{Key: m.DatabaseUUID, Name: objectID}); err == nil &&
		sh.OK && target.Gen == sh.Gen && target.Txid <= sh.Txid {
		if lt := hh.lostTail(ctx, m.DatabaseUUID, history.Position{Gen: sh.Gen, Txid: sh.Txid}); lt != nil && target.Txid >= lt.FirstTxid {
			return "", nil, hh.restoreDamaged(h, "export", m.DatabaseUUID, objectID, target, "nothing was exported", lt)
		}
	}
	if err := hh.waitArchived(ctx, m.DatabaseUUID, target); err != nil {
		return "", nil, err
	}
	dir, err := os.MkdirTemp(hh.cfg.StagingDir, "export-")
	if err != nil {
		return "", nil, err
	}
	cleanup := func() { _ = os.RemoveAll(dir) }
	dst := filepath.Join(dir, "at.db")
	if _, err := hh.archive.Restore(ctx, m.DatabaseUUID, target, dst); err != nil {
		cleanup()
		return "", nil, hh.restoreDamaged(h, "export", m.DatabaseUUID, objectID, target, "nothing was exported", err)
	}
	return dst, cleanup, nil
}
