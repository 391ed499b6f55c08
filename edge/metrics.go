package edge

import (
	"encoding/hex"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/gorilla/mux"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/sony/gobreaker/v2"
)

type metrics struct {
	requests    *prometheus.CounterVec
	duration    *prometheus.HistogramVec
	rateLimited *prometheus.CounterVec
	staleRoutes prometheus.Counter
	movedRoutes prometheus.Counter
	// hostRoutes counts last-resort route lookups on object hosts
	// (hostroute.go) by result.
	hostRoutes  *prometheus.CounterVec
	createTries *prometheus.CounterVec
	bgDropped   prometheus.Counter
	// createSteps times the create flow's steps: account (limit check),
	// placement, init (object host round trip, its durable index commit
	// included), catalog_write (the Raft write, the checkpoint), after (route
	// write-through, scheduling the confirm). Observers resolved once.
	createSteps                                              *prometheus.HistogramVec
	stepAccount, stepPlace, stepInit, stepCatalog, stepAfter prometheus.Observer
	// batchSize counts the creates sharing one request of a coalesced step
	// (createbatch.go): catalog_write, init, confirm.
	batchSize                             *prometheus.HistogramVec
	batchCatalog, batchInit, batchConfirm prometheus.Observer
}

func newMetrics(reg *prometheus.Registry, s *Server) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shoal_edge_requests_total",
			Help: "Requests by endpoint, HTTP status and D1 error code (empty when the answer carries none); endpoint \"no_route\" counts requests no route matched."}, []string{"endpoint", "status", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "shoal_edge_request_duration_seconds",
			Help: "Request latency by endpoint.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}, []string{"endpoint"}),
		rateLimited: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shoal_edge_rate_limited_total",
			Help: "Requests refused by a rate limit, by scope."}, []string{"scope"}),
		staleRoutes: prometheus.NewCounter(prometheus.CounterOpts{Name: "shoal_edge_stale_routes_total",
			Help: "Routes refused by an object host (421/410/404) and re-resolved."}),
		movedRoutes: prometheus.NewCounter(prometheus.CounterOpts{Name: "shoal_edge_moved_routes_total",
			Help: "Queries whose object host refused the connection and that were sent to the database's new route (relocated off a lost host)."}),
		hostRoutes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shoal_edge_host_route_lookups_total",
			Help: "Route lookups asked of the object hosts because the catalog was unavailable, by result: found, not_found, no_answer (no host answered for it), superseded (the cache holds a newer route), refused (at the cap)."}, []string{"result"}),
		createTries: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shoal_edge_create_attempts_total",
			Help: "Create attempts by outcome."}, []string{"outcome"}),
		bgDropped: prometheus.NewCounter(prometheus.CounterOpts{Name: "shoal_edge_background_dropped_total",
			Help: "Best-effort background tasks shed because too many were running."}),
		createSteps: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "shoal_edge_create_step_duration_seconds",
			Help:    "Time in each step of the create flow (account, placement, init, catalog_write, after).",
			Buckets: prometheus.ExponentialBuckets(0.00005, 2, 16)}, []string{"step"}),
	}
	m.batchSize = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "shoal_edge_create_batch_creates",
		Help:    "Creates sharing one request of a coalesced create step (catalog_write, init, confirm).",
		Buckets: prometheus.ExponentialBuckets(1, 2, 9)}, []string{"step"})
	m.batchCatalog = m.batchSize.WithLabelValues("catalog_write")
	m.batchInit = m.batchSize.WithLabelValues("init")
	m.batchConfirm = m.batchSize.WithLabelValues("confirm")
	m.stepAccount = m.createSteps.WithLabelValues("account")
	m.stepPlace = m.createSteps.WithLabelValues("placement")
	m.stepInit = m.createSteps.WithLabelValues("init")
	m.stepCatalog = m.createSteps.WithLabelValues("catalog_write")
	m.stepAfter = m.createSteps.WithLabelValues("after")
	gauge := func(name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, f)
	}
	counter := func(name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, f)
	}
	reg.MustRegister(m.requests, m.duration, m.rateLimited, m.staleRoutes, m.movedRoutes, m.hostRoutes, m.createTries, m.bgDropped, m.createSteps, m.batchSize,
		counter("shoal_edge_route_cache_hits_total", "Route lookups served by the local cache.", func() float64 { return float64(s.cache.hits.Load()) }),
		counter("shoal_edge_route_cache_misses_total", "Route lookups that missed the local cache.", func() float64 { return float64(s.cache.misses.Load()) }),
		counter("shoal_edge_route_cache_negative_hits_total", "Lookups answered by a negative entry.", func() float64 { return float64(s.cache.negHits.Load()) }),
		gauge("shoal_edge_catalog_fallback_in_flight", "Catalog reads in flight for cache misses.", func() float64 { return float64(s.fb.inFlight.Load()) }),
		counter("shoal_edge_catalog_fallback_rejected_total", "Catalog reads refused fast (cap full or breaker open).", func() float64 { return float64(s.fb.rejected.Load()) }),
		breakerCollector{s: s},
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "shoal_edge_host_forwards_total", ConstLabels: prometheus.Labels{"transport": "frames"},
			Help: "Queries forwarded to object hosts, by transport: frames (multiplexed connections) or http (hosts that do not speak frames, or --host-transport http)."},
			func() float64 { return float64(s.hosts.sentFrames.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "shoal_edge_host_forwards_total", ConstLabels: prometheus.Labels{"transport": "http"},
			Help: "Queries forwarded to object hosts, by transport: frames (multiplexed connections) or http (hosts that do not speak frames, or --host-transport http)."},
			func() float64 { return float64(s.hosts.sentHTTP.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "shoal_edge_host_lifecycle_batches_total", ConstLabels: prometheus.Labels{"transport": "frames"},
			Help: "Batched lifecycle calls (create inits and confirms) sent to object hosts, by transport: frames (the hosts' multiplexed connections) or http (hosts of an earlier version, or --host-transport http)."},
			func() float64 { return float64(s.hosts.batchFrames.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "shoal_edge_host_lifecycle_batches_total", ConstLabels: prometheus.Labels{"transport": "http"},
			Help: "Batched lifecycle calls (create inits and confirms) sent to object hosts, by transport: frames (the hosts' multiplexed connections) or http (hosts of an earlier version, or --host-transport http)."},
			func() float64 { return float64(s.hosts.batchHTTP.Load()) }),
	)
	return m
}

