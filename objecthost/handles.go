package objecthost

import (
	"container/list"
	"io"
	"sync"
)

// handleCache keeps at most cap open database handles, least recently used
// evicted first. A handle is reference-counted: acquire pins it, release
// unpins it, and a pinned handle is never closed — when every open handle is
// pinned the cache runs over its cap and shrinks back as requests release.
// A handle being opened or closed is visible to acquirers, who wait for it,
// so one file never has two live handles (two handles would mean two writers
// on one SQLite file).
//
// Idle databases cost nothing here: no goroutine and no file descriptor
// until acquired.
type handleCache[T io.Closer] struct {
	mu      sync.Mutex
	cap     int
	open    func(id string) (T, error)
	entries map[string]*handle[T]
	lru     *list.List // of *handle[T]; front = most recently used
	closing map[string]chan struct{}
	onOpen  func(open int) // gauge hook, called under mu
	// closers tracks background closes of evicted handles: a request that
	// evicts another database's handle does not pay for its close (a WAL
	// checkpoint, possibly an fsync). closeEverything waits for them.
	closers sync.WaitGroup
	shut    bool // closeEverything ran: acquire fails with ErrClosed
}

type handle[T io.Closer] struct {
	id     string
	db     T
	err    error
	ready  chan struct{} // closed when the open finished (db or err set)
	refs   int
	elem   *list.Element
	doomed chan struct{} // non-nil: close when refs drops to zero, then close this
}

func newHandleCache[T io.Closer](capacity int, open func(string) (T, error), onOpen func(int)) *handleCache[T] {
	if capacity < 1 {
		capacity = 1
	}
	if onOpen == nil {
		onOpen = func(int) {}
	}
	return &handleCache[T]{cap: capacity, open: open, entries: map[string]*handle[T]{}, lru: list.New(), closing: map[string]chan struct{}{}, onOpen: onOpen}
}

// acquire returns a pinned handle for id, opening it if needed. The caller
// must release it exactly once.
func (c *handleCache[T]) acquire(id string) (*handle[T], error) {
	for {
		c.mu.Lock()
		if c.shut {
			c.mu.Unlock()
			return nil, ErrClosed
		}
		if h := c.entries[id]; h != nil {
			h.refs++
			c.lru.MoveToFront(h.elem)
			c.mu.Unlock()
			<-h.ready
			if h.err != nil {
				c.release(h)
				return nil, h.err
			}
			return h, nil
		}
		if ch := c.closing[id]; ch != nil {
			c.mu.Unlock()
			<-ch
			continue
		}
		h := &handle[T]{id: id, ready: make(chan struct{}), refs: 1}
		h.elem = c.lru.PushFront(h)
		c.entries[id] = h
		victims := c.evictLocked()
		c.onOpen(len(c.entries))
		c.mu.Unlock()
		c.closeInBackground(victims)

		db, err := c.open(id)
		h.db, h.err = db, err
		close(h.ready)
		if err != nil {
			c.release(h)
			return nil, err
		}
		return h, nil
	}
}

// release unpins h; a doomed or over-cap handle is closed once unpinned.
func (c *handleCache[T]) release(h *handle[T]) {
	c.mu.Lock()
	h.refs--
	var victims []*handle[T]
	if h.refs == 0 && h.doomed != nil {
		victims = append(victims, h)
	} else if h.refs == 0 && h.err != nil {
		// A failed open leaves no handle behind: the next acquire retries.
		c.removeLocked(h)
	}
	victims = append(victims, c.evictLocked()...)
	c.onOpen(len(c.entries))
	c.mu.Unlock()
	c.closeInBackground(victims)
}

func (c *handleCache[T]) closeInBackground(victims []*handle[T]) {
	if len(victims) == 0 {
		return
	}
	c.closers.Add(1)
	go func() {
		defer c.closers.Done()
		c.closeAll(victims)
	}()
}

// evictLocked removes unpinned handles from the LRU tail while over cap and
// registers them as closing. The caller closes them after unlocking.
func (c *handleCache[T]) evictLocked() []*handle[T] {
	var victims []*handle[T]
	for e := c.lru.Back(); e != nil && len(c.entries) > c.cap; {
		h := e.Value.(*handle[T])
		prev := e.Prev()
		if h.refs == 0 {
			c.removeLocked(h)
			h.doomed = make(chan struct{})
			c.closing[h.id] = h.doomed
			victims = append(victims, h)
		}
		e = prev
	}
	return victims
}

func (c *handleCache[T]) removeLocked(h *handle[T]) {
	if c.entries[h.id] == h {
		delete(c.entries, h.id)
		c.lru.Remove(h.elem)
	}
}

func (c *handleCache[T]) closeAll(victims []*handle[T]) {
	for _, h := range victims {
		if h.err == nil {
			_ = h.db.Close()
		}
		c.mu.Lock()
		if c.closing[h.id] == h.doomed {
			delete(c.closing, h.id)
		}
		c.mu.Unlock()
		close(h.doomed)
	}
}

// evict closes id's handle as soon as no request uses it and returns a
// channel closed once the file has no open handle (immediately if none).
// New acquirers of id wait for the close and then open a fresh handle.
func (c *handleCache[T]) evict(id string) <-chan struct{} {
	c.mu.Lock()
	if ch := c.closing[id]; ch != nil {
		c.mu.Unlock()
		return ch
	}
	h := c.entries[id]
	if h == nil {
		c.mu.Unlock()
		ch := make(chan struct{})
		close(ch)
		return ch
	}
	c.removeLocked(h)
	h.doomed = make(chan struct{})
	c.closing[id] = h.doomed
	ch := h.doomed
	var victims []*handle[T]
	if h.refs == 0 {
		// refs cannot grow again (h left the map under mu), and an unpinned
		// handle has finished opening.
		victims = append(victims, h)
	}
	c.onOpen(len(c.entries))
	c.mu.Unlock()
	c.closeAll(victims)
	return ch
}

// len returns the number of handles in the map (open, opening or pinned).
func (c *handleCache[T]) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}

// closeEverything closes every handle, waiting for pinned ones to be
// released; later acquires fail with ErrClosed.
func (c *handleCache[T]) closeEverything() {
	c.mu.Lock()
	c.shut = true
	ids := make([]string, 0, len(c.entries))
	for id := range c.entries {
		ids = append(ids, id)
	}
	c.mu.Unlock()
	for _, id := range ids {
		<-c.evict(id)
	}
	c.closers.Wait()
}
