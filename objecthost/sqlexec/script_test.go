package sqlexec

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	v4 "github.com/shoaldb/shoal/internal/v4"
)

// lines feeds ExecScript from a slice.
func lines(stmts ...string) func() (string, error) {
	i := 0
	return func() (string, error) {
		if i == len(stmts) {
			return "", io.EOF
		}
		i++
		return stmts[i-1], nil
	}
}

func scriptErr(t *testing.T, err error) *ScriptError {
	t.Helper()
	var se *ScriptError
	require.True(t, errors.As(err, &se), "error %v (%T) is not *ScriptError", err, err)
	return se
}

func TestExecScriptCommitsAndCounts(t *testing.T) {
	db, _ := openTest(t, Options{})
	var progress []int
	res, err := db.ExecScript(context.Background(), lines(
		"CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)",
		"CREATE INDEX t_v ON t(v)",
		"  ",
		"INSERT INTO t VALUES (1, 'a'), (2, 'b')",
		"INSERT INTO t VALUES (3, 'c'); UPDATE t SET v = 'z' WHERE id = 1",
		"SELECT * FROM t",
	), ScriptOptions{ProgressEvery: 2, Progress: func(n int) { progress = append(progress, n) }})
	require.NoError(t, err)
	require.Equal(t, 5, res.Statements, "blank strings are not counted")
	// D1's counts: CREATE TABLE writes its schema row twice (insert, then
	// the update that fills in its root page), CREATE INDEX once (and no
	// entries: the table is empty); 3 inserts × (row + index); the update
	// of an indexed column writes the row and the new index entry (the
	// old entry's delete is not counted).
	require.Equal(t, int64(2+1+3*2+2), res.RowsWritten)
	require.Equal(t, int64(4), res.Changes)
	require.Positive(t, res.RowsRead)
	require.Positive(t, res.SizeAfter)
	require.Equal(t, []int{2, 4, 5}, progress)
	require.Equal(t, int64(3), scalar(t, db, "SELECT count(*) FROM t"))
	require.Equal(t, "z", scalar(t, db, "SELECT v FROM t WHERE id = 1"))
	// The writer's statement cache was not filled with the script's SQL.
	require.Empty(t, db.writerConn.stmts["INSERT INTO t VALUES (1, 'a'), (2, 'b')"])
}

func TestExecScriptFailureRollsBackEverything(t *testing.T) {
	db, _ := openTest(t, Options{})
	run(t, db, stmt("CREATE TABLE keep(x)"), stmt("INSERT INTO keep VALUES (1)"))
	_, err := db.ExecScript(context.Background(), lines(
		"CREATE TABLE a(x)",
		"INSERT INTO keep VALUES (2)",
		"INSERT INTO nope VALUES (3)",
		"INSERT INTO a VALUES (4)",
	), ScriptOptions{})
	se := scriptErr(t, err)
	require.Equal(t, 3, se.Statement)
	require.ErrorIs(t, err, ErrSQL)
	require.Contains(t, err.Error(), "no such table: nope")
	require.Equal(t, int64(1), scalar(t, db, "SELECT count(*) FROM keep"))
	e := runErr(t, db, stmt("SELECT * FROM a"))
	require.Contains(t, e.Message, "no such table: a")
	// The writer works normally afterwards.
	run(t, db, stmt("INSERT INTO keep VALUES (5)"))
}

