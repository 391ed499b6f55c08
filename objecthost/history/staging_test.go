package history

import (
	"context"
	"os"
	"path/filepath"
	"testing"

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
		tip{Last: recordHeader{PageSize: uint32(ps), DBSize: pages, TimeUs: base.TimeUs}, Settled: true, Restore: filepath.Base(tmp)}, Position{}))
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
