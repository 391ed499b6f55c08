package sqlexec

/*
#include "shim.h"
extern int sqlite3_wal_checkpoint_v2(sqlite3*, const char*, int, int*, int*);
extern int sqlite3_wal_autocheckpoint(sqlite3*, int);
extern void *sqlite3_wal_hook(sqlite3*, int(*)(void*, sqlite3*, const char*, int), void*);

// The WAL hook runs after every commit with the number of frames in the
// WAL (its mxFrame): the hook's reader never reads past it.
static int shoal_wal_frames_cb(void *slot, sqlite3 *db, const char *zDb, int nFrame) {
	*(int*)slot = nFrame;
	return 0;
}
static int *shoal_wal_frames_install(sqlite3 *db) {
	int *slot = (int*)malloc(sizeof(int));
	if (slot) { *slot = -1; sqlite3_wal_hook(db, shoal_wal_frames_cb, slot); }
	return slot;
}
static void shoal_wal_frames_remove(sqlite3 *db, int *slot) {
	sqlite3_wal_hook(db, 0, 0);
	free(slot);
}
*/
import "C"

import (
	"context"
	"errors"
	"time"
	"unsafe"
)

// CommitHook observes every transaction a DB's writer commits, in commit
// order. It is how objecthost/history captures each transaction's pages
// from the WAL (see history/DESIGN.md).
//
// Contract:
//   - Committed is called on the writer goroutine, after every COMMIT that
//     succeeded (a group commit or a script), before the requests of that
//     transaction are acknowledged, with no transaction open. Calls never
//     overlap and are never reordered.
//   - While a hook is attached the writer connection's automatic
//     checkpoints are off (wal_autocheckpoint=0) and nothing but the hook
//     checkpoints the database (readers never do), so the frames of every
//     transaction committed since the hook's last checkpoint are still in
//     <Path()>-wal when Committed runs. Only HookConn.Checkpoint, called from
//     inside Committed (or the attach function), moves them into the
//     database file. The last Close still checkpoints: detach (Flush) first.
//   - A non-nil error from Committed fails the transaction's requests with
//     that error (the transaction itself is committed: the hook decides
//     whether that is acceptable, e.g. only in a "wait until archived" mode).
//   - Committed must not call back into the DB (Execute would deadlock).
type CommitHook interface {
	Committed(w HookConn) error
}

// CommitHookCloser is an optional CommitHook: Closing is called on the
// writer goroutine when the DB closes, after its last commit and before
// its connections close (the last close checkpoints the WAL into the
// database file and truncates it).
type CommitHookCloser interface {
	Closing()
}

// HookConn is what a CommitHook may do on the writer connection. It is
// valid only during the call it is passed to.
type HookConn struct {
	c      *conn
	frames *C.int
}

// WALFrames is the number of frames in the WAL after the last commit, as
// SQLite reported it to its WAL hook (its mxFrame: every frame up to it is
// committed, anything after it is not), or -1 before the first commit
// since the hook was attached. After a Checkpoint that backfilled the whole
// WAL it is 0 until a commit writes frames again: SQLite may restart the
// WAL at the next write, and the old count would name frames of the new
// WAL that are not committed yet (a commit that writes no frames does not
// call the WAL hook).
func (w HookConn) WALFrames() int {
	if w.frames == nil {
		return -1
	}
	return int(*w.frames)
}

// Checkpoint runs a PASSIVE checkpoint (it never waits for readers) and
// returns the WAL's size in frames and how many of them are now in the
// database file; walFrames == backfilled means the database file holds
// every committed transaction and SQLite restarts the WAL (new salts, frame
// 1) at the next write. It may be called only from Committed or the attach
// function, and never inside a transaction (SetCommitHook's attach function
// runs inside one: there it fails).
func (w HookConn) Checkpoint() (walFrames, backfilled int, err error) {
	var nlog, nckpt C.int
	main := C.CString("main")
	defer C.free(unsafe.Pointer(main))
	if rc := C.sqlite3_wal_checkpoint_v2(w.c.db, main, 0 /* PASSIVE */, &nlog, &nckpt); rc != rcOK {
		return 0, 0, w.c.errorFor(rc, -1)
	}
	if nlog == nckpt && w.frames != nil {
		*w.frames = 0 // see WALFrames
	}
	return int(nlog), int(nckpt), nil
}

