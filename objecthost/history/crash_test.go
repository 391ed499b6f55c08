package history

import (
	"context"
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/objecthost/sqlexec"
)

// crashImage copies what a process crash leaves on disk (the database
// file, its WAL, the staging area and the archive, all in the page cache)
// into a fresh directory while the database is still open.
func crashImage(t *testing.T, e *env, archiveDir string, withWAL bool) (dir string) {
	t.Helper()
	dir = t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "data"), 0o755))
	files := []string{e.path}
	if withWAL {
		files = append(files, e.path+"-wal")
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, "data", filepath.Base(f)), b, 0o644))
	}
	for _, d := range [][2]string{{e.copts.StagingDir, "staging"}, {archiveDir, "archive"}} {
		out, err := exec.Command("cp", "-a", d[0], filepath.Join(dir, d[1])).CombinedOutput()
		require.NoError(t, err, string(out))
	}
	return dir
}

// openImage attaches a capturer to a crash image, as a restarted host does.
func openImage(t *testing.T, dir, key string) (*sqlexec.DB, *Capturer, *Shipper, *Archive) {
	t.Helper()
	store, err := NewDirStore(filepath.Join(dir, "archive"))
	require.NoError(t, err)
	path := filepath.Join(dir, "data", "x.db")
	c, err := NewCapturer(key, path, CaptureOptions{StagingDir: filepath.Join(dir, "staging")})
	require.NoError(t, err)
	db, err := sqlexec.Open(path, sqlexec.Options{ReadConns: 1})
	require.NoError(t, err)
	require.NoError(t, c.Attach(context.Background(), db))
	ship := NewShipper(store, ShipperOptions{})
	return db, c, ship, NewArchive(store)
}

// TestCrashAfterWALRestart: the capturer checkpointed the whole WAL, SQLite
// restarted it (salt1 + 1) for the next write, and the process died after
// that write's COMMIT but before its capture. The restarted capturer
// recognises the restart, captures the commit, and stays in the same
// generation.
func TestCrashAfterWALRestart(t *testing.T) {
	archiveDir := t.TempDir()
	store, err := NewDirStore(archiveDir)
	require.NoError(t, err)
	e := newEnv(t, store, CaptureOptions{CheckpointFrames: 1 << 30}, ShipperOptions{})
	e.exec("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT DEFAULT (hex(randomblob(8))))")
	for i := 0; i < 20; i++ {
		e.exec("INSERT INTO t DEFAULT VALUES")
	}
	// Ask for a checkpoint: the first commit starts the staging fsync in
	// the background, a later one checkpoints everything.
	e.cap.wantCkpt.Store(true)
	for i := 0; i < 500 && e.cap.Stats().FullCheckpoints == 0; i++ {
		e.exec("INSERT INTO t DEFAULT VALUES")
		time.Sleep(time.Millisecond) // pacing: writes until the background checkpoint has run (the loop's condition)
	}
	require.EqualValues(t, 1, e.cap.Stats().FullCheckpoints)
	before := e.cap.Current()
	walBefore := e.cap.pos
	e.sync()

	// "Crash" between the next COMMIT and its capture: the hook is gone.
	require.NoError(t, e.db.SetCommitHook(context.Background(), nil, nil))
	e.exec("INSERT INTO t(v) VALUES ('uncaptured')")
	want := dumpDB(t, e.db)
	f, err := os.Open(e.path + "-wal")
	require.NoError(t, err)
	h, ok, err := readWALHeader(f)
	f.Close()
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, walBefore.Salt1+1, h.salt1, "SQLite restarted the WAL")
	img := crashImage(t, e, archiveDir, true)

	db, c, ship, a := openImage(t, img, e.key)
	assert.Zero(t, c.Stats().Generations, "continuity proven, no new generation")
	assert.Equal(t, before.Txid+1, c.Current().Txid, "the uncaptured commit was captured")
	assert.Equal(t, before.Gen, c.Current().Gen)
	assert.Equal(t, want, dumpDB(t, db))
	require.NoError(t, c.Flush())
	require.NoError(t, db.Close())
	require.NoError(t, ship.Sync(context.Background(), c))
	require.NoError(t, c.Close())
	vs, err := a.Verify(context.Background(), e.key)
	require.NoError(t, err)
	assert.Equal(t, c.Current(), vs.Last)
	out := filepath.Join(t.TempDir(), "r.db")
	_, err = a.Restore(context.Background(), e.key, vs.Last, out)
	require.NoError(t, err)
	assert.Equal(t, want, dumpRestored(t, out))
	require.NoError(t, e.db.SetCommitHook(context.Background(), e.cap, nil))
}

