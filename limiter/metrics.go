package limiter

import "github.com/prometheus/client_golang/prometheus"

// metrics are shoal_limiter_*. Channel-labelled counters are created for
// every configured notifier at start, so they read 0 rather than missing.
type metrics struct {
	passes          prometheus.Counter
	passErrors      prometheus.Counter
	accountsOver    prometheus.Gauge
	lastPass        prometheus.Gauge
	active          prometheus.Gauge
	limitsPublished prometheus.Counter
	clearsPublished prometheus.Counter
	publishErrors   prometheus.Counter
	claims          *prometheus.CounterVec // result: claimed, taken, error
	noticesSent     *prometheus.CounterVec // channel
	noticeErrors    *prometheus.CounterVec // channel
	noticesDropped  *prometheus.CounterVec // channel
	pending         prometheus.GaugeFunc

	all []prometheus.Collector
}

func newMetrics(pending func() float64) *metrics {
	m := &metrics{
		passes:          prometheus.NewCounter(prometheus.CounterOpts{Name: "shoal_limiter_passes_total", Help: "Limiter passes completed (as the active limiter)."}),
		passErrors:      prometheus.NewCounter(prometheus.CounterOpts{Name: "shoal_limiter_pass_errors_total", Help: "Passes that failed (ClickHouse unreachable, …); retried at the next interval."}),
		accountsOver:    prometheus.NewGauge(prometheus.GaugeOpts{Name: "shoal_limiter_accounts_over", Help: "Free-tier accounts over a daily limit at the last pass."}),
		lastPass:        prometheus.NewGauge(prometheus.GaugeOpts{Name: "shoal_limiter_last_pass_timestamp_seconds", Help: "Unix time of the last completed pass."}),
		active:          prometheus.NewGauge(prometheus.GaugeOpts{Name: "shoal_limiter_is_active", Help: "1 while this limiter is the one acting (owns partition 0 of accounts in its group)."}),
		limitsPublished: prometheus.NewCounter(prometheus.CounterOpts{Name: "shoal_limiter_limits_published_total", Help: "Limited flags published on the limits topic."}),
		clearsPublished: prometheus.NewCounter(prometheus.CounterOpts{Name: "shoal_limiter_clears_published_total", Help: "Clearing records published on the limits topic (tier changes)."}),
		publishErrors:   prometheus.NewCounter(prometheus.CounterOpts{Name: "shoal_limiter_publish_errors_total", Help: "Records the broker did not acknowledge (retried)."}),
		claims:          prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shoal_limiter_notice_claims_total", Help: "claim_limit_notice proposals by result: claimed, taken (already claimed for the day), error."}, []string{"result"}),
		noticesSent:     prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shoal_limiter_notices_sent_total", Help: "Notices a channel accepted."}, []string{"channel"}),
		noticeErrors:    prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shoal_limiter_notice_errors_total", Help: "Failed notice attempts (retried with backoff until the limit lifts)."}, []string{"channel"}),
		noticesDropped:  prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shoal_limiter_notices_dropped_total", Help: "Notices given up: permanent failure, the day ended, or the limiter closed."}, []string{"channel"}),
		pending:         prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "shoal_limiter_notices_pending", Help: "Notices claimed by this limiter and not yet delivered on every channel."}, pending),
	}
	m.all = []prometheus.Collector{m.passes, m.passErrors, m.accountsOver, m.lastPass, m.active, m.limitsPublished,
		m.clearsPublished, m.publishErrors, m.claims, m.noticesSent, m.noticeErrors, m.noticesDropped, m.pending}
	return m
}
