package objecthost

import (
	"container/heap"
	"context"
	"hash/fnv"
	"sort"
	"sync"
	"time"

	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// schedule is the min-heap of next heartbeat times: one entry per active
// object with heartbeats enabled, ~40 bytes each, and no goroutine or timer
// per database. Safe for concurrent use.
type schedule struct {
	mu sync.Mutex
	h  hbHeap
}

type hbItem struct {
	due int64 // Unix nanoseconds
	id  string
}

type hbHeap []hbItem

func (h hbHeap) Len() int           { return len(h) }
func (h hbHeap) Less(i, j int) bool { return h[i].due < h[j].due }
func (h hbHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *hbHeap) Push(x any)        { *h = append(*h, x.(hbItem)) }
func (h *hbHeap) Pop() any {
	old := *h
	it := old[len(old)-1]
	*h = old[:len(old)-1]
	return it
}

func (s *schedule) push(id string, due time.Time) {
	s.mu.Lock()
	heap.Push(&s.h, hbItem{due: due.UnixNano(), id: id})
	s.mu.Unlock()
}

// popDue removes and returns every entry due at or before now.
func (s *schedule) popDue(now time.Time) []string {
	n := now.UnixNano()
	s.mu.Lock()
	defer s.mu.Unlock()
	var ids []string
	for len(s.h) > 0 && s.h[0].due <= n {
		ids = append(ids, heap.Pop(&s.h).(hbItem).id)
	}
	return ids
}

func (s *schedule) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.h)
}

// hash64 is the per-database seed of phase and jitter: deterministic from
// the UUID, so a restart keeps each database's slot and databases spread
// evenly over the interval.
func hash64(s string) uint64 {
	f := fnv.New64a()
	_, _ = f.Write([]byte(s))
	return f.Sum64()
}

// interval is the database's heartbeat interval: the database option, else
// the account's limit, else the host default; ok=false when disabled (-1).
func (h *Host) interval(m *Meta) (time.Duration, bool) {
	switch ms := m.Options.HeartbeatIntervalMs; {
	case ms < 0:
		return 0, false
	case ms > 0:
		return time.Duration(ms) * time.Millisecond, true
	}
	switch ms := h.account(m.AccountID).intervalMs; {
	case ms < 0:
		return 0, false
	case ms > 0:
		return time.Duration(ms) * time.Millisecond, true
	}
	return h.cfg.HeartbeatInterval, true
}

// jitter is up to a tenth of the interval, fixed per database.
func jitter(uuid string, iv time.Duration) time.Duration {
	return time.Duration(hash64(uuid) % uint64(iv/10+1))
}

// scheduleFirst places an object's first heartbeat at a UUID-determined
// phase within one interval, so a host restarting with a million objects
// spreads them over the interval instead of sending them all at once.
func (h *Host) scheduleFirst(m *Meta, now time.Time) {
	iv, ok := h.interval(m)
	if !ok {
		return
	}
	h.sched.push(m.ObjectID, now.Add(time.Duration(hash64(m.DatabaseUUID)%uint64(iv))))
}

func (h *Host) scheduleNext(m *Meta, now time.Time) {
	iv, ok := h.interval(m)
	if !ok {
		return
	}
	h.sched.push(m.ObjectID, now.Add(iv+jitter(m.DatabaseUUID, iv)))
}

// HeartbeatReport counts what one RunHeartbeats pass did.
type HeartbeatReport struct {
	Sent            int // databases included in catalog calls
	Calls           int // catalog calls made
	Failed          int // databases whose call failed (rescheduled sooner)
	Confirmations   int // unknown-on-a-stale-read databases re-asked linearizably
	OrphansKilled   int // unknown to the catalog (confirmed) after the grace period
	OrphansSaved    int // orphan verdicts the fence refuted (a create committed after the confirming read)
	OrphansHeld     int // confirmed orphans kept: the pass had a mass of them (alarm)
	LostHeld        int // unknown to the catalog although once confirmed active: kept (alarm)
	Deleted         int // deleted in the catalog
	RoutesRepaired  int // republished (unconfirmed, stale generation or failed publication)
	Superseded      int // retired: the catalog names a newer object on another host (lost-host recovery)
	LeftoversKilled int // unconfirmed objects of a relocation that never committed, fenced and deleted
	OlderHeld       int // confirmed objects the catalog names an older object for: kept (alarm)

	// Digest heartbeats (digests.go).
	DigestCalls   int // digest calls made (one per pass, more only for over HeartbeatBatch accounts)
	DigestBuckets int // bucket digests sent
	DigestDiffer  int // buckets the catalog answered different: their due objects went per database
	DigestMatched int // due objects answered by an equal bucket: no per-database lookup

	// Resurrection is the pass's check of deleted databases after a
	// catalog restore (resurrected.go).
	Resurrection ResurrectionReport
}

