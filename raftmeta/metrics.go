package raftmeta

import (
	"strings"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"
)

// metrics is one node's Prometheus registry (no global registry: several
// nodes share a process in tests).
type metrics struct {
	reg          *prometheus.Registry
	applyLatency prometheus.Histogram
	batchSize    prometheus.Histogram
	// batchCommands: commands per FSM transaction (a batch entry counts
	// its commands).
	batchCommands prometheus.Histogram
	snapshotDur   *prometheus.HistogramVec
	forwarded     *prometheus.CounterVec
	reads         *prometheus.CounterVec
	drains        prometheus.Counter
}

func newMetrics(n *Node) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		applyLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "shoal_raftmeta_apply_duration_seconds",
			Help:    "Latency of proposals applied through this node's Raft (leader side), commit and FSM apply included.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}),
		batchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "shoal_raftmeta_fsm_batch_entries",
			Help:    "Log entries per FSM ApplyBatch call (group commit).",
			Buckets: prometheus.ExponentialBuckets(1, 2, 11),
		}),
		batchCommands: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "shoal_raftmeta_fsm_batch_commands",
			Help:    "Commands per FSM ApplyBatch call: log entries, a batch entry counted by its commands.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 11),
		}),
		snapshotDur: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "shoal_raftmeta_snapshot_duration_seconds",
			Help:    "Duration of FSM snapshot phases (capture, persist, restore).",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}, []string{"phase"}),
		forwarded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shoal_raftmeta_forwarded_total",
			Help: "Requests this follower forwarded to the leader, by kind and outcome.",
		}, []string{"kind", "outcome"}),
		reads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shoal_raftmeta_reads_total",
			Help: "Catalog reads served, by consistency level and outcome.",
		}, []string{"consistency", "outcome"}),
		drains: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "shoal_raftmeta_stats_drains_total",
			Help: "Stats drain commands proposed by this node as leader.",
		}),
	}
	gauge := func(name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, f)
	}
	m.reg.MustRegister(m.applyLatency, m.batchSize, m.batchCommands, m.snapshotDur, m.forwarded, m.reads, m.drains,
		stateCollector{n: n},
		gauge("shoal_raftmeta_is_leader", "1 when this node is the leader.", func() float64 {
			if n.raft.State() == raft.Leader {
				return 1
			}
			return 0
		}),
		gauge("shoal_raftmeta_cluster_level", "The cluster's catalog level as this node has applied it (commands above it are refused).", func() float64 {
			return float64(n.cat.ClusterLevel())
		}),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "shoal_raftmeta_fsm_batch_entries_total",
			Help: "Batch entries (one log entry carrying many commands; catalog level 3) this replica's FSM was handed since the process started, applied or refused whole.",
		}, func() float64 { return float64(n.cat.BatchEntries()) }),
		gauge("shoal_raftmeta_build_level", "The catalog level this node's build knows.", func() float64 { return float64(n.cat.BuildLevel()) }),
		gauge("shoal_raftmeta_term", "Current Raft term.", func() float64 { return float64(n.raft.CurrentTerm()) }),
		gauge("shoal_raftmeta_commit_index", "Raft commit index known to this node.", func() float64 { return float64(n.raft.CommitIndex()) }),
		gauge("shoal_raftmeta_applied_index", "Highest log index applied to the catalog FSM.", func() float64 { return float64(n.AppliedIndex()) }),
		gauge("shoal_raftmeta_last_contact_seconds", "Seconds since this node last heard from a leader (0 on the leader).", func() float64 {
			return n.staleness().Seconds()
		}),
	)
	m.reg.MustRegister(n.cfg.Collectors...)
	return m
}

// raftStates are the values of shoal_raftmeta_state's state label, one
// series each (1 for the node's current state, 0 for the others), as
// Prometheus advises for enumerations: an alert reads
// shoal_raftmeta_state{state="leader"} == 1 instead of a magic number.
var raftStates = []raft.RaftState{raft.Follower, raft.Candidate, raft.Leader, raft.Shutdown}

var stateDesc = prometheus.NewDesc("shoal_raftmeta_state",
	"Raft state of this node: 1 for the current state, 0 for the others.", []string{"state"}, nil)

type stateCollector struct{ n *Node }

func (c stateCollector) Describe(ch chan<- *prometheus.Desc) { ch <- stateDesc }

func (c stateCollector) Collect(ch chan<- prometheus.Metric) {
	cur := c.n.raft.State()
	for _, st := range raftStates {
		v := 0.0
		if st == cur {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(stateDesc, prometheus.GaugeValue, v, strings.ToLower(st.String()))
	}
}
