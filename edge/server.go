package edge

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/gorilla/mux"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/semaphore"
	"golang.org/x/sync/singleflight"

	"github.com/shoaldb/shoal/internal/binding"
	"github.com/shoaldb/shoal/internal/pki"
	v4 "github.com/shoaldb/shoal/internal/v4"
	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// Options configure a Server. Catalog and Dir are required; every other field
// has a default.
type Options struct {
	Catalog Catalog
	Hosts   *HostClient // default NewHostClient(0, HostTLS)
	// HostTLS is the edge's cluster certificate for calling object hosts
	// (mutual TLS, internal/pki); nil: plain HTTP (insecure mode).
	HostTLS *pki.Loader
	// HostTransport is how queries reach object hosts: TransportFrames
	// (default: multiplexed frame connections, HTTP for hosts that do not
	// speak them) or TransportHTTP (an HTTP/1.1 exchange per query).
	HostTransport string
	Dir           string // holds routes.db, the bbolt route cache
	Region        string // this edge's region (placement default); default "weur"

	AdminToken  string           // bearer secret of the operator; "" disables the admin API
	BindingKeys *binding.Keyring // nil disables binding tokens

	TokenTTL         time.Duration // trust a token check this long; default 10s (revocation delay)
	TokenNegativeTTL time.Duration // remember unknown tokens; default 2s
	TokenStaleGrace  time.Duration // keep validated tokens while the catalog is down; default 15m
	AccountCacheTTL  time.Duration // account rows for limit checks; default 3s
	HostsCacheTTL    time.Duration // host list for placement; default 5s

	AccountRate  RateLimit // per account; default 1000/s burst 2000
	DatabaseRate RateLimit // per database; default 500/s burst 1000 (D1: ~1000 QPS per database)
	MaxRateKeys  int       // buckets kept per kind; default 100000
	Limits       Limits

	FallbackCap      int64         // concurrent catalog reads on cache misses; default 64
	CatalogTimeout   time.Duration // per catalog read; default 2s
	BreakerFailures  uint32        // default 5
	BreakerOpenFor   time.Duration // default 2s
	NegativeRouteTTL time.Duration // default 2s
	// The last-resort route lookup on object hosts when the catalog is
	// unavailable (hostroute.go): at most HostRouteCap lookups in flight
	// (default 16), each host asked within HostRouteTimeout (default
	// 500ms). KnownHosts are object host addresses to ask besides the
	// catalog's last host list and the hosts queries went to (cluster.hcl's
	// object hosts, so a fresh edge knows them with the catalog down).
	HostRouteCap     int64
	HostRouteTimeout time.Duration
	KnownHosts       []string
	// AccountChanged, when set, is called after an account's tier or limits
	// changed through the admin API (after the catalog write); `shoal`
	// publishes it on the `accounts` topic. Errors are logged.
	AccountChanged func(ctx context.Context, a fsm.Account) error
	// DeletedRouteRetention is how long a deleted database's route stays
	// in the cache (answering 404 without the catalog); default 7 days,
	// checked hourly; negative keeps them forever.
	DeletedRouteRetention time.Duration

	CreateAttempts int           // create attempts with fresh ids; default 4
	CreateBackoff  time.Duration // first backoff between attempts; default 50ms
	// CreateBatch bounds the creates whose catalog writes, host inits and
	// confirms share one request (createbatch.go); default 128, negative:
	// one request per create. CreateBatchInflight is how many such
	// requests of one kind (catalog; per host) may be in flight at once;
	// default 1 (measured: one slot gave larger batches and 11–19% less
	// CPU per create than two at the same throughput, docs/benchmarks.md).
	CreateBatch         int
	CreateBatchInflight int
	// ConfirmLinger is how long a batch of confirms to one host waits for
	// more before it is sent (createbatch.go); default 20ms, negative: none.
	ConfirmLinger time.Duration
	// RouteStageLinger is how long the route of a database this edge
	// created stays only in memory (readable at once) before it is written
	// to the route cache's file with the others of that time
	// (routestage.go); default 20ms, negative: written before the create
	// is answered.
	RouteStageLinger time.Duration
	// CreateGather is how long a catalog batch of creates may wait for
	// the creates of init batches that came back and are on their way to
	// its queue, so an init batch's creates share one catalog entry
	// (createbatch.go, "Gathering the catalog batch"); default 1ms,
	// negative: none (a call finding the slot free goes at once).
	CreateGather time.Duration
	// CreateGroupDelay and CreateInitGroupDelay bound the group-commit
	// delay of the catalog batcher and of each host's init batcher
	// (batcher.go, groupLocked): a batch that came back with n ≥ 2 creates
	// keeps its slot until about n creates are queued again, at most this
	// long (createbatch.go, "Grouping the next batch"); default 2ms,
	// negative: none.
	CreateGroupDelay     time.Duration
	CreateInitGroupDelay time.Duration

	CloseGrace time.Duration // Close waits this long for background work before cancelling it; default 5s

	// RouteFeed, when set, runs this edge's consumer of the routes topic
	// into the route cache (routefeed.go): started by New, stopped by
	// Close. nil: routes come from the catalog only (miss fills).
	RouteFeed *RouteFeedOptions

	// RateShare, when set, makes AccountRate and DatabaseRate hold across
	// the edges that share it: each edge publishes what it admitted on the
	// ratelimits topic and charges what the others admitted to its own
	// buckets (ratelimit_share.go; tolerance in DESIGN.md). Started by New,
	// stopped by Close. nil: each edge enforces the limits on its own.
	RateShare *RateShareOptions

	// Insights, when set, answers GET …/{database_id}/insights (insights.go).
	// nil: that endpoint answers 503 "analytics unavailable".
	Insights InsightsSource
	// Registry, when set, is where the edge registers its metrics and what
	// /metrics serves, so a process can add its own collectors (the
	// pipeline's) to the same page. Default: a registry of its own.
	Registry *prometheus.Registry

	BindingDefaultTTL time.Duration // default 1h
	BindingMaxTTL     time.Duration // default 7 days

	Tiers map[string]fsm.Limits // default free/paid with D1's limits

	// Failpoint, when set, is called at named steps of multi-step flows and
	// its error is injected there (fault tests). Steps: "create:after-init"
	// (between the object init and the catalog write) and
	// "create:after-catalog-write" (the checkpoint passed, response lost).
	Failpoint func(step string) error

	Now func() time.Time
	// Logger receives the edge's logs, one access line per request among
	// them (at info; at error with the reason for a 5xx). Default: none,
	// as the other components (the binary always passes its logger).
	Logger *slog.Logger
}

