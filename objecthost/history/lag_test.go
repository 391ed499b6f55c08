package history

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	v4 "github.com/shoaldb/shoal/internal/v4"
	"github.com/shoaldb/shoal/objecthost/sqlexec"
)

// Capture runs on a goroutine of its own, behind the writer. These tests
// hold it back on purpose and check what the design promises: nothing is
// lost or reordered while it lags, the WAL is never restarted under a
// commit it has not captured and fsynced, a commit keeps the time it was
// acknowledged at, and a failing capture never turns into a false
// acknowledgement in the archived mode.

// TestCaptureLagsBehindWrites: capture sleeps before every batch while
// four writers insert and the WAL is checkpointed every 8 frames (each
// checkpoint waits for capture). No generation is started (every WAL
// restart was one the capturer was told about), the current position
// includes the last acknowledged write, and the archive replays to the
// database.
func TestCaptureLagsBehindWrites(t *testing.T) {
	store, err := NewDirStore(t.TempDir())
	require.NoError(t, err)
	e := newEnv(t, store, CaptureOptions{CheckpointFrames: 8, captureDelay: 5 * time.Millisecond}, ShipperOptions{MaxLag: 100 * time.Millisecond})
	e.exec("CREATE TABLE t(id INTEGER PRIMARY KEY, w INTEGER, v BLOB)")
	var wg sync.WaitGroup
	var maxBehind atomic.Uint64
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; i < 150; i++ {
				_, err := execOn(e.db, "INSERT INTO t(w, v) VALUES (?, randomblob(300))", w)
				assert.NoError(t, err)
				e.cap.mu.Lock()
				behind := e.cap.pubSeq - e.cap.capSeq
				e.cap.mu.Unlock()
				for m := maxBehind.Load(); behind > m && !maxBehind.CompareAndSwap(m, behind); m = maxBehind.Load() {
				}
			}
		}(w)
	}
	wg.Wait()
	t.Logf("capture was up to %d commits behind; %+v", maxBehind.Load(), e.cap.Stats())
	assert.Greater(t, maxBehind.Load(), uint64(1), "capture lagged")
	res := e.exec("SELECT count(*) FROM t")
	require.EqualValues(t, 600, res[0].Results.(*sqlexec.RawResults).Rows[0][0])
	cur := e.cap.Current()
	st := e.cap.Stats()
	assert.EqualValues(t, st.Records, cur.Txid, "Current waited for every acknowledged commit")
	assert.EqualValues(t, 1, st.Generations, "only the first one: no WAL restart under uncaptured frames")
	assert.Positive(t, st.FullCheckpoints)
	assert.Positive(t, st.WALRestarts)
	want := dumpDB(t, e.db)
	e.close()
	vs, err := e.archive.Verify(context.Background(), e.key)
	require.NoError(t, err)
	assert.Equal(t, cur, vs.Last)
	out := filepath.Join(t.TempDir(), "r.db")
	_, err = e.archive.Restore(context.Background(), e.key, cur, out)
	require.NoError(t, err)
	assert.Equal(t, want, dumpRestored(t, out))
}

// TestCommitTimeIsTheWriters: a record's time is the time its commit was
// acknowledged at, not the time capture got to it, so a restore to a
// timestamp includes every write acknowledged before it even when capture
// lagged.
func TestCommitTimeIsTheWriters(t *testing.T) {
	store, err := NewDirStore(t.TempDir())
	require.NoError(t, err)
	clk := &fakeClock{}
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	clk.us.Store(t0.UnixMicro())
	e := newEnv(t, store, CaptureOptions{Now: clk.now, captureDelay: 50 * time.Millisecond}, ShipperOptions{Now: clk.now})
	e.exec("CREATE TABLE t(v TEXT)")
	var times []time.Time
	for i := 0; i < 5; i++ {
		clk.advance(time.Minute)
		times = append(times, clk.now())
		e.exec("INSERT INTO t VALUES (?)", i)
	}
	clk.advance(time.Hour) // capture runs now, an hour "later"
	last := e.cap.Current()
	assert.Equal(t, times[4].UnixMicro(), last.TimeUs, "the last commit's time is its acknowledgement's")
	e.close()
	for i, at := range times {
		p, err := e.archive.Resolve(context.Background(), e.key, at.Add(30*time.Second))
		require.NoError(t, err)
		assert.Equal(t, at.UnixMicro(), p.TimeUs, "insert %d", i)
		assert.EqualValues(t, last.Txid-uint64(4-i), p.Txid, "insert %d", i)
	}
}

