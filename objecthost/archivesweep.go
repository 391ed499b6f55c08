package objecthost

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/shoaldb/shoal/objecthost/history"
	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// Archives of deleted databases. The retention sweeper (hostHistory.sweep)
// trims the archive of every live database; once a database is deleted its
// archive must go too, but only after its time-travel retention (7 days
// free, 30 paid, as D1) has passed since the deletion, and never while the
// database lives: a database relocated off a lost host keeps its UUID, so
// the superseded object left on the old host (retired, marked deleted
// here) shares the archive key with the live object elsewhere.
//
// What remembers the duty is the staging area (<staging>/<uuid>/<object>/,
// history.StagingAreas): it outlives the object (Sweep removes deleted
// objects after DeletedRetention, a day, much sooner than the retention),
// and every host that ever held an object of the database has one. Each
// pass (every SweepInterval, after the retention sweep):
//
//  1. areas of objects not live here (deleted, retired, swept) whose
//     records are all shipped (history.StagingPending: shipping first, or
//     a late Put would recreate part of an archive just deleted);
//  2. their databases' state from the catalog on a linearizable read
//     (ConfirmHeartbeat), never a follower's possibly stale answer;
//  3. per database: unknown to the catalog: kept (a catalog restored from
//     an older backup must not cost an archive); live (any state but
//     deleted): the archive is never touched, only the areas here, which
//     hold nothing unshipped, are removed; deleted less than its
//     retention ago (catalog deleted_at + the account tier's retention):
//     kept; deleted longer ago: due;
//  4. the brake: more due databases than max(DeletedArchiveMassFloor,
//     DeletedArchiveMassFraction × the databases this host knows) deletes
//     none and raises the "mass_archive_deletes" alarm (a wrong catalog
//     answer or a bug must not empty the archive in one pass; the alarm
//     clears once a pass is under the limit, e.g. after an operator raised
//     it);
//  5. each due database: history.Archive.DeleteAll (the checkpoint: every
//     object under <uuid>/ gone), then its staging areas here. A crash in
//     between leaves the area, and the next pass deletes what is left.
//
// A host lost with its data dir loses its areas: archives of databases
// deleted while their only object was on it are not swept by this (see
// objecthost/history/DESIGN.md, "Archives of deleted databases").

// DeletedArchiveReport is one pass of sweepDeletedArchives.
type DeletedArchiveReport struct {
	Areas    int // staging areas examined (objects not live here)
	Pending  int // areas skipped: records not shipped yet
	Asked    int // databases asked about
	Unknown  int // unknown to the catalog: kept
	Live     int // live databases: areas removed, archive kept
	NotDue   int // deleted, retention not over: kept
	Due      int // deleted, retention over
	Held     int // due, but held by the mass brake
	Deleted  int // archives deleted
	Objects  int // archive objects deleted
	Failures int // archives whose deletion failed (retried next pass)
}

