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
	LockedIdle(mu, wake, bound, 0, stop, done)
}

// LockedIdle is Locked that also ends once idle has passed with no wake —
// since the wait began, or since the last wake (idle ≤ 0: never). The
// callers a group commit waits for come back close together when they are
// the ones it just answered (a closed loop: each sends again as soon as it
// has its answer); independent arrivals (an open loop, moderate load) are
// spaced out, and waiting the whole bound for them only adds latency. The
// idle gap ends such a wait after idle instead of bound.
//
// Cost: one timer for the wait, re-armed only when it fires early (never
// once per wake: arming a timer per wake interrupts the runtime's poller).
func LockedIdle(mu *sync.Mutex, wake <-chan struct{}, bound, idle time.Duration, stop <-chan struct{}, done func() bool) {
	if done() {
		return
	}
	start := time.Now()
	end := start.Add(bound)
	first := bound
	if idle > 0 && idle < bound {
		first = idle
	}
	t := time.NewTimer(first)
	defer t.Stop()
	last := start // the last wake (or the start)
	for !done() {
		mu.Unlock()
		select {
		case <-wake:
			if idle > 0 {
				last = time.Now()
			}
		case now := <-t.C:
			if idle <= 0 || !now.Before(end) {
				mu.Lock()
				return
			}
			// An idle timer: ended unless a wake came since it was armed.
			next := last.Add(idle)
			if !now.Before(next) {
				mu.Lock()
				return
			}
			if next.After(end) {
				next = end
			}
			t.Reset(next.Sub(now))
		case <-stop:
			mu.Lock()
			return
		}
		mu.Lock()
	}
}
