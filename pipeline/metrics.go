package pipeline

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// Reasons a record is dropped (the reason label of
// shoal_pipeline_producer_dropped_total).
const (
	dropSpillFull  = "spill_full"  // the spill is at MaxSpillBytes
	dropSpillSlow  = "spill_slow"  // the spill's write queue is at SpillQueueBytes (the disk cannot keep up)
	dropTooLarge   = "too_large"   // over MaxRecordBytes
	dropRejected   = "rejected"    // the broker refused the record itself (too large, invalid)
	dropSpillError = "spill_error" // writing the spill failed (disk full, I/O error)
	dropShutdown   = "shutdown"    // Close could neither deliver nor spill it
	dropClosed     = "closed"      // published after Close
)

var dropReasons = []string{dropSpillFull, dropSpillSlow, dropTooLarge, dropRejected, dropSpillError, dropShutdown, dropClosed}

// Stats is a snapshot of a Producer's counters (the same numbers its
// Prometheus metrics export).
type Stats struct {
	Enqueued       uint64            // Publish calls
	Produced       uint64            // records acknowledged by the broker (replays included)
	ProduceErrors  uint64            // produce attempts that failed (the record was then spilled, retried or dropped)
	SpilledRecords uint64            // records written to the spill
	SpilledBytes   uint64            // framed bytes written to the spill
	Replayed       uint64            // spilled records acknowledged by the broker
	Dropped        uint64            // records lost, all reasons
	DroppedBy      map[string]uint64 // by reason
	CorruptBytes   uint64            // spill bytes skipped as unreadable
	BufferedBytes  int64             // record bytes in memory: handed to the client and unacknowledged, or waiting for the spill writer
	SpillBytes     int64             // unreplayed bytes in the spill (on disk or queued for it)
	Spilling       bool              // new records go to the spill
}

type counters struct {
	enqueued, produced, produceErrors atomic.Uint64
	spilledRecords, spilledBytes      atomic.Uint64
	replayed, corruptBytes            atomic.Uint64
	drops                             [7]atomic.Uint64 // by dropReasons index
}

func dropIndex(reason string) int {
	for i, r := range dropReasons {
		if r == reason {
			return i
		}
	}
	return len(dropReasons) - 1
}

// spillStats implementation.
func (c *counters) spilled(records int, bytes int64) {
	c.spilledRecords.Add(uint64(records))
	c.spilledBytes.Add(uint64(bytes))
}
func (c *counters) dropped(reason string, records int) {
	c.drops[dropIndex(reason)].Add(uint64(records))
}
func (c *counters) corrupt(bytes int64) { c.corruptBytes.Add(uint64(bytes)) }

// Stats returns the producer's counters.
func (p *Producer) Stats() Stats {
	s := Stats{
		Enqueued:       p.c.enqueued.Load(),
		Produced:       p.c.produced.Load(),
		ProduceErrors:  p.c.produceErrors.Load(),
		SpilledRecords: p.c.spilledRecords.Load(),
		SpilledBytes:   p.c.spilledBytes.Load(),
		Replayed:       p.c.replayed.Load(),
		CorruptBytes:   p.c.corruptBytes.Load(),
		DroppedBy:      make(map[string]uint64, len(dropReasons)),
		BufferedBytes:  p.directBytes.Load() + p.replayBytes.Load() + p.headLen.Load() + p.spill.queued(),
		SpillBytes:     p.spill.backlog(),
		Spilling:       p.spilling.Load(),
	}
	for i, r := range dropReasons {
		n := p.c.drops[i].Load()
		s.DroppedBy[r] = n
		s.Dropped += n
	}
	return s
}

// collectors builds the producer's metrics; all read the same atomics as
// Stats, so the two never disagree.
func (p *Producer) collectors() []prometheus.Collector {
	counter := func(name, help string, f func() uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help},
			func() float64 { return float64(f()) })
	}
	gauge := func(name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, f)
	}
	cs := []prometheus.Collector{
		counter("shoal_pipeline_producer_enqueued_total", "Records published (Publish calls).", p.c.enqueued.Load),
		counter("shoal_pipeline_producer_produced_total", "Records acknowledged by the broker, replays included.", p.c.produced.Load),
		counter("shoal_pipeline_producer_produce_errors_total", "Produce attempts that failed (the record was then spilled, retried or dropped).", p.c.produceErrors.Load),
		counter("shoal_pipeline_producer_spilled_records_total", "Records written to the local spill.", p.c.spilledRecords.Load),
		counter("shoal_pipeline_producer_spilled_bytes_total", "Framed bytes written to the local spill.", p.c.spilledBytes.Load),
		counter("shoal_pipeline_producer_replayed_total", "Spilled records replayed and acknowledged by the broker.", p.c.replayed.Load),
		counter("shoal_pipeline_producer_spill_corrupt_bytes_total", "Spill bytes skipped as unreadable (torn tail, CRC mismatch).", p.c.corruptBytes.Load),
		gauge("shoal_pipeline_producer_buffered_bytes", "Record bytes held in memory (unacknowledged in the client, or waiting for the spill writer).",
			func() float64 {
				return float64(p.directBytes.Load() + p.replayBytes.Load() + p.headLen.Load() + p.spill.queued())
			}),
		gauge("shoal_pipeline_producer_spill_bytes", "Unreplayed bytes in the spill.", func() float64 { return float64(p.spill.backlog()) }),
		gauge("shoal_pipeline_producer_spilling", "1 while new records go to the spill instead of the broker.", func() float64 {
			if p.spilling.Load() {
				return 1
			}
			return 0
		}),
	}
	for i, r := range dropReasons {
		i := i
		cs = append(cs, prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "shoal_pipeline_producer_dropped_total",
			Help:        "Records lost, by reason (spill_full, spill_slow, too_large, rejected, spill_error, shutdown, closed).",
			ConstLabels: prometheus.Labels{"reason": r},
		}, func() float64 { return float64(p.c.drops[i].Load()) }))
	}
	return cs
}
