package sqlexec

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	v4 "github.com/shoaldb/shoal/internal/v4"
)

func count(t *testing.T, db *DB, table string) int64 {
	t.Helper()
	return scalar(t, db, "SELECT count(*) FROM "+table).(int64)
}

// Every limit fails the whole request: the INSERT before the offending
// statement must not survive.
func TestLimitsRefuseWithNothingWritten(t *testing.T) {
	db, _ := openTest(t, Options{})
	run(t, db, stmt("CREATE TABLE t(v)"))
	guard := stmt("INSERT INTO t VALUES ('must roll back')")

	placeholders := func(n int) string { return strings.TrimSuffix(strings.Repeat("?,", n), ",") }
	params := func(n int) []json.RawMessage {
		p := make([]json.RawMessage, n)
		for i := range p {
			p[i] = json.RawMessage(`1`)
		}
		return p
	}
	sqlOfLen := func(n int) string { // SELECT '<aaa>' exactly n bytes
		return "SELECT '" + strings.Repeat("a", n-len("SELECT ''")) + "'"
	}
	cols := func(n int) string {
		c := make([]string, n)
		for i := range c {
			c[i] = fmt.Sprintf("c%d", i)
		}
		return strings.Join(c, ", ")
	}
	args := func(n int) string { return strings.TrimSuffix(strings.Repeat("1,", n), ",") }

	cases := []struct {
		name   string
		ok     Statement
		bad    Statement
		code   int
		msgHas string
	}{
		{"100 params ok, 101 refused",
			Statement{SQL: "SELECT " + placeholders(100), Params: params(100)},
			Statement{SQL: "SELECT " + placeholders(101), Params: params(101)},
			v4.CodeTooLarge, "too many SQL variables"},
		{"101 numbered placeholders refused when prepared",
			Statement{SQL: "SELECT ?100", Params: params(100)},
			stmt("SELECT ?101"),
			v4.CodeSQL, "variable number must be between ?1 and ?100"},
		{"100 KB statement ok, +1 byte refused",
			stmt(sqlOfLen(100_000)), stmt(sqlOfLen(100_001)),
			v4.CodeTooLarge, "statement too long"},
		{"2 MB string param",
			stmt("INSERT INTO t VALUES (?)", strings.Repeat("x", 1_999_000)),
			stmt("INSERT INTO t VALUES (?)", strings.Repeat("x", 2_000_001)),
			v4.CodeTooLarge, "SQLITE_TOOBIG"},
		{"2 MB row made of two 1.1 MB values",
			stmt("CREATE TABLE two(a, b)"),
			stmt("INSERT INTO two VALUES (?, ?)", strings.Repeat("x", 1_100_000), strings.Repeat("x", 1_100_000)),
			v4.CodeTooLarge, "SQLITE_TOOBIG"},
		{"2 MB blob from SQL",
			stmt("SELECT length(zeroblob(2000000))"), stmt("SELECT zeroblob(2000001)"),
			v4.CodeTooLarge, "SQLITE_TOOBIG"},
		{"100 columns ok, 101 refused",
			stmt("CREATE TABLE wide100(" + cols(100) + ")"), stmt("CREATE TABLE wide101(" + cols(101) + ")"),
			v4.CodeSQL, "too many columns"},
		{"LIKE pattern 50 ok, 51 refused",
			stmt("SELECT 'a' LIKE ?", strings.Repeat("%", 50)), stmt("SELECT 'a' LIKE ?", strings.Repeat("%", 51)),
			v4.CodeSQL, "LIKE or GLOB pattern too complex"},
		{"32 function args ok, 33 refused",
			stmt("SELECT max(" + args(32) + ")"), stmt("SELECT max(" + args(33) + ")"),
			v4.CodeSQL, "too many arguments"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := count(t, db, "t")
			_, err := db.Execute(context.Background(), Request{Statements: []Statement{c.ok}})
			require.NoError(t, err)
			before = count(t, db, "t")
			e := runErr(t, db, guard, c.bad)
			assert.Equal(t, c.code, e.Code, e.Message)
			assert.Contains(t, e.Message, c.msgHas)
			assert.Equal(t, before, count(t, db, "t"), "nothing half-written")
		})
	}
}

