package objecthost

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// Digest heartbeats (raftmeta/fsm/hbdigest.go has the catalog's half).
//
// The host keeps, per bucket (fsm.DigestBucket of the UUID), the XOR of
// fsm.DigestOf(uuid, object, generation) over its ACTIVE objects and their
// count, updated whenever an object's metadata is swapped (setMeta). The
// catalog keeps the same per (host, bucket) over the active databases it
// places on this host. Each heartbeat pass sends the digests of the buckets
// its due objects fall in (one call, followers first); a bucket the catalog
// answers equal holds nothing the host could learn from per-database
// answers — same databases, objects, generations, all active — so its due
// objects are rescheduled without a per-database lookup. Only the due
// objects of a differing bucket, and the objects that need a per-database
// answer whatever the digest says (unsettled below), go through today's
// per-database heartbeat, and only its answers ever lead to a delete, a
// retirement, an orphan verdict or an alarm.

// hostDigests is the host's side of the digests. Safe for concurrent use;
// 64 KiB whatever the number of objects.
type hostDigests struct {
	mu     sync.Mutex
	digest [fsm.DigestBuckets]int64
	count  [fsm.DigestBuckets]int64
}

// add puts m's contribution in (sign +1) or takes it out (−1); deleted and
// nil metadata contribute nothing.
func (t *hostDigests) add(m *Meta, sign int64) {
	if m == nil || m.deleted() {
		return
	}
	b := fsm.DigestBucket(m.DatabaseUUID)
	d := fsm.DigestOf(m.DatabaseUUID, m.ObjectID, m.RoutingGeneration)
	t.mu.Lock()
	t.digest[b] ^= d
	t.count[b] += sign
	t.mu.Unlock()
}

// swap replaces old's contribution by m's. Skipped when neither changes
// what the digest covers (most metadata swaps: bindings, confirmation).
func (t *hostDigests) swap(old, m *Meta) {
	if old != nil && m != nil && old.deleted() == m.deleted() && old.DatabaseUUID == m.DatabaseUUID &&
		old.ObjectID == m.ObjectID && old.RoutingGeneration == m.RoutingGeneration {
		return
	}
	t.add(old, -1)
	t.add(m, +1)
}

func (t *hostDigests) bucket(b int) fsm.BucketDigest {
	t.mu.Lock()
	defer t.mu.Unlock()
	return fsm.BucketDigest{Bucket: b, Digest: t.digest[b], Count: t.count[b]}
}

// setMeta publishes m as o's metadata and keeps the digests in step. Every
// metadata change goes through it; callers hold o.mu (or own o alone, as
// Open does), so the swaps of one object are serialised.
func (h *Host) setMeta(o *object, m *Meta) {
	old := o.meta.Swap(m)
	h.digests.swap(old, m)
}

// DigestCatalog is the optional part of Catalog that digest heartbeats
// need, discovered by type assertion (RaftmetaCatalog has it). A catalog
// without it gets per-database heartbeats only, as before.
type DigestCatalog interface {
	// HeartbeatDigests answers which of the host's bucket digests differ
	// from the catalog's and, once each, the accounts named. It may be
	// served by a follower (a stale answer at worst delays what the
	// host learns by one interval; nothing destructive follows from it).
	// A catalog that does not know the call answers ErrDigestsUnsupported.
	HeartbeatDigests(ctx context.Context, q fsm.DigestQuery) (fsm.DigestAnswer, error)
}

// ErrDigestsUnsupported is a catalog's answer to a digest heartbeat when it
// runs a build without them (a rolling upgrade): the host sends
// per-database heartbeats and asks again after digestRetryAfter.
var ErrDigestsUnsupported = errors.New("catalog does not support digest heartbeats")

// digestRetryAfter is how long a host sends only per-database heartbeats
// after a catalog answered ErrDigestsUnsupported.
const digestRetryAfter = 5 * time.Minute

// unsettled reports whether o needs a per-database answer whatever its
// bucket's digest says: not confirmed yet (the answer confirms it and
// publishes its route), a failed route publication to repair, or a
// restore from the archive in progress.
func unsettled(o *object, m *Meta) bool {
	return !m.Confirmed || o.routeDirty.Load() || m.Restoring != nil
}

