package history

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// scrubEnv is a database with three shipped batches of 20 inserts, one
// segment each at least, and the position after each batch.
func scrubEnv(t *testing.T, snapAfterFirst bool) (*env, *DirStore, []Position) {
	store, err := NewDirStore(t.TempDir())
	require.NoError(t, err)
	e := newEnv(t, store, CaptureOptions{CheckpointFrames: 8}, ShipperOptions{SnapshotMinBytes: 1 << 40})
	e.exec("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)")
	var points []Position
	for batch := 0; batch < 3; batch++ {
		for i := 0; i < 20; i++ {
			e.exec("INSERT INTO t(v) VALUES (?)", strings.Repeat("x", 200))
		}
		if batch == 0 && snapAfterFirst {
			ok, err := e.cap.Snapshot()
			require.NoError(t, err)
			require.True(t, ok)
		}
		p := e.cap.Current() // every commit captured…
		e.sync()             // …and shipped
		points = append(points, p)
	}
	return e, store, points
}

func (e *env) scrub(sample int) ScrubReport {
	e.t.Helper()
	sh, err := ShippedOf(e.copts.StagingDir, StagingArea{Key: e.key})
	require.NoError(e.t, err)
	require.True(e.t, sh.OK, "the staging area names what was shipped")
	rep, err := e.archive.Scrub(context.Background(), e.key, sh, ScrubOptions{Sample: sample})
	require.NoError(e.t, err)
	return rep
}

func archiveKeys(t *testing.T, store Store, prefix, suffix string) []string {
	keys, err := store.List(context.Background(), prefix)
	require.NoError(t, err)
	var out []string
	for _, k := range keys {
		if strings.HasSuffix(k, suffix) {
			out = append(out, k)
		}
	}
	return out
}

// damage deletes the object at key or flips a bit in it.
func damage(t *testing.T, store *DirStore, key, how string) {
	path := filepath.Join(store.root, filepath.FromSlash(key))
	if how == "deleted" {
		require.NoError(t, store.Delete(context.Background(), key))
		return
	}
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	bad := append([]byte(nil), b...)
	bad[len(bad)/2] ^= 0x40
	require.NoError(t, os.WriteFile(path, bad, 0o644))
}

func restoreDump(t *testing.T, a *Archive, key string, p Position) (string, error) {
	got := filepath.Join(t.TempDir(), "r.db")
	if _, err := a.Restore(context.Background(), key, p, got); err != nil {
		return "", err
	}
	return dumpFile(t, got), nil
}

