package edge

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Route is where a database lives, as the edge believes it.
type Route struct {
	DatabaseUUID string `json:"d"`
	ObjectID     string `json:"o"`
	HostAddress  string `json:"h"`
	AccountID    string `json:"a"`
	State        string `json:"s"` // fsm.StateActive | fsm.StateDeleted
	Generation   int64  `json:"g"` // routing generation; the cache never goes backwards
	// InvalidUntil is set on a tombstone left by Invalidate: the route at
	// Generation is known bad; until InvalidUntil (Unix nanoseconds) only a
	// route with a higher generation may replace it.
	InvalidUntil int64 `json:"x,omitempty"`
}

func (r Route) tombstone() bool { return r.InvalidUntil != 0 }

var (
	routesBucket = []byte("routes")
	// deletedAtBucket maps the UUID of every route stored as deleted to
	// when it was (Unix ns, 8 bytes big-endian): what ExpireDeleted reads.
	deletedAtBucket = []byte("deleted_at")
)

// RouteCache is the edge's local routing table: a bbolt file mapping database
// UUID to Route, plus an in-memory set of negative entries (UUIDs the catalog
// did not know) with a short TTL.
//
// Contract: every update goes through Put or Invalidate, which never move a
// UUID's route to a lower routing generation, so reordered updates (a slow
// miss fill racing a newer feed entry) cannot resurrect an old route. Methods
// are safe for concurrent use. Reads are bbolt read transactions (mmap, no
// lock contention with each other); writes are plain bbolt updates (cheap
// with NoSync: no fsync to amortise, so no bolt.Batch delay on a miss fill).
//
// In front of the file, a bounded in-memory copy of the routes read
// recently (memo) answers repeated lookups of a database without a bbolt
// read transaction (one per query was ~4% of the edge's CPU). It never
// answers differently from the file: every write forgets the routes it
// touched once it has committed, and a route read from the file is only
// remembered if no write committed since the read began (memoEpoch).
type RouteCache struct {
	db          *bolt.DB
	now         func() time.Time
	negativeTTL time.Duration
	tombTTL     time.Duration
	maxNegative int

	mu       sync.Mutex
	negative map[string]time.Time // uuid → expiry

	memoMu    sync.RWMutex
	memo      map[string]Route // live (non-tombstone) routes as stored in the file
	memoEpoch uint64           // +1 after every committed write (under memoMu)
	maxMemo   int

	// Staged routes (routestage.go), under memoMu: the routes of new
	// databases not yet in the file, and the flush due for them.
	staged      map[string]Route
	stageLinger time.Duration // < 0: Stage is Put
	flushArmed  bool
	flushTimer  *time.Timer
	flushWG     sync.WaitGroup // flush timers armed and not yet stopped or done
	closed      bool
	log         *slog.Logger
	writeMu     sync.Mutex // one update at a time (routestage.go)

	hits, misses, negHits atomic.Int64

	book hostBook // the object host addresses known (hostbook.go)
}

// defaultMaxMemo bounds RouteCache.memo; a full memo starts over empty.
const defaultMaxMemo = 1 << 15

// RouteCacheOptions configures a RouteCache.
type RouteCacheOptions struct {
	NegativeTTL  time.Duration    // default 2s
	TombstoneTTL time.Duration    // default 5s
	MaxNegative  int              // default 100000
	Now          func() time.Time // default time.Now
	// StageLinger is how long a staged route (Stage: a new database's)
	// may wait in memory before it is written to the file; default 20ms,
	// < 0: Stage writes at once (Put).
	StageLinger time.Duration
	Logger      *slog.Logger // default: discard
}

