package sqlexec

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	v4 "github.com/shoaldb/shoal/internal/v4"
)

func TestMultiStatementSplitWithPrepareTail(t *testing.T) {
	db, _ := openTest(t, Options{})
	res := run(t, db, stmt("CREATE TABLE t(a); INSERT INTO t VALUES ('x;y'); /* ; */ SELECT a, ';' AS s FROM t; -- trailing ; comment\n ;;"))
	require.Len(t, res, 3, "one result per statement; semicolons inside strings and comments do not split")
	rows := res[2].Results.(Rows)
	require.Len(t, rows, 1)
	assert.Equal(t, []any{"x;y", ";"}, rows[0].Values())

	e := runErr(t, db, stmt("  -- only a comment\n ; "))
	assert.Equal(t, v4.CodeSQL, e.Code)
}

func TestRequestIsOneTransaction(t *testing.T) {
	db, _ := openTest(t, Options{})
	run(t, db, stmt("CREATE TABLE t(a UNIQUE)"))
	// Batch: the second statement fails, the first is rolled back.
	e := runErr(t, db, stmt("INSERT INTO t VALUES (1)"), stmt("INSERT INTO t VALUES (1)"))
	assert.Equal(t, v4.CodeSQL, e.Code)
	assert.Contains(t, e.Message, "UNIQUE constraint failed: t.a: SQLITE_CONSTRAINT")
	assert.Equal(t, 1, e.Statement)
	assert.Equal(t, int64(0), count(t, db, "t"))
	// Multi-statement string: same.
	runErr(t, db, stmt("INSERT INTO t VALUES (2); INSERT INTO t VALUES (2)"))
	assert.Equal(t, int64(0), count(t, db, "t"))
	// DDL rolls back too, and the schema caches follow.
	runErr(t, db, stmt("CREATE TABLE t2(a); INSERT INTO t2 VALUES (1); SELECT * FROM nope"))
	e = runErr(t, db, stmt("SELECT * FROM t2"))
	assert.Contains(t, e.Message, "no such table: t2")
	// Later statements see earlier ones of the same request.
	res := run(t, db, stmt("INSERT INTO t VALUES (5)"), stmt("SELECT count(*) AS n FROM t"))
	assert.Equal(t, int64(1), res[1].Results.(Rows)[0].Values()[0])
}

func TestSchemaChangeRefreshesCachedStatements(t *testing.T) {
	db, _ := openTest(t, Options{})
	run(t, db, stmt("CREATE TABLE t(a)"), stmt("INSERT INTO t VALUES (1)"))
	for i := 0; i < 3; i++ { // warm reader and writer caches
		run(t, db, stmt("SELECT * FROM t"))
	}
	run(t, db, stmt("ALTER TABLE t ADD COLUMN b DEFAULT 2"), stmt("ALTER TABLE t RENAME COLUMN a TO z"))
	for i := 0; i < 3; i++ {
		res := run(t, db, stmt("SELECT * FROM t"))
		b, _ := json.Marshal(res[0].Results)
		assert.Equal(t, `[{"z":1,"b":2}]`, string(b))
	}
	// Index info for rows_written follows the schema too.
	run(t, db, stmt("CREATE INDEX t_b ON t(b)"))
	res := run(t, db, stmt("INSERT INTO t VALUES (3, 4)"))
	assert.Equal(t, int64(2), res[0].Meta.RowsWritten)
}