// TestCaptureFailureKeepsFramesInWAL: while appending to the staging file
// fails, writes still succeed (default mode), but no checkpoint moves
// their frames out of the WAL; once appends work again capture catches up
// in the same generation and the archive is complete.
func TestCaptureFailureKeepsFramesInWAL(t *testing.T) {
	store, err := NewDirStore(t.TempDir())
	require.NoError(t, err)
	var failing atomic.Bool
	injected := errors.New("injected staging failure")
	e := newEnv(t, store, CaptureOptions{CheckpointFrames: 4, appendErr: func() error {
		if failing.Load() {
			return injected
		}
		return nil
	}}, ShipperOptions{})
	e.exec("CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB)")
	for i := 0; i < 20; i++ {
		e.exec("INSERT INTO t(v) VALUES (randomblob(200))")
	}
	before := e.cap.Current()
	failing.Store(true)
	ckpts := e.cap.Stats().FullCheckpoints
	for i := 0; i < 40; i++ {
		e.exec("INSERT INTO t(v) VALUES (randomblob(200))") // acknowledged: committed on the host
	}
	assert.ErrorIs(t, e.cap.Err(), injected)
	assert.Equal(t, before, e.cap.Current(), "nothing captured while appends fail")
	// No exact point exists meanwhile: a bookmark of before would restore
	// to a state without the 40 acknowledged inserts.
	_, err = e.cap.Exact()
	assert.ErrorIs(t, err, injected, "Exact names a point without acknowledged commits")
	assert.Equal(t, ckpts, e.cap.Stats().FullCheckpoints, "no checkpoint while capture fails")
	failing.Store(false)
	e.exec("INSERT INTO t(v) VALUES (randomblob(200))")
	cur := e.cap.Current()
	assert.EqualValues(t, before.Txid+41, cur.Txid, "every commit captured after the failure cleared")
	exact, err := e.cap.Exact()
	require.NoError(t, err)
	assert.Equal(t, cur, exact)
	assert.NoError(t, e.cap.Err())
	assert.EqualValues(t, 1, e.cap.Stats().Generations, "only the first one")
	want := dumpDB(t, e.db)
	e.close()
	vs, err := e.archive.Verify(context.Background(), e.key)
	require.NoError(t, err)
	assert.Equal(t, 1, vs.Generations)
	out := filepath.Join(t.TempDir(), "r.db")
	_, err = e.archive.Restore(context.Background(), e.key, cur, out)
	require.NoError(t, err)
	assert.Equal(t, want, dumpRestored(t, out))
}

// TestArchivedModeCaptureFailure: in `durability = "archived"` mode a
// write whose capture fails is answered 7503, never acknowledged as
// archived; once capture works again it is archived with the next one.
func TestArchivedModeCaptureFailure(t *testing.T) {
	store, err := NewDirStore(t.TempDir())
	require.NoError(t, err)
	var failing atomic.Bool
	e := newEnvMode(t, store, CaptureOptions{appendErr: func() error {
		if failing.Load() {
			return errors.New("injected staging failure")
		}
		return nil
	}}, ShipperOptions{}, true)
	e.exec("CREATE TABLE t(v TEXT)")
	e.exec("INSERT INTO t VALUES ('archived')")
	failing.Store(true)
	_, err = execOn(e.db, "INSERT INTO t VALUES ('committed, not archived')")
	var se *sqlexec.Error
	require.ErrorAs(t, err, &se)
	assert.Equal(t, v4.CodeUnavailable, se.Code)
	failing.Store(false)
	e.exec("INSERT INTO t VALUES ('archived again')")
	latest, err := e.archive.Latest(context.Background(), e.key)
	require.NoError(t, err)
	assert.Equal(t, e.cap.Current(), latest, "acknowledged = in the store")
	out := filepath.Join(t.TempDir(), "r.db")
	_, err = e.archive.Restore(context.Background(), e.key, latest, out)
	require.NoError(t, err)
	assert.Equal(t, dumpDB(t, e.db), dumpRestored(t, out))
}
