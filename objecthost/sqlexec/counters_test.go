package sqlexec

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func seed1000(t *testing.T, db *DB) {
	t.Helper()
	run(t, db, stmt("CREATE TABLE t(id INTEGER PRIMARY KEY, k INTEGER, c INTEGER)"), stmt("CREATE INDEX t_k ON t(k)"))
	var sb strings.Builder
	sb.WriteString("INSERT INTO t(id, k, c) VALUES ")
	for i := 1; i <= 1000; i++ {
		if i > 1 {
			sb.WriteByte(',')
		}
		fmt.Fprintf(&sb, "(%d, %d, %d)", i, i*10, i%7)
	}
	run(t, db, stmt(sb.String()))
}

// TestRowsReadCounters fails loudly if the bundled SQLite was built without
// -DSQLITE_ENABLE_STMT_SCANSTATUS (every count would read 0).
func TestRowsReadCounters(t *testing.T) {
	db, _ := openTest(t, Options{})
	seed1000(t, db)
	cases := []struct {
		name    string
		sql     string
		rows    int
		minRead int64
		maxRead int64
	}{
		// D1's rules (libSQL's counters): positioning a cursor reads a
		// row, and so does every step that moves it to one.
		{"full scan with filter", "SELECT * FROM t WHERE c = 3", 143, 1000, 1000},
		{"primary key lookup", "SELECT * FROM t WHERE id = 500", 1, 1, 1},
		// The seek, then the step to the next entry that ends the range.
		{"indexed equality", "SELECT * FROM t WHERE k = 5000", 1, 2, 2},
		{"indexed range of 110", "SELECT * FROM t WHERE k BETWEEN 1000 AND 2090", 110, 111, 111},
		{"empty result of a range", "SELECT * FROM t WHERE k BETWEEN 1 AND 2", 0, 1, 1},
		// Sorting reads every row again from the sorter.
		{"unindexed ORDER BY", "SELECT * FROM t WHERE c = 3 ORDER BY k % 13", 143, 1143, 1143},
		// OP_Count has no loop: the count itself is the rows read (D1).
		{"count(*) of the table", "SELECT count(*) FROM t", 1, 1000, 1000},
		{"count(*) with a filter scans", "SELECT COUNT(*) AS n FROM t WHERE c >= 0", 1, 1000, 1000},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// Twice: the statement is cached and its counters must restart.
			for i := 0; i < 2; i++ {
				res := run(t, db, stmt(c.sql))
				require.Len(t, res[0].Results.(Rows), c.rows)
				got := res[0].Meta.RowsRead
				if got == 0 {
					t.Fatalf("rows_read is 0: the SQLite in this binary was built without -DSQLITE_ENABLE_STMT_SCANSTATUS; build with build.env")
				}
				assert.GreaterOrEqual(t, got, c.minRead)
				assert.LessOrEqual(t, got, c.maxRead)
				assert.Zero(t, res[0].Meta.RowsWritten)
			}
		})
	}
	// Reads are counted on reader connections too (the second run above went
	// to a reader once the SQL was known read-only).
	assert.True(t, db.isReadonly(&Request{Statements: []Statement{stmt("SELECT * FROM t WHERE id = 500")}}))
}

