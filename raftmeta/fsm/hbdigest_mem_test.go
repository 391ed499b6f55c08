package fsm

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// snapshotTableDigests writes a snapshot stream's payload to a file and
// reads its host_digests table, checking it against its databases table the
// way CheckSnapshot does.
func snapshotTableDigests(t *testing.T, snap []byte) map[string]map[int]BucketDigest {
	t.Helper()
	path := filepath.Join(t.TempDir(), "snap.db")
	require.NoError(t, os.WriteFile(path, payloadOf(snap), 0o600))
	db, err := sql.Open("sqlite3", "file:"+path+"?_query_only=1")
	require.NoError(t, err)
	defer db.Close()
	ctx := context.Background()
	require.NoError(t, checkHostDigests(ctx, db), "the snapshot's host_digests table")
	got, err := tableHostDigests(ctx, db)
	require.NoError(t, err)
	return got
}

func memoryDigests(t *testing.T, f *FSM) map[string]map[int]BucketDigest {
	t.Helper()
	return memoryDigestsTB(t, f)
}

func memoryDigestsTB(t testing.TB, f *FSM) map[string]map[int]BucketDigest {
	t.Helper()
	hosts, err := f.readDigestsPinned(func() error { return nil }, true)
	require.NoError(t, err)
	return digestView{hosts: hosts}.asMap()
}

// TestSnapshotsCarryTheDigestsInTheirTable: the digests live in memory, and
// a snapshot (or backup) holds them in its host_digests table exactly as
// the builds that wrote the table on every batch did, so a snapshot of
// either kind restores on either build. Restoring one loads them back into
// memory and leaves the live table empty. A snapshot is the state at
// Snapshot(), not at Persist(): batches applied in between (on the same
// host arrays, copied on write) do not leak into it.
func TestSnapshotsCarryTheDigestsInTheirTable(t *testing.T) {
	for _, mode := range []SnapshotMode{SnapshotBackup, SnapshotSerialize} {
		t.Run(fmt.Sprintf("mode %d", mode), func(t *testing.T) {
			f := newFSM(t, WithSnapshotMode(mode))
			d := newDriver(t, f)
			catalogWith(t, d)
			d.ok(CmdRegisterHost, RegisterHost{ID: "h2", Address: "10.0.0.2:1", Region: "enam", State: HostStateActive})
			d.ok(CmdRelocateDatabase, RelocateDatabase{UUID: uuidN(5), FromObjectID: "obj-" + uuidN(5), ObjectID: "moved", HostID: "h2"})
			want := memoryDigests(t, f)
			require.Len(t, want, 2, "two hosts hold databases")
			wantDump := dump(t, f)

			snap, err := f.Snapshot()
			require.NoError(t, err)
			// After the view, before Persist: change buckets of both hosts,
			// empty h2 (the host goes), add a host.
			for i := 21; i <= 60; i++ {
				d.ok(CmdCreateDatabase, createDB(uuidN(i), "a1", fmt.Sprintf("db%d", i)))
			}
			d.ok(CmdDeleteDatabase, DeleteDatabase{UUID: uuidN(5), AccountID: "a1"})
			d.ok(CmdDeleteDatabase, DeleteDatabase{UUID: uuidN(1), AccountID: "a1"})
			c := createDB(uuidN(61), "a1", "db61")
			c.HostID = "h3"
			d.ok(CmdCreateDatabase, c)
			checkInvariants(t, f)
			require.NotContains(t, memoryDigests(t, f), "h2")
			b := persistBytes(t, snap)
			snap.Release()

			assert.Equal(t, want, snapshotTableDigests(t, b), "the snapshot's table holds the digests at Snapshot()")
			g := newFSM(t)
			require.NoError(t, restoreBytes(g, b))
			checkInvariants(t, g) // memory matches the databases; live table empty
			assert.Equal(t, want, memoryDigests(t, g))
			assert.Equal(t, wantDump, dump(t, g))

			// And the live state at the end round-trips too.
			h := newFSM(t)
			require.NoError(t, restoreBytes(h, snapshotBytes(t, f)))
			checkInvariants(t, h)
			assert.Equal(t, memoryDigests(t, f), memoryDigests(t, h))
		})
	}
}