// DefaultTiers are D1's free and paid limits.
func DefaultTiers() map[string]fsm.Limits {
	return map[string]fsm.Limits{
		"free": {MaxDatabases: 10, MaxStorageBytes: 5 << 30, MaxDatabaseBytes: 500 << 20,
			RowsReadPerDay: 5_000_000, RowsWrittenPerDay: 100_000},
		"paid": {MaxDatabases: 50_000, MaxStorageBytes: 1 << 40, MaxDatabaseBytes: 10 << 30},
	}
}

// Server is the edge's HTTP server. Create it with New, serve Handler(), stop
// it with Close (which waits for its background goroutines).
type Server struct {
	o       Options
	catalog Catalog
	hosts   *HostClient
	cache   *RouteCache
	feed    *routeFeed // nil without Options.RouteFeed
	share   *rateShare // nil without Options.RateShare
	fb      *fallback
	writes  *recentWrites // accounts whose lists read from the leader for a moment
	res     *resolver
	auth    *authenticator
	acctRL  *limiters
	dbRL    *limiters
	router  *mux.Router
	reg     *prometheus.Registry
	m       *metrics
	log     *slog.Logger

	acctGroup singleflight.Group
	acctMu    sync.Mutex
	accts     map[string]cachedAccount

	hostsMu      sync.Mutex
	hostsList    []fsm.Host
	hostsFetched time.Time
	hostsPending map[string]int64 // creates placed since the last refresh

	hostsJurs  map[string]bool // jurisdictions of every registered host, in any state
	movedMu    sync.Mutex
	movedCheck map[string]time.Time // uuid → last catalog read after its host refused (query.go)

	bgCtx     context.Context
	bgCancel  context.CancelFunc
	bgWG      sync.WaitGroup
	bgSem     *semaphore.Weighted
	bgMu      sync.Mutex // orders bgWG.Add against Close's Wait
	bgClosing bool

	expireStop, expireDone chan struct{} // the deleted-route expiry loop

	// queryQuery and queryRaw are the full handler chains of the two query
	// routes, shared by mux and the hand-matched fast path.
	queryQuery, queryRaw http.Handler

	// copyBufs recycles pass-through buffers: io.Copy's own 32 KB buffer per
	// request showed up in profiles as large allocations.
	copyBufs sync.Pool

	cb createBatching // coalesced create steps (createbatch.go)

	// The last-resort route lookup on object hosts (hostroute.go).
	locateGroup singleflight.Group
	locateSem   *semaphore.Weighted

	closeOnce sync.Once
}