// RunHeartbeats sends every due heartbeat, in chunks of HeartbeatBatch UUIDs
// per catalog call, and applies the answers. The background loop calls it
// every HeartbeatTick; tests call it directly with a moved clock.
//
// Answers: deleted in the catalog → deleted; active and unconfirmed, at a
// newer generation or with a failed publication → confirmed and route
// republished. Accounts' limits update BlockGrowth and intervals. Unknown
// after CreationGrace is only a suspicion: it is re-asked with a
// linearizable read, and only a confirmed unknown that was never confirmed
// active is an orphan (the leftover of a failed create), killed at the end
// of the pass unless the pass found a mass of them (see killOrphans and the
// destruction contract on Catalog).
func (h *Host) RunHeartbeats(ctx context.Context) HeartbeatReport {
	var rep HeartbeatReport
	if h.cfg.Catalog == nil {
		return rep
	}
	now := h.now()
	ids := h.sched.popDue(now)
	// Bucket digests first: the due objects of buckets the catalog holds
	// exactly as the host does need no per-database lookup; the rest (and
	// everything, when the digest call fails or the catalog does not know
	// it) go through the per-database heartbeat below.
	ids = h.digestPass(ctx, ids, now, &rep)
	var orphans []*object
	for start := 0; start < len(ids); start += h.cfg.HeartbeatBatch {
		if ctx.Err() != nil {
			// Shutting down: nothing is lost, the schedule is rebuilt on Open.
			return rep
		}
		end := min(start+h.cfg.HeartbeatBatch, len(ids))
		orphans = append(orphans, h.heartbeatChunk(ctx, ids[start:end], now, &rep)...)
	}
	h.killOrphans(ctx, orphans, &rep)
	// After a catalog restore: databases deleted here that it lists again
	// (resurrected.go; nothing to do in the steady state).
	rep.Resurrection = h.checkResurrected(ctx, now)
	return rep
}

// heartbeatChunk sends one catalog call and applies its answer; it returns
// the confirmed orphans for the pass to kill.
func (h *Host) heartbeatChunk(ctx context.Context, ids []string, now time.Time, rep *HeartbeatReport) []*object {
	// byUUID is a multimap only for robustness: the create flow never gives
	// one UUID two objects, but if it happened both must stay scheduled.
	byUUID := make(map[string][]*object, len(ids))
	var live []*object
	uuids := make([]string, 0, len(ids))
	for _, id := range ids {
		o, m, err := h.lookup(id)
		if err != nil || m.deleted() {
			continue // swept or deleted since scheduled: drop
		}
		if byUUID[m.DatabaseUUID] == nil {
			uuids = append(uuids, m.DatabaseUUID)
		}
		byUUID[m.DatabaseUUID] = append(byUUID[m.DatabaseUUID], o)
		live = append(live, o)
	}
	if len(uuids) == 0 {
		return nil
	}
	rep.Calls++
	rep.Sent += len(uuids)
	cctx, cancel := context.WithTimeout(ctx, h.cfg.CatalogTimeout)
	ans, err := h.cfg.Catalog.Heartbeat(cctx, uuids)
	cancel()
	if err != nil {
		h.m.catalogCalls.WithLabelValues("heartbeat", "error").Inc()
		h.m.heartbeats.WithLabelValues("error").Add(float64(len(uuids)))
		rep.Failed += len(uuids)
		for _, o := range live {
			m := o.meta.Load()
			h.sched.push(m.ObjectID, now.Add(h.cfg.HeartbeatRetry+jitter(m.DatabaseUUID, h.cfg.HeartbeatRetry)))
		}
		h.log.Warn("heartbeat call failed", "databases", len(uuids), "err", err)
		return nil
	}
	h.m.catalogCalls.WithLabelValues("heartbeat", "ok").Inc()
	h.applyAccounts(ans.Accounts)
	h.noteCatalogRestores(ans.CatalogRestores) // before apply: this answer's objects republish

	var suspects, orphans, gone, repair, mismatched []*object
	answered := make(map[*object]bool, len(ans.Databases))
	gens := make(map[*object]int64)
	apply := func(st fsm.HeartbeatState, o *object) {
		m := o.meta.Load()
		switch {
		case st.State == fsm.StateDeleted:
			gone = append(gone, o)
		case st.State == fsm.StateActive && st.ObjectID != "" && st.ObjectID != m.ObjectID:
			// The catalog names another object for this database:
			// resolved below on a linearizable read (relocated.go).
			mismatched = append(mismatched, o)
		case st.State == fsm.StateActive:
			h.republishSizeOnBeat(o)
			if !m.Confirmed || st.RoutingGeneration > m.RoutingGeneration || o.routeDirty.Load() {
				repair = append(repair, o)
				gens[o] = st.RoutingGeneration
			}
		}
	}
	for _, st := range ans.Databases {
		for _, o := range byUUID[st.UUID] {
			if answered[o] {
				continue // duplicate entry in the answer
			}
			answered[o] = true
			switch {
			case !st.Known:
				if now.Sub(o.meta.Load().CreatedAt) >= h.cfg.CreationGrace && !h.restoreRunning(o.meta.Load().ObjectID) {
					suspects = append(suspects, o)
				}
			default:
				apply(st, o)
			}
		}
	}
	if len(suspects) > 0 {
		orphans = h.confirmUnknown(ctx, suspects, rep, apply)
	}
	if len(mismatched) > 0 {
		h.resolveMismatched(ctx, mismatched, now, rep)
	}
	if len(gone) > 0 {
		if _, err := h.markDeletedAs(ctx, gone, 0, "deleted in the catalog (heartbeat)", deletedByCatalog); err != nil {
			h.log.Error("marking deleted from heartbeat failed; retrying next beat", "err", err)
			gone = nil
		}
	}
	rep.Deleted += len(gone)
	h.m.heartbeats.WithLabelValues("deleted").Add(float64(len(gone)))
	if len(repair) > 0 {
		n := h.repairRoutes(ctx, repair, gens)
		rep.RoutesRepaired += n
		h.m.heartbeats.WithLabelValues("route_repaired").Add(float64(n))
	}
	ok := 0
	for _, o := range live {
		m := o.meta.Load()
		if m.deleted() {
			continue
		}
		if !answered[o] {
			h.m.heartbeats.WithLabelValues("skipped").Inc()
		} else {
			ok++
		}
		h.scheduleNext(m, now)
	}
	h.m.heartbeats.WithLabelValues("ok").Add(float64(ok))
	return orphans
}

