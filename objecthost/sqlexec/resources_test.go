package sqlexec

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	v4 "github.com/shoaldb/shoal/internal/v4"
)

func execErr(t *testing.T, db *DB, req Request) *Error {
	t.Helper()
	res, err := db.Execute(context.Background(), req)
	require.Error(t, err, "expected an error, got %d results", len(res))
	var e *Error
	require.True(t, errors.As(err, &e), "error %v is not *Error", err)
	return e
}

// countTo is a recursive CTE of n rows (1..n), the usual way a tenant makes
// many rows out of nothing.
func countTo(n int) string {
	return fmt.Sprintf("WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM r WHERE i < %d) ", n)
}

// Encoded results are byte for byte what AppendResults writes for the Rows
// and *RawResults of the same request: every type, duplicate columns,
// empty and NULL values, escapes, JS numbers, /query and /raw, several
// statements.
func TestEncodedResultsMatchRows(t *testing.T) {
	db, _ := openTest(t, Options{})
	run(t, db, stmt("CREATE TABLE t(a INTEGER, b REAL, c TEXT, d BLOB, e)"),
		stmt(`INSERT INTO t VALUES (1, 1.5, 'x', x'00ff', NULL), (9007199254740993, -0.0, '', x'', 'q"''<&>'||char(10)||char(8232)),
			(-9223372036854775808, 1e300, 'é漢', zeroblob(3), 2.5e-7)`))
	cases := [][]Statement{
		{stmt("SELECT * FROM t ORDER BY rowid")},
		{stmt("SELECT a, a, b AS a, c FROM t ORDER BY rowid")},
		{stmt("SELECT * FROM t WHERE a = ?", 42)},
		{stmt("SELECT 1 AS x; SELECT 'two' AS y, NULL AS z")},
		{stmt("SELECT count(*) AS n FROM t"), stmt("SELECT sum(a) FROM t")},
		{stmt("SELECT 1e999 AS inf, -1e999 AS ninf, 0.1 + 0.2 AS f")},
		{stmt("UPDATE t SET e = 1 WHERE a = 1")},
	}
	for i, stmts := range cases {
		for _, raw := range []bool{false, true} {
			for _, js := range []bool{false, true} {
				plain, err := db.Execute(context.Background(), Request{Statements: stmts, Raw: raw, JSNumbers: js})
				require.NoError(t, err, "case %d", i)
				enc, err := db.Execute(context.Background(), Request{Statements: stmts, Raw: raw, JSNumbers: js, Encode: true})
				require.NoError(t, err, "case %d", i)
				require.Len(t, enc, len(plain))
				for j := range enc {
					_, ok := enc[j].Results.(Encoded)
					require.True(t, ok, "case %d: %T", i, enc[j].Results)
					// meta differs in durations only: compare results alone
					enc[j].Meta, plain[j].Meta = Meta{}, Meta{}
				}
				assert.Equal(t, string(AppendResults(nil, plain)), string(AppendResults(nil, enc)), "case %d raw=%v js=%v", i, raw, js)
			}
		}
	}
}

// A result over MaxResultBytes fails the request with 7413 and the limit in
// the message, whether encoded or not, and nothing it wrote stays.
func TestResultSizeLimit(t *testing.T) {
	db, _ := openTest(t, Options{Limits: Limits{MaxResultBytes: 100_000}})
	run(t, db, stmt("CREATE TABLE w(v)"))
	big := countTo(1_000_000) + "SELECT i, 'some text to make the row longer' AS pad FROM r"
	for _, encode := range []bool{false, true} {
		e := execErr(t, db, Request{Statements: []Statement{stmt(big)}, Encode: encode})
		assert.Equal(t, v4.CodeTooLarge, e.Code)
		assert.Equal(t, fmt.Sprintf(ResultTooLargeMessage, 100_000), e.Message)
		// The limit counts the request: two statements of 60 kB each fail.
		half := countTo(2000) + "SELECT i, 'some text to make the row longer' AS pad FROM r"
		e = execErr(t, db, Request{Statements: []Statement{stmt("INSERT INTO w VALUES (1)"), stmt(half), stmt(half)}, Encode: encode})
		assert.Equal(t, v4.CodeTooLarge, e.Code)
		assert.Equal(t, int64(0), scalar(t, db, "SELECT count(*) FROM w"), "the failed request rolled back")
		// Under the limit it answers.
		res := run(t, db, stmt(countTo(100)+"SELECT i FROM r"))
		assert.Len(t, res[0].Results.(Rows), 100)
	}
}