func TestTimeoutInterruptsAndRollsBack(t *testing.T) {
	lim := DefaultLimits()
	lim.QueryTimeout = 200 * time.Millisecond
	db, _ := openTest(t, Options{Limits: lim})
	run(t, db, stmt("CREATE TABLE t(v)"))
	forever := stmt("WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r) SELECT count(*) FROM r")
	e := runErr(t, db, stmt("INSERT INTO t VALUES (1)"), forever)
	assert.Equal(t, v4.CodeTimeout, e.Code, e.Message)
	assert.True(t, errors.Is(e, ErrTimeout))
	assert.Equal(t, int64(0), count(t, db, "t"))

	// A caller's cancellation interrupts too, and the connection is reusable.
	ctx, cancel := context.WithCancel(context.Background())
	go func() { time.Sleep(50 * time.Millisecond); cancel() }() // any moment works: before or during the statement, it is interrupted
	_, err := db.Execute(ctx, Request{Statements: []Statement{forever}})
	require.Error(t, err)
	assert.True(t, errors.Is(err, ErrTimeout), "%v", err)
	run(t, db, stmt("INSERT INTO t VALUES (2)"))
	assert.Equal(t, int64(1), count(t, db, "t"))
}

func TestMaxDatabaseBytes(t *testing.T) {
	lim := DefaultLimits()
	lim.MaxDatabaseBytes = 256 * 1024
	db, _ := openTest(t, Options{Limits: lim})
	run(t, db, stmt("CREATE TABLE t(v)"))
	run(t, db, stmt("INSERT INTO t VALUES (zeroblob(100000))"))
	e := runErr(t, db, stmt("INSERT INTO t VALUES (1)"), stmt("WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < 5) INSERT INTO t SELECT zeroblob(100000) FROM s"))
	assert.Equal(t, v4.CodeStorageLimit, e.Code, e.Message)
	assert.True(t, errors.Is(e, ErrStorageLimit))
	assert.Equal(t, int64(1), count(t, db, "t"))
	// Deletes still work and make room.
	run(t, db, stmt("DELETE FROM t"))
	run(t, db, stmt("INSERT INTO t VALUES (zeroblob(100000))"))
}

func TestBlockGrowth(t *testing.T) {
	db, _ := openTest(t, Options{})
	run(t, db, stmt("CREATE TABLE t(v)"))
	run(t, db, stmt("WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < 20) INSERT INTO t SELECT zeroblob(10000) FROM s"))
	blocked := func(stmts ...Statement) *Error {
		_, err := db.Execute(context.Background(), Request{Statements: stmts, BlockGrowth: true})
		if err == nil {
			return nil
		}
		var e *Error
		require.True(t, errors.As(err, &e))
		return e
	}
	e := blocked(stmt("WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < 20) INSERT INTO t SELECT zeroblob(10000) FROM s"))
	require.NotNil(t, e)
	assert.Equal(t, v4.CodeStorageLimit, e.Code)
	e = blocked(stmt("CREATE TABLE more(a, b, c)"), stmt("CREATE INDEX more_a ON more(a)"))
	require.NotNil(t, e, "DDL that adds pages is blocked")
	assert.Equal(t, v4.CodeStorageLimit, e.Code)
	assert.Equal(t, int64(20), count(t, db, "t"))

	// Reads and deletes still work.
	_, err := db.Execute(context.Background(), Request{Statements: []Statement{stmt("SELECT count(*) FROM t")}, BlockGrowth: true})
	require.NoError(t, err)
	assert.Nil(t, blocked(stmt("DELETE FROM t WHERE rowid <= 10")))
	assert.Nil(t, blocked(stmt("CREATE TABLE gone(a)")), "fits in a page freed above")
	assert.Nil(t, blocked(stmt("DROP TABLE gone")))
	// Inserts that reuse freed pages do not grow the file and pass.
	assert.Nil(t, blocked(stmt("INSERT INTO t VALUES (zeroblob(10000))")))
	assert.Equal(t, int64(11), count(t, db, "t"))
}

