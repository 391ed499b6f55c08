package chsink

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// Reasons a record is skipped (the reason label of
// shoal_pipeline_chsink_skipped_total). A skipped record is committed past:
// it would fail the same way on every redelivery.
const (
	skipUndecodable  = "undecodable"   // not a JSON usage record
	skipNewerVersion = "newer_version" // a schema version this build does not know
)

var skipReasons = []string{skipUndecodable, skipNewerVersion}

// Stats is a snapshot of a Sink's counters (the same numbers its
// Prometheus metrics export).
type Stats struct {
	Consumed          uint64            // records polled from the topic (redeliveries included)
	Inserted          uint64            // events written (rows of requests), retries of a batch counted once
	InsightRows       uint64            // usage events with a shape written (insight rows of requests)
	Batches           uint64            // batches inserted and committed
	DuplicatesDropped uint64            // events dropped as already inserted by this sink (see recentIDs)
	Skipped           uint64            // records skipped, all reasons
	SkippedBy         map[string]uint64 // by reason
	InsertErrors      uint64            // failed insert attempts (each retried)
	CommitErrors      uint64            // failed offset commits
	SchemaErrors      uint64            // failed schema creation attempts (each retried)
	FetchErrors       uint64            // fetch errors reported by the client
	Lag               int64             // records behind the committed position, all assigned partitions, as of the last fetch
	OldestPendingMs   int64             // window end (Unix ms) of the oldest event consumed and not yet committed; 0 if none
	LastCommittedMs   int64             // window end (Unix ms) of the newest event committed
}

type counters struct {
	consumed, inserted, insightRows, batches atomic.Uint64
	dupes, insertErrors, commitErrors        atomic.Uint64
	schemaErrors, fetchErrors                atomic.Uint64
	skipped                                  [2]atomic.Uint64 // by skipReasons index
	lag, oldestPendingMs, lastCommittedMs    atomic.Int64
}

func (c *counters) skip(reason string) {
	for i, r := range skipReasons {
		if r == reason {
			c.skipped[i].Add(1)
			return
		}
	}
}

// Stats returns the sink's counters.
func (s *Sink) Stats() Stats {
	st := Stats{
		Consumed:          s.c.consumed.Load(),
		Inserted:          s.c.inserted.Load(),
		InsightRows:       s.c.insightRows.Load(),
		Batches:           s.c.batches.Load(),
		DuplicatesDropped: s.c.dupes.Load(),
		InsertErrors:      s.c.insertErrors.Load(),
		CommitErrors:      s.c.commitErrors.Load(),
		SchemaErrors:      s.c.schemaErrors.Load(),
		FetchErrors:       s.c.fetchErrors.Load(),
		Lag:               s.c.lag.Load(),
		OldestPendingMs:   s.c.oldestPendingMs.Load(),
		LastCommittedMs:   s.c.lastCommittedMs.Load(),
		SkippedBy:         make(map[string]uint64, len(skipReasons)),
	}
	for i, r := range skipReasons {
		n := s.c.skipped[i].Load()
		st.SkippedBy[r] = n
		st.Skipped += n
	}
	return st
}

// collectors builds the sink's metrics, labelled with its group; all read
// the same atomics as Stats.
func (s *Sink) collectors() []prometheus.Collector {
	labels := prometheus.Labels{"group": s.cfg.Group}
	counter := func(name, help string, f func() uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels},
			func() float64 { return float64(f()) })
	}
	gauge := func(name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: labels}, f)
	}
	cs := []prometheus.Collector{
		counter("shoal_pipeline_chsink_consumed_total", "Usage records polled from Kafka, redeliveries included.", s.c.consumed.Load),
		counter("shoal_pipeline_chsink_inserted_events_total", "Usage events written to ClickHouse requests (a retried batch counts once).", s.c.inserted.Load),
		counter("shoal_pipeline_chsink_inserted_insight_rows_total", "Usage events with a query shape written to ClickHouse requests (the insight rows).", s.c.insightRows.Load),
		counter("shoal_pipeline_chsink_batches_total", "Batches inserted and committed.", s.c.batches.Load),
		counter("shoal_pipeline_chsink_duplicates_dropped_total", "Events dropped before insert as already inserted by this sink (others are collapsed by ReplacingMergeTree).", s.c.dupes.Load),
		counter("shoal_pipeline_chsink_insert_errors_total", "Failed ClickHouse insert attempts (each is retried; offsets are not committed meanwhile).", s.c.insertErrors.Load),
		counter("shoal_pipeline_chsink_commit_errors_total", "Failed offset commits (the batch is redelivered and deduplicated).", s.c.commitErrors.Load),
		counter("shoal_pipeline_chsink_schema_errors_total", "Failed schema creation attempts at start (retried).", s.c.schemaErrors.Load),
		counter("shoal_pipeline_chsink_fetch_errors_total", "Fetch errors reported by the Kafka client.", s.c.fetchErrors.Load),
		gauge("shoal_pipeline_chsink_lag_records", "Records behind this sink's committed position over its assigned partitions, as of the last fetch.",
			func() float64 { return float64(s.c.lag.Load()) }),
		gauge("shoal_pipeline_chsink_oldest_pending_age_seconds", "Age of the oldest consumed, not yet committed event (by its window end); 0 when none.",
			func() float64 {
				ms := s.c.oldestPendingMs.Load()
				if ms == 0 {
					return 0
				}
				return float64(s.cfg.Now().UnixMilli()-ms) / 1000
			}),
		gauge("shoal_pipeline_chsink_last_committed_window_end_timestamp_seconds", "Window end (Unix seconds) of the newest committed event: aggregate freshness.",
			func() float64 { return float64(s.c.lastCommittedMs.Load()) / 1000 }),
	}
	for i, r := range skipReasons {
		cs = append(cs, prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "shoal_pipeline_chsink_skipped_total",
			Help:        "Records skipped and committed past, by reason (undecodable, newer_version).",
			ConstLabels: prometheus.Labels{"group": s.cfg.Group, "reason": r},
		}, func() float64 { return float64(s.c.skipped[i].Load()) }))
	}
	return cs
}
