package objecthost

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/shoaldb/shoal/objecthost/history"
)

// An init with RestoreFrom (a fork, or a database relocated off a lost
// host) creates an object whose content is an archived state instead of an
// empty file. Steps, each safe to crash after:
//
//  1. the index commit of the object's record with Restoring set — *the
//     init's checkpoint*, as for a plain init: from here the object exists
//     and heartbeats, and until its catalog row names it, it is an orphan
//     candidate like any unconfirmed object. While Restoring is set the
//     object cannot be opened (queries answer 503), so it is never served
//     empty;
//  2. history.RestoreInto: the archived state at the bookmark (or the
//     source's last archived commit) becomes the object's file, and the
//     first generation of its own history, whose base snapshot is that
//     state (its own checkpoint is the staging tip, see
//     objecthost/history/DESIGN.md);
//  3. the index commit of the record without Restoring, its creation time
//     moved to now (the creation grace counts from the end of the restore,
//     so a long restore is not mistaken for a failed create);
//  4. the database is opened once so the shipper archives the new base
//     promptly (best effort; the next open does it otherwise).
//
// A crash before 3 leaves Restoring set: the edge's retry of the same init
// resumes at 2 (a second new generation; the first is never shipped past
// its base), and if no retry comes the object is an orphan like any other
// and dies after the creation grace.

// checkRestoreSource validates an init's RestoreFrom before anything is
// written.
func (h *Host) checkRestoreSource(src RestoreSource) error {
	if h.hist == nil {
		return fmt.Errorf("%w: restoring from the archive needs an object host with history (an archive: objecthost serve --archive-dir, or cluster.hcl's archive block)", ErrInvalid)
	}
	if !validUUID(src.DatabaseUUID) {
		return fmt.Errorf("%w: restore_from.database_uuid must be a canonical lowercase UUID", ErrInvalid)
	}
	if src.Bookmark != "" {
		if _, err := history.ParseBookmark(src.DatabaseUUID, history.Bookmark(src.Bookmark)); err != nil {
			return fmt.Errorf("%w: restore_from.bookmark is not a bookmark of database %s", ErrInvalid, src.DatabaseUUID)
		}
	}
	return nil
}

// restoreRunning reports whether an init restore of objectID runs in this
// process (its object is not an orphan suspect meanwhile).
func (h *Host) restoreRunning(objectID string) bool {
	if h.hist == nil {
		return false
	}
	h.hist.mu.Lock()
	defer h.hist.mu.Unlock()
	return h.hist.restoring[objectID]
}

// finishRestoreInit runs steps 2–4 for an object whose record has
// Restoring set, and answers the init.
func (h *Host) finishRestoreInit(ctx context.Context, objectID string, start time.Time) (ObjectInfo, error) {
	hh := h.hist
	hh.mu.Lock()
	if hh.restoring[objectID] {
		hh.mu.Unlock()
		return ObjectInfo{}, ErrRestoring // another init of it is restoring: retry
	}
	hh.restoring[objectID] = true
	hh.mu.Unlock()
	released := false
	release := func() {
		if !released {
			released = true
			hh.mu.Lock()
			delete(hh.restoring, objectID)
			hh.mu.Unlock()
		}
	}
	defer release()
	o, m, err := h.lookup(objectID)
	if err != nil {
		return ObjectInfo{}, err
	}
	if m.Restoring == nil { // finished by a concurrent init
		return h.info(o, m), nil
	}
	src := *m.Restoring

	// Step 2.
	restored, empty, err := h.restoreInto(ctx, objectID, m.DatabaseUUID, src)
	if err != nil {
		h.m.lifecycle.WithLabelValues("init_restore_failed").Inc()
		return ObjectInfo{}, err
	}

	// Step 3.
	o.mu.Lock()
	m = o.meta.Load()
	if o.gone || m == nil || m.deleted() {
		o.mu.Unlock()
		return ObjectInfo{}, ErrNotFound
	}
	n := *m
	n.Restoring = nil
	n.CreatedAt = h.now().UTC()
	if err := h.ix.put(&n); err != nil {
		o.mu.Unlock()
		return ObjectInfo{}, err
	}
	h.setMeta(o, &n)
	o.mu.Unlock()
	h.log.Info("database restored into a new object", "database", n.DatabaseUUID, "object", objectID,
		"from", src.DatabaseUUID, "at", restored, "empty", empty)

	// Step 4 (the slot released first: it keeps the database closed).
	release()
	if !empty {
		if hd, err := h.handles.acquire(objectID); err == nil {
			h.handles.release(hd)
		} else {
			h.log.Warn("opening a restored database failed; its history ships at the next open", "object", objectID, "err", err)
		}
	}
	h.m.lifecycle.WithLabelValues("init").Inc()
	h.m.initLatency.Observe(time.Since(start).Seconds())
	info, err := h.Info(ctx, objectID)
	if err != nil {
		return h.info(o, &n), nil
	}
	return info, nil
}