// sweepDeletedArchives is one pass (see above).
func (hh *hostHistory) sweepDeletedArchives(ctx context.Context, h *Host) (DeletedArchiveReport, error) {
	var rep DeletedArchiveReport
	if h.cfg.Catalog == nil {
		return rep, nil
	}
	root := hh.cfg.StagingDir
	// Areas first, objects after: an area listed existed before the
	// objects are looked at, and its object (created before its first
	// staging write, or with Restoring set before a restore into it) is
	// then seen live.
	areas, err := history.StagingAreas(root)
	if err != nil {
		return rep, err
	}
	live, liveUUID, known := hh.liveObjects(h)
	byUUID := map[string][]history.StagingArea{}
	var uuids []string
	for _, a := range areas {
		if a.Name != "" && live[a.Name] || a.Name == "" && liveUUID[a.Key] {
			continue // a live object's area (the former layout: shared with it)
		}
		rep.Areas++
		if pending, err := history.StagingPending(root, a); err != nil || pending {
			rep.Pending++
			continue
		}
		if byUUID[a.Key] == nil {
			uuids = append(uuids, a.Key)
		}
		byUUID[a.Key] = append(byUUID[a.Key], a)
	}
	sort.Strings(uuids)
	now := h.now()
	v, err := hh.judgeDeletedArchives(ctx, h, uuids, "confirm_deleted_archives", func(u string) { hh.removeAreas(h, byUUID[u]) })
	rep.Asked, rep.Unknown, rep.Live, rep.NotDue, rep.Due = v.asked, v.unknown, v.live, v.notDue, len(v.due)
	if err != nil {
		return rep, fmt.Errorf("confirming deleted databases' archives: %w", err)
	}
	limit := max(hh.cfg.DeletedArchiveMassFloor, int(hh.cfg.DeletedArchiveMassFraction*float64(known+rep.Areas)))
	if hh.massHeld(h, "mass_archive_deletes", v.due, limit, now, 2*hh.cfg.SweepInterval,
		fmt.Sprintf("%d databases known here", known+rep.Areas)) {
		rep.Held = len(v.due)
		return rep, nil
	}
	unlock, due := hh.holdMarks(ctx, h, v.due)
	defer unlock()
	rep.Deleted, rep.Objects, rep.Failures, err = hh.deleteArchives(ctx, h, due, func(u string) { hh.removeAreas(h, byUUID[u]) })
	return rep, err
}

// holdMarks is what an archive sweep does before it deletes the archives
// of due: it takes markMu (no marker pass runs until unlock), writes the
// markers still owed, and answers due without the databases whose marker
// is still owed here — they keep their archive until it is written
// (deletemark.go): deleted now, a marker pass that had read its work
// before would put the marker back alone afterwards.
func (hh *hostHistory) holdMarks(ctx context.Context, h *Host, due []string) (unlock func(), kept []string) {
	hh.markMu.Lock()
	if _, err := hh.markDeletesLocked(ctx, h); err != nil && ctx.Err() == nil {
		h.log.Warn("history: writing delete markers before an archive sweep failed; their archives wait", "err", err)
	}
	pending := hh.markPendingUUIDs(h)
	kept = due[:0:0]
	for _, u := range due {
		if !pending[u] {
			kept = append(kept, u)
		}
	}
	return hh.markMu.Unlock, kept
}

// archiveVerdicts sorts databases by the catalog leader's answer.
type archiveVerdicts struct {
	asked, unknown, live, notDue int
	due                          []string // deleted longer than their retention ago
}

// judgeDeletedArchives asks the catalog on a linearizable read, in
// heartbeat batches, about uuids, and sorts them: unknown (kept), live
// (kept; onLive is called for each), deleted within the tier's retention
// (kept), due. label names the catalog calls in the metrics.
func (hh *hostHistory) judgeDeletedArchives(ctx context.Context, h *Host, uuids []string, label string, onLive func(string)) (archiveVerdicts, error) {
	var v archiveVerdicts
	now := h.now()
	for start := 0; start < len(uuids); start += fsm.MaxHeartbeatBatch {
		batch := uuids[start:min(len(uuids), start+fsm.MaxHeartbeatBatch)]
		cctx, cancel := context.WithTimeout(ctx, h.cfg.CatalogTimeout)
		ans, err := h.cfg.Catalog.ConfirmHeartbeat(cctx, batch)
		cancel()
		if err != nil {
			h.m.catalogCalls.WithLabelValues(label, "error").Inc()
			return v, err
		}
		h.m.catalogCalls.WithLabelValues(label, "ok").Inc()
		v.asked += len(batch)
		for _, st := range ans.Databases {
			switch {
			case !st.Known:
				v.unknown++
			case st.State != fsm.StateDeleted:
				v.live++
				if onLive != nil {
					onLive(st.UUID)
				}
			case st.DeletedAt == 0 || now.Sub(time.Unix(0, st.DeletedAt)) < hh.deletedRetention(ans.Accounts[st.AccountID]):
				v.notDue++
			default:
				v.due = append(v.due, st.UUID)
			}
		}
	}
	return v, nil
}

