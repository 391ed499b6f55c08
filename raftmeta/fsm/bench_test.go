package fsm

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	sqlite3 "github.com/mattn/go-sqlite3"
	"github.com/stretchr/testify/require"
)

// TestBenchCatalog measures the figures in docs/bench/raftmeta-fsm.md. It
// is skipped unless SHOAL_BENCH=1; SHOAL_BENCH_DBS sets the size of the big
// account (default 1,000,000).
//
//	SHOAL_BENCH=1 go test ./raftmeta/fsm -run TestBenchCatalog -v -timeout 30m
func TestBenchCatalog(t *testing.T) {
	if os.Getenv("SHOAL_BENCH") != "1" {
		t.Skip("set SHOAL_BENCH=1")
	}
	big := 1_000_000
	if v := os.Getenv("SHOAL_BENCH_DBS"); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(t, err)
		big = n
	}
	const smallAccounts, perSmall, batch = 1000, 10, 1024
	ctx := context.Background()
	dir := t.TempDir()
	f, err := New(dir)
	require.NoError(t, err)
	defer f.Close()

	var index uint64
	now := baseTime
	var logs []*raft.Log
	var applyDur time.Duration
	var applied int
	flush := func() {
		if len(logs) == 0 {
			return
		}
		start := time.Now()
		out := f.ApplyBatch(logs)
		applyDur += time.Since(start)
		for _, r := range out {
			if res := r.(Result); res.Err != nil {
				t.Fatalf("refused: %v", res.Err)
			}
		}
		applied += len(logs)
		logs = logs[:0]
	}
	add := func(typ CommandType, body any) {
		index++
		now += 100_000 // 0.1 ms: a proposer at 10,000 commands/s
		data, err := json.Marshal(Command{Version: CommandVersion, Type: typ, RequestID: "r" + strconv.FormatUint(index, 36), Time: now, Body: mustJSON(body)})
		require.NoError(t, err)
		logs = append(logs, &raft.Log{Index: index, Type: raft.LogCommand, Data: data})
		if len(logs) == batch {
			flush()
		}
	}
	add(CmdRegisterHost, RegisterHost{ID: "h1", Address: "127.0.0.1:7001", Region: "weur", Capacity: 1 << 30, State: HostStateActive})
	add(CmdCreateAccount, CreateAccount{ID: "big", Name: "big", Tier: TierPaid, Limits: bigLimits()})
	for a := 0; a < smallAccounts; a++ {
		add(CmdCreateAccount, CreateAccount{ID: fmt.Sprintf("acct-%04d", a), Name: "small", Tier: TierFree, Limits: bigLimits()})
	}
	flush()
	n := 0
	uuid := func() string { n++; return uuidN(n * 2654435761 % (1 << 47)) } // scattered keys, like random UUIDs
	start := time.Now()
	applyDur, applied = 0, 0
	for a := 0; a < smallAccounts; a++ {
		for i := 0; i < perSmall; i++ {
			add(CmdCreateDatabase, createDB(uuid(), fmt.Sprintf("acct-%04d", a), fmt.Sprintf("db-%d", i)))
		}
	}
	for i := 0; i < big; i++ {
		add(CmdCreateDatabase, createDB(uuid(), "big", "db-"+strconv.Itoa(i)))
	}
	flush()
	creates := applied
	createWall := time.Since(start)
	t.Logf("build: %d CreateDatabase in ApplyBatch(%d): apply %.1fs = %.0f commands/s (wall incl. encoding %.1fs)",
		creates, batch, applyDur.Seconds(), float64(creates)/applyDur.Seconds(), createWall.Seconds())

	// Small batches (raft's default MaxAppendEntries is 64).
	{
		g, err := New(t.TempDir())
		require.NoError(t, err)
		gi := uint64(0)
		mk := func(typ CommandType, body any) *raft.Log {
			gi++
			data, _ := json.Marshal(Command{Version: CommandVersion, Type: typ, RequestID: "g" + strconv.FormatUint(gi, 36), Time: baseTime + int64(gi)*100_000, Body: mustJSON(body)})
			return &raft.Log{Index: gi, Type: raft.LogCommand, Data: data}
		}
		g.ApplyBatch([]*raft.Log{mk(CmdCreateAccount, CreateAccount{ID: "x", Name: "x", Tier: TierPaid, Limits: bigLimits()})})
		for _, bs := range []int{1, 64} {
			var d time.Duration
			const total = 50_000
			for done := 0; done < total; done += bs {
				var b []*raft.Log
				for j := 0; j < bs; j++ {
					b = append(b, mk(CmdCreateDatabase, createDB(uuidN(int(gi)), "x", "n"+strconv.FormatUint(gi, 36))))
				}
				s := time.Now()
				g.ApplyBatch(b)
				d += time.Since(s)
			}
			t.Logf("throughput: ApplyBatch(%d) CreateDatabase: %.0f commands/s (%d commands)", bs, total/d.Seconds(), total)
		}
		g.Close()
	}

	// Storage stats for 100,000 of the big account's databases, then drain.
	n = smallAccounts * perSmall
	statsStart := time.Now()
	for i := 0; i < 100; i++ {
		var st []DatabaseStat
		for j := 0; j < 1000; j++ {
			st = append(st, DatabaseStat{UUID: uuid(), SizeBytes: int64(4096 * (j + 1))})
		}
		add(CmdSetDatabaseStats, SetDatabaseStats{Stats: st})
	}
	add(CmdDrainStats, DrainStats{})
	flush()
	t.Logf("stats: 100 SetDatabaseStats x 1000 + drain: %.2fs", time.Since(statsStart).Seconds())
	bigAcct, err := f.Account(ctx, "big")
	require.NoError(t, err)
	require.Equal(t, int64(big), bigAcct.ActiveDatabases)
	require.Positive(t, bigAcct.StorageBytes)

	fi, err := os.Stat(f.path)
	require.NoError(t, err)
	t.Logf("catalog file: %.1f MB", float64(fi.Size())/1e6)

	// Read latencies: 10 vs big databases in the account.
	measure := func(fn func() error) time.Duration {
		var ds []time.Duration
		for i := 0; i < 300; i++ {
			s := time.Now()
			require.NoError(t, fn())
			ds = append(ds, time.Since(s))
		}
		sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
		return ds[len(ds)/2]
	}
	listSmall := measure(func() error { _, _, err := f.ListDatabases(ctx, "acct-0500", ListQuery{PerPage: 100}); return err })
	listBig := measure(func() error {
		l, total, err := f.ListDatabases(ctx, "big", ListQuery{PerPage: 100})
		if err == nil && (len(l) != 100 || total != int64(big)) {
			err = fmt.Errorf("page %d total %d", len(l), total)
		}
		return err
	})
	// The 10-database account's page holds 10 rows, the big one's 100: the
	// same-size page (10 rows) isolates the effect of the account's size.
	listBig10 := measure(func() error { _, _, err := f.ListDatabases(ctx, "big", ListQuery{PerPage: 10}); return err })
	listBigDeep := measure(func() error {
		_, _, err := f.ListDatabases(ctx, "big", ListQuery{PerPage: 100, Page: 1000})
		return err
	})
	acctSmall := measure(func() error { _, err := f.Account(ctx, "acct-0500"); return err })
	acctBig := measure(func() error { _, err := f.Account(ctx, "big"); return err })
	t.Logf("list page 1 (100/page): 10 dbs %v, %d dbs %v, ratio %.2f", listSmall, big, listBig, float64(listBig)/float64(listSmall))
	t.Logf("list page 1 (10/page, same rows as the small account's page): %d dbs %v, ratio %.2f", big, listBig10, float64(listBig10)/float64(listSmall))
	t.Logf("list page 1000 (offset 99,900) of %d dbs: %v (ratio to page 1 of 10 dbs %.2f)", big, listBigDeep, float64(listBigDeep)/float64(listSmall))
	t.Logf("Account() storage total: 10 dbs %v, %d dbs %v, ratio %.2f", acctSmall, big, acctBig, float64(acctBig)/float64(acctSmall))

	// What the copy alone costs: this is how long Apply would stall if the
	// catalog were serialized inside Snapshot() instead of in Persist.
	{
		conn, err := f.rdb.Conn(ctx)
		require.NoError(t, err)
		s := time.Now()
		var size int
		require.NoError(t, conn.Raw(func(dc any) error {
			b, err := dc.(*sqlite3.SQLiteConn).Serialize("main")
			size = len(b)
			return err
		}))
		t.Logf("sqlite3_serialize alone: %.1f MB in %.2fs", float64(size)/1e6, time.Since(s).Seconds())
		require.NoError(t, conn.Close())
	}

	// Snapshot + Persist into raft's file snapshot store (fsyncs), both modes,
	// then Restore into a fresh FSM.
	for _, mode := range []SnapshotMode{SnapshotSerialize, SnapshotBackup} {
		f.cfg.snapshotMode = mode
		store, err := raft.NewFileSnapshotStore(t.TempDir(), 1, io.Discard)
		require.NoError(t, err)
		s0 := time.Now()
		snap, err := f.Snapshot()
		require.NoError(t, err)
		snapCall := time.Since(s0)
		sink, err := store.Create(raft.SnapshotVersionMax, index, 1, raft.Configuration{}, 1, nil)
		if err == nil {
			err = snap.Persist(sink)
		}
		snap.Release() // before any FailNow: a held snapshot would block Close forever
		require.NoError(t, err)
		persist := time.Since(s0)
		metas, err := store.List()
		require.NoError(t, err)
		t.Logf("snapshot %s: size %.1f MB, Snapshot() %v, Snapshot+Persist %.2fs", modeName(mode), float64(metas[0].Size)/1e6, snapCall, persist.Seconds())

		r, err := New(t.TempDir())
		require.NoError(t, err)
		_, rc, err := store.Open(metas[0].ID)
		require.NoError(t, err)
		s1 := time.Now()
		require.NoError(t, r.Restore(rc))
		t.Logf("restore (%s stream): %.2fs", modeName(mode), time.Since(s1).Seconds())
		require.Equal(t, index, r.AppliedIndex())
		ra, err := r.Account(ctx, "big")
		require.NoError(t, err)
		require.Equal(t, bigAcct, ra)
		require.NoError(t, r.Close())
	}
}

func modeName(m SnapshotMode) string {
	if m == SnapshotSerialize {
		return "serialize"
	}
	return "backup"
}

func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}
