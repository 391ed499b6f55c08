package history

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/objecthost/sqlexec"
)

// dumpDB is the logical content of a database through sqlexec: every
// sqlite_schema row, then every table's rows in rowid order, read in one
// read transaction.
func dumpDB(t testing.TB, db *sqlexec.DB) string {
	t.Helper()
	res, err := execOn(db, "SELECT type, name, tbl_name, sql FROM sqlite_schema ORDER BY type, name")
	require.NoError(t, err)
	raw := res[0].Results.(*sqlexec.RawResults)
	var b strings.Builder
	var stmts []sqlexec.Statement
	for _, r := range raw.Rows {
		fmt.Fprintf(&b, "%v\n", r)
		if r[0] == "table" && !strings.HasPrefix(r[1].(string), "sqlite_") {
			stmts = append(stmts, sqlexec.Statement{SQL: fmt.Sprintf(`SELECT * FROM "%s" ORDER BY rowid`, r[1])})
		}
	}
	if len(stmts) > 0 {
		res, err := db.Execute(context.Background(), sqlexec.Request{Statements: stmts, Raw: true})
		require.NoError(t, err)
		for i, r := range res {
			j, err := json.Marshal(r.Results)
			require.NoError(t, err)
			fmt.Fprintf(&b, "%s: %s\n", stmts[i].SQL, j)
		}
	}
	return b.String()
}

// dumpRestored opens a restored file with sqlexec (no capture), dumps it,
// closes it, and checks PRAGMA integrity_check with a plain connection.
func dumpRestored(t testing.TB, path string) string {
	t.Helper()
	db, err := sqlexec.Open(path, sqlexec.Options{ReadConns: 1})
	require.NoError(t, err)
	d := dumpDB(t, db)
	require.NoError(t, db.Close())
	dumpFile(t, path) // integrity_check
	return d
}

type workload struct {
	rng     *rand.Rand
	tables  []string
	cols    map[string]int
	nextTab int
}

func (w *workload) blob(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(w.rng.IntN(256))
	}
	return b
}

// step runs one random write (DDL, inserts, updates, deletes, blobs,
// random() and datetime defaults) and returns its SQL for failures.
func (w *workload) step(t testing.TB, db *sqlexec.DB) {
	t.Helper()
	r := w.rng.IntN(100)
	if len(w.tables) == 0 {
		r = 0
	}
	pick := func() string { return w.tables[w.rng.IntN(len(w.tables))] }
	var err error
	var what string
	switch {
	case r < 6 && len(w.tables) < 5:
		name := fmt.Sprintf("t%d", w.nextTab)
		w.nextTab++
		what = "create " + name
		_, err = execOn(db, fmt.Sprintf(`CREATE TABLE %s(id INTEGER PRIMARY KEY, a TEXT, b BLOB, r INTEGER DEFAULT (random()), at TEXT DEFAULT (strftime('%%Y-%%m-%%d %%H:%%M:%%f','now')))`, name))
		w.tables = append(w.tables, name)
	case r < 9:
		tb := pick()
		what = "index " + tb
		_, err = execOn(db, fmt.Sprintf(`CREATE INDEX IF NOT EXISTS %s_a ON %s(a, r)`, tb, tb))
	case r < 11 && w.cols[pick()] < 3:
		tb := pick()
		w.cols[tb]++
		what = "alter " + tb
		_, err = execOn(db, fmt.Sprintf(`ALTER TABLE %s ADD COLUMN c%d INTEGER DEFAULT (%d)`, tb, w.cols[tb], w.rng.IntN(1000)))
	case r < 12 && len(w.tables) > 2:
		i := w.rng.IntN(len(w.tables))
		what = "drop " + w.tables[i]
		_, err = execOn(db, "DROP TABLE "+w.tables[i])
		w.tables = append(w.tables[:i], w.tables[i+1:]...)
	case r < 60:
		tb := pick()
		n := 1 + w.rng.IntN(20)
		stmts := make([]sqlexec.Statement, n)
		for i := range stmts {
			size := w.rng.IntN(3000)
			if w.rng.IntN(10) == 0 {
				size = 10000 + w.rng.IntN(20000) // overflow pages
			}
			a, _ := json.Marshal(strings.Repeat(string(rune('a'+w.rng.IntN(26))), w.rng.IntN(200)))
			stmts[i] = sqlexec.Statement{SQL: fmt.Sprintf("INSERT INTO %s(a, b) VALUES (?, randomblob(?))", tb), Params: []json.RawMessage{a, json.RawMessage(fmt.Sprint(size))}}
		}
		what = "insert " + tb
		_, err = db.Execute(context.Background(), sqlexec.Request{Statements: stmts})
	case r < 80:
		tb := pick()
		what = "update " + tb
		_, err = execOn(db, fmt.Sprintf("UPDATE %s SET a = a || ?, b = randomblob(?), r = random() WHERE id %% ? = ?", tb), "u", w.rng.IntN(4000), 2+w.rng.IntN(5), w.rng.IntN(2))
	default:
		tb := pick()
		what = "delete " + tb
		_, err = execOn(db, fmt.Sprintf("DELETE FROM %s WHERE id %% ? = ?", tb), 2+w.rng.IntN(6), w.rng.IntN(2))
	}
	require.NoError(t, err, what)
}