// Stats is a snapshot of the routing counters (tests and operators).
type Stats struct {
	CacheHits, CacheMisses, NegativeHits int64
	FallbackInFlight, FallbackMaxSeen    int64
	FallbackRejected                     int64
	BreakerState                         string         // "closed" | "half-open" | "open"
	Feed                                 RouteFeedStats // zero without a route feed
}

// Stats returns the routing counters.
func (s *Server) Stats() Stats {
	st := Stats{
		CacheHits: s.cache.hits.Load(), CacheMisses: s.cache.misses.Load(), NegativeHits: s.cache.negHits.Load(),
		FallbackInFlight: s.fb.inFlight.Load(), FallbackMaxSeen: s.fb.maxSeen.Load(), FallbackRejected: s.fb.rejected.Load(),
		BreakerState: breakerName(s.fb.breaker.State()),
	}
	if s.feed != nil {
		st.Feed = s.feed.stats()
	}
	return st
}

func breakerName(st gobreaker.State) string { return st.String() }

// statusRecorder is the response writer instrument hands its handler: it
// keeps what the access log and the request metrics need (status, D1 error
// code, the reason of a 5xx).
type statusRecorder struct {
	http.ResponseWriter
	status int
	code   int   // D1 error code of the answer, 0 when it carries none
	reason error // why the answer is a 5xx (writeErr, failWith)
}

func (r *statusRecorder) WriteHeader(code int) {
	r.status = code
	r.ResponseWriter.WriteHeader(code)
}

// RecordCode implements v4.CodeRecorder.
func (r *statusRecorder) RecordCode(code int) { r.code = code }

