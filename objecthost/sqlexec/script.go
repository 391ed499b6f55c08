package sqlexec

/*
#include "shim.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"
	"unsafe"

	v4 "github.com/shoaldb/shoal/internal/v4"
)

// ScriptOptions configure ExecScript.
type ScriptOptions struct {
	// Progress, when set, is called on the writer goroutine every
	// ProgressEvery statements with the number run so far. It must return
	// quickly and must not call into this DB (the writer is busy with the
	// script: that would deadlock).
	Progress func(statements int)
	// ProgressEvery defaults to 1000.
	ProgressEvery int
	// DeferForeignKeys runs the script with PRAGMA defer_foreign_keys=ON:
	// foreign keys are checked once, at the end, so a dump may insert child
	// rows before their parents.
	DeferForeignKeys bool
	// BlockGrowth is Request.BlockGrowth for the whole script: a script that
	// grows the file is rolled back with CodeStorageLimit.
	BlockGrowth bool
	// MaxStatementBytes, when > 0, replaces Limits.MaxSQLBytes for the
	// script's statements. It is the one limit a script may relax: a dump
	// carries values as literals (a 2 MB blob is a 4 MB statement) that user
	// SQL would bind as parameters. Every other limit is the DB's.
	MaxStatementBytes int
	// AllowSequenceWrites lets the script INSERT, UPDATE and DELETE rows of
	// sqlite_sequence, which .dump output does to restore AUTOINCREMENT
	// counters (and SQLite documents as legitimate); user SQL may not. It
	// is the sandbox's only script-specific rule (shim.c, allow_seq).
	AllowSequenceWrites bool
	// Record, when set, is called once every statement of the script ran
	// and its deferred checks passed, inside its transaction and just
	// before the COMMIT, with what the script did (SizeAfter measured
	// there); the internal statements it returns run in that transaction,
	// outside the sandbox (they may set PRAGMA application_id, or write
	// reserved _shoal_* tables) and uncounted, so they commit with the
	// script or not at all. It runs on the writer goroutine (it may do
	// I/O, e.g. fsync a file, but must not call into this DB). An error
	// from it, or a failing statement, rolls the script back
	// (*ScriptError, Statement 0).
	Record func(ScriptResult) ([]InternalStatement, error)
	// AfterCommit, when set, is called on the writer goroutine once the
	// script's COMMIT succeeded and the commit hook ran (whatever it
	// answered), before any other transaction of this DB can begin: the
	// database's state is exactly the script's (e.g. the history
	// capturer's current position is the script's commit). It must not
	// call into this DB.
	AfterCommit func()
}

// InternalStatement is one statement of ScriptOptions.Record: SQL with ?
// parameters, bound in order to Args as text. Its text may vary (a
// PRAGMA's value cannot be a parameter): record statements are prepared
// for the one run and not cached.
type InternalStatement struct {
	SQL  string
	Args []string
}

// CommittedError is ExecScript's error when the script committed but the
// commit hook failed its acknowledgement (CommitHook: e.g. durability
// "archived" and the archive store did not confirm). Unlike a
// *ScriptError, the script's changes are in the database, and ExecScript
// returns its ScriptResult with this error.
type CommittedError struct {
	Err error // the hook's error (an *Error with CodeUnavailable for "archived")
}

func (e *CommittedError) Error() string { return "committed, then: " + e.Err.Error() }
func (e *CommittedError) Unwrap() error { return e.Err }

// ScriptResult is what a committed script did.
type ScriptResult struct {
	Statements  int   // statements run (blank strings are not counted)
	RowsRead    int64 // D1's rows_read, summed over the statements
	RowsWritten int64 // D1's rows_written (rows + index entries), summed
	Changes     int64 // sqlite3_changes, summed
	SizeAfter   int64 // database bytes after the COMMIT ((page_count − freelist_count) × page_size, as a request's size_after)
}

// ScriptError is an ExecScript failure. Nothing of the script was kept.
type ScriptError struct {
	// Statement is the 1-based number of the failing statement (the
	// Statement-th non-blank string next returned), 0 when the failure is
	// the script's as a whole: deferred foreign keys at the end,
	// BlockGrowth, the COMMIT, or cancellation before it started.
	Statement int
	// Err is an *Error for SQL failures and limits, ErrClosed, or the error
	// next returned.
	Err error
	// canceled is the caller's context error when the script was
	// interrupted by it (errors.Is(err, context.Canceled) then holds).
	canceled error
}

func (e *ScriptError) Error() string {
	if e.Statement > 0 {
		return fmt.Sprintf("statement %d: %v", e.Statement, e.Err)
	}
	return e.Err.Error()
}

// Unwrap exposes Err and, when the caller canceled, its context's error.
func (e *ScriptError) Unwrap() []error {
	if e.canceled != nil {
		return []error{e.Err, e.canceled}
	}
	return []error{e.Err}
}

type scriptJob struct {
	ctx  context.Context
	next func() (string, error)
	opt  ScriptOptions
	res  ScriptResult
	// committed is set by the writer once the script's COMMIT succeeded,
	// before its commit hook runs (read after done is closed).
	committed bool
}

// scriptQueueRetry is how often ExecScript retries to queue while the
// writer queue is full: a script is a long job whose caller (an import)
// would rather wait for room than fail with CodeOverloaded.
const scriptQueueRetry = 5 * time.Millisecond

// ExecScript runs a stream of statements on the writer connection as ONE
// transaction, under exactly the sandbox of user SQL (the same authorizer,
// defensive mode, limits and max_page_count) and counting rows read and
// written as Execute does. next returns the statements one at a time
// (each string may hold several; blank ones are skipped) and io.EOF at the
// end; it runs on the writer goroutine and must not call into this DB.
//
// The script is queued like any write (in arrival order; while the queue is
// full ExecScript waits for room) and then runs alone, never sharing a
// transaction with other requests: writes that arrive meanwhile wait behind
// it in the queue (each within its own QueryTimeout) and run after its
// COMMIT; reads keep running on the reader connections and see the
// database as it was before the script until it commits (WAL).
//
// Statements holding a NUL or invalid UTF-8 fail (CodeInvalidRequest) as
// for Execute, instead of running up to the NUL.
//
// All or nothing: a failing statement, a limit, the deferred foreign-key
// check, ctx's end (SQLite is interrupted) or Close rolls everything back
// and returns a *ScriptError. The one error after which the script HAS
// applied is a *CommittedError (the commit hook refused the acknowledgement). Each statement is bounded by
// Limits.QueryTimeout; the script as a whole only by ctx.
func (db *DB) ExecScript(ctx context.Context, next func() (string, error), opt ScriptOptions) (ScriptResult, error) {
	if opt.ProgressEvery <= 0 {
		opt.ProgressEvery = 1000
	}
	sj := &scriptJob{ctx: ctx, next: next, opt: opt}
	j := &job{script: sj, done: make(chan struct{})}
	db.scripts.Add(1)
	defer db.scripts.Add(-1)
	for {
		err := db.enqueue(j)
		if err == nil {
			break
		}
		if !errors.Is(err, ErrOverloaded) {
			return ScriptResult{}, err
		}
		select {
		case <-ctx.Done():
			return ScriptResult{}, &ScriptError{Err: ctxError(ctx), canceled: ctx.Err()}
		case <-time.After(scriptQueueRetry):
		}
	}
	<-j.done
	if j.err != nil && sj.committed {
		return sj.res, &CommittedError{Err: j.err}
	}
	return sj.res, j.err
}

// script is ExecScript's body on the writer connection. Checkpoint: the
// COMMIT; before it nothing of the script is visible or durable.
func (db *DB) script(c *conn, sj *scriptJob) (res ScriptResult, err error) {
	ctx, opt := sj.ctx, sj.opt
	fail := func(n int, e error) (ScriptResult, error) {
		se := &ScriptError{Statement: n, Err: e}
		if ctx.Err() != nil {
			se.canceled = ctx.Err()
			if _, ok := e.(*Error); ok {
				se.Err = ctxError(ctx)
			}
		}
		return ScriptResult{}, se
	}
	if db.isClosed() {
		return ScriptResult{}, ErrClosed
	}
	if ctx.Err() != nil {
		return fail(0, ctxError(ctx))
	}
	if err := c.execInternal("BEGIN IMMEDIATE"); err != nil {
		return fail(0, err)
	}
	// Statements prepared from here on are never cached (scriptNoCache):
	// that is also what keeps allow_seq from outliving the script.
	c.scriptNoCache, c.scriptSQLBytes = true, opt.MaxStatementBytes
	if opt.AllowSequenceWrites {
		c.sc.allow_seq = 1
	}
	st := reqState{base: db.base, discard: true}
	committed := false
	defer func() {
		c.scriptNoCache, c.scriptSQLBytes = false, 0
		c.sc.allow_seq = 0
		C.shoal_clear_recs(c.sc)
		if !committed && C.sqlite3_get_autocommit(c.db) == 0 {
			_ = c.execInternal("ROLLBACK")
		}
		if st.ddl {
			// Cached column names and index info (rows_written) are
			// refreshed, whether the script committed or not.
			c.schemaGen.Add(1)
		}
	}()
	if opt.DeferForeignKeys {
		if err := c.execInternal("PRAGMA defer_foreign_keys=ON"); err != nil {
			return fail(0, err)
		}
	}
	var pagesBefore int64
	if opt.BlockGrowth {
		if pagesBefore, err = c.queryInt("PRAGMA page_count"); err != nil {
			return fail(0, err)
		}
	}
	var results []StatementResult
	for {
		if db.isClosed() {
			return fail(res.Statements, ErrClosed)
		}
		sql, err := sj.next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fail(res.Statements, err)
		}
		if isBlank(sql) {
			continue
		}
		res.Statements++
		if e := checkSQL(sql); e != nil {
			// SQLite would run the text before a NUL and drop the rest.
			return fail(res.Statements, e)
		}
		rq := newReqCtx(ctx, db.lim.QueryTimeout)
		if e := rq.err(); e != nil {
			return fail(res.Statements, e)
		}
		req := Request{Statements: []Statement{{SQL: sql}}}
		st.stmtIdx = 0
		c.armCancel(rq)
		results, err = c.runSQL(rq, &req, 0, nil, &st, results[:0])
		if err == nil && c.canceled() {
			err = rq.cancelError()
		}
		c.disarmCancel()
		if err == nil && C.sqlite3_get_autocommit(c.db) != 0 {
			// Cannot happen for statements the authorizer lets through;
			// never commit half a script if it somehow does.
			err = sqlErr(v4.CodeSQL, -1, "the script's transaction ended early: SQLITE_ERROR")
		}
		if err != nil {
			return fail(res.Statements, err)
		}
		for i := range results {
			m := &results[i].Meta
			res.RowsRead += m.RowsRead
			res.RowsWritten += m.RowsWritten
			res.Changes += m.Changes
		}
		if opt.Progress != nil && res.Statements%opt.ProgressEvery == 0 {
			opt.Progress(res.Statements)
		}
	}
	if opt.BlockGrowth {
		after, err := c.queryInt("PRAGMA page_count")
		if err != nil {
			return fail(0, err)
		}
		if after > pagesBefore {
			return fail(0, sqlErr(v4.CodeStorageLimit, -1, "storage limit exceeded: the import would grow the database while it is at its size limit or its account is over its storage limit: SQLITE_FULL"))
		}
	}
	if C.shoal_deferred_fks(c.db) != 0 {
		// COMMIT would fail too, but leave the transaction open; say it
		// the way a request's deferred check does.
		return fail(0, sqlErr(v4.CodeSQL, -1, "FOREIGN KEY constraint failed: SQLITE_CONSTRAINT (extended: SQLITE_CONSTRAINT_FOREIGNKEY)"))
	}
	if opt.Record != nil {
		if size, err := c.usedBytes(); err == nil {
			res.SizeAfter = size
		}
		stmts, err := opt.Record(res)
		if err != nil {
			return fail(0, err)
		}
		for _, is := range stmts {
			if err := c.execOnce(is.SQL, is.Args); err != nil {
				return fail(0, err)
			}
		}
		st.ddl = true // the record may have created its table
	}
	if st.ddl {
		c.schemaGen.Add(1) // before COMMIT too: see runGroup
	}
	if err := c.execInternal("COMMIT"); err != nil { // the checkpoint
		return fail(0, err)
	}
	committed = true
	db.commits.Add(1)
	if size, err := c.usedBytes(); err == nil { // the measure a request's size_after uses
		res.SizeAfter = size
		c.sizeHint.Store(size)
	}
	if opt.Progress != nil && res.Statements%opt.ProgressEvery != 0 {
		opt.Progress(res.Statements)
	}
	return res, nil
}

// execOnce is execInternalArgs for a statement that is not cached: it is
// prepared for this one run and finalized.
func (c *conn) execOnce(sql string, args []string) error {
	csql := C.CString(sql)
	defer C.free(unsafe.Pointer(csql))
	var s *C.sqlite3_stmt
	var consumed C.int
	c.sc.user = 0
	if rc := C.shoal_prepare(c.db, csql, C.int(len(sql)), &s, &consumed, 0); rc != rcOK {
		return fmt.Errorf("sqlexec: prepare %q: %s", sql, C.GoString(C.sqlite3_errmsg(c.db)))
	}
	defer C.sqlite3_finalize(s)
	return c.stepInternal(s, args)
}

// execInternalArgs runs an internal statement (outside the sandbox) with
// its ? parameters bound to args as text.
func (c *conn) execInternalArgs(sql string, args []string) error {
	s, err := c.internalStmt(sql)
	if err != nil {
		return err
	}
	return c.stepInternal(s, args)
}

// stepInternal binds args to the internal statement s as text and runs it
// to completion (rows are discarded), leaving it reset.
func (c *conn) stepInternal(s *C.sqlite3_stmt, args []string) error {
	c.sc.user = 0
	for i, a := range args {
		C.shoal_bind_text(s, C.int(i+1), (*C.char)(unsafe.Pointer(unsafe.StringData(a))), C.int(len(a)))
	}
	rc := C.sqlite3_step(s)
	for rc == rcRow {
		rc = C.sqlite3_step(s)
	}
	C.sqlite3_reset(s)
	if rc != rcDone {
		return c.errorFor(rc, -1)
	}
	return nil
}

// InternalStrings runs one read-only internal statement (outside the
// sandbox: it may read reserved _shoal_* tables, e.g. ScriptOptions.Record's)
// with one text argument on a reader connection, and returns every column
// of every row as text, flattened. Keep sql constant (statements are
// cached by their text); it must not write.
func (db *DB) InternalStrings(sql, arg string) ([]string, error) {
	var out []string
	err := db.inspect(func(c *conn) error {
		var err error
		out, err = c.queryStrings(sql, arg)
		return err
	})
	return out, err
}
