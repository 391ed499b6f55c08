package plane

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shoaldb/shoal/pipeline/chsink"
)

// The reconciler compares what reached ClickHouse with what the hosts
// produced: usage events carry a contiguous sequence per producer identity
// (host@boot-epoch/usage), so a sequence missing between a producer's
// lowest and highest stored event is an event that never arrived — dropped
// by a full spill on the host (also counted there,
// shoal_pipeline_producer_dropped_total) or lost on the way. It runs every
// ConsumersConfig.ReconcileInterval (default 1 min) over the UTC days of the
// last ReconcileWindow and exports the drift; 0 is the healthy value.
const ReconcileWindow = 48 * time.Hour

// ReconcileStatus is the last reconciliation.
type ReconcileStatus struct {
	Producers int       `json:"producers"`
	Missing   uint64    `json:"missing_events"`
	At        time.Time `json:"at"`
	Error     string    `json:"error,omitempty"`
}

type reconciler struct {
	store *chsink.Store
	log   *slog.Logger
	reg   prometheus.Registerer
	cols  []prometheus.Collector

	missing, producers, lastOK prometheus.Gauge
	errs                       prometheus.Counter

	every time.Duration
	mu    sync.Mutex
	last  ReconcileStatus

	stop, done chan struct{}
}

func startReconciler(store *chsink.Store, every time.Duration, reg prometheus.Registerer, log *slog.Logger) *reconciler {
	if every <= 0 {
		every = time.Minute
	}
	r := &reconciler{store: store, log: log, reg: reg, every: every, stop: make(chan struct{}), done: make(chan struct{}),
		missing: prometheus.NewGauge(prometheus.GaugeOpts{Name: "shoal_pipeline_reconcile_missing_events",
			Help: "Usage events missing in ClickHouse between each producer's lowest and highest stored sequence, last 48 h (0 is healthy)."}),
		producers: prometheus.NewGauge(prometheus.GaugeOpts{Name: "shoal_pipeline_reconcile_producers",
			Help: "Usage producer identities (host boots) seen in ClickHouse, last 48 h."}),
		lastOK: prometheus.NewGauge(prometheus.GaugeOpts{Name: "shoal_pipeline_reconcile_last_success_timestamp_seconds",
			Help: "When the last reconciliation completed."}),
		errs: prometheus.NewCounter(prometheus.CounterOpts{Name: "shoal_pipeline_reconcile_errors_total",
			Help: "Reconciliations that failed (ClickHouse unreachable)."}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{r.missing, r.producers, r.lastOK, r.errs} {
			if err := reg.Register(c); err == nil {
				r.cols = append(r.cols, c)
			}
		}
	}
	go r.loop()
	return r
}

func (r *reconciler) loop() {
	defer close(r.done)
	t := time.NewTicker(r.every)
	defer t.Stop()
	for {
		r.once()
		select {
		case <-r.stop:
			return
		case <-t.C:
		}
	}
}

func (r *reconciler) once() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	now := time.Now()
	gaps, err := r.store.Gaps(ctx, now.Add(-ReconcileWindow))
	st := ReconcileStatus{At: now.UTC()}
	if err != nil {
		r.errs.Inc()
		st.Error = err.Error()
		r.mu.Lock()
		st.Producers, st.Missing = r.last.Producers, r.last.Missing
		r.last = st
		r.mu.Unlock()
		return
	}
	for _, g := range gaps {
		st.Missing += g.Missing
	}
	st.Producers = len(gaps)
	if st.Missing > 0 {
		r.log.Warn("usage events missing in ClickHouse (dropped by a full spill, or lost)", "missing", st.Missing, "producers", st.Producers)
	}
	r.missing.Set(float64(st.Missing))
	r.producers.Set(float64(st.Producers))
	r.lastOK.Set(float64(now.Unix()))
	r.mu.Lock()
	r.last = st
	r.mu.Unlock()
}

func (r *reconciler) status() ReconcileStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last
}

func (r *reconciler) close() {
	close(r.stop)
	<-r.done
	for _, c := range r.cols {
		r.reg.Unregister(c)
	}
}
