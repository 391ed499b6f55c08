package edge

import (
	"container/list"
	"math"
	"sync"
	"time"
)

// RateLimit is a token bucket: Rate requests per second with bursts of Burst.
// A zero Rate disables the limit.
type RateLimit struct {
	Rate  float64
	Burst int
}

// limiters holds one token bucket per key (account or database) in a bounded
// LRU: when full, the least recently used bucket is dropped, which at worst
// gives that key a fresh full bucket. Safe for concurrent use.
//
// A bucket is this edge's replica of the fleet's bucket for the key: allow
// takes tokens for the requests this edge admits, and charge (the rate share,
// ratelimit_share.go) takes the tokens other edges reported spending. A
// charge may drive the tokens negative: the edge then refuses the key until
// the refill has paid the debt back, which is what keeps the sum over the
// edges at the configured rate. Without a rate share nothing charges and
// each edge enforces the limit on its own.
type limiters struct {
	limit RateLimit
	burst float64
	max   int
	now   func() time.Time

	mu    sync.Mutex
	ll    *list.List // front = most recently used; values are *bucket
	byKey map[string]*list.Element
}

// bucket is one key's tokens as of last. Guarded by limiters.mu.
type bucket struct {
	key    string
	tokens float64 // may be negative after a charge
	last   time.Time
}

func newLimiters(l RateLimit, max int, now func() time.Time) *limiters {
	if max <= 0 {
		max = 100_000
	}
	burst := float64(l.Burst)
	if burst <= 0 {
		burst = math.Max(1, l.Rate)
	}
	return &limiters{limit: l, burst: burst, max: max, now: now, ll: list.New(), byKey: make(map[string]*list.Element)}
}

// get returns key's bucket refilled up to now, creating a full one (and
// evicting the least recently used) when there is none. Caller holds mu.
func (ls *limiters) get(key string, now time.Time) *bucket {
	if el, ok := ls.byKey[key]; ok {
		ls.ll.MoveToFront(el)
		b := el.Value.(*bucket)
		if d := now.Sub(b.last); d > 0 {
			b.tokens = math.Min(ls.burst, b.tokens+d.Seconds()*ls.limit.Rate)
			b.last = now
		}
		return b
	}
	b := &bucket{key: key, tokens: ls.burst, last: now}
	ls.byKey[key] = ls.ll.PushFront(b)
	for ls.ll.Len() > ls.max {
		old := ls.ll.Back()
		ls.ll.Remove(old)
		delete(ls.byKey, old.Value.(*bucket).key)
	}
	return b
}

// allow takes one token for key. When none is available it returns false and
// how long until one will be.
func (ls *limiters) allow(key string) (bool, time.Duration) {
	if ls.limit.Rate <= 0 {
		return true, 0
	}
	now := ls.now()
	ls.mu.Lock()
	defer ls.mu.Unlock()
	b := ls.get(key, now)
	if b.tokens >= 1 {
		b.tokens--
		return true, 0
	}
	wait := time.Duration((1 - b.tokens) / ls.limit.Rate * float64(time.Second))
	return false, max(wait, time.Millisecond)
}

// charge takes n tokens from key's bucket for requests admitted elsewhere
// (another edge's report). The tokens may go negative.
func (ls *limiters) charge(key string, n int64) {
	if ls.limit.Rate <= 0 || n <= 0 {
		return
	}
	now := ls.now()
	ls.mu.Lock()
	defer ls.mu.Unlock()
	ls.get(key, now).tokens -= float64(n)
}

// tokens is key's current token count (tests); a key without a bucket has
// a full one.
func (ls *limiters) tokens(key string) float64 {
	now := ls.now()
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if el, ok := ls.byKey[key]; ok {
		b := el.Value.(*bucket)
		return math.Min(ls.burst, b.tokens+max(0, now.Sub(b.last).Seconds())*ls.limit.Rate)
	}
	return ls.burst
}

func (ls *limiters) len() int {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return ls.ll.Len()
}