// A segment lost or damaged behind the host's back (the middle one, or
// the newest, which only the host's own record of what it shipped can
// miss) is found by one pass, the lost range is named, a rebase heals the
// current point, and the points before the hole and after the rebase
// restore exactly.
func TestScrubSegmentLostOrDamaged(t *testing.T) {
	for _, tc := range []struct{ how, which string }{
		{"deleted", "middle"}, {"corrupted", "middle"}, {"deleted", "newest"}, {"corrupted", "newest"},
	} {
		t.Run(tc.how+"-"+tc.which, func(t *testing.T) {
			e, store, points := scrubEnv(t, false)
			clean := e.scrub(-1)
			require.False(t, clean.Damage(), "%+v", clean)
			before, err := restoreDump(t, e.archive, e.key, points[0])
			require.NoError(t, err)

			target := points[1]
			if tc.which == "newest" {
				target = points[2]
			}
			var lost segName
			for _, k := range archiveKeys(t, store, e.key+"/", ".seg") {
				if n, ok := parseSegName(filepath.Base(k)); ok && n.First <= target.Txid && target.Txid <= n.Last {
					lost = n
					damage(t, store, k, tc.how)
				}
			}
			require.NotZero(t, lost.Last)

			sample := 0 // a listing finds what is gone
			if tc.how == "corrupted" {
				sample = -1 // damage under the same name needs a read
			}
			rep := e.scrub(sample)
			require.True(t, rep.Damage(), "found in one pass")
			assert.False(t, rep.Current, "the shipped point no longer restores")
			require.Len(t, rep.Lost, 1, "%+v", rep.Lost)
			lr := rep.Lost[0]
			assert.Equal(t, points[0].Gen, lr.Gen)
			assert.Equal(t, lost.First, lr.FirstTxid, "the lost range starts with the lost records")
			assert.Equal(t, points[2].Txid, lr.LastTxid, "and runs to the last shipped point")
			assert.Equal(t, lost.First-1, lr.After.Txid, "the last point that restores")
			assert.Zero(t, lr.Until, "nothing restores after it yet")
			if tc.how == "corrupted" {
				assert.Len(t, rep.Damaged, 1)
			} else {
				assert.NotEmpty(t, rep.Missing)
			}

			// Heal: a snapshot at the current point, shipped.
			healed, err := e.cap.Rebase()
			require.NoError(t, err)
			e.sync()
			rep = e.scrub(-1)
			assert.True(t, rep.Current, "healed")
			require.Len(t, rep.Lost, 1, "%+v", rep.Lost)
			assert.Equal(t, LostRange{Gen: lr.Gen, FirstTxid: lost.First, LastTxid: healed.Txid - 1, After: lr.After, Until: healed}, rep.Lost[0],
				"the damage stays named, now ending before the healed point")

			// Writes after the heal restore exactly; so does the healed
			// point and the point before the hole.
			e.exec("INSERT INTO t(v) VALUES ('after')")
			last := e.cap.Current()
			e.sync()
			rep = e.scrub(-1)
			assert.True(t, rep.Current)
			assert.Equal(t, healed.Txid-1, rep.Lost[0].LastTxid, "the lost range does not grow")
			_, err = e.archive.Verify(context.Background(), e.key)
			assert.ErrorIs(t, err, ErrCorrupt, "Verify sees the damage")
			vs, err := e.archive.VerifyExcept(context.Background(), e.key, rep.Lost, rep.Damaged)
			require.NoError(t, err, "the archive verifies from the healed point on")
			assert.Equal(t, last, vs.Last)
			e.close()
			got, err := restoreDump(t, e.archive, e.key, last)
			require.NoError(t, err)
			assert.Equal(t, dumpFile(t, e.path), got, "the newest point restores exactly")
			_, err = restoreDump(t, e.archive, e.key, healed)
			require.NoError(t, err, "the healed point restores")
			again, err := restoreDump(t, e.archive, e.key, points[0])
			require.NoError(t, err, "a point before the hole")
			assert.Equal(t, before, again)
			if tc.which == "middle" {
				_, err = restoreDump(t, e.archive, e.key, points[1])
				assert.ErrorIs(t, err, ErrCorrupt, "a point inside the lost range")
			}
		})
	}
}

// A snapshot lost or damaged: the generation's base, when a later
// snapshot exists (the points between no longer restore; the later ones
// do, nothing to heal) or when it is the only one (nothing restores: the
// host heals); a later snapshot whose records are all still there (no
// point is lost: a restore falls back to the older snapshot).
func TestScrubSnapshotLostOrDamaged(t *testing.T) {
	for _, how := range []string{"deleted", "corrupted"} {
		t.Run(how+"-base-with-later-snapshot", func(t *testing.T) {
			e, store, points := scrubEnv(t, true)
			snaps := archiveKeys(t, store, e.key+"/", ".snap")
			require.Len(t, snaps, 2)
			damage(t, store, snaps[0], how) // the base (txid 0)
			mid, ok := parseSnapName(filepath.Base(snaps[1]))
			require.True(t, ok)
			rep := e.scrub(-1)
			require.True(t, rep.Damage())
			assert.True(t, rep.Current, "the current point restores from the later snapshot")
			require.Len(t, rep.Lost, 1, "%+v", rep.Lost)
			assert.Equal(t, LostRange{Gen: points[0].Gen, FirstTxid: 0, LastTxid: mid.Txid - 1,
				Until: Position{Gen: points[0].Gen, Txid: mid.Txid, TimeUs: mid.TimeUs}}, rep.Lost[0])
			_, err := restoreDump(t, e.archive, e.key, points[2])
			require.NoError(t, err, "a point after the later snapshot")
		})
		t.Run(how+"-base-only", func(t *testing.T) {
			e, store, points := scrubEnv(t, false)
			snaps := archiveKeys(t, store, e.key+"/", ".snap")
			require.Len(t, snaps, 1)
			damage(t, store, snaps[0], how)
			sample := 0
			if how == "corrupted" {
				sample = -1
			}
			rep := e.scrub(sample)
			require.True(t, rep.Damage(), "found in one pass")
			assert.False(t, rep.Current)
			require.Len(t, rep.Lost, 1)
			assert.Equal(t, LostRange{Gen: points[0].Gen, FirstTxid: 0, LastTxid: points[2].Txid}, rep.Lost[0])
			healed, err := e.cap.Rebase()
			require.NoError(t, err)
			e.sync()
			rep = e.scrub(-1)
			assert.True(t, rep.Current, "healed")
			require.Len(t, rep.Lost, 1)
			assert.Equal(t, healed, rep.Lost[0].Until)
			e.exec("INSERT INTO t(v) VALUES ('after')")
			last := e.cap.Current()
			e.sync()
			e.close()
			got, err := restoreDump(t, e.archive, e.key, last)
			require.NoError(t, err)
			assert.Equal(t, dumpFile(t, e.path), got, "the newest point restores exactly")
		})
		t.Run(how+"-later-snapshot-redundant", func(t *testing.T) {
			e, store, points := scrubEnv(t, true)
			snaps := archiveKeys(t, store, e.key+"/", ".snap")
			require.Len(t, snaps, 2)
			damage(t, store, snaps[1], how)
			rep := e.scrub(-1)
			assert.Empty(t, rep.Lost, "every point still restores from the base and the records")
			assert.True(t, rep.Current)
			if how == "corrupted" {
				assert.Equal(t, []string{snaps[1]}, rep.Damaged, "the damaged object is named")
			}
			e.close()
			got, err := restoreDump(t, e.archive, e.key, points[2])
			require.NoError(t, err, "a restore past the damaged snapshot falls back to the base")
			assert.Equal(t, dumpFile(t, e.path), got)
		})
	}
}