// OpenRouteCache opens (creating) the cache file at path. A file that bbolt
// cannot open is removed and recreated: it is a cache, the catalog holds the
// truth.
func OpenRouteCache(path string, o RouteCacheOptions) (*RouteCache, error) {
	if o.NegativeTTL <= 0 {
		o.NegativeTTL = 2 * time.Second
	}
	if o.TombstoneTTL <= 0 {
		o.TombstoneTTL = 5 * time.Second
	}
	if o.MaxNegative <= 0 {
		o.MaxNegative = 100_000
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.StageLinger == 0 {
		o.StageLinger = defaultStageLinger
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("route cache dir: %w", err)
	}
	// NoSync: the file is a cache of the catalog. A power loss can at worst
	// lose or garble recent entries; a garbled route is refused by the object
	// host (421, database/account mismatch) and repaired from the catalog, and
	// an unopenable file is recreated below. Paying an fsync per miss fill
	// would make a mass purge far more expensive.
	opts := &bolt.Options{Timeout: 2 * time.Second, NoSync: true}
	db, err := bolt.Open(path, 0o600, opts)
	if err != nil && !errors.Is(err, bolt.ErrTimeout) {
		_ = os.Remove(path)
		db, err = bolt.Open(path, 0o600, opts)
	}
	if err != nil {
		return nil, fmt.Errorf("open route cache: %w", err)
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		if _, err := tx.CreateBucketIfNotExists(routesBucket); err != nil {
			return err
		}
		if _, err := tx.CreateBucketIfNotExists(deletedAtBucket); err != nil {
			return err
		}
		if _, err := tx.CreateBucketIfNotExists(tokensBucket); err != nil {
			return err
		}
		_, err := tx.CreateBucketIfNotExists(feedBucket)
		return err
	}); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("init route cache: %w", err)
	}
	c := &RouteCache{
		db: db, now: o.Now, negativeTTL: o.NegativeTTL, tombTTL: o.TombstoneTTL,
		maxNegative: o.MaxNegative, negative: make(map[string]time.Time),
		memo: make(map[string]Route), maxMemo: defaultMaxMemo,
		staged: make(map[string]Route), stageLinger: o.StageLinger, log: o.Logger,
	}
	if err := db.Update(c.loadHosts); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("init route cache: %w", err)
	}
	return c, nil
}

// Close writes the staged routes and closes the file.
func (c *RouteCache) Close() error {
	c.memoMu.Lock()
	c.closed = true
	t := c.flushTimer
	c.memoMu.Unlock()
	if t != nil && t.Stop() {
		c.flushWG.Done() // its function will not run
	}
	c.flushWG.Wait()
	c.flushStaged()
	return c.db.Close()
}

// Lookup results.
type lookupResult int

const (
	cacheMiss lookupResult = iota
	cacheHit
	cacheNegative
)

// Get returns the cached route of uuid. A tombstone counts as a miss.
func (c *RouteCache) Get(uuid string) (Route, lookupResult) {
	c.memoMu.RLock()
	r, ok := c.memo[uuid]
	if !ok {
		r, ok = c.staged[uuid]
	}
	epoch := c.memoEpoch
	c.memoMu.RUnlock()
	if ok {
		c.hits.Add(1)
		return r, cacheHit
	}
	r, ok = c.read(uuid)
	if ok && !r.tombstone() {
		c.remember(r, epoch)
	}
	if ok && !r.tombstone() {
		c.hits.Add(1)
		return r, cacheHit
	}
	if !ok {
		c.mu.Lock()
		exp, neg := c.negative[uuid]
		if neg && !c.now().Before(exp) {
			delete(c.negative, uuid)
			neg = false
		}
		c.mu.Unlock()
		if neg {
			c.negHits.Add(1)
			return Route{}, cacheNegative
		}
	}
	c.misses.Add(1)
	return Route{}, cacheMiss
}

// remember puts r (read from the file by a lookup that began at epoch)
// into the memo, unless a write has committed since: it may have changed r.
func (c *RouteCache) remember(r Route, epoch uint64) {
	c.memoMu.Lock()
	if c.memoEpoch == epoch {
		if len(c.memo) >= c.maxMemo {
			c.memo = make(map[string]Route)
		}
		c.memo[r.DatabaseUUID] = r
	}
	c.memoMu.Unlock()
}

// forget is called after every write to the routes bucket, committed or
// not: the routes of uuids leave the memo (all of them when all is set),
// and lookups that read the file before the write may not remember what
// they read.
func (c *RouteCache) forget(all bool, uuids ...string) {
	c.memoMu.Lock()
	c.memoEpoch++
	if all {
		c.memo = make(map[string]Route)
	} else {
		for _, u := range uuids {
			delete(c.memo, u)
		}
	}
	c.memoMu.Unlock()
}

