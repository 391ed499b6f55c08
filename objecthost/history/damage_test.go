package history

import (
	"bytes"
	"context"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// damagedS3Env is scrubEnv's database (three shipped batches of 20
// inserts) archived in gofakes3 over HTTP.
func damagedS3Env(t *testing.T) (*env, *s3Server, *S3Store, []Position) {
	srv, store := newS3(t)
	e := newEnv(t, store, CaptureOptions{CheckpointFrames: 8}, ShipperOptions{SnapshotMinBytes: 1 << 40})
	e.exec("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)")
	var points []Position
	for batch := 0; batch < 3; batch++ {
		for i := 0; i < 20; i++ {
			e.exec("INSERT INTO t(v) VALUES (?)", strings.Repeat("x", 200))
		}
		points = append(points, e.cap.Current())
		e.sync()
	}
	return e, srv, store, points
}

// spoil deletes the object at key, or overwrites it with one bit flipped
// (an S3 overwrite behind the host's back).
func spoil(t *testing.T, store Store, key, how string) {
	ctx := context.Background()
	if how == "deleted" {
		require.NoError(t, store.Delete(ctx, key))
		return
	}
	r, err := store.Get(ctx, key)
	require.NoError(t, err)
	b, err := io.ReadAll(r)
	r.Close()
	require.NoError(t, err)
	b[len(b)/2] ^= 0x40
	require.NoError(t, store.Put(ctx, key, bytes.NewReader(b), int64(len(b))))
}

// TestRestoreOfDamagedArchive: a restore (or a timestamp's resolution)
// that needs an object the store lost or damaged fails with a
// *DamageError naming the records that no longer restore and the last
// point before them that does (which restores), not with an error a
// caller cannot tell from a failing store; a store that is down, or cuts
// a read short, is not damage.
func TestRestoreOfDamagedArchive(t *testing.T) {
	for _, tc := range []struct{ what, how string }{
		{"segment", "deleted"}, {"segment", "corrupted"}, {"snapshot", "deleted"}, {"snapshot", "corrupted"},
	} {
		t.Run(tc.what+"-"+tc.how, func(t *testing.T) {
			e, _, store, points := damagedS3Env(t)
			ctx := context.Background()
			target := points[1]
			var lost segName
			if tc.what == "segment" {
				for _, k := range archiveKeys(t, store, e.key+"/", ".seg") {
					if n, ok := parseSegName(filepath.Base(k)); ok && n.First <= target.Txid && target.Txid <= n.Last {
						lost = n
						spoil(t, store, k, tc.how)
					}
				}
				require.NotZero(t, lost.Last)
			} else {
				snaps := archiveKeys(t, store, e.key+"/", ".snap")
				require.Len(t, snaps, 1, "the base only")
				spoil(t, store, snaps[0], tc.how)
			}

			_, err := e.archive.Restore(ctx, e.key, target, filepath.Join(t.TempDir(), "r.db"))
			require.ErrorIs(t, err, ErrDamaged)
			var de *DamageError
			require.ErrorAs(t, err, &de)
			assert.Equal(t, target.Gen, de.Gen)
			if tc.what == "segment" {
				assert.Equal(t, "records", de.What)
				if tc.how == "deleted" {
					assert.Equal(t, lost.First, de.FirstTxid)
					assert.Equal(t, lost.Last, de.LastTxid, "the hole is the lost segment")
				} else {
					// The records of the segment before the flipped bit
					// still replay.
					assert.GreaterOrEqual(t, de.FirstTxid, lost.First)
					assert.LessOrEqual(t, de.FirstTxid, target.Txid)
					assert.Equal(t, lost.Last, de.LastTxid)
				}
				assert.Equal(t, de.FirstTxid-1, de.After.Txid, "the last point before the damage")
				_, err := restoreDump(t, e.archive, e.key, de.After)
				require.NoError(t, err, "After restores")
				// A timestamp inside the damaged segment cannot be
				// resolved either (its records name the commit).
				if tc.how == "corrupted" {
					_, err = e.archive.Resolve(ctx, e.key, time.UnixMicro(target.TimeUs-1))
					assert.ErrorIs(t, err, ErrDamaged)
				}
			} else {
				assert.Equal(t, "snapshot", de.What)
				assert.Zero(t, de.After, "nothing before it restores")
			}
			assert.Contains(t, err.Error(), target.Gen)
		})
	}

	t.Run("store-down", func(t *testing.T) {
		e, srv, _, points := damagedS3Env(t)
		srv.down.Store(true)
		_, err := e.archive.Restore(context.Background(), e.key, points[1], filepath.Join(t.TempDir(), "r.db"))
		require.Error(t, err)
		assert.NotErrorIs(t, err, ErrDamaged, "an outage is not damage")
	})
	t.Run("short-read", func(t *testing.T) {
		for _, suffix := range []string{".seg", ".snap"} {
			store, err := NewDirStore(t.TempDir())
			require.NoError(t, err)
			cs := &cutStore{Store: store}
			e := newEnv(t, cs, CaptureOptions{CheckpointFrames: 8}, ShipperOptions{SnapshotMinBytes: 1 << 40})
			e.exec("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)")
			e.exec("INSERT INTO t(v) VALUES (?)", strings.Repeat("y", 3000))
			p := e.cap.Current()
			e.sync()
			cs.cut = suffix
			_, err = e.archive.Restore(context.Background(), e.key, p, filepath.Join(t.TempDir(), "r.db"))
			require.Error(t, err, suffix)
			assert.NotErrorIs(t, err, ErrDamaged, "%s: a read the store cut short is not damage", suffix)
		}
	})
}

// TestScrubFindsSupersededGenerationsNewestSegment: once a restore
// superseded a generation, its newest segment is named by nothing but the
// new generation's prev marker (keys.go), shipped before its base; the
// store losing that segment is found by a listing and reported as a lost
// range ending at the marker's record. The marker goes with its
// generation when retention sweeps it.
func TestScrubFindsSupersededGenerationsNewestSegment(t *testing.T) {
	_, store := newS3(t)
	e := newEnv(t, store, CaptureOptions{CheckpointFrames: 8}, ShipperOptions{SnapshotMinBytes: 1 << 40})
	e.exec("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)")
	e.exec("INSERT INTO t(v) VALUES ('one')")
	p1 := e.cap.Current()
	e.sync()
	e.exec("INSERT INTO t(v) VALUES ('two')")
	p2 := e.cap.Current()
	e.sync()
	restored, previous := e.restoreLive(p1)
	require.Equal(t, p2, previous)
	e.exec("INSERT INTO t(v) VALUES ('after')")
	e.cap.Current()
	e.sync()

	markers := archiveKeys(t, store, e.key+"/"+restored.Gen+"/prev/", ".prev")
	require.Len(t, markers, 1, "the new generation names the one it superseded")
	pn, ok := parsePrevName(filepath.Base(markers[0]))
	require.True(t, ok)
	assert.Equal(t, prevName{Gen: p2.Gen, Txid: p2.Txid, TimeUs: p2.TimeUs}, pn)
	require.False(t, e.scrub(-1).Damage(), "a clean archive")

	// The superseded generation's newest segment is lost.
	var lost segName
	for _, k := range archiveKeys(t, store, e.key+"/"+p2.Gen+"/seg/", ".seg") {
		if n, ok := parseSegName(filepath.Base(k)); ok && n.Last == p2.Txid {
			lost = n
			spoil(t, store, k, "deleted")
		}
	}
	require.NotZero(t, lost.Last)
	rep := e.scrub(0)
	require.True(t, rep.Damage(), "found by a listing")
	assert.True(t, rep.Current, "the current generation is whole")
	require.Len(t, rep.Lost, 1, "%+v", rep.Lost)
	assert.Equal(t, p2.Gen, rep.Lost[0].Gen)
	assert.Equal(t, lost.First, rep.Lost[0].FirstTxid)
	assert.Equal(t, p2.Txid, rep.Lost[0].LastTxid, "up to what the marker names")

	// Retention sweeps the superseded generation: its marker (in the
	// new generation) stays and claims nothing any more.
	_, err := e.archive.Sweep(context.Background(), e.key, time.UnixMicro(restored.TimeUs))
	require.NoError(t, err)
	assert.Empty(t, archiveKeys(t, store, e.key+"/"+p2.Gen+"/", ""), "the old generation is gone")
	sh, err := ShippedOf(e.copts.StagingDir, StagingArea{Key: e.key})
	require.NoError(t, err)
	rep, err = e.archive.Scrub(context.Background(), e.key, sh, ScrubOptions{Sample: -1, Cutoff: time.UnixMicro(restored.TimeUs)})
	require.NoError(t, err)
	assert.False(t, rep.Damage(), "%+v", rep)
}

// TestScrubFindsLostSupersededGeneration: every object of a superseded
// generation lost (its base snapshot and every segment): the listing shows
// nothing of it, the next generation's prev marker still names it.
func TestScrubFindsLostSupersededGeneration(t *testing.T) {
	_, store := newS3(t)
	e := newEnv(t, store, CaptureOptions{CheckpointFrames: 8}, ShipperOptions{SnapshotMinBytes: 1 << 40})
	e.exec("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)")
	e.exec("INSERT INTO t(v) VALUES ('one')")
	p1 := e.cap.Current()
	e.sync()
	restored, previous := e.restoreLive(p1)
	e.sync()
	require.False(t, e.scrub(-1).Damage())
	for _, k := range archiveKeys(t, store, e.key+"/"+previous.Gen+"/", "") {
		spoil(t, store, k, "deleted")
	}
	rep := e.scrub(0)
	require.True(t, rep.Damage())
	assert.True(t, rep.Current)
	require.Len(t, rep.Lost, 1, "%+v", rep.Lost)
	assert.Equal(t, LostRange{Gen: previous.Gen, FirstTxid: 0, LastTxid: previous.Txid}, rep.Lost[0])
	assert.NotEqual(t, restored.Gen, previous.Gen)
}
