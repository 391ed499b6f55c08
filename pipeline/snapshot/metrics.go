package snapshot

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Stages of a pass, the stage label of shoal_pipeline_snapshot_pass_errors_total.
const (
	stageSchema = "schema" // creating the table
	stageState  = "state"  // reading the last completed bucket
	stageRead   = "read"   // a catalog page
	stageInsert = "insert" // a batch of rows or the completion marker
)

var stages = []string{stageSchema, stageState, stageRead, stageInsert}

// Stats is a snapshot of a Snapshotter's counters (the numbers its
// Prometheus metrics export).
type Stats struct {
	Passes        uint64            // passes completed (marker written)
	PassErrors    uint64            // failed attempts of any stage (each retried), all stages
	ErrorsByStage map[string]uint64 // the same, by stage
	Rows          uint64            // rows written by completed inserts (a retried batch counted once)
	Pages         uint64            // catalog pages read
	MissedBuckets uint64            // buckets no pass completed for (the snapshotter, the catalog or ClickHouse unavailable for them)
	LastSuccess   int64             // snapshot_time (Unix s) of the newest completed bucket; 0 if none known
}

type metrics struct {
	passes, rows, pages, missed atomic.Uint64
	errs                        [4]atomic.Uint64 // by stages index
	lastSuccess                 atomic.Int64

	passDuration, pageDuration prometheus.Histogram
}

func newMetrics() *metrics {
	return &metrics{
		passDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "shoal_pipeline_snapshot_pass_duration_seconds",
			Help:    "Duration of completed passes, from the first catalog page to the completion marker (retries included).",
			Buckets: prometheus.ExponentialBuckets(0.05, 2, 14), // 50 ms … ~7 min
		}),
		pageDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "shoal_pipeline_snapshot_page_duration_seconds",
			Help:    "Latency of successful catalog storage page reads.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14),
		}),
	}
}

// succeeded records bucket b as completed; the gauge never moves back.
func (m *metrics) succeeded(b time.Time) {
	for {
		old := m.lastSuccess.Load()
		if b.Unix() <= old || m.lastSuccess.CompareAndSwap(old, b.Unix()) {
			return
		}
	}
}

func (m *metrics) fail(stage string) {
	for i, s := range stages {
		if s == stage {
			m.errs[i].Add(1)
		}
	}
}

func (m *metrics) stats() Stats {
	st := Stats{
		Passes: m.passes.Load(), Rows: m.rows.Load(), Pages: m.pages.Load(), MissedBuckets: m.missed.Load(),
		LastSuccess: m.lastSuccess.Load(), ErrorsByStage: make(map[string]uint64, len(stages)),
	}
	for i, s := range stages {
		n := m.errs[i].Load()
		st.ErrorsByStage[s] = n
		st.PassErrors += n
	}
	return st
}

// collectors are the Prometheus views of the counters.
func (m *metrics) collectors() []prometheus.Collector {
	counter := func(name, help string, v *atomic.Uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "shoal_pipeline_snapshot_" + name, Help: help},
			func() float64 { return float64(v.Load()) })
	}
	cols := []prometheus.Collector{
		counter("passes_total", "Storage snapshot passes completed.", &m.passes),
		counter("rows_total", "Rows written into storage_snapshots by completed inserts.", &m.rows),
		counter("pages_total", "Catalog storage pages read.", &m.pages),
		counter("missed_buckets_total", "Snapshot buckets no pass completed for.", &m.missed),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "shoal_pipeline_snapshot_last_success_timestamp_seconds",
			Help: "snapshot_time (Unix seconds) of the newest completed bucket."},
			func() float64 { return float64(m.lastSuccess.Load()) }),
		m.passDuration, m.pageDuration,
	}
	errs := prometheus.NewDesc("shoal_pipeline_snapshot_pass_errors_total",
		"Failed attempts within passes, by stage (each is retried).", []string{"stage"}, nil)
	cols = append(cols, &errCollector{m: m, desc: errs})
	return cols
}

// errCollector exports the per-stage error counters as one labelled family.
type errCollector struct {
	m    *metrics
	desc *prometheus.Desc
}

func (c *errCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *errCollector) Collect(ch chan<- prometheus.Metric) {
	for i, s := range stages {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(c.m.errs[i].Load()), s)
	}
}
