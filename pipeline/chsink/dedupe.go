package chsink

import "github.com/shoaldb/shoal/pipeline/event"

// recentIDs remembers, per producer, which of its most recent sequences
// this sink inserted, so a duplicate it sees again (a producer that
// replayed a spilled record which had in fact been delivered, a partition
// that came back after a rebalance, a record repeated inside one batch) is
// dropped before it is written, and counted. It is an optimisation and the
// source of the duplicates-dropped metric, not the correctness mechanism:
// it is per process and bounded, and the table's ReplacingMergeTree key
// catches everything it misses. It never drops an event it has not seen:
// it is exact (a bitmap of the last window sequences below each
// producer's highest one, never a hash), so it cannot lose usage.
//
// A bitmap and not a set of IDs because usage sequences are contiguous
// per producer and arrive nearly in order: a lookup is a bit test in a
// few cache lines where a 262,144-entry hash set missed the cache on
// every probe (a quarter of the sink's CPU). Memory: window/8 bytes per
// producer, at most maxProducers of them (the least recently looked up is
// forgotten first).
//
// Not safe for concurrent use: only the sink's loop touches it.
type recentIDs struct {
	window    uint64 // sequences remembered per producer, a power of two ≥ 64
	producers map[string]*seqWindow
	lastName  string // the producer of the previous lookup: records come in runs
	last      *seqWindow
	tick      uint64
}

// seqWindow holds one producer's sequences in (hi-window, hi].
type seqWindow struct {
	hi   uint64
	any  bool // hi is meaningful
	used uint64
	bits []uint64
}

const maxProducers = 256

func newRecentIDs(n int) *recentIDs {
	if n <= 0 {
		return nil
	}
	w := uint64(64)
	for w < uint64(n) {
		w <<= 1
	}
	return &recentIDs{window: w, producers: make(map[string]*seqWindow)}
}

func (r *recentIDs) lookup(producer string, create bool) *seqWindow {
	if r.last != nil && producer == r.lastName {
		return r.last
	}
	w := r.producers[producer]
	if w == nil {
		if !create {
			return nil
		}
		if len(r.producers) >= maxProducers {
			r.evictOldest()
		}
		w = &seqWindow{bits: make([]uint64, r.window/64)}
		r.producers[producer] = w
	}
	r.tick++
	w.used = r.tick
	r.lastName, r.last = producer, w
	return w
}

func (r *recentIDs) evictOldest() {
	var name string
	var oldest *seqWindow
	for p, w := range r.producers {
		if oldest == nil || w.used < oldest.used {
			name, oldest = p, w
		}
	}
	delete(r.producers, name)
	if r.last == oldest {
		r.lastName, r.last = "", nil
	}
}

// clear forgets every sequence, keeping the allocations (a batch's set
// between batches).
func (r *recentIDs) clear() {
	if r == nil {
		return
	}
	for _, w := range r.producers {
		if w.any {
			clear(w.bits)
			w.any = false
		}
	}
}

// seen reports whether id was added and is still in its producer's window.
func (r *recentIDs) seen(id event.ID) bool {
	if r == nil {
		return false
	}
	w := r.lookup(id.Producer, false)
	if w == nil || !w.any {
		return false
	}
	s := id.Seq
	if s > w.hi || w.hi-s >= r.window {
		return false
	}
	i := s & (r.window - 1)
	return w.bits[i>>6]&(1<<(i&63)) != 0
}

// add remembers id, sliding its producer's window forward (and forgetting
// what falls out of it) when id is the highest sequence yet.
func (r *recentIDs) add(id event.ID) {
	if r == nil {
		return
	}
	w := r.lookup(id.Producer, true)
	s := id.Seq
	switch {
	case !w.any:
		w.any, w.hi = true, s
	case s > w.hi:
		if s-w.hi >= r.window {
			clear(w.bits)
		} else {
			for q := w.hi + 1; q < s; q++ {
				i := q & (r.window - 1)
				w.bits[i>>6] &^= 1 << (i & 63)
			}
		}
		w.hi = s
	case w.hi-s >= r.window:
		return // older than the window: not remembered, never matched
	}
	i := s & (r.window - 1)
	w.bits[i>>6] |= 1 << (i & 63)
}
