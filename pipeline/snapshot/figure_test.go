package snapshot

import (
	"context"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/raftmeta"
	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// The figures of pipeline/DESIGN.md ("Storage snapshotter"). They take
// minutes, so they run only with SHOAL_BENCH=1:
//
//	SHOAL_BENCH=1 go test -count=1 -run TestFigure -v -timeout 30m ./pipeline/snapshot

func requireBench(t *testing.T) {
	if os.Getenv("SHOAL_BENCH") == "" {
		t.Skip("figure: set SHOAL_BENCH=1")
	}
}

// One pass over 100,000 databases in 1,000 accounts: the catalog page
// latency seen by the snapshotter and rows/s into storage_snapshots.
func TestFigurePass(t *testing.T) {
	requireBench(t)
	ch := requireCH(t)
	h := openHistory(t, ch)
	ctx := context.Background()
	cat := startCatalog(t)
	t0 := time.Now()
	uuids := cat.populate(t, 1_000, 100_000)
	cat.setSizes(t, uuids, 1, sizeA)
	t.Logf("catalog populated in %s", time.Since(t0))

	// Page latency: the client's view (HTTP, JSON, one node), stale reads.
	var dbPages, acctPages []time.Duration
	for round := 0; round < 3; round++ {
		after := ""
		for {
			t1 := time.Now()
			p, err := cat.client.DatabaseStoragePage(ctx, after, fsm.MaxStoragePage, raftmeta.StaleRead())
			require.NoError(t, err)
			dbPages = append(dbPages, time.Since(t1))
			if after = p.Next; after == "" {
				break
			}
		}
		t1 := time.Now()
		p, err := cat.client.AccountStoragePage(ctx, "", fsm.MaxStoragePage, raftmeta.StaleRead())
		require.NoError(t, err)
		require.Len(t, p.Accounts, 1_001)
		acctPages = append(acctPages, time.Since(t1))
	}
	t.Logf("catalog database page (10,000 rows): %s", spread(dbPages))
	t.Logf("catalog account page (1,001 rows): %s", spread(acctPages))

	s := newSnapshotter(t, cat, h, nil)
	base := s.bucket(time.Now())
	var passes []Pass
	for i := 0; i < 3; i++ {
		p, err := s.pass(ctx, base.Add(-time.Duration(i)*time.Hour))
		require.NoError(t, err)
		passes = append(passes, p)
		rows := float64(p.Databases + p.Accounts + 1)
		t.Logf("pass %d: %d rows in %s (catalog read %s, %.0f rows/s; inserts %s, %.0f rows/s; overall %.0f rows/s)",
			i, int(rows), p.Duration.Round(time.Millisecond), p.Read.Round(time.Millisecond), rows/p.Read.Seconds(),
			(p.Duration - p.Read).Round(time.Millisecond), rows/(p.Duration-p.Read).Seconds(), rows/p.Duration.Seconds())
	}
	requireMatches(t, h, cat.truth(t), base)
	perRow := func() float64 {
		var bytes uint64
		require.NoError(t, h.conn.QueryRow(ctx, `SELECT sum(bytes_on_disk) FROM system.parts WHERE active AND database = ? AND table = ?`,
			h.Database(), Table).Scan(&bytes))
		return float64(bytes) / float64(len(passes)*(passes[0].Databases+passes[0].Accounts+1))
	}
	asInserted := perRow()
	tbl := h.Database() + "." + Table
	require.NoError(t, h.conn.Exec(ctx, "SYSTEM START MERGES "+tbl))
	require.NoError(t, h.conn.Exec(ctx, "OPTIMIZE TABLE "+tbl+" FINAL"))
	t.Logf("on disk: %.1f bytes per row as inserted, %.1f merged (%d passes)", asInserted, perRow(), len(passes))
}

// The dedupe forms on a week of hourly snapshots (168 buckets of 100,000
// databases in 10,000 accounts, 18.5 M rows), merged, plus 8 buckets
// stored twice and not merged: GROUP BY the key (what History does)
// against FINAL, and no dedupe (wrong) for scale.
func TestFigureDedupeCost(t *testing.T) {
	requireBench(t)
	ch := requireCH(t)
	h := openHistory(t, ch)
	ctx := context.Background()
	tbl := h.Database() + "." + Table
	require.NoError(t, h.conn.Exec(ctx, "SYSTEM START MERGES "+tbl))

	const accounts, perAccount, buckets = 10_000, 10, 168
	T := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	r := &figures{}
	for a := 0; a < accounts; a++ {
		acct := fmt.Sprintf("acct-%05d", a)
		var sum int64
		for d := 0; d < perAccount; d++ {
			size := int64((a*perAccount+d)%997)*4096 + 8192
			r.dbUUID, r.dbAccount = append(r.dbUUID, fmt.Sprintf("%s-db-%02d", acct, d)), append(r.dbAccount, acct)
			r.dbSize, r.dbSeq, r.dbUpdated = append(r.dbSize, size), append(r.dbSeq, 1), append(r.dbUpdated, 1)
			sum += size
		}
		r.account = append(r.account, acct)
		r.acctSize, r.acctDBs, r.acctUpd = append(r.acctSize, sum), append(r.acctDBs, perAccount), append(r.acctUpd, 1)
		r.sizeSum += sum
	}
	s, err := New(Config{Catalog: stubCatalog{}, Conn: h.conn, Database: h.Database()})
	require.NoError(t, err)
	defer s.Close()
	t0 := time.Now()
	for b := 0; b < buckets; b++ {
		require.NoError(t, s.insert(ctx, T.Add(time.Duration(b)*time.Hour), uint64(b+1), r, time.Now()))
	}
	rows := buckets * (len(r.dbUUID) + len(r.account) + 1)
	t.Logf("inserted %d rows in %s (%.0f rows/s)", rows, time.Since(t0).Round(time.Millisecond), float64(rows)/time.Since(t0).Seconds())
	require.NoError(t, h.conn.Exec(ctx, "OPTIMIZE TABLE "+tbl+" FINAL"))
	require.NoError(t, h.conn.Exec(ctx, "SYSTEM STOP MERGES "+tbl))
	for b := buckets - 8; b < buckets; b++ { // the newest 8 buckets, inserted again
		require.NoError(t, s.insert(ctx, T.Add(time.Duration(b)*time.Hour), uint64(b+1), r, time.Now()))
	}

	last := T.Add((buckets - 1) * time.Hour)
	acct := "acct-04242"
	pass := fmt.Sprint(buckets)
	at := fmt.Sprint(last.Unix())
	from, to := fmt.Sprint(T.Unix()), at
	forms := []struct{ name, group, final, none string }{
		{"one account, one bucket (StorageAt)",
			`SELECT any(size_bytes) FROM ` + tbl + ` WHERE kind = 'account' AND account_id = '` + acct + `' AND snapshot_time = toDateTime(` + at + `) AND pass_id = ` + pass + ` GROUP BY snapshot_time, pass_id`,
			`SELECT size_bytes FROM ` + tbl + ` FINAL WHERE kind = 'account' AND account_id = '` + acct + `' AND snapshot_time = toDateTime(` + at + `) AND pass_id = ` + pass,
			`SELECT size_bytes FROM ` + tbl + ` WHERE kind = 'account' AND account_id = '` + acct + `' AND snapshot_time = toDateTime(` + at + `) AND pass_id = ` + pass},
		{"one account, a week (AccountHistory)",
			historyQuery(tbl, "", true, acct, from, to),
			historyQuery(tbl, "FINAL", false, acct, from, to),
			historyQuery(tbl, "", false, acct, from, to)},
		{"every account, one bucket (AccountsAt)",
			`SELECT account_id, any(size_bytes) FROM ` + tbl + ` WHERE kind = 'account' AND snapshot_time = toDateTime(` + at + `) AND pass_id = ` + pass + ` AND day = toDate(toDateTime(` + at + `)) GROUP BY account_id ORDER BY account_id`,
			`SELECT account_id, size_bytes FROM ` + tbl + ` FINAL WHERE kind = 'account' AND snapshot_time = toDateTime(` + at + `) AND pass_id = ` + pass + ` AND day = toDate(toDateTime(` + at + `)) ORDER BY account_id`,
			`SELECT account_id, size_bytes FROM ` + tbl + ` WHERE kind = 'account' AND snapshot_time = toDateTime(` + at + `) AND pass_id = ` + pass + ` AND day = toDate(toDateTime(` + at + `)) ORDER BY account_id`},
		{"one bucket's totals (sum of every database)",
			`SELECT sum(s) FROM (SELECT any(size_bytes) AS s FROM ` + tbl + ` WHERE kind = 'database' AND snapshot_time = toDateTime(` + at + `) AND pass_id = ` + pass + ` GROUP BY account_id, database_uuid)`,
			`SELECT sum(size_bytes) FROM ` + tbl + ` FINAL WHERE kind = 'database' AND snapshot_time = toDateTime(` + at + `) AND pass_id = ` + pass,
			`SELECT sum(size_bytes) FROM ` + tbl + ` WHERE kind = 'database' AND snapshot_time = toDateTime(` + at + `) AND pass_id = ` + pass},
	}
	for _, f := range forms {
		var res [3]string
		for i, q := range []string{f.none, f.final, f.group} {
			best := time.Duration(1 << 62)
			var n int
			for k := 0; k < 5; k++ {
				t1 := time.Now()
				rows, err := h.conn.Query(ctx, q)
				require.NoError(t, err, q)
				n = 0
				for rows.Next() {
					n++
				}
				require.NoError(t, rows.Err())
				rows.Close()
				best = min(best, time.Since(t1))
			}
			res[i] = fmt.Sprintf("%s (%d rows)", best.Round(100*time.Microsecond), n)
		}
		t.Logf("%-45s none %-22s FINAL %-22s GROUP BY %s", f.name, res[0], res[1], res[2])
	}
	// The History methods themselves.
	t1 := time.Now()
	hist, err := h.AccountHistory(ctx, acct, T, last)
	require.NoError(t, err)
	require.Len(t, hist, buckets)
	t.Logf("AccountHistory (a week): %s", time.Since(t1).Round(100*time.Microsecond))
	t1 = time.Now()
	_, err = h.StorageAt(ctx, acct, last)
	require.NoError(t, err)
	t.Logf("StorageAt: %s", time.Since(t1).Round(100*time.Microsecond))
}

// historyQuery is AccountHistory's query with the account rows
// deduplicated by GROUP BY (group), by FINAL, or not at all.
func historyQuery(tbl, final string, group bool, acct, from, to string) string {
	inner := `SELECT snapshot_time, pass_id, size_bytes, databases FROM ` + tbl + ` ` + final
	tail := ""
	if group {
		inner = `SELECT snapshot_time, pass_id, any(size_bytes) AS size_bytes, any(databases) AS databases FROM ` + tbl
		tail = ` GROUP BY snapshot_time, pass_id`
	}
	return `SELECT snapshot_time, size_bytes, databases FROM (
    SELECT snapshot_time, max(pass_id) AS pass_id FROM ` + tbl + `
    WHERE kind = 'pass' AND account_id = '' AND snapshot_time >= toDateTime(` + from + `) AND snapshot_time <= toDateTime(` + to + `)
    GROUP BY snapshot_time
) ANY LEFT JOIN (
    ` + inner + `
    WHERE kind = 'account' AND account_id = '` + acct + `' AND snapshot_time >= toDateTime(` + from + `) AND snapshot_time <= toDateTime(` + to + `)` + tail + `
) USING (snapshot_time, pass_id) ORDER BY snapshot_time`
}

func spread(ds []time.Duration) string {
	s := slices.Clone(ds)
	slices.Sort(s)
	return fmt.Sprintf("min %s, median %s, max %s over %d", s[0].Round(100*time.Microsecond),
		s[len(s)/2].Round(100*time.Microsecond), s[len(s)-1].Round(100*time.Microsecond), len(s))
}
