package chsink

import "github.com/shoaldb/shoal/pipeline/event"

// recentIDs remembers the last N event IDs this sink inserted, so a
// duplicate it sees again (a producer that replayed a spilled record which
// had in fact been delivered, a partition that came back after a
// rebalance, a record repeated inside one batch) is dropped before it is
// written, and counted. It is an optimisation and the source of the
// duplicates-dropped metric, not the correctness mechanism: it is per
// process and bounded, and the tables' ReplacingMergeTree keys catch
// everything it misses. It never drops an event it has not seen: keys are
// exact (an interned producer index and the sequence packed into 64 bits;
// an ID that does not fit is simply not remembered), so it cannot lose
// usage.
//
// Not safe for concurrent use: only the sink's loop touches it.
type recentIDs struct {
	producers map[string]uint64
	lastName  string // the producer of the previous lookup: records come in runs
	lastIdx   uint64
	set       map[uint64]struct{}
	ring      []uint64
	next      int
}

const (
	seqBits      = 40 // sequences up to 2^40 (years of one producer boot at 20,000 events/s)
	maxProducers = 1 << (64 - seqBits - 1)
	noKey        = ^uint64(0)
)

func newRecentIDs(n int) *recentIDs {
	if n <= 0 {
		return nil
	}
	return &recentIDs{
		producers: make(map[string]uint64),
		set:       make(map[uint64]struct{}, n),
		ring:      make([]uint64, 0, n),
	}
}

// key packs id; intern adds its producer if new. It returns noKey when
// the ID cannot be represented (not remembered, never matched).
func (r *recentIDs) key(id event.ID, intern bool) uint64 {
	if id.Seq >= 1<<seqBits {
		return noKey
	}
	if id.Producer != r.lastName || r.lastName == "" {
		p, ok := r.producers[id.Producer]
		if !ok {
			if !intern {
				return noKey
			}
			if len(r.producers) >= maxProducers {
				return noKey // full until resetIfFull between batches
			}
			p = uint64(len(r.producers))
			r.producers[id.Producer] = p
		}
		r.lastName, r.lastIdx = id.Producer, p
	}
	return r.lastIdx<<seqBits | id.Seq
}

// resetIfFull starts over when the producer table is full. Only call it
// when no keys are held elsewhere (between batches): indices are reused.
func (r *recentIDs) resetIfFull() {
	if r != nil && len(r.producers) >= maxProducers {
		r.reset()
	}
}

func (r *recentIDs) reset() {
	clear(r.producers)
	clear(r.set)
	r.ring, r.next = r.ring[:0], 0
	r.lastName, r.lastIdx = "", 0
}

// seen reports whether id was added and not yet evicted.
func (r *recentIDs) seen(id event.ID) bool {
	if r == nil {
		return false
	}
	k := r.key(id, false)
	if k == noKey {
		return false
	}
	_, ok := r.set[k]
	return ok
}

// add remembers id, evicting the oldest when full.
func (r *recentIDs) add(id event.ID) {
	if r == nil {
		return
	}
	k := r.key(id, true)
	if k == noKey {
		return
	}
	if _, dup := r.set[k]; dup {
		return
	}
	if len(r.ring) < cap(r.ring) {
		r.ring = append(r.ring, k)
	} else {
		delete(r.set, r.ring[r.next])
		r.ring[r.next] = k
		r.next = (r.next + 1) % len(r.ring)
	}
	r.set[k] = struct{}{}
}
