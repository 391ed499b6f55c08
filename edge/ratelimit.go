package edge

import (
	"container/list"
	"math"
	"sync"
	"time"

	"golang.org/x/time/rate"
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
type limiters struct {
	limit RateLimit
	max   int
	now   func() time.Time

	mu    sync.Mutex
	ll    *list.List // front = most recently used; values are *limiterEntry
	byKey map[string]*list.Element
}

type limiterEntry struct {
	key string
	lim *rate.Limiter
}

func newLimiters(l RateLimit, max int, now func() time.Time) *limiters {
	if max <= 0 {
		max = 100_000
	}
	return &limiters{limit: l, max: max, now: now, ll: list.New(), byKey: make(map[string]*list.Element)}
}

// allow takes one token for key. When none is available it returns false and
// how long until one will be.
func (ls *limiters) allow(key string) (bool, time.Duration) {
	if ls.limit.Rate <= 0 {
		return true, 0
	}
	ls.mu.Lock()
	var lim *rate.Limiter
	if el, ok := ls.byKey[key]; ok {
		ls.ll.MoveToFront(el)
		lim = el.Value.(*limiterEntry).lim
	} else {
		burst := ls.limit.Burst
		if burst <= 0 {
			burst = int(math.Max(1, ls.limit.Rate))
		}
		lim = rate.NewLimiter(rate.Limit(ls.limit.Rate), burst)
		ls.byKey[key] = ls.ll.PushFront(&limiterEntry{key: key, lim: lim})
		for ls.ll.Len() > ls.max {
			old := ls.ll.Back()
			ls.ll.Remove(old)
			delete(ls.byKey, old.Value.(*limiterEntry).key)
		}
	}
	ls.mu.Unlock()
	now := ls.now()
	r := lim.ReserveN(now, 1)
	if !r.OK() {
		return false, time.Second
	}
	if d := r.DelayFrom(now); d > 0 {
		r.CancelAt(now)
		return false, d
	}
	return true, 0
}

func (ls *limiters) len() int {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return ls.ll.Len()
}
