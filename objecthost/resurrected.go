package objecthost

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// Resurrected databases. A catalog restored from an older backup (`shoal
// cluster restore`) brings back, active, every database deleted after the
// backup: listed, found by GET, counted against the account's database
// limit — while the host keeps their objects deleted (it never revives an
// object on the catalog's word), so every query answers 404. A deleted
// object no longer heartbeats, so nothing else would ever tell anyone.
//
// The host still holds each deleted object's record (its tombstone) until
// the sweep removes it, DeletedRetention (24 h) after the delete. So:
//
//  1. when a heartbeat or digest answer shows the catalog's restore count
//     grow (noteCatalogRestores), or the first answer since the start shows
//     a catalog that was ever restored (the restore may have happened while
//     this host was down), a check of every tombstone is due;
//  2. the check asks the catalog about the tombstones' databases on a
//     linearizable read (ConfirmHeartbeat, in HeartbeatBatch chunks), as
//     the destructive paths do: a follower behind the restore must not
//     raise, nor one ahead of a second delete keep, the alarm;
//  3. a database the catalog answers active (any state but deleted) with
//     this very object (or naming no object: a catalog older than the
//     field) is resurrected. Every host-side delete follows the catalog's
//     own verdict — its delete, "unknown" (an orphan, fenced) or another
//     object (superseded, a relocation's leftover) — so the catalog naming
//     a tombstone's own object active again is a rewind of the catalog (or
//     a bug), never a normal state. Not counted: active with another
//     object (the host holding that one judges it), and a tombstone of an
//     object superseded by a relocation (Meta.Superseded) even when a
//     restore names it again — its database lives on elsewhere (that
//     host raises older_object), and deleting it again would destroy it;
//  4. the resurrected ones raise the "resurrected_databases" alarm (count,
//     sample, the span of their deletes), the gauge
//     shoal_objecthost_resurrected_databases, an error log line per
//     database when first found, and are listed in full by GET
//     /v1/resurrected (`shoal cluster resurrected`). Nothing is revived and
//     nothing is deleted in the catalog: the way out is the operator's
//     (deleting them again, docs/operations.md);
//  5. while any is held, the held ones are asked again every
//     HeartbeatInterval (linearizable, only those); the ones the catalog
//     answers deleted or unknown (the operator deleted them again) leave
//     the set, and the alarm clears when none is left. The sweep removes
//     a held tombstone's files on schedule (publishing its size 0, as for
//     any swept object: the catalog counted the backup's size against the
//     account) but keeps its index record, so the alarm cannot vanish by
//     itself while the zombie is still listed.
//
// A failed call changes nothing: the check (or re-check) is retried after
// HeartbeatRetry. The checkpoint is nothing durable: the set lives in
// memory, and a restart re-finds it at the first answer (step 1, the
// catalog having been restored at least once). What this cannot see:
// databases whose tombstone was swept before the restore (deleted more
// than DeletedRetention before it), and a host with no live object (it
// sends no heartbeat, so it never learns of the restore).

// ResurrectedDatabase is one database the catalog lists active again
// although this host deleted its object (GET /v1/resurrected).
type ResurrectedDatabase struct {
	DatabaseUUID string    `json:"database_uuid"`
	AccountID    string    `json:"account_id"`
	ObjectID     string    `json:"object_id"`
	Name         string    `json:"name,omitempty"`
	DeletedAt    time.Time `json:"deleted_at"` // when this host deleted the object
	FoundAt      time.Time `json:"found_at"`   // when a check first found it active again
}

// resurrection is the host's state of the check (guarded by mu).
type resurrection struct {
	mu sync.Mutex
	// due: a check of every tombstone is owed (a restore was seen).
	due bool
	// notBefore: no call before this (after a failure: HeartbeatRetry).
	notBefore time.Time
	// nextRecheck: when the held set is asked again.
	nextRecheck time.Time
	// held: object ID → the resurrected database.
	held map[string]ResurrectedDatabase
}