type moment struct {
	pos  Position
	dump string
}

// TestRestoreRandomMoments: restore to each of 100 random moments of a
// randomized workload equals the database as it was at that moment, table
// by table and schema by schema; bookmarks and timestamps resolve to the
// same moments. The workload crosses many checkpoints and WAL restarts,
// and the shipper takes snapshots while it runs. Archive: S3 (gofakes3
// over loopback HTTP).
func TestRestoreRandomMoments(t *testing.T) {
	_, store := newS3(t)
	e := newEnv(t, store, CaptureOptions{CheckpointFrames: 32}, ShipperOptions{MaxLag: 100 * time.Millisecond, SnapshotMinBytes: 512 << 10})
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	w := &workload{rng: rand.New(rand.NewPCG(uint64(seed), 7)), cols: map[string]int{}}
	var moments []moment
	for len(moments) < 100 {
		steps := 1 + w.rng.IntN(8)
		if w.rng.IntN(4) == 0 {
			// Concurrent writers: group commit puts several requests in
			// one transaction.
			var wg sync.WaitGroup
			ws := make([]*workload, 4)
			for i := range ws {
				ws[i] = &workload{rng: rand.New(rand.NewPCG(w.rng.Uint64(), 1)), tables: append([]string(nil), w.tables...), cols: map[string]int{}, nextTab: 1000}
				for k, v := range w.cols {
					ws[i].cols[k] = v + 10 // no ALTER from these
				}
			}
			for _, cw := range ws {
				wg.Add(1)
				go func(cw *workload) {
					defer wg.Done()
					for k := 0; k < steps; k++ {
						cw.stepDML(t, e.db)
					}
				}(cw)
			}
			wg.Wait()
		} else {
			for k := 0; k < steps; k++ {
				w.step(t, e.db)
			}
		}
		moments = append(moments, moment{pos: e.cap.Current(), dump: dumpDB(t, e.db)})
	}
	stats := e.cap.Stats()
	t.Logf("capture: %+v", stats)
	e.close()
	assert.GreaterOrEqual(t, stats.FullCheckpoints, int64(5), "crosses several checkpoints")
	assert.GreaterOrEqual(t, stats.WALRestarts, int64(3), "and WAL restarts")
	assert.EqualValues(t, 1, stats.Generations)

	ctx := context.Background()
	vs, err := e.archive.Verify(ctx, e.key)
	require.NoError(t, err)
	t.Logf("archive: %+v", vs)
	assert.Equal(t, 1, vs.Generations)
	assert.GreaterOrEqual(t, vs.Snapshots, 3, "snapshots besides the base")
	assert.Equal(t, moments[len(moments)-1].pos, vs.Last)

	dir := t.TempDir()
	for i, m := range moments {
		b := MakeBookmark(e.key, m.pos)
		if i > 0 && moments[i-1].pos != m.pos {
			assert.Less(t, string(MakeBookmark(e.key, moments[i-1].pos)), string(b), "bookmarks sort")
		}
		p, err := ParseBookmark(e.key, b)
		require.NoError(t, err)
		// The timestamp of the moment resolves to the same position.
		rp, err := e.archive.Resolve(ctx, e.key, m.pos.Time())
		require.NoError(t, err)
		require.Equal(t, m.pos, rp, "moment %d", i)
		out := filepath.Join(dir, fmt.Sprintf("m%d.db", i))
		_, err = e.archive.Restore(ctx, e.key, p, out)
		require.NoError(t, err, "moment %d", i)
		require.Equal(t, m.dump, dumpRestored(t, out), "moment %d (%v)", i, m.pos)
	}
}

// stepDML is step without DDL (for concurrent writers sharing tables).
func (w *workload) stepDML(t testing.TB, db *sqlexec.DB) {
	t.Helper()
	if len(w.tables) == 0 {
		return
	}
	for {
		r := w.rng.IntN(100)
		if r >= 12 {
			w.stepAt(t, db, r)
			return
		}
	}
}

func (w *workload) stepAt(t testing.TB, db *sqlexec.DB, r int) {
	t.Helper()
	tb := w.tables[w.rng.IntN(len(w.tables))]
	var err error
	switch {
	case r < 60:
		_, err = execOn(db, fmt.Sprintf("INSERT INTO %s(a, b) VALUES (?, randomblob(?))", tb), "c", w.rng.IntN(5000))
	case r < 80:
		_, err = execOn(db, fmt.Sprintf("UPDATE %s SET b = randomblob(?), r = random() WHERE id %% 7 = ?", tb), w.rng.IntN(3000), w.rng.IntN(7))
	default:
		_, err = execOn(db, fmt.Sprintf("DELETE FROM %s WHERE id %% 11 = ?", tb), w.rng.IntN(11))
	}
	// A concurrent writer may find its table dropped by nobody (no DDL runs
	// concurrently), so every error is a failure.
	require.NoError(t, err)
}
