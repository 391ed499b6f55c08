package edge

import (
	"encoding/hex"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sony/gobreaker/v2"
)

type metrics struct {
	requests    *prometheus.CounterVec
	duration    *prometheus.HistogramVec
	rateLimited *prometheus.CounterVec
	staleRoutes prometheus.Counter
	movedRoutes prometheus.Counter
	createTries *prometheus.CounterVec
	bgDropped   prometheus.Counter
	// createSteps times the create flow's steps: account (limit check),
	// placement, init (object host round trip, its durable index commit
	// included), catalog_write (the Raft write, the checkpoint), after (route
	// write-through, scheduling the confirm). Observers resolved once.
	createSteps                                              *prometheus.HistogramVec
	stepAccount, stepPlace, stepInit, stepCatalog, stepAfter prometheus.Observer
}

func newMetrics(reg *prometheus.Registry, s *Server) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shoal_edge_requests_total",
			Help: "Requests by endpoint and HTTP status."}, []string{"endpoint", "status"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "shoal_edge_request_seconds",
			Help: "Request latency by endpoint.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}, []string{"endpoint"}),
		rateLimited: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shoal_edge_rate_limited_total",
			Help: "Requests refused by a rate limit, by scope."}, []string{"scope"}),
		staleRoutes: prometheus.NewCounter(prometheus.CounterOpts{Name: "shoal_edge_stale_routes_total",
			Help: "Routes refused by an object host (421/410/404) and re-resolved."}),
		movedRoutes: prometheus.NewCounter(prometheus.CounterOpts{Name: "shoal_edge_moved_routes_total",
			Help: "Queries whose object host refused the connection and that were sent to the database's new route (relocated off a lost host)."}),
		createTries: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shoal_edge_create_attempts_total",
			Help: "Create attempts by outcome."}, []string{"outcome"}),
		bgDropped: prometheus.NewCounter(prometheus.CounterOpts{Name: "shoal_edge_background_dropped_total",
			Help: "Best-effort background tasks shed because too many were running."}),
		createSteps: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "shoal_edge_create_step_seconds",
			Help:    "Time in each step of the create flow (account, placement, init, catalog_write, after).",
			Buckets: prometheus.ExponentialBuckets(0.00005, 2, 16)}, []string{"step"}),
	}
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
	reg.MustRegister(m.requests, m.duration, m.rateLimited, m.staleRoutes, m.movedRoutes, m.createTries, m.bgDropped, m.createSteps,
		counter("shoal_edge_route_cache_hits_total", "Route lookups served by the local cache.", func() float64 { return float64(s.cache.hits.Load()) }),
		counter("shoal_edge_route_cache_misses_total", "Route lookups that missed the local cache.", func() float64 { return float64(s.cache.misses.Load()) }),
		counter("shoal_edge_route_cache_negative_hits_total", "Lookups answered by a negative entry.", func() float64 { return float64(s.cache.negHits.Load()) }),
		gauge("shoal_edge_catalog_fallback_in_flight", "Catalog reads in flight for cache misses.", func() float64 { return float64(s.fb.inFlight.Load()) }),
		counter("shoal_edge_catalog_fallback_rejected_total", "Catalog reads refused fast (cap full or breaker open).", func() float64 { return float64(s.fb.rejected.Load()) }),
		gauge("shoal_edge_catalog_breaker_state", "Catalog circuit breaker: 0 closed, 1 half-open, 2 open.", func() float64 { return float64(s.fb.breaker.State()) }),
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

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(code int) {
	r.status = code
	r.ResponseWriter.WriteHeader(code)
}

// commonStatuses get a counter resolved once per endpoint: WithLabelValues
// (label hashing, a map lookup under a lock) on every request showed up in
// the hot path's profile.
var commonStatuses = [...]int{200, 400, 401, 403, 404, 413, 429, 500, 503}

type counterBox struct{ c prometheus.Counter }

type observerBox struct{ o prometheus.Observer }

// instrument counts and times h under endpoint name. The histogram observer
// and the counter of a common status are resolved on first use and kept (so
// /metrics still shows only series that happened); other statuses go
// through WithLabelValues.
func (s *Server) instrument(name string, h http.Handler) http.Handler {
	var dur atomic.Pointer[observerBox]
	var counters [len(commonStatuses)]atomic.Pointer[counterBox]
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
		h.ServeHTTP(rec, r)
		counted := false
		for i, st := range commonStatuses {
			if st == rec.status {
				cb := counters[i].Load()
				if cb == nil {
					cb = &counterBox{c: s.m.requests.WithLabelValues(name, strconv.Itoa(st))}
					counters[i].Store(cb)
				}
				cb.c.Inc()
				counted = true
				break
			}
		}
		if !counted {
			s.m.requests.WithLabelValues(name, strconv.Itoa(rec.status)).Inc()
		}
		ob := dur.Load()
		if ob == nil {
			ob = &observerBox{o: s.m.duration.WithLabelValues(name)}
			dur.Store(ob)
		}
		ob.o.Observe(time.Since(start).Seconds())
	})
}

func mustHex(s string) []byte {
	b, err := hex.DecodeString(s)
	if err != nil {
		panic(err)
	}
	return b
}
