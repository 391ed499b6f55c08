// Package groupwait is the bounded wait of a group commit, shared by the
// catalog client's write coalescing (raftmeta/coalesce.go) and the edge's
// grouping batchers (edge/batcher.go): a slot holder whose batch just came
// back waits, with its lock released, for the callers it expects to queue
// again, never longer than a bound.
package groupwait

import (
	"sync"
	"time"
)

// Locked waits until done() holds, re-checking it (under mu) each time
// wake is signalled, for at most bound, and no longer once stop is closed.
// mu is held on entry and on return, released while waiting. done is
// checked first, so a wait whose condition already holds costs nothing.
func Locked(mu *sync.Mutex, wake <-chan struct{}, bound time.Duration, stop <-chan struct{}, done func() bool) {
	if done() {
		return
	}
	t := time.NewTimer(bound)
	defer t.Stop()
	for !done() {
		mu.Unlock()
		select {
		case <-wake:
		case <-t.C:
			mu.Lock()
			return
		case <-stop:
			mu.Lock()
			return
		}
		mu.Lock()
	}
}
