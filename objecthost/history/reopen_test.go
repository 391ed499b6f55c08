package history

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/objecthost/sqlexec"
)

// session is one open of a database with its capturer, as the object host
// opens a handle: NewCapturer (with or without a Reopen), sqlexec.Open,
// Attach, Shipper.Add.
type session struct {
	t    *testing.T
	db   *sqlexec.DB
	cap  *Capturer
	ship *Shipper
}

func openSession(t *testing.T, key, path, staging string, store Store, r *Reopen, opts CaptureOptions) *session {
	return openSessionHow(t, false, key, path, staging, store, r, opts)
}

// openSessionHow is openSession; atOpen attaches the capturer the way the
// object host does since 2026-12-03, by sqlexec.Open itself
// (AttachAtOpen), instead of Attach after Open.
func openSessionHow(t *testing.T, atOpen bool, key, path, staging string, store Store, r *Reopen, opts CaptureOptions) *session {
	t.Helper()
	ship := NewShipper(store, ShipperOptions{})
	opts.StagingDir, opts.Reopen, opts.OnAppend = staging, r, ship.Notify
	c, err := NewCapturer(key, path, opts)
	require.NoError(t, err)
	sopts := sqlexec.Options{ReadConns: 1}
	if atOpen {
		c.AttachAtOpen(&sopts)
	}
	db, err := sqlexec.Open(path, sopts)
	require.NoError(t, err)
	if !atOpen {
		require.NoError(t, c.Attach(context.Background(), db))
	}
	ship.Add(c)
	return &session{t: t, db: db, cap: c, ship: ship}
}

func (s *session) exec(sqlText string) {
	s.t.Helper()
	_, err := execOn(s.db, sqlText)
	require.NoError(s.t, err)
}

// close closes like a handle eviction (the writer's Closing flushes), ships
// what is left, and returns the Reopen the close handed out.
func (s *session) close() (Reopen, bool) {
	s.t.Helper()
	require.NoError(s.t, s.db.Close())
	require.NoError(s.t, s.cap.Close())
	s.ship.Retire(s.cap)
	require.NoError(s.t, s.ship.Drain(context.Background()))
	return s.cap.Reopen()
}

type reopenEnv struct {
	key, dir, path, staging, archive string
	store                            Store
}

func newReopenEnv(t *testing.T) *reopenEnv {
	e := &reopenEnv{key: "db-reopen", dir: t.TempDir()}
	e.path = filepath.Join(e.dir, "data", "x.db")
	e.staging = filepath.Join(e.dir, "staging")
	e.archive = filepath.Join(e.dir, "archive")
	require.NoError(t, os.MkdirAll(filepath.Dir(e.path), 0o755))
	store, err := NewDirStore(e.archive)
	require.NoError(t, err)
	e.store = store
	return e
}

// verify checks the archive's chain and that its last state is want.
func (e *reopenEnv) verify(t *testing.T, store Store, want string, last Position) {
	t.Helper()
	a := NewArchive(store)
	vs, err := a.Verify(context.Background(), e.key)
	require.NoError(t, err, "the archived chain: no gap, no repeat")
	assert.Equal(t, last, vs.Last)
	out := filepath.Join(t.TempDir(), "r.db")
	_, err = a.Restore(context.Background(), e.key, vs.Last, out)
	require.NoError(t, err)
	assert.Equal(t, want, dumpRestored(t, out))
}

// TestReopenSkipsRecovery: a capturer closed cleanly hands out a Reopen;
// the next capturer of the same area starts from it (no staging recovery,
// no new generation) and the history goes on without a gap or a repeat.
func TestReopenSkipsRecovery(t *testing.T) {
	e := newReopenEnv(t)
	s := openSession(t, e.key, e.path, e.staging, e.store, nil, CaptureOptions{})
	s.exec("CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB)")
	for range 10 {
		s.exec("INSERT INTO t(v) VALUES (randomblob(50))")
	}
	first := s.cap.Current()
	r, ok := s.close()
	require.True(t, ok, "a clean close hands out a Reopen")
	assert.Equal(t, first.Txid, r.st.Last.Txid)

	for round := range 3 {
		s = openSession(t, e.key, e.path, e.staging, e.store, &r, CaptureOptions{})
		assert.True(t, s.cap.reopened, "round %d: started from the Reopen", round)
		assert.Zero(t, s.cap.Stats().Generations, "round %d: continuity, no new generation", round)
		assert.Equal(t, first.Gen, s.cap.Current().Gen)
		s.exec("SELECT count(*) FROM t") // a cold read: nothing to capture
		for range 5 {
			s.exec("INSERT INTO t(v) VALUES (randomblob(50))")
		}
		r, ok = s.close()
		require.True(t, ok)
	}
	s = openSession(t, e.key, e.path, e.staging, e.store, &r, CaptureOptions{})
	last := s.cap.Current()
	assert.Equal(t, first.Txid+15, last.Txid, "every commit captured once")
	want := dumpDB(t, s.db)
	_, ok = s.close()
	require.True(t, ok)
	e.verify(t, e.store, want, last)
}

