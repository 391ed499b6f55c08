package objecthost

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// The size feed's restart pass. A size reaches the catalog only if its
// event survives the host's aggregation window, the producer's memory (the
// client's buffer while the broker is slow or away, until StallTimeout
// sends it to the on-disk spill) and the broker. A host killed -9 loses
// what was still in memory, and after its restart nothing measured that
// database again unless it changed: Open loads each object's size from its
// file without publishing it, a write that leaves the size as it was
// publishes nothing, and the size aggregator's periodic resend only covers
// databases recorded since the start. Such a database kept no size (or an
// old one) in the catalog, and its account's storage total under-counted
// it, until its next growth.
//
// The host cannot tell which sizes were delivered (the producer's
// acknowledgements are not persisted per database), so after every start
// it publishes the size of every live database once, with a fresh
// sequence. Consumers keep the highest sequence per database, so a size
// that had arrived is rewritten with the same value: repeated work, never
// a wrong value — provided the object is still the database's object.
// A host declared lost that comes back holds superseded objects of
// databases relocated elsewhere: their sizes are stale, and a fresh
// (wall-clock) sequence would make the catalog prefer them over the live
// object's until its next write. So with a catalog, the size of an object
// is published again at its first heartbeat after the start whose answer
// names this very object as the database's active one (heartbeat.go);
// the first beats are spread over one interval by their UUID phase, which
// paces it. Without a catalog (no relocation can have happened: tests, a
// host run alone), one pass after the start publishes every live size,
// paced at SizeRepublishRate per second. A negative rate disables both.
//
// A database whose heartbeats are disabled (its init options carry the
// account's HeartbeatIntervalMs -1: the edge copies it at create) never
// gets a heartbeat, so with a catalog its size would never be published
// again after a restart. For those, one pass after the start
// (republishQuietSizes) asks the catalog the same question a heartbeat
// asks, HeartbeatBatch databases per call, and publishes the size of
// each one the catalog names active with this very object. It answers
// nothing else (a heartbeat's other verdicts stay with heartbeats), and a
// failed call is retried every HeartbeatInterval until the pass is done.

// RepublishSizes records the current size of every active object with a
// file into the size sink, with a fresh sequence, paced at rate per second
// (≤ 0: unpaced). It returns how many sizes it recorded.
func (h *Host) RepublishSizes(ctx context.Context, rate int) int {
	h.mu.Lock()
	objs := make([]*object, 0, len(h.objects))
	for _, o := range h.objects {
		objs = append(objs, o)
	}
	h.mu.Unlock()
	h.m.sizeRepublishPending.Set(float64(len(objs)))
	defer h.m.sizeRepublishPending.Set(0)
	pace := newPacer(rate, len(objs))
	defer pace.stop()
	n := 0
	for i, o := range objs {
		if !pace.wait(ctx) {
			return n
		}
		if h.republishSize(o) {
			n++
			h.m.sizesRepublished.Inc()
		}
		h.m.sizeRepublishPending.Set(float64(len(objs) - i - 1))
	}
	return n
}

// republishSize records o's size again under its size lock (so the fresh
// sequence orders it after any measurement already recorded and before
// any later one). Deleted, swept and never-written objects have no size to
// publish: a swept object's 0 was recorded by the sweep.
func (h *Host) republishSize(o *object) bool {
	if o.sizeUnknown.Load() {
		h.measureOpen(o)
	}
	o.sizeMu.Lock()
	defer o.sizeMu.Unlock()
	m := o.meta.Load()
	size := o.size.Load()
	if m == nil || m.deleted() || size <= 0 {
		return false
	}
	h.cfg.Sizes.RecordSize(SizeEvent{AccountID: m.AccountID, DatabaseUUID: m.DatabaseUUID, SizeBytes: size, Seq: h.nextSizeSeq(), Time: h.now()})
	return true
}

// startSizeRepublish runs the restart pass once, in the background (a
// host with a million databases spreads it over minutes at the default
// rate and serves meanwhile).
func (h *Host) startSizeRepublish(ctx context.Context) {
	if _, none := h.cfg.Sizes.(discard); none || h.cfg.SizeRepublishRate < 0 {
		return
	}
	if h.cfg.Catalog != nil {
		// The others at each object's first current heartbeat.
		h.wg.Add(1)
		go func() {
			defer h.wg.Done()
			for {
				n, err := h.republishQuietSizes(ctx)
				if err == nil {
					if n > 0 {
						h.log.Info("sizes of databases without heartbeats republished after start", "databases", n)
					}
					return
				}
				h.log.Warn("republishing the sizes of databases without heartbeats failed; retrying", "err", err)
				select {
				case <-ctx.Done():
					return
				case <-time.After(h.cfg.HeartbeatInterval):
				}
			}
		}()
		return
	}
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		n := h.RepublishSizes(ctx, h.cfg.SizeRepublishRate)
		h.log.Info("sizes republished after start", "databases", n)
	}()
}

