package history

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/objecthost/sqlexec"
)

// TestStagingPerObjectRelocatedBack: a database relocated away from a host
// and back (A→B→A) has two objects on that host: the superseded one, whose
// staging still holds commits the archive never received (the host was
// cut off), and the new one, restored from the archive. Each has its own
// staging area: the new object's restore, interrupted by a crash after its
// checkpoint, is completed by the new object's capturer only, never by the
// old one's recovery at the host's start (with one shared area it was:
// that recovery wrote the new generation's tip as finished without
// swapping the restored file in, so the new object would have opened an
// empty file under a history claiming the restored state); the old
// object's unshipped commits stay and ship as its own generation; both
// lineages verify in the archive.
func TestStagingPerObjectRelocatedBack(t *testing.T) {
	ctx := context.Background()
	store, err := NewDirStore(t.TempDir())
	require.NoError(t, err)
	e := newEnv(t, store, CaptureOptions{StagingName: "o1"}, ShipperOptions{})
	e.exec("CREATE TABLE t(v)")
	e.exec("INSERT INTO t VALUES ('archived')")
	e.cap.Current() // waits for capture: Sync ships what was captured
	e.sync()
	archived, err := e.archive.Latest(ctx, e.key)
	require.NoError(t, err)
	archivedDump := dumpDB(t, e.db)
	// Host A is cut off: these commits stay in o1's staging only.
	e.exec("INSERT INTO t VALUES ('only on A')")
	o1Last := e.cap.Current()
	require.NoError(t, e.cap.Flush())
	require.NoError(t, e.db.Close())
	e.cancel()
	<-e.done
	e.ship.Remove(e.cap)
	require.NoError(t, e.cap.Close())
	e.db = nil
	o1Dir := filepath.Join(e.copts.StagingDir, e.key, "o1")
	o1Before := listTree(t, o1Dir)

	// The database comes back to A as object o3, restored from the archive
	// (its last archived commit); the restore crashes after its checkpoint.
	path3 := filepath.Join(e.dir, "data", "o3.db")
	o3 := CaptureOptions{StagingDir: e.copts.StagingDir, StagingName: "o3"}
	tmp := path3 + ".restore-tmp"
	var st RestoreStats
	require.NoError(t, e.archive.build(ctx, e.key, archived, tmp, &st))
	l, err := openLocalLog(o3.StagingDir, e.key, o3.StagingName)
	require.NoError(t, err)
	_, _, err = l.recover()
	require.NoError(t, err)
	f, err := os.Open(tmp)
	require.NoError(t, err)
	ps, pages, err := dbFileInfo(f)
	require.NoError(t, err)
	base := snapHeader{PageSize: uint32(ps), DBSize: pages, TimeUs: o1Last.TimeUs + 1_000_000}
	gen3 := genID(base.TimeUs)
	require.NoError(t, l.startGeneration(gen3, base, func(w *os.File) error { return writeSnapshot(w, base, (&dbImage{db: f, pageSize: ps}).readPage) },
		tip{Last: recordHeader{PageSize: uint32(ps), DBSize: pages, TimeUs: base.TimeUs}, Settled: true, Restore: filepath.Base(tmp)}))
	f.Close()
	l.close()

	// Host A starts: every staging area is recovered and sealed, o1's first.
	areas, err := StagingAreas(e.copts.StagingDir)
	require.NoError(t, err)
	assert.ElementsMatch(t, []StagingArea{{Key: e.key, Name: "o1"}, {Key: e.key, Name: "o3"}}, areas)
	c1, err := NewCapturer(e.key, e.path, CaptureOptions{StagingDir: e.copts.StagingDir, StagingName: "o1"})
	require.NoError(t, err)
	require.NoError(t, c1.SealForShipping())
	_, err = os.Stat(tmp)
	require.NoError(t, err, "o1's recovery must leave o3's interrupted restore alone")
	assert.NoFileExists(t, path3)

	// o3 opens: its capturer completes its restore; it serves the archived
	// state and captures on top of it.
	ship := NewShipper(store, e.sopts)
	c3, err := NewCapturer(e.key, path3, o3)
	require.NoError(t, err)
	db3, err := sqlexec.Open(path3, sqlexec.Options{ReadConns: 1})
	require.NoError(t, err)
	require.NoError(t, c3.Attach(ctx, db3))
	assert.Equal(t, archivedDump, dumpDB(t, db3))
	assert.Equal(t, gen3, c3.Current().Gen)
	assert.Equal(t, int64(0), c3.Stats().Generations, "continuity with the restored generation")
	_, err = execOn(db3, "INSERT INTO t VALUES ('on A again')")
	require.NoError(t, err)
	require.NoError(t, c3.Flush())
	require.NoError(t, db3.Close())
	want3 := dumpFile(t, path3)
	require.NoError(t, ship.Sync(ctx, c3))
	require.NoError(t, c3.Close())

	// o1's staging was only sealed (same records, open.seg renamed), then
	// it ships as its own lineage; both verify, each restores to its end.
	assert.Equal(t, len(o1Before), len(listTree(t, o1Dir)))
	require.NoError(t, ship.Sync(ctx, c1))
	vs, err := e.archive.Verify(ctx, e.key)
	require.NoError(t, err)
	assert.Equal(t, 2, vs.Generations)
	got := filepath.Join(t.TempDir(), "o1.db")
	_, err = e.archive.Restore(ctx, e.key, o1Last, got)
	require.NoError(t, err)
	assert.Contains(t, dumpFile(t, got), "only on A")
	latest, err := e.archive.Latest(ctx, e.key)
	require.NoError(t, err)
	assert.Equal(t, gen3, latest.Gen)
	got3 := filepath.Join(t.TempDir(), "o3.db")
	_, err = e.archive.Restore(ctx, e.key, latest, got3)
	require.NoError(t, err)
	assert.Equal(t, want3, dumpFile(t, got3))
}