// Unwrap lets http.ResponseController reach the connection's writer
// (flushing a streamed export).
func (r *statusRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

// noteReason records why the answer written to w is a server error, for the
// request's access log line: the one place a 5xx's reason is logged.
func noteReason(w http.ResponseWriter, err error) {
	for w != nil {
		if r, ok := w.(*statusRecorder); ok {
			r.reason = err
			return
		}
		u, ok := w.(interface{ Unwrap() http.ResponseWriter })
		if !ok {
			return
		}
		w = u.Unwrap()
	}
}

// commonStatuses get a counter resolved once per endpoint: WithLabelValues
// (label hashing, a map lookup under a lock) on every request showed up in
// the hot path's profile. Only answers without a D1 error code use them;
// errors go through WithLabelValues.
var commonStatuses = [...]int{200, 400, 401, 403, 404, 413, 429, 500, 503}

type counterBox struct{ c prometheus.Counter }

type observerBox struct{ o prometheus.Observer }

// endpointNoRoute is the endpoint label of requests no route matched (404
// "No route for that URI", 405 for a known path with another method).
const endpointNoRoute = "no_route"

// Route templates of the hand-matched query path (it bypasses mux, so
// mux.CurrentRoute has nothing to say).
const (
	queryTemplate = queryPathPrefix + "{account_id}/d1/database/{database_id}/query"
	rawTemplate   = queryPathPrefix + "{account_id}/d1/database/{database_id}/raw"
)

// routeTemplate is the route r matched, as registered ({database_id}, not
// the id): raw paths carry ids and one-time tokens, and would make the
// access log unbounded in cardinality.
func routeTemplate(r *http.Request, endpoint string) string {
	if info, _ := r.Context().Value(requestIDKey).(*reqInfo); info != nil && info.vars {
		if strings.HasSuffix(r.URL.Path, "/raw") {
			return rawTemplate
		}
		return queryTemplate
	}
	if cr := mux.CurrentRoute(r); cr != nil {
		if t, err := cr.GetPathTemplate(); err == nil {
			return t
		}
	}
	return endpoint
}

// instrument counts, times and logs h under endpoint name: one
// shoal_edge_requests_total{endpoint,status,code} increment, one latency
// observation and one access log line per request. The line is at info, or
// at error with the reason for a 5xx, so `--log-level warn` keeps exactly
// the failures. It names the route template and never the raw path, the
// body, the SQL or a token.
//
// The histogram observer and the counter of a common status without an
// error code are resolved on first use and kept (so /metrics still shows
// only series that happened); the others go through WithLabelValues.
func (s *Server) instrument(name string, h http.Handler) http.Handler {
	var dur atomic.Pointer[observerBox]
	var counters [len(commonStatuses)]atomic.Pointer[counterBox]
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
		h.ServeHTTP(rec, r)
		took := time.Since(start)
		counted := false
		if rec.code == 0 {
			for i, st := range commonStatuses {
				if st == rec.status {
					cb := counters[i].Load()
					if cb == nil {
						cb = &counterBox{c: s.m.requests.WithLabelValues(name, strconv.Itoa(st), "")}
						counters[i].Store(cb)
					}
					cb.c.Inc()
					counted = true
					break
				}
			}
		}
		if !counted {
			code := ""
			if rec.code != 0 {
				code = strconv.Itoa(rec.code)
			}
			s.m.requests.WithLabelValues(name, strconv.Itoa(rec.status), code).Inc()
		}
		ob := dur.Load()
		if ob == nil {
			ob = &observerBox{o: s.m.duration.WithLabelValues(name)}
			dur.Store(ob)
		}
		ob.o.Observe(took.Seconds())
		s.accessLog(r, rec, name, took)
	})
}

// accessLog writes the request's line (see instrument).
func (s *Server) accessLog(r *http.Request, rec *statusRecorder, endpoint string, took time.Duration) {
	lvl := slog.LevelInfo
	if rec.status >= 500 {
		lvl = slog.LevelError
	}
	ctx := r.Context()
	if !s.log.Enabled(ctx, lvl) {
		return
	}
	attrs := make([]slog.Attr, 0, 10)
	attrs = append(attrs,
		slog.String("method", r.Method),
		slog.String("route", routeTemplate(r, endpoint)),
		slog.String("endpoint", endpoint),
		slog.Int("status", rec.status),
		slog.Int("code", rec.code),
		slog.Float64("duration_ms", float64(took.Microseconds())/1000),
		slog.String("account", pathVar(r, "account_id")),
		slog.String("request_id", requestIDFrom(ctx)))
	if rec.status >= 500 {
		reason := "unknown"
		if rec.reason != nil {
			reason = rec.reason.Error()
		} else if rec.code != 0 {
			reason = "answered by the object host (see its log for this request_id)"
		}
		attrs = append(attrs, slog.String("err", reason))
	}
	s.log.LogAttrs(ctx, lvl, "request", attrs...)
}

func mustHex(s string) []byte {
	b, err := hex.DecodeString(s)
	if err != nil {
		panic(err)
	}
	return b
}

// breakerStates are the values of shoal_edge_catalog_breaker_state's state
// label: one series per state, 1 for the current one (Prometheus's advice
// for enumerations, instead of a numeric state code).
var breakerStates = []gobreaker.State{gobreaker.StateClosed, gobreaker.StateHalfOpen, gobreaker.StateOpen}

var breakerDesc = prometheus.NewDesc("shoal_edge_catalog_breaker_state",
	"Catalog circuit breaker: 1 for the current state (closed, half_open, open), 0 for the others.", []string{"state"}, nil)

type breakerCollector struct{ s *Server }

func (c breakerCollector) Describe(ch chan<- *prometheus.Desc) { ch <- breakerDesc }

func (c breakerCollector) Collect(ch chan<- prometheus.Metric) {
	cur := c.s.fb.breaker.State()
	for _, st := range breakerStates {
		v := 0.0
		if st == cur {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(breakerDesc, prometheus.GaugeValue, v, strings.ReplaceAll(st.String(), "-", "_"))
	}
}