// The result budget shared by all requests: a request whose results need
// more than its free allowance plus what the budget has left fails with
// 7501 (retryable), and releasing a lease gives the bytes back.
func TestResultBudget(t *testing.T) {
	db, _ := openTest(t, Options{})
	budget := NewResultBudget(3 << 20)
	twoMB := countTo(20_000) + "SELECT i, hex(zeroblob(50)) AS pad FROM r" // ~2.3 MB encoded
	first := budget.Lease()
	res, err := db.Execute(context.Background(), Request{Statements: []Statement{stmt(twoMB)}, Encode: true, Lease: first})
	require.NoError(t, err)
	require.Greater(t, len(res[0].Results.(Encoded)), 2<<20)
	second := budget.Lease()
	e := execErr(t, db, Request{Statements: []Statement{stmt(twoMB + " UNION ALL " + strings.TrimPrefix(twoMB, countTo(20_000)))}, Encode: true, Lease: second})
	assert.Equal(t, v4.CodeOverloaded, e.Code)
	assert.Equal(t, ResultMemoryMessage, e.Message)
	second.Release()
	first.Release()
	third := budget.Lease()
	_, err = db.Execute(context.Background(), Request{Statements: []Statement{stmt(twoMB)}, Encode: true, Lease: third})
	require.NoError(t, err, "the budget came back")
	third.Release()
	// Small results never touch the budget.
	empty := NewResultBudget(1)
	l := empty.Lease()
	_, err = db.Execute(context.Background(), Request{Statements: []Statement{stmt("SELECT 1")}, Encode: true, Lease: l})
	require.NoError(t, err)
}

// Temporary files: a query whose temporary b-tree needs more than
// MaxTempBytes fails with 7413 and the limit in the message; the process's
// temporary bytes return to zero; the same query under a larger limit
// succeeds; and the host-wide cap refuses with 7501.
func TestTempSpaceLimit(t *testing.T) {
	// ~25 MB of distinct keys: far more than the page cache, so the
	// DISTINCT b-tree spills to a temporary file.
	distinct := countTo(200_000) + "SELECT count(*) AS n FROM (SELECT DISTINCT hex(randomblob(64)) FROM r)"
	small, _ := openTest(t, Options{Limits: Limits{MaxTempBytes: 1 << 20}})
	e := execErr(t, small, Request{Statements: []Statement{stmt(distinct)}})
	assert.Equal(t, v4.CodeTooLarge, e.Code)
	assert.Equal(t, fmt.Sprintf(TempTooLargeMessage, 1<<20), e.Message)
	assert.Equal(t, int64(0), TempSpaceInUse(), "temporary files closed and uncounted")
	// A sort that spills is capped the same way.
	sorted := countTo(200_000) + "SELECT count(*) FROM (SELECT hex(randomblob(64)) AS k FROM r ORDER BY k LIMIT -1 OFFSET 1)"
	e = execErr(t, small, Request{Statements: []Statement{stmt(sorted)}})
	assert.Equal(t, v4.CodeTooLarge, e.Code, e.Message)

	roomy, _ := openTest(t, Options{})
	res := run(t, roomy, stmt(distinct))
	assert.Equal(t, int64(200_000), res[0].Results.(Rows)[0].Values()[0])

	SetTempSpaceLimit(1 << 20)
	defer SetTempSpaceLimit(0)
	e = execErr(t, roomy, Request{Statements: []Statement{stmt(distinct)}})
	assert.Equal(t, v4.CodeOverloaded, e.Code)
	assert.Equal(t, TempHostFullMessage, e.Message)
	assert.Equal(t, int64(0), TempSpaceInUse())
}

// Statements that would expand into a huge program fail to prepare
// (SQLITE_LIMIT_VDBE_OP): a CTE that is not materialized is inlined at
// every reference, so 100 KB of SQL can ask for millions of instructions.
func TestProgramSizeLimit(t *testing.T) {
	db, _ := openTest(t, Options{Limits: Limits{MaxProgramOps: 100_000}})
	var b strings.Builder
	b.WriteString("WITH c(x) AS NOT MATERIALIZED (SELECT CASE random()")
	for i := 0; i < 400; i++ {
		fmt.Fprintf(&b, " WHEN %d THEN %d", i, i)
	}
	b.WriteString(" END) SELECT x FROM c")
	for i := 0; i < 200; i++ {
		b.WriteString(" UNION ALL SELECT x FROM c")
	}
	require.Less(t, b.Len(), 100_000)
	e := execErr(t, db, Request{Statements: []Statement{stmt(b.String())}})
	assert.Equal(t, v4.CodeTooLarge, e.Code, e.Message)
	assert.Equal(t, fmt.Sprintf(ProgramTooLargeMessage, 100_000), e.Message)
	// The default limit (1,000,000) leaves room for ordinary big statements.
	roomy, _ := openTest(t, Options{})
	var ins strings.Builder
	ins.WriteString("CREATE TABLE t(a, b, c); INSERT INTO t VALUES (0, 'x', 0.5)")
	for i := 1; i < 4000; i++ {
		fmt.Fprintf(&ins, ", (%d, 'x', 0.5)", i)
	}
	require.Less(t, ins.Len(), 100_000)
	run(t, roomy, stmt(ins.String()))
}