// TestReopenAfterCrashRecovers: the Reopen lives in memory only. A crash
// after a staging write (records in open.seg, nothing sealed, no clean
// close) loses it, and the next open after the restart recovers the area
// from disk: every captured commit is there, and so is the commit the
// crash left uncaptured in the WAL; the generation goes on.
func TestReopenAfterCrashRecovers(t *testing.T) {
	e := newReopenEnv(t)
	s := openSession(t, e.key, e.path, e.staging, e.store, nil, CaptureOptions{})
	s.exec("CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB)")
	s.exec("INSERT INTO t(v) VALUES (randomblob(50))")
	r, ok := s.close()
	require.True(t, ok)

	s = openSession(t, e.key, e.path, e.staging, e.store, &r, CaptureOptions{})
	require.True(t, s.cap.reopened)
	for range 20 {
		s.exec("INSERT INTO t(v) VALUES (randomblob(50))")
	}
	captured := s.cap.Current() // waits for capture: the staging write is done
	st, err := os.Stat(filepath.Join(e.staging, e.key, captured.Gen, "open.seg"))
	require.NoError(t, err, "the records are in open.seg, not sealed")
	require.Positive(t, st.Size())
	// One more commit that capture never sees (a kill between COMMIT and
	// capture), then the crash: what is on disk (page cache) is copied
	// while the process still runs.
	require.NoError(t, s.db.SetCommitHook(context.Background(), nil, nil))
	s.exec("INSERT INTO t(v) VALUES (x'00')")
	want := dumpDB(t, s.db)
	img := t.TempDir()
	for _, d := range []string{"data", "staging", "archive"} {
		out, err := exec.Command("cp", "-a", filepath.Join(e.dir, d), filepath.Join(img, d)).CombinedOutput()
		require.NoError(t, err, string(out))
	}

	// The restarted process has no Reopen: it recovers.
	e2 := &reopenEnv{key: e.key, dir: img, path: filepath.Join(img, "data", "x.db"), staging: filepath.Join(img, "staging")}
	store2, err := NewDirStore(filepath.Join(img, "archive"))
	require.NoError(t, err)
	s2 := openSession(t, e2.key, e2.path, e2.staging, store2, nil, CaptureOptions{})
	assert.False(t, s2.cap.reopened)
	assert.Zero(t, s2.cap.Stats().Generations, "continuity proven from the recovered staging")
	last := s2.cap.Current()
	assert.Equal(t, captured.Gen, last.Gen)
	assert.Equal(t, captured.Txid+1, last.Txid, "the captured commits and the uncaptured one, each once")
	assert.Equal(t, want, dumpDB(t, s2.db))
	_, ok = s2.close()
	require.True(t, ok)
	e2.verify(t, store2, want, last)

	// Handing the stale Reopen to the crashed area itself is refused too
	// (open.seg is there): the recovery runs.
	s.cap.Close() // release the crashed session's files (its database stays open, unused)
	s3c, err := NewCapturer(e.key, e.path, CaptureOptions{StagingDir: e.staging, Reopen: &r})
	require.NoError(t, err)
	assert.False(t, s3c.reopened, "a Reopen older than the area is not trusted")
	require.NoError(t, s3c.log.close())
}

