package fsm

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func storage(t *testing.T, f *FSM, account string) int64 {
	t.Helper()
	a, err := f.Account(context.Background(), account)
	require.NoError(t, err)
	return a.StorageBytes
}

func pending(t *testing.T, f *FSM) int64 {
	t.Helper()
	n, err := f.PendingStatsChanges(context.Background())
	require.NoError(t, err)
	return n
}

func TestStatsDeltasAndDrain(t *testing.T) {
	ctx := context.Background()
	f := newFSM(t)
	d := newDriver(t, f)
	d.account("a1", 10)
	d.account("a2", 10)
	d.ok(CmdCreateDatabase, createDB(uuidN(1), "a1", "one"))
	d.ok(CmdCreateDatabase, createDB(uuidN(2), "a1", "two"))
	d.ok(CmdCreateDatabase, createDB(uuidN(3), "a2", "three"))

	r := d.ok(CmdSetDatabaseStats, SetDatabaseStats{Stats: []DatabaseStat{
		{UUID: uuidN(1), SizeBytes: 1000},
		{UUID: uuidN(2), SizeBytes: 500},
		{UUID: uuidN(3), SizeBytes: 70},
		{UUID: uuidN(9), SizeBytes: 123}, // unknown: skipped
	}})
	assert.Equal(t, StatsResult{Applied: 3, Skipped: 1}, decodeValue[StatsResult](t, r))
	assert.Equal(t, int64(3), pending(t, f))
	assert.Zero(t, storage(t, f, "a1"), "not drained yet")

	dr := decodeValue[DrainResult](t, d.ok(CmdDrainStats, DrainStats{}))
	assert.Equal(t, DrainResult{Changes: 3, Accounts: 2}, dr)
	assert.Equal(t, int64(1500), storage(t, f, "a1"))
	assert.Equal(t, int64(70), storage(t, f, "a2"))
	assert.Zero(t, pending(t, f))

	// Shrinking gives a negative delta; an unchanged size gives none.
	d.ok(CmdSetDatabaseStats, SetDatabaseStats{Stats: []DatabaseStat{{UUID: uuidN(1), SizeBytes: 400}, {UUID: uuidN(2), SizeBytes: 500}}})
	assert.Equal(t, int64(1), pending(t, f))
	d.ok(CmdDrainStats, DrainStats{})
	assert.Equal(t, int64(900), storage(t, f, "a1"))

	// Deleting a database removes its size from the account's total.
	d.ok(CmdDeleteDatabase, DeleteDatabase{AccountID: "a1", UUID: uuidN(2)})
	d.ok(CmdDrainStats, DrainStats{})
	assert.Equal(t, int64(400), storage(t, f, "a1"))
	// Stats for the deleted database are skipped from now on.
	r = d.ok(CmdSetDatabaseStats, SetDatabaseStats{Stats: []DatabaseStat{{UUID: uuidN(2), SizeBytes: 9999}}})
	assert.Equal(t, StatsResult{Skipped: 1}, decodeValue[StatsResult](t, r))
	assert.Zero(t, pending(t, f))
	db, err := f.Database(ctx, uuidN(1))
	require.NoError(t, err)
	assert.Equal(t, int64(400), db.SizeBytes)

	// Invalid stats refuse the whole command.
	before := dumpCatalog(t, f)
	assert.ErrorIs(t, d.do(CmdSetDatabaseStats, SetDatabaseStats{Stats: []DatabaseStat{{UUID: uuidN(1), SizeBytes: 1}, {UUID: uuidN(3), SizeBytes: -1}}}).Err, ErrInvalid)
	assert.ErrorIs(t, d.do(CmdSetDatabaseStats, SetDatabaseStats{Stats: []DatabaseStat{{UUID: "X", SizeBytes: 1}}}).Err, ErrInvalid)
	assert.ErrorIs(t, d.do(CmdDrainStats, DrainStats{Max: -1}).Err, ErrInvalid)
	assert.Equal(t, before, dumpCatalog(t, f))

	// Draining an empty log is a no-op.
	assert.Equal(t, DrainResult{}, decodeValue[DrainResult](t, d.ok(CmdDrainStats, DrainStats{})))
}

// TestDrainArithmeticManyAccounts drives random size changes, deletions and
// partial drains over many accounts and checks every account total against
// a model: total == sum of the latest sizes of its active databases, once
// everything is drained; and partial drains never lose or double a delta.
func TestDrainArithmeticManyAccounts(t *testing.T) {
	f := newFSM(t)
	d := newDriver(t, f)
	rng := rand.New(rand.NewPCG(1, 2))
	const accounts, perAccount = 40, 10
	size := map[string]int64{}   // uuid -> latest size of active dbs
	owner := map[string]string{} // uuid -> account
	for a := 0; a < accounts; a++ {
		acct := fmt.Sprintf("acct-%02d", a)
		d.account(acct, 1000)
		for i := 0; i < perAccount; i++ {
			u := uuidN(a*perAccount + i)
			d.ok(CmdCreateDatabase, createDB(u, acct, fmt.Sprintf("db-%d", i)))
			owner[u] = acct
			size[u] = 0
		}
	}
	drained := map[string]int64{} // model of account_database_stats
	var queue []struct {
		acct  string
		delta int64
	}
	for round := 0; round < 30; round++ {
		var stats []DatabaseStat
		for i := 0; i < 50; i++ {
			u := uuidN(rng.IntN(accounts * perAccount))
			s := rng.Int64N(1 << 20)
			stats = append(stats, DatabaseStat{UUID: u, SizeBytes: s})
			if old, ok := size[u]; ok {
				if s != old {
					queue = append(queue, struct {
						acct  string
						delta int64
					}{owner[u], s - old})
				}
				size[u] = s
			}
		}
		d.ok(CmdSetDatabaseStats, SetDatabaseStats{Stats: stats})
		if rng.IntN(3) == 0 {
			u := uuidN(rng.IntN(accounts * perAccount))
			if old, ok := size[u]; ok {
				d.ok(CmdDeleteDatabase, DeleteDatabase{AccountID: owner[u], UUID: u})
				if old != 0 {
					queue = append(queue, struct {
						acct  string
						delta int64
					}{owner[u], -old})
				}
				delete(size, u)
			}
		}
		require.Equal(t, int64(len(queue)), pending(t, f))
		max := rng.IntN(40) // 0 drains everything
		r := decodeValue[DrainResult](t, d.ok(CmdDrainStats, DrainStats{Max: max}))
		n := len(queue)
		if max > 0 && max < n {
			n = max
		}
		touched := map[string]bool{}
		for _, c := range queue[:n] {
			drained[c.acct] += c.delta
			touched[c.acct] = true
		}
		queue = queue[n:]
		assert.Equal(t, DrainResult{Changes: int64(n), Accounts: int64(len(touched))}, r)
		for a := 0; a < accounts; a++ {
			acct := fmt.Sprintf("acct-%02d", a)
			assert.Equal(t, drained[acct], storage(t, f, acct), "round %d %s", round, acct)
		}
	}
	d.ok(CmdDrainStats, DrainStats{})
	want := map[string]int64{}
	for u, s := range size {
		want[owner[u]] += s
	}
	for a := 0; a < accounts; a++ {
		acct := fmt.Sprintf("acct-%02d", a)
		assert.Equal(t, want[acct], storage(t, f, acct), acct)
	}
}