// massHeld applies a pass's brake: more due than limit raises alarm kind
// (none deleted) and reports true; otherwise it clears the alarm.
func (hh *hostHistory) massHeld(h *Host, kind string, due []string, limit int, now time.Time, ttl time.Duration, scope string) bool {
	if len(due) <= limit {
		h.alarms.clear(kind)
		return false
	}
	msg := fmt.Sprintf("%d deleted databases' archives are due for deletion in one pass (limit %d, %s); none deleted. if that is expected, raise deleted_archive_mass_floor in cluster.hcl's archive block", len(due), limit, scope)
	h.alarms.raiseFor(kind, now, len(due), due, ttl, msg)
	h.log.Error("mass of deleted databases' archives due; deleting none", "alarm", kind, "due", len(due), "limit", limit, "sample", due[:min(5, len(due))])
	return true
}

// deleteArchives deletes each due database's archive (DeleteAll: the
// checkpoint), then calls after for it; a failure is counted and retried
// at the next pass.
func (hh *hostHistory) deleteArchives(ctx context.Context, h *Host, due []string, after func(string)) (deleted, objects, failures int, err error) {
	for _, u := range due {
		if ctx.Err() != nil {
			return deleted, objects, failures, ctx.Err()
		}
		n, err := hh.archive.DeleteAll(ctx, u)
		objects += n
		if err != nil {
			failures++
			h.log.Warn("deleting a deleted database's archive failed; retried next pass", "database", u, "objects_deleted", n, "err", err)
			continue
		}
		deleted++
		h.log.Info("archive of a deleted database deleted (retention over)", "database", u, "objects", n)
		if after != nil {
			after(u)
		}
	}
	return deleted, objects, failures, nil
}

// liveObjects: the objects of this host that are not deleted, their
// databases, and how many objects the host knows.
func (hh *hostHistory) liveObjects(h *Host) (live, liveUUID map[string]bool, known int) {
	live, liveUUID = map[string]bool{}, map[string]bool{}
	h.mu.RLock()
	known = len(h.objects)
	for id, o := range h.objects {
		if m := o.meta.Load(); m != nil && !m.deleted() {
			live[id], liveUUID[m.DatabaseUUID] = true, true
		}
	}
	h.mu.RUnlock()
	hh.mu.Lock()
	for id := range hh.caps {
		live[id] = true
	}
	for id := range hh.restoring {
		live[id] = true
	}
	hh.mu.Unlock()
	return live, liveUUID, known
}

// removeAreas removes staging areas that hold nothing unshipped, checking
// again that no object of theirs came alive meanwhile.
func (hh *hostHistory) removeAreas(h *Host, areas []history.StagingArea) {
	live, liveUUID, _ := hh.liveObjects(h)
	for _, a := range areas {
		if a.Name != "" && live[a.Name] || a.Name == "" && liveUUID[a.Key] {
			continue
		}
		if pending, err := history.StagingPending(hh.cfg.StagingDir, a); err != nil || pending {
			continue
		}
		if a.Name != "" {
			hh.forgetReopen(a.Name) // the area is going: its next open (if any) recovers
		}
		if err := history.RemoveStaging(hh.cfg.StagingDir, a); err != nil {
			h.log.Warn("removing a staging area failed", "database", a.Key, "object", a.Name, "err", err)
		}
	}
}

// deletedRetention is how long a deleted database's archive is kept: the
// account tier's time-travel retention (D1: 7 days free, 30 paid), capped
// by the host's Retention; an account the catalog did not return gets the
// longest.
func (hh *hostHistory) deletedRetention(a fsm.Account) time.Duration {
	if a.Tier == fsm.TierFree {
		return min(7*24*time.Hour, hh.cfg.Retention)
	}
	return hh.cfg.Retention
}