// Every request of the hostile corpus, as the second statement of a script,
// is refused and leaves the database (and its directory) untouched: a
// script is held to exactly the rules of user SQL.
func TestExecScriptHostileCorpus(t *testing.T) {
	for _, p := range hostileFiles {
		_ = os.Remove(p)
	}
	db, path := openTest(t, Options{})
	run(t, db,
		stmt("CREATE TABLE victim(a INTEGER PRIMARY KEY AUTOINCREMENT, b)"),
		stmt("INSERT INTO victim(b) VALUES ('keep')"),
		stmt("CREATE VIRTUAL TABLE ftsv USING fts5(x)"),
		stmt("INSERT INTO ftsv VALUES ('hello world')"),
	)
	_, err := hostConn(t, path).Exec("CREATE TABLE _shoal_meta(k TEXT PRIMARY KEY, v TEXT); INSERT INTO _shoal_meta VALUES ('owner', 'acct-1')")
	require.NoError(t, err)
	before := fingerprint(t, path)
	for _, line := range readCorpus(t) {
		_, err := db.ExecScript(context.Background(), lines("INSERT INTO victim(b) VALUES ('script')", line), ScriptOptions{DeferForeignKeys: true})
		if !assert.Error(t, err, "not refused: %s", line) {
			continue
		}
		se := scriptErr(t, err)
		assert.Equal(t, 2, se.Statement, "%s: %v", line, err)
		var e *Error
		require.True(t, errors.As(err, &e), "%s: %v", line, err)
		assert.Contains(t, []int{v4.CodeSQL, v4.CodeInvalidRequest}, e.Code, "%s: %s", line, e.Message)
		assert.NotContains(t, e.Message, path)
	}
	assert.Equal(t, before, fingerprint(t, path), "the database or its directory changed")
	for _, p := range hostileFiles {
		_, err := os.Stat(p)
		assert.True(t, errors.Is(err, os.ErrNotExist), "%s was created", p)
	}
	assert.Equal(t, int64(1), count(t, db, "victim"))
}

func TestExecScriptDeferredForeignKeys(t *testing.T) {
	db, _ := openTest(t, Options{})
	schema := []string{"CREATE TABLE p(id INTEGER PRIMARY KEY)", "CREATE TABLE c(pid REFERENCES p(id))"}
	// Child before parent: fine when deferred to the end.
	_, err := db.ExecScript(context.Background(), lines(append(schema, "INSERT INTO c VALUES (1)", "INSERT INTO p VALUES (1)")...), ScriptOptions{DeferForeignKeys: true})
	require.NoError(t, err)
	// Not deferred: the statement itself fails.
	_, err = db.ExecScript(context.Background(), lines("INSERT INTO c VALUES (2)", "INSERT INTO p VALUES (2)"), ScriptOptions{})
	require.Equal(t, 1, scriptErr(t, err).Statement)
	// Deferred and never resolved: the script fails as a whole.
	_, err = db.ExecScript(context.Background(), lines("INSERT INTO p VALUES (3)", "INSERT INTO c VALUES (99)"), ScriptOptions{DeferForeignKeys: true})
	se := scriptErr(t, err)
	require.Equal(t, 0, se.Statement)
	require.ErrorContains(t, err, "FOREIGN KEY constraint failed")
	require.Equal(t, int64(1), scalar(t, db, "SELECT count(*) FROM p"))
	// defer_foreign_keys did not outlive the script: a request's
	// violation fails immediately again.
	e := runErr(t, db, stmt("INSERT INTO c VALUES (98)"))
	require.Contains(t, e.Message, "FOREIGN KEY")
}

