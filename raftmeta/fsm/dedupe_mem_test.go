package fsm

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hashicorp/raft"
	"github.com/stretchr/testify/require"
)

// The in-memory dedupe against a plain map model: puts, replacements,
// pruning by index and time, chunk reclamation, compaction, and a view
// that stays readable after the live structure moved on.
func TestDedupeMatchesModel(t *testing.T) {
	d := newDedupe()
	type ent struct {
		index  uint64
		ts     int64
		result string
	}
	model := map[string]ent{}
	var order []string // ids in put order (for the model's prune)
	put := func(id string, index uint64, ts int64, result string) {
		d.put(&reqEntry{id: id, index: index, ts: ts, result: []byte(result)})
		model[id] = ent{index, ts, result}
		order = append(order, id)
	}
	check := func() {
		t.Helper()
		require.Equal(t, len(model), d.len())
		for id, e := range model {
			got := d.get(id)
			require.NotNil(t, got, id)
			require.Equal(t, e.index, got.index)
			require.Equal(t, e.ts, got.ts)
			require.Equal(t, e.result, string(got.result))
		}
	}
	idx := uint64(0)
	big := strings.Repeat("x", dedupeChunk+10) // larger than a chunk
	for i := 0; i < 20000; i++ {
		idx++
		res := fmt.Sprintf(`{"index":%d,"value":"%s"}`, idx, strings.Repeat("v", i%300))
		if i == 777 {
			res = big
		}
		put(fmt.Sprintf("rid-%d", i%15000), idx, int64(idx), res) // the last 5,000 replace earlier ids
	}
	check()
	require.Nil(t, d.get("never"))

	v := d.view() // taken before pruning: must stay readable and unchanged
	var before []string
	require.NoError(t, v.each(func(id string, index uint64, ts int64, result []byte) error {
		before = append(before, fmt.Sprintf("%s/%d/%d/%d", id, index, ts, len(result)))
		return nil
	}))
	require.Len(t, before, 20000)

	// Prune by index: everything at or below 12,000 goes.
	d.prune(0, 12000)
	for id, e := range model {
		if e.index <= 12000 {
			delete(model, id)
		}
	}
	check()
	require.Less(t, len(d.chunks), 8, "chunks of pruned entries are freed")
	// Prune by time: ts below 16,000.
	d.prune(16000, 0)
	for id, e := range model {
		if e.ts < 16000 {
			delete(model, id)
		}
	}
	check()
	// More puts after compaction keep working.
	for i := 0; i < 3000; i++ {
		idx++
		put(fmt.Sprintf("new-%d", i), idx, int64(idx), "r")
	}
	check()
	d.prune(1<<62, 0)
	require.Equal(t, 0, d.len())
	require.Nil(t, d.get("new-1"))

	// The old view still reads exactly what it captured, after pruning,
	// compaction and more puts on the live structure.
	var after []string
	require.NoError(t, v.each(func(id string, index uint64, ts int64, result []byte) error {
		after = append(after, fmt.Sprintf("%s/%d/%d/%d", id, index, ts, len(result)))
		return nil
	}))
	require.Equal(t, before, after)
	require.Contains(t, after, fmt.Sprintf("rid-777/778/778/%d", len(big)))

	// The view held every chunk it saw; releasing it frees the ones the
	// live structure pruned meanwhile, and only those.
	held := append([]*chunk(nil), v.chunks...)
	live := map[*chunk]bool{}
	for _, c := range d.chunks {
		live[c] = true
	}
	v.release()
	for _, c := range held {
		if live[c] {
			require.NotNil(t, c.mem, "a chunk the live structure still uses stays allocated")
			require.Equal(t, int32(1), c.refs.Load())
		} else {
			require.Nil(t, c.mem, "a pruned chunk is freed once the last view lets go")
		}
	}
	d.free()
	for c := range live {
		require.Nil(t, c.mem)
	}
}

// A view keeps the chunks it references allocated while the live structure
// prunes them (off the heap, reading freed memory would fault, not just
// read stale bytes); the last reference frees them.
func TestDedupeViewPinsChunks(t *testing.T) {
	d := newDedupe()
	res := strings.Repeat("r", 1000)
	for i := range 3000 { // ~3 MB: several chunks
		d.put(&reqEntry{id: fmt.Sprintf("id-%d", i), index: uint64(i + 1), ts: int64(i + 1), result: []byte(res)})
	}
	require.Greater(t, len(d.chunks), 2)
	first := d.chunks[0]
	v := d.view()
	d.prune(1<<62, 0) // everything expires; the last chunk stays (being filled)
	require.Equal(t, 0, d.len())
	require.NotNil(t, first.mem, "pinned by the view")
	n := 0
	require.NoError(t, v.each(func(id string, _ uint64, _ int64, result []byte) error {
		require.Equal(t, fmt.Sprintf("id-%d", n), id)
		require.Equal(t, res, string(result))
		n++
		return nil
	}))
	require.Equal(t, 3000, n)
	v.release()
	require.Nil(t, first.mem, "freed with the last reference")
	d.free()
}