type cachedAccount struct {
	acct    fsm.Account
	fetched time.Time
}

// New opens the route cache and builds the server.
func New(o Options) (*Server, error) {
	if o.Catalog == nil {
		return nil, errors.New("edge: Catalog is required")
	}
	if o.Dir == "" {
		return nil, errors.New("edge: Dir is required")
	}
	setDefaults(&o)
	if o.HostTransport != "" {
		if err := o.Hosts.UseTransport(o.HostTransport); err != nil {
			return nil, err
		}
	}
	cache, err := OpenRouteCache(filepath.Join(o.Dir, "routes.db"), RouteCacheOptions{NegativeTTL: o.NegativeRouteTTL, Now: o.Now,
		StageLinger: o.RouteStageLinger, Logger: o.Logger})
	if err != nil {
		return nil, err
	}
	fb := newFallback(fallbackOptions{Cap: o.FallbackCap, Timeout: o.CatalogTimeout,
		BreakerFailures: o.BreakerFailures, BreakerOpenFor: o.BreakerOpenFor})
	s := &Server{
		o: o, catalog: o.Catalog, hosts: o.Hosts, cache: cache, fb: fb,
		res:    &resolver{cache: cache, catalog: o.Catalog, fb: fb},
		acctRL: newLimiters(o.AccountRate, o.MaxRateKeys, o.Now),
		dbRL:   newLimiters(o.DatabaseRate, o.MaxRateKeys, o.Now),
		log:    o.Logger, accts: make(map[string]cachedAccount), hostsPending: make(map[string]int64),
		bgSem: semaphore.NewWeighted(256), locateSem: semaphore.NewWeighted(o.HostRouteCap),
	}
	s.auth = &authenticator{catalog: o.Catalog, fb: fb, ttl: o.TokenTTL, negativeTTL: o.TokenNegativeTTL,
		staleGrace: o.TokenStaleGrace, max: 100_000, maxNegative: 10_000, now: o.Now, unreachableFor: defaultUnreachableFor,
		unknown: semaphore.NewWeighted(unknownTokenLookups(o.FallbackCap)),
		m:       make(map[[sha256.Size]byte]tokenEntry), neg: make(map[[sha256.Size]byte]time.Time)}
	s.auth.book = cache
	if err := s.auth.loadBook(); err != nil {
		// A cache: without it the edge starts as before (tokens are
		// validated by the catalog as they come).
		s.log.Warn("loading validated tokens failed", "err", err)
	}
	if o.AdminToken != "" {
		h := HashToken(o.AdminToken)
		s.auth.adminHash = mustHex(h)
	}
	s.writes = newRecentWrites(5*time.Second, o.Now)
	s.copyBufs.New = func() any { b := make([]byte, 32<<10); return &b }
	s.bgCtx, s.bgCancel = context.WithCancel(context.Background())
	s.initCreateBatching()
	s.reg = o.Registry
	if s.reg == nil {
		s.reg = prometheus.NewRegistry()
	}
	s.m = newMetrics(s.reg, s)
	s.router = s.routes()
	s.expireStop, s.expireDone = make(chan struct{}), make(chan struct{})
	go s.expireDeletedRoutes(time.Hour)
	if o.RouteFeed != nil {
		f, err := newRouteFeed(*o.RouteFeed, cache, o.Logger)
		if err != nil {
			_ = cache.Close()
			return nil, err
		}
		s.feed = f
		s.reg.MustRegister(f.collectors()...)
		f.start()
	}
	if o.RateShare != nil {
		rs, err := newRateShare(*o.RateShare, s.acctRL, s.dbRL, o.Logger, o.Now)
		if err != nil {
			_ = s.Close()
			return nil, err
		}
		s.share = rs
		s.reg.MustRegister(rs.collectors()...)
		rs.start()
	}
	return s, nil
}

