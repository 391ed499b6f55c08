package fsm

import (
	"context"
	"database/sql"
	"fmt"
	"hash/fnv"
	"strings"
	"sync/atomic"
)

// dedupe remembers recently applied request IDs and their results, in
// memory. It belongs to the apply goroutine (Apply, ApplyBatch, Snapshot and
// Restore, which hashicorp/raft never runs concurrently).
//
// It used to be the catalog table requests, written by every command: a
// lookup, an insert into three B-trees and two prune statements per batch,
// about 35% of the FSM's cost per create (TestBenchRaftmetaStages: 27–32 µs
// per create with the table, 19–20 µs without). In memory it costs a map
// lookup and an append. It still travels in snapshots: Snapshot copies the
// live entries and Persist writes them into the snapshot's copy of the
// requests table (same format as before, so snapshots of either kind
// restore), and Restore loads them back and empties the table.
//
// Determinism: the entries are a function of the applied log (every replica
// puts the same entry at the same index). Pruning happens at the end of each
// batch, and batches differ between replicas, so at a given index two
// replicas may hold different expired entries; that never shows, because
// lookups apply the expiry rule themselves (dedupeThresholds) and an expired
// entry is never used.
type dedupe struct {
	m    map[[16]byte]uint64 // hash of the ID → sequence number of its entry
	q    []reqRec            // entries in log order; q[head:] is live
	head int
	seq0 uint64 // sequence number of q[0]

	// The IDs and results live in append-only chunks, freed in FIFO order
	// as the entries that use them are pruned. Nothing above holds a
	// pointer per entry: the map, the records and the chunks' bytes are
	// all pointer-free, so the garbage collector never walks them. (With a
	// map of pointers, 3 replicas' 100,000+ entries made each GC mark phase
	// take 15–47 ms and every in-flight create wait for it: the p99 at 64
	// clients was those pauses.) The chunks' bytes are outside the Go heap
	// (allocChunk): on the heap, up to ~100 MB of them made GOGC=400 let
	// the heap grow to ~5× that before collecting.
	chunks    []*chunk
	used      int    // bytes filled in the last chunk
	chunkBase uint32 // chunk number of chunks[0]
}

// chunk is one block of IDs and results. Its memory may be outside the Go
// heap and is freed explicitly when the last reference goes: one held by
// the live structure until prune passes it, one by each snapshot view
// until the view is released. mem is never resliced after creation, so a
// view may read it while apply appends past what the view knows.
type chunk struct {
	mem     []byte
	offHeap bool
	refs    atomic.Int32
}

func newChunk(n int) *chunk {
	c := &chunk{}
	c.mem, c.offHeap = allocChunk(n)
	c.refs.Store(1)
	return c
}

func (c *chunk) unref() {
	if c.refs.Add(-1) == 0 {
		freeChunk(c.mem, c.offHeap)
		c.mem = nil
	}
}

// reqRec is one remembered command (pointer-free).
type reqRec struct {
	key [16]byte
	// index is the command's position (batchentry.go): its log index, or
	// past it once batch entries were applied — one per command, in log
	// order. Snapshots store it as requests.log_index.
	index uint64
	ts    int64
	chunk uint32 // absolute chunk number
	off   uint32 // where the ID starts in the chunk; the result follows it
	idLen uint32
	resLn uint32
}

// reqEntry is a remembered command as read back (lookups, snapshots).
type reqEntry struct {
	id     string
	index  uint64
	ts     int64
	result []byte // JSON of the original Result
}

const dedupeChunk = 1 << 20

func newDedupe() *dedupe { return &dedupe{m: make(map[[16]byte]uint64)} }

func dedupeKey(id string) [16]byte {
	h := fnv.New128a()
	h.Write([]byte(id)) //nolint:errcheck // hash writes never fail
	var k [16]byte
	h.Sum(k[:0])
	return k
}

func (d *dedupe) bytes(r *reqRec) (id, result []byte) {
	c := d.chunks[r.chunk-d.chunkBase].mem
	return c[r.off : r.off+r.idLen], c[r.off+r.idLen : r.off+r.idLen+r.resLn]
}