// TestStorageFull: while the account is over its storage limit, statements
// that add data or schema are refused even when they would fit in free
// pages; reads, UPDATE that fits, DELETE and DROP work.
func TestStorageFull(t *testing.T) {
	db, _ := openTest(t, Options{})
	run(t, db, stmt("CREATE TABLE t(id INTEGER PRIMARY KEY, v)"))
	run(t, db, stmt("CREATE TABLE audit(id)"))
	run(t, db, stmt("WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < 20) INSERT INTO t(v) SELECT zeroblob(10000) FROM s"))
	run(t, db, stmt("DELETE FROM t WHERE id > 15")) // free pages: a small insert would not grow the file
	run(t, db, stmt("INSERT INTO t(v) VALUES ('cached')"))
	run(t, db, stmt("DELETE FROM t WHERE v = 'nothing'")) // cached before a trigger exists
	full := func(stmts ...Statement) *Error {
		_, err := db.Execute(context.Background(), Request{Statements: stmts, StorageFull: true})
		if err == nil {
			return nil
		}
		var e *Error
		require.True(t, errors.As(err, &e))
		return e
	}
	refused := func(what string, stmts ...Statement) {
		t.Helper()
		e := full(stmts...)
		require.NotNil(t, e, what)
		assert.Equal(t, v4.CodeStorageLimit, e.Code, what)
		assert.Equal(t, AccountStorageLimitMessage, e.Message, what)
	}
	refused("a small INSERT (cached statement) that fits in free pages", stmt("INSERT INTO t(v) VALUES ('cached')"))
	refused("REPLACE", stmt("REPLACE INTO t(id, v) VALUES (1, 'x')"))
	refused("upsert", stmt("INSERT INTO t(id, v) VALUES (1, 'x') ON CONFLICT(id) DO UPDATE SET v = 'y'"))
	refused("CREATE TABLE", stmt("CREATE TABLE more(a)"))
	refused("CREATE INDEX", stmt("CREATE INDEX t_v ON t(v)"))
	refused("ALTER TABLE", stmt("ALTER TABLE t ADD COLUMN w"))
	refused("UPDATE that grows the file", stmt("UPDATE t SET v = zeroblob(300000) WHERE id = 1"))
	refused("after a statement that was fine", stmt("DELETE FROM t WHERE id = 2"), stmt("INSERT INTO t(v) VALUES (1)"))
	assert.Equal(t, int64(16), count(t, db, "t"), "refused requests rolled back whole")

	assert.Nil(t, full(stmt("SELECT count(*) FROM t")))
	assert.Nil(t, full(stmt("EXPLAIN INSERT INTO t(v) VALUES (1)")), "EXPLAIN only reads")
	assert.Nil(t, full(stmt("UPDATE t SET v = 'small' WHERE id = 3")), "an UPDATE that fits")
	assert.Nil(t, full(stmt("DELETE FROM t WHERE v = 'nothing'")))
	assert.Nil(t, full(stmt("DROP TABLE audit")))

	// A DELETE whose trigger inserts adds data: refused, also through the
	// statement cached before the trigger existed (re-prepared by SQLite).
	run(t, db, stmt("CREATE TABLE log(id)"))
	run(t, db, stmt("CREATE TRIGGER t_del AFTER DELETE ON t BEGIN INSERT INTO log VALUES (old.id); END"))
	refused("DELETE with an inserting trigger, re-prepared", stmt("DELETE FROM t WHERE v = 'nothing'"))
	refused("DELETE with an inserting trigger", stmt("DELETE FROM t WHERE id = 4"))
	assert.Equal(t, int64(16), count(t, db, "t"))

	// Not full: everything works again.
	run(t, db, stmt("INSERT INTO t(v) VALUES ('cached')"))
	run(t, db, stmt("CREATE TABLE more(a)"))
}