// TestMigrateStaging: a staging area of the former per-database layout
// moves into its object's area at a host's start, and the object's
// capturer continues its generation (no new one) and ships what it held.
func TestMigrateStaging(t *testing.T) {
	ctx := context.Background()
	store, err := NewDirStore(t.TempDir())
	require.NoError(t, err)
	e := newEnv(t, store, CaptureOptions{}, ShipperOptions{}) // former layout
	e.exec("CREATE TABLE t(v)")
	e.exec("INSERT INTO t VALUES (1)")
	require.NoError(t, e.cap.Flush())
	require.NoError(t, e.db.Close())
	e.cancel()
	<-e.done
	e.ship.Remove(e.cap)
	require.NoError(t, e.cap.Close())
	e.db = nil
	gen := e.cap.Current().Gen

	areas, err := StagingAreas(e.copts.StagingDir)
	require.NoError(t, err)
	assert.Equal(t, []StagingArea{{Key: e.key}}, areas)
	n, err := MigrateStaging(e.copts.StagingDir, e.key, "obj1")
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	areas, err = StagingAreas(e.copts.StagingDir)
	require.NoError(t, err)
	assert.Equal(t, []StagingArea{{Key: e.key, Name: "obj1"}}, areas)

	e.copts.StagingName = "obj1"
	e.open()
	assert.Equal(t, gen, e.cap.Current().Gen)
	assert.Equal(t, int64(0), e.cap.Stats().Generations, "the migrated generation continues")
	e.exec("INSERT INTO t VALUES (2)")
	e.close()
	want := dumpFile(t, e.path)
	vs, err := e.archive.Verify(ctx, e.key)
	require.NoError(t, err)
	assert.Equal(t, 1, vs.Generations)
	latest, err := e.archive.Latest(ctx, e.key)
	require.NoError(t, err)
	got := filepath.Join(t.TempDir(), "r.db")
	_, err = e.archive.Restore(ctx, e.key, latest, got)
	require.NoError(t, err)
	assert.Equal(t, want, dumpFile(t, got))
}

func listTree(t *testing.T, dir string) []string {
	var out []string
	require.NoError(t, filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if !fi.IsDir() {
			out = append(out, p)
		}
		return nil
	}))
	return out
}