// restoreInto builds the object's file from src (step 2). It answers the
// bookmark restored and whether the object was left empty (EmptyIfNone and
// no archived history).
func (h *Host) restoreInto(ctx context.Context, objectID, dstKey string, src RestoreSource) (string, bool, error) {
	hh := h.hist
	var (
		p   history.Position
		err error
	)
	if src.Bookmark != "" {
		p, err = history.ParseBookmark(src.DatabaseUUID, history.Bookmark(src.Bookmark))
		if err != nil {
			return "", false, fmt.Errorf("%w: %v", ErrInvalid, err)
		}
		if err := hh.waitArchived(ctx, src.DatabaseUUID, p); err != nil {
			return "", false, err
		}
	} else {
		p, err = hh.archive.Latest(ctx, src.DatabaseUUID)
		if errors.Is(err, history.ErrNoHistory) {
			if src.EmptyIfNone {
				return "", true, nil
			}
			return "", false, fmt.Errorf("%w: database %s has no archived history to restore from", ErrInvalid, src.DatabaseUUID)
		}
		if err != nil {
			return "", false, fmt.Errorf("read the archive: %w", err)
		}
	}
	path := h.path(objectID)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return "", false, fmt.Errorf("create shard dir: %w", err)
	}
	hh.forgetReopen(objectID) // a new object has none; never start from a state the restore replaces
	if _, err := history.RestoreInto(ctx, hh.archive, src.DatabaseUUID, p, dstKey, path,
		history.CaptureOptions{StagingDir: hh.cfg.StagingDir, StagingName: objectID, Now: h.now}); err != nil {
		if errors.Is(err, history.ErrNoHistory) {
			return "", false, fmt.Errorf("%w: database %s has no archived state at bookmark %s (not archived yet, or past retention)",
				ErrInvalid, src.DatabaseUUID, history.MakeBookmark(src.DatabaseUUID, p))
		}
		if errors.Is(err, history.ErrDamaged) {
			// The source's archive lost what this state needs: a 400
			// naming it (not retried elsewhere: every host reads the same
			// archive). The object keeps Restoring and dies as an orphan.
			op, outcome := "fork", "no database was created"
			if src.Bookmark == "" {
				op, outcome = "recover", "the database was not relocated"
			}
			target := p
			if src.Bookmark == "" {
				target = history.Position{}
			}
			// The source is not live here (a fork's is on its own host):
			// counted and logged; its own host's scrub raises the alarm.
			return "", false, hh.restoreDamaged(h, op, src.DatabaseUUID, "", target, outcome, err)
		}
		return "", false, fmt.Errorf("restore from the archive: %w", err)
	}
	if o, m, err := h.lookup(objectID); err == nil {
		h.noteStoredSize(o, m)
	}
	return string(history.MakeBookmark(src.DatabaseUUID, p)), false, nil
}