// The snapshot of the current point itself lost (with the base, so that
// nothing restores): the rebase writes that snapshot again, under the
// same name, even though the capturer already took one there.
func TestScrubRebaseRewritesTheCurrentSnapshot(t *testing.T) {
	e, store, points := scrubEnv(t, false)
	ok, err := e.cap.Snapshot()
	require.NoError(t, err)
	require.True(t, ok)
	e.sync()
	for _, k := range archiveKeys(t, store, e.key+"/", ".snap") {
		damage(t, store, k, "deleted")
	}
	rep := e.scrub(0)
	require.False(t, rep.Current)
	healed, err := e.cap.Rebase()
	require.NoError(t, err)
	assert.Equal(t, points[2], healed, "no commit since: the same point")
	e.sync()
	rep = e.scrub(-1)
	assert.True(t, rep.Current, "healed")
	e.close()
	got, err := restoreDump(t, e.archive, e.key, points[2])
	require.NoError(t, err)
	assert.Equal(t, dumpFile(t, e.path), got)
}

// A store that answers 503 is an outage: Scrub fails, it reports no
// damage (the host then neither alarms nor rebases).
func TestScrubStoreDownIsNotDamage(t *testing.T) {
	srv, store := newS3(t)
	e := newEnv(t, store, CaptureOptions{CheckpointFrames: 8}, ShipperOptions{SnapshotMinBytes: 1 << 40})
	e.exec("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)")
	e.exec("INSERT INTO t(v) VALUES ('a')")
	e.sync()
	require.False(t, e.scrub(-1).Damage())
	srv.down.Store(true)
	sh, err := ShippedOf(e.copts.StagingDir, StagingArea{Key: e.key})
	require.NoError(t, err)
	rep, err := e.archive.Scrub(context.Background(), e.key, sh, ScrubOptions{Sample: -1})
	require.Error(t, err)
	assert.NotErrorIs(t, err, ErrCorrupt)
	assert.False(t, rep.Damage(), "%+v", rep)
	srv.down.Store(false)
	require.False(t, e.scrub(-1).Damage())
}

// A read cut short by the store is the store's failure, not damage.
func TestScrubShortReadIsNotDamage(t *testing.T) {
	for _, suffix := range []string{".seg", ".snap"} {
		t.Run(suffix, func(t *testing.T) {
			store, err := NewDirStore(t.TempDir())
			require.NoError(t, err)
			cs := &cutStore{Store: store}
			e := newEnv(t, cs, CaptureOptions{CheckpointFrames: 8}, ShipperOptions{SnapshotMinBytes: 1 << 40})
			e.exec("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)")
			e.exec("INSERT INTO t(v) VALUES (?)", strings.Repeat("y", 3000))
			e.cap.Current()
			e.sync()
			cs.cut = suffix
			sh, err := ShippedOf(e.copts.StagingDir, StagingArea{Key: e.key})
			require.NoError(t, err)
			rep, err := e.archive.Scrub(context.Background(), e.key, sh, ScrubOptions{Sample: -1})
			require.Error(t, err)
			assert.NotErrorIs(t, err, ErrCorrupt)
			assert.False(t, rep.Damage(), "%+v", rep)
		})
	}
}