// repairRoutes confirms the objects at the catalog's generation in one
// index commit and republishes their routes. Returns how many it published.
func (h *Host) repairRoutes(ctx context.Context, objs []*object, gens map[*object]int64) int {
	sortObjects(objs)
	for _, o := range objs {
		o.mu.Lock()
	}
	defer func() {
		for _, o := range objs {
			o.mu.Unlock()
		}
	}()
	var changed []*Meta
	var changedObjs, live []*object
	for _, o := range objs {
		m := o.meta.Load()
		if o.gone || m.deleted() {
			continue
		}
		live = append(live, o)
		if !m.Confirmed || gens[o] > m.RoutingGeneration {
			n := *m
			n.Confirmed = true
			n.RoutingGeneration = max(gens[o], m.RoutingGeneration)
			changed = append(changed, &n)
			changedObjs = append(changedObjs, o)
		}
	}
	if len(changed) > 0 {
		if err := h.ix.put(changed...); err != nil {
			h.log.Error("confirming from heartbeat failed; retrying next beat", "err", err)
			return 0
		}
		for i, o := range changedObjs {
			h.setMeta(o, changed[i])
		}
	}
	for _, o := range live {
		h.publishLocked(ctx, o, o.meta.Load())
	}
	return len(live)
}

// applyAccounts records each account's heartbeat interval and whether it is
// over its storage limit (then writes that grow its databases are blocked
// until the drained total drops below the limit).
func (h *Host) applyAccounts(accts map[string]fsm.Account) {
	if len(accts) == 0 {
		return
	}
	h.accMu.Lock()
	defer h.accMu.Unlock()
	for id, a := range accts {
		st := h.accounts[id]
		if st == nil {
			st = &accountState{}
			h.accounts[id] = st
		}
		st.intervalMs = a.Limits.HeartbeatIntervalMs
		st.maxDatabaseBytes = a.Limits.MaxDatabaseBytes
		st.storageBytes, st.maxStorageBytes = a.StorageBytes, a.Limits.MaxStorageBytes
		block := a.Limits.MaxStorageBytes > 0 && a.StorageBytes >= a.Limits.MaxStorageBytes
		if block != st.blockGrowth {
			if block {
				h.m.blocked.Inc()
			} else {
				h.m.blocked.Dec()
			}
		}
		st.blockGrowth = block
	}
}

// sortObjects orders objects by ID: batch mutations lock in this order so
// two batches never deadlock.
func sortObjects(objs []*object) {
	sort.Slice(objs, func(i, j int) bool { return objs[i].meta.Load().ObjectID < objs[j].meta.Load().ObjectID })
}