// TestStaleReopenRefused: a Reopen the caller should have dropped (the
// area moved on: a later close rewrote the tip, a crash left open.seg, a
// restore started a generation) is refused by NewCapturer, which then
// recovers; the history stays exact.
func TestStaleReopenRefused(t *testing.T) {
	e := newReopenEnv(t)
	s := openSession(t, e.key, e.path, e.staging, e.store, nil, CaptureOptions{})
	s.exec("CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB)")
	r1, ok := s.close()
	require.True(t, ok)
	s = openSession(t, e.key, e.path, e.staging, e.store, &r1, CaptureOptions{})
	require.True(t, s.cap.reopened)
	for range 5 {
		s.exec("INSERT INTO t(v) VALUES (randomblob(50))")
	}
	after2 := s.cap.Current()
	r2, ok := s.close()
	require.True(t, ok)

	// r1 is older than the tip r2's close wrote.
	s = openSession(t, e.key, e.path, e.staging, e.store, &r1, CaptureOptions{})
	assert.False(t, s.cap.reopened, "a rewritten tip: refused")
	assert.Equal(t, after2, s.cap.Current())
	assert.Zero(t, s.cap.Stats().Generations)
	r3, ok := s.close()
	require.True(t, ok)
	_ = r2

	// open.seg present (what a crash leaves; empty here, recovery drops it).
	gen := filepath.Join(e.staging, e.key, after2.Gen)
	require.NoError(t, os.WriteFile(filepath.Join(gen, "open.seg"), nil, 0o644))
	s = openSession(t, e.key, e.path, e.staging, e.store, &r3, CaptureOptions{})
	assert.False(t, s.cap.reopened, "open.seg present: refused")
	assert.Equal(t, after2, s.cap.Current())
	r4, ok := s.close()
	require.True(t, ok)

	// A newer generation directory (what a restore creates first).
	newer := filepath.Join(e.staging, e.key, "7fffffffffffffff")
	require.NoError(t, os.Mkdir(newer, 0o755))
	c, err := NewCapturer(e.key, e.path, CaptureOptions{StagingDir: e.staging, Reopen: &r4})
	require.NoError(t, err)
	assert.False(t, c.reopened, "a new generation directory: refused")
	require.NoError(t, c.log.close())
	require.NoError(t, os.Remove(newer))

	// Another area's Reopen is ignored.
	other := r4
	other.key = "db-other"
	s = openSession(t, e.key, e.path, e.staging, e.store, &other, CaptureOptions{})
	assert.False(t, s.cap.reopened)
	s.exec("INSERT INTO t(v) VALUES (randomblob(50))")
	last := s.cap.Current()
	want := dumpDB(t, s.db)
	_, ok = s.close()
	require.True(t, ok)
	assert.Equal(t, after2.Txid+1, last.Txid)
	e.verify(t, e.store, want, last)
}

// TestUncleanCloseGivesNoReopen: a close after a failed capture (the WAL
// holds commits the staging log lacks; the log is not settled) hands out
// no Reopen: the next open must recover and prove continuity itself.
func TestUncleanCloseGivesNoReopen(t *testing.T) {
	e := newReopenEnv(t)
	var failing atomic.Bool
	opts := CaptureOptions{appendErr: func() error {
		if failing.Load() {
			return errors.New("disk full")
		}
		return nil
	}}
	s := openSession(t, e.key, e.path, e.staging, e.store, nil, opts)
	s.exec("CREATE TABLE t(v)")
	s.cap.Current()
	failing.Store(true)
	s.exec("INSERT INTO t VALUES (1)")
	require.NoError(t, s.db.Close()) // Closing's Flush fails: kept in Err
	require.Error(t, s.cap.Err())
	require.NoError(t, s.cap.Close())
	_, ok := s.cap.Reopen()
	assert.False(t, ok, "no Reopen after an unclean close")
}

