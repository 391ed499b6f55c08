package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/internal/ids"
	"github.com/shoaldb/shoal/objecthost"
	"github.com/shoaldb/shoal/pipeline/chsink"
	"github.com/shoaldb/shoal/pipeline/event"
	"github.com/shoaldb/shoal/raftmeta"
	"github.com/shoaldb/shoal/raftmeta/fsm"
	"github.com/shoaldb/shoal/test/harness"
)

// Figures of issue 11 (docs/benchmarks.md, "Limits"); SHOAL_BENCH=1 runs
// them. They measure, they do not assert timings.

func limitsBenchOnly(t *testing.T) {
	if os.Getenv("SHOAL_BENCH") != "1" {
		t.Skip("figure: set SHOAL_BENCH=1")
	}
}

// TestFigureLimiterQueryCost: the limiter's one ClickHouse query per pass
// (chsink.Store.AccountsOver) with 100,000 active accounts and a day of
// pre-aggregated usage rows (SHOAL_BENCH_LIMITER_ROWS, default 3,000,000,
// spread over today's hours so far; 1% of the accounts over the free
// tier's 100,000 rows written). Best and median of 7 runs, as inserted
// (parts not yet merged: what a pass sees during the day) and after
// OPTIMIZE FINAL.
func TestFigureLimiterQueryCost(t *testing.T) {
	limitsBenchOnly(t)
	accounts := benchEnvInt(t, "SHOAL_BENCH_LIMITER_ACCOUNTS", 100_000)
	rows := benchEnvInt(t, "SHOAL_BENCH_LIMITER_ROWS", 3_000_000)
	ch := harness.StartClickHouse(t, filepath.Join(t.TempDir(), "clickhouse"), 0, 0)
	t.Cleanup(func() { _ = ch.Close() })
	st, err := chsink.Open(chsink.StoreConfig{Options: ch.Options(), Database: "limbench", Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = st.Close() })
	ctx := context.Background()
	require.NoError(t, st.EnsureSchema(ctx))

	now := time.Now().UTC()
	dayStart := time.Date(now.Year(), now.Month(), now.Day(), 0, 0, 0, 0, time.UTC).UnixMilli()
	span := max(now.UnixMilli()-dayStart-2000, 1000)
	const batch = 100_000
	ins0 := time.Now()
	buf := make([]event.Usage, 0, batch)
	for i := range rows {
		acct := i % accounts
		written := int64(5)
		if acct%100 == 0 { // 1%: over 100,000 written
			written = int64(200_000/(rows/accounts)) + 1
		}
		ws := dayStart + int64(i)*span/int64(rows)
		buf = append(buf, event.Usage{V: event.Version, EventID: event.ID{Producer: "bench-h" + strconv.Itoa(acct%8), Seq: uint64(i + 1)},
			Host: "h" + strconv.Itoa(acct%8), AccountID: fmt.Sprintf("%032x", acct), DatabaseUUID: fmt.Sprintf("00000000-0000-4000-8000-%012x", acct*3+i%3),
			ShapeHash: uint64(i % 7), Shape: "SELECT * FROM t WHERE id = ?",
			WindowStart: ws, WindowEnd: ws + 1000, Queries: 10, RowsRead: 40, RowsWritten: written, DurationUs: 900, MaxDuration: 200})
		if len(buf) == batch || i == rows-1 {
			require.NoError(t, st.Insert(ctx, buf))
			buf = buf[:0]
		}
	}
	t.Logf("FIGURE inserted %d usage rows for %d accounts in %s", rows, accounts, time.Since(ins0).Round(time.Millisecond))

	run := func(when string) {
		var ds []time.Duration
		var n int
		for range 7 {
			s := time.Now()
			over, err := st.AccountsOver(ctx, now, limiterFreeRead, limiterFreeWritten)
			ds = append(ds, time.Since(s))
			require.NoError(t, err)
			n = len(over)
		}
		var parts uint64
		require.NoError(t, st.Conn().QueryRow(ctx, `SELECT count() FROM system.parts WHERE database = 'limbench' AND table = 'requests' AND active`).Scan(&parts))
		slices.Sort(ds)
		t.Logf("FIGURE AccountsOver %s (%d accounts, %d rows, %d active parts): best %s median %s worst %s; %d accounts over",
			when, accounts, rows, parts, ds[0].Round(time.Millisecond), ds[len(ds)/2].Round(time.Millisecond), ds[len(ds)-1].Round(time.Millisecond), n)
		require.Equal(t, (accounts+99)/100, n, "the 1% over the limit")
	}
	run("as inserted")
	require.NoError(t, st.Conn().Exec(ctx, "OPTIMIZE TABLE limbench.requests FINAL"))
	run("after OPTIMIZE FINAL")
}

