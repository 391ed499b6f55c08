package chsink

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/shoaldb/shoal/pipeline/event"
)

// TestFigureSinkThroughput measures, on this machine, usage events per
// second from Kafka into ClickHouse (pre-aggregated input shaped like the
// aggregator's output) and bytes per row on disk. It is a figure, not a
// check (no timing asserts; totals are still checked exactly):
//
//	SHOAL_BENCH=1 go test -count=1 -run TestFigureSinkThroughput -v ./pipeline/chsink
//
// SHOAL_BENCH_EVENTS sets the event count (default 1,000,000). Two runs:
// "backlog" drains a topic filled beforehand (the sink's own rate, e.g.
// catching up after an outage); "live" produces while the sink consumes
// (end to end: producer → broker → sink → ClickHouse, all on this
// machine's cores).
func TestFigureSinkThroughput(t *testing.T) {
	if os.Getenv("SHOAL_BENCH") != "1" {
		t.Skip("figure: set SHOAL_BENCH=1")
	}
	n := 1_000_000
	if v := os.Getenv("SHOAL_BENCH_EVENTS"); v != "" {
		var err error
		n, err = strconv.Atoi(v)
		require.NoError(t, err)
	}
	batch := 0 // the default
	if v := os.Getenv("SHOAL_BENCH_BATCH"); v != "" {
		var err error
		batch, err = strconv.Atoi(v)
		require.NoError(t, err)
	}
	ch := requireCH(t)
	for _, mode := range []string{"backlog", "live"} {
		t.Run(mode, func(t *testing.T) {
			st := openStore(t, ch)
			br := startBroker(t, 0, "")
			defer br.Close()
			addr := br.ListenAddrs()[0]
			ctx := context.Background()

			var want figureTotals
			var sink *Sink
			start := func() {
				var err error
				sink, err = Start(Config{Brokers: []string{addr}, Group: "figure", Store: st, MaxBatch: batch})
				require.NoError(t, err)
			}
			var t0 time.Time
			var cpu0 cpuTimes
			if mode == "live" {
				cpu0 = readCPU(t, ch.Pid())
				start()
				t0 = time.Now()
				want = produceFigure(t, addr, n)
			} else {
				p0 := time.Now()
				want = produceFigure(t, addr, n)
				t.Logf("FIGURE produce-only: %d events in %s = %.0f events/s", n, time.Since(p0).Round(time.Millisecond), float64(n)/time.Since(p0).Seconds())
				cpu0 = readCPU(t, ch.Pid())
				if f := os.Getenv("SHOAL_BENCH_CPUPROFILE"); f != "" {
					out, err := os.Create(f)
					require.NoError(t, err)
					require.NoError(t, pprof.StartCPUProfile(out))
					defer func() { pprof.StopCPUProfile(); _ = out.Close() }()
				}
				t0 = time.Now()
				start()
			}
			defer sink.Close()
			for {
				s := sink.Stats()
				if s.Inserted >= uint64(n) && s.Lag == 0 && s.OldestPendingMs == 0 {
					break
				}
				require.Less(t, time.Since(t0), 10*time.Minute, "sink stalled: %+v", s)
				time.Sleep(20 * time.Millisecond) // poll interval of the figure's drain loop (a measurement, not a check)
			}
			el := time.Since(t0)
			cpu := readCPU(t, ch.Pid()).sub(cpu0)
			stt := sink.Stats()
			t.Logf("FIGURE %s: %d events into ClickHouse in %s = %.0f events/s (%d batches, %d insert errors)",
				mode, n, el.Round(time.Millisecond), float64(n)/el.Seconds(), stt.Batches, stt.InsertErrors)
			t.Logf("FIGURE %s CPU: clickhouse-server %.2f s, this Go process (sink + kfake%s) %.2f s, on %d cores; %.0f events per server CPU-second",
				mode, cpu.server.Seconds(), map[bool]string{true: " + producer", false: ""}[mode == "live"], cpu.self.Seconds(), runtime.NumCPU(),
				float64(n)/cpu.server.Seconds())

			var got figureTotals
			require.NoError(t, st.Conn().QueryRow(ctx, "SELECT count(), sum(queries), sum(rows_read), sum(rows_written) FROM "+st.Database()+".requests FINAL").
				Scan(&got.events, &got.queries, &got.read, &got.written))
			assert.Equal(t, want, got, "totals exact")

			for _, when := range []string{"as inserted", "after OPTIMIZE FINAL"} {
				if when != "as inserted" {
					for _, tbl := range Tables() {
						require.NoError(t, st.Conn().Exec(ctx, "OPTIMIZE TABLE "+st.Database()+"."+tbl+" FINAL"))
					}
				}
				for _, tbl := range Tables() {
					var rows, bytes, parts uint64
					require.NoError(t, st.Conn().QueryRow(ctx, `SELECT sum(rows), sum(bytes_on_disk), count() FROM system.parts
WHERE database = ? AND table = ? AND active`, st.Database(), tbl).Scan(&rows, &bytes, &parts))
					t.Logf("FIGURE bytes/row %s %s: %.1f (%d rows, %d bytes, %d parts)", tbl, when, float64(bytes)/float64(rows), rows, bytes, parts)
				}
			}
		})
	}
}