// TestWrongDigestsInMemoryAreCaught: digests in memory that do not match
// the databases table (a bug in their maintenance) are found by the
// invariant check, and a snapshot written from them is refused by
// CheckSnapshot, the check every uploaded backup passes.
func TestWrongDigestsInMemoryAreCaught(t *testing.T) {
	f := newFSM(t)
	catalogWith(t, newDriver(t, f))
	require.NoError(t, checkMemoryDigests(context.Background(), f))
	good := snapshotBytes(t, f)
	_, err := CheckSnapshot(context.Background(), bytesReader(good), t.TempDir())
	require.NoError(t, err)

	f.dig.mu.Lock()
	f.dig.add(map[digestKey]digestDelta{{"h1", DigestBucket(uuidN(7))}: {digest: 1, count: 0}})
	f.dig.mu.Unlock()
	err = checkMemoryDigests(context.Background(), f)
	require.Error(t, err)
	assert.Contains(t, err.Error(), `host digests do not match the databases table (host "h1"`)
	_, err = CheckSnapshot(context.Background(), bytesReader(snapshotBytes(t, f)), t.TempDir())
	require.ErrorIs(t, err, ErrInvalidSnapshot)
	assert.Contains(t, err.Error(), `host digests do not match the databases table (host "h1"`)
}

// TestHeartbeatDigestsReadOneAppliedState runs digest heartbeats while the
// apply goroutine creates databases one batch at a time on one host and
// takes snapshots (persisted on other goroutines, as raft does). Every
// answer must describe one applied state: the buckets that differ from an
// empty host are exactly those of the first n databases, where n is the
// account's active count in the same answer (read from SQLite in the same
// read transaction). Run it with -race: the digests are written by the
// apply goroutine and read by the others.
func TestHeartbeatDigestsReadOneAppliedState(t *testing.T) {
	const creates = 1200
	ctx := context.Background()
	f := newFSM(t, WithReadConns(4))
	d := newDriver(t, f)
	d.account("a1", 1<<30)
	empty := DigestQuery{HostID: "h1", Accounts: []string{"a1"}}
	for b := 0; b < DigestBuckets; b++ {
		empty.Buckets = append(empty.Buckets, BucketDigest{Bucket: b})
	}
	// bucketsAfter[n]: the non-empty buckets after the first n creates.
	bucketsAfter := make([][]int, creates+1)
	set := map[int]bool{}
	for n := 0; n <= creates; n++ {
		if n > 0 {
			set[DigestBucket(uuidN(n))] = true
		}
		for b := range set {
			bucketsAfter[n] = append(bucketsAfter[n], b)
		}
		slices.Sort(bucketsAfter[n])
		if bucketsAfter[n] == nil {
			bucketsAfter[n] = []int{}
		}
	}

	var done atomic.Bool
	var wg sync.WaitGroup
	var answers atomic.Int64
	for r := 0; r < 3; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !done.Load() {
				ans, err := f.HeartbeatDigests(ctx, empty)
				if !assert.NoError(t, err) {
					return
				}
				n := ans.Accounts["a1"].ActiveDatabases
				if !assert.Equal(t, bucketsAfter[n], ans.Differ, "answer at %d databases mixes two applied states", n) {
					return
				}
				answers.Add(1)
			}
		}()
	}
	for i := 1; i <= creates; i++ {
		d.ok(CmdCreateDatabase, createDB(uuidN(i), "a1", fmt.Sprintf("db%d", i)))
		if i%200 == 0 {
			snap, err := f.Snapshot()
			require.NoError(t, err)
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer snap.Release()
				persistBytes(t, snap)
			}()
		}
	}
	done.Store(true)
	wg.Wait()
	t.Logf("%d answers checked", answers.Load())
	require.Positive(t, answers.Load())
	checkInvariants(t, f)
}

// BenchmarkDigestsRestore measures what the digests in memory add to a
// restart: Restore of a snapshot whose host_digests table is full (every
// bucket of every host non-empty, which 1M databases on up to ~240 hosts
// make) loads them into memory. Reported per restore; compare hosts=0.
//
//	go test ./raftmeta/fsm -run XXX -bench DigestsRestore -benchtime 5x
func BenchmarkDigestsRestore(b *testing.B) {
	for _, hosts := range []int{0, 3, 100} {
		b.Run(fmt.Sprintf("hosts=%d", hosts), func(b *testing.B) {
			f := newFSM(b)
			batch := map[digestKey]digestDelta{}
			for h := 0; h < hosts; h++ {
				for bk := 0; bk < DigestBuckets; bk++ {
					batch[digestKey{fmt.Sprintf("host-%03d", h), bk}] = digestDelta{digest: int64(h*DigestBuckets + bk + 1), count: 3}
				}
			}
			f.dig.add(batch)
			snap := snapshotBytes(b, f)
			g := newFSM(b)
			b.ResetTimer()
			cpu0 := processCPU()
			for i := 0; i < b.N; i++ {
				require.NoError(b, restoreBytes(g, snap))
			}
			b.StopTimer()
			b.ReportMetric(float64((processCPU()-cpu0).Microseconds())/1e3/float64(b.N), "cpu-ms/restore")
			require.Len(b, memoryDigestsTB(b, g), hosts)
			b.ReportMetric(float64(len(snap))/1e6, "snapshot-MB")
		})
	}
}
