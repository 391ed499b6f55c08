package objecthost

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/shoaldb/shoal/internal/binding"
	"github.com/shoaldb/shoal/internal/pki"
	"github.com/shoaldb/shoal/objecthost/sqlexec"
	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// Config configures a Host. Zero values take the documented defaults.
type Config struct {
	// TLS, when set, is the host's cluster certificate: its internal API
	// admits only callers whose certificates hold the roles of
	// peerAllowed (http.go). The listener itself is the caller's (cmd/shoal
	// wraps it, internal/pki); nil: no authentication (insecure mode).
	TLS          *pki.Loader
	ID           string // host ID in the catalog (required)
	Dir          string // data directory (required)
	Address      string // advertised host:port of the internal API
	Region       string
	Jurisdiction string
	Capacity     int64 // databases this host accepts (reported to the catalog)

	MaxOpen   int            // open handles kept in the LRU (default 1,000)
	ReadConns int            // sqlexec read connections per handle (default 1; -1 none)
	Limits    sqlexec.Limits // per-database SQL limits (default sqlexec.DefaultLimits)

	HeartbeatInterval time.Duration // default 30 s
	HeartbeatTick     time.Duration // how often due heartbeats are sent (default 1 s)
	HeartbeatBatch    int           // UUIDs per catalog call (default 5,000; the catalog accepts up to 10,000)
	// HeartbeatDigestsOff sends per-database heartbeats only, never bucket
	// digests (digests.go), even to a catalog that supports them.
	HeartbeatDigestsOff bool
	HeartbeatRetry      time.Duration // retry delay after a failed catalog call (default 5 s)
	CreationGrace       time.Duration // unknown-to-catalog orphans die after this age (default 2 min)
	// A heartbeat pass whose confirmed orphans number more than
	// max(OrphanMassFloor, OrphanMassFraction × databases sent) deletes none
	// of them and raises the mass-orphan alarm (defaults 10 and 0.01).
	OrphanMassFloor    int
	OrphanMassFraction float64
	DeletedRetention   time.Duration // deleted files are swept after this (default 24 h)
	SweepInterval      time.Duration // default 1 min
	LoadReportInterval time.Duration // default 10 s
	// The route feed's anti-entropy (routerepublish.go): dirty routes
	// (failed publications, deleted ones included) are retried every
	// DirtyRouteRetry (default 1 min), and every confirmed route is
	// published again every RouteRepublishInterval (default 1 h), at most
	// RouteRepublishRate per second (default 1,000). Negative disables.
	// StorageRefresh is the dynamic TTL of account storage totals: an
	// account within StorageRefreshNear (default 0.9) of its storage limit,
	// or over it, has its total re-read every StorageRefresh (default 5 s)
	// instead of only with its databases' heartbeats (default every 30 s),
	// one read per account whatever its number of databases, so the block
	// and its lifting land within seconds where it matters. Negative
	// disables. Needs a Catalog that is also an AccountReader.
	StorageRefresh         time.Duration
	StorageRefreshNear     float64
	DirtyRouteRetry        time.Duration
	RouteRepublishInterval time.Duration
	RouteRepublishRate     int
	// SizeRepublishRate paces the pass that, after every start of a host
	// without a catalog, publishes the size of every live database once
	// (sizerepublish.go: sizes a crash lost in memory are otherwise never
	// sent again; with a catalog each object's first current heartbeat
	// does it). Per second; default 1,000; negative disables both.
	SizeRepublishRate int
	CatalogTimeout    time.Duration // per catalog call (default 10 s)
	MaxBodyBytes      int64         // query body limit (default 10 MB)

	Catalog Catalog   // nil: no heartbeats, no registration (tests, dev)
	Usage   UsageSink // nil: discarded
	Sizes   SizeSink  // nil: discarded
	Routes  RouteSink // nil: discarded
	// LimitsFeed, when set, makes the host consume the limiter's compacted
	// limits topic (limitsfeed.go) and refuse the queries of a limited
	// account until its flag lifts. It runs also when Manual is set.
	LimitsFeed *LimitsFeedOptions
	// Registry, when set, is where the host registers its metrics and what
	// its /metrics serves, so the process can add the pipeline's collectors
	// to the same page. Default: a registry of its own.
	Registry *prometheus.Registry

	// History, when set, captures every database's commits into an
	// off-host archive and serves time travel (history.go).
	History *HistoryConfig

	// Bindings verifies binding tokens for /v1/bound/*; nil disables the
	// bound routes (404).
	Bindings *binding.Keyring

	// Tenant bounds what one account may take of the host (tenant.go).
	Tenant TenantLimits

	// Now is the clock for heartbeats, grace periods, retention and token
	// expiry (default time.Now).
	Now func() time.Time
	// Manual disables the background loops (heartbeats, sweeper,
	// registration, load reports); tests drive RunHeartbeats and Sweep.
	Manual bool
	Logger *slog.Logger
}