// cutStore's Get streams of keys ending in cut fail after a few bytes.
type cutStore struct {
	Store
	cut string
}

func (s *cutStore) Get(ctx context.Context, key string) (rc io.ReadCloser, err error) {
	rc, err = s.Store.Get(ctx, key)
	if err != nil || s.cut == "" || !strings.HasSuffix(key, s.cut) {
		return rc, err
	}
	return &cutReader{rc: rc, left: 70}, nil
}

type cutReader struct {
	rc   io.ReadCloser
	left int
}

func (r *cutReader) Read(p []byte) (int, error) {
	if r.left <= 0 {
		return 0, errors.New("connection reset by peer")
	}
	if len(p) > r.left {
		p = p[:r.left]
	}
	n, err := r.rc.Read(p)
	r.left -= n
	return n, err
}

func (r *cutReader) Close() error { return r.rc.Close() }

// BenchmarkScrub: one database's scrub (Archive.Scrub, as the host runs it
// once per database per pass) against gofakes3 over HTTP on loopback (in
// process: the CPU reported includes the store's side) and a directory
// store. Each archive is a copy of one real database's: its base snapshot
// and the segments of 6 shipments (60 inserts). Reports store requests,
// bytes read and the process's CPU per database checked, by sample size
// (0: the listing only; 1: the default; -1: every object read).
//
//	go test -run '^$' -bench BenchmarkScrub -benchtime 400x ./objecthost/history/
func BenchmarkScrub(b *testing.B) {
	src, err := NewDirStore(b.TempDir())
	require.NoError(b, err)
	e := newEnv(b, src, CaptureOptions{CheckpointFrames: 8}, ShipperOptions{SnapshotMinBytes: 1 << 40})
	e.exec("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)")
	for batch := 0; batch < 6; batch++ {
		for i := 0; i < 10; i++ {
			e.exec("INSERT INTO t(v) VALUES (?)", strings.Repeat("x", 200))
		}
		e.cap.Current()
		e.sync()
	}
	e.close()
	keys, err := src.List(context.Background(), e.key+"/")
	require.NoError(b, err)
	const dbs = 200
	for _, kind := range []string{"s3", "dir"} {
		var store Store
		var srv *s3Server
		if kind == "s3" {
			srv, store = newS3(b)
		} else {
			ds, err := NewDirStore(b.TempDir())
			require.NoError(b, err)
			store = ds
		}
		for i := range dbs {
			for _, k := range keys {
				r, err := src.Get(context.Background(), k)
				require.NoError(b, err)
				body, err := io.ReadAll(r)
				r.Close()
				require.NoError(b, err)
				nk := fmt.Sprintf("db%04d", i) + strings.TrimPrefix(k, e.key)
				require.NoError(b, store.Put(context.Background(), nk, bytes.NewReader(body), int64(len(body))))
			}
		}
		a := NewArchive(store)
		for _, sample := range []int{0, 1, -1} {
			b.Run(fmt.Sprintf("store=%s/sample=%d", kind, sample), func(b *testing.B) {
				var reqs0 int64
				if srv != nil {
					reqs0 = srv.reqs.Load()
				}
				var read int64
				objects := 0
				cpu0 := cpuTime()
				b.ResetTimer()
				for i := range b.N {
					rep, err := a.Scrub(context.Background(), fmt.Sprintf("db%04d", i%dbs), Shipped{}, ScrubOptions{Sample: sample})
					if err != nil || rep.Damage() {
						b.Fatalf("%v %+v", err, rep)
					}
					read += rep.ReadBytes
					objects = rep.Objects
				}
				b.StopTimer()
				cpu := cpuTime() - cpu0
				b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/db")
				b.ReportMetric(float64(read)/float64(b.N), "read-B/db")
				b.ReportMetric(float64(objects), "objects/db")
				if srv != nil {
					b.ReportMetric(float64(srv.reqs.Load()-reqs0)/float64(b.N), "requests/db")
				}
			})
		}
	}
}