// get returns the entry for id, if remembered. The result aliases the
// arena: read it before the next put.
func (d *dedupe) get(id string) *reqEntry {
	seq, ok := d.m[dedupeKey(id)]
	if !ok {
		return nil
	}
	r := &d.q[seq-d.seq0]
	rid, res := d.bytes(r)
	if string(rid) != id { // a 128-bit hash collision: treat as unknown
		return nil
	}
	return &reqEntry{id: id, index: r.index, ts: r.ts, result: res}
}

// put remembers e; a later entry for the same ID replaces the earlier one
// (a command re-sent after its first answer expired is applied again).
func (d *dedupe) put(e *reqEntry) {
	need := len(e.id) + len(e.result)
	if len(d.chunks) == 0 || len(d.chunks[len(d.chunks)-1].mem)-d.used < need {
		d.chunks = append(d.chunks, newChunk(max(dedupeChunk, need)))
		d.used = 0
	}
	ci := len(d.chunks) - 1
	c := d.chunks[ci].mem
	off := d.used
	copy(c[off:], e.id)
	copy(c[off+len(e.id):], e.result)
	d.used += need
	key := dedupeKey(e.id)
	d.m[key] = d.seq0 + uint64(len(d.q))
	d.q = append(d.q, reqRec{key: key, index: e.index, ts: e.ts, chunk: d.chunkBase + uint32(ci),
		off: uint32(off), idLen: uint32(len(e.id)), resLn: uint32(len(e.result))})
}

// prune forgets entries from the oldest end while they are outside the
// window (ts < tsMin or index <= idxMax). Entries are in index order, so the
// index bound keeps at most dedupeMaxEntries; an entry whose time expired
// behind a younger one waits for its turn (lookups ignore it meanwhile).
func (d *dedupe) prune(tsMin int64, idxMax uint64) {
	for d.head < len(d.q) {
		r := &d.q[d.head]
		if r.ts >= tsMin && r.index > idxMax {
			break
		}
		if seq, ok := d.m[r.key]; ok && seq == d.seq0+uint64(d.head) {
			delete(d.m, r.key)
		}
		d.head++
	}
	// Free the chunks no live entry uses (the last chunk stays: it is
	// being filled). None yet: a batch of only entries that are not
	// remembered (envelope or level refusals) as a catalog's first.
	if len(d.chunks) == 0 {
		return
	}
	keep := uint32(len(d.chunks) - 1)
	if d.head < len(d.q) {
		keep = min(keep, d.q[d.head].chunk-d.chunkBase)
	}
	if keep > 0 {
		for _, c := range d.chunks[:keep] {
			c.unref()
		}
		clear(d.chunks[:keep])
		d.chunks = d.chunks[keep:]
		d.chunkBase += keep
	}
	if d.head > 1024 && d.head*2 > len(d.q) { // reclaim the dead prefix
		// Into a new array, never in place: a snapshot's view may still be
		// reading the old one.
		d.q = append(make([]reqRec, 0, 2*(len(d.q)-d.head)+1024), d.q[d.head:]...)
		d.seq0 += uint64(d.head)
		d.head = 0
	}
}

// dedupeView is a point-in-time view of the live entries for a snapshot,
// taken in O(chunks): the records are shared, not copied, because the live
// structure never writes a record it has already published (put appends
// past the view's end, prune only moves head, compaction copies into a new
// array), and the chunks are append-only and stay allocated while a view
// holds a reference. So Persist can read the view from another goroutine
// while apply goes on. The view must be released (release) exactly once.
type dedupeView struct {
	q         []reqRec
	chunks    []*chunk
	chunkBase uint32
}

func (d *dedupe) view() dedupeView {
	for _, c := range d.chunks {
		c.refs.Add(1)
	}
	return dedupeView{q: d.q[d.head:len(d.q):len(d.q)],
		chunks: append([]*chunk(nil), d.chunks...), chunkBase: d.chunkBase}
}

// release drops the view's references to its chunks.
func (v *dedupeView) release() {
	for _, c := range v.chunks {
		c.unref()
	}
	v.chunks, v.q = nil, nil
}

// free releases every chunk of a dedupe no longer used (replaced by a
// restore, or the FSM closed). Apply goroutine (or exclusive owner) only.
func (d *dedupe) free() {
	for _, c := range d.chunks {
		c.unref()
	}
	d.chunks, d.q, d.m = nil, nil, map[[16]byte]uint64{}
	d.head, d.used = 0, 0
}