// noteRestoreSeen makes a check of every tombstone due (see above).
func (h *Host) noteRestoreSeen() {
	h.resurrect.mu.Lock()
	h.resurrect.due = true
	h.resurrect.notBefore = time.Time{}
	h.resurrect.mu.Unlock()
}

// holdsTombstone reports whether the sweep must keep objectID's index
// record: its database is held as resurrected.
func (h *Host) holdsTombstone(objectID string) bool {
	h.resurrect.mu.Lock()
	defer h.resurrect.mu.Unlock()
	_, ok := h.resurrect.held[objectID]
	return ok
}

// Resurrected lists the databases held as resurrected, oldest delete first.
func (h *Host) Resurrected() []ResurrectedDatabase {
	h.resurrect.mu.Lock()
	out := make([]ResurrectedDatabase, 0, len(h.resurrect.held))
	for _, r := range h.resurrect.held {
		out = append(out, r)
	}
	h.resurrect.mu.Unlock()
	sortResurrected(out)
	return out
}

func sortResurrected(rs []ResurrectedDatabase) {
	sort.Slice(rs, func(i, j int) bool {
		if !rs[i].DeletedAt.Equal(rs[j].DeletedAt) {
			return rs[i].DeletedAt.Before(rs[j].DeletedAt)
		}
		return rs[i].DatabaseUUID < rs[j].DatabaseUUID
	})
}

// ResurrectionReport is what one checkResurrected pass did.
type ResurrectionReport struct {
	Checked int // tombstones asked about (full check or re-check)
	Found   int // newly found resurrected
	Cleared int // held ones the catalog no longer names active
	Held    int // held after the pass
	Failed  bool
}

