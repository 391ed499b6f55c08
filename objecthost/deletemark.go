package objecthost

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"
)

// Delete markers (objecthost/history/deletemark.go): a database its host
// deleted on the catalog's word is never revived from the archive.
//
// A catalog restored from an older backup lists again, active, the
// databases deleted after the backup ("zombies", resurrected.go). Their
// hosts keep them deleted; but if such a host is then declared lost,
// lost-host recovery (edge/relocate.go) would restore every database the
// catalog places on it from the archive — the zombies included, bringing
// back data the user deleted. So the host writes what it knows to the
// archive, and an init that restores from the archive checks it first:
//
//  1. a delete on the catalog's word (the API's delete, a heartbeat
//     answering "deleted") sets Meta.CatalogDeleted in the index commit
//     of the delete — the host delete's own checkpoint;
//  2. the marker pass (after each such delete, at start, and every
//     deleteMarkRetry) writes <db>/deleted/<object> to the archive for
//     each such record without ArchiveMarked — *the Put is the
//     checkpoint*: from it on, the archive refuses to revive the database;
//  3. an index commit sets ArchiveMarked (a memo: a crash before it only
//     writes the same marker again).
//
// The sweep runs a marker pass first and keeps the record of a deleted
// object whose marker is still not written (its file goes on schedule),
// so an archive outage longer than DeletedRetention delays the marker,
// never drops it. Both archive sweeps (archivesweep.go, holdMarks) run
// a pass first, under markMu, and keep the archive of a database whose
// marker is still owed: deleting it first would let a pass that had
// already read its work put the marker back alone afterwards (seen as a
// stray marker left after the sweep in TestDeletedArchivesMassBrake once
// the two branches met).
//
// An init with RestoreFrom (lost-host recovery, a fork) lists the
// database's markers before it writes anything and, if there is one,
// refuses with ErrDeletedInArchive (410): the recovery reports the
// database (RecoverReport.DeletedOnHost) and leaves it to the operator;
// nothing is deleted automatically.
//
// What the archive cannot know: a delete by a host of a build older than
// this one (no marker), and a delete whose marker was not written before
// the host was lost (the host died or lost its archive between step 1 and
// step 2: normally milliseconds, the archive store's outage otherwise).
// Such a database is revived by recovery as before.

// ErrDeletedInArchive: an init asked to restore a database whose archive
// holds a delete marker.
var ErrDeletedInArchive = errors.New("database was deleted on its host")

// deleteMarkRetry is how often the marker pass runs besides after each
// delete: the retry of markers an archive outage held back.
const deleteMarkRetry = 30 * time.Second

// notifyDeleteMarks asks for a marker pass (non-blocking; without history
// there is none).
func (h *Host) notifyDeleteMarks() {
	if h.hist == nil || h.hist.markCh == nil {
		return
	}
	select {
	case h.hist.markCh <- struct{}{}:
	default: // a pass is already due
	}
}

// markLoop runs marker passes until ctx ends: one at start (records a
// previous run left unmarked), one after each notification, one every
// deleteMarkRetry.
func (hh *hostHistory) markLoop(ctx context.Context, h *Host) {
	t := time.NewTicker(deleteMarkRetry)
	defer t.Stop()
	for {
		if _, err := hh.markDeletes(ctx, h); err != nil && ctx.Err() == nil {
			h.log.Warn("history: writing delete markers to the archive failed; retried", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-hh.markCh:
		case <-t.C:
		}
	}
}

// markPending reports whether m is a deleted record whose archive marker
// is still owed.
func (h *Host) markPending(m *Meta) bool {
	return h.hist != nil && m.deleted() && m.CatalogDeleted && !m.ArchiveMarked
}

// markDeletes is one marker pass (steps 2 and 3 above); it answers how
// many markers it wrote. It stops at the first failed Put (the store is
// likely down: the next pass retries).
func (hh *hostHistory) markDeletes(ctx context.Context, h *Host) (int, error) {
	hh.markMu.Lock()
	defer hh.markMu.Unlock()
	return hh.markDeletesLocked(ctx, h)
}

// markDeletesLocked is markDeletes with hh.markMu held.
func (hh *hostHistory) markDeletesLocked(ctx context.Context, h *Host) (int, error) {
	todo := h.markPendingObjects()
	if len(todo) == 0 {
		return 0, nil
	}
	sortObjects(todo)
	var done []*object
	var putErr error
	for _, o := range todo {
		m := o.meta.Load()
		// THE CHECKPOINT (step 2).
		if putErr = hh.archive.MarkDeleted(ctx, m.DatabaseUUID, m.ObjectID, m.DeletedAt); putErr != nil {
			putErr = fmt.Errorf("delete marker of %s (object %s): %w", m.DatabaseUUID, m.ObjectID, putErr)
			break
		}
		done = append(done, o)
	}
	if len(done) == 0 {
		return 0, putErr
	}
	// Step 3: the memo, in one index commit.
	for _, o := range done {
		o.mu.Lock()
	}
	defer func() {
		for _, o := range done {
			o.mu.Unlock()
		}
	}()
	var metas []*Meta
	var objs []*object
	for _, o := range done {
		m := o.meta.Load()
		if o.gone || m == nil || !h.markPending(m) {
			continue
		}
		n := *m
		n.ArchiveMarked = true
		metas, objs = append(metas, &n), append(objs, o)
	}
	if len(metas) == 0 {
		return len(done), putErr
	}
	if err := h.ix.put(metas...); err != nil {
		return len(done), errors.Join(putErr, fmt.Errorf("record the delete markers written: %w", err))
	}
	h.mu.Lock()
	for i, o := range objs {
		h.setMeta(o, metas[i])
	}
	h.mu.Unlock()
	return len(done), putErr
}

// checkNotDeletedInArchive refuses (ErrDeletedInArchive) to restore
// database db from the archive when the archive holds a delete marker of
// it. An archive that cannot be read is an error too (the init fails, the
// caller retries): revival is never decided on a failed read.
func (h *Host) checkNotDeletedInArchive(ctx context.Context, db string) error {
	if h.hist == nil {
		return nil // checkRestoreSource refused already
	}
	marks, err := h.hist.archive.DeleteMarks(ctx, db)
	if err != nil {
		return fmt.Errorf("read the archive's delete markers of %s: %w", db, err)
	}
	if len(marks) == 0 {
		return nil
	}
	sort.Slice(marks, func(i, j int) bool { return marks[i].DeletedAt.After(marks[j].DeletedAt) })
	last := marks[0]
	return fmt.Errorf("%w: database %s was deleted on its host (object %s, at %s) and the archive holds its delete marker; a catalog restored from an older backup may list it again, but it is not restored from the archive (shoal cluster resurrected)",
		ErrDeletedInArchive, db, last.ObjectID, last.DeletedAt.UTC().Format(time.RFC3339))
}

// markPendingObjects answers the deleted records whose archive marker is
// still owed.
func (h *Host) markPendingObjects() []*object {
	h.mu.RLock()
	defer h.mu.RUnlock()
	var out []*object
	for id := range h.deleted {
		if o := h.objects[id]; o != nil {
			if m := o.meta.Load(); m != nil && h.markPending(m) {
				out = append(out, o)
			}
		}
	}
	return out
}

// markPendingUUIDs answers the databases of markPendingObjects (hh.markMu
// held: no pass runs meanwhile).
func (hh *hostHistory) markPendingUUIDs(h *Host) map[string]bool {
	out := map[string]bool{}
	for _, o := range h.markPendingObjects() {
		out[o.meta.Load().DatabaseUUID] = true
	}
	return out
}