func TestRowsWrittenCountsIndexes(t *testing.T) {
	db, _ := openTest(t, Options{})
	run(t, db, stmt("CREATE TABLE u(id INTEGER PRIMARY KEY, a TEXT, b TEXT, c TEXT)"),
		stmt("CREATE INDEX u_a ON u(a)"), stmt("CREATE INDEX u_b ON u(b)"))

	w := func(sql string) int64 {
		t.Helper()
		res := run(t, db, stmt(sql))
		got := res[0].Meta.RowsWritten
		if got == 0 {
			t.Fatalf("rows_written is 0 for %q: the preupdate hook is missing (build tag sqlite_preupdate_hook)", sql)
		}
		return got
	}
	assert.Equal(t, int64(3), w("INSERT INTO u VALUES (1, 'a', 'b', 'c')"), "row + 2 index entries")
	assert.Equal(t, int64(6), w("INSERT INTO u VALUES (2, 'a', 'b', 'c'), (3, 'x', 'y', 'z')"))
	assert.Equal(t, int64(1), w("UPDATE u SET c = 'cc' WHERE id = 1"), "unindexed column: the row only")
	assert.Equal(t, int64(2), w("UPDATE u SET a = 'aa' WHERE id = 1"), "one index changed")
	assert.Equal(t, int64(3), w("UPDATE u SET a = 'a2', b = 'b2' WHERE id = 1"), "both indexes changed")
	assert.Equal(t, int64(3), w("UPDATE u SET id = 10 WHERE id = 1"), "rowid change touches every index")
	// DELETE without WHERE clears the table: its rows are written, its
	// index entries are not counted, and nothing is read (D1).
	res := run(t, db, stmt("DELETE FROM u"))
	assert.Equal(t, int64(3), res[0].Meta.RowsWritten, "3 rows, index entries not counted")
	assert.Zero(t, res[0].Meta.RowsRead)
	assert.Equal(t, int64(3), res[0].Meta.Changes)

	// Changes and changed_db for a DML statement.
	res = run(t, db, stmt("INSERT INTO u(a) VALUES ('q'), ('r')"))
	assert.Equal(t, int64(2), res[0].Meta.Changes)
	assert.True(t, res[0].Meta.ChangedDB)
	assert.Positive(t, res[0].Meta.LastRowID)
	res = run(t, db, stmt("SELECT * FROM u"))
	assert.Zero(t, res[0].Meta.Changes)
	assert.False(t, res[0].Meta.ChangedDB)
	assert.Positive(t, res[0].Meta.SizeAfter)

	// WITHOUT ROWID: the primary key is the table, not an extra index.
	run(t, db, stmt("CREATE TABLE wr(k TEXT PRIMARY KEY, v TEXT) WITHOUT ROWID"), stmt("CREATE INDEX wr_v ON wr(v)"))
	assert.Equal(t, int64(2), w("INSERT INTO wr VALUES ('k', 'v')"))

	// Triggers' writes count too.
	run(t, db, stmt("CREATE TABLE audit(x)"), stmt("CREATE TRIGGER u_audit AFTER INSERT ON u BEGIN INSERT INTO audit VALUES (new.id); END"))
	res = run(t, db, stmt("INSERT INTO u(a) VALUES ('t')"))
	assert.Equal(t, int64(4), res[0].Meta.RowsWritten, "3 for u + 1 for audit")
	assert.Equal(t, int64(2), res[0].Meta.Changes, "D1 counts the trigger's row as a change too")
}

func TestReturningAndUpsert(t *testing.T) {
	db, _ := openTest(t, Options{})
	run(t, db, stmt("CREATE TABLE kv(k TEXT PRIMARY KEY, v INTEGER)"))
	res := run(t, db, stmt("INSERT INTO kv VALUES ('a', 1) RETURNING k, v"))
	assert.Equal(t, []any{"a", int64(1)}, res[0].Results.(Rows)[0].Values())
	assert.Equal(t, int64(2), res[0].Meta.RowsWritten, "row + the primary-key index of a rowid table")
	res = run(t, db, stmt("INSERT INTO kv VALUES ('a', 5) ON CONFLICT(k) DO UPDATE SET v = v + excluded.v RETURNING v"))
	assert.Equal(t, []any{int64(6)}, res[0].Results.(Rows)[0].Values())
	assert.Equal(t, int64(1), res[0].Meta.RowsWritten, "the update changed no indexed column")
	assert.Equal(t, int64(1), res[0].Meta.Changes)
}

// A count answered by OP_Count reads the table's rows in both result
// shapes; counts SQLite computes with a loop are not added twice, and a
// query that merely mentions "count" is untouched.
func TestRowsReadSimpleCount(t *testing.T) {
	db, _ := openTest(t, Options{})
	seed1000(t, db)
	res, err := db.Execute(context.Background(), Request{Statements: []Statement{stmt("SELECT count(*) FROM t")}, Raw: true})
	require.NoError(t, err)
	assert.EqualValues(t, 1000, res[0].Meta.RowsRead)
	res = run(t, db, stmt("SELECT count(*) FROM t WHERE k > 5000"))
	assert.EqualValues(t, 500, res[0].Results.(Rows)[0].Values()[0])
	assert.EqualValues(t, 500, res[0].Meta.RowsRead, "index range to the index's end: the seek and 499 steps")
	res = run(t, db, stmt("SELECT c, count(*) FROM t GROUP BY c"))
	assert.EqualValues(t, 2000, res[0].Meta.RowsRead, "grouped count: the scan, then the sorter")
	res = run(t, db, stmt("SELECT 'count' AS w, 7 AS n"))
	assert.Zero(t, res[0].Meta.RowsRead)
	run(t, db, stmt("CREATE TABLE e(x)"))
	res = run(t, db, stmt("SELECT count(*) FROM e"))
	assert.Zero(t, res[0].Meta.RowsRead)
}