// unknownTokenLookups is how many catalog reads for tokens this edge has not
// validated may be in flight: a quarter of the fallback's capacity, at least 4.
func unknownTokenLookups(fallbackCap int64) int64 {
	if fallbackCap <= 0 {
		fallbackCap = 64
	}
	return max(fallbackCap/4, 4)
}

func setDefaults(o *Options) {
	if o.Hosts == nil {
		o.Hosts = NewHostClient(0, o.HostTLS)
	}
	if o.Region == "" {
		o.Region = "weur"
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&o.TokenTTL, 10*time.Second)
	def(&o.TokenNegativeTTL, 2*time.Second)
	def(&o.TokenStaleGrace, 15*time.Minute)
	def(&o.AccountCacheTTL, 3*time.Second)
	def(&o.HostsCacheTTL, 5*time.Second)
	def(&o.NegativeRouteTTL, 2*time.Second)
	if o.DeletedRouteRetention == 0 {
		o.DeletedRouteRetention = 7 * 24 * time.Hour
	}
	def(&o.CreateBackoff, 50*time.Millisecond)
	def(&o.BindingDefaultTTL, time.Hour)
	def(&o.BindingMaxTTL, 7*24*time.Hour)
	def(&o.CatalogTimeout, 2*time.Second)
	def(&o.CloseGrace, 5*time.Second)
	if o.AccountRate == (RateLimit{}) {
		o.AccountRate = RateLimit{Rate: 1000, Burst: 2000}
	}
	if o.DatabaseRate == (RateLimit{}) {
		o.DatabaseRate = RateLimit{Rate: 500, Burst: 1000}
	}
	if o.CreateAttempts <= 0 {
		o.CreateAttempts = 4
	}
	if o.Tiers == nil {
		o.Tiers = DefaultTiers()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	hostRouteDefaults(o)
	o.Limits.defaults()
}

// Handler returns the HTTP handler of the public and admin APIs.
func (s *Server) Handler() http.Handler { return s }

// ServeHTTP serves the public and admin APIs. POST …/{database_id}/query and
// …/raw, the hot path, are matched by hand before gorilla/mux: its regexp
// matching and the map of path variables were ~20% of the edge's handler CPU
// in the bench profile (docs/bench/edge.md). Every other request, and any
// query path that is not exactly in canonical form, goes through mux, so the
// answers are the same either way.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodPost {
		if acct, db, kind, ok := matchQueryPath(r.URL.Path); ok {
			h := s.queryRaw
			if kind == "query" {
				h = s.queryQuery
			}
			s.serveWithVars(w, r, acct, db, h)
			return
		}
	}
	s.router.ServeHTTP(w, r)
}

// LeanRoute reports whether a request may be served on the public
// listener's lean HTTP/1.1 path (v4.ServerOptions.Lean), which runs this
// same handler — authentication, scopes, rate limits, validation, access
// log and metrics unchanged. Every route is, except the two whose bodies
// are streamed (the export download, GET /client/v4/shoal/dump/…, and the
// import upload, PUT /client/v4/shoal/upload/…): they keep net/http's
// cancellation when the client goes away, MaxBytesReader's closing of the
// connection, and bodies of any size, so the connection is handed over.
// Unrouted paths are lean too (their 404/405 is the same handler's).
// Whatever the route, the lean path itself hands over any request that is
// not plainly simple (internal/v4's parseLeanHead), HEAD and OPTIONS
// included.
func (s *Server) LeanRoute(method, path string) bool {
	return !strings.HasPrefix(path, streamedPathPrefix)
}

// streamedPathPrefix is the common prefix of the export download and
// import upload routes (LeanRoute).
const streamedPathPrefix = "/client/v4/shoal/"

const queryPathPrefix = "/client/v4/accounts/"

// matchQueryPath recognises /client/v4/accounts/{a}/d1/database/{id}/query
// (or /raw) with non-empty segments that mux would match unchanged (no '/',
// not "." or "..", which mux would clean and redirect).
func matchQueryPath(p string) (acct, db, kind string, ok bool) {
	rest, found := strings.CutPrefix(p, queryPathPrefix)
	if !found {
		return "", "", "", false
	}
	i := strings.IndexByte(rest, '/')
	if i <= 0 {
		return "", "", "", false
	}
	acct, rest = rest[:i], rest[i:]
	rest, found = strings.CutPrefix(rest, "/d1/database/")
	if !found {
		return "", "", "", false
	}
	i = strings.IndexByte(rest, '/')
	if i <= 0 {
		return "", "", "", false
	}
	db, kind = rest[:i], rest[i+1:]
	if kind != "query" && kind != "raw" {
		return "", "", "", false
	}
	if acct == "." || acct == ".." || db == "." || db == ".." {
		return "", "", "", false
	}
	return acct, db, kind, true
}