// checkResurrected runs the due check, or the re-check of the held set
// when its time has come; RunHeartbeats calls it at the end of each pass.
func (h *Host) checkResurrected(ctx context.Context, now time.Time) ResurrectionReport {
	var rep ResurrectionReport
	r := &h.resurrect
	r.mu.Lock()
	if now.Before(r.notBefore) || (!r.due && (len(r.held) == 0 || now.Before(r.nextRecheck))) {
		rep.Held = len(r.held)
		r.mu.Unlock()
		return rep
	}
	full := r.due
	r.due = false
	heldIDs := make(map[string]bool, len(r.held))
	for id := range r.held {
		heldIDs[id] = true
	}
	r.mu.Unlock()

	// The tombstones to ask about: every deleted object (full check) or
	// the held ones (re-check).
	var objs []*object
	h.mu.RLock()
	for id := range h.deleted {
		if full || heldIDs[id] {
			if o := h.objects[id]; o != nil && o.meta.Load() != nil {
				objs = append(objs, o)
			}
		}
	}
	h.mu.RUnlock()
	sortObjects(objs)

	found := map[string]ResurrectedDatabase{} // object ID → resurrected
	asked := map[string]bool{}                // object IDs answered
	for start := 0; start < len(objs); start += h.cfg.HeartbeatBatch {
		if ctx.Err() != nil {
			rep.Failed = true
			break
		}
		chunk := objs[start:min(len(objs), start+h.cfg.HeartbeatBatch)]
		uuids := make([]string, 0, len(chunk))
		byUUID := make(map[string][]*object, len(chunk))
		for _, o := range chunk {
			u := o.meta.Load().DatabaseUUID
			if byUUID[u] == nil {
				uuids = append(uuids, u)
			}
			byUUID[u] = append(byUUID[u], o)
		}
		cctx, cancel := context.WithTimeout(ctx, h.cfg.CatalogTimeout)
		ans, err := h.cfg.Catalog.ConfirmHeartbeat(cctx, uuids)
		cancel()
		if err != nil {
			h.m.catalogCalls.WithLabelValues("confirm_resurrected", "error").Inc()
			h.log.Warn("asking the catalog about deleted databases after a catalog restore failed; retrying", "databases", len(uuids), "err", err)
			rep.Failed = true
			break
		}
		h.m.catalogCalls.WithLabelValues("confirm_resurrected", "ok").Inc()
		rep.Checked += len(uuids)
		for _, st := range ans.Databases {
			for _, o := range byUUID[st.UUID] {
				m := o.meta.Load()
				asked[m.ObjectID] = true
				if !st.Known || st.State == fsm.StateDeleted || (st.ObjectID != "" && st.ObjectID != m.ObjectID) || !m.deleted() || m.Superseded {
					continue
				}
				found[m.ObjectID] = ResurrectedDatabase{DatabaseUUID: m.DatabaseUUID, AccountID: m.AccountID, ObjectID: m.ObjectID,
					Name: m.Name, DeletedAt: m.DeletedAt, FoundAt: now}
			}
		}
	}

	r.mu.Lock()
	defer r.mu.Unlock()
	if rep.Failed {
		r.notBefore = now.Add(h.cfg.HeartbeatRetry)
		if full {
			r.due = true // the whole check again; what it found so far is added below
		}
	}
	if r.held == nil {
		r.held = map[string]ResurrectedDatabase{}
	}
	var newly []ResurrectedDatabase
	for id, d := range found {
		if old, ok := r.held[id]; ok {
			d.FoundAt = old.FoundAt
		} else {
			newly = append(newly, d)
		}
		r.held[id] = d
	}
	for id, d := range r.held {
		if _, still := found[id]; still || !asked[id] {
			continue // still resurrected, or not answered (no news)
		}
		delete(r.held, id)
		rep.Cleared++
		h.log.Info("database no longer active in the catalog; resurrected alarm cleared for it",
			"database", d.DatabaseUUID, "account", d.AccountID, "object", d.ObjectID)
	}
	// A held tombstone swept meanwhile (the sweep ran before it was held)
	// is no longer this host's to report.
	for id := range r.held {
		if _, m, err := h.lookup(id); err != nil || !m.deleted() {
			delete(r.held, id)
		}
	}
	r.nextRecheck = now.Add(h.cfg.HeartbeatInterval)
	rep.Found, rep.Held = len(newly), len(r.held)
	sortResurrected(newly)
	for _, d := range newly {
		h.log.Error("database deleted on this host is active again in the catalog (restored from an older backup?); its object stays deleted and every query answers 404: delete it again",
			"database", d.DatabaseUUID, "account", d.AccountID, "object", d.ObjectID, "deleted_at", d.DeletedAt.UTC().Format(time.RFC3339))
	}
	h.m.resurrected.Set(float64(len(r.held)))
	if len(r.held) == 0 {
		h.alarms.clear(alarmResurrected)
		return rep
	}
	all := make([]ResurrectedDatabase, 0, len(r.held))
	for _, d := range r.held {
		all = append(all, d)
	}
	sortResurrected(all)
	sample := make([]string, 0, min(5, len(all)))
	for _, d := range all[:min(5, len(all))] {
		sample = append(sample, d.DatabaseUUID)
	}
	msg := fmt.Sprintf("%d databases deleted on this host (deletes from %s to %s) are active again in the catalog (linearizable read): "+
		"the catalog was restored from an older backup; they are listed but every query answers 404 (their objects stay deleted). "+
		"delete them again: shoal cluster resurrected --delete",
		len(all), all[0].DeletedAt.UTC().Format(time.RFC3339), all[len(all)-1].DeletedAt.UTC().Format(time.RFC3339))
	// Held as long as the set is: the re-checks raise it again or clear it.
	h.alarms.set(alarmResurrected, now, len(all), sample, 24*time.Hour, msg, int64(len(all)))
	return rep
}

// alarmResurrected is the alarm kind of resurrected databases.
const alarmResurrected = "resurrected_databases"
