package storage

import (
	"context"
	"math/rand/v2"
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/pipeline/event"
)

// sizeModel is the ground truth: the size with the highest seq produced
// per database, and the records produced so far (to replay stale ones).
type sizeModel struct {
	owner  map[string]string
	uuids  []string
	latest map[string]event.Size
	past   []event.Size
	seq    int64
}

func newSizeModel(uuids []string, owner map[string]string) *sizeModel {
	return &sizeModel{owner: owner, uuids: uuids, latest: map[string]event.Size{}}
}

func (m *sizeModel) next(u string, size int64) event.Size {
	m.seq++
	s := event.Size{DatabaseUUID: u, AccountID: m.owner[u], SizeBytes: size, Seq: m.seq, Host: "h1"}
	if s.Seq > m.latest[u].Seq {
		m.latest[u] = s
	}
	m.past = append(m.past, s)
	return s
}

func (m *sizeModel) want() map[string]int64 {
	out := map[string]int64{}
	for _, a := range m.owner {
		out[a] = 0
	}
	for u, s := range m.latest {
		out[m.owner[u]] += s.SizeBytes
	}
	return out
}

func (m *sizeModel) accounts() []string {
	seen := map[string]bool{}
	var out []string
	for _, a := range m.owner {
		if !seen[a] {
			seen[a] = true
			out = append(out, a)
		}
	}
	sort.Strings(out)
	return out
}

// round measures every database `updates` times, each size moving in dir
// (+1 growing, -1 shrinking, 0 either way) from its latest, and returns the
// stream to produce: in order, except that about a fifth of the databases
// have an older measurement of theirs sent after a newer one, and about a
// tenth have a record sent twice.
func (m *sizeModel) round(rng *rand.Rand, updates int, dir int) []event.Size {
	per := make([][]event.Size, 0, len(m.uuids))
	for _, u := range m.uuids {
		var mine []event.Size
		for k := 0; k < updates; k++ {
			cur := m.latest[u].SizeBytes
			step := 4096 * (1 + rng.Int64N(64))
			switch {
			case dir > 0:
				cur += step
			case dir < 0:
				cur = max(0, cur-step)
			default:
				cur = max(0, cur+step*(rng.Int64N(3)-1))
			}
			mine = append(mine, m.next(u, cur))
		}
		if len(mine) >= 2 && rng.IntN(5) == 0 {
			i := rng.IntN(len(mine) - 1)
			mine[i], mine[i+1] = mine[i+1], mine[i] // an older size after a newer one
		}
		if rng.IntN(10) == 0 {
			mine = append(mine, mine[rng.IntN(len(mine))]) // a duplicate
		}
		per = append(per, mine)
	}
	// Interleave the databases at random, each keeping its own order (what
	// a keyed partition preserves).
	var out []event.Size
	for len(per) > 0 {
		i := rng.IntN(len(per))
		out = append(out, per[i][0])
		if per[i] = per[i][1:]; len(per[i]) == 0 {
			per[i] = per[len(per)-1]
			per = per[:len(per)-1]
		}
	}
	return out
}

// awaitTotals polls the catalog's account totals until they equal want and
// returns how long after `since` that happened. With monotone > 0 every
// account's total must never decrease between polls (< 0: never increase):
// a stale or duplicate size applied would move it back.
func awaitTotals(t *testing.T, cat *catalog, accounts []string, want map[string]int64, since time.Time, monotone int) time.Duration {
	t.Helper()
	prev := cat.totals(t, accounts)
	deadline := time.Now().Add(60 * time.Second)
	for {
		got := cat.totals(t, accounts)
		for _, a := range accounts {
			switch {
			case monotone > 0:
				require.GreaterOrEqual(t, got[a], prev[a], "account %s total went backwards", a)
			case monotone < 0:
				require.LessOrEqual(t, got[a], prev[a], "account %s total went backwards", a)
			}
		}
		if equalTotals(got, want, accounts) {
			return time.Since(since)
		}
		if time.Now().After(deadline) {
			require.Equal(t, want, got, "account totals never matched the latest sizes")
		}
		prev = got
		time.Sleep(10 * time.Millisecond) // poll interval of a wait for the condition above (the event itself)
	}
}

func equalTotals(got, want map[string]int64, accounts []string) bool {
	for _, a := range accounts {
		if got[a] != want[a] {
			return false
		}
	}
	return true
}

