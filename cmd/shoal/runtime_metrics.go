package main

import (
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// runtimeCollectors are the collectors every role's /metrics carries
// besides its own: the Go runtime (go_*), the process (process_*: CPU,
// memory, open files) and shoal_build_info{version,commit,goversion} = 1,
// so a dashboard can tell which build each process runs.
func runtimeCollectors() []prometheus.Collector {
	info, _ := debug.ReadBuildInfo()
	v, c := versionAndCommit(version, commit, info)
	return []prometheus.Collector{
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "shoal_build_info",
			Help:        "Always 1; the labels name the running build (version as `shoal --version` prints it, commit).",
			ConstLabels: prometheus.Labels{"version": v, "commit": c, "goversion": runtime.Version()},
		}, func() float64 { return 1 }),
	}
}

// registerRuntime registers runtimeCollectors on reg.
func registerRuntime(reg prometheus.Registerer) {
	reg.MustRegister(runtimeCollectors()...)
}