func TestExecScriptLimits(t *testing.T) {
	lim := DefaultLimits()
	lim.MaxSQLBytes = 200
	lim.MaxDatabaseBytes = 256 * 1024
	db, _ := openTest(t, Options{Limits: lim})
	long := "INSERT INTO t VALUES ('" + strings.Repeat("a", 300) + "')"

	_, err := db.ExecScript(context.Background(), lines("CREATE TABLE t(x)", long), ScriptOptions{})
	require.Equal(t, 2, scriptErr(t, err).Statement)
	require.ErrorIs(t, err, ErrTooLarge)
	_, err = db.ExecScript(context.Background(), lines("CREATE TABLE t(x)", long), ScriptOptions{MaxStatementBytes: 1000})
	require.NoError(t, err, "MaxStatementBytes relaxes the statement length only")

	// max_page_count is the DB's: a script cannot grow past it.
	_, err = db.ExecScript(context.Background(), lines("INSERT INTO t SELECT randomblob(100000) FROM (SELECT 1 UNION SELECT 2 UNION SELECT 3)"), ScriptOptions{})
	require.ErrorIs(t, err, ErrStorageLimit)
	// Value length (SQLITE_LIMIT_LENGTH) is the DB's too.
	_, err = db.ExecScript(context.Background(), lines("SELECT randomblob(3000000)"), ScriptOptions{})
	require.ErrorIs(t, err, ErrTooLarge)

	// BlockGrowth: growing is refused, shrinking is fine.
	_, err = db.ExecScript(context.Background(), lines("INSERT INTO t SELECT randomblob(50000)"), ScriptOptions{BlockGrowth: true})
	se := scriptErr(t, err)
	require.Equal(t, 0, se.Statement)
	require.ErrorIs(t, err, ErrStorageLimit)
	_, err = db.ExecScript(context.Background(), lines("DELETE FROM t"), ScriptOptions{BlockGrowth: true})
	require.NoError(t, err)
}

func TestExecScriptCanceled(t *testing.T) {
	db, _ := openTest(t, Options{})
	run(t, db, stmt("CREATE TABLE t(x)"))
	// Canceled between statements.
	ctx, cancel := context.WithCancel(context.Background())
	next := lines("INSERT INTO t VALUES (1)", "INSERT INTO t VALUES (2)", "INSERT INTO t VALUES (3)")
	n := 0
	_, err := db.ExecScript(ctx, func() (string, error) {
		n++
		if n == 2 {
			cancel()
		}
		return next()
	}, ScriptOptions{})
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, 2, scriptErr(t, err).Statement)
	require.ErrorIs(t, err, ErrTimeout)
	require.Equal(t, int64(0), scalar(t, db, "SELECT count(*) FROM t"))

	// Canceled inside a statement that would run forever: interrupted.
	ctx, cancel = context.WithCancel(context.Background())
	started := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := db.ExecScript(ctx, lines("INSERT INTO t VALUES (1)", "SELECT (SELECT 1) AS go",
			"WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM c) SELECT count(*) FROM c"),
			ScriptOptions{ProgressEvery: 2, Progress: func(int) { close(started) }})
		done <- err
	}()
	<-started
	cancel()
	err = <-done
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, 3, scriptErr(t, err).Statement)
	require.Equal(t, int64(0), scalar(t, db, "SELECT count(*) FROM t"))
}

// While a script holds the writer, a write queues behind it and succeeds
// after its COMMIT (here it needs the table the script creates), and
// reads — including SQL the DB has never seen — are answered by the
// readers from the snapshot before the script.
func TestExecScriptWritesWaitReadsRun(t *testing.T) {
	db, _ := openTest(t, Options{})
	run(t, db, stmt("CREATE TABLE before(x)"), stmt("INSERT INTO before VALUES (1)"))
	release := make(chan struct{})
	first, n := true, 0
	next := lines("INSERT INTO before VALUES (2)", "CREATE TABLE made(x)", "INSERT INTO made VALUES ('script')")
	scriptDone := make(chan error, 1)
	inScript := make(chan struct{})
	go func() {
		_, err := db.ExecScript(context.Background(), func() (string, error) {
			if first {
				first = false
			} else if n++; n == 2 {
				close(inScript)
				<-release // hold the writer, mid-transaction
			}
			return next()
		}, ScriptOptions{})
		scriptDone <- err
	}()
	<-inScript

	// Reads run concurrently, from the pre-script snapshot.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // bounds a hang only
	defer cancel()
	res, err := db.Execute(ctx, Request{Statements: []Statement{stmt("SELECT count(*) AS n FROM before /* never seen */")}})
	require.NoError(t, err, "a read must not queue behind the script")
	require.EqualValues(t, 1, res[0].Results.(Rows)[0].Values()[0], "the script is not visible before its COMMIT")

	// A write queues behind the script.
	writeDone := make(chan error, 1)
	go func() {
		_, err := db.Execute(context.Background(), Request{Statements: []Statement{stmt("INSERT INTO made VALUES ('user')")}})
		writeDone <- err
	}()
	for len(db.writeQ) == 0 {
		time.Sleep(time.Millisecond) // until the write is queued (no timing assertion)
	}
	close(release)
	require.NoError(t, <-scriptDone)
	require.NoError(t, <-writeDone, "the queued write runs after the script, not a busy failure")
	require.Equal(t, int64(2), scalar(t, db, "SELECT count(*) FROM made"))
	require.Equal(t, int64(2), scalar(t, db, "SELECT count(*) FROM before"))
	require.Equal(t, "user", scalar(t, db, "SELECT x FROM made ORDER BY rowid DESC LIMIT 1"))
}