// A long write occupies the writer; reads of known read-only SQL still run
// on the reader connections, proving reads do not queue behind writes.
func TestReadsRunBesideABusyWriter(t *testing.T) {
	db, _ := openTest(t, Options{ReadConns: 2})
	run(t, db, stmt("CREATE TABLE t(a)"), stmt("INSERT INTO t VALUES (1)"))
	read := stmt("SELECT a FROM t")
	run(t, db, read) // learn that it is read-only

	ctx, cancel := context.WithCancel(context.Background())
	writerDone := make(chan error, 1)
	go func() {
		_, err := db.Execute(ctx, Request{Statements: []Statement{stmt("INSERT INTO t VALUES (2)"),
			stmt("WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r) SELECT count(*) FROM r")}})
		writerDone <- err
	}()
	waitWriterBusy(t, db)
	for i := 0; i < 5; i++ {
		res := run(t, db, read)
		assert.Equal(t, []any{int64(1)}, res[0].Results.(Rows)[0].Values(), "readers see the last committed state")
	}
	cancel()
	require.Error(t, <-writerDone)
}

// waitWriterBusy waits until the writer has taken a job off its queue and
// is running it (the queue is empty and the writer connection is mid-request).
func waitWriterBusy(t *testing.T, db *DB) {
	t.Helper()
	require.Eventually(t, func() bool {
		db.writerConn.cancelMu.Lock()
		gen := db.writerConn.reqGen
		db.writerConn.cancelMu.Unlock()
		return len(db.writeQ) == 0 && gen%2 == 1 // odd: a request is armed
	}, 5*time.Second, time.Millisecond)
}

func TestOverloadedWhenQueueFull(t *testing.T) {
	lim := DefaultLimits()
	lim.MaxQueue = 2
	db, _ := openTest(t, Options{Limits: lim, ReadConns: -1})
	run(t, db, stmt("CREATE TABLE t(a)"))

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	start := func(s Statement) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := db.Execute(ctx, Request{Statements: []Statement{s}})
			errs <- err
		}()
	}
	start(stmt("WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r) SELECT count(*) FROM r"))
	waitWriterBusy(t, db)
	start(stmt("INSERT INTO t VALUES (1)"))
	start(stmt("INSERT INTO t VALUES (2)"))
	require.Eventually(t, func() bool { return len(db.writeQ) == 2 }, 5*time.Second, time.Millisecond)

	_, err := db.Execute(context.Background(), Request{Statements: []Statement{stmt("INSERT INTO t VALUES (3)")}})
	require.Error(t, err)
	assert.True(t, errors.Is(err, ErrOverloaded), "%v", err)
	var e *Error
	require.True(t, errors.As(err, &e))
	assert.Equal(t, v4.CodeOverloaded, e.Code)

	cancel()
	wg.Wait()
	close(errs)
	for err := range errs {
		assert.True(t, errors.Is(err, ErrTimeout), "queued and running requests end with the context: %v", err)
	}
	assert.Equal(t, int64(0), count(t, db, "t"))
}

// Concurrent writers and readers: every acknowledged insert is present,
// writes are serialized (no SQLITE_BUSY), and readers never see a partial
// request (the two rows of a request appear together).
func TestConcurrentRequests(t *testing.T) {
	db, _ := openTest(t, Options{ReadConns: 3})
	run(t, db, stmt("CREATE TABLE t(g INTEGER, v INTEGER)"))
	const writers, perWriter = 4, 25
	var wg sync.WaitGroup
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < perWriter; i++ {
				g := w*1000 + i
				_, err := db.Execute(context.Background(), Request{Statements: []Statement{
					stmt("INSERT INTO t VALUES (?, 1)", g), stmt("INSERT INTO t VALUES (?, 2)", g)}})
				assert.NoError(t, err)
			}
		}()
	}
	for r := 0; r < 4; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 50; i++ {
				res, err := db.Execute(context.Background(), Request{Statements: []Statement{stmt("SELECT count(*) FROM t GROUP BY g HAVING count(*) != 2")}})
				if assert.NoError(t, err) {
					assert.Empty(t, res[0].Results.(Rows), "a reader saw half a request")
				}
			}
		}()
	}
	wg.Wait()
	assert.Equal(t, int64(writers*perWriter*2), count(t, db, "t"))
}