// Purge drops every cached route (operator action; the purge test). With a
// route feed, the feed's positions go too and it re-reads the topic from the
// start, refilling the cache without the catalog.
func (s *Server) Purge() error {
	if err := s.cache.Purge(); err != nil {
		return err
	}
	if s.feed != nil {
		s.feed.rewind()
	}
	return nil
}

// Routes exposes the route cache (tests and tools).
func (s *Server) Routes() *RouteCache { return s.cache }

// RateShareStats is a snapshot of the rate share's counters (false without
// Options.RateShare).
func (s *Server) RateShareStats() (RateShareStats, bool) {
	if s.share == nil {
		return RateShareStats{}, false
	}
	return s.share.stats(), true
}

// Close stops accepting background work, gives in-flight confirmations and
// delete notifications CloseGrace (default 5 s) to finish (they are best effort: heartbeats
// repair what they miss), cancels the rest, waits for every goroutine, stops
// the route feed and closes the route cache. Close is idempotent.
func (s *Server) Close() error {
	var err error
	s.closeOnce.Do(func() {
		s.bgMu.Lock()
		s.bgClosing = true
		s.bgMu.Unlock()
		if s.cb.flush != nil {
			close(s.cb.flush) // posted confirms go now, within the grace
		}
		done := make(chan struct{})
		go func() { s.bgWG.Wait(); s.cb.wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(s.o.CloseGrace):
		}
		s.bgCancel()
		<-done
		s.cb.wg.Wait() // batches in flight end with bgCtx
		close(s.expireStop)
		<-s.expireDone
		s.hosts.Close()
		if s.feed != nil {
			s.feed.close() // before the cache: it writes into it
		}
		if s.share != nil {
			s.share.close()
		}
		err = s.cache.Close()
	})
	return err
}

// expireDeletedRoutes drops deleted routes older than the retention from
// the cache every interval, 10,000 per transaction, until Close.
func (s *Server) expireDeletedRoutes(every time.Duration) {
	defer close(s.expireDone)
	if s.o.DeletedRouteRetention < 0 {
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-s.expireStop:
			return
		case <-t.C:
		}
		total := 0
		for {
			n, err := s.cache.ExpireDeleted(s.o.DeletedRouteRetention, 10_000)
			if err != nil {
				s.log.Warn("expiring deleted routes failed", "err", err)
				break
			}
			total += n
			if n < 10_000 {
				break
			}
		}
		if total > 0 {
			s.log.Info("expired deleted routes from the cache", "routes", total, "retention", s.o.DeletedRouteRetention)
		}
	}
}

// goBackground runs fn in an owned goroutine, unless too many are running:
// background work is best-effort by contract, so shedding it is correct.
func (s *Server) goBackground(name string, fn func(ctx context.Context) error) {
	if !s.bgSem.TryAcquire(1) {
		s.m.bgDropped.Inc()
		return
	}
	s.bgMu.Lock()
	if s.bgClosing {
		s.bgMu.Unlock()
		s.bgSem.Release(1)
		return
	}
	s.bgWG.Add(1)
	s.bgMu.Unlock()
	go func() {
		defer s.bgWG.Done()
		defer s.bgSem.Release(1)
		ctx, cancel := context.WithTimeout(s.bgCtx, 10*time.Second)
		defer cancel()
		if err := fn(ctx); err != nil {
			s.log.Debug("background task failed", "task", name, "err", err)
		}
	}()
}

// routedWithOtherMethod reports whether router has a route for req's path
// under another method.
func routedWithOtherMethod(router *mux.Router, req *http.Request) bool {
	for _, m := range []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete} {
		if m == req.Method {
			continue
		}
		alt := req.Clone(req.Context())
		alt.Method = m
		var match mux.RouteMatch
		if router.Match(alt, &match) && match.MatchErr == nil {
			return true
		}
	}
	return false
}