func (c *Config) setDefaults() {
	if c.MaxOpen <= 0 {
		c.MaxOpen = 1000
	}
	if c.ReadConns == 0 {
		c.ReadConns = 1
	}
	if c.Limits == (sqlexec.Limits{}) {
		c.Limits = sqlexec.DefaultLimits()
	}
	if c.HeartbeatInterval <= 0 {
		c.HeartbeatInterval = 30 * time.Second
	}
	if c.HeartbeatTick <= 0 {
		c.HeartbeatTick = time.Second
	}
	if c.HeartbeatBatch <= 0 {
		c.HeartbeatBatch = 5000
	}
	if c.HeartbeatRetry <= 0 {
		c.HeartbeatRetry = 5 * time.Second
	}
	if c.CreationGrace <= 0 {
		c.CreationGrace = 2 * time.Minute
	}
	if c.OrphanMassFloor <= 0 {
		c.OrphanMassFloor = 10
	}
	if c.OrphanMassFraction <= 0 {
		c.OrphanMassFraction = 0.01
	}
	if c.DeletedRetention <= 0 {
		c.DeletedRetention = 24 * time.Hour
	}
	if c.SweepInterval <= 0 {
		c.SweepInterval = time.Minute
	}
	if c.LoadReportInterval <= 0 {
		c.LoadReportInterval = 10 * time.Second
	}
	if c.CatalogTimeout <= 0 {
		c.CatalogTimeout = 10 * time.Second
	}
	if c.MaxBodyBytes <= 0 {
		c.MaxBodyBytes = 10 << 20
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Usage == nil {
		c.Usage = discard{}
	}
	if c.Sizes == nil {
		c.Sizes = discard{}
	}
	if c.Routes == nil {
		c.Routes = discard{}
	}
	if c.StorageRefresh == 0 {
		c.StorageRefresh = 5 * time.Second
	}
	if c.StorageRefreshNear <= 0 || c.StorageRefreshNear > 1 {
		c.StorageRefreshNear = 0.9
	}
	if c.DirtyRouteRetry == 0 {
		c.DirtyRouteRetry = time.Minute
	}
	if c.RouteRepublishInterval == 0 {
		c.RouteRepublishInterval = time.Hour
	}
	if c.RouteRepublishRate == 0 {
		c.RouteRepublishRate = 1000
	}
	if c.SizeRepublishRate == 0 {
		c.SizeRepublishRate = 1000
	}
}

type discard struct{}

func (discard) RecordUsage(UsageEvent)                    {}
func (discard) RecordSize(SizeEvent)                      {}
func (discard) PublishRoute(context.Context, Route) error { return nil }

// Host owns the SQLite files of one data directory. All methods are safe for
// concurrent use.
type Host struct {
	cfg     Config
	now     func() time.Time
	log     *slog.Logger
	ix      *index
	handles *handleCache[*liveDB]
	hist    *hostHistory // nil: history off
	m       *metrics
	sched   *schedule
	digests hostDigests // per-bucket digests of the active objects (digests.go)
	// digestOffUntil: Unix ns before which heartbeats are per-database
	// only (the catalog answered ErrDigestsUnsupported).
	digestOffUntil atomic.Int64

	// shardDirs: the dbs/ab/cd directories known to exist (openDB; at
	// most 65,536).
	shardDirs dirSet

	mu      sync.RWMutex
	objects map[string]*object  // object ID → object (placeholders have nil meta)
	deleted map[string]struct{} // object IDs in state deleted, for the sweeper

	accMu    sync.RWMutex
	accounts map[string]*accountState

	alarms alarmSet // destructive verdicts held (see orphans.go)
	// declaredLost: the catalog answered this host's registration with
	// state "lost" (an operator declared it lost; relocated.go).
	declaredLost atomic.Bool
	// catalogRestores is 1 + the highest catalog restore count a
	// heartbeat answer carried since the start (0: no answer yet;
	// sizerepublish.go, noteCatalogRestores).
	catalogRestores atomic.Int64
	// resurrect: databases deleted here that a restored catalog lists
	// active again (resurrected.go).
	resurrect resurrection

	active     atomic.Int64 // objects in state active
	totalBytes atomic.Int64 // sum of objects' last known sizes
	sizeSeq    atomic.Int64 // last size sequence handed out (see nextSizeSeq)

	// bufs holds *[]byte buffers reused by the query path for request
	// bodies and responses (one per request in flight).
	bufs sync.Pool

	closeOnce sync.Once
	closed    atomic.Bool
	jobMu     sync.Mutex  // makes startJob's closed check and wg.Add atomic with Close
	dump      *dumpAPI    // export/import jobs, one map per host
	limits    *limitsFeed // nil without Config.LimitsFeed
	cancel    context.CancelFunc
	wg        sync.WaitGroup

	tenant *tenantGuard // per-account admission, result budget (tenant.go)
	frames *frameServer // the edges' multiplexed query connections (frames.go)
}

// object is one database's in-memory state. meta is replaced, never
// modified in place; mu serialises mutations across their durable write so
// two mutations of one object reach the index in the order they are
// applied in memory.
type object struct {
	mu         sync.Mutex
	meta       atomic.Pointer[Meta]
	gone       bool         // swept or failed init: re-look-up (guarded by mu)
	size       atomic.Int64 // last known size in bytes (sqlexec's UsedBytes: pages in use)
	routeDirty atomic.Bool  // last route publication failed: next heartbeat retries
	sizeMu     sync.Mutex   // orders size measurements with their sequence numbers

	sizeRepublished atomic.Bool // size published again since this start (sizerepublish.go)
	sizeUnknown     atomic.Bool // the header could not be trusted at the start: measure by opening (sizerepublish.go)
}

// accountState is what heartbeats taught the host about an account.
type accountState struct {
	blockGrowth      bool
	maxDatabaseBytes int64     // fsm.Limits.MaxDatabaseBytes (0: no account limit)
	intervalMs       int64     // fsm.Limits.HeartbeatIntervalMs
	limitedUntil     time.Time // the limiter's flag (limits feed); zero or past: not limited
	limitReason      string    // which limit, e.g. "rows_written_per_day"
	storageBytes     int64     // the account's drained total, as last read
	maxStorageBytes  int64     // fsm.Limits.MaxStorageBytes (0: none)
}

// rowLimited returns the refusal for a query at now, or nil when the account
// is not limited: the flag expires on the clock, without any new record.
func (a *accountState) rowLimited(now time.Time) error {
	if a.limitedUntil.After(now) {
		return &RowLimitError{Reason: a.limitReason, Until: a.limitedUntil}
	}
	return nil
}

// Open loads the index of cfg.Dir (creating it if needed), schedules every
// active object's heartbeat and, unless cfg.Manual, starts the background
// loops. Close stops them.
func Open(cfg Config) (*Host, error) {
	cfg.setDefaults()
	if cfg.ID == "" || cfg.Dir == "" {
		return nil, fmt.Errorf("%w: host id and data dir are required", ErrInvalid)
	}
	// Absolute, so that every database path is too: sqlexec's VFS takes a
	// clean absolute path as its full name, where SQLite's own would
	// getcwd(3) and lstat(2) every directory from the root at each open
	// (and refuse a symbolic link among them).
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("data dir: %w", err)
	}
	cfg.Dir = dir
	if err := os.MkdirAll(filepath.Join(cfg.Dir, "dbs"), 0o755); err != nil {
		return nil, fmt.Errorf("create data dir: %w", err)
	}
	h := &Host{
		cfg:      cfg,
		now:      cfg.Now,
		log:      cfg.Logger,
		m:        newMetrics(cfg.Registry),
		sched:    &schedule{},
		objects:  map[string]*object{},
		deleted:  map[string]struct{}{},
		accounts: map[string]*accountState{},
	}
	ix, err := openIndex(filepath.Join(cfg.Dir, "index.db"), func(n int) { h.m.indexCommits.Observe(float64(n)) })
	if err != nil {
		return nil, err
	}
	ix.lazyFailed = func(n int) {
		h.log.Warn("index commit failed; lazily stored confirmations dropped (the next heartbeat confirms them again)", "records", n)
	}
	ix.checkpointFailed = func(err error) {
		h.log.Warn("index checkpoint failed; retrying (the journal keeps every committed record meanwhile)", "err", err)
	}
	h.ix = ix
	h.m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "shoal_objecthost_alarms", Help: "Alarms raised (mass of orphan verdicts, databases the catalog lost or lists again after their delete); see /v1/status.",
	}, func() float64 { return float64(len(h.Alarms())) }))
	h.bufs.New = func() any { b := make([]byte, 0, 4096); return &b }
	h.frames = newFrameServer(h)
	h.tenant = newTenantGuard(cfg.Tenant, h.m.reg)
	h.handles = newHandleCache(cfg.MaxOpen, h.openDB, func(n int) { h.m.openHandles.Set(float64(n)) })

	now := h.now()
	err = ix.load(func(m *Meta) error {
		o := &object{}
		h.setMeta(o, m)
		if size, ok := storedUsedBytes(h.path(m.ObjectID)); !ok {
			o.sizeUnknown.Store(true)
		} else if size > 0 {
			o.size.Store(size)
			h.totalBytes.Add(size)
		}
		h.objects[m.ObjectID] = o
		if m.deleted() {
			h.deleted[m.ObjectID] = struct{}{}
			return nil
		}
		h.active.Add(1)
		h.scheduleFirst(m, now)
		return nil
	})
	if err != nil {
		_ = ix.close()
		return nil, fmt.Errorf("load index: %w", err)
	}
	h.refreshGauges()
	h.dump = &dumpAPI{h: h, jobs: map[string]*importJob{}}
	if cfg.History != nil {
		if h.hist, err = newHostHistory(h, *cfg.History); err != nil {
			_ = ix.close()
			return nil, err
		}
	}

	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	if h.hist != nil {
		h.hist.start(h) // stopped in Close, after the handles
	}
	if cfg.LimitsFeed != nil {
		if err := h.startLimitsFeed(ctx, *cfg.LimitsFeed); err != nil {
			cancel()
			_ = ix.close()
			return nil, err
		}
	}
	if !cfg.Manual {
		h.startLoops(ctx)
	}
	return h, nil
}