// TestLostWALStartsGeneration: when the WAL the log was captured from is
// gone (an OS crash before SQLite synced it, an operator's mistake), the
// history cannot prove continuity: the capturer starts a new generation
// from the database as it is instead of continuing a wrong chain, and the
// old generation stays restorable.
func TestLostWALStartsGeneration(t *testing.T) {
	archiveDir := t.TempDir()
	store, err := NewDirStore(archiveDir)
	require.NoError(t, err)
	e := newEnv(t, store, CaptureOptions{CheckpointFrames: 1 << 30}, ShipperOptions{})
	e.exec("CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB)")
	for i := 0; i < 10; i++ {
		e.exec("INSERT INTO t(v) VALUES (randomblob(100))")
	}
	old := e.cap.Current()
	e.sync()
	img := crashImage(t, e, archiveDir, false)

	db, c, ship, a := openImage(t, img, e.key)
	assert.EqualValues(t, 1, c.Stats().Generations)
	assert.NotEqual(t, old.Gen, c.Current().Gen)
	assert.Contains(t, c.genReason, "cannot prove continuity")
	// The database file never saw a checkpoint: without its WAL it is empty.
	_, err = execOn(db, "CREATE TABLE IF NOT EXISTS t(id INTEGER PRIMARY KEY, v BLOB)")
	require.NoError(t, err)
	_, err = execOn(db, "INSERT INTO t(v) VALUES (x'01')")
	require.NoError(t, err)
	require.NoError(t, c.Flush())
	require.NoError(t, db.Close())
	require.NoError(t, ship.Sync(context.Background(), c))
	require.NoError(t, c.Close())
	vs, err := a.Verify(context.Background(), e.key)
	require.NoError(t, err)
	assert.Equal(t, 2, vs.Generations)
	_, err = a.Restore(context.Background(), e.key, old, filepath.Join(t.TempDir(), "old.db"))
	require.NoError(t, err, "the old generation is still restorable")
}

// TestLeftoversShipAfterRestart: a host that died with records only in
// local staging ships them at its next start, before the database is
// opened again (SealForShipping + Retire).
func TestLeftoversShipAfterRestart(t *testing.T) {
	archiveDir := t.TempDir()
	store, err := NewDirStore(archiveDir)
	require.NoError(t, err)
	e := newEnv(t, store, CaptureOptions{}, ShipperOptions{MaxLag: time.Hour}) // nothing sealed by age
	e.exec("CREATE TABLE t(v)")
	e.sync()
	for i := 0; i < 30; i++ {
		e.exec("INSERT INTO t VALUES (randomblob(100))")
	}
	want := e.cap.Current()
	img := crashImage(t, e, archiveDir, true)

	imgStore, err := NewDirStore(filepath.Join(img, "archive"))
	require.NoError(t, err)
	a := NewArchive(imgStore)
	before, err := a.Latest(context.Background(), e.key)
	require.NoError(t, err)
	require.Less(t, before.Txid, want.Txid, "the last records were only local")

	c, err := NewCapturer(e.key, filepath.Join(img, "data", "x.db"), CaptureOptions{StagingDir: filepath.Join(img, "staging")})
	require.NoError(t, err)
	require.NoError(t, c.SealForShipping())
	ship := NewShipper(imgStore, ShipperOptions{})
	ship.Retire(c)
	require.NoError(t, ship.Drain(context.Background()))
	got, err := a.Latest(context.Background(), e.key)
	require.NoError(t, err)
	assert.Equal(t, want, got)
	_, err = a.Verify(context.Background(), e.key)
	require.NoError(t, err)
}

// TestJunkAfterLastCommitIgnored: a process killed while SQLite wrote a
// transaction can leave frames after the WAL's last commit that carry the
// current salts, even a commit flag, with a torn page (SQLite writes a
// frame's header and its page in two writes; its recovery rejects them by
// checksum). The next process's transactions overwrite them only as far as
// they reach, so the capturer must never read past SQLite's mxFrame: no
// phantom transaction may be captured.
func TestJunkAfterLastCommitIgnored(t *testing.T) {
	store, err := NewDirStore(t.TempDir())
	require.NoError(t, err)
	e := newEnv(t, store, CaptureOptions{CheckpointFrames: 1 << 30}, ShipperOptions{})
	e.exec("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)")
	e.exec("INSERT INTO t(v) VALUES ('a')")
	before := e.cap.Current()
	mx := e.cap.pos.Frames
	f, err := os.OpenFile(e.path+"-wal", os.O_RDWR, 0)
	require.NoError(t, err)
	h, ok, err := readWALHeader(f)
	require.NoError(t, err)
	require.True(t, ok)
	frameSize := int64(walFrameHeaderSize + h.pageSize)
	for i := uint32(2); i <= 8; i++ {
		fb := make([]byte, frameSize)
		be := binaryBE
		be.PutUint32(fb[0:], 2) // page 2: the table's root
		if i == 8 {
			be.PutUint32(fb[4:], 3) // a commit frame
		}
		be.PutUint32(fb[8:], h.salt1)
		be.PutUint32(fb[12:], h.salt2)
		for k := walFrameHeaderSize; k < len(fb); k++ {
			fb[k] = 0xAB
		}
		_, err := f.WriteAt(fb, walHeaderSize+int64(mx+i-1)*frameSize)
		require.NoError(t, err)
	}
	require.NoError(t, f.Close())

	e.exec("INSERT INTO t(v) VALUES ('b')") // one or two frames, then the junk
	assert.Equal(t, before.Txid+1, e.cap.Current().Txid, "exactly one transaction captured")
	want := dumpDB(t, e.db)
	e.close()
	out := filepath.Join(t.TempDir(), "r.db")
	latest, err := e.archive.Latest(context.Background(), e.key)
	require.NoError(t, err)
	_, err = e.archive.Restore(context.Background(), e.key, latest, out)
	require.NoError(t, err)
	assert.Equal(t, want, dumpRestored(t, out))
}

var binaryBE = binary.BigEndian