// TestSealInterruptedRecovered: a crash in the middle of a seal leaves
// sealing.seg (open.seg renamed, its fsyncs not done) and a new open.seg
// with the records after it. Recovery finishes the seal and keeps
// appending to open.seg; if sealing.seg lost its tail (an OS crash) the
// later records in open.seg cannot follow and are dropped (their frames
// are still in the WAL for attach to capture again), never kept behind a
// gap.
func TestSealInterruptedRecovered(t *testing.T) {
	recs := func(from, to uint64) []byte {
		var b []byte
		for id := from; id <= to; id++ {
			b, _ = encodeRecord(b, recordHeader{PageSize: 512, DBSize: 1, Txid: id, TimeUs: int64(id)}, map[uint32][]byte{1: bytes.Repeat([]byte{byte(id)}, 512)})
		}
		return b
	}
	for _, torn := range []bool{false, true} {
		root := t.TempDir()
		gen := genID(1)
		dir := filepath.Join(root, "db", "obj", gen)
		require.NoError(t, os.MkdirAll(dir, 0o755))
		sealing := recs(1, 3)
		if torn {
			sealing = sealing[:len(sealing)-10]
		}
		require.NoError(t, os.WriteFile(filepath.Join(dir, sealingName), sealing, 0o644))
		require.NoError(t, os.WriteFile(filepath.Join(dir, "open.seg"), recs(4, 5), 0o644))
		pending, err := StagingPending(root, StagingArea{Key: "db", Name: "obj"})
		require.NoError(t, err)
		assert.True(t, pending)

		l, err := openLocalLog(root, "db", "obj")
		require.NoError(t, err)
		st, ok, err := l.recover()
		require.NoError(t, err)
		require.True(t, ok)
		assert.NoFileExists(t, filepath.Join(dir, sealingName))
		files, err := l.pending("db")
		require.NoError(t, err)
		require.Len(t, files, 1)
		if torn {
			assert.Equal(t, uint64(2), st.Last.Txid)
			assert.Equal(t, filepath.Join(dir, hex16(1)+"-"+hex16(2)+"-"+hex16(2)+".seg"), files[0].path)
			assert.NoFileExists(t, filepath.Join(dir, "open.seg"), "records after a gap are dropped")
			assert.Nil(t, l.open)
		} else {
			assert.Equal(t, uint64(5), st.Last.Txid)
			assert.Equal(t, filepath.Join(dir, hex16(1)+"-"+hex16(3)+"-"+hex16(3)+".seg"), files[0].path)
			require.NotNil(t, l.open)
			assert.Equal(t, uint64(4), l.openFirst.Txid)
		}
		require.NoError(t, l.close())
	}
}

// TestSealFailureFinishedByNextSeal: a seal whose fsync fails leaves its
// records in sealing.seg; capture goes on appending to a new open.seg;
// the next seal first finishes the failed one, so the later sealing.seg
// never replaces it: both segments are there, every record once.
func TestSealFailureFinishedByNextSeal(t *testing.T) {
	root := t.TempDir()
	l, err := openLocalLog(root, "db", "obj")
	require.NoError(t, err)
	gen := genID(1)
	require.NoError(t, l.startGeneration(gen, snapHeader{PageSize: 512, TimeUs: 1}, func(*os.File) error { return nil },
		tip{Last: recordHeader{PageSize: 512, TimeUs: 1}, Settled: true}))
	var prev recordHeader
	appendTx := func(from, to uint64) {
		var b []byte
		var first recordHeader
		for id := from; id <= to; id++ {
			var h recordHeader
			b, h = encodeRecord(b, recordHeader{PageSize: 512, DBSize: 1, PrevCRC: prev.CRC, Txid: id, TimeUs: int64(id) + 1}, map[uint32][]byte{1: bytes.Repeat([]byte{byte(id)}, 512)})
			if id == from {
				first = h
			}
			prev = h
		}
		_, err := l.appendBatch(b, first, prev)
		require.NoError(t, err)
	}
	appendTx(1, 3)
	sealSyncErr = func() error { return errors.New("injected fsync failure") }
	_, err = l.seal()
	sealSyncErr = nil
	require.Error(t, err)
	dir := filepath.Join(root, "db", "obj", gen)
	assert.FileExists(t, filepath.Join(dir, sealingName))
	appendTx(4, 5)
	require.NoError(t, l.sync(), "sync fsyncs the stuck sealing.seg too")
	sealed, err := l.seal()
	require.NoError(t, err)
	assert.True(t, sealed)
	assert.NoFileExists(t, filepath.Join(dir, sealingName))
	files, err := l.pending("db")
	require.NoError(t, err)
	var segs []string
	var txids []uint64
	for _, f := range files {
		if f.isSnap {
			continue
		}
		segs = append(segs, filepath.Base(f.path))
		fh, err := os.Open(f.path)
		require.NoError(t, err)
		_, err = readRecords(fh, false, func(h recordHeader, _ []page) error { txids = append(txids, h.Txid); return nil })
		fh.Close()
		require.NoError(t, err)
	}
	assert.Equal(t, []string{hex16(1) + "-" + hex16(3) + "-" + hex16(4) + ".seg", hex16(4) + "-" + hex16(5) + "-" + hex16(6) + ".seg"}, segs)
	assert.Equal(t, []uint64{1, 2, 3, 4, 5}, txids)
	require.NoError(t, l.close())
	// The tip names the last record.
	l2, err := openLocalLog(root, "db", "obj")
	require.NoError(t, err)
	st, ok, err := l2.recover()
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, uint64(5), st.Last.Txid)
}