type cpuTimes struct{ server, self time.Duration }

func (c cpuTimes) sub(o cpuTimes) cpuTimes { return cpuTimes{c.server - o.server, c.self - o.self} }

// readCPU reads the user+system CPU time of the server process (from
// /proc, in clock ticks of 10 ms) and of this process.
func readCPU(t *testing.T, pid int) cpuTimes {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	require.NoError(t, err)
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	var ru syscall.Rusage
	require.NoError(t, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return cpuTimes{
		server: time.Duration(ut+st) * 10 * time.Millisecond,
		self:   time.Duration(ru.Utime.Nano() + ru.Stime.Nano()),
	}
}

type figureTotals struct {
	events                 uint64
	queries, read, written int64
}

// produceFigure produces n events shaped like the aggregator's output:
// 1 s windows, 4 hosts, each window carrying the active (account,
// database, shape) keys of that host; 20,000 accounts with 3 databases
// and up to 8 shapes each.
func produceFigure(t *testing.T, addr string, n int) figureTotals {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.DefaultProduceTopic(event.TopicUsage),
		kgo.ProducerLinger(5*time.Millisecond), kgo.MaxBufferedRecords(100_000))
	require.NoError(t, err)
	defer cl.Close()
	shapes := make([]string, 8)
	for i := range shapes {
		shapes[i] = fmt.Sprintf("SELECT id, name, email FROM users_%d WHERE id = ? AND tenant = ?", i)
	}
	const perWindow = 20_000 // events per host per window
	base := time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC).UnixMilli()
	var tot figureTotals
	errs := make(chan error, 1)
	for i := 0; i < n; i++ {
		host := i % 4
		w := int64(i / (4 * perWindow))
		k := (i / 4) % perWindow
		acct := (k*7919 + int(w)*31) % 20_000
		shape := k % 8
		q := int64(1 + k%17)
		u := event.Usage{
			V:            event.Version,
			EventID:      event.ID{Producer: "host-" + strconv.Itoa(host) + "/1764576000", Seq: uint64(i/4 + 1)},
			Host:         "host-" + strconv.Itoa(host),
			AccountID:    "acct-" + strconv.Itoa(acct),
			DatabaseUUID: "0193a7c2-5b1e-7c4d-9e2f-" + fmt.Sprintf("%012d", acct*3+k%3),
			Shape:        shapes[shape],
			ShapeHash:    uint64(0x9e3779b97f4a7c15) * uint64(shape+1),
			WindowStart:  base + w*1000,
			WindowEnd:    base + w*1000 + 1000,
			Queries:      q,
			Errors:       int64(k % 50 / 49),
			RowsRead:     q * int64(1+k%100),
			RowsWritten:  q * int64(k%3),
			DurationUs:   q * int64(50+k%400),
			MaxDuration:  int64(80 + k%900),
		}
		tot.events++
		tot.queries += u.Queries
		tot.read += u.RowsRead
		tot.written += u.RowsWritten
		b, err := event.Encode(u)
		require.NoError(t, err)
		cl.Produce(context.Background(), &kgo.Record{Key: []byte(u.AccountID), Value: b}, func(_ *kgo.Record, err error) {
			if err != nil {
				select {
				case errs <- err:
				default:
				}
			}
		})
	}
	require.NoError(t, cl.Flush(context.Background()))
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
	return tot
}

