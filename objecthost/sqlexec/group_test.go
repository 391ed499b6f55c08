package sqlexec

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	v4 "github.com/shoaldb/shoal/internal/v4"
)

// blockWriter parks the writer on an internal job until release is closed,
// so that requests queue up behind it and form one group.
func blockWriter(t *testing.T, db *DB) (release func()) {
	t.Helper()
	ch := make(chan struct{})
	started := make(chan struct{})
	var once sync.Once // the writer may run a job again after a lost transaction
	j := &job{rq: newReqCtx(context.Background(), time.Hour), done: make(chan struct{}), fn: func(*conn) error {
		once.Do(func() { close(started) })
		<-ch
		return nil
	}}
	require.NoError(t, db.enqueue(j))
	<-started
	return func() { close(ch); <-j.done }
}

type outcome struct {
	res []StatementResult
	err error
}

// queue submits requests one after another (each is in the queue before
// the next is sent, fixing arrival order) and returns their outcomes.
func queue(t *testing.T, db *DB, reqs ...Request) []chan outcome {
	t.Helper()
	outs := make([]chan outcome, len(reqs))
	for i, r := range reqs {
		outs[i] = make(chan outcome, 1)
		want := len(db.writeQ) + 1
		go func() {
			res, err := db.Execute(context.Background(), r)
			outs[i] <- outcome{res, err}
		}()
		require.Eventually(t, func() bool { return len(db.writeQ) == want }, 5*time.Second, time.Millisecond)
	}
	return outs
}

func req(stmts ...Statement) Request { return Request{Statements: stmts} }

func TestGroupCommitIsolatesFailures(t *testing.T) {
	db, _ := openTest(t, Options{})
	db.maxGroupTime = time.Minute // the test decides the group, not the clock
	run(t, db, stmt("CREATE TABLE t(v UNIQUE)"))
	before := db.commits.Load()

	release := blockWriter(t, db)
	outs := queue(t, db,
		req(stmt("INSERT INTO t VALUES ('a')")),
		req(stmt("INSERT INTO t VALUES ('b')"), stmt("INSERT INTO t VALUES ('a')")), // fails: unique
		req(stmt("INSERT INTO t VALUES ('c')"), stmt("SELECT count(*) FROM t")),
	)
	release()
	o0, o1, o2 := <-outs[0], <-outs[1], <-outs[2]
	require.NoError(t, o0.err)
	var e *Error
	require.True(t, errors.As(o1.err, &e))
	assert.Equal(t, v4.CodeSQL, e.Code)
	require.NoError(t, o2.err)
	// The third request saw the first (same transaction, arrival order) but
	// not the failed second.
	assert.Equal(t, int64(2), o2.res[1].Results.(Rows)[0].Values()[0])
	assert.Equal(t, int64(1), db.commits.Load()-before, "the blocker and the three queued behind it: one commit")
	rows := run(t, db, stmt("SELECT v FROM t ORDER BY v"))[0].Results.(Rows)
	require.Len(t, rows, 2)
	assert.Equal(t, "a", rows[0].Values()[0])
	assert.Equal(t, "c", rows[1].Values()[0])
}

// An interrupted write makes SQLite roll back the whole transaction: the
// group's earlier request must be run again, not lost or half-applied.
func TestGroupCommitSurvivesLostTransaction(t *testing.T) {
	db, _ := openTest(t, Options{})
	db.maxGroupTime = time.Minute
	run(t, db, stmt("CREATE TABLE t(v)"))

	release := blockWriter(t, db)
	outs := make([]chan outcome, 3)
	for i := range outs {
		outs[i] = make(chan outcome, 1)
	}
	var wg sync.WaitGroup
	submit := func(i int, ctx context.Context, r Request) {
		want := len(db.writeQ) + 1
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := db.Execute(ctx, r)
			outs[i] <- outcome{res, err}
		}()
		require.Eventually(t, func() bool { return len(db.writeQ) == want }, 5*time.Second, time.Millisecond)
	}
	submit(0, context.Background(), req(stmt("INSERT INTO t VALUES ('first')")))
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	submit(1, ctx, req(stmt("WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r) INSERT INTO t SELECT 'endless' FROM r")))
	submit(2, context.Background(), req(stmt("INSERT INTO t VALUES ('third')")))
	release()
	wg.Wait()
	o0, o1, o2 := <-outs[0], <-outs[1], <-outs[2]
	require.NoError(t, o0.err)
	require.Error(t, o1.err)
	assert.True(t, errors.Is(o1.err, ErrTimeout), "%v", o1.err)
	require.NoError(t, o2.err)
	rows := run(t, db, stmt("SELECT v, count(*) FROM t GROUP BY v ORDER BY v"))[0].Results.(Rows)
	assert.Equal(t, int64(1), db.lostTxns.Load(), "the interrupted INSERT rolled back the group's transaction")
	require.Len(t, rows, 2, "no 'endless' rows survive")
	assert.Equal(t, []any{"first", int64(1)}, rows[0].Values(), "run again exactly once")
	assert.Equal(t, []any{"third", int64(1)}, rows[1].Values())
}

// Deferred foreign keys are checked per request, not at the group's shared
// COMMIT, and PRAGMA defer_foreign_keys does not leak to the next request.
func TestGroupCommitForeignKeysPerRequest(t *testing.T) {
	db, _ := openTest(t, Options{})
	db.maxGroupTime = time.Minute
	run(t, db, stmt("CREATE TABLE p(id INTEGER PRIMARY KEY)"),
		stmt("CREATE TABLE c(id INTEGER PRIMARY KEY, p INTEGER REFERENCES p(id))"))

	release := blockWriter(t, db)
	outs := queue(t, db,
		req(stmt("INSERT INTO p VALUES (1)")),
		req(stmt("PRAGMA defer_foreign_keys = ON"), stmt("INSERT INTO c VALUES (1, 99)")),                                  // never fixed up
		req(stmt("PRAGMA defer_foreign_keys = ON"), stmt("INSERT INTO c VALUES (2, 3)"), stmt("INSERT INTO p VALUES (3)")), // fixed up
		req(stmt("INSERT INTO c VALUES (4, 98)")),                                                                          // immediate: defer must not leak here
		req(stmt("INSERT INTO c VALUES (5, 1)")),
	)
	release()
	var got []error
	for _, o := range outs {
		got = append(got, (<-o).err)
	}
	assert.NoError(t, got[0])
	assert.ErrorContains(t, got[1], "FOREIGN KEY constraint failed")
	assert.NoError(t, got[2])
	assert.ErrorContains(t, got[3], "FOREIGN KEY constraint failed")
	assert.NoError(t, got[4])
	rows := run(t, db, stmt("SELECT id, p FROM c ORDER BY id"))[0].Results.(Rows)
	require.Len(t, rows, 2)
	assert.Equal(t, []any{int64(2), int64(3)}, rows[0].Values())
	assert.Equal(t, []any{int64(5), int64(1)}, rows[1].Values())
}