// TestReopenAttachAtOpen: the object host's cold open — a Reopen, the
// capturer attached by sqlexec.Open itself (AttachAtOpen) — keeps the
// history one chain: no new generation, every commit captured once, the
// archive restores the last state; a crash-left WAL is still caught up
// at such an open.
func TestReopenAttachAtOpen(t *testing.T) {
	e := newReopenEnv(t)
	s := openSessionHow(t, true, e.key, e.path, e.staging, e.store, nil, CaptureOptions{})
	assert.EqualValues(t, 1, s.cap.Stats().Generations, "a first open starts the first generation")
	s.exec("CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB)")
	first := s.cap.Current()
	r, ok := s.close()
	require.True(t, ok)
	for round := range 3 {
		s = openSessionHow(t, true, e.key, e.path, e.staging, e.store, &r, CaptureOptions{})
		assert.True(t, s.cap.reopened, "round %d", round)
		assert.Zero(t, s.cap.Stats().Generations, "round %d: continuity", round)
		s.exec("SELECT count(*) FROM t")
		for range 4 {
			s.exec("INSERT INTO t(v) VALUES (randomblob(50))")
		}
		r, ok = s.close()
		require.True(t, ok)
	}
	s = openSessionHow(t, true, e.key, e.path, e.staging, e.store, &r, CaptureOptions{})
	last := s.cap.Current()
	assert.Equal(t, first.Gen, last.Gen)
	assert.Equal(t, first.Txid+12, last.Txid, "every commit captured once")
	want := dumpDB(t, s.db)
	_, ok = s.close()
	require.True(t, ok)
	e.verify(t, e.store, want, last)
}

// TestReopenOfRemovedArea: a Reopen whose staging area was removed since
// (a caller that should have dropped it) is refused, and the open
// creates the area again (NewCapturer skips its MkdirAll only while the
// Reopen's check holds) and starts a new generation.
func TestReopenOfRemovedArea(t *testing.T) {
	e := newReopenEnv(t)
	s := openSessionHow(t, true, e.key, e.path, e.staging, e.store, nil, CaptureOptions{})
	s.exec("CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB)")
	s.exec("INSERT INTO t(v) VALUES (randomblob(50))")
	r, ok := s.close()
	require.True(t, ok)
	require.NoError(t, os.RemoveAll(filepath.Join(e.staging, e.key)))

	s = openSessionHow(t, true, e.key, e.path, e.staging, e.store, &r, CaptureOptions{})
	assert.False(t, s.cap.reopened, "the area is gone: refused")
	assert.EqualValues(t, 1, s.cap.Stats().Generations, "no local history: a new generation")
	s.exec("INSERT INTO t(v) VALUES (randomblob(50))")
	last := s.cap.Current()
	want := dumpDB(t, s.db)
	_, ok = s.close()
	require.True(t, ok)
	a := NewArchive(e.store)
	out := filepath.Join(t.TempDir(), "r.db")
	_, err := a.Restore(context.Background(), e.key, last, out)
	require.NoError(t, err)
	assert.Equal(t, want, dumpRestored(t, out))
}

// TestReadOnlyReopenOpensNoDescriptors: at a clean reopen with an empty
// WAL the capturer opens no descriptor of its own (attach learns the WAL
// is empty from a stat); a session that only reads never opens them and
// still hands out a Reopen; the first write opens them, is captured, and
// the archive restores it. After Close, nothing opens them again.
func TestReadOnlyReopenOpensNoDescriptors(t *testing.T) {
	e := newReopenEnv(t)
	s := openSessionHow(t, true, e.key, e.path, e.staging, e.store, nil, CaptureOptions{})
	s.exec("CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB)")
	r, ok := s.close()
	require.True(t, ok)

	s = openSessionHow(t, true, e.key, e.path, e.staging, e.store, &r, CaptureOptions{})
	require.True(t, s.cap.reopened)
	assert.False(t, s.cap.filesOpen, "a clean reopen with an empty WAL opens nothing")
	s.exec("SELECT count(*) FROM t")
	assert.False(t, s.cap.filesOpen, "a read opens nothing")
	r, ok = s.close()
	require.True(t, ok, "a read-only session still hands out a Reopen")
	require.ErrorIs(t, s.cap.files(), errCaptureStopped, "no descriptor after Close")
	assert.Nil(t, s.cap.walF)

	s = openSessionHow(t, true, e.key, e.path, e.staging, e.store, &r, CaptureOptions{})
	require.True(t, s.cap.reopened)
	s.exec("INSERT INTO t(v) VALUES (randomblob(50))")
	last := s.cap.Current()
	assert.True(t, s.cap.filesOpen, "the first write's capture opened them")
	assert.Zero(t, s.cap.Stats().Generations, "continuity")
	want := dumpDB(t, s.db)
	_, ok = s.close()
	require.True(t, ok)
	e.verify(t, e.store, want, last)
}
