package objecthost

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

func benchMeta() *Meta {
	var b [16]byte
	_, _ = rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	return &Meta{ObjectID: id, DatabaseUUID: "0193a6f2-7c1e-7d2a-9f00-" + id[:12], AccountID: "acct-0001",
		Name: "db-" + id[:8], Region: "weur", State: StateActive, CreatedAt: time.Now(), RoutingGeneration: 1}
}

func indexBenchCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkIndexCommit measures one index commit of a batch of 1, 8 or 32
// new records (one put call carrying them, so every commit holds exactly
// that batch) into an index already holding 20,000 records, the way an
// init batch lands on a host. Reported per record: wall time (ns/op) and
// the process's CPU including the close that follows (cpu-µs/rec); per
// commit: wall ms (ms/commit). Only
// the openIndex/put/close API is used, so the file runs unchanged against
// an older index for an A/B. Count the fdatasyncs with strace:
//
//	go test -c -o /tmp/ob.test ./objecthost && strace -f -c -e trace=fsync,fdatasync \
//	  /tmp/ob.test -test.run '^$' -test.bench 'IndexCommit/batch=8$' -test.benchtime 400x
func BenchmarkIndexCommit(b *testing.B) {
	for _, n := range []int{1, 8, 32} {
		b.Run(fmt.Sprintf("batch=%d", n), func(b *testing.B) {
			path := filepath.Join(b.TempDir(), "index.db")
			ix, err := openIndex(path, nil)
			if err != nil {
				b.Fatal(err)
			}
			for range 20 {
				fill := make([]*Meta, 1000)
				for i := range fill {
					fill[i] = benchMeta()
				}
				if err := ix.put(fill...); err != nil {
					b.Fatal(err)
				}
			}
			// Reopened, so nothing of the fill is still being written.
			if err := ix.close(); err != nil {
				b.Fatal(err)
			}
			if ix, err = openIndex(path, nil); err != nil {
				b.Fatal(err)
			}
			batches := make([][]*Meta, b.N)
			for i := range batches {
				batches[i] = make([]*Meta, n)
				for k := range batches[i] {
					batches[i][k] = benchMeta()
				}
			}
			b.ResetTimer()
			cpu0, t0 := indexBenchCPU(), time.Now()
			for i := range b.N {
				if err := ix.put(batches[i]...); err != nil {
					b.Fatal(err)
				}
			}
			wall := time.Since(t0)
			cpu := indexBenchCPU() - cpu0
			b.StopTimer()
			b.ReportMetric(float64(wall.Nanoseconds())/float64(b.N*n), "ns/op")
			b.ReportMetric(float64(cpu.Microseconds())/float64(b.N*n), "cpu-µs/rec")
			b.ReportMetric(float64(wall.Microseconds())/1000/float64(b.N), "ms/commit")
		})
	}
}