// A script queued behind requests that are being grouped is not pulled
// into their transaction: it runs alone, after them, in order.
func TestExecScriptNotGrouped(t *testing.T) {
	db, _ := openTest(t, Options{})
	db.maxGroupTime = time.Hour // gather everything queued
	run(t, db, stmt("CREATE TABLE t(x)"))
	gate, entered := make(chan struct{}), make(chan struct{})
	hold := make(chan error, 1)
	go func() { // occupies the writer so the rest queue up
		_, err := db.ExecScript(context.Background(), func() (string, error) { close(entered); <-gate; return "", io.EOF }, ScriptOptions{})
		hold <- err
	}()
	<-entered
	errs := make(chan error, 3)
	send := func(sql string) {
		go func() {
			_, err := db.Execute(context.Background(), Request{Statements: []Statement{stmt(sql)}})
			errs <- err
		}()
	}
	send("INSERT INTO t VALUES (1)")
	for len(db.writeQ) < 1 {
		time.Sleep(time.Millisecond) // until the write is queued
	}
	scriptRes := make(chan error, 1)
	go func() {
		_, err := db.ExecScript(context.Background(), lines("INSERT INTO t SELECT count(*) * 10 FROM t"), ScriptOptions{})
		scriptRes <- err
	}()
	for len(db.writeQ) < 2 {
		time.Sleep(time.Millisecond) // until the write is queued
	}
	send("INSERT INTO t VALUES (3)")
	for len(db.writeQ) < 3 {
		time.Sleep(time.Millisecond) // until the write is queued
	}
	commits := db.commits.Load()
	close(gate)
	require.NoError(t, <-hold)
	require.NoError(t, <-scriptRes)
	require.NoError(t, <-errs)
	require.NoError(t, <-errs)
	require.Equal(t, int64(4), db.commits.Load()-commits, "empty script, group, script, group")
	// The script saw exactly the first insert: it ran after it and before
	// the third, each in its own transaction.
	res := run(t, db, stmt("SELECT group_concat(x, ',') FROM (SELECT x FROM t ORDER BY rowid)"))
	require.Equal(t, "1,10,3", fmt.Sprint(res[0].Results.(Rows)[0].Values()[0]))
}

func TestExecScriptAfterClose(t *testing.T) {
	db, _ := openTest(t, Options{})
	require.NoError(t, db.Close())
	_, err := db.ExecScript(context.Background(), lines("CREATE TABLE t(x)"), ScriptOptions{})
	require.ErrorIs(t, err, ErrClosed)
}

