package test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand"
	"net/http"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/d1client"
	"github.com/shoaldb/shoal/edge"
	"github.com/shoaldb/shoal/edge/chinsights"
	"github.com/shoaldb/shoal/internal/binding"
	"github.com/shoaldb/shoal/objecthost"
	"github.com/shoaldb/shoal/pipeline/chlocal"
	"github.com/shoaldb/shoal/pipeline/chsink"
	"github.com/shoaldb/shoal/pipeline/event"
	"github.com/shoaldb/shoal/pipeline/shape"
	"github.com/shoaldb/shoal/raftmeta"
	"github.com/shoaldb/shoal/test/harness"
)

// startClickHouse starts a clickhouse-server of the test's own. Without
// the binary the test is skipped, or fails with SHOAL_REQUIRE_CLICKHOUSE=1
// (CI installs it, so there a skip would hide the test).
func startClickHouse(t *testing.T) *chlocal.Server {
	t.Helper()
	ch, err := chlocal.Start(context.Background(), chlocal.Config{DataDir: t.TempDir()})
	if errors.Is(err, chlocal.ErrNotInstalled) && os.Getenv("SHOAL_REQUIRE_CLICKHOUSE") != "1" {
		t.Skipf("clickhouse-server not installed (scripts/deps.sh installs it): %v", err)
	}
	require.NoError(t, err, "clickhouse-server")
	t.Cleanup(func() { _ = ch.Close() })
	return ch
}

// insightsTruth is one shape's figures computed from the inserted events.
type insightsTruth struct {
	hash                                     uint64
	text                                     string
	queries, errs, read, written, dur, maxUs int64
}

func (s insightsTruth) insight() d1client.QueryInsight {
	totalMs := float64(s.dur) / 1000
	n := float64(s.queries)
	return d1client.QueryInsight{Query: s.text, NumberOfTimesRun: s.queries, NumberOfErrors: s.errs,
		TotalRowsRead: s.read, AvgRowsRead: float64(s.read) / n,
		TotalRowsWritten: s.written, AvgRowsWritten: float64(s.written) / n,
		TotalDurationMs: totalMs, AvgDurationMs: totalMs / n, MaxDurationMs: float64(s.maxUs) / 1000}
}

// topTruth ranks the shapes of (account, database) among events whose
// window starts at or after since, as `wrangler d1 insights` would.
func topTruth(evs []event.Usage, acct, db string, since time.Time, key func(insightsTruth) float64, limit int) []d1client.QueryInsight {
	by := map[uint64]*insightsTruth{}
	seen := map[event.ID]bool{}
	for _, u := range evs {
		if u.AccountID != acct || u.DatabaseUUID != db || u.WindowStart < since.UnixMilli() || seen[u.EventID] {
			continue
		}
		seen[u.EventID] = true // a redelivered event counts once
		s := by[u.ShapeHash]
		if s == nil {
			s = &insightsTruth{hash: u.ShapeHash, text: u.Shape}
			by[u.ShapeHash] = s
		}
		s.queries += u.Queries
		s.errs += u.Errors
		s.read += u.RowsRead
		s.written += u.RowsWritten
		s.dur += u.DurationUs
		s.maxUs = max(s.maxUs, u.MaxDuration)
	}
	all := make([]insightsTruth, 0, len(by))
	for _, s := range by {
		all = append(all, *s)
	}
	sort.Slice(all, func(i, j int) bool {
		if ki, kj := key(all[i]), key(all[j]); ki != kj {
			return ki > kj
		}
		return all[i].hash < all[j].hash
	})
	out := []d1client.QueryInsight{}
	for i := 0; i < len(all) && i < limit; i++ {
		out = append(out, all[i].insight())
	}
	return out
}