func (c *RouteCache) read(uuid string) (Route, bool) {
	var r Route
	var ok bool
	_ = c.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(routesBucket).Get([]byte(uuid))
		if v != nil {
			var err error
			r, err = decodeRoute(v) // copies: v is only valid inside the tx
			ok = err == nil
		}
		return nil
	})
	return r, ok
}

// accepts decides whether next may replace cur. The order is: higher
// generation wins; at equal generation a live route may become deleted but
// never the reverse, and a tombstone blocks its own generation until it
// expires.
func (c *RouteCache) accepts(cur Route, next Route) bool {
	switch {
	case next.Generation > cur.Generation:
		return true
	case next.Generation < cur.Generation:
		return false
	case cur.tombstone():
		return c.now().UnixNano() >= cur.InvalidUntil
	case cur.State == next.State:
		return true // refresh (e.g. host address repaired at the same generation)
	default:
		return next.State != "active" // active → deleted only
	}
}

// Put stores r unless the cache already holds a newer route for its UUID. It
// reports whether r was stored. A stored route clears any negative entry.
func (c *RouteCache) Put(r Route) (bool, error) {
	stored := false
	err := c.update(func(tx *bolt.Tx) error {
		var err error
		stored, err = c.putTx(tx.Bucket(routesBucket), r)
		return err
	})
	c.forget(false, r.DatabaseUUID)
	if err != nil {
		return false, fmt.Errorf("route cache put: %w", err)
	}
	if stored {
		c.mu.Lock()
		delete(c.negative, r.DatabaseUUID)
		c.mu.Unlock()
		c.noteRouteHosts(r)
	}
	return stored, nil
}

// PutMany is Put for several routes in one transaction (the creates that
// finished together, createbatch.go): stored[i] reports whether rs[i] was
// stored. One bbolt commit instead of one per route — each commit, even
// without an fsync, writes its dirty pages and the meta page, and holds the
// file's one writer lock.
func (c *RouteCache) PutMany(rs []Route) ([]bool, error) {
	stored := make([]bool, len(rs))
	err := c.update(func(tx *bolt.Tx) error {
		b := tx.Bucket(routesBucket)
		for i, r := range rs {
			var err error
			if stored[i], err = c.putTx(b, r); err != nil {
				return err
			}
		}
		return nil
	})
	uuids := make([]string, len(rs))
	for i, r := range rs {
		uuids[i] = r.DatabaseUUID
	}
	c.forget(false, uuids...)
	if err != nil {
		return make([]bool, len(rs)), fmt.Errorf("route cache put: %w", err)
	}
	c.mu.Lock()
	for i, r := range rs {
		if stored[i] {
			delete(c.negative, r.DatabaseUUID)
		}
	}
	c.mu.Unlock()
	for i, r := range rs {
		if stored[i] {
			c.noteRouteHosts(r)
		}
	}
	return stored, nil
}

// putTx is Put inside a write transaction: the one place a route is stored.
func (c *RouteCache) putTx(b *bolt.Bucket, r Route) (bool, error) {
	r.InvalidUntil = 0
	if v := b.Get([]byte(r.DatabaseUUID)); v != nil {
		if cur, err := decodeRoute(v); err == nil && !c.accepts(cur, r) {
			return false, nil
		}
	}
	key := []byte(r.DatabaseUUID)
	if d := b.Tx().Bucket(deletedAtBucket); d != nil {
		var err error
		switch {
		case r.State == "active":
			err = d.Delete(key)
		case d.Get(key) == nil:
			err = d.Put(key, binary.BigEndian.AppendUint64(nil, uint64(c.now().UnixNano())))
		}
		if err != nil {
			return false, err
		}
	}
	return true, b.Put(key, encodeRoute(r))
}

