package fsm

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// walkDatabases reads every database storage page of size limit.
func walkDatabases(t *testing.T, f *FSM, limit int) (out []DatabaseStorage, pages int) {
	t.Helper()
	after := ""
	for {
		p, err := f.DatabaseStoragePage(context.Background(), after, limit)
		require.NoError(t, err)
		pages++
		require.LessOrEqual(t, len(p.Databases), storageLimit(limit))
		out = append(out, p.Databases...)
		if p.Next == "" {
			return out, pages
		}
		require.Len(t, p.Databases, storageLimit(limit), "only a full page has a next page")
		require.Equal(t, p.Databases[len(p.Databases)-1].UUID, p.Next)
		after = p.Next
	}
}

func walkAccounts(t *testing.T, f *FSM, limit int) (out []AccountStorage) {
	t.Helper()
	after := ""
	for {
		p, err := f.AccountStoragePage(context.Background(), after, limit)
		require.NoError(t, err)
		out = append(out, p.Accounts...)
		if p.Next == "" {
			return out
		}
		after = p.Next
	}
}

func TestStoragePagesWalkEveryRowOnce(t *testing.T) {
	f := newFSM(t)
	d := newDriver(t, f)
	d.account("a1", 1000)
	d.account("a2", 1000)
	d.account("a3-empty", 10) // no databases: listed with zeros
	const n = 250
	want := map[string]DatabaseStorage{}
	var stats []DatabaseStat
	for i := 1; i <= n; i++ {
		acct := []string{"a1", "a2"}[i%2]
		d.ok(CmdCreateDatabase, createDB(uuidN(i), acct, fmt.Sprintf("db%d", i)))
		if i%10 == 0 {
			continue // never sized: no row
		}
		stats = append(stats, DatabaseStat{UUID: uuidN(i), SizeBytes: int64(i) * 100, Seq: int64(i)})
		want[uuidN(i)] = DatabaseStorage{UUID: uuidN(i), AccountID: acct, SizeBytes: int64(i) * 100, Seq: int64(i)}
	}
	d.ok(CmdSetDatabaseStats, SetDatabaseStats{Stats: stats})
	sizedAt := d.now
	d.ok(CmdDeleteDatabase, DeleteDatabase{AccountID: "a1", UUID: uuidN(4)}) // deleted: its size goes
	delete(want, uuidN(4))
	d.ok(CmdDrainStats, DrainStats{})
	drainedAt := d.now

	for _, limit := range []int{1, 7, 100, 224, 225, 226, 0, MaxStoragePage + 5} {
		got, pages := walkDatabases(t, f, limit)
		require.Len(t, got, len(want), "limit %d", limit)
		for i, g := range got {
			if i > 0 {
				require.Less(t, got[i-1].UUID, g.UUID, "UUID order, no repeats (limit %d)", limit)
			}
			w, ok := want[g.UUID]
			require.True(t, ok, "unexpected %s", g.UUID)
			w.UpdatedAt = sizedAt
			assert.Equal(t, w, g)
		}
		if limit == 7 {
			assert.Equal(t, (len(want)+6)/7, pages, "a page more only when the last is full")
		}
	}

	// Account totals: the drained sums, every account once.
	var sum = map[string]int64{}
	for _, w := range want {
		sum[w.AccountID] += w.SizeBytes
	}
	for _, limit := range []int{1, 2, 3, 0} {
		accts := walkAccounts(t, f, limit)
		require.Equal(t, []AccountStorage{
			{AccountID: "a1", StorageBytes: sum["a1"], ActiveDatabases: n/2 - 1, UpdatedAt: drainedAt},
			{AccountID: "a2", StorageBytes: sum["a2"], ActiveDatabases: n / 2, UpdatedAt: drainedAt},
			{AccountID: "a3-empty"},
		}, accts, "limit %d", limit)
	}

	// A key past the end is an empty last page; an empty catalog too.
	p, err := f.DatabaseStoragePage(context.Background(), "ffffffff-ffff-4fff-bfff-ffffffffffff", 10)
	require.NoError(t, err)
	assert.Empty(t, p.Databases)
	assert.Empty(t, p.Next)
	e, err := newFSM(t).AccountStoragePage(context.Background(), "", 10)
	require.NoError(t, err)
	assert.Equal(t, AccountStoragePage{Accounts: []AccountStorage{}}, e)
}

// Sizes changing while the pages are walked (Apply on its one goroutine,
// as raft calls it) never make a database appear twice or go missing:
// pages follow the primary key, which updates do not move.
func TestStoragePagesUnderConcurrentUpdates(t *testing.T) {
	f := newFSM(t)
	d := newDriver(t, f)
	d.account("a1", 10_000)
	const n = 2_000
	var stats []DatabaseStat
	for i := 1; i <= n; i++ {
		d.ok(CmdCreateDatabase, createDB(uuidN(i), "a1", fmt.Sprintf("db%d", i)))
		stats = append(stats, DatabaseStat{UUID: uuidN(i), SizeBytes: 1, Seq: 1})
	}
	d.ok(CmdSetDatabaseStats, SetDatabaseStats{Stats: stats})

	stop := make(chan struct{})
	refused := make(chan *Error, 1)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for seq := int64(2); ; seq++ {
			select {
			case <-stop:
				return
			default:
			}
			batch := make([]DatabaseStat, 0, 100)
			for j := 0; j < 100; j++ {
				batch = append(batch, DatabaseStat{UUID: uuidN(1 + int(seq*97+int64(j)*13)%n), SizeBytes: seq, Seq: seq})
			}
			if r := d.do(CmdSetDatabaseStats, SetDatabaseStats{Stats: batch}); r.Err != nil {
				refused <- r.Err
				return
			}
		}
	}()
	for round := 0; round < 5; round++ {
		got, _ := walkDatabases(t, f, 97)
		require.Len(t, got, n)
		for i := range got {
			require.Equal(t, uuidN(i+1), got[i].UUID)
		}
	}
	close(stop)
	wg.Wait()
	select {
	case err := <-refused:
		t.Fatalf("size update refused: %v", err)
	default:
	}
}

func BenchmarkDatabaseStoragePage(b *testing.B) {
	f, err := New(b.TempDir())
	require.NoError(b, err)
	defer f.Close()
	d := newDriver(b, f)
	d.ok(CmdCreateAccount, CreateAccount{ID: "a1", Name: "a1", Tier: TierFree, Limits: bigLimits()})
	const n = 100_000
	for i := 1; i <= n; i += 5_000 {
		var stats []DatabaseStat
		for j := i; j < i+5_000; j++ {
			d.ok(CmdCreateDatabase, createDB(uuidN(j), "a1", fmt.Sprintf("db%d", j)))
			stats = append(stats, DatabaseStat{UUID: uuidN(j), SizeBytes: int64(j), Seq: 1})
		}
		d.ok(CmdSetDatabaseStats, SetDatabaseStats{Stats: stats})
	}
	b.ResetTimer()
	after := ""
	for i := 0; i < b.N; i++ {
		p, err := f.DatabaseStoragePage(context.Background(), after, MaxStoragePage)
		require.NoError(b, err)
		after = p.Next // walks the catalog, starting over at the end
	}
}