// TestSealENOSPCLastCommitsShipped: the disk fills while a database
// writes (found by the random schedule seed 1796218103641371752,
// disk-full): a seal renames open.seg to sealing.seg and then fails to
// write the tip (ENOSPC at its temp file), and no commit follows. Once the
// disk has room again the shipper must finish that seal and ship its
// records: the archive ends equal to the database, and the shipper reports
// no backlog only then. (It used to seal only when open.seg had records:
// with open.seg empty the failed seal was never finished, sealing.seg
// never shipped, and idle() reported the log shipped, lag 0 and no
// backlog, while the archive lacked the last acknowledged commits.)
func TestSealENOSPCLastCommitsShipped(t *testing.T) {
	ctx := context.Background()
	store, err := NewDirStore(t.TempDir())
	require.NoError(t, err)
	e := newEnv(t, store, CaptureOptions{}, ShipperOptions{MaxLag: 200 * time.Millisecond})
	t.Cleanup(func() { tipWriteENOSPC.Store(false) })
	e.exec("CREATE TABLE t(v INTEGER PRIMARY KEY)")
	e.exec("INSERT INTO t VALUES (1)")
	e.cap.Current()
	e.sync()

	// The disk is full: commits go on (their appends are not what fails
	// here), every seal fails: the first after its rename, the next ones
	// finishing it.
	tipWriteENOSPC.Store(true)
	e.exec("INSERT INTO t VALUES (2)")
	e.cap.Current()
	err = e.ship.Sync(ctx, e.cap)
	require.ErrorIs(t, err, syscall.ENOSPC)
	e.exec("INSERT INTO t VALUES (3)")
	e.cap.Current()
	require.ErrorIs(t, e.ship.Sync(ctx, e.cap), syscall.ENOSPC)
	// The disk has room again for one seal: it finishes the failed one
	// and seals 3; then it is full again for the last commit's seal.
	tipWriteENOSPC.Store(false)
	e.sync()
	e.exec("INSERT INTO t VALUES (4)")
	want := e.cap.Current()
	tipWriteENOSPC.Store(true)
	require.ErrorIs(t, e.ship.Sync(ctx, e.cap), syscall.ENOSPC)
	assert.NotZero(t, e.ship.Status().Backlog, "a failed seal is backlog")

	// The disk is freed; no commit follows. The shipper's own loop must
	// ship commit 4.
	tipWriteENOSPC.Store(false)
	waitFor(t, 20*time.Second, "the shipper to report no backlog", func() bool { return e.ship.Status().Backlog == 0 })
	latest, err := e.archive.Latest(ctx, e.key)
	require.NoError(t, err)
	assert.Equal(t, want, latest, "the last acknowledged commit is archived")
	_, err = e.archive.Verify(ctx, e.key)
	require.NoError(t, err)
	out := filepath.Join(t.TempDir(), "r.db")
	_, err = e.archive.Restore(ctx, e.key, latest, out)
	require.NoError(t, err)
	assert.Equal(t, dumpDB(t, e.db), dumpRestored(t, out))
	// And a forced shipment (restore, fork) finds it archived too.
	e.sync()
	latest, err = e.archive.Latest(ctx, e.key)
	require.NoError(t, err)
	assert.Equal(t, want, latest)
}
