package history

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/objecthost/sqlexec"
)

// BenchmarkInsert: one-row INSERT requests with history off (plain
// sqlexec) and on (capture + shipper into a directory store on the same
// disk; on-s3: into gofakes3 over HTTP, in memory), in the same run;
// sequential and with 8 concurrent writers (group commit). Reports p99
// latency, the process's CPU time per insert and, with history, how
// capture kept up.
//
//	go test -run '^$' -bench BenchmarkInsert -benchtime 20000x ./objecthost/history/
func BenchmarkInsert(b *testing.B) {
	for _, par := range []int{1, 8} {
		for _, mode := range []string{"off", "on", "on-s3", "archived"} {
			b.Run(fmt.Sprintf("writers=%d/history=%s", par, mode), func(b *testing.B) {
				var db *sqlexec.DB
				var c *Capturer
				if mode != "off" {
					var store Store
					if mode == "on-s3" {
						_, store = newS3(b) // the archive is not on this disk
					} else {
						ds, err := NewDirStore(b.TempDir())
						require.NoError(b, err)
						store = ds
					}
					e := newEnvMode(b, store, CaptureOptions{CheckpointFrames: benchCkptFrames()}, ShipperOptions{}, mode == "archived")
					db, c = e.db, e.cap
				} else {
					var err error
					db, err = sqlexec.Open(filepath.Join(b.TempDir(), "x.db"), sqlexec.Options{ReadConns: 2})
					require.NoError(b, err)
					b.Cleanup(func() { db.Close() })
				}
				_, err := execOn(db, "CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT, n INTEGER)")
				require.NoError(b, err)
				var st0 CaptureStats
				if c != nil {
					st0 = c.Stats()
				}
				cpu0 := cpuTime()
				lat := runWorkers(b, par, func(i int) error {
					_, err := execOn(db, "INSERT INTO t(v, n) VALUES (?, ?)", "some text of a row", i)
					return err
				})
				// CPU time of the whole process (writer, capture, shipper,
				// clients) per insert: steadier than wall time on a shared
				// machine.
				b.ReportMetric(float64((cpuTime()-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/op")
				if c != nil {
					// How capture kept up: records per staging write, and
					// the writer's wait before its checkpoints per insert.
					st := c.Stats()
					b.ReportMetric(float64(st.Records-st0.Records)/float64(max(1, st.Batches-st0.Batches)), "records/write")
					b.ReportMetric(float64((st.CheckpointWait-st0.CheckpointWait).Nanoseconds())/float64(b.N), "ckpt-wait-ns/op")
					b.ReportMetric(float64(st.FullCheckpoints-st0.FullCheckpoints), "checkpoints")
				}
				sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
				b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
				// The inserts that ran a checkpoint (about one in 1,000).
				b.ReportMetric(float64(lat[len(lat)*999/1000].Microseconds()), "p99.9-µs")
			})
		}
	}
}

// runWorkers runs op for i in [0, b.N) on par goroutines, timed (the timer
// reset at the start, stopped at the end), and returns each op's latency.
func runWorkers(b *testing.B, par int, op func(i int) error) []time.Duration {
	lat := make([]time.Duration, b.N)
	b.ResetTimer()
	var wg sync.WaitGroup
	per := (b.N + par - 1) / par
	for w := 0; w < par; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := w * per; i < min(b.N, (w+1)*per); i++ {
				t0 := time.Now()
				if err := op(i); err != nil {
					b.Error(err)
					return
				}
				lat[i] = time.Since(t0)
			}
		}(w)
	}
	wg.Wait()
	b.StopTimer()
	return lat
}

// BenchmarkPointSelect: point SELECTs by primary key with history off vs
// on (capture attached, shipper running), 1 and 8 readers, on a 1,000-row
// table: the read side of issue 13's "≤ 10 % cost" figure.
//
//	go test -run '^$' -bench 'BenchmarkPointSelect' -benchtime 20000x ./objecthost/history/
func BenchmarkPointSelect(b *testing.B) {
	for _, par := range []int{1, 8} {
		for _, mode := range []string{"off", "on"} {
			b.Run(fmt.Sprintf("readers=%d/history=%s", par, mode), func(b *testing.B) {
				var db *sqlexec.DB
				if mode == "on" {
					ds, err := NewDirStore(b.TempDir())
					require.NoError(b, err)
					db = newEnvMode(b, ds, CaptureOptions{}, ShipperOptions{}, false).db
				} else {
					var err error
					db, err = sqlexec.Open(filepath.Join(b.TempDir(), "x.db"), sqlexec.Options{ReadConns: 2})
					require.NoError(b, err)
					b.Cleanup(func() { db.Close() })
				}
				_, err := execOn(db, "CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT); INSERT INTO t SELECT value, 'row ' || value FROM json_each((SELECT json_group_array(x) FROM (WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x < 1000) SELECT x FROM c)))")
				require.NoError(b, err)
				cpu0 := cpuTime()
				lat := runWorkers(b, par, func(i int) error {
					_, err := execOn(db, "SELECT v FROM t WHERE id = ?", i%1000+1)
					return err
				})
				b.ReportMetric(float64((cpuTime()-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/op")
				sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
				b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
			})
		}
	}
}

// BenchmarkWriteAmplification: bytes put into the store (segments and
// snapshots) per byte of SQL-visible change (the inserted values), for one
// small row per commit and for 100 rows per commit.
//
//	go test -run '^$' -bench BenchmarkWriteAmplification -benchtime 1x ./objecthost/history/
func BenchmarkWriteAmplification(b *testing.B) {
	for _, rows := range []int{1, 100} {
		b.Run(fmt.Sprintf("rows_per_commit=%d", rows), func(b *testing.B) {
			store, err := NewDirStore(b.TempDir())
			require.NoError(b, err)
			e := newEnv(b, store, CaptureOptions{}, ShipperOptions{})
			_, err = execOn(e.db, "CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)")
			require.NoError(b, err)
			e.sync()
			before := storeBytes(b, store)
			const commits = 2000
			payload := "a row of about a hundred bytes: lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do"
			visible := 0
			for c := 0; c < commits; c++ {
				stmts := make([]sqlexec.Statement, rows)
				for i := range stmts {
					stmts[i] = sqlexec.Statement{SQL: "INSERT INTO t(v) VALUES ('" + payload + "')"}
					visible += len(payload) + 8 // the value and its rowid
				}
				_, err := e.db.Execute(context.Background(), sqlexec.Request{Statements: stmts})
				require.NoError(b, err)
			}
			e.close()
			archived := storeBytes(b, store) - before
			b.ReportMetric(float64(archived)/float64(visible), "archived/visible")
			b.ReportMetric(float64(archived)/commits, "archived-B/commit")
		})
	}
}

func storeBytes(b testing.TB, s *DirStore) int64 {
	keys, err := s.List(context.Background(), "")
	require.NoError(b, err)
	var n int64
	for _, k := range keys {
		r, err := s.Get(context.Background(), k)
		require.NoError(b, err)
		fi, err := r.(*os.File).Stat()
		require.NoError(b, err)
		n += fi.Size()
		r.Close()
	}
	return n
}

// BenchmarkRestore: restore a database of about 100 MB (1 MB blob rows, a
// snapshot in the middle of its log) to its last commit and to a point in
// the middle, from a directory store.
//
//	go test -run '^$' -bench BenchmarkRestore -benchtime 3x ./objecthost/history/
func BenchmarkRestore(b *testing.B) {
	store, err := NewDirStore(b.TempDir())
	require.NoError(b, err)
	e := newEnv(b, store, CaptureOptions{}, ShipperOptions{SnapshotMinBytes: 64 << 20})
	_, err = execOn(e.db, "CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB)")
	require.NoError(b, err)
	var mid Position
	for i := 0; i < 100; i++ {
		_, err := execOn(e.db, "INSERT INTO t(v) VALUES (randomblob(1000000))")
		require.NoError(b, err)
		if i%10 == 9 {
			_, err := execOn(e.db, "UPDATE t SET v = randomblob(1000000) WHERE id = ?", i-5)
			require.NoError(b, err)
		}
		if i == 60 {
			mid = e.cap.Current()
		}
	}
	e.close()
	latest, err := e.archive.Latest(context.Background(), e.key)
	require.NoError(b, err)
	for name, p := range map[string]Position{"latest": latest, "middle": mid} {
		b.Run(name, func(b *testing.B) {
			var st RestoreStats
			for i := 0; i < b.N; i++ {
				st, err = e.archive.Restore(context.Background(), e.key, p, filepath.Join(b.TempDir(), "r.db"))
				require.NoError(b, err)
			}
			b.ReportMetric(float64(st.DatabaseBytes)/1e6, "db-MB")
			b.ReportMetric(float64(st.BytesRead)/1e6, "read-MB")
			b.ReportMetric(float64(st.Records), "records")
		})
	}
}

// cpuTime is the process's user + system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func benchCkptFrames() int {
	n, _ := strconv.Atoi(os.Getenv("HISTORY_BENCH_CKPT"))
	return n
}

// BenchmarkArchivePerDay: archive bytes for a 10 MB database taking one
// small write per second, for three simulated hours (fake clock, 10,800
// commits, shipped every simulated minute), reported per day (× 8), by
// kind: segments (the records) and snapshots (the shipper's policy: after
// max(16 MiB, the database size) of records, or an hour after the last
// one if anything changed — at one write per second, once an hour).
// Shipping every minute instead of every ~0.5 s (MaxLag/2, what a host
// does at this rate) leaves the bytes the same (records are encoded one
// by one) but not the number of PUTs, which is not reported.
//
//	go test -run '^$' -bench BenchmarkArchivePerDay -benchtime 1x ./objecthost/history/
func BenchmarkArchivePerDay(b *testing.B) {
	const hours = 3
	store, err := NewDirStore(b.TempDir())
	require.NoError(b, err)
	clk := &fakeClock{}
	clk.us.Store(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC).UnixMicro())
	e := newEnv(b, store, CaptureOptions{Now: clk.now}, ShipperOptions{Now: clk.now})
	_, err = execOn(e.db, "CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT, b BLOB)")
	require.NoError(b, err)
	for i := 0; i < 10; i++ {
		_, err := execOn(e.db, "INSERT INTO t(b) SELECT randomblob(1000) FROM generate_series(1, 1000)")
		if err != nil { // no generate_series: a recursive CTE
			_, err = execOn(e.db, "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM n WHERE x < 1000) INSERT INTO t(b) SELECT randomblob(1000) FROM n")
		}
		require.NoError(b, err)
	}
	e.sync()
	seg0, snap0, nsnap0 := storeBytesByKind(b, store)
	for s := 1; s <= hours*3600; s++ {
		clk.advance(time.Second)
		_, err := execOn(e.db, "INSERT INTO t(v) VALUES (?)", "a small row of about fifty bytes, e.g. an event")
		require.NoError(b, err)
		if s%60 == 0 {
			e.cap.Current() // captured…
			e.sync()        // …and shipped (a snapshot when due)
		}
	}
	e.close()
	seg1, snap1, nsnap1 := storeBytesByKind(b, store)
	fi, err := os.Stat(e.path)
	require.NoError(b, err)
	perDay := float64(24 / hours)
	b.ReportMetric(float64(fi.Size())/1e6, "db-MB")
	b.ReportMetric(float64(seg1-seg0+snap1-snap0)*perDay/1e6, "archived-MB/day")
	b.ReportMetric(float64(seg1-seg0)*perDay/1e6, "segments-MB/day")
	b.ReportMetric(float64(snap1-snap0)*perDay/1e6, "snapshots-MB/day")
	b.ReportMetric(float64(nsnap1-nsnap0)*perDay, "snapshots/day")
	b.ReportMetric(float64(seg1-seg0)/float64(hours*3600), "segment-B/commit")
}

// storeBytesByKind sums the sizes of a directory store's segments and
// snapshots, and counts the snapshots.
func storeBytesByKind(b testing.TB, s *DirStore) (seg, snap int64, snaps int) {
	keys, err := s.List(context.Background(), "")
	require.NoError(b, err)
	for _, k := range keys {
		r, err := s.Get(context.Background(), k)
		require.NoError(b, err)
		fi, err := r.(*os.File).Stat()
		require.NoError(b, err)
		r.Close()
		switch {
		case strings.HasSuffix(k, ".seg"):
			seg += fi.Size()
		case strings.HasSuffix(k, ".snap"):
			snap += fi.Size()
			snaps++
		}
	}
	return seg, snap, snaps
}

// BenchmarkColdOpen: open a closed database, run one point read, close it,
// with and without its capturer (NewCapturer + Attach, which recovers the
// staging log and proves continuity with the WAL; Close seals). The object
// host pays this on every cold query.
//
//	go test -run '^$' -bench BenchmarkColdOpen -benchtime 2000x ./objecthost/history/
func BenchmarkColdOpen(b *testing.B) {
	for _, on := range []bool{false, true} {
		b.Run(fmt.Sprintf("history=%v", on), func(b *testing.B) {
			store, err := NewDirStore(b.TempDir())
			require.NoError(b, err)
			e := newEnv(b, store, CaptureOptions{}, ShipperOptions{})
			_, err = execOn(e.db, "CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)")
			require.NoError(b, err)
			_, err = execOn(e.db, "INSERT INTO t(v) VALUES ('x')")
			require.NoError(b, err)
			e.close()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				var c *Capturer
				if on {
					c, err = NewCapturer(e.key, e.path, e.copts)
					require.NoError(b, err)
				}
				db, err := sqlexec.Open(e.path, sqlexec.Options{ReadConns: 1})
				require.NoError(b, err)
				if on {
					require.NoError(b, c.Attach(context.Background(), db))
				}
				_, err = execOn(db, "SELECT v FROM t WHERE id = 1")
				require.NoError(b, err)
				require.NoError(b, db.Close())
				if on {
					require.NoError(b, c.Close())
				}
			}
		})
	}
}

// BenchmarkStagingWriteback: appending 64 MiB to a file in 230 KiB writes
// (a capture batch under load) and fsyncing it, with the kernel's writeback
// started (startWriteback) after every write, after every MiB, or never.
// Reports the CPU time per MiB (writes and fsync) and how long the final
// fsync took: what the fsync before a WAL restart waits for.
//
//	go test -run '^$' -bench BenchmarkStagingWriteback -benchtime 3x ./objecthost/history/
func BenchmarkStagingWriteback(b *testing.B) {
	const batch, total = 230 << 10, 64 << 20
	data := make([]byte, batch)
	for i := range data {
		data[i] = byte(i * 7)
	}
	for _, every := range []int64{0, batch, 1 << 20} {
		name := map[int64]string{0: "never", batch: "every-write", 1 << 20: "every-MiB"}[every]
		b.Run("writeback="+name, func(b *testing.B) {
			var cpu, fsync time.Duration
			for i := 0; i < b.N; i++ {
				f, err := os.Create(filepath.Join(b.TempDir(), "open.seg"))
				require.NoError(b, err)
				c0 := cpuTime()
				var size, from int64
				for size < total {
					_, err := f.Write(data)
					require.NoError(b, err)
					size += batch
					if every > 0 && size-from >= every {
						startWriteback(f, from, size-from)
						from = size
					}
				}
				t := time.Now()
				require.NoError(b, f.Sync())
				fsync += time.Since(t)
				cpu += cpuTime() - c0
				require.NoError(b, f.Close())
			}
			b.ReportMetric(float64(cpu.Microseconds())/float64(b.N)/64, "cpu-µs/MiB")
			b.ReportMetric(float64(fsync.Microseconds())/float64(b.N)/1000, "final-fsync-ms")
		})
	}
}