// TestInsightsCLIAgainstClickHouse inserts usage events into a real
// ClickHouse through chsink.Store (some twice, merges stopped, so the read
// must deduplicate), serves a real edge over loopback with the
// chinsights source, and checks that `shoal d1 insights` prints exactly
// the figures computed from the events, for every order and window;
// then that another account cannot see them and that a stopped
// ClickHouse is "unavailable", not zeros.
func TestInsightsCLIAgainstClickHouse(t *testing.T) {
	ch := startClickHouse(t)
	bin := shoalBin.Path(t)
	ctx := context.Background()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))

	st, err := chsink.Open(chsink.StoreConfig{Options: ch.Options(), Database: "insights_e2e"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = st.Close() })
	require.NoError(t, st.EnsureSchema(ctx))
	for _, tbl := range chsink.Tables() {
		require.NoError(t, st.Conn().Exec(ctx, "SYSTEM STOP MERGES "+st.Database()+"."+tbl))
	}

	// One catalog node, one object host, one edge with the ClickHouse source.
	cat, err := raftmeta.NewNode(raftmeta.Config{ID: "c0", Dir: t.TempDir(), RaftAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
		Bootstrap: true, Logger: quiet, RaftLogOutput: io.Discard})
	require.NoError(t, err)
	t.Cleanup(func() { _ = cat.Close() })
	require.Eventually(t, cat.IsLeader, 20*time.Second, 20*time.Millisecond)
	keys, err := binding.KeyringFromSecrets("insights-binding-secret-0123456789")
	require.NoError(t, err)
	hcl, err := raftmeta.NewClient([]string{cat.HTTPAddr()})
	require.NoError(t, err)
	hln, haddr := harness.Listen(t)
	host, err := objecthost.Open(objecthost.Config{ID: "h0", Dir: t.TempDir(), Address: haddr, Region: "weur", Capacity: 100,
		Catalog: objecthost.RaftmetaCatalog{C: hcl}, Bindings: keys, Logger: quiet})
	require.NoError(t, err)
	t.Cleanup(func() { _ = host.Close() })
	harness.Serve(t, hln, host.Handler())
	require.Eventually(t, func() bool {
		hs, err := hcl.Hosts(ctx, raftmeta.ReadOptions{Consistency: raftmeta.Stale, NoCache: true})
		return err == nil && len(hs) == 1
	}, 30*time.Second, 50*time.Millisecond, "object host never registered")
	ecl, err := raftmeta.NewClient([]string{cat.HTTPAddr()})
	require.NoError(t, err)
	const admin = "insights-admin-token"
	srv, err := edge.New(edge.Options{Catalog: edge.RaftmetaCatalog{C: ecl}, Dir: t.TempDir(), Region: "weur",
		AdminToken: admin, BindingKeys: keys, Logger: quiet, Insights: chinsights.NewSource(st)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Close() })
	eln, eaddr := harness.Listen(t)
	harness.Serve(t, eln, srv)
	c := &harness.E2ECluster{Admin: admin, EdgeURL: []string{"http://" + eaddr}}
	acctA, bearerA := c.SetupAccount(t, "paid")
	acctB, bearerB := c.SetupAccount(t, "paid")
	createDB := func(acct, bearer, name string) string {
		a := harness.Call(t, "POST", c.EdgeURL[0]+"/client/v4/accounts/"+acct+"/d1/database", bearer, map[string]any{"name": name})
		require.Equal(t, 200, a.Status, "%s", a.Raw)
		var d struct{ UUID string }
		require.NoError(t, json.Unmarshal(a.Result, &d))
		return d.UUID
	}
	dbA, dbA2, dbB := createDB(acctA, bearerA, "shop"), createDB(acctA, bearerA, "other"), createDB(acctB, bearerB, "theirs")

	// Events: nine shapes on dbA spread over the last 40 days (so 1d, 7d
	// and 31d windows differ), one without a stored text; noise on the
	// account's other database; and account B using the same shape hashes
	// with texts of its own, which must never show through A's answers.
	now := time.Now()
	rng := rand.New(rand.NewSource(10))
	sqls := []string{
		"SELECT * FROM orders WHERE id = 1", "SELECT * FROM orders WHERE customer = 'x' ORDER BY created DESC LIMIT 20",
		"INSERT INTO orders (customer, total) VALUES ('a', 10)", "UPDATE orders SET total = 3 WHERE id = 9",
		"SELECT count(*) FROM orders", "DELETE FROM carts WHERE updated < 100",
		"SELECT o.id, c.name FROM orders o JOIN customers c ON c.id = o.customer WHERE o.total > 50",
		"INSERT INTO audit (at, what) VALUES (1, 'login')",
	}
	var evs []event.Usage
	seq := uint64(0)
	add := func(acct, db, text string, hash uint64, ago time.Duration) {
		seq++
		q := int64(1 + rng.Intn(50))
		maxUs := int64(50 + rng.Intn(20_000))
		u := event.Usage{V: 1, EventID: event.ID{Producer: "insights-test", Seq: seq}, Host: "h0", AccountID: acct, DatabaseUUID: db,
			Shape: text, ShapeHash: hash, WindowStart: now.Add(-ago).UnixMilli(), WindowEnd: now.Add(-ago + time.Second).UnixMilli(),
			Queries: q, Errors: int64(rng.Intn(2)), RowsRead: q * int64(rng.Intn(400)), RowsWritten: q * int64(rng.Intn(3)),
			DurationUs: q*int64(10+rng.Intn(900)) + maxUs, MaxDuration: maxUs}
		evs = append(evs, u)
	}
	// Within 1d: 1h to 20h ago, not within 30 minutes of 10h (the 600m
	// window's edge moves by the seconds between here and the request).
	recent := func() time.Duration {
		ago := time.Hour + time.Duration(rng.Int63n(int64(19*time.Hour)))
		if ago > 9*time.Hour+30*time.Minute && ago < 10*time.Hour+30*time.Minute {
			ago += 2 * time.Hour
		}
		return ago
	}
	for i, sql := range sqls {
		text, hash := shape.Of(sql)
		for j := 0; j < 4+i; j++ {
			add(acctA, dbA, text, hash, recent())
		}
		for j := 0; j < 3; j++ {
			add(acctA, dbA, text, hash, 30*time.Hour+time.Duration(rng.Int63n(int64(5*24*time.Hour)))) // 7d, not 1d
		}
		add(acctA, dbA, text, hash, 10*24*time.Hour+time.Duration(rng.Int63n(int64(15*24*time.Hour)))) // 31d, not 7d
		add(acctA, dbA, text, hash, 40*24*time.Hour)                                                   // older than any window
		add(acctA, dbA2, text, hash, time.Hour)
		add(acctB, dbB, "SELECT secret FROM b_only_"+fmt.Sprint(i), hash, time.Hour)
	}
	const textless = uint64(0xfeedface)
	for j := 0; j < 3; j++ {
		add(acctA, dbA, "", textless, 2*time.Hour)
	}
	// B's texts are inserted first, so a read that ignored the account
	// would find them.
	sort.SliceStable(evs, func(i, j int) bool { return evs[i].AccountID == acctB && evs[j].AccountID != acctB })
	require.NoError(t, st.Insert(ctx, evs))
	dups := append([]event.Usage(nil), evs[:len(evs)/3]...)
	require.NoError(t, st.Insert(ctx, dups), "a redelivery: stored twice, counted once")
	evs = append(evs, dups...)
	cnt, err := st.Counts(ctx, "query_insights")
	require.NoError(t, err)
	require.Equal(t, uint64(len(dups)), cnt.PendingDuplicates(), "the duplicates are stored, unmerged")

	clean := []string{"SHOAL_API_URL=", "SHOAL_API_TOKEN=", "SHOAL_ACCOUNT_ID="}
	d1 := func(acct, bearer string, args ...string) cliResult {
		t.Helper()
		return runCLI(t, bin, clean, "", append([]string{"d1", "--dev-dir", t.TempDir(), "--api-url", c.EdgeURL[0],
			"--token", strings.TrimPrefix(bearer, "Bearer "), "--account-id", acct}, args...)...)
	}
	jsonInsights := func(r cliResult) []d1client.QueryInsight {
		t.Helper()
		require.Equal(t, 0, r.code, "stdout: %s\nstderr: %s", r.stdout, r.stderr)
		require.Empty(t, r.stderr)
		var out []d1client.QueryInsight
		require.NoError(t, json.Unmarshal([]byte(r.stdout), &out), "%s", r.stdout)
		require.NotNil(t, out, "an empty answer is [], not null")
		return out
	}
	keys4 := map[string]func(insightsTruth) float64{
		"time/sum":   func(s insightsTruth) float64 { return float64(s.dur) },
		"time/avg":   func(s insightsTruth) float64 { return float64(s.dur) / float64(s.queries) },
		"reads/sum":  func(s insightsTruth) float64 { return float64(s.read) },
		"reads/avg":  func(s insightsTruth) float64 { return float64(s.read) / float64(s.queries) },
		"writes/sum": func(s insightsTruth) float64 { return float64(s.written) },
		"writes/avg": func(s insightsTruth) float64 { return float64(s.written) / float64(s.queries) },
		"count/sum":  func(s insightsTruth) float64 { return float64(s.queries) },
		"count/avg":  func(s insightsTruth) float64 { return float64(s.queries) },
	}

	// Defaults (1d, time, sum, limit 5), by name and by UUID.
	want := topTruth(evs, acctA, dbA, now.Add(-24*time.Hour), keys4["time/sum"], 5)
	require.Len(t, want, 5)
	assert.Equal(t, want, jsonInsights(d1(acctA, bearerA, "insights", "shop", "--json")))
	assert.Equal(t, want, jsonInsights(d1(acctA, bearerA, "insights", dbA, "--json")))

	// Every order over every window, all shapes.
	for _, period := range []struct {
		flag string
		d    time.Duration
	}{{"1d", 24 * time.Hour}, {"7d", 7 * 24 * time.Hour}, {"31d", 31 * 24 * time.Hour}, {"600m", 600 * time.Minute}} {
		for k, key := range keys4 {
			by, typ, _ := strings.Cut(k, "/")
			want := topTruth(evs, acctA, dbA, now.Add(-period.d), key, 100)
			got := jsonInsights(d1(acctA, bearerA, "insights", "shop", "--json", "--time-period", period.flag,
				"--sort-by", by, "--sort-type", typ, "--limit", "100"))
			assert.Equal(t, want, got, "%s %s", period.flag, k)
		}
	}
	// wrangler's spelling of the period flag.
	assert.Equal(t, topTruth(evs, acctA, dbA, now.Add(-7*24*time.Hour), keys4["reads/sum"], 3),
		jsonInsights(d1(acctA, bearerA, "insights", "shop", "--json", "--timePeriod", "7d", "--sort-by", "reads", "--limit", "3")))

	// The table shows the same figures.
	want = topTruth(evs, acctA, dbA, now.Add(-31*24*time.Hour), keys4["count/sum"], 100)
	require.Len(t, want, len(sqls)+1)
	r := d1(acctA, bearerA, "insights", "shop", "--time-period", "31d", "--sort-by", "count", "--limit", "100")
	require.Equal(t, 0, r.code, "%s", r.stderr)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	require.Equal(t, fmt.Sprintf("Top %d query shapes of shop in the last 31d, by count:", len(want)), lines[0])
	var cells [][]string
	for _, l := range lines[1:] {
		if !strings.HasPrefix(l, "│") {
			continue // borders
		}
		var row []string
		for _, f := range strings.Split(strings.Trim(l, "│"), "│") {
			row = append(row, strings.TrimSpace(f))
		}
		cells = append(cells, row)
	}
	require.Len(t, cells, len(want)+1, "%s", r.stdout)
	assert.Equal(t, []string{"QUERY", "COUNT", "TOTAL MS", "AVG MS", "MAX MS", "ROWS READ", "AVG ROWS READ",
		"ROWS WRITTEN", "AVG ROWS WRITTEN", "ERRORS"}, cells[0])
	for i, w := range want {
		q := w.Query
		if q == "" {
			q = "(statement text not recorded)"
		}
		assert.Equal(t, []string{q, fmt.Sprint(w.NumberOfTimesRun), fmt.Sprintf("%.3f", w.TotalDurationMs),
			fmt.Sprintf("%.3f", w.AvgDurationMs), fmt.Sprintf("%.3f", w.MaxDurationMs), fmt.Sprint(w.TotalRowsRead),
			fmt.Sprintf("%.2f", w.AvgRowsRead), fmt.Sprint(w.TotalRowsWritten), fmt.Sprintf("%.2f", w.AvgRowsWritten),
			fmt.Sprint(w.NumberOfErrors)}, cells[i+1], "row %d", i)
	}
	assert.NotContains(t, r.stdout, "b_only", "another account's statement texts never show")

	// The other database and account B see only their own usage.
	assert.Equal(t, topTruth(evs, acctA, dbA2, now.Add(-24*time.Hour), keys4["time/sum"], 100),
		jsonInsights(d1(acctA, bearerA, "insights", "other", "--json", "--limit", "100")))
	gotB := jsonInsights(d1(acctB, bearerB, "insights", "theirs", "--json", "--limit", "100"))
	assert.Equal(t, topTruth(evs, acctB, dbB, now.Add(-24*time.Hour), keys4["time/sum"], 100), gotB)
	for _, g := range gotB {
		assert.Contains(t, g.Query, "b_only", "B's texts are B's, whatever the hash")
	}
	r = d1(acctA, bearerA, "insights", "shop", "--json", "--time-period", "10m")
	assert.Equal(t, "[]\n", r.stdout, "no usage in the window: an empty list")
	r = d1(acctA, bearerA, "insights", "shop", "--time-period", "10m")
	assert.Equal(t, 0, r.code)
	assert.Equal(t, "No queries on shop in the last 10m.\n", r.stdout)

	// Scoping: B's token on A's account, and A's database through B's own.
	r = d1(acctA, bearerB, "insights", dbA, "--json")
	assert.Equal(t, 4, r.code, "%s", r.stderr)
	assert.Contains(t, r.stderr, "[7403]")
	r = d1(acctB, bearerB, "insights", dbA, "--json")
	assert.Equal(t, 3, r.code, "%s", r.stderr)
	assert.Contains(t, r.stderr, "[7404]")
	assert.Empty(t, r.stdout)

	// Bad options: the edge's 400, exit 1, nothing on stdout.
	for _, args := range [][]string{{"--time-period", "32d"}, {"--sort-by", "rows"}, {"--sort-type", "max"}, {"--limit", "1001"}} {
		r = d1(acctA, bearerA, append([]string{"insights", "shop"}, args...)...)
		assert.Equal(t, 1, r.code, "%v: %s", args, r.stderr)
		assert.Contains(t, r.stderr, "[7400]", "%v", args)
		assert.Empty(t, r.stdout)
	}
	for _, lim := range []string{"many", "0", "-1"} {
		r = d1(acctA, bearerA, "insights", "shop", "--limit", lim)
		assert.Equal(t, 2, r.code, "--limit %s: %s", lim, r.stderr)
		assert.Empty(t, r.stdout)
	}

	// ClickHouse stopped: 503 with Retry-After and an analytics message;
	// the CLI exits 5 and prints no figures.
	require.NoError(t, ch.Close())
	req, err := http.NewRequest("GET", c.EdgeURL[0]+"/client/v4/accounts/"+acctA+"/d1/database/"+dbA+"/insights", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", bearerA)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, 503, resp.StatusCode, "%s", body)
	assert.NotEmpty(t, resp.Header.Get("Retry-After"))
	assert.Contains(t, string(body), `"code":7503`)
	assert.Contains(t, string(body), `"result":null`)
	r = d1(acctA, bearerA, "insights", "shop", "--json")
	assert.Equal(t, 5, r.code, "%s", r.stderr)
	assert.Contains(t, r.stderr, "analytics store could not be reached")
	assert.Empty(t, r.stdout)
	r = d1(acctA, bearerA, "insights", "shop")
	assert.Equal(t, 5, r.code)
	assert.Empty(t, r.stdout, "never a table of zeros")
}
