package main

import (
	"os"
	"runtime/debug"
)

// serverGCPercent is the garbage collector's target for the long-running
// roles when GOGC is not set. Their live Go heaps are small (the catalog and
// every database live in SQLite files, not in the heap), so letting the heap
// grow to 5x live before collecting costs little memory and saves CPU on
// the write path: 3 catalog processes on 2 cores made 8% more creates/s at
// 16 and 64 clients with 400 than with Go's default 100 (docs/benchmarks.md).
const serverGCPercent = 400

// serverRuntime applies the server defaults; GOGC in the environment wins.
func serverRuntime() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(serverGCPercent)
	}
}
