package objecthost

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the host's Prometheus series, on a registry of its own (no
// global registry: several hosts may live in one test process).
type metrics struct {
	reg          *prometheus.Registry
	queries      *prometheus.CounterVec // outcome
	latency      prometheus.Histogram   // seconds, whole request incl. open
	openHandles  prometheus.Gauge       // handles in the LRU
	queueDepth   prometheus.Gauge       // queries in flight on the host
	heartbeats   *prometheus.CounterVec // outcome
	catalogCalls *prometheus.CounterVec // method, outcome
	bytesOnDisk  prometheus.Gauge       // sum of database sizes
	databases    *prometheus.GaugeVec   // state
	lifecycle    *prometheus.CounterVec // op (init, confirm, delete, sweep)
	indexCommits prometheus.Histogram   // ops per index transaction
	initLatency  prometheus.Histogram   // seconds
	blocked      prometheus.Gauge       // accounts with BlockGrowth set

	sizeRepublishPending prometheus.Gauge   // objects the restart pass has yet to visit
	sizesRepublished     prometheus.Counter // sizes the restart pass recorded
	resurrected          prometheus.Gauge   // databases deleted here the catalog lists active again

	// queryOutcome holds the queries counter of each outcome label,
	// resolved once: WithLabelValues hashes the label and locks the vector
	// on every call, which showed in the query path's profile.
	queryOutcome map[string]prometheus.Counter
}

// queryDone counts one query by outcome.
func (m *metrics) queryDone(outcome string) {
	c, ok := m.queryOutcome[outcome]
	if !ok {
		c = m.queries.WithLabelValues(outcome)
	}
	c.Inc()
}

func newMetrics(reg *prometheus.Registry) *metrics {
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	m := &metrics{
		reg: reg,
		queries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shoal_objecthost_queries_total", Help: "Queries by outcome (ok, sql_error, not_found, deleted, wrong_host, overloaded, limit, error).",
		}, []string{"outcome"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "shoal_objecthost_query_duration_seconds", Help: "Query latency on the host, handle acquisition included.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
		}),
		openHandles: prometheus.NewGauge(prometheus.GaugeOpts{Name: "shoal_objecthost_open_handles", Help: "Database handles held open by the LRU."}),
		queueDepth:  prometheus.NewGauge(prometheus.GaugeOpts{Name: "shoal_objecthost_queue_depth", Help: "Queries in flight on this host."}),
		heartbeats: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shoal_objecthost_heartbeats_total", Help: "Heartbeat outcomes per database (ok, digest_ok: answered by an equal bucket digest, orphan_killed, route_repaired, deleted, error, skipped).",
		}, []string{"outcome"}),
		catalogCalls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shoal_objecthost_catalog_calls_total", Help: "Catalog calls by method and outcome.",
		}, []string{"method", "outcome"}),
		bytesOnDisk: prometheus.NewGauge(prometheus.GaugeOpts{Name: "shoal_objecthost_database_files_bytes", Help: "Sum of the last known sizes of this host's database files."}),
		databases: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "shoal_objecthost_databases", Help: "Objects in the index by state.",
		}, []string{"state"}),
		lifecycle: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shoal_objecthost_lifecycle_total", Help: "Lifecycle operations (init, init_conflict, confirm, delete, swept).",
		}, []string{"op"}),
		indexCommits: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "shoal_objecthost_index_batch_operations", Help: "Operations per group-committed index transaction.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 12),
		}),
		initLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "shoal_objecthost_init_duration_seconds", Help: "Init latency, durable commit included.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
		}),
		blocked: prometheus.NewGauge(prometheus.GaugeOpts{Name: "shoal_objecthost_blocked_accounts", Help: "Accounts over their storage limit (writes that grow are blocked)."}),
		sizeRepublishPending: prometheus.NewGauge(prometheus.GaugeOpts{Name: "shoal_objecthost_size_republish_pending",
			Help: "Objects the size republication after start has yet to visit (0 once it is done)."}),
		sizesRepublished: prometheus.NewCounter(prometheus.CounterOpts{Name: "shoal_objecthost_sizes_republished_total",
			Help: "Database sizes published again by the pass after start (sizes a crash may have lost)."}),
		resurrected: prometheus.NewGauge(prometheus.GaugeOpts{Name: "shoal_objecthost_resurrected_databases",
			Help: "Databases deleted on this host that the catalog lists active again (a catalog restored from an older backup); see GET /v1/resurrected."}),
	}
	// The label values outcome() returns.
	outcomes := []string{"ok", "sql_error", "not_found", "deleted", "wrong_host", "overloaded", "limit", "error"}
	m.queryOutcome = make(map[string]prometheus.Counter, len(outcomes))
	for _, o := range outcomes {
		m.queryOutcome[o] = m.queries.WithLabelValues(o)
	}
	m.reg.MustRegister(m.queries, m.latency, m.openHandles, m.queueDepth, m.heartbeats, m.catalogCalls,
		m.bytesOnDisk, m.databases, m.lifecycle, m.indexCommits, m.initLatency, m.blocked,
		m.sizeRepublishPending, m.sizesRepublished, m.resurrected)
	return m
}
