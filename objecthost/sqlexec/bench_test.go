package sqlexec

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Benchmarks compare DB.Execute with plain database/sql (mattn) on the same
// file settings (WAL, synchronous=NORMAL, foreign keys on), 16 goroutines.
// The baseline for reads uses a pool as large as ours (1 writer + 4 readers);
// for inserts a single connection, like our single writer.

const benchRows = 10_000

func benchParallelism() int {
	p := 16 / max(1, runtimeGOMAXPROCS())
	return max(p, 1)
}

func seedBench(b testing.TB, path string) {
	h, err := sql.Open("sqlite3", "file:"+path+"?_journal_mode=WAL&_synchronous=NORMAL")
	require.NoError(b, err)
	defer h.Close()
	_, err = h.Exec("CREATE TABLE kv(id INTEGER PRIMARY KEY, name TEXT, score REAL, tag TEXT); CREATE TABLE ins(id INTEGER PRIMARY KEY, name TEXT, score REAL)")
	require.NoError(b, err)
	var sb strings.Builder
	sb.WriteString("INSERT INTO kv VALUES ")
	for i := 1; i <= benchRows; i++ {
		if i > 1 {
			sb.WriteByte(',')
		}
		fmt.Fprintf(&sb, "(%d, 'name-%d', %d.5, 't%d')", i, i, i, i%10)
	}
	_, err = h.Exec(sb.String())
	require.NoError(b, err)
}

func benchPaths(b testing.TB) string {
	path := filepath.Join(b.TempDir(), "bench.db")
	seedBench(b, path)
	return path
}

func baselineDB(b testing.TB, path string, conns int) *sql.DB {
	h, err := sql.Open("sqlite3", "file:"+path+"?_journal_mode=WAL&_synchronous=NORMAL&_foreign_keys=1&_busy_timeout=5000")
	require.NoError(b, err)
	h.SetMaxOpenConns(conns)
	h.SetMaxIdleConns(conns)
	b.Cleanup(func() { h.Close() })
	return h
}

func BenchmarkPointSelectExecute(b *testing.B) {
	db, err := Open(benchPaths(b), Options{ReadConns: 4})
	require.NoError(b, err)
	defer db.Close()
	b.SetParallelism(benchParallelism())
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		r := rand.New(rand.NewPCG(rand.Uint64(), 1))
		for pb.Next() {
			id := json.RawMessage(strconv.Itoa(1 + r.IntN(benchRows)))
			res, err := db.Execute(context.Background(), Request{Statements: []Statement{{SQL: "SELECT * FROM kv WHERE id = ?", Params: []json.RawMessage{id}}}})
			if err != nil || len(res[0].Results.(Rows)) != 1 {
				b.Fatalf("%v", err)
			}
		}
	})
}

