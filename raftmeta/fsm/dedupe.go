package fsm

import (
	"context"
	"database/sql"
	"fmt"
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
	m    map[string]*reqEntry
	q    []*reqEntry // in log order (append order); q[head:] is live
	head int
}

// reqEntry is one remembered command. Entries are immutable once put, so a
// snapshot can share them with the live structure.
type reqEntry struct {
	id     string
	index  uint64
	ts     int64
	result []byte // JSON of the original Result
}

func newDedupe() *dedupe { return &dedupe{m: make(map[string]*reqEntry)} }

func (d *dedupe) get(id string) *reqEntry { return d.m[id] }

// put remembers e; a later entry for the same ID replaces the earlier one
// (a command re-sent after its first answer expired is applied again).
func (d *dedupe) put(e *reqEntry) {
	d.m[e.id] = e
	d.q = append(d.q, e)
}

// prune forgets entries from the oldest end while they are outside the
// window (ts < tsMin or index <= idxMax). Entries are in index order, so the
// index bound keeps at most dedupeMaxEntries; an entry whose time expired
// behind a younger one waits for its turn (lookups ignore it meanwhile).
func (d *dedupe) prune(tsMin int64, idxMax uint64) {
	for d.head < len(d.q) {
		e := d.q[d.head]
		if e.ts >= tsMin && e.index > idxMax {
			break
		}
		if d.m[e.id] == e {
			delete(d.m, e.id)
		}
		d.q[d.head] = nil
		d.head++
	}
	if d.head > 1024 && d.head*2 > len(d.q) { // reclaim the dead prefix
		n := copy(d.q, d.q[d.head:])
		clear(d.q[n:])
		d.q, d.head = d.q[:n], 0
	}
}

// live returns the entries in log order (a copy of the slice; the entries
// are shared). Writing them in order with INSERT OR REPLACE leaves exactly
// the current entry of each ID.
func (d *dedupe) live() []*reqEntry {
	return append([]*reqEntry(nil), d.q[d.head:]...)
}

func (d *dedupe) len() int { return len(d.m) }

// writeRequests stores entries into the requests table of the catalog
// copy behind conn (a snapshot being persisted), in one transaction.
func writeRequests(ctx context.Context, db *sql.DB, entries []*reqEntry) error {
	if len(entries) == 0 {
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
	for _, e := range entries {
		if _, err := st.ExecContext(ctx, e.id, int64(e.index), e.ts, e.result); err != nil {
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