func (s *Server) routes() *mux.Router {
	r := mux.NewRouter()
	r.Use(s.requestID)
	methodNotAllowed := func(w http.ResponseWriter, _ *http.Request) {
		v4.WriteError(w, http.StatusMethodNotAllowed, 7000, "Method not allowed for this URI")
	}
	// Unrouted requests are counted and logged like the others, under the
	// endpoint "no_route" (a client on a wrong base URL shows up there).
	r.NotFoundHandler = s.requestID(s.instrument(endpointNoRoute, http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		func() {
			// mux reports a method mismatch only when the mismatching
			// route is the last one it tries (routes registered after it
			// reset the error): ask again with the other methods before
			// answering 404. Only unrouted requests pay for it.
			if routedWithOtherMethod(r, req) {
				methodNotAllowed(w, req)
				return
			}
			v4.WriteError(w, http.StatusNotFound, 7000, "No route for that URI")
		}()
	})))
	r.MethodNotAllowedHandler = http.HandlerFunc(methodNotAllowed)
	r.Handle("/healthz", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v4.WriteResult(w, map[string]string{"status": "ok"})
	})).Methods(http.MethodGet)
	r.Handle("/metrics", promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{})).Methods(http.MethodGet)

	d1 := r.PathPrefix("/client/v4/accounts/{account_id}/d1/database").Subrouter()
	// The query routes first: mux tries routes in order and regexp matching
	// showed up in profiles of the hot path.
	s.queryQuery, s.queryRaw = s.query("query"), s.query("raw")
	d1.Handle("/{database_id}/query", s.queryQuery).Methods(http.MethodPost)
	d1.Handle("/{database_id}/raw", s.queryRaw).Methods(http.MethodPost)
	d1.Handle("", s.account("create", s.handleCreate)).Methods(http.MethodPost)
	d1.Handle("", s.account("list", s.handleList)).Methods(http.MethodGet)
	d1.Handle("/{database_id}", s.account("get", s.handleGet)).Methods(http.MethodGet)
	d1.Handle("/{database_id}", s.account("update", s.handleUpdate)).Methods(http.MethodPut, http.MethodPatch)
	d1.Handle("/{database_id}", s.account("delete", s.handleDelete)).Methods(http.MethodDelete)
	d1.Handle("/{database_id}/binding", s.account("binding", s.handleMintBinding)).Methods(http.MethodPost)
	d1.Handle("/{database_id}/binding", s.account("binding_revoke_all", s.handleRevokeBindings)).Methods(http.MethodDelete)
	d1.Handle("/{database_id}/binding/{token_id}", s.account("binding_revoke", s.handleRevokeBindings)).Methods(http.MethodDelete)
	d1.Handle("/{database_id}/export", s.account("export", s.handleExport)).Methods(http.MethodPost)
	d1.Handle("/{database_id}/import", s.account("import", s.handleImport)).Methods(http.MethodPost)
	d1.Handle("/{database_id}/time_travel/bookmark", s.account("time_travel_bookmark", s.handleTimeTravelBookmark)).Methods(http.MethodGet)
	d1.Handle("/{database_id}/time_travel/restore", s.account("time_travel_restore", s.handleTimeTravelRestore)).Methods(http.MethodPost)
	d1.Handle("/{database_id}/insights", s.account("insights", s.handleInsights)).Methods(http.MethodGet)
	d1.Handle("/{database_id}/fork", s.account("fork", s.handleFork)).Methods(http.MethodPost)
	r.Handle("/client/v4/shoal/dump/{token}", s.instrument("export_download", http.HandlerFunc(s.handleExportDownload))).Methods(http.MethodGet)
	r.Handle("/client/v4/shoal/upload/{token}", s.instrument("import_upload", http.HandlerFunc(s.handleImportUpload))).Methods(http.MethodPut)

	r.Handle("/client/v4/bound/{kind:query|raw}", s.instrument("bound", http.HandlerFunc(s.handleBound))).Methods(http.MethodPost)
	s.identityRoutes(r) // identity.go: /memberships, /user, /accounts, tokens/verify
	s.graphqlRoutes(r)  // graphql.go: /graphql (D1's analytics datasets)

	adm := r.PathPrefix("/admin/v1").Subrouter()
	adm.Handle("/accounts", s.admin("admin_create_account", s.handleAdminCreateAccount)).Methods(http.MethodPost)
	adm.Handle("/accounts/{id}", s.admin("admin_get_account", s.handleAdminGetAccount)).Methods(http.MethodGet)
	adm.Handle("/accounts/{id}", s.admin("admin_update_account", s.handleAdminUpdateAccount)).Methods(http.MethodPatch, http.MethodPut)
	adm.Handle("/accounts/{id}/tokens", s.admin("admin_create_token", s.handleAdminCreateToken)).Methods(http.MethodPost)
	adm.Handle("/tokens/{id}", s.admin("admin_revoke_token", s.handleAdminRevokeToken)).Methods(http.MethodDelete)
	adm.Handle("/routes/purge", s.admin("admin_purge", func(w http.ResponseWriter, r *http.Request, _ principal) {
		if err := s.Purge(); err != nil {
			s.writeErr(w, r, err)
			return
		}
		v4.WriteResult(w, nil)
	})).Methods(http.MethodPost)
	return r
}