// Close stops the background loops, waits for them, closes every open
// database (waiting for requests still using one) and the index. Requests
// arriving after Close fail with ErrClosed.
func (h *Host) Close() error {
	var err error
	h.closeOnce.Do(func() {
		// Queries in flight on frame connections finish first, as the
		// HTTP server's shutdown lets its own finish before Close.
		h.frames.shutdown(frameDrain)
		h.jobMu.Lock() // no startJob between this and wg.Wait
		h.closed.Store(true)
		h.jobMu.Unlock()
		h.cancel()
		h.wg.Wait()
		h.handles.closeEverything()
		if h.hist != nil {
			h.hist.close(h.log)
		}
		err = h.ix.close()
	})
	return err
}

// startLimitsFeed starts the limits feed and waits, up to o.StartWait, for
// it to read the topic to its end (see LimitsFeedOptions.StartWait).
func (h *Host) startLimitsFeed(ctx context.Context, o LimitsFeedOptions) error {
	f, err := newLimitsFeed(o, h)
	if err != nil {
		return err
	}
	for _, c := range f.collectors() {
		if err := h.m.reg.Register(c); err != nil {
			f.cl.Close()
			return fmt.Errorf("limits feed metrics: %w", err)
		}
	}
	h.limits = f
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		f.run(ctx)
	}()
	if !f.waitCaughtUp(ctx, f.o.StartWait) && f.o.StartWait >= 0 {
		h.log.Warn("limits feed not caught up at start; limited accounts are refused once it has read their flags", "waited", f.o.StartWait)
	}
	return nil
}

