package edge

import (
	"encoding/hex"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sony/gobreaker/v2"
)

type metrics struct {
	requests    *prometheus.CounterVec
	duration    *prometheus.HistogramVec
	rateLimited *prometheus.CounterVec
	staleRoutes prometheus.Counter
	createTries *prometheus.CounterVec
	bgDropped   prometheus.Counter
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
		createTries: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shoal_edge_create_attempts_total",
			Help: "Create attempts by outcome."}, []string{"outcome"}),
		bgDropped: prometheus.NewCounter(prometheus.CounterOpts{Name: "shoal_edge_background_dropped_total",
			Help: "Best-effort background tasks shed because too many were running."}),
	}
	gauge := func(name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, f)
	}
	counter := func(name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, f)
	}
	reg.MustRegister(m.requests, m.duration, m.rateLimited, m.staleRoutes, m.createTries, m.bgDropped,
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
	BreakerState                         string // "closed" | "half-open" | "open"
}

// Stats returns the routing counters.
func (s *Server) Stats() Stats {
	return Stats{
		CacheHits: s.cache.hits.Load(), CacheMisses: s.cache.misses.Load(), NegativeHits: s.cache.negHits.Load(),
		FallbackInFlight: s.fb.inFlight.Load(), FallbackMaxSeen: s.fb.maxSeen.Load(), FallbackRejected: s.fb.rejected.Load(),
		BreakerState: breakerName(s.fb.breaker.State()),
	}
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

func (s *Server) instrument(name string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
		h.ServeHTTP(rec, r)
		s.m.requests.WithLabelValues(name, strconv.Itoa(rec.status)).Inc()
		s.m.duration.WithLabelValues(name).Observe(time.Since(start).Seconds())
	})
}

func mustHex(s string) []byte {
	b, err := hex.DecodeString(s)
	if err != nil {
		panic(err)
	}
	return b
}