// Thousands of remembered IDs travel through a snapshot in both modes (the
// rows must land in the streamed file, not in a -wal beside it, and the copy
// must be able to grow).
func TestManyRequestIDsSurviveSnapshotRestore(t *testing.T) {
	for _, mode := range []SnapshotMode{SnapshotBackup, SnapshotSerialize} {
		f := newFSM(t, WithSnapshotMode(mode))
		d := newDriver(t, f)
		d.account("a1", 100000)
		var first Result
		for i := 0; i < 3000; i++ {
			r := d.doRID(CmdCreateDatabase, fmt.Sprintf("c-%d", i), createDB(uuidN(i+10), "a1", fmt.Sprintf("db-%d", i)))
			require.Nil(t, r.Err)
			if i == 0 {
				first = r
			}
		}
		g := newFSM(t)
		require.NoError(t, restoreBytes(g, snapshotBytes(t, f)))
		require.Equal(t, 3000+1, g.dd.len(), "every remembered ID restored (plus the account's)")
		dg := &driver{t: t, f: g, index: d.index, now: d.now}
		require.Equal(t, first, dg.doRID(CmdCreateDatabase, "c-0", createDB(uuidN(10), "a1", "db-0")))
		var n int
		require.NoError(t, g.rdb.QueryRow(`SELECT count(*) FROM requests`).Scan(&n))
		require.Zero(t, n, "the live table stays empty after a restore")
	}
}

// Consecutive creates in one batch bump the account's active count once
// (flushActive); the limit, a delete in the middle, a refusal of another
// kind and the end of the batch all see the right count.
func TestActiveCountInsideABatch(t *testing.T) {
	ctx := context.Background()
	f := newFSM(t)
	var logs []*raft.Log
	add := func(typ CommandType, body any) {
		logs = append(logs, &raft.Log{Index: uint64(len(logs) + 1), Type: raft.LogCommand,
			Data: encode(t, typ, fmt.Sprintf("r%d", len(logs)), baseTime+int64(len(logs)), body)})
	}
	l := bigLimits()
	l.MaxDatabases = 3
	add(CmdCreateAccount, CreateAccount{ID: "a1", Name: "a", Tier: TierFree, Limits: l})
	add(CmdCreateDatabase, createDB(uuidN(1), "a1", "one"))
	add(CmdCreateDatabase, createDB(uuidN(2), "a1", "two"))
	add(CmdCreateDatabase, createDB(uuidN(3), "a1", "three"))
	add(CmdCreateDatabase, createDB(uuidN(4), "a1", "four"))                 // over the limit of 3
	add(CmdDeleteDatabase, DeleteDatabase{AccountID: "a1", UUID: uuidN(2)})  // flushes, then 2 active
	add(CmdDeleteDatabase, DeleteDatabase{AccountID: "a1", UUID: uuidN(99)}) // refused: must not undo the flush
	add(CmdCreateDatabase, createDB(uuidN(5), "a1", "five"))                 // 3 active
	add(CmdCreateDatabase, createDB(uuidN(6), "a1", "six"))                  // over the limit again
	out := f.ApplyBatch(logs)
	errs := make([]error, len(out))
	for i, o := range out {
		if e := o.(Result).Err; e != nil {
			errs[i] = e
		}
	}
	require.NoError(t, errs[1])
	require.NoError(t, errs[2])
	require.NoError(t, errs[3])
	require.ErrorIs(t, errs[4], ErrDatabaseLimit)
	require.NoError(t, errs[5])
	require.ErrorIs(t, errs[6], ErrNotFound)
	require.NoError(t, errs[7])
	require.ErrorIs(t, errs[8], ErrDatabaseLimit)
	a, err := f.Account(ctx, "a1")
	require.NoError(t, err)
	require.Equal(t, int64(3), a.ActiveDatabases)
	require.Empty(t, f.activeDelta, "nothing left pending between batches")
}

// writeRequests inserts requestRowsPerInsert rows per statement: the table
// it writes holds exactly the rows one INSERT per entry wrote (the earlier
// code, kept here as the reference), at the sizes around a statement's
// boundary, the last shorter statement included.
func TestWriteRequestsMatchesOneRowInserts(t *testing.T) {
	ctx := context.Background()
	open := func() *sql.DB {
		db, err := sql.Open("sqlite3", "file:"+filepath.Join(t.TempDir(), "r.db")+"?_journal_mode=DELETE")
		require.NoError(t, err)
		t.Cleanup(func() { db.Close() })
		_, err = db.Exec(`CREATE TABLE requests (log_index INTEGER PRIMARY KEY, request_id TEXT NOT NULL UNIQUE,
			ts INTEGER NOT NULL, result BLOB NOT NULL); CREATE INDEX requests_ts ON requests (ts)`)
		require.NoError(t, err)
		return db
	}
	rows := func(db *sql.DB) [][4]any {
		rs, err := db.Query(`SELECT log_index, request_id, ts, result FROM requests ORDER BY log_index`)
		require.NoError(t, err)
		defer rs.Close()
		var out [][4]any
		for rs.Next() {
			var idx, ts int64
			var id string
			var res []byte
			require.NoError(t, rs.Scan(&idx, &id, &ts, &res))
			out = append(out, [4]any{idx, id, ts, string(res)})
		}
		require.NoError(t, rs.Err())
		return out
	}
	n := requestRowsPerInsert
	for _, size := range []int{1, n - 1, n, n + 1, 3*n + 7} {
		d := newDedupe()
		for i := range size {
			d.put(&reqEntry{id: fmt.Sprintf("rid-%05d", i), index: uint64(100 + 3*i), ts: int64(1_000_000 + i),
				result: []byte(fmt.Sprintf(`{"index":%d,"value":{"n":%d}}`, 100+3*i, i))})
		}
		v := d.view()
		got := open()
		require.NoError(t, writeRequests(ctx, got, v))
		want := open()
		require.NoError(t, v.each(func(id string, index uint64, ts int64, result []byte) error {
			_, err := want.Exec(`INSERT OR REPLACE INTO requests (request_id, log_index, ts, result) VALUES (?, ?, ?, ?)`, id, int64(index), ts, result)
			return err
		}))
		w := rows(want)
		require.Len(t, w, size)
		require.Equal(t, w, rows(got), "size %d", size)
		v.release()
		d.free()
	}
}