// startJob runs fn in a goroutine owned by the host: Close waits for it. It
// reports false, without running fn, once Close has begun.
func (h *Host) startJob(fn func()) bool {
	h.jobMu.Lock()
	defer h.jobMu.Unlock()
	if h.closed.Load() {
		return false
	}
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		fn()
	}()
	return true
}

// Registry is the host's Prometheus registry (served at /metrics).
func (h *Host) Registry() *prometheus.Registry { return h.m.reg }

// path is where an object's SQLite file lives: dbs/ab/cd/<id>.db, two
// levels of 256 directories so no directory holds more than a few thousand
// files even at millions of objects.
func (h *Host) path(objectID string) string {
	return filepath.Join(h.cfg.Dir, "dbs", objectID[0:2], objectID[2:4], objectID+".db")
}

// openDB opens (creating it on first use) an object's SQLite file.
func (h *Host) openDB(objectID string) (*liveDB, error) {
	p := h.path(objectID)
	// The shard directory is made (or found) once per process, not at
	// every open: os.MkdirAll's stat of the whole path was ~3% of a
	// host's CPU per cold query. Nothing here removes a shard directory;
	// if something else did, the open that fails for it makes it again
	// and retries once, as the MkdirAll at every open did.
	dir := filepath.Dir(p)
	known := h.shardDirs.has(dir)
	if !known {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("create shard dir: %w", err)
		}
		h.shardDirs.add(dir)
	}
	ldb, err := h.openFile(objectID, p)
	if err != nil && known {
		if _, serr := os.Stat(dir); errors.Is(serr, fs.ErrNotExist) {
			h.shardDirs.forget(dir)
			return h.openDB(objectID)
		}
	}
	return ldb, err
}

// openFile opens the SQLite file at p, whose directory exists.
func (h *Host) openFile(objectID, p string) (*liveDB, error) {
	if h.hist != nil {
		return h.hist.open(h, objectID, p) // with its history capturer
	}
	db, err := sqlexec.Open(p, sqlexec.Options{Limits: h.cfg.Limits, ReadConns: h.cfg.ReadConns, Region: h.cfg.Region, Host: h.cfg.ID})
	if err != nil {
		return nil, err
	}
	return &liveDB{DB: db}, nil
}

// dirSet is a set of directory paths, safe for concurrent use.
type dirSet struct{ m sync.Map }

func (s *dirSet) has(dir string) bool { _, ok := s.m.Load(dir); return ok }
func (s *dirSet) add(dir string)      { s.m.Store(dir, struct{}{}) }
func (s *dirSet) forget(dir string)   { s.m.Delete(dir) }

// lookup returns the object and its meta, or ErrNotFound.
func (h *Host) lookup(objectID string) (*object, *Meta, error) {
	h.mu.RLock()
	o := h.objects[objectID]
	h.mu.RUnlock()
	if o == nil {
		return nil, nil, ErrNotFound
	}
	m := o.meta.Load()
	if m == nil {
		return nil, nil, ErrNotFound
	}
	return o, m, nil
}