type ctxKey int

const requestIDKey ctxKey = 0

// reqInfo is the one context value the edge adds to a request: its request
// id and, on the hand-matched query path, the path variables mux would have
// extracted (one allocation instead of mux's map and second context).
type reqInfo struct {
	id       string
	vars     bool // account and database are set: the request bypassed mux
	account  string
	database string
}

// serveWithVars runs h as the requestID middleware would, with the path
// variables of the hand-matched query path.
func (s *Server) serveWithVars(w http.ResponseWriter, r *http.Request, acct, db string, h http.Handler) {
	info := &reqInfo{id: incomingRequestID(r), vars: true, account: acct, database: db}
	w.Header()[headerRequestIDCanonical] = []string{info.id}
	h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), requestIDKey, info)))
}

// requestID accepts a sane incoming X-Request-ID or makes one, echoes it and
// propagates it to object hosts.
func (s *Server) requestID(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		info := &reqInfo{id: incomingRequestID(r)}
		w.Header()[headerRequestIDCanonical] = []string{info.id}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), requestIDKey, info)))
	})
}

func incomingRequestID(r *http.Request) string {
	var id string
	if v := r.Header[headerRequestIDCanonical]; len(v) > 0 {
		id = v[0]
	}
	if !saneRequestID(id) {
		id = uuid.NewString()
	}
	return id
}

// pathVar returns the path variable name ("account_id" or "database_id"),
// from the hand-matched query path or from mux.
func pathVar(r *http.Request, name string) string {
	if info, _ := r.Context().Value(requestIDKey).(*reqInfo); info != nil && info.vars {
		switch name {
		case "account_id":
			return info.account
		case "database_id":
			return info.database
		}
	}
	return mux.Vars(r)[name]
}

func saneRequestID(id string) bool {
	if id == "" || len(id) > 128 {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || strings.IndexByte("-_.:", c) >= 0) {
			return false
		}
	}
	return true
}

func requestIDFrom(ctx context.Context) string {
	if info, _ := ctx.Value(requestIDKey).(*reqInfo); info != nil {
		return info.id
	}
	return ""
}

type authedHandler func(w http.ResponseWriter, r *http.Request, p principal)

// account wraps a D1 handler: validates the path's account id, authenticates
// the bearer token and checks that it belongs to that account (or is admin).
func (s *Server) account(name string, h authedHandler) http.Handler {
	return s.instrument(name, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		acct := pathVar(r, "account_id")
		if err := checkAccountID(acct); err != nil {
			s.writeErr(w, r, err)
			return
		}
		p, err := s.auth.authenticate(r.Context(), r.Header.Get("Authorization"))
		if err != nil {
			s.writeErr(w, r, err)
			return
		}
		if !p.admin && p.accountID != acct {
			s.writeErr(w, r, errForbidden)
			return
		}
		if p.readOnly || len(p.databases) > 0 {
			if err := scopeCheck(p, name, pathVar(r, "database_id")); err != nil {
				s.writeErr(w, r, err)
				return
			}
		}
		if name != "query" && name != "raw" {
			// Control-plane calls: who and from where, for the audit log.
			r = r.WithContext(fsm.WithAudit(r.Context(), auditOf(p, r)))
		}
		h(w, r, p)
	}))
}

