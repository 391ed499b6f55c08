package raftmeta

import (
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"
)

// staleCache is the Client's short-lived cache of stale-read answers, keyed
// by query and parameters ("account:<id>", "db:<uuid>", …) so that every
// caller asking the same question within the TTL shares one entry and one
// in-flight request (singleflight). It holds raw JSON so each caller decodes
// its own copy. Safe for concurrent use.
type staleCache struct {
	ttl        time.Duration
	maxEntries int
	now        func() time.Time

	mu      sync.Mutex
	entries map[string]cacheEntry
	group   singleflight.Group
}

type cacheEntry struct {
	data      []byte
	fetched   time.Time
	staleness time.Duration // node's staleness when fetched
}

func newStaleCache(ttl time.Duration, maxEntries int, now func() time.Time) *staleCache {
	return &staleCache{ttl: ttl, maxEntries: maxEntries, now: now, entries: map[string]cacheEntry{}}
}

// get returns a fresh entry: younger than the TTL and, when maxStale > 0,
// with age plus the serving node's staleness within maxStale.
func (c *staleCache) get(key string, maxStale time.Duration) ([]byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[key]
	if !ok {
		return nil, false
	}
	age := c.now().Sub(e.fetched)
	if age >= c.ttl || age < 0 {
		delete(c.entries, key)
		return nil, false
	}
	if maxStale > 0 && age+e.staleness > maxStale {
		return nil, false
	}
	return e.data, true
}

func (c *staleCache) put(key string, data []byte, staleness time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.entries) >= c.maxEntries {
		now := c.now()
		for k, e := range c.entries {
			if now.Sub(e.fetched) >= c.ttl {
				delete(c.entries, k)
			}
		}
		if len(c.entries) >= c.maxEntries {
			clear(c.entries) // all fresh: a burst of distinct keys; start over
		}
	}
	c.entries[key] = cacheEntry{data: data, fetched: c.now(), staleness: staleness}
}

// invalidate drops exact keys and every key with one of the prefixes
// ending in '*'.
func (c *staleCache) invalidate(keys ...string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, k := range keys {
		if p, ok := strings.CutSuffix(k, "*"); ok {
			for ek := range c.entries {
				if strings.HasPrefix(ek, p) {
					delete(c.entries, ek)
				}
			}
			continue
		}
		delete(c.entries, k)
	}
}

func (c *staleCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}