func BenchmarkPointSelectSQL(b *testing.B) {
	h := baselineDB(b, benchPaths(b), 5)
	st, err := h.Prepare("SELECT * FROM kv WHERE id = ?")
	require.NoError(b, err)
	b.SetParallelism(benchParallelism())
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		r := rand.New(rand.NewPCG(rand.Uint64(), 2))
		var id int64
		var name, tag string
		var score float64
		for pb.Next() {
			if err := st.QueryRow(1+r.IntN(benchRows)).Scan(&id, &name, &score, &tag); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkInsertExecute(b *testing.B) {
	db, err := Open(benchPaths(b), Options{ReadConns: 4})
	require.NoError(b, err)
	defer db.Close()
	var n atomic.Int64
	commits0 := db.commits.Load()
	b.SetParallelism(benchParallelism())
	b.ResetTimer()
	defer func() { b.ReportMetric(float64(b.N)/float64(max(1, db.commits.Load()-commits0)), "req/commit") }()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := n.Add(1)
			_, err := db.Execute(context.Background(), Request{Statements: []Statement{{SQL: "INSERT INTO ins(name, score) VALUES (?, ?)",
				Params: []json.RawMessage{json.RawMessage(`"name-` + strconv.FormatInt(i, 10) + `"`), json.RawMessage(`1.5`)}}}})
			if err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkInsertSQL(b *testing.B) {
	h := baselineDB(b, benchPaths(b), 1)
	st, err := h.Prepare("INSERT INTO ins(name, score) VALUES (?, ?)")
	require.NoError(b, err)
	var n atomic.Int64
	b.SetParallelism(benchParallelism())
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := n.Add(1)
			if _, err := st.Exec("name-"+strconv.FormatInt(i, 10), 1.5); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestBenchRatios runs the pairs above in one process, alternating ours and
// the baseline three times so that machine noise hits both, and prints the
// median ops/s of each and their ratio. Opt-in: SHOAL_BENCH=1 (~30 s).
func TestBenchRatios(t *testing.T) {
	if os.Getenv("SHOAL_BENCH") != "1" {
		t.Skip("set SHOAL_BENCH=1 to run")
	}
	pairs := []struct {
		name           string
		ours, baseline func(*testing.B)
	}{
		{"point SELECT by primary key", BenchmarkPointSelectExecute, BenchmarkPointSelectSQL},
		{"single-row INSERT", BenchmarkInsertExecute, BenchmarkInsertSQL},
	}
	median := func(v []float64) float64 { slices.Sort(v); return v[len(v)/2] }
	for _, p := range pairs {
		var ours, base []float64
		var allocsO, allocsB int64
		for round := 0; round < 3; round++ {
			o := testing.Benchmark(p.ours)
			bl := testing.Benchmark(p.baseline)
			ours = append(ours, float64(o.N)/o.T.Seconds())
			base = append(base, float64(bl.N)/bl.T.Seconds())
			allocsO, allocsB = o.AllocsPerOp(), bl.AllocsPerOp()
		}
		mo, mb := median(ours), median(base)
		fmt.Printf("%-28s Execute %7.0f ops/s (%d allocs/op) | database/sql %7.0f ops/s (%d allocs/op) | ratio %.2f | rounds ours %.0f baseline %.0f\n",
			p.name, mo, allocsO, mb, allocsB, mo/mb, ours, base)
	}
}

// BenchmarkColdQuery is the object host's cold path on one database: Open
// an existing file, run its first query (a point SELECT), Close. Files are
// rotated so the OS caches stay as warm as on a host with many files.
//
//	go test ./objecthost/sqlexec/ -run '^$' -bench ColdQuery -cpuprofile cpu.out
func BenchmarkColdQuery(b *testing.B) {
	const files = 64
	dir := b.TempDir()
	paths := make([]string, files)
	for i := range paths {
		paths[i] = filepath.Join(dir, strconv.Itoa(i)+".db")
		db, err := Open(paths[i], Options{ReadConns: 1})
		require.NoError(b, err)
		_, err = db.Execute(context.Background(), Request{Statements: []Statement{{SQL: "CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT); INSERT INTO t VALUES (1, 'x')"}}})
		require.NoError(b, err)
		require.NoError(b, db.Close())
	}
	sel := Request{Statements: []Statement{{SQL: "SELECT v FROM t WHERE id = 1"}}}
	var openNs, queryNs, closeNs int64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := nanotime()
		db, err := Open(paths[i%files], Options{ReadConns: 1})
		if err != nil {
			b.Fatal(err)
		}
		t1 := nanotime()
		if _, err := db.Execute(context.Background(), sel); err != nil {
			b.Fatal(err)
		}
		t2 := nanotime()
		if err := db.Close(); err != nil {
			b.Fatal(err)
		}
		t3 := nanotime()
		openNs += t1 - t0
		queryNs += t2 - t1
		closeNs += t3 - t2
	}
	b.ReportMetric(float64(openNs)/float64(b.N), "open-ns/op")
	b.ReportMetric(float64(queryNs)/float64(b.N), "query-ns/op")
	b.ReportMetric(float64(closeNs)/float64(b.N), "close-ns/op")
}

// processCPU is the process's user + system CPU time so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkSerialCPU runs point reads and inserts one at a time and
// reports the process's CPU time per request (cpu-ns/op) next to wall
// time: on a shared machine CPU time moves less with other processes'
// load than ns/op does, so A/B comparisons of the query path use it.
func BenchmarkSerialCPU(b *testing.B) {
	ctx := context.Background()
	b.Run("PointRead", func(b *testing.B) {
		db, err := Open(benchPaths(b), Options{ReadConns: 4})
		require.NoError(b, err)
		defer db.Close()
		b.ResetTimer()
		c0 := processCPU()
		for i := 0; i < b.N; i++ {
			id := json.RawMessage(strconv.Itoa(1 + i%benchRows))
			res, err := db.Execute(ctx, Request{Statements: []Statement{{SQL: "SELECT * FROM kv WHERE id = ?", Params: []json.RawMessage{id}}}})
			if err != nil || len(res[0].Results.(Rows)) != 1 {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(processCPU()-c0)/float64(b.N), "cpu-ns/op")
	})
	b.Run("Insert", func(b *testing.B) {
		db, err := Open(benchPaths(b), Options{ReadConns: 4})
		require.NoError(b, err)
		defer db.Close()
		b.ResetTimer()
		c0 := processCPU()
		for i := 0; i < b.N; i++ {
			_, err := db.Execute(ctx, Request{Statements: []Statement{{SQL: "INSERT INTO ins(name, score) VALUES (?, ?)",
				Params: []json.RawMessage{json.RawMessage(`"name-` + strconv.Itoa(i) + `"`), json.RawMessage(`1.5`)}}}})
			if err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(processCPU()-c0)/float64(b.N), "cpu-ns/op")
	})
}
