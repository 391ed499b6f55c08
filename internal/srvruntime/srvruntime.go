// Package srvruntime sets the Go runtime up for Shoal's long-running roles
// (the shoal binary's serve commands and `shoal dev`).
//
// Two settings, both measured on the 2-core machine type (docs/benchmarks.md)
// and both overridden by the standard environment variables:
//
//   - GOGC 400 instead of 100. The roles' live Go heaps are small: the
//     catalog and every database live in SQLite files, not in the heap. A
//     heap allowed to grow to 5x live costs little memory and saves CPU: 3
//     catalog processes made ~8% more creates/s at 16 and 64 clients.
//   - One P more than the default GOMAXPROCS for roles that block in cgo
//     (SQLite) and fsync: the catalog, the object host and `shoal dev`. A
//     goroutine inside a cgo call or a blocking system call keeps its P
//     until the runtime's monitor takes it back, and with 2 Ps one fsync or
//     SQLite commit in flight halves the process's capacity to run the
//     goroutines that are ready. With a spare P, `shoal dev` on 2 cores made
//     ~1.6x the creates/s at 16 clients (p50 7.6 ms instead of 12) with the
//     same point-SELECT p99. More spare Ps (4 or 8 on 2 cores) made the
//     query tail worse, so it is exactly one.
//
// MonitorAwake (monitor.go), for the edge and the object host, is a third
// setting, made by re-executing the binary because the runtime reads it
// only at start.
package srvruntime

import (
	"os"
	"runtime"
	"runtime/debug"
)

// GCPercent is the garbage collector's target when GOGC is not set.
const GCPercent = 400

// Apply sets the runtime for a server role; spareP asks for the extra P
// (roles that block in cgo or fsync). It returns a function that restores
// the previous settings (for tests that run a role in-process).
func Apply(spareP bool) (restore func()) {
	prevGC, prevP := -1, 0
	if os.Getenv("GOGC") == "" {
		prevGC = debug.SetGCPercent(GCPercent)
	}
	if spareP && os.Getenv("GOMAXPROCS") == "" {
		prevP = runtime.GOMAXPROCS(runtime.GOMAXPROCS(0) + 1)
	}
	return func() {
		if prevGC != -1 {
			debug.SetGCPercent(prevGC)
		}
		if prevP != 0 {
			runtime.GOMAXPROCS(prevP)
		}
	}
}
