package sqlexec

/*
#include "shim.h"
*/
import "C"

import (
	"time"
)

// Group commit on the writer.
//
// The writer takes the request at the head of its queue plus the requests
// already queued behind it (up to maxGroup, and only while the group has run
// for less than maxGroupTime, so a request never waits long for others to
// finish) and runs them in one SQL transaction, each inside its own
// SAVEPOINT: a failing request is rolled back to its savepoint alone, and
// one COMMIT makes the group durable. This is D1's (Durable Objects')
// "automatic atomic write coalescing": every request stays atomic and
// isolated, runs in arrival order, and is acknowledged only after the
// COMMIT that contains it; the WAL append and lock round trip are paid once
// per group instead of once per request.
//
// Checkpoint: the COMMIT. Before it nothing of the group is visible or
// durable; if it fails, every request of the group that had succeeded gets
// the COMMIT's error, and nothing was written.
//
// SQLite rolls back the whole transaction on some errors (an interrupted
// write, SQLITE_FULL in some cases, I/O errors). The writer notices
// (autocommit is back on), fails only the request that caused it, and runs
// the group's earlier successful requests again in a fresh transaction:
// they were never acknowledged, so running them again is invisible to
// clients.

const (
	maxGroup            = 64
	defaultMaxGroupTime = 2 * time.Millisecond
)

// writer is the writer connection's loop. A script (ExecScript) never
// joins a group: it runs alone, in its own transaction, and a script met
// while a group is being gathered ends the gathering and runs right after
// that group's COMMIT (db.carry), so arrival order is kept.
func (db *DB) writer(c *conn) {
	defer db.wg.Done()
	group := make([]*job, 0, maxGroup)
	for {
		j := db.carry
		db.carry = nil
		if j == nil {
			var ok bool
			if j, ok = <-db.writeQ; !ok {
				db.hookClosing() // the last commit is behind us
				return
			}
		}
		if j.script != nil {
			res, err := db.script(c, j.script)
			j.script.res = res
			if err == nil {
				// After the script's COMMIT, before its acknowledgement.
				j.script.committed = true
				err = db.committed(c)
				if f := j.script.opt.AfterCommit; f != nil {
					f() // still alone on the writer: nothing committed since
				}
			}
			j.finish(nil, err)
			continue
		}
		group = append(group[:0], j)
		db.runGroup(c, group)
	}
}

// runGroup runs first and whatever is queued behind it as one transaction.
func (db *DB) runGroup(c *conn, group []*job) {
	start := time.Now()
	pending := group[:1]
	more := true
	for len(pending) > 0 {
		var done []*job // succeeded in this transaction, not yet acknowledged
		lost := false   // SQLite rolled the transaction back under us
		ddl := false
		if err := c.execInternal("BEGIN IMMEDIATE"); err != nil {
			for _, j := range pending {
				j.finish(nil, err)
			}
			return
		}
		for i := 0; ; i++ {
			var j *job
			switch {
			case i < len(pending):
				j = pending[i]
			case more && len(pending) < maxGroup && time.Since(start) < db.maxGroupTime:
				j = db.tryDequeueWrite()
				if j == nil {
					more = false
				} else {
					pending = append(pending, j)
				}
			}
			if j == nil {
				break
			}
			if db.isClosed() {
				j.finish(nil, ErrClosed)
				continue
			}
			if e := j.rq.err(); e != nil {
				j.finish(nil, e)
				continue
			}
			res, jddl, err := db.runInSavepoint(c, j)
			ddl = ddl || jddl
			if err == nil {
				j.res = res
				done = append(done, j)
				continue
			}
			if C.sqlite3_get_autocommit(c.db) != 0 {
				// The whole transaction is gone: fail j alone, redo the rest.
				j.finish(nil, err)
				db.lostTxns.Add(1)
				lost = true
				pending = append(done, pending[i+1:]...)
				break
			}
			j.finish(nil, err)
		}
		if lost {
			if ddl {
				c.schemaGen.Add(1)
			}
			continue
		}
		if ddl {
			// Bumped before and after COMMIT: a reader caching column names
			// between the two bumps is refreshed by the second.
			c.schemaGen.Add(1)
		}
		err := c.execInternal("COMMIT") // the checkpoint
		db.commits.Add(1)
		if ddl {
			c.schemaGen.Add(1)
		}
		if err != nil {
			if C.sqlite3_get_autocommit(c.db) == 0 {
				_ = c.execInternal("ROLLBACK")
			}
			for _, j := range done {
				j.finish(nil, err)
			}
			return
		}
		// The commit hook (history capture) sees the transaction before
		// anyone is told it committed.
		herr := db.committed(c)
		for _, j := range done {
			if herr != nil {
				j.finish(nil, herr)
				continue
			}
			j.finish(j.res, nil)
		}
		return
	}
}

// runInSavepoint runs one request (or internal job) inside a savepoint of
// the group's transaction, rolling back to it on failure.
func (db *DB) runInSavepoint(c *conn, j *job) ([]StatementResult, bool, error) {
	if err := c.execInternal("SAVEPOINT shoal_request"); err != nil {
		return nil, false, err
	}
	var res []StatementResult
	var err error
	st := reqState{base: db.base, classify: db.classifyFn}
	if j.fn != nil {
		err = j.fn(c)
	} else {
		var params [][]param
		params, err = c.decodeParams(j.req)
		if err == nil {
			res, err = c.body(j.rq, j.req, params, &st)
		}
		c.releaseParams()
	}
	if err == nil {
		err = c.execInternal("RELEASE shoal_request")
	}
	if err != nil && C.sqlite3_get_autocommit(c.db) == 0 {
		_ = c.execInternal("ROLLBACK TO shoal_request")
		_ = c.execInternal("RELEASE shoal_request")
	}
	if st.deferFK && C.sqlite3_get_autocommit(c.db) == 0 {
		// SQLite resets defer_foreign_keys only at COMMIT/ROLLBACK; the
		// next request of the group must start without it.
		_ = c.execInternal("PRAGMA defer_foreign_keys=OFF")
	}
	if err != nil {
		return nil, st.ddl, err
	}
	return res, st.ddl, nil
}

// tryDequeueWrite returns the next queued request to add to the group, or
// nil. A script ends the group: it is kept in db.carry for the writer loop.
func (db *DB) tryDequeueWrite() *job {
	select {
	case j, ok := <-db.writeQ:
		if !ok {
			return nil
		}
		if j.script != nil {
			db.carry = j
			return nil
		}
		return j
	default:
		return nil
	}
}

func (j *job) finish(res []StatementResult, err error) {
	j.res, j.err = res, err
	close(j.done)
}
