package history

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// restoreLive is what the host does for POST …/time_travel/restore: ship
// what is local, take the previous bookmark, close the database, restore
// in place, reopen.
func (e *env) restoreLive(p Position) (restored, previous Position) {
	t := e.t
	e.sync()
	previous = e.cap.Current()
	e.close()
	restored, err := RestoreInPlace(context.Background(), e.archive, e.key, e.path, p, e.copts)
	require.NoError(t, err)
	e.open()
	return restored, previous
}

// TestRestoreIsUndoable: restore to an old bookmark, write, then restore to
// the bookmark taken before the restore: the later state is back; and the
// state written after the first restore is reachable too.
func TestRestoreIsUndoable(t *testing.T) {
	store, err := NewDirStore(t.TempDir())
	require.NoError(t, err)
	e := newEnv(t, store, CaptureOptions{CheckpointFrames: 16}, ShipperOptions{})
	e.exec("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT, r INTEGER DEFAULT (random()))")
	e.exec("INSERT INTO t(v) VALUES ('one'), ('two')")
	posA1, dumpA1 := e.cap.Current(), dumpDB(t, e.db)
	e.exec("DELETE FROM t")
	e.exec("CREATE TABLE u(x BLOB)")
	for i := 0; i < 50; i++ {
		e.exec("INSERT INTO u VALUES (randomblob(3000))")
	}
	dumpA2 := dumpDB(t, e.db)

	restored, previous := e.restoreLive(posA1)
	assert.Equal(t, dumpA1, dumpDB(t, e.db), "restored to A1")
	assert.Equal(t, restored, e.cap.Current(), "the restore is the new generation's base")
	assert.NotEqual(t, posA1.Gen, restored.Gen)
	assert.Less(t, string(MakeBookmark(e.key, previous)), string(MakeBookmark(e.key, restored)))

	e.exec("INSERT INTO t(v) VALUES ('after restore')")
	posC, dumpC := e.cap.Current(), dumpDB(t, e.db)

	_, _ = e.restoreLive(previous)
	assert.Equal(t, dumpA2, dumpDB(t, e.db), "undo: the pre-restore state is back")

	_, _ = e.restoreLive(posC)
	assert.Equal(t, dumpC, dumpDB(t, e.db), "and the state written after the first restore")
	e.exec("INSERT INTO t(v) VALUES ('still writable')")
	e.close()

	ctx := context.Background()
	vs, err := e.archive.Verify(ctx, e.key)
	require.NoError(t, err)
	assert.Equal(t, 4, vs.Generations)
	// Timestamps inside old generations still resolve there.
	p, err := e.archive.Resolve(ctx, e.key, previous.Time())
	require.NoError(t, err)
	assert.Equal(t, previous, p)
}

// TestRestoreInPlaceFinishesAfterCrash: a crash after the new generation's
// tip (the checkpoint) but before the file swap is completed by the next
// NewCapturer, before the database is opened.
func TestRestoreInPlaceFinishesAfterCrash(t *testing.T) {
	store, err := NewDirStore(t.TempDir())
	require.NoError(t, err)
	e := newEnv(t, store, CaptureOptions{}, ShipperOptions{})
	e.exec("CREATE TABLE t(v)")
	e.exec("INSERT INTO t VALUES (1)")
	pos1, dump1 := e.cap.Current(), dumpDB(t, e.db)
	e.exec("INSERT INTO t VALUES (2)")
	e.close()

	// Steps 1 and 2 of RestoreInPlace, then "crash".
	ctx := context.Background()
	tmp := e.path + ".restore-tmp"
	var st RestoreStats
	require.NoError(t, e.archive.build(ctx, e.key, pos1, tmp, &st))
	l, err := openLocalLog(e.copts.StagingDir, e.key, e.copts.StagingName)
	require.NoError(t, err)
	_, _, err = l.recover()
	require.NoError(t, err)
	f, err := os.Open(tmp)
	require.NoError(t, err)
	ps, pages, err := dbFileInfo(f)
	require.NoError(t, err)
	base := snapHeader{PageSize: uint32(ps), DBSize: pages, TimeUs: pos1.TimeUs + 10_000_000}
	im := &dbImage{db: f, pageSize: ps}
	gen := genID(base.TimeUs)
	require.NoError(t, l.startGeneration(gen, base, func(w *os.File) error { return writeSnapshot(w, base, im.readPage) },
		tip{Last: recordHeader{PageSize: uint32(ps), DBSize: pages, TimeUs: base.TimeUs}, Settled: true, Restore: filepath.Base(tmp)}, Position{}))
	f.Close()
	l.close()

	e.open()
	assert.Equal(t, dump1, dumpDB(t, e.db))
	assert.Equal(t, gen, e.cap.Current().Gen)
	_, err = os.Stat(tmp)
	assert.True(t, os.IsNotExist(err))
	e.exec("INSERT INTO t VALUES (3)")
	e.close()
	_, err = e.archive.Verify(ctx, e.key)
	require.NoError(t, err)
}