// sqlite_sequence is writable in a script that asks for it (a dump
// restoring AUTOINCREMENT counters), never in user SQL, and the permission
// does not leak into later requests through the statement cache.
func TestExecScriptSequenceWrites(t *testing.T) {
	db, _ := openTest(t, Options{})
	run(t, db, stmt("CREATE TABLE a(id INTEGER PRIMARY KEY AUTOINCREMENT, x)"), stmt("INSERT INTO a(x) VALUES (1)"))
	const upd = "UPDATE sqlite_sequence SET seq = 100 WHERE name = 'a'"
	_, err := db.ExecScript(context.Background(), lines(upd), ScriptOptions{})
	require.Contains(t, errDetail(t, err), "writes to internal table not allowed")
	_, err = db.ExecScript(context.Background(), lines(upd), ScriptOptions{AllowSequenceWrites: true})
	require.NoError(t, err)
	require.Equal(t, int64(100), scalar(t, db, "SELECT seq FROM sqlite_sequence WHERE name = 'a'"))
	e := runErr(t, db, stmt(upd))
	require.Equal(t, "not authorized: SQLITE_AUTH", e.Message, "D1's text")
	require.Contains(t, e.Detail, "writes to internal table not allowed")
	_, err = db.ExecScript(context.Background(), lines("ANALYZE", "DELETE FROM sqlite_stat1"), ScriptOptions{AllowSequenceWrites: true})
	require.Equal(t, 2, scriptErr(t, err).Statement)
	require.Contains(t, errDetail(t, err), "writes to internal table not allowed", "only sqlite_sequence")
}

// errDetail is the sandbox's reason inside a script's error.
func errDetail(t *testing.T, err error) string {
	t.Helper()
	var e *Error
	require.True(t, errors.As(err, &e), "%v is not an *Error", err)
	return e.Detail
}

// TestExecScriptRecord: Record's statements commit in the script's own
// transaction (outside the sandbox: a reserved table), with what the script
// did; a script that fails leaves no record; user SQL cannot read it.
func TestExecScriptRecord(t *testing.T) {
	db, _ := openTest(t, Options{})
	rec := func(name string) func(ScriptResult) ([]InternalStatement, error) {
		return func(r ScriptResult) ([]InternalStatement, error) {
			return []InternalStatement{
				{SQL: "CREATE TABLE IF NOT EXISTS _shoal_rec(name TEXT PRIMARY KEY, n INTEGER)"},
				{SQL: "INSERT INTO _shoal_rec VALUES (?, CAST(? AS INTEGER))", Args: []string{name, fmt.Sprint(r.Statements)}},
			}, nil
		}
	}
	_, err := db.ExecScript(context.Background(), lines("CREATE TABLE a(x)", "INSERT INTO nope VALUES (1)"), ScriptOptions{Record: rec("failed")})
	scriptErr(t, err)
	n, err := db.InternalStrings("SELECT count(*) FROM sqlite_schema WHERE name = ?", "_shoal_rec")
	require.NoError(t, err)
	require.Equal(t, []string{"0"}, n, "a failed script leaves no record")

	res, err := db.ExecScript(context.Background(), lines("CREATE TABLE a(x)", "INSERT INTO a VALUES (1)"), ScriptOptions{Record: rec("ok")})
	require.NoError(t, err)
	require.Equal(t, 2, res.Statements)
	row, err := db.InternalStrings("SELECT name, n FROM _shoal_rec WHERE name = ?", "ok")
	require.NoError(t, err)
	require.Equal(t, []string{"ok", "2"}, row)
	e := runErr(t, db, stmt("SELECT * FROM _shoal_rec"))
	require.Contains(t, e.Message, "prohibited")
}

// failingHook refuses every commit's acknowledgement once fail is set (as
// history's capturer does in durability "archived" without the archive).
type failingHook struct{ fail atomic.Bool }

func (h *failingHook) Committed(HookConn) error {
	if h.fail.Load() {
		return &Error{Code: v4.CodeUnavailable, Statement: -1, Message: "not archived"}
	}
	return nil
}

