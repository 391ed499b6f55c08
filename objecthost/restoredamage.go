package objecthost

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	v4 "github.com/shoaldb/shoal/internal/v4"
	"github.com/shoaldb/shoal/objecthost/history"
)

// A restore to a point whose archived history the object store lost or
// damaged (a time-travel restore, an export at a bookmark, a fork, a lost
// host's recovery, a timestamp's bookmark) is refused with a D1-style 400
// 7400 naming what no longer restores and, when there is one, the newest
// earlier point that does — like the other refusals of a point that has no
// restorable state (history.ErrNoHistory), and unlike a store that fails
// (503, retry): retrying cannot bring the lost records back. Nothing is
// changed: the error comes from building the state into a temporary file,
// before the checkpoint of any of these flows. It is counted
// (shoal_history_restore_damaged_total{op}) and, for a database live on
// this host, its archive is checked at once in the background (scrubOne:
// confirms the damage, raises archive_damaged with the lost ranges, heals
// the current point by a fresh snapshot if it no longer restores).

// damageCheck asks for one database's archive check (scrubOne) now.
type damageCheck struct {
	objectID, uuid string
	found          []string // objects the restore found damaged (read again whatever the sample)
}

// maxDamageChecks bounds the checks waiting; more are dropped (the paced
// scrub finds the damage anyway).
const maxDamageChecks = 64

// restoreDamaged turns err, if the archive's damage caused it, into the
// client's answer (errHistory), counts it and queues a check of the
// database's archive when objectID is live on this host (""
// otherwise). target is the point asked for (zero for "the newest");
// outcome says what was not done ("nothing was changed", …). Any other
// error is returned as is.
func (hh *hostHistory) restoreDamaged(h *Host, op, key, objectID string, target history.Position, outcome string, err error) error {
	var de *history.DamageError
	if !errors.As(err, &de) {
		return err
	}
	hh.sm.restoreDamaged.WithLabelValues(op).Inc()
	h.log.Error("history: a restore needs archived history the store lost or damaged", "op", op, "db", key, "object", objectID,
		"target", history.MakeBookmark(key, target), "err", err)
	if objectID != "" {
		var found []string
		if de.Key != "" {
			found = []string{de.Key}
		}
		select {
		case hh.checks <- damageCheck{objectID: objectID, uuid: key, found: found}:
		default:
		}
	}
	return &errHistory{status: http.StatusBadRequest, code: v4.CodeInvalidRequest, msg: damageMessage(key, target, de, outcome), cause: err}
}

// damageMessage names the point, what of its history is lost, and the
// newest earlier point that restores.
func damageMessage(key string, target history.Position, de *history.DamageError, outcome string) string {
	what := "the database's newest archived point"
	if target.Gen != "" {
		what = "bookmark " + string(history.MakeBookmark(key, target))
	}
	var lost string
	switch de.What {
	case "snapshot":
		lost = fmt.Sprintf("no snapshot of generation %s at or before record %d is whole", de.Gen, de.LastTxid)
	default:
		lost = fmt.Sprintf("records %d..%d of generation %s are lost or fail their checksum", de.FirstTxid, de.LastTxid, de.Gen)
	}
	msg := fmt.Sprintf("%s can no longer be restored: the archive of its history is damaged (%s); %s", what, lost, outcome)
	if de.After.Gen != "" {
		msg += fmt.Sprintf("; the newest earlier point that restores is bookmark %s (%s)",
			history.MakeBookmark(key, de.After), de.After.Time().UTC().Format(time.RFC3339Nano))
	}
	return msg
}

// lostTail reports the records of the current generation that the host
// shipped (through shipped, after a Sync) but the archive no longer chains
// to: the store lost the newest segment(s). A restore to a point among
// them would otherwise read as "not archived yet" (ErrNoHistory).
func (hh *hostHistory) lostTail(ctx context.Context, key string, shipped history.Position) *history.DamageError {
	if shipped.Gen == "" {
		return nil
	}
	latest, err := hh.archive.Latest(ctx, key)
	if err != nil && !errors.Is(err, history.ErrNoHistory) {
		return nil // the store failing: the restore reports it
	}
	switch {
	case err == nil && latest.Gen == shipped.Gen && latest.Txid < shipped.Txid:
		return &history.DamageError{Gen: shipped.Gen, FirstTxid: latest.Txid + 1, LastTxid: shipped.Txid, What: "records", After: latest,
			Err: fmt.Errorf("%w: records %d..%d (shipped) are not in the archive", history.ErrNotFound, latest.Txid+1, shipped.Txid)}
	case err != nil || latest.Gen < shipped.Gen:
		// The whole shipped generation is gone (or holds no snapshot).
		return &history.DamageError{Gen: shipped.Gen, FirstTxid: 0, LastTxid: shipped.Txid, What: "records",
			Err: fmt.Errorf("%w: generation %s (shipped through record %d) is not in the archive", history.ErrNotFound, shipped.Gen, shipped.Txid)}
	}
	return nil
}

func (hh *hostHistory) restoreRunning(objectID string) bool {
	hh.mu.Lock()
	defer hh.mu.Unlock()
	return hh.restoring[objectID]
}

// runDamageChecks runs the queued archive checks until ctx ends.
func (hh *hostHistory) runDamageChecks(ctx context.Context, h *Host) {
	for {
		select {
		case <-ctx.Done():
			return
		case c := <-hh.checks:
			// Queued by a restore that still holds the database (its
			// slot is released as the call returns); a heal needs it
			// open, so wait for the slot.
			for hh.restoreRunning(c.objectID) {
				select {
				case <-ctx.Done():
					return
				case <-time.After(50 * time.Millisecond): // poll: the slot has no wake-up of its own
				}
			}
			hh.scrubOne(ctx, h, c.objectID, c.uuid, hh.cfg.ScrubSample, c.found...)
		}
	}
}
