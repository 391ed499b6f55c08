package objecthost

import (
	"context"
	"fmt"
	"time"

	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// Lost-host recovery (edge/relocate.go) moves a database to a new object on
// another host: the new object is initialised from the archive, then
// relocate_database makes the catalog name it at a routing generation one
// higher. A heartbeat answer naming another object than the host's for an
// active database means one of three things, told apart by generation and
// confirmation, always on a linearizable re-read:
//
//   - the catalog names a newer object (higher generation): this object was
//     superseded — its host was declared lost and the database lives
//     elsewhere. It is retired (marked deleted: no query is served from it
//     again; the file stays until DeletedRetention, for an operator who
//     wants the commits the archive had not received). Generations only
//     grow in the catalog, so this verdict cannot come from a lagging
//     replica or a catalog restored from an older backup.
//   - the object is unconfirmed and not newer than the catalog's: the
//     leftover of a relocation that never committed (or lost the
//     compare-and-set to another). Past the creation grace it is killed
//     like an orphan: the mass brake, then a fence of the object
//     (relocate_database then refuses it), then the delete.
//   - the object is confirmed and the catalog names an older one: the
//     catalog went back in time (restored from an old backup). Kept,
//     serving, with the "older_object" alarm.
//
// A host whose registration the catalog answers "lost" raises the
// "declared_lost" alarm and keeps serving the databases not relocated yet;
// each relocated one retires at its next heartbeat.

// noteHostState records the host's state as the catalog keeps it.
func (h *Host) noteHostState(state string) {
	lost := state == fsm.HostStateLost
	if lost && !h.declaredLost.Load() {
		h.log.Error("this object host was declared lost by an operator (shoal cluster host lost); its databases are being relocated from the archive, and each relocated one is retired here at its next heartbeat. If that was a mistake: shoal cluster host readmit " + h.cfg.ID)
	}
	h.declaredLost.Store(lost)
	if lost {
		h.alarms.raise("declared_lost", h.now(), nil, "this host was declared lost (shoal cluster host lost); databases relocated elsewhere are retired here as their heartbeats find them superseded")
	}
}

// resolveMismatched re-reads linearizably the databases whose heartbeat
// answer named another object, and retires, kills or holds their objects
// (see above).
func (h *Host) resolveMismatched(ctx context.Context, objs []*object, now time.Time, rep *HeartbeatReport) {
	ans, byUUID, ok := h.confirmLinearizably(ctx, objs, rep, "confirm_object",
		"confirming databases the catalog names another object for failed; nothing changed, asking again next beat")
	if !ok {
		return
	}
	var superseded, leftovers, older []*object
	var deleted []*object
	seen := make(map[*object]bool, len(objs))
	newer := map[*object]fsm.HeartbeatState{}
	for _, st := range ans.Databases {
		for _, o := range byUUID[st.UUID] {
			if seen[o] || !st.Known {
				continue // unknown: the unknown path of the next beat
			}
			seen[o] = true
			m := o.meta.Load()
			switch {
			case st.State == fsm.StateDeleted:
				deleted = append(deleted, o)
			case st.ObjectID == "" || st.ObjectID == m.ObjectID:
				// Named after all (a relocation to it committed): the next
				// heartbeat confirms it.
			case st.RoutingGeneration > m.RoutingGeneration:
				superseded = append(superseded, o)
				newer[o] = st
			case !m.Confirmed:
				if now.Sub(m.CreatedAt) >= h.cfg.CreationGrace && !h.restoreRunning(m.ObjectID) {
					leftovers = append(leftovers, o)
				}
			default:
				older = append(older, o)
			}
		}
	}
	if len(deleted) > 0 {
		if _, err := h.markDeletedAs(ctx, deleted, 0, "deleted in the catalog (heartbeat)", deletedByCatalog); err == nil {
			rep.Deleted += len(deleted)
			h.m.heartbeats.WithLabelValues("deleted").Add(float64(len(deleted)))
		}
	}
	if len(superseded) > 0 {
		// Raised before the objects retire, so that whoever sees them
		// retired (GET /v1/status) sees why too; one that fails to retire
		// is retried next beat, which raises the alarm again.
		h.alarms.raise("superseded", now, superseded, fmt.Sprintf(
			"%d databases of this host were relocated to other hosts (lost-host recovery); their objects here are retired, files kept for %s", len(superseded), h.cfg.DeletedRetention))
	}
	for _, o := range superseded {
		st := newer[o]
		m := o.meta.Load()
		if _, err := h.markDeletedAs(ctx, []*object{o}, 0, fmt.Sprintf(
			"superseded: the catalog names object %s at routing generation %d (this object: %d); the database was relocated off this host (lost-host recovery)",
			st.ObjectID, st.RoutingGeneration, m.RoutingGeneration), deletedSuperseded); err != nil {
			h.log.Error("retiring a superseded object failed; retrying next beat", "object", m.ObjectID, "err", err)
			continue
		}
		rep.Superseded++
		h.m.heartbeats.WithLabelValues("superseded").Inc()
	}
	if len(older) > 0 {
		rep.OlderHeld += len(older)
		h.m.heartbeats.WithLabelValues("older_held").Add(float64(len(older)))
		h.alarms.raise("older_object", now, older, fmt.Sprintf(
			"%d databases confirmed active here are named by the catalog with another object at an older routing generation: kept, not deleted; the catalog may have been restored from an old backup", len(older)))
		for _, o := range older {
			m := o.meta.Load()
			h.log.Error("the catalog names an older object for a database confirmed here; keeping it", "database", m.DatabaseUUID, "object", m.ObjectID)
		}
	}
	if len(leftovers) > 0 {
		h.killLeftovers(ctx, leftovers, rep)
	}
}

// killLeftovers deletes the unconfirmed objects of relocations that never
// committed, under the orphans' rules: mass brake, then the fence (the
// checkpoint), then the delete.
func (h *Host) killLeftovers(ctx context.Context, objs []*object, rep *HeartbeatReport) {
	limit := max(h.cfg.OrphanMassFloor, int(h.cfg.OrphanMassFraction*float64(rep.Sent)))
	if len(objs) > limit {
		h.m.heartbeats.WithLabelValues("orphan_held").Add(float64(len(objs)))
		rep.OrphansHeld += len(objs)
		h.alarms.raise("mass_orphans", h.now(), objs, fmt.Sprintf(
			"%d unconfirmed objects in one heartbeat pass belong to databases the catalog names another object for (limit %d); none deleted", len(objs), limit))
		return
	}
	rc, ok := h.cfg.Catalog.(RelocationCatalog)
	if !ok {
		h.alarms.raise("mass_orphans", h.now(), objs, "leftover objects of relocations cannot be fenced by this catalog; none deleted")
		return
	}
	refs := make([]fsm.ObjectRef, 0, len(objs))
	for _, o := range objs {
		m := o.meta.Load()
		refs = append(refs, fsm.ObjectRef{UUID: m.DatabaseUUID, ObjectID: m.ObjectID})
	}
	fctx, cancel := context.WithTimeout(ctx, h.cfg.CatalogTimeout)
	ans, err := rc.FenceObjects(fctx, h.cfg.ID, refs)
	cancel()
	if err != nil {
		h.m.catalogCalls.WithLabelValues("fence_objects", "error").Inc()
		h.log.Warn("fencing relocation leftovers failed; none deleted, asking again next beat", "objects", len(objs), "err", err)
		return
	}
	h.m.catalogCalls.WithLabelValues("fence_objects", "ok").Inc()
	fenced := make(map[string]bool, len(ans.FencedObjects))
	for _, id := range ans.FencedObjects {
		fenced[id] = true
	}
	var kill []*object
	for _, o := range objs {
		if fenced[o.meta.Load().ObjectID] {
			kill = append(kill, o)
		}
	}
	if len(kill) == 0 {
		return
	}
	if _, err := h.markDeleted(ctx, kill, 0, "leftover of a relocation that never committed: the catalog names another object (linearizable read), never confirmed, fenced"); err != nil {
		h.log.Error("killing relocation leftovers failed; retrying next beat", "err", err)
		return
	}
	rep.LeftoversKilled += len(kill)
	h.m.heartbeats.WithLabelValues("leftover_killed").Add(float64(len(kill)))
}
