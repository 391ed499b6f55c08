package fsm

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
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
	type change = struct {
		acct  string
		delta int64
	}
	hasRow := map[string]bool{} // uuid -> has a database_stats row
	for round := 0; round < 30; round++ {
		var stats []DatabaseStat
		updates := map[string]int64{} // account -> summed delta of updated sizes
		for i := 0; i < 50; i++ {
			u := uuidN(rng.IntN(accounts * perAccount))
			s := rng.Int64N(1 << 20)
			stats = append(stats, DatabaseStat{UUID: u, SizeBytes: s})
			old, ok := size[u]
			switch {
			case !ok: // deleted: skipped
			case !hasRow[u]: // a first size: the insert trigger logs it at once
				hasRow[u] = true
				if s != 0 {
					queue = append(queue, change{owner[u], s})
				}
				size[u] = s
			default: // an update: summed per account, logged after the command's stats
				updates[owner[u]] += s - old
				size[u] = s
			}
		}
		var accts []string
		for a, dl := range updates {
			if dl != 0 {
				accts = append(accts, a)
			}
		}
		sort.Strings(accts)
		for _, a := range accts {
			queue = append(queue, change{a, updates[a]})
		}
		d.ok(CmdSetDatabaseStats, SetDatabaseStats{Stats: stats})
		if rng.IntN(3) == 0 {
			u := uuidN(rng.IntN(accounts * perAccount))
			if old, ok := size[u]; ok {
				d.ok(CmdDeleteDatabase, DeleteDatabase{AccountID: owner[u], UUID: u})
				if old != 0 && hasRow[u] {
					queue = append(queue, change{owner[u], -old})
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

// TestStatsSeqIgnoresStaleAndDuplicates: a size is kept only if its seq is
// greater than the stored one, so duplicates and late deliveries change
// nothing (no delta, no total moving backwards) and are counted as stale.
func TestStatsSeqIgnoresStaleAndDuplicates(t *testing.T) {
	ctx := context.Background()
	f := newFSM(t)
	d := newDriver(t, f)
	d.account("a1", 10)
	d.ok(CmdCreateDatabase, createDB(uuidN(1), "a1", "one"))
	d.ok(CmdCreateDatabase, createDB(uuidN(2), "a1", "two"))
	set := func(stats ...DatabaseStat) StatsResult {
		t.Helper()
		return decodeValue[StatsResult](t, d.ok(CmdSetDatabaseStats, SetDatabaseStats{Stats: stats}))
	}
	size := func(u string) int64 {
		t.Helper()
		db, err := f.Database(ctx, u)
		require.NoError(t, err)
		return db.SizeBytes
	}
	drained := func() int64 {
		t.Helper()
		d.ok(CmdDrainStats, DrainStats{})
		return storage(t, f, "a1")
	}

	assert.Equal(t, StatsResult{Applied: 2}, set(DatabaseStat{UUID: uuidN(1), SizeBytes: 1000, Seq: 10},
		DatabaseStat{UUID: uuidN(2), SizeBytes: 50, Seq: 3}))
	assert.Equal(t, int64(1050), drained())

	// A duplicate (same seq) and a late one (lower seq): nothing changes,
	// not even updated_at, and no delta is logged.
	before := dumpCatalog(t, f)
	r := set(DatabaseStat{UUID: uuidN(1), SizeBytes: 1000, Seq: 10}, DatabaseStat{UUID: uuidN(1), SizeBytes: 10, Seq: 9},
		DatabaseStat{UUID: uuidN(9), SizeBytes: 1, Seq: 99}) // unknown: skipped, not stale
	assert.Equal(t, StatsResult{Stale: 2, Skipped: 1}, r)
	assert.Equal(t, before, dumpCatalog(t, f))
	assert.Zero(t, pending(t, f))

	// Reordered within one command: the higher seq wins whatever its place.
	assert.Equal(t, StatsResult{Applied: 1, Stale: 1}, set(DatabaseStat{UUID: uuidN(1), SizeBytes: 3000, Seq: 12},
		DatabaseStat{UUID: uuidN(1), SizeBytes: 2000, Seq: 11}))
	assert.Equal(t, int64(3000), size(uuidN(1)))
	assert.Equal(t, int64(3050), drained())

	// Shrinking with a newer seq is kept; growing with an older one is not.
	assert.Equal(t, StatsResult{Applied: 1}, set(DatabaseStat{UUID: uuidN(1), SizeBytes: 100, Seq: 20}))
	assert.Equal(t, StatsResult{Stale: 1}, set(DatabaseStat{UUID: uuidN(1), SizeBytes: 9000, Seq: 19}))
	assert.Equal(t, int64(150), drained())

	// A newer seq with the same size is applied (the seq moves on) but
	// logs no delta; the old seq is then stale.
	assert.Equal(t, StatsResult{Applied: 1}, set(DatabaseStat{UUID: uuidN(2), SizeBytes: 50, Seq: 4}))
	assert.Zero(t, pending(t, f))
	assert.Equal(t, StatsResult{Stale: 1}, set(DatabaseStat{UUID: uuidN(2), SizeBytes: 70, Seq: 4}))

	// Unsequenced stats (seq 0) keep last-writer-wins until a sequenced
	// size arrives, and are stale after it.
	d.ok(CmdCreateDatabase, createDB(uuidN(3), "a1", "three"))
	assert.Equal(t, StatsResult{Applied: 2}, set(DatabaseStat{UUID: uuidN(3), SizeBytes: 5}, DatabaseStat{UUID: uuidN(3), SizeBytes: 7}))
	assert.Equal(t, int64(7), size(uuidN(3)))
	assert.Equal(t, StatsResult{Applied: 1}, set(DatabaseStat{UUID: uuidN(3), SizeBytes: 8, Seq: 1}))
	assert.Equal(t, StatsResult{Stale: 1}, set(DatabaseStat{UUID: uuidN(3), SizeBytes: 5}))
	assert.Equal(t, int64(158), drained())

	// A deleted database's stats row goes; later stats are skipped, not
	// stale, whatever their seq.
	d.ok(CmdDeleteDatabase, DeleteDatabase{AccountID: "a1", UUID: uuidN(3)})
	assert.Equal(t, StatsResult{Skipped: 2}, set(DatabaseStat{UUID: uuidN(3), SizeBytes: 9, Seq: 2}, DatabaseStat{UUID: uuidN(3), SizeBytes: 9, Seq: 0}))
	assert.Equal(t, int64(150), drained())
	checkInvariants(t, f)
}

// TestStatsSeqRandomDeliveryConverges delivers sizes of growing and
// shrinking databases shuffled, some twice, split at random command
// boundaries: every command's counts match a model in which the highest seq
// delivered so far wins, and after each drain the account total is the sum
// of those sizes.
func TestStatsSeqRandomDeliveryConverges(t *testing.T) {
	f := newFSM(t)
	d := newDriver(t, f)
	rng := rand.New(rand.NewPCG(3, 4))
	const dbs = 60
	d.account("a1", dbs)
	for i := 0; i < dbs; i++ {
		d.ok(CmdCreateDatabase, createDB(uuidN(i), "a1", fmt.Sprintf("db-%d", i)))
	}
	type meas struct {
		size, seq int64
	}
	best := map[string]meas{} // model: the highest seq delivered per database
	var seq int64
	for round := 0; round < 20; round++ {
		// Each round measures some databases a few times (growing and
		// shrinking) and delivers the measurements shuffled, some twice,
		// some from earlier rounds again.
		var out []DatabaseStat
		for k := 0; k < 40; k++ {
			u := uuidN(rng.IntN(dbs))
			seq++
			out = append(out, DatabaseStat{UUID: u, SizeBytes: rng.Int64N(1 << 20), Seq: seq})
			if rng.IntN(4) == 0 {
				out = append(out, out[rng.IntN(len(out))])
			}
		}
		rng.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
		for len(out) > 0 {
			n := 1 + rng.IntN(len(out))
			res := decodeValue[StatsResult](t, d.ok(CmdSetDatabaseStats, SetDatabaseStats{Stats: out[:n]}))
			applied := 0
			for _, st := range out[:n] {
				if st.Seq > best[st.UUID].seq {
					best[st.UUID] = meas{st.SizeBytes, st.Seq}
					applied++
				}
			}
			assert.Equal(t, StatsResult{Applied: applied, Stale: n - applied}, res)
			out = out[n:]
		}
		d.ok(CmdDrainStats, DrainStats{})
		var want int64
		for _, m := range best {
			want += m.size
		}
		assert.Equal(t, want, storage(t, f, "a1"), "round %d", round)
	}
	checkInvariants(t, f)
}