func TestSizeNumTablesClose(t *testing.T) {
	db, path := openTest(t, Options{Region: "WEUR", Host: "host-1"})
	n, err := db.NumTables()
	require.NoError(t, err)
	assert.Zero(t, n)
	res := run(t, db, stmt("CREATE TABLE a(x)"), stmt("CREATE TABLE b(x)"), stmt("CREATE VIRTUAL TABLE f USING fts5(x)"))
	assert.Equal(t, "WEUR", res[0].Meta.ServedByRegion)
	assert.Equal(t, "host-1", res[0].Meta.ServedByColo)
	assert.True(t, res[0].Meta.ServedByPrimary)
	_, err = hostConn(t, path).Exec("CREATE TABLE _shoal_meta(k)")
	require.NoError(t, err)
	n, err = db.NumTables()
	require.NoError(t, err)
	assert.Equal(t, 3+5, n, "a, b, f and FTS5's shadow tables; not _shoal_meta") // f is a virtual table: counted as type 'table'
	size, err := db.Size()
	require.NoError(t, err)
	assert.Positive(t, size)

	require.NoError(t, db.Close())
	require.NoError(t, db.Close())
	_, err = db.Execute(context.Background(), Request{Statements: []Statement{stmt("SELECT 1")}})
	assert.ErrorIs(t, err, ErrClosed)
}

func TestCloseInterruptsRunningRequest(t *testing.T) {
	db, _ := openTest(t, Options{})
	errc := make(chan error, 1)
	go func() {
		_, err := db.Execute(context.Background(), Request{Statements: []Statement{
			stmt("WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r) SELECT count(*) FROM r")}})
		errc <- err
	}()
	waitWriterBusy(t, db)
	require.NoError(t, db.Close()) // returns without waiting for the 30 s timeout
	err := <-errc
	require.Error(t, err)
	assert.True(t, errors.Is(err, ErrTimeout), "%v", err)
}

func TestParseBody(t *testing.T) {
	req, err := ParseBody([]byte(`{"sql": "SELECT ?", "params": ["a", 1, 2.5, null, true, [1,2]]}`))
	require.NoError(t, err)
	require.Len(t, req.Statements, 1)
	assert.Equal(t, "SELECT ?", req.Statements[0].SQL)
	assert.Len(t, req.Statements[0].Params, 6)

	req, err = ParseBody([]byte(`{"batch": [{"sql": "SELECT 1"}, {"sql": "SELECT ?", "params": [1]}]}`))
	require.NoError(t, err)
	require.Len(t, req.Statements, 2)

	for _, bad := range []string{
		``, `[]`, `{}`, `{"sql": 1}`, `{"sql": "x", "extra": 1}`, `{"sql": "x", "params": {"a": 1}}`,
		`{"sql": "x", "params": [{"a": 1}]}`, `{"sql": "x", "params": [[300]]}`, `{"sql": "x", "params": [[1.5]]}`,
		`{"sql": "x", "batch": [{"sql": "y"}]}`, `{"batch": []}`, `{"batch": [{"params": [1]}]}`,
		`{"batch": [{"sql": "y", "x": 1}]}`, `{"batch": [{"sql": "y"}], "params": [1]}`, `{"sql": "x"} {}`, `{"sql": "x"`,
	} {
		_, err := ParseBody([]byte(bad))
		var e *Error
		if assert.True(t, errors.As(err, &e), "%s: %v", bad, err) {
			assert.Equal(t, v4.CodeInvalidRequest, e.Code, bad)
		}
	}
}

func ExampleDB_Execute() {
	dir, _ := osMkdirTemp()
	db, err := Open(dir+"/example.db", Options{Region: "WEUR"})
	if err != nil {
		panic(err)
	}
	defer db.Close()
	req, _ := ParseBody([]byte(`{"batch": [{"sql": "CREATE TABLE t(a, b)"}, {"sql": "INSERT INTO t VALUES (?, ?)", "params": [1, "x"]}, {"sql": "SELECT * FROM t"}]}`))
	res, err := db.Execute(context.Background(), req)
	if err != nil {
		panic(err)
	}
	out, _ := json.Marshal(res[2].Results)
	fmt.Println(string(out), res[1].Meta.RowsWritten)
	// Output: [{"a":1,"b":"x"}] 1
}