// republishQuietSizes publishes, once since the start, the size of every
// live object whose heartbeats are disabled and that the catalog names as
// its database's active object (see above). It answers how many objects
// the catalog named so (each has its size published, unless it has none),
// and the first failed catalog call (the objects not asked yet, or not
// answered, are asked again by the next call).
func (h *Host) republishQuietSizes(ctx context.Context) (int, error) {
	h.mu.RLock()
	byUUID := map[string][]*object{}
	var uuids []string
	for _, o := range h.objects {
		m := o.meta.Load()
		if m == nil || m.deleted() || o.sizeRepublished.Load() {
			continue
		}
		if _, beats := h.interval(m); beats {
			continue
		}
		if byUUID[m.DatabaseUUID] == nil {
			uuids = append(uuids, m.DatabaseUUID)
		}
		byUUID[m.DatabaseUUID] = append(byUUID[m.DatabaseUUID], o)
	}
	h.mu.RUnlock()
	sort.Strings(uuids)
	n := 0
	for start := 0; start < len(uuids); start += max(1, h.cfg.HeartbeatBatch) {
		batch := uuids[start:min(len(uuids), start+max(1, h.cfg.HeartbeatBatch))]
		cctx, cancel := context.WithTimeout(ctx, h.cfg.CatalogTimeout)
		ans, err := h.cfg.Catalog.Heartbeat(cctx, batch)
		cancel()
		if err != nil {
			return n, fmt.Errorf("catalog heartbeat read of %d databases without heartbeats: %w", len(batch), err)
		}
		for _, st := range ans.Databases {
			if !st.Known || st.State != fsm.StateActive {
				continue
			}
			for _, o := range byUUID[st.UUID] {
				if m := o.meta.Load(); st.ObjectID == "" || st.ObjectID == m.ObjectID {
					before := o.sizeRepublished.Load()
					h.republishSizeOnBeat(o)
					if !before {
						n++
					}
				}
			}
		}
	}
	return n, nil
}

// republishSizeOnBeat publishes o's size at its first heartbeat since the
// start that names o as its database's active object (see above).
func (h *Host) republishSizeOnBeat(o *object) {
	if h.cfg.SizeRepublishRate < 0 || o.sizeRepublished.Swap(true) {
		return
	}
	if _, none := h.cfg.Sizes.(discard); none {
		return
	}
	if h.republishSize(o) {
		h.m.sizesRepublished.Inc()
	}
}

// noteStoredSize records o's size after its file was replaced whole (a
// restore from the archive, in place or onto this host): from the file's
// header, or — when the header cannot be trusted — at the object's next
// republication, by opening it.
func (h *Host) noteStoredSize(o *object, m *Meta) {
	size, ok := storedUsedBytes(h.path(m.ObjectID))
	if !ok {
		o.sizeUnknown.Store(true)
		return
	}
	h.noteSize(o, m, func() int64 { return size })
}

// measureOpen measures o's size by opening the database (its WAL replayed
// by SQLite) when its header could not be trusted, and records it.
func (h *Host) measureOpen(o *object) {
	m := o.meta.Load()
	if m == nil || m.deleted() {
		return
	}
	hd, err := h.handles.acquire(m.ObjectID)
	if err != nil {
		h.log.Warn("size unknown: the database did not open", "object", m.ObjectID, "err", err)
		return
	}
	defer h.handles.release(hd)
	size, err := hd.db.UsedBytes()
	if err != nil {
		h.log.Warn("size unknown: the database could not be measured", "object", m.ObjectID, "err", err)
		return
	}
	o.sizeUnknown.Store(false)
	h.noteSize(o, m, func() int64 { return size })
}

// sizeResender is the optional part of a size sink that sends only
// changed sizes (PipelineSinks): ResendSizes has it send every database's
// latest size once more, changed or not.
type sizeResender interface{ ResendSizes() }

// noteCatalogRestores takes the catalog's restore count from a heartbeat
// answer. A catalog restored from a backup (`shoal cluster restore`) holds
// the backup's sizes for every database it knew then (database_stats went
// back with everything else), and a host publishes a size only when it
// changes: the account totals the storage limits are enforced on would
// count the backup's sizes until each database next changed size (the
// robustness suite's catalog-restore schedule found 7 of 74 databases
// behind, the total 181 kB short). So when the count grows past the one
// the host first saw since its start, every object publishes its size
// again at its next heartbeat that names it current — the restart pass's
// path, paced the same way. The first answer since the start only records
// the count: the start's pass publishes everything anyway. An answer with
// a lower count (a follower behind the restore) changes nothing.
func (h *Host) noteCatalogRestores(n int64) {
	for {
		seen := h.catalogRestores.Load()
		if n+1 <= seen {
			return
		}
		if !h.catalogRestores.CompareAndSwap(seen, n+1) {
			continue
		}
		if seen == 0 {
			// The first answer since the start: the start's pass
			// publishes every size anyway. A catalog restored at some
			// point (maybe while this host was down) gets its tombstones
			// checked once (resurrected.go).
			if n > 0 {
				h.noteRestoreSeen()
			}
			return
		}
		break
	}
	h.noteRestoreSeen() // databases deleted since the backup are listed again (resurrected.go)
	h.mu.Lock()
	for _, o := range h.objects {
		o.sizeRepublished.Store(false)
	}
	n0 := len(h.objects)
	h.mu.Unlock()
	// A sink that sends a size only when it changed (the pipeline's
	// aggregator) must be told to send unchanged ones too.
	if r, ok := h.cfg.Sizes.(sizeResender); ok {
		r.ResendSizes()
	}
	h.log.Warn("the catalog was restored from a backup: publishing every database's size again at its next heartbeat", "catalog_restores", n, "objects", n0)
}
