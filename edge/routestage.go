package edge

import (
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Staged routes: the routes of the databases this edge has just created,
// answered from memory at once and written to the file a little later,
// many per transaction.
//
// Why: a create used to write its route through to the file before its
// client was answered (one bbolt transaction per group of creates that
// finished together, RouteCache.PutMany). Even with NoSync each commit
// materialises and rewrites the path from the root to the leaf — with
// tens of thousands of routes a branch node of thousands of keys — and
// its meta page: 19% of the edge's CPU and 48% of the bytes it allocated
// in a create phase at 16 clients (docs/benchmarks.md, "The route of a
// create, staged"), at about 8 routes per commit.
//
// Contract (Stage):
//   - A staged route answers Get (and so every query) from the moment
//     Stage returns, exactly as a Put would have: "the route is readable by
//     the next query the moment the create is answered" still holds.
//   - It is written to the file through putTx (Put's ordering rule) by the
//     first write transaction that begins after it was staged — the
//     flush that Stage arms (StageLinger later), or any other write of the
//     cache (Put, PutMany, Invalidate, the route feed's applyFeed,
//     ExpireDeleted), each of which writes the staged routes first, in its
//     own transaction. So every later write to a route is ordered after its
//     staged version, as if the staged route had been Put when staged: an
//     Invalidate or a feed record for a staged database never lands under
//     it. Purge drops the staged routes with the others.
//   - Stage is only for a route whose UUID the file cannot hold yet (a
//     database this edge just created, a fresh UUID v7). A staged route is
//     answered before the file; for a fresh UUID the file has nothing to
//     contradict it with, since anything that writes the UUID writes the
//     staged route first.
//   - What a crash of the edge process loses: the routes staged within
//     the last StageLinger (20 ms by default). The file is a cache written
//     with NoSync (a power loss already loses recent routes); a lost
//     route is a cache miss, filled from the catalog (bounded fallback),
//     the route feed (the host publishes it on confirm) or, with the
//     catalog unavailable, the object hosts (hostroute.go).
//   - Close writes what is staged before closing the file.
//   - A flush that fails (the file's write failed) drops its routes from
//     memory and is logged: as a failed write-through was before.

// defaultStageLinger is RouteCacheOptions.StageLinger's default: as long
// as the confirms' linger (the confirm is what makes the host publish the
// route on the feed), so at 2,000 creates/s a flush holds about 40.
const defaultStageLinger = 20 * time.Millisecond

// maxStaged bounds the staged routes: Stage writes them at once (on the
// caller's goroutine) when this many wait.
const maxStaged = 4096

// Stage makes r readable at once and writes it to the file within
// StageLinger (see "Staged routes"). With StageLinger < 0 it is Put.
func (c *RouteCache) Stage(r Route) error {
	if c.stageLinger < 0 {
		_, err := c.Put(r)
		return err
	}
	r.InvalidUntil = 0
	c.memoMu.Lock()
	if c.closed {
		c.memoMu.Unlock()
		return fmt.Errorf("route cache stage: %w", bolt.ErrDatabaseNotOpen)
	}
	c.staged[r.DatabaseUUID] = r
	full := len(c.staged) >= maxStaged
	if !full {
		c.armFlushLocked()
	}
	c.memoMu.Unlock()
	if full {
		c.flushStaged()
	}
	return nil
}

// armFlushLocked makes sure a flush of the staged routes is due within
// StageLinger (under memoMu). The timer's goroutine is waited for by Close.
func (c *RouteCache) armFlushLocked() {
	if c.flushArmed || c.closed {
		return
	}
	c.flushArmed = true
	c.flushWG.Add(1)
	c.flushTimer = time.AfterFunc(c.stageLinger, func() {
		defer c.flushWG.Done()
		c.flushStaged()
	})
}

// flushStaged writes the staged routes to the file (update with nothing
// else to do). A failure is logged; it drops them (update).
func (c *RouteCache) flushStaged() {
	if err := c.update(nil); err != nil {
		c.log.Warn("route cache: writing the routes of new databases failed", "err", err)
	}
}

// update is the cache's write transaction for anything that touches
// routes: it writes the staged routes first (through putTx), then runs fn
// (nil: nothing more), in one transaction. Once it has ended, the staged
// routes it wrote leave memory (unless one was staged again meanwhile)
// and the memo forgets them, under the memo's lock: a lookup finds each
// either staged or in the file. When fn itself fails the transaction is
// rolled back and the staged routes stay for the next write; any other
// failure (writing them, the commit) drops them, as a failed write-through
// was dropped before: a cache fill is not retried either.
//
// One update runs at a time, from taking the staged routes to letting
// them go: a staged route is written by exactly one transaction, so a
// later write of its UUID (a same-generation refresh, say) is never
// overwritten by a second copy of it. bbolt has one writer anyway.
func (c *RouteCache) update(fn func(tx *bolt.Tx) error) error {
	c.writeMu.Lock()
	written, err := c.updateLocked(fn)
	c.writeMu.Unlock()
	c.noteRouteHosts(written...)
	return err
}

// updateLocked is update under writeMu; it returns the staged routes it
// stored (whose hosts the book notes, as after Put).
func (c *RouteCache) updateLocked(fn func(tx *bolt.Tx) error) ([]Route, error) {
	c.memoMu.Lock()
	var st []Route
	if len(c.staged) > 0 {
		st = make([]Route, 0, len(c.staged))
		for _, r := range c.staged {
			st = append(st, r)
		}
	}
	c.flushArmed = false // what is staged from now on arms its own flush
	c.memoMu.Unlock()
	if len(st) == 0 {
		if fn == nil {
			return nil, nil // a flush with nothing staged: no empty commit
		}
		return nil, c.db.Update(fn)
	}
	stored := make([]bool, len(st))
	var fnErr error
	err := c.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(routesBucket)
		for i, r := range st {
			var err error
			if stored[i], err = c.putTx(b, r); err != nil {
				return err
			}
		}
		if fn != nil {
			fnErr = fn(tx)
			return fnErr
		}
		return nil
	})
	c.memoMu.Lock()
	if fnErr != nil {
		c.armFlushLocked() // rolled back: they stay staged
		c.memoMu.Unlock()
		return nil, err
	}
	c.memoEpoch++
	for _, r := range st {
		if cur, ok := c.staged[r.DatabaseUUID]; ok && cur == r {
			delete(c.staged, r.DatabaseUUID)
		}
		delete(c.memo, r.DatabaseUUID)
	}
	c.memoMu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("route cache: writing staged routes: %w", err)
	}
	written := st[:0]
	for i, r := range st {
		if stored[i] {
			written = append(written, r)
		}
	}
	return written, nil
}

// stagedRoute returns the staged route of uuid.
func (c *RouteCache) stagedRoute(uuid string) (Route, bool) {
	c.memoMu.RLock()
	r, ok := c.staged[uuid]
	c.memoMu.RUnlock()
	return r, ok
}