// TestSizesReachAccountTotalsExactly runs the storage consumer against a
// real 3-node catalog and a real (kfake) broker over TCP: 1,000 databases
// in 10 accounts grow and shrink, with reordered and duplicated records;
// the account totals the leader drains every second equal the sum of the
// latest sizes, never move backwards, ignore a replay of old records
// entirely, and stay exact when the consumer is killed between a catalog
// write and its commit and restarted.
func TestSizesReachAccountTotalsExactly(t *testing.T) {
	brokers := startBroker(t, 4)
	cat := startCatalog(t, time.Second)
	uuids, owner := cat.populate(t, 10, 100)
	m := newSizeModel(uuids, owner)
	accounts := m.accounts()
	rng := rand.New(rand.NewPCG(7, 11))
	p := newSizeProducer(t, brokers)
	const group = "storage-it"

	c, stop := runConsumer(t, Config{Brokers: brokers, Catalog: cat.client, Group: group, Consumers: 2})

	// Growing, then shrinking: totals move one way only.
	for _, ph := range []struct {
		name string
		dir  int
	}{{"grow", +1}, {"shrink", -1}, {"grow again", +1}} {
		stream := m.round(rng, 3, ph.dir)
		p.produce(stream...)
		fresh := awaitTotals(t, cat, accounts, m.want(), time.Now(), ph.dir)
		t.Logf("%s: %d records for %d databases; totals exact %v after the last was acknowledged by the broker",
			ph.name, len(stream), len(uuids), fresh.Round(time.Millisecond))
	}
	require.Eventually(t, func() bool { return c.Stats().Committed == c.Stats().Consumed }, 10*time.Second, 10*time.Millisecond)

	// A replay of old records (every one produced so far, shuffled) and
	// duplicates of the latest: nothing changes, not even a delta.
	before := c.Stats()
	want := m.want()
	replay := append([]event.Size(nil), m.past...)
	rng.Shuffle(len(replay), func(i, j int) { replay[i], replay[j] = replay[j], replay[i] })
	for _, u := range uuids {
		replay = append(replay, m.latest[u])
	}
	p.produce(replay...)
	require.Eventually(t, func() bool { return c.Stats().Committed-before.Committed == uint64(len(replay)) },
		30*time.Second, 10*time.Millisecond)
	s := c.Stats()
	assert.Zero(t, s.Applied-before.Applied, "no replayed size was applied")
	assert.Positive(t, s.Stale-before.Stale)
	assert.Equal(t, uint64(len(replay)), (s.Stale-before.Stale)+(s.Superseded-before.Superseded))
	for _, n := range cat.nodes {
		p, err := n.FSM().PendingStatsChanges(context.Background())
		require.NoError(t, err)
		assert.Zero(t, p, "a replayed size logged a delta on %s", n.ID())
	}
	// No drain needs to pass: the totals change only by draining logged
	// deltas, and every node has none pending (above), with every record
	// committed. (This was a 1.5 s sleep for "a drain passes".)
	assert.Equal(t, want, cat.totals(t, accounts))
	t.Logf("replay: %d old or duplicate records, %d stale in the catalog, %d superseded in batches; totals unchanged",
		len(replay), s.Stale-before.Stale, s.Superseded-before.Superseded)
	stop()

	// Killed mid-stream: the consumer stops right after its third
	// acknowledged write, before committing it; a new one takes over.
	stream := m.round(rng, 5, 0)
	p.produce(stream...)
	k, err := New(Config{Brokers: brokers, Catalog: cat.client, Group: group, MaxBatch: 1000, Logger: quietLogger()})
	require.NoError(t, err)
	writes := 0
	k.afterWrite = func(int) {
		if writes++; writes == 3 {
			k.cancel() // as if the process died here: the write is in, the commit is not
		}
	}
	require.NoError(t, k.Run(context.Background()))
	require.NoError(t, k.Close())
	ks := k.Stats()
	require.EqualValues(t, 3, ks.Writes)
	require.Less(t, ks.Committed, uint64(len(stream)), "the kill came mid-stream")

	start := time.Now()
	r, _ := runConsumer(t, Config{Brokers: brokers, Catalog: cat.client, Group: group, Consumers: 2})
	fresh := awaitTotals(t, cat, accounts, m.want(), start, 0)
	rs := r.Stats()
	assert.Positive(t, rs.Stale, "the uncommitted batch was redelivered and found stale")
	t.Logf("kill: %d records; killed after %d writes (%d records committed, %d consumed); restarted consumer: "+
		"%d applied, %d stale, %d superseded; totals exact %v after the restart",
		len(stream), ks.Writes, ks.Committed, ks.Consumed, rs.Applied, rs.Stale, rs.Superseded, fresh.Round(time.Millisecond))
}