// each calls fn for every entry in log order. Writing them in order with
// INSERT OR REPLACE leaves exactly the current entry of each ID.
func (v dedupeView) each(fn func(id string, index uint64, ts int64, result []byte) error) error {
	for i := range v.q {
		r := &v.q[i]
		c := v.chunks[r.chunk-v.chunkBase].mem
		id, res := c[r.off:r.off+r.idLen], c[r.off+r.idLen:r.off+r.idLen+r.resLn]
		if err := fn(string(id), r.index, r.ts, res); err != nil {
			return err
		}
	}
	return nil
}

func (d *dedupe) len() int { return len(d.m) }

// requestRowsPerInsert is how many requests rows one INSERT of
// writeRequests carries. A snapshot writes up to DefaultDedupeMaxEntries
// rows; with a statement per row that was 80% of a snapshot's CPU, about a
// third of it the per-statement costs (database/sql, cgo, the VDBE
// program's setup): 64 rows a statement cut it to 0.68×, the whole
// snapshot to 0.78× (BenchmarkSnapshotPersist). 4 parameters a row stay far
// under SQLite's limit of 32,766. A failed write leaves only the temporary
// copy, which the caller removes.
const requestRowsPerInsert = 64

// writeRequests stores the view's entries into the requests table of db (a
// snapshot's copy of the catalog), in one transaction, in the view's order
// (the rows are the same whatever the statement size).
func writeRequests(ctx context.Context, db *sql.DB, v dedupeView) error {
	if len(v.q) == 0 {
		return nil
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("write request ids: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // no-op after commit
	insert := func(rows int) string {
		var b strings.Builder
		b.WriteString(`INSERT OR REPLACE INTO requests (request_id, log_index, ts, result) VALUES `)
		for i := range rows {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(`(?, ?, ?, ?)`)
		}
		return b.String()
	}
	full, err := tx.PrepareContext(ctx, insert(min(requestRowsPerInsert, len(v.q))))
	if err != nil {
		return fmt.Errorf("write request ids: %w", err)
	}
	defer full.Close()
	args := make([]any, 0, 4*requestRowsPerInsert)
	flush := func() error {
		st := full
		if len(args) < 4*requestRowsPerInsert && len(args) < 4*len(v.q) {
			// The last, shorter statement.
			var err error
			if st, err = tx.PrepareContext(ctx, insert(len(args)/4)); err != nil {
				return err
			}
			defer st.Close()
		}
		_, err := st.ExecContext(ctx, args...)
		args = args[:0]
		return err
	}
	if err := v.each(func(id string, index uint64, ts int64, result []byte) error {
		args = append(args, id, int64(index), ts, result)
		if len(args) == cap(args) {
			return flush()
		}
		return nil
	}); err != nil {
		return fmt.Errorf("write request ids: %w", err)
	}
	if len(args) > 0 {
		if err := flush(); err != nil {
			return fmt.Errorf("write request ids: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("write request ids: %w", err)
	}
	return nil
}

// loadDedupe moves the requests table of the open catalog (a restored
// snapshot) into memory and empties the table.
func (f *FSM) loadDedupe(ctx context.Context) error {
	d := newDedupe()
	rows, err := f.wconn.QueryContext(ctx, `SELECT request_id, log_index, ts, result FROM requests ORDER BY log_index`)
	if err != nil {
		return fmt.Errorf("load request ids: %w", err)
	}
	for rows.Next() {
		var (
			e   reqEntry
			idx int64
		)
		if err := rows.Scan(&e.id, &idx, &e.ts, &e.result); err != nil {
			rows.Close()
			d.free()
			return fmt.Errorf("load request ids: %w", err)
		}
		e.index = uint64(idx)
		d.put(&e)
	}
	if err := rows.Close(); err != nil {
		d.free()
		return fmt.Errorf("load request ids: %w", err)
	}
	if _, err := f.wconn.ExecContext(ctx, `DELETE FROM requests`); err != nil {
		d.free()
		return fmt.Errorf("load request ids: %w", err)
	}
	f.dd.free()
	f.dd = d
	return nil
}