// TestFigureFinalCost measures what reading with FINAL costs against the
// alternatives, on one day of 2,000,000 requests rows of 20,000 accounts
// with 10% of the events inserted twice (pipeline/DESIGN.md, "ClickHouse
// sink"):
//
//	SHOAL_BENCH=1 go test -count=1 -run TestFigureFinalCost -v ./pipeline/chsink
func TestFigureFinalCost(t *testing.T) {
	if os.Getenv("SHOAL_BENCH") != "1" {
		t.Skip("figure: set SHOAL_BENCH=1")
	}
	ch := requireCH(t)
	st := openStore(t, ch)
	ctx := context.Background()
	const n, batch = 2_000_000, 100_000
	base := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	evs := make([]event.Usage, batch)
	for off := 0; off < n; off += batch {
		for i := range evs {
			k := off + i
			evs[i] = event.Usage{V: 1, EventID: event.ID{Producer: "host-" + strconv.Itoa(k%4) + "/1", Seq: uint64(k)},
				Host: "host-" + strconv.Itoa(k%4), AccountID: "acct-" + strconv.Itoa(k%20_000),
				DatabaseUUID: "db-" + strconv.Itoa(k%60_000), ShapeHash: uint64(k % 8),
				WindowStart: base.UnixMilli() + int64(k/50), WindowEnd: base.UnixMilli() + int64(k/50) + 1000,
				Queries: 3, RowsRead: int64(k % 1000), RowsWritten: int64(k % 7)}
		}
		require.NoError(t, st.Insert(ctx, evs))
		if off%(10*batch) == 0 { // 10% of the events twice, as a redelivery would
			require.NoError(t, st.Insert(ctx, evs))
		}
	}
	c, err := st.Counts(ctx, "requests")
	require.NoError(t, err)
	t.Logf("FIGURE final-cost: %d rows stored, %d distinct (merges pending for %d)", c.Rows, c.Distinct, c.PendingDuplicates())
	db := st.Database()
	timeIt := func(name, q string, args ...any) {
		const runs = 5
		var best time.Duration
		for r := 0; r < runs; r++ {
			t0 := time.Now()
			rows, err := st.Conn().Query(ctx, q, args...)
			require.NoError(t, err)
			for rows.Next() {
			}
			require.NoError(t, rows.Err())
			rows.Close()
			if d := time.Since(t0); r == 0 || d < best {
				best = d
			}
		}
		t.Logf("FIGURE final-cost %-40s best of %d: %s", name, runs, best.Round(100*time.Microsecond))
	}
	day := "2026-12-01"
	acct := "WHERE day = toDate(?) AND account_id = ?"
	timeIt("one account-day, no dedupe (wrong)", "SELECT sum(rows_read), sum(rows_written) FROM "+db+".requests "+acct, day, "acct-42")
	timeIt("one account-day, FINAL", "SELECT sum(rows_read), sum(rows_written) FROM "+db+".requests FINAL "+acct, day, "acct-42")
	timeIt("one account-day, GROUP BY event", "SELECT sum(r), sum(w) FROM (SELECT any(rows_read) r, any(rows_written) w FROM "+db+
		".requests "+acct+" GROUP BY database_uuid, event_producer, event_seq)", day, "acct-42")
	having := " GROUP BY account_id HAVING r > ? OR w > ?"
	timeIt("all accounts HAVING, no dedupe (wrong)", "SELECT account_id, sum(rows_read) r, sum(rows_written) w FROM "+db+
		".requests WHERE day = toDate(?)"+having, day, 300_000, 1_000)
	timeIt("all accounts HAVING, FINAL", "SELECT account_id, sum(rows_read) r, sum(rows_written) w FROM "+db+
		".requests FINAL WHERE day = toDate(?)"+having, day, 300_000, 1_000)
	timeIt("all accounts HAVING, GROUP BY event", "SELECT account_id, sum(rr) r, sum(ww) w FROM (SELECT account_id, any(rows_read) rr, any(rows_written) ww FROM "+db+
		".requests WHERE day = toDate(?) GROUP BY account_id, event_producer, event_seq)"+having, day, 300_000, 1_000)

	// Insights: TopShapes of one database over its day, read from requests
	// (sorted by day, account, database) against the former per-event
	// query_insights layout (sorted by account, database, day, shape),
	// rebuilt here from the same rows.
	since := base
	for r := 0; r < 3; r++ {
		t0 := time.Now()
		top, err := st.TopShapes(ctx, "acct-42", "db-42", since, ByDuration, 20)
		require.NoError(t, err)
		require.NotEmpty(t, top)
		t.Logf("FIGURE final-cost %-40s run %d: %s", "TopShapes one database-day (requests)", r, time.Since(t0).Round(100*time.Microsecond))
	}
	require.NoError(t, st.Conn().Exec(ctx, "CREATE TABLE "+db+".insights_layout ENGINE = ReplacingMergeTree() PARTITION BY toYYYYMM(day) "+
		"ORDER BY (account_id, database_uuid, day, shape_hash, event_producer, event_seq) AS SELECT * FROM "+db+".requests WHERE shape_hash != 0"))
	shapesQuery := func(tbl string) string {
		return "SELECT shape_hash, sum(ed) AS d FROM (SELECT shape_hash, any(duration_us) AS ed FROM " + db + "." + tbl +
			" WHERE day >= toDate(?) AND account_id = ? AND database_uuid = ? AND window_start_ms >= ? AND shape_hash != 0" +
			" GROUP BY day, shape_hash, event_producer, event_seq) GROUP BY shape_hash ORDER BY d DESC, shape_hash LIMIT 20"
	}
	timeIt("shapes of one database-day, requests", shapesQuery("requests"), day, "acct-42", "db-42", since.UnixMilli())
	timeIt("shapes of one database-day, old layout", shapesQuery("insights_layout"), day, "acct-42", "db-42", since.UnixMilli())
}