// storedUsedBytes is a closed database file's size as sqlexec's UsedBytes
// measures it — (page count − freelist count) × page size — read from the
// file's 100-byte header without opening it, so a start with a million
// databases stays a stat and a read each. ok is false when the header
// cannot be trusted: a WAL longer than its own header may hold newer pages
// (page 1 among them), or the in-header page count is stale (a writer that
// did not maintain it left version-valid-for behind the change counter).
// A database never created is 0, true.
func storedUsedBytes(p string) (int64, bool) {
	if fi, err := os.Stat(p + "-wal"); err == nil && fi.Size() > 32 {
		return 0, false
	}
	f, err := os.Open(p)
	if errors.Is(err, os.ErrNotExist) {
		return 0, true
	}
	if err != nil {
		return 0, false
	}
	defer f.Close()
	var hdr [100]byte
	if n, err := io.ReadFull(f, hdr[:]); err != nil {
		return 0, n == 0 && errors.Is(err, io.EOF) // an empty file holds nothing
	}
	if string(hdr[:16]) != "SQLite format 3\x00" {
		return 0, false
	}
	pageSize := int64(binary.BigEndian.Uint16(hdr[16:18]))
	if pageSize == 1 {
		pageSize = 65536
	}
	pages := int64(binary.BigEndian.Uint32(hdr[28:32]))
	free := int64(binary.BigEndian.Uint32(hdr[36:40]))
	if pageSize < 512 || pages == 0 || free > pages || binary.BigEndian.Uint32(hdr[24:28]) != binary.BigEndian.Uint32(hdr[92:96]) {
		return 0, false
	}
	return (pages - free) * pageSize, true
}

