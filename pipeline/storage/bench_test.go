package storage

import (
	"context"
	"os"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/pipeline/event"
	"github.com/shoaldb/shoal/raftmeta"
	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// TestBenchStorageConsumer measures size updates/s applied to the catalog
// (a 3-node raftmeta cluster over loopback TCP) in batches, first by
// SetDatabaseStats directly (the catalog's ceiling), then end to end from a
// backlog in the storage topic through the consumer; and the freshness of
// account totals (one size change to the drained total). Opt-in:
//
//	SHOAL_BENCH=1 go test ./pipeline/storage -run TestBenchStorageConsumer -v -timeout 20m
//
// Results are printed, not asserted (shared, noisy machines).
func TestBenchStorageConsumer(t *testing.T) {
	if os.Getenv("SHOAL_BENCH") == "" {
		t.Skip("set SHOAL_BENCH=1 to run")
	}
	const (
		accounts   = 20
		perAccount = 1000
		rounds     = 25
	)
	cat := startCatalog(t, time.Second)
	start := time.Now()
	uuids, owner := cat.populate(t, accounts, perAccount)
	t.Logf("setup: %d databases created in %.1fs", len(uuids), time.Since(start).Seconds())
	var seq int64
	nextRound := func() []fsm.DatabaseStat {
		out := make([]fsm.DatabaseStat, len(uuids))
		for i, u := range uuids {
			seq++
			out[i] = fsm.DatabaseStat{UUID: u, SizeBytes: 4096 * (1 + seq%1000), Seq: seq}
		}
		return out
	}

	// 1. The catalog alone: writers each sending batches of 5,000 distinct
	// databases, as the consumer's members do. The first round gives every
	// database its first size (an insert; once per database's life) and is
	// reported apart.
	for _, writers := range []int{0, 1, 2, 4} {
		rounds := 5
		if writers == 0 {
			writers, rounds = 1, 1
		}
		var batches [][]fsm.DatabaseStat
		for r := 0; r < rounds; r++ {
			st := nextRound()
			for i := 0; i < len(st); i += DefaultMaxBatch {
				batches = append(batches, st[i:min(i+DefaultMaxBatch, len(st))])
			}
		}
		work := make(chan []fsm.DatabaseStat, len(batches))
		for _, b := range batches {
			work <- b
		}
		close(work)
		var wg sync.WaitGroup
		var mu sync.Mutex
		var applied int
		var lat []time.Duration
		start := time.Now()
		for w := 0; w < writers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for b := range work {
					s := time.Now()
					r, err := cat.client.SetDatabaseStats(context.Background(), b)
					require.NoError(t, err)
					mu.Lock()
					applied += r.Applied
					lat = append(lat, time.Since(s))
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		el := time.Since(start)
		sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
		what := "updates"
		if rounds == 1 {
			what = "first sizes"
		}
		t.Logf("catalog direct, %d writer(s): %d %s in %d writes of %d, %.2fs: %.0f/s (write p50 %v, p99 %v)",
			writers, applied, what, len(batches), DefaultMaxBatch, el.Seconds(), float64(applied)/el.Seconds(),
			lat[len(lat)/2].Round(time.Millisecond), lat[len(lat)*99/100].Round(time.Millisecond))
	}

	// 2. End to end: a backlog of `rounds` sizes per database in the topic
	// (4 partitions, a fresh broker each run), drained by the consumer with
	// 1, 2 and 4 members.
	var brokers []string
	var p *sizeProducer
	for _, members := range []int{1, 2, 4} {
		brokers = startBroker(t, 4)
		p = newSizeProducer(t, brokers)
		var total int
		prodStart := time.Now()
		for r := 0; r < rounds; r++ {
			var sizes []event.Size
			for _, st := range nextRound() {
				sizes = append(sizes, event.Size{DatabaseUUID: st.UUID, AccountID: owner[st.UUID], SizeBytes: st.SizeBytes, Seq: st.Seq})
			}
			p.produce(sizes...)
			total += len(sizes)
		}
		prodEl := time.Since(prodStart)
		start := time.Now()
		c, stop := runConsumer(t, Config{Brokers: brokers, Catalog: cat.client, Group: "bench", Consumers: members})
		require.Eventually(t, func() bool { return c.Stats().Committed == uint64(total) }, 10*time.Minute, 20*time.Millisecond)
		el := time.Since(start)
		s := c.Stats()
		stop()
		written := s.Applied + s.Stale + s.Skipped
		t.Logf("end to end, %d member(s): %d records (%d new, produced at %.0f/s) consumed in %.2fs: %.0f records/s, "+
			"%.0f updates/s written to the catalog (%d applied, %d stale, %d superseded, %d writes, %d catalog errors)",
			members, s.Consumed, total, float64(total)/prodEl.Seconds(), el.Seconds(), float64(s.Consumed)/el.Seconds(),
			float64(written)/el.Seconds(), s.Applied, s.Stale, s.Superseded, s.Writes, s.CatalogErrors)
	}

	// 3. Freshness: one size change at a time, from the broker's ack to the
	// account's drained total showing it (drain every 1 s).
	c, _ := runConsumer(t, Config{Brokers: brokers, Catalog: cat.client, Group: "bench-fresh", Consumers: 2})
	require.Eventually(t, func() bool { return c.Stats().Lag == 0 && c.Stats().Committed > 0 }, 10*time.Minute, 50*time.Millisecond)
	time.Sleep(1500 * time.Millisecond) // a drain passes before the freshness phase (a measurement)
	acct := owner[uuids[0]]
	var fresh []time.Duration
	for i := 0; i < 40; i++ {
		a, err := cat.client.Account(context.Background(), acct, raftmeta.LinearizableRead())
		require.NoError(t, err)
		var db fsm.Database
		db, err = cat.client.Database(context.Background(), uuids[0], raftmeta.LinearizableRead())
		require.NoError(t, err)
		seq++
		newSize := db.SizeBytes + 4096
		p.produce(event.Size{DatabaseUUID: uuids[0], AccountID: acct, SizeBytes: newSize, Seq: seq})
		sent := time.Now()
		want := a.StorageBytes + 4096
		for {
			got, err := cat.client.Account(context.Background(), acct, raftmeta.LinearizableRead())
			require.NoError(t, err)
			if got.StorageBytes == want {
				break
			}
			require.Less(t, time.Since(sent), 30*time.Second)
			time.Sleep(5 * time.Millisecond) // poll interval: until the drained total shows the change
		}
		fresh = append(fresh, time.Since(sent))
		time.Sleep(time.Duration(i%7) * 37 * time.Millisecond) // spread over the drain phase
	}
	sort.Slice(fresh, func(i, j int) bool { return fresh[i] < fresh[j] })
	t.Logf("freshness (size acked by the broker → drained account total), %d changes: p50 %v, p99 %v, max %v",
		len(fresh), fresh[len(fresh)/2].Round(time.Millisecond), fresh[len(fresh)*99/100].Round(time.Millisecond),
		fresh[len(fresh)-1].Round(time.Millisecond))
}
