package fsm

import (
	"context"
	"database/sql"
	"fmt"
	"hash/fnv"
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
	// clients was those pauses.)
	chunks    [][]byte
	chunkBase uint32 // chunk number of chunks[0]
}

// reqRec is one remembered command (pointer-free).
type reqRec struct {
	key   [16]byte
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
	c := d.chunks[r.chunk-d.chunkBase]
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
	if len(d.chunks) == 0 || cap(d.chunks[len(d.chunks)-1])-len(d.chunks[len(d.chunks)-1]) < need {
		d.chunks = append(d.chunks, make([]byte, 0, max(dedupeChunk, need)))
	}
	ci := len(d.chunks) - 1
	c := d.chunks[ci]
	off := len(c)
	c = append(append(c, e.id...), e.result...)
	d.chunks[ci] = c
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
	// being filled).
	keep := uint32(len(d.chunks) - 1)
	if d.head < len(d.q) {
		keep = min(keep, d.q[d.head].chunk-d.chunkBase)
	}
	if keep > 0 {
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
// array), and the chunks are append-only and stay alive while referenced.
// So Persist can read the view from another goroutine while apply goes on.
type dedupeView struct {
	q         []reqRec
	chunks    [][]byte
	chunkBase uint32
}

func (d *dedupe) view() dedupeView {
	return dedupeView{q: d.q[d.head:len(d.q):len(d.q)],
		chunks: append([][]byte(nil), d.chunks...), chunkBase: d.chunkBase}
}

// each calls fn for every entry in log order. Writing them in order with
// INSERT OR REPLACE leaves exactly the current entry of each ID.
func (v dedupeView) each(fn func(id string, index uint64, ts int64, result []byte) error) error {
	for i := range v.q {
		r := &v.q[i]
		c := v.chunks[r.chunk-v.chunkBase]
		id, res := c[r.off:r.off+r.idLen], c[r.off+r.idLen:r.off+r.idLen+r.resLn]
		if err := fn(string(id), r.index, r.ts, res); err != nil {
			return err
		}
	}
	return nil
}

func (d *dedupe) len() int { return len(d.m) }

// writeRequests stores the view's entries into the requests table of db (a
// snapshot's copy of the catalog), in one transaction.
func writeRequests(ctx context.Context, db *sql.DB, v dedupeView) error {
	if len(v.q) == 0 {
		return nil
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("write request ids: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // no-op after commit
	st, err := tx.PrepareContext(ctx, `INSERT OR REPLACE INTO requests (request_id, log_index, ts, result) VALUES (?, ?, ?, ?)`)
	if err != nil {
		return fmt.Errorf("write request ids: %w", err)
	}
	defer st.Close()
	if err := v.each(func(id string, index uint64, ts int64, result []byte) error {
		_, err := st.ExecContext(ctx, id, int64(index), ts, result)
		return err
	}); err != nil {
		return fmt.Errorf("write request ids: %w", err)
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
			return fmt.Errorf("load request ids: %w", err)
		}
		e.index = uint64(idx)
		d.put(&e)
	}
	if err := rows.Close(); err != nil {
		return fmt.Errorf("load request ids: %w", err)
	}
	if _, err := f.wconn.ExecContext(ctx, `DELETE FROM requests`); err != nil {
		return fmt.Errorf("load request ids: %w", err)
	}
	f.dd = d
	return nil
}
