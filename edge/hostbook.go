package edge

import (
	"fmt"
	"sort"
	"sync"
	"sync/atomic"

	bolt "go.etcd.io/bbolt"
)

// The host book: the object host addresses this edge knows, kept in the
// route cache's bbolt file (bucket "hosts": address → empty value) so that
// an edge restarted while the catalog is down still knows whom to ask in
// the last-resort route lookup (hostroute.go). Addresses only: every call
// to a host is still authenticated by mutual TLS, so an address that is
// wrong or stale costs a failed request, never trust.
//
// Sources: the catalog's host list when placement reads it (every
// registered host, any state; it replaces the book, dropping hosts no
// longer registered and addresses a garbled route put there), and every
// route stored in the cache (miss fills, the route feed, creates, the
// hosts' own answers) or used by a query. Purge keeps the book: it drops
// routes, not hosts.
//
// Crash safety: the file is NoSync like the routes; a crash may lose the
// latest additions, which the next route or host list puts back. Each
// change is one bbolt transaction, so the book is never half-written.
var hostsBucket = []byte("hosts")

// maxKnownHosts bounds the book (a garbled cached route could otherwise
// add any number of addresses).
const maxKnownHosts = 1024

// hostBook is the in-memory copy of the bucket. Reads are lock-free (one
// atomic load and a map lookup on the query path); changes take mu, write
// the file, then publish a new map.
type hostBook struct {
	mu  sync.Mutex
	set atomic.Pointer[map[string]struct{}]
}

// loadHosts reads the bucket into the book (at open).
func (c *RouteCache) loadHosts(tx *bolt.Tx) error {
	b, err := tx.CreateBucketIfNotExists(hostsBucket)
	if err != nil {
		return err
	}
	m := make(map[string]struct{})
	err = b.ForEach(func(k, _ []byte) error {
		if len(m) < maxKnownHosts && len(k) > 0 {
			m[string(k)] = struct{}{}
		}
		return nil
	})
	c.book.set.Store(&m)
	return err
}

// Hosts returns the addresses in the book, sorted.
func (c *RouteCache) Hosts() []string {
	m := c.book.set.Load()
	if m == nil {
		return nil
	}
	out := make([]string, 0, len(*m))
	for a := range *m {
		out = append(out, a)
	}
	sort.Strings(out)
	return out
}

// NoteHost adds addr to the book (and the file) unless it is there, the
// address is empty or the book is full. The common case — an address
// already known — costs one atomic load and a map lookup.
func (c *RouteCache) NoteHost(addr string) error {
	if addr == "" {
		return nil
	}
	if m := c.book.set.Load(); m != nil {
		if _, ok := (*m)[addr]; ok {
			return nil
		}
	}
	c.book.mu.Lock()
	defer c.book.mu.Unlock()
	old := *c.book.set.Load()
	if _, ok := old[addr]; ok || len(old) >= maxKnownHosts {
		return nil
	}
	if err := c.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(hostsBucket).Put([]byte(addr), nil)
	}); err != nil {
		return fmt.Errorf("host book: %w", err)
	}
	next := make(map[string]struct{}, len(old)+1)
	for a := range old {
		next[a] = struct{}{}
	}
	next[addr] = struct{}{}
	c.book.set.Store(&next)
	return nil
}

// noteRouteHosts notes the host of every route in rs (after a write).
func (c *RouteCache) noteRouteHosts(rs ...Route) {
	for _, r := range rs {
		_ = c.NoteHost(r.HostAddress) // best effort: the next route notes it again
	}
}

// ReplaceHosts makes the book exactly addrs (the catalog's list of
// registered hosts; at most maxKnownHosts of them). Nothing is written
// when the book already holds that set.
func (c *RouteCache) ReplaceHosts(addrs []string) error {
	next := make(map[string]struct{}, len(addrs))
	for _, a := range addrs {
		if a != "" && len(next) < maxKnownHosts {
			next[a] = struct{}{}
		}
	}
	c.book.mu.Lock()
	defer c.book.mu.Unlock()
	old := *c.book.set.Load()
	if len(old) == len(next) {
		same := true
		for a := range next {
			if _, ok := old[a]; !ok {
				same = false
				break
			}
		}
		if same {
			return nil
		}
	}
	if err := c.db.Update(func(tx *bolt.Tx) error {
		if err := tx.DeleteBucket(hostsBucket); err != nil {
			return err
		}
		b, err := tx.CreateBucket(hostsBucket)
		if err != nil {
			return err
		}
		for a := range next {
			if err := b.Put([]byte(a), nil); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return fmt.Errorf("host book: %w", err)
	}
	c.book.set.Store(&next)
	return nil
}