// admin wraps an admin handler: only the admin token passes.
func (s *Server) admin(name string, h authedHandler) http.Handler {
	return s.instrument(name, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, err := s.auth.authenticate(r.Context(), r.Header.Get("Authorization"))
		if err != nil {
			s.writeErr(w, r, err)
			return
		}
		if !p.operator {
			s.writeErr(w, r, errForbidden)
			return
		}
		h(w, r.WithContext(fsm.WithAudit(r.Context(), auditOf(p, r))), p)
	}))
}

var errForbidden = errors.New("forbidden")

// rateLimited is a 429 with the time until a token is available.
type rateLimited struct {
	scope string
	after time.Duration
}

func (e *rateLimited) Error() string { return "rate limited: " + e.scope }

func (s *Server) checkRate(acct, db string) error {
	if ok, d := s.acctRL.allow(acct); !ok {
		s.m.rateLimited.WithLabelValues("account").Inc()
		return &rateLimited{scope: "account", after: d}
	}
	if db != "" {
		if ok, d := s.dbRL.allow(db); !ok {
			s.m.rateLimited.WithLabelValues("database").Inc()
			s.share.record(acct, "") // the account's token is spent
			return &rateLimited{scope: "database", after: d}
		}
	}
	s.share.record(acct, db)
	return nil
}

// writeErr maps any error to its D1-style answer. Messages never carry
// internals.
//
// It records err on the request (noteReason) so that, when the answer is a
// 5xx, the request's access log line carries it: the one place the reason
// of a server error is logged.
func (s *Server) writeErr(w http.ResponseWriter, r *http.Request, err error) {
	noteReason(w, err)
	var ve *validationError
	var rl *rateLimited
	var he *HostError
	var dle *databaseLimitError
	var be *bindingError
	switch {
	case errors.As(err, &ve):
		v4.WriteError(w, ve.status, ve.code, ve.msg)
	case errors.As(err, &be):
		v4.WriteError(w, http.StatusUnauthorized, v4.CodeUnauthorized, be.msg)
	case errors.Is(err, errUnauthenticated):
		v4.WriteError(w, http.StatusUnauthorized, v4.CodeUnauthorized, "Authentication error")
	case errors.Is(err, errTokenExpired):
		v4.WriteError(w, http.StatusUnauthorized, v4.CodeUnauthorized, "Authentication error: the API token has expired")
	case errors.Is(err, errForbidden), errors.Is(err, fsm.ErrAccountNotFound):
		v4.WriteError(w, http.StatusForbidden, v4.CodeForbidden, "The given account is not valid or is not authorized to access this service")
	case errors.As(err, &rl):
		v4.WriteRetryAfter(w, http.StatusTooManyRequests, v4.CodeRateLimited,
			fmt.Sprintf("Too many requests for this %s; please retry later", rl.scope), rl.after)
	case errors.Is(err, ErrDatabaseNotFound), errors.Is(err, fsm.ErrNotFound):
		v4.WriteError(w, http.StatusNotFound, v4.CodeNotFound, "The database could not be found")
	case errors.Is(err, fsm.ErrNameTaken):
		v4.WriteError(w, http.StatusBadRequest, v4.CodeNameTaken, "A database with that name already exists")
	case errors.As(err, &dle):
		v4.WriteError(w, http.StatusBadRequest, v4.CodeDatabaseLimit, dle.message())
	case errors.Is(err, fsm.ErrDatabaseLimit):
		v4.WriteError(w, http.StatusBadRequest, v4.CodeDatabaseLimit, "The account has reached its limit of databases")
	case errors.Is(err, fsm.ErrInvalid):
		v4.WriteError(w, http.StatusBadRequest, v4.CodeInvalidRequest, "Invalid request")
	case errors.Is(err, ErrUnavailable):
		v4.WriteRetryAfter(w, http.StatusServiceUnavailable, v4.CodeUnavailable, "Service temporarily unavailable; please retry", time.Second)
	case errors.As(err, &he) && he.Status < 500:
		v4.WriteError(w, he.Status, he.Code, he.Message)
	case errors.As(err, &he):
		v4.WriteRetryAfter(w, http.StatusServiceUnavailable, v4.CodeUnavailable, "Service temporarily unavailable; please retry", time.Second)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		v4.WriteRetryAfter(w, http.StatusServiceUnavailable, v4.CodeUnavailable, "Request timed out; please retry", time.Second)
	default:
		v4.WriteError(w, http.StatusInternalServerError, v4.CodeInternal, "Internal error")
	}
}