// Archives of databases deleted while their only object was on a host that
// was later lost with its disk have no staging area left anywhere to
// remember them. The bucket-wide pass covers them: every
// BucketSweepInterval (a day), on one host — the active (or draining)
// host with the smallest ID in the catalog's host list, so a fleet does
// not list the bucket once per host (a stale list may make two hosts run
// it: each decision is still the leader's, and DeleteAll twice is
// harmless):
//
//  1. list the databases at the archive's top level (one delimited
//     listing: history.Archive.Databases);
//  2. their state from the catalog on a linearizable read, in heartbeat
//     batches, with the same rules as the per-host pass: unknown → kept,
//     live → kept, deleted less than the tier's retention ago → kept,
//     older → due;
//  3. the brake: more due than max(DeletedArchiveMassFloor,
//     DeletedArchiveMassFraction × the databases listed) deletes none and
//     raises "mass_bucket_archive_deletes";
//  4. each due database: history.Archive.DeleteAll (the checkpoint; a
//     crash midway leaves a suffix the next pass deletes).
//
// A late Put from a host still shipping a deleted database's last records
// can recreate part of an archive just deleted; the next pass deletes it
// again (the per-host pass waits for shipping, this one cannot see other
// hosts' staging).

// BucketArchiveReport is one bucket-wide pass.
type BucketArchiveReport struct {
	Coordinator bool // this host ran the pass
	Listed      int  // databases in the archive
	Unknown     int
	Live        int
	NotDue      int
	Due         int
	Held        int // due, held by the mass brake
	Deleted     int
	Objects     int
	Failures    int
}

// bucketCoordinator reports whether this host runs the bucket-wide pass.
func (hh *hostHistory) bucketCoordinator(ctx context.Context, h *Host) (bool, error) {
	hl, ok := h.cfg.Catalog.(HostLister)
	if !ok {
		return false, nil
	}
	cctx, cancel := context.WithTimeout(ctx, h.cfg.CatalogTimeout)
	defer cancel()
	hosts, err := hl.Hosts(cctx)
	if err != nil {
		return false, fmt.Errorf("listing hosts: %w", err)
	}
	first := ""
	for _, x := range hosts {
		if x.State != fsm.HostStateActive && x.State != fsm.HostStateDraining {
			continue
		}
		if first == "" || x.ID < first {
			first = x.ID
		}
	}
	return first == h.cfg.ID, nil
}

// sweepBucketArchives is one bucket-wide pass (see above).
func (hh *hostHistory) sweepBucketArchives(ctx context.Context, h *Host) (BucketArchiveReport, error) {
	var rep BucketArchiveReport
	if h.cfg.Catalog == nil {
		return rep, nil
	}
	coord, err := hh.bucketCoordinator(ctx, h)
	if err != nil || !coord {
		return rep, err
	}
	rep.Coordinator = true
	uuids, err := hh.archive.Databases(ctx)
	if errors.Is(err, history.ErrNoDatabaseListing) {
		return rep, nil
	}
	if err != nil {
		return rep, err
	}
	rep.Listed = len(uuids)
	v, err := hh.judgeDeletedArchives(ctx, h, uuids, "confirm_bucket_archives", nil)
	rep.Unknown, rep.Live, rep.NotDue, rep.Due = v.unknown, v.live, v.notDue, len(v.due)
	if err != nil {
		return rep, fmt.Errorf("confirming the archive's databases: %w", err)
	}
	limit := max(hh.cfg.DeletedArchiveMassFloor, int(hh.cfg.DeletedArchiveMassFraction*float64(len(uuids))))
	if hh.massHeld(h, "mass_bucket_archive_deletes", v.due, limit, h.now(), 2*hh.cfg.BucketSweepInterval,
		fmt.Sprintf("%d databases in the archive, bucket-wide pass", len(uuids))) {
		rep.Held = len(v.due)
		return rep, nil
	}
	unlock, due := hh.holdMarks(ctx, h, v.due)
	defer unlock()
	rep.Deleted, rep.Objects, rep.Failures, err = hh.deleteArchives(ctx, h, due, nil)
	return rep, err
}