func TestReadOverloadedWhenReadersBusy(t *testing.T) {
	lim := DefaultLimits()
	lim.MaxQueue = 1
	db, _ := openTest(t, Options{Limits: lim, ReadConns: 1})
	count := "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r WHERE i < ?) SELECT count(*) FROM r"
	run(t, db, stmt(count, 1)) // learned read-only: later runs use the reader pool

	ctx, cancel := context.WithCancel(context.Background())
	longDone := make(chan error, 1)
	go func() {
		_, err := db.Execute(ctx, Request{Statements: []Statement{stmt(count, int64(1)<<50)}})
		longDone <- err
	}()
	require.Eventually(t, func() bool { return db.readWaiting.Load() == 1 && len(db.readers) == 0 }, 5*time.Second, time.Millisecond)
	waitingDone := make(chan error, 1)
	go func() {
		_, err := db.Execute(context.Background(), Request{Statements: []Statement{stmt(count, 3)}})
		waitingDone <- err
	}()
	require.Eventually(t, func() bool { return db.readWaiting.Load() == 2 }, 5*time.Second, time.Millisecond)

	_, err := db.Execute(context.Background(), Request{Statements: []Statement{stmt(count, 2)}})
	assert.True(t, errors.Is(err, ErrOverloaded), "%v", err)
	// Writes are not affected by busy readers.
	run(t, db, stmt("CREATE TABLE w(a)"))

	cancel()
	assert.True(t, errors.Is(<-longDone, ErrTimeout))
	assert.NoError(t, <-waitingDone)
}

func TestCloseLeavesNoGoroutines(t *testing.T) {
	before := runtime.NumGoroutine()
	db, err := Open(filepath.Join(t.TempDir(), "g.db"), Options{ReadConns: 3})
	require.NoError(t, err)
	run(t, db, stmt("CREATE TABLE t(a)"), stmt("INSERT INTO t VALUES (1)"))
	run(t, db, stmt("SELECT * FROM t"))
	run(t, db, stmt("SELECT * FROM t"))
	_, err = db.NumTables()
	require.NoError(t, err)
	require.NoError(t, db.Close())
	// Polled in this goroutine: assert.Eventually runs its condition in a
	// goroutine of its own, which would be counted.
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond) // poll interval: goroutines counted until they are gone (deadline above)
	}
	assert.LessOrEqual(t, runtime.NumGoroutine(), before, "goroutines left behind by Close")
}

// A statement string wrongly believed read-only (as after a schema change)
// reaches a reader, which hands the request untouched to the writer.
func TestMisclassifiedWriteFallsBackToWriter(t *testing.T) {
	db, _ := openTest(t, Options{ReadConns: 2})
	run(t, db, stmt("CREATE TABLE t(a)"))
	ins := "INSERT INTO t VALUES (1); SELECT count(*) FROM t"
	db.readonly.Store(ins, true)
	res := run(t, db, stmt(ins))
	require.Len(t, res, 2)
	assert.Equal(t, int64(1), res[1].Results.(Rows)[0].Values()[0])
	assert.Equal(t, int64(1), count(t, db, "t"), "inserted exactly once")
	v, _ := db.readonly.Load(ins)
	assert.Equal(t, false, v, "relearned as writing")
}

// TestServedByRegionUpperCase: hosts are configured with the location-hint
// spelling ("weur"); answers carry D1's ("WEUR"), which the SDKs' enums use.
func TestServedByRegionUpperCase(t *testing.T) {
	db, _ := openTest(t, Options{Region: "weur", Host: "host-1"})
	res := run(t, db, stmt("SELECT 1"))
	assert.Equal(t, "WEUR", res[0].Meta.ServedByRegion)
}