func validObjectID(id string) bool {
	if len(id) != 32 {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

func validUUID(s string) bool {
	u, err := uuid.Parse(s)
	return err == nil && u.String() == s
}

// Init records a new object durably. It is idempotent for the same
// (object, database UUID, account): a repeat returns the stored object.
// Another database for an existing object, or a repeat after the object was
// deleted, fails with ErrConflict (the edge then retries with new IDs).
//
// Checkpoint: the index commit. Before it the object does not exist (a
// crash leaves nothing); after it the object exists and will heartbeat, so
// if the catalog write of the create never happens it dies as an orphan
// after the creation grace period. The SQLite file is created lazily on the
// first query.
func (h *Host) Init(ctx context.Context, objectID string, req InitRequest) (ObjectInfo, error) {
	start := time.Now()
	if h.closed.Load() {
		return ObjectInfo{}, ErrClosed
	}
	switch {
	case !validObjectID(objectID):
		return ObjectInfo{}, fmt.Errorf("%w: object id must be 32 lowercase hex characters", ErrInvalid)
	case !validUUID(req.DatabaseUUID):
		return ObjectInfo{}, fmt.Errorf("%w: database_uuid must be a canonical lowercase UUID", ErrInvalid)
	case req.AccountID == "" || len(req.AccountID) > 64:
		return ObjectInfo{}, fmt.Errorf("%w: account_id must be 1..64 bytes", ErrInvalid)
	case len(req.Name) > 64:
		return ObjectInfo{}, fmt.Errorf("%w: name too long", ErrInvalid)
	}
	if req.RestoreFrom != nil {
		if err := h.checkRestoreSource(*req.RestoreFrom); err != nil {
			return ObjectInfo{}, err
		}
		// Before anything is written: a database its host deleted is
		// never revived from the archive (deletemark.go).
		if err := h.checkNotDeletedInArchive(ctx, req.RestoreFrom.DatabaseUUID); err != nil {
			return ObjectInfo{}, err
		}
	}
	for {
		h.mu.Lock()
		o := h.objects[objectID]
		if o == nil {
			o = &object{}
			h.objects[objectID] = o
		}
		h.mu.Unlock()

		o.mu.Lock()
		if o.gone {
			o.mu.Unlock()
			continue
		}
		if m := o.meta.Load(); m != nil {
			o.mu.Unlock()
			if m.DatabaseUUID != req.DatabaseUUID || m.AccountID != req.AccountID {
				h.m.lifecycle.WithLabelValues("init_conflict").Inc()
				return ObjectInfo{}, ErrConflict
			}
			if m.deleted() {
				// A repeated init arriving after the object died (e.g. killed
				// as an orphan): success would let the edge write a catalog
				// row pointing at a dead object. 409 makes it retry with
				// fresh IDs.
				h.m.lifecycle.WithLabelValues("init_conflict").Inc()
				return ObjectInfo{}, fmt.Errorf("%w: object was deleted", ErrConflict)
			}
			if m.Restoring != nil {
				// The retry of an init whose restore did not finish (a
				// crash, a failed archive read): resume it.
				return h.finishRestoreInit(ctx, objectID, start)
			}
			return h.info(o, m), nil
		}
		m := &Meta{
			ObjectID:          objectID,
			DatabaseUUID:      req.DatabaseUUID,
			AccountID:         req.AccountID,
			Name:              req.Name,
			Region:            req.Region,
			Jurisdiction:      req.Jurisdiction,
			State:             StateActive,
			CreatedAt:         h.now().UTC(),
			RoutingGeneration: req.RoutingGeneration,
			Options:           req.Options,
		}
		if req.RestoreFrom != nil {
			src := *req.RestoreFrom
			m.Restoring = &src
		}
		if err := h.ix.put(m); err != nil {
			o.gone = true
			o.mu.Unlock()
			h.mu.Lock()
			if h.objects[objectID] == o {
				delete(h.objects, objectID)
			}
			h.mu.Unlock()
			return ObjectInfo{}, err
		}
		h.setMeta(o, m)
		o.mu.Unlock()
		h.active.Add(1)
		h.scheduleFirst(m, h.now())
		h.refreshGauges()
		if m.Restoring != nil {
			return h.finishRestoreInit(ctx, objectID, start)
		}
		h.m.lifecycle.WithLabelValues("init").Inc()
		h.m.initLatency.Observe(time.Since(start).Seconds())
		return h.info(o, m), nil
	}
}

// Confirm marks the object confirmed (its catalog row exists) at least at
// generation gen and publishes its route. The record is stored lazily (it
// rides in the index's next commit, within defaultLazyDelay, instead of
// costing an fsync of its own): if the host crashes first, the object comes
// back unconfirmed and the next heartbeat confirms it again from the
// catalog, which is the checkpoint of record. A failed publication is
// retried by the next heartbeat too.
func (h *Host) Confirm(ctx context.Context, objectID string, gen int64) (ObjectInfo, error) {
	o, _, err := h.lookup(objectID)
	if err != nil {
		return ObjectInfo{}, err
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	m := o.meta.Load()
	if o.gone || m == nil {
		return ObjectInfo{}, ErrNotFound
	}
	if m.deleted() {
		return ObjectInfo{}, ErrDeleted
	}
	if !m.Confirmed || gen > m.RoutingGeneration {
		n := *m
		n.Confirmed = true
		n.RoutingGeneration = max(gen, m.RoutingGeneration)
		if err := h.ix.putLazy(&n); err != nil {
			return ObjectInfo{}, err
		}
		h.setMeta(o, &n)
		m = &n
	}
	h.publishLocked(ctx, o, m)
	h.m.lifecycle.WithLabelValues("confirm").Inc()
	return h.info(o, m), nil
}

// Delete marks the object deleted: from the moment it returns every query
// is refused with ErrDeleted, whatever route brought it. Checkpoint: the
// index commit. The file is removed by the sweeper after the retention.
func (h *Host) Delete(ctx context.Context, objectID string, gen int64) (ObjectInfo, error) {
	o, _, err := h.lookup(objectID)
	if err != nil {
		return ObjectInfo{}, err
	}
	metas, err := h.markDeletedAs(ctx, []*object{o}, gen, "deleted through the API (catalog delete)", deletedByCatalog)
	if err != nil {
		return ObjectInfo{}, err
	}
	if len(metas) == 0 { // swept meanwhile
		return ObjectInfo{}, ErrNotFound
	}
	h.m.lifecycle.WithLabelValues("delete").Inc()
	return h.info(o, metas[0]), nil
}

// markDeleted durably moves objects to state deleted in one index commit,
// publishes their deleted routes and closes their handles once unused. Each
// object it deletes is logged with its database, account and reason. It
// returns the resulting metas (already deleted objects included, gone ones
// left out).
func (h *Host) markDeleted(ctx context.Context, objs []*object, gen int64, reason string) ([]*Meta, error) {
	return h.markDeletedAs(ctx, objs, gen, reason, deletedOther)
}

// deleteCause is why a host deletes an object, as its record keeps it.
type deleteCause int

const (
	// deletedOther: an orphan or a leftover (never the catalog's object).
	deletedOther deleteCause = iota
	// deletedByCatalog: the catalog deleted the database (the API's
	// delete, a heartbeat's answer): Meta.CatalogDeleted, and a delete
	// marker in the archive (deletemark.go).
	deletedByCatalog
	// deletedSuperseded: the catalog names a newer object elsewhere
	// (relocated.go): Meta.Superseded; the database lives on.
	deletedSuperseded
)

// markDeletedAs is markDeleted, recording why (deleteCause).
func (h *Host) markDeletedAs(ctx context.Context, objs []*object, gen int64, reason string, cause deleteCause) ([]*Meta, error) {
	sortObjects(objs)
	for _, o := range objs { // ordered locking: no deadlock between batches
		o.mu.Lock()
	}
	defer func() {
		for _, o := range objs {
			o.mu.Unlock()
		}
	}()
	now := h.now().UTC()
	var changed []*Meta
	var changedObjs []*object
	var out []*Meta
	for _, o := range objs {
		m := o.meta.Load()
		if o.gone || m == nil {
			continue
		}
		if m.deleted() {
			out = append(out, m)
			continue
		}
		n := *m
		n.State = StateDeleted
		n.DeletedAt = now
		n.Superseded = cause == deletedSuperseded
		n.CatalogDeleted = cause == deletedByCatalog
		n.RoutingGeneration = max(gen, m.RoutingGeneration)
		changed = append(changed, &n)
		changedObjs = append(changedObjs, o)
		out = append(out, &n)
	}
	if len(changed) == 0 {
		return out, nil
	}
	if err := h.ix.put(changed...); err != nil {
		return nil, err
	}
	h.mu.Lock()
	for i, o := range changedObjs {
		h.setMeta(o, changed[i])
		h.deleted[changed[i].ObjectID] = struct{}{}
	}
	h.mu.Unlock()
	h.active.Add(-int64(len(changed)))
	for i, o := range changedObjs {
		m := changed[i]
		h.log.Info("database marked deleted", "database", m.DatabaseUUID, "account", m.AccountID, "object", m.ObjectID, "reason", reason)
		h.publishLocked(ctx, o, m)
		h.handles.evict(changed[i].ObjectID)
	}
	h.refreshGauges()
	if cause == deletedByCatalog {
		h.notifyDeleteMarks()
	}
	return out, nil
}

// publishLocked publishes m's route; o.mu is held so publications of one
// object happen in state order.
func (h *Host) publishLocked(ctx context.Context, o *object, m *Meta) {
	err := h.cfg.Routes.PublishRoute(ctx, Route{
		DatabaseUUID: m.DatabaseUUID,
		ObjectID:     m.ObjectID,
		HostAddress:  h.cfg.Address,
		AccountID:    m.AccountID,
		State:        m.State,
		Generation:   m.RoutingGeneration,
	})
	o.routeDirty.Store(err != nil)
	if err != nil {
		h.log.Warn("route publication failed; heartbeat will retry", "object", m.ObjectID, "err", err)
	}
}

// Info returns the object's metadata with its file size and table count.
// It never creates the file: a database never queried reports 0 and 0.
func (h *Host) Info(ctx context.Context, objectID string) (ObjectInfo, error) {
	o, m, err := h.lookup(objectID)
	if err != nil {
		return ObjectInfo{}, err
	}
	info := h.info(o, m)
	if m.deleted() {
		return info, nil
	}
	if _, err := os.Stat(h.path(objectID)); errors.Is(err, os.ErrNotExist) {
		return info, nil
	}
	hd, err := h.handles.acquire(objectID)
	if err != nil {
		return ObjectInfo{}, fmt.Errorf("open database: %w", err)
	}
	defer h.handles.release(hd)
	if info.FileSize, err = hd.db.UsedBytes(); err != nil {
		return ObjectInfo{}, err
	}
	n, err := hd.db.NumTables()
	info.NumTables = int64(n)
	if err != nil {
		return ObjectInfo{}, err
	}
	h.noteSize(o, m, func() int64 { return info.FileSize })
	return info, nil
}

func (h *Host) info(o *object, m *Meta) ObjectInfo {
	return ObjectInfo{
		ObjectID:          m.ObjectID,
		DatabaseUUID:      m.DatabaseUUID,
		AccountID:         m.AccountID,
		Name:              m.Name,
		State:             m.State,
		Confirmed:         m.Confirmed,
		CreatedAt:         m.CreatedAt.UTC().Format(time.RFC3339Nano),
		RoutingGeneration: m.RoutingGeneration,
		FileSize:          o.size.Load(),
	}
}

// Identity is who a data-plane caller believes the object is.
type Identity struct {
	DatabaseUUID string
	AccountID    string
}

// Query executes a D1 request on the object. The object's own metadata is
// the authority: an unknown object is ErrNotFound, another database or
// account ErrWrongHost, a deleted one ErrDeleted — checked before and again
// after the handle is acquired, so a delete that returned refuses every
// later query even through a stale route.
func (h *Host) Query(ctx context.Context, objectID string, id Identity, req sqlexec.Request) ([]sqlexec.StatementResult, error) {
	if h.closed.Load() {
		return nil, ErrClosed
	}
	start := time.Now()
	o, m, err := h.lookup(objectID)
	if err != nil {
		return nil, err
	}
	if m.DatabaseUUID != id.DatabaseUUID || m.AccountID != id.AccountID {
		return nil, ErrWrongHost
	}
	if m.deleted() {
		return nil, ErrDeleted
	}
	acct := h.account(m.AccountID)
	if err := acct.rowLimited(h.now()); err != nil {
		return nil, err
	}
	// While the account is over its storage total (the last heartbeat's
	// answer), statements that add data or schema are refused; while this
	// database is at the account's per-database size limit, requests that
	// grow the file are (the host's own sqlexec limit, max_page_count, is
	// the hard cap for all). Each refusal names its limit.
	req.StorageFull = acct.blockGrowth
	req.BlockGrowth = acct.maxDatabaseBytes > 0 && o.size.Load() >= acct.maxDatabaseBytes

	hd, err := h.handles.acquire(objectID)
	if err != nil {
		return nil, fmt.Errorf("open database: %w", err)
	}
	defer h.handles.release(hd)
	if m = o.meta.Load(); m == nil || m.deleted() {
		return nil, ErrDeleted
	}
	res, err := hd.db.Execute(ctx, req)
	if err != nil {
		var se *sqlexec.Error
		if errors.As(err, &se) { // the request ran and failed: metered as an error, no rows
			h.cfg.Usage.RecordUsage(UsageEvent{AccountID: m.AccountID, DatabaseUUID: m.DatabaseUUID, Time: h.now(),
				Duration: time.Since(start), SQL: requestSQL(&req), Error: true})
		}
		return nil, err
	}
	var read, written int64
	changed := false
	for i := range res {
		read += res[i].Meta.RowsRead
		written += res[i].Meta.RowsWritten
		changed = changed || res[i].Meta.ChangedDB
	}
	now := h.now()
	h.cfg.Usage.RecordUsage(UsageEvent{AccountID: m.AccountID, DatabaseUUID: m.DatabaseUUID, RowsRead: read, RowsWritten: written,
		Time: now, Duration: time.Since(start), SQL: requestSQL(&req)})
	if n := len(res); n > 0 && (changed || o.size.Load() == 0) {
		after := res[n-1].Meta.SizeAfter
		h.noteSize(o, m, func() int64 {
			// The writer's latest measurement: a concurrent write's result
			// may be noted before this one's, and must not be undone.
			if v := hd.db.SizeHint(); v > 0 {
				return v
			}
			return after
		})
	}
	return res, nil
}

// requestSQL is the text usage is shaped by: the first statement (a batch
// is metered as one request, like D1's).
func requestSQL(req *sqlexec.Request) string {
	if len(req.Statements) == 0 {
		return ""
	}
	return req.Statements[0].SQL
}

// noteSize records a database's latest size and emits it, with a fresh
// sequence number, when it changed. measure runs under the object's size
// lock, so sequence order is measurement order: consumers keep the highest
// sequence and a late, older measurement can never win.
func (h *Host) noteSize(o *object, m *Meta, measure func() int64) {
	o.sizeMu.Lock()
	defer o.sizeMu.Unlock()
	size := measure()
	if size <= 0 {
		return
	}
	old := o.size.Swap(size)
	if old == size {
		return
	}
	h.totalBytes.Add(size - old)
	h.m.bytesOnDisk.Set(float64(h.totalBytes.Load()))
	h.cfg.Sizes.RecordSize(SizeEvent{AccountID: m.AccountID, DatabaseUUID: m.DatabaseUUID, SizeBytes: size, Seq: h.nextSizeSeq(), Time: h.now()})
}

// nextSizeSeq returns a host-wide strictly increasing sequence that also
// increases across restarts: the wall clock in nanoseconds, bumped past the
// last one handed out.
func (h *Host) nextSizeSeq() int64 {
	for {
		last := h.sizeSeq.Load()
		next := max(time.Now().UnixNano(), last+1)
		if h.sizeSeq.CompareAndSwap(last, next) {
			return next
		}
	}
}

// account returns a copy of what the host knows about an account.
func (h *Host) account(id string) accountState {
	h.accMu.RLock()
	defer h.accMu.RUnlock()
	if a := h.accounts[id]; a != nil {
		return *a
	}
	return accountState{}
}

// SetAccountLimited refuses every query of the account with ErrRowLimit
// until the given time (the limiter's flag, expiring at the end of the UTC
// day); a zero time lifts it.
func (h *Host) SetAccountLimited(accountID string, until time.Time) {
	h.setAccountLimit(accountID, "", until)
}

// setAccountLimit records the limiter's flag of an account with the limit
// that was crossed (reason); a zero until clears it.
func (h *Host) setAccountLimit(accountID, reason string, until time.Time) {
	h.accMu.Lock()
	defer h.accMu.Unlock()
	a := h.accounts[accountID]
	if a == nil {
		if until.IsZero() {
			return
		}
		a = &accountState{}
		h.accounts[accountID] = a
	}
	a.limitedUntil, a.limitReason = until, reason
}

// limitedAccounts counts the accounts whose flag is set at now.
func (h *Host) limitedAccounts(now time.Time) int {
	h.accMu.RLock()
	defer h.accMu.RUnlock()
	n := 0
	for _, a := range h.accounts {
		if a.limitedUntil.After(now) {
			n++
		}
	}
	return n
}

func (h *Host) refreshGauges() {
	h.mu.RLock()
	del := len(h.deleted)
	h.mu.RUnlock()
	h.m.databases.WithLabelValues(StateActive).Set(float64(h.active.Load()))
	h.m.databases.WithLabelValues(StateDeleted).Set(float64(del))
	h.m.bytesOnDisk.Set(float64(h.totalBytes.Load()))
}

// Stats is a snapshot of the host's load.
type Stats struct {
	Active, Deleted int
	Bytes           int64
	OpenHandles     int
	IndexBytes      int64
}

// Stats returns counts for load reports, benchmarks and tests.
func (h *Host) Stats() Stats {
	h.mu.RLock()
	del := len(h.deleted)
	h.mu.RUnlock()
	return Stats{Active: int(h.active.Load()), Deleted: del, Bytes: h.totalBytes.Load(), OpenHandles: h.handles.len(), IndexBytes: h.ix.size()}
}

// hostRecord is this host as the catalog registers it.
func (h *Host) hostRecord() fsm.RegisterHost {
	return fsm.RegisterHost{ID: h.cfg.ID, Address: h.cfg.Address, Region: h.cfg.Region, Jurisdiction: h.cfg.Jurisdiction, Capacity: h.cfg.Capacity, State: "active"}
}