// TestExecScriptCommittedError: a script whose commit the hook refused to
// acknowledge is committed: ExecScript says so (*CommittedError, not a
// *ScriptError) and returns its result.
func TestExecScriptCommittedError(t *testing.T) {
	h := &failingHook{}
	db, _ := openTest(t, Options{CommitHook: h})
	h.fail.Store(true)
	res, err := db.ExecScript(context.Background(), lines("CREATE TABLE a(x)", "INSERT INTO a VALUES (1), (2)"), ScriptOptions{})
	var ce *CommittedError
	require.True(t, errors.As(err, &ce), "%v (%T)", err, err)
	var se *ScriptError
	require.False(t, errors.As(err, &se))
	require.Equal(t, 2, res.Statements)
	require.Positive(t, res.SizeAfter)
	n, err := db.InternalStrings("SELECT count(*) FROM a WHERE ? = ''", "")
	require.NoError(t, err)
	require.Equal(t, []string{"2"}, n)
}

// atomicHook counts the commits it is told about (read from any goroutine).
type atomicHook struct{ n atomic.Int64 }

func (h *atomicHook) Committed(HookConn) error { h.n.Add(1); return nil }

// TestExecScriptRecordHeaderAndAfterCommit: a Record statement's text may
// vary (PRAGMA application_id=N cannot bind N), it sets the header inside
// the script's transaction where user SQL cannot read it; a Record error
// rolls the script back; AfterCommit runs after the script's commit and
// before a write queued behind the script commits.
func TestExecScriptRecordHeaderAndAfterCommit(t *testing.T) {
	h := &atomicHook{}
	db, _ := openTest(t, Options{CommitHook: h})
	appID := func() string {
		v, err := db.InternalStrings("SELECT application_id FROM pragma_application_id WHERE ? = ''", "")
		require.NoError(t, err)
		return v[0]
	}
	tag := func(n int) func(ScriptResult) ([]InternalStatement, error) {
		return func(ScriptResult) ([]InternalStatement, error) {
			return []InternalStatement{{SQL: fmt.Sprintf("PRAGMA application_id=%d", n)}}, nil
		}
	}
	_, err := db.ExecScript(context.Background(), lines("CREATE TABLE a(x)"), ScriptOptions{Record: func(ScriptResult) ([]InternalStatement, error) {
		return nil, errors.New("job file not written")
	}})
	require.ErrorContains(t, err, "job file not written")
	_, err = db.Execute(context.Background(), Request{Statements: []Statement{stmt("SELECT * FROM a")}})
	require.ErrorContains(t, err, "no such table", "a Record error rolls the script back")

	_, err = db.ExecScript(context.Background(), lines("CREATE TABLE a(x)"), ScriptOptions{Record: tag(7)})
	require.NoError(t, err)
	require.Equal(t, "7", appID())
	e := runErr(t, db, stmt("PRAGMA application_id"))
	require.Contains(t, e.Detail, "PRAGMA not allowed")

	// A write queued while the script runs commits after AfterCommit.
	var before, atAfter int64
	queued := make(chan error, 1)
	_, err = db.ExecScript(context.Background(), lines("INSERT INTO a VALUES (1)"), ScriptOptions{
		Record: func(r ScriptResult) ([]InternalStatement, error) {
			before = h.n.Load() // on the writer: every earlier commit's hook ran
			go func() {
				_, err := db.Execute(context.Background(), Request{Statements: []Statement{stmt("INSERT INTO a VALUES (2)")}})
				queued <- err
			}()
			assert.Eventually(t, func() bool { return len(db.writeQ) > 0 }, 10*time.Second, time.Millisecond, "the write queued behind the script")
			return tag(8)(r)
		},
		AfterCommit: func() { atAfter = h.n.Load() },
	})
	require.NoError(t, err)
	require.NoError(t, <-queued)
	assert.Equal(t, before+1, atAfter, "AfterCommit sees the script's commit and no later one")
	assert.Equal(t, before+2, h.n.Load())
	require.Equal(t, "8", appID(), "set again to another value (statement text varies)")
}