type commitHook struct {
	h      CommitHook
	frames *C.int // written by SQLite's WAL hook (C memory)
}

// ErrHookAttached is returned by SetCommitHook when a hook is attached
// already.
var ErrHookAttached = errors.New("sqlexec: commit hook already attached")

// SetCommitHook attaches h (nil detaches). attach, when not nil, runs first on the
// writer goroutine inside a write transaction (nothing else can commit or
// checkpoint meanwhile, so the database file and the WAL are stable): it is
// where the hook reads the current state (the WAL's frames, or a snapshot of
// the whole database) before the first Committed. If attach fails nothing is
// attached. Requests queued before SetCommitHook commit before attach runs.
func (db *DB) SetCommitHook(ctx context.Context, h CommitHook, attach func(HookConn) error) error {
	fn := func(c *conn) error { return db.setHook(c, h, attach) }
	rq := newReqCtx(ctx, time.Hour) // attach may snapshot a large database
	j := &job{rq: rq, done: make(chan struct{}), fn: fn}
	if err := db.enqueue(j); err != nil {
		return err
	}
	<-j.done
	return j.err
}

// setHook attaches h (nil detaches) on c, the writer connection, inside a
// write transaction the caller holds (writer goroutine, or Open before the
// writer goroutine starts).
func (db *DB) setHook(c *conn, h CommitHook, attach func(HookConn) error) error {
	if h != nil && db.hook != nil {
		return ErrHookAttached
	}
	if h == nil {
		if db.hook != nil {
			C.shoal_wal_frames_remove(c.db, db.hook.frames)
		}
		db.hook = nil
		C.sqlite3_wal_autocheckpoint(c.db, 1000) // SQLite's default
		return nil
	}
	// Off before attach reads anything: from here on only the hook
	// checkpoints. (autocheckpoint is itself a WAL hook: ours replaces it.)
	C.sqlite3_wal_autocheckpoint(c.db, 0)
	if attach != nil {
		if err := attach(HookConn{c: c}); err != nil {
			C.sqlite3_wal_autocheckpoint(c.db, 1000)
			return err
		}
	}
	db.hook = &commitHook{h: h, frames: C.shoal_wal_frames_install(c.db)}
	return nil
}

// attachHook is SetCommitHook for Open (Options.CommitHook): the same
// attach in the same kind of write transaction (BEGIN IMMEDIATE … COMMIT,
// nothing else can commit or checkpoint meanwhile), run on the opening
// goroutine before the writer goroutine exists. The transaction writes
// nothing; the hook is told of its COMMIT, as of the COMMIT of
// SetCommitHook's job.
func (db *DB) attachHook(c *conn, h CommitHook, attach func(HookConn) error) error {
	if err := c.execInternal("BEGIN IMMEDIATE"); err != nil {
		return err
	}
	if err := db.setHook(c, h, attach); err != nil {
		if C.sqlite3_get_autocommit(c.db) == 0 {
			_ = c.execInternal("ROLLBACK")
		}
		return err
	}
	if err := c.execInternal("COMMIT"); err != nil {
		if C.sqlite3_get_autocommit(c.db) == 0 {
			_ = c.execInternal("ROLLBACK")
		}
		_ = db.setHook(c, nil, nil)
		return err
	}
	// As after SetCommitHook's job: the hook sees the (empty) commit that
	// closed its attach.
	return db.committed(c)
}

// Path is the database file's path (its WAL is Path()+"-wal").
func (db *DB) Path() string { return db.path }

// committed runs the hook after a successful COMMIT (writer goroutine).
func (db *DB) committed(c *conn) error {
	if db.hook == nil {
		return nil
	}
	return db.hook.h.Committed(HookConn{c: c, frames: db.hook.frames})
}

// hookClosing tells the hook that the writer is stopping (writer goroutine).
func (db *DB) hookClosing() {
	if db.hook == nil {
		return
	}
	if hc, ok := db.hook.h.(CommitHookCloser); ok {
		hc.Closing()
	}
}