// ExpireDeleted drops the deleted routes stored more than retention ago
// (at most max per call, oldest first is not guaranteed), so a cache does not
// grow with every database ever deleted. A lookup of an expired one misses
// and asks the catalog (bounded fallback), which answers "deleted" or "not
// found" again; the route feed's tombstones are long compacted by then.
// Deleted routes stored before this bookkeeping existed carry no time and
// are kept.
func (c *RouteCache) ExpireDeleted(retention time.Duration, max int) (int, error) {
	cutoff := uint64(c.now().Add(-retention).UnixNano())
	n := 0
	err := c.update(func(tx *bolt.Tx) error {
		d, b := tx.Bucket(deletedAtBucket), tx.Bucket(routesBucket)
		var expired [][]byte
		cur := d.Cursor()
		for k, v := cur.First(); k != nil && len(expired) < max; k, v = cur.Next() {
			if len(v) == 8 && binary.BigEndian.Uint64(v) < cutoff {
				expired = append(expired, append([]byte(nil), k...))
			}
		}
		for _, k := range expired {
			if v := b.Get(k); v != nil {
				if r, err := decodeRoute(v); err == nil && r.State == "active" {
					continue // revived at a newer generation meanwhile (putTx cleared it; defensive)
				}
				if err := b.Delete(k); err != nil {
					return err
				}
			}
			if err := d.Delete(k); err != nil {
				return err
			}
			n++
		}
		return nil
	})
	c.forget(true)
	if err != nil {
		return 0, fmt.Errorf("route cache expire: %w", err)
	}
	return n, nil
}

// Invalidate marks the route of uuid at generation gen as known bad (an object
// host refused it). Routes newer than gen are untouched. The entry becomes a
// tombstone: lookups miss, and only a route with a higher generation (or any
// route once the tombstone expires) replaces it.
func (c *RouteCache) Invalidate(uuid string, gen int64) error {
	until := c.now().Add(c.tombTTL).UnixNano()
	err := c.update(func(tx *bolt.Tx) error {
		b := tx.Bucket(routesBucket)
		v := b.Get([]byte(uuid))
		if v == nil {
			return nil
		}
		cur, err := decodeRoute(v)
		if err == nil && cur.Generation > gen {
			return nil
		}
		if err != nil {
			return b.Delete([]byte(uuid)) // unreadable entry: drop it
		}
		cur.InvalidUntil = until
		return b.Put([]byte(uuid), encodeRoute(cur))
	})
	c.forget(false, uuid)
	if err != nil {
		return fmt.Errorf("route cache invalidate: %w", err)
	}
	return nil
}

// PutNegative records that the catalog does not know uuid, for NegativeTTL.
// It is ignored when a route is cached. When the set is full an arbitrary
// entry is evicted (map iteration order), which only costs a catalog read.
func (c *RouteCache) PutNegative(uuid string) {
	if _, ok := c.stagedRoute(uuid); ok {
		return
	}
	if _, ok := c.read(uuid); ok {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.negative) >= c.maxNegative {
		now := c.now()
		for k, exp := range c.negative {
			if !now.Before(exp) || len(c.negative) >= c.maxNegative {
				delete(c.negative, k)
			}
			if len(c.negative) < c.maxNegative/2 {
				break
			}
		}
	}
	c.negative[uuid] = c.now().Add(c.negativeTTL)
}

// Purge drops every route, every negative entry and the route feed's stored
// positions (operator action, and the purge test: every subsequent lookup is
// a miss that falls back to the catalog until the feed, if one runs, has
// re-read the topic; Server.Purge rewinds it).
func (c *RouteCache) Purge() error {
	err := c.update(func(tx *bolt.Tx) error { // the staged routes go with the rest
		for _, name := range [][]byte{routesBucket, deletedAtBucket, feedBucket} {
			if err := tx.DeleteBucket(name); err != nil {
				return err
			}
			if _, err := tx.CreateBucket(name); err != nil {
				return err
			}
		}
		return nil
	})
	c.forget(true)
	c.mu.Lock()
	c.negative = make(map[string]time.Time)
	c.mu.Unlock()
	if err != nil {
		return fmt.Errorf("route cache purge: %w", err)
	}
	return nil
}

// Len returns the number of stored routes (tombstones included); it
// writes the staged routes first.
func (c *RouteCache) Len() int {
	c.flushStaged()
	n := 0
	_ = c.db.View(func(tx *bolt.Tx) error {
		n = tx.Bucket(routesBucket).Stats().KeyN
		return nil
	})
	return n
}