const (
	limiterFreeRead    = 5_000_000
	limiterFreeWritten = 100_000
)

// TestFigureHeartbeatCatalogReads: catalog reads per second caused by the
// heartbeats of one object host holding 100,000 databases of one account
// (SHOAL_BENCH_HB_DATABASES), with the default heartbeat interval (30 s),
// tick (1 s) and chunk (5,000), against a real raftmeta node over HTTP
// (in this process). Counted on the node's shoal_raftmeta_reads_total over
// 30 s of steady state, after one interval in which the first beats
// confirm every database.
func TestFigureHeartbeatCatalogReads(t *testing.T) {
	limitsBenchOnly(t)
	n := benchEnvInt(t, "SHOAL_BENCH_HB_DATABASES", 100_000)
	quiet := slog.New(slog.DiscardHandler)
	node, err := raftmeta.NewNode(raftmeta.Config{ID: "hb0", Dir: t.TempDir(), RaftAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
		Bootstrap: true, Logger: quiet, RaftLogOutput: io.Discard})
	require.NoError(t, err)
	t.Cleanup(func() { _ = node.Close() })
	require.Eventually(t, node.IsLeader, 20*time.Second, 20*time.Millisecond)
	cl, err := raftmeta.NewClient([]string{node.HTTPAddr()})
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	ctx := context.Background()
	const acct = "0123456789abcdef0123456789abcdef"
	_, err = cl.CreateAccount(ctx, fsm.CreateAccount{ID: acct, Name: "many", Tier: fsm.TierPaid,
		Limits: fsm.Limits{MaxDatabases: int64(2 * n), MaxStorageBytes: 1 << 40, MaxDatabaseBytes: 10 << 30}})
	require.NoError(t, err)

	h, err := objecthost.Open(objecthost.Config{ID: "hb-host", Dir: t.TempDir(), Address: "127.0.0.1:1", Region: "weur",
		Capacity: int64(2 * n), Catalog: objecthost.RaftmetaCatalog{C: cl}, Logger: quiet})
	require.NoError(t, err)
	t.Cleanup(func() { _ = h.Close() })
	require.Eventually(t, func() bool {
		hs, err := cl.Hosts(ctx, raftmeta.LeaderRead())
		return err == nil && len(hs) == 1
	}, 30*time.Second, 50*time.Millisecond, "host registered")

	// The account's databases: catalog record first, then the host's init
	// (what the edge does), from 64 goroutines.
	create0 := time.Now()
	var next atomic.Int64
	var wg sync.WaitGroup
	var firstErr error
	var errOnce sync.Once
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				uuid, obj := ids.New(), fmt.Sprintf("%032x", i+1)
				d, err := cl.CreateDatabase(ctx, fsm.CreateDatabase{UUID: uuid, AccountID: acct, Name: "db-" + strconv.Itoa(i),
					ObjectID: obj, HostID: "hb-host", Region: "weur", ReadReplication: "disabled"})
				if err == nil {
					_, err = h.Init(ctx, obj, objecthost.InitRequest{DatabaseUUID: uuid, AccountID: acct, Name: d.Name,
						Region: "weur", RoutingGeneration: d.RoutingGeneration})
				}
				if err != nil {
					errOnce.Do(func() { firstErr = fmt.Errorf("database %d: %w", i, err) })
					return
				}
			}
		}()
	}
	wg.Wait()
	require.NoError(t, firstErr)
	t.Logf("FIGURE setup: %d databases (catalog create + host init) in %s", n, time.Since(create0).Round(time.Millisecond))

	addr := []string{node.HTTPAddr()}
	sample := func(d time.Duration) float64 {
		r0, err := harness.RaftmetaReads(addr)
		require.NoError(t, err)
		time.Sleep(d) // the sampled window
		r1, err := harness.RaftmetaReads(addr)
		require.NoError(t, err)
		return float64(r1-r0) / d.Seconds()
	}
	warm := sample(35 * time.Second)
	t.Logf("FIGURE first interval (first beats, confirms): %.1f catalog reads/s", warm)
	steady := sample(30 * time.Second)
	t.Logf("FIGURE steady state, %d databases of one account on one host, default interval 30 s / tick 1 s / chunk 5,000: %.2f catalog reads/s (%.0f heartbeats/s ÷ 5,000 per call)",
		n, steady, float64(n)/30)
}