// digestPass splits a pass's due objects into those a matching bucket
// answers (rescheduled here, with their accounts applied) and those that
// still need a per-database heartbeat (returned, as object IDs). Any
// failure of the digest call returns every due ID: the per-database path
// then does exactly what it did before digests.
func (h *Host) digestPass(ctx context.Context, ids []string, now time.Time, rep *HeartbeatReport) []string {
	dc, ok := h.cfg.Catalog.(DigestCatalog)
	if !ok || h.cfg.HeartbeatDigestsOff || now.UnixNano() < h.digestOffUntil.Load() {
		return ids
	}
	var (
		perDB   []string
		byBkt   = map[int][]*object{}
		buckets []int
		accts   []string
		seen    = map[string]bool{}
	)
	for _, id := range ids {
		o, m, err := h.lookup(id)
		if err != nil || m.deleted() {
			continue // swept or deleted since scheduled: drop (as heartbeatChunk does)
		}
		if unsettled(o, m) {
			perDB = append(perDB, id)
			continue
		}
		b := fsm.DigestBucket(m.DatabaseUUID)
		if byBkt[b] == nil {
			buckets = append(buckets, b)
		}
		byBkt[b] = append(byBkt[b], o)
		if !seen[m.AccountID] {
			seen[m.AccountID] = true
			accts = append(accts, m.AccountID)
		}
	}
	if len(buckets) == 0 {
		return perDB
	}
	q := fsm.DigestQuery{HostID: h.cfg.ID, Buckets: make([]fsm.BucketDigest, 0, len(buckets))}
	for _, b := range buckets {
		q.Buckets = append(q.Buckets, h.digests.bucket(b))
	}
	// Accounts go with the buckets, at most HeartbeatBatch per call (the
	// catalog takes 10,000); a pass naming more sends the rest in calls
	// without buckets.
	step := max(1, min(h.cfg.HeartbeatBatch, fsm.MaxDigestAccounts))
	differ := map[int]bool{}
	for start := 0; start == 0 || start < len(accts); start += step {
		q.Accounts = accts[start:min(start+step, len(accts))]
		rep.DigestCalls++
		cctx, cancel := context.WithTimeout(ctx, h.cfg.CatalogTimeout)
		ans, err := dc.HeartbeatDigests(cctx, q)
		cancel()
		if err != nil {
			h.m.catalogCalls.WithLabelValues("heartbeat_digests", "error").Inc()
			if errors.Is(err, ErrDigestsUnsupported) {
				h.digestOffUntil.Store(now.Add(digestRetryAfter).UnixNano())
				h.log.Info("catalog does not support digest heartbeats; sending per-database heartbeats", "retry_after", digestRetryAfter)
			} else {
				h.log.Warn("digest heartbeat failed; sending per-database heartbeats", "err", err)
			}
			if start == 0 {
				return ids
			}
			break // the buckets were answered; some accounts wait for the next pass
		}
		h.m.catalogCalls.WithLabelValues("heartbeat_digests", "ok").Inc()
		h.applyAccounts(ans.Accounts)
		if start == 0 {
			// Before the matched buckets below republish: a restore
			// seen here has every matching object publish its size.
			h.noteCatalogRestores(ans.CatalogRestores)
			rep.DigestBuckets += len(q.Buckets)
			for _, b := range ans.Differ {
				differ[b] = true
			}
			q.Buckets = nil
		}
	}
	matched := 0
	for _, b := range buckets {
		if differ[b] {
			rep.DigestDiffer++
			for _, o := range byBkt[b] {
				perDB = append(perDB, o.meta.Load().ObjectID)
			}
			continue
		}
		for _, o := range byBkt[b] {
			m := o.meta.Load()
			if m.deleted() {
				continue
			}
			// The catalog names this very object, at this generation, as
			// the database's active one on this host: what an "active,
			// same object" per-database answer says.
			h.republishSizeOnBeat(o)
			h.scheduleNext(m, now)
			matched++
		}
	}
	rep.DigestMatched += matched
	h.m.heartbeats.WithLabelValues("digest_ok").Add(float64(matched))
	return perDB
}
