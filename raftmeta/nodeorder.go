package raftmeta

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// nodeOrder is the Client's view of which catalog nodes to try first. Stale
// reads are spread round-robin over every node that is not demoted, so no
// single node (the first listed, say) carries all of them and one hung node
// costs only the requests that were already on their way to it. A node that
// timed out or refused the connection is demoted for a while (demoteFor); one
// that answered "too stale" or "not ready" for a shorter while (demoteBrief).
// Demoted nodes are still tried, last, so demotion reorders and never makes
// a reachable catalog unreachable. Safe for concurrent use.
type nodeOrder struct {
	addrs       []string
	now         func() time.Time
	demoteFor   time.Duration
	demoteBrief time.Duration
	rr          atomic.Uint64

	mu      sync.Mutex
	demoted map[string]time.Time // addr → demoted until
}

func newNodeOrder(addrs []string, now func() time.Time, demoteFor time.Duration) *nodeOrder {
	return &nodeOrder{addrs: addrs, now: now, demoteFor: demoteFor, demoteBrief: max(demoteFor/5, time.Millisecond),
		demoted: map[string]time.Time{}}
}

// demote moves addr to the back of every order for d.
func (o *nodeOrder) demote(addr string, d time.Duration) {
	if d <= 0 {
		return
	}
	o.mu.Lock()
	o.demoted[addr] = o.now().Add(d)
	o.mu.Unlock()
}

// restore clears addr's demotion after it answered.
func (o *nodeOrder) restore(addr string) {
	o.mu.Lock()
	if _, ok := o.demoted[addr]; ok {
		delete(o.demoted, addr)
	}
	o.mu.Unlock()
}

func (o *nodeOrder) isDemoted(addr string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	until, ok := o.demoted[addr]
	if !ok {
		return false
	}
	if !o.now().Before(until) {
		delete(o.demoted, addr)
		return false
	}
	return true
}

// order returns the nodes to try: first (when not "" and not demoted), then
// the healthy nodes starting at a rotating offset, then the demoted ones.
// With spread=false the healthy nodes keep the configured order.
func (o *nodeOrder) order(first string, spread bool) []string {
	n := len(o.addrs)
	start := 0
	if spread {
		start = int(o.rr.Add(1) % uint64(n))
	}
	out := make([]string, 0, n+1)
	var late []string
	if first != "" {
		if o.isDemoted(first) {
			late = append(late, first)
		} else {
			out = append(out, first)
		}
	}
	for i := 0; i < n; i++ {
		a := o.addrs[(start+i)%n]
		if a == first {
			continue
		}
		if o.isDemoted(a) {
			late = append(late, a)
		} else {
			out = append(out, a)
		}
	}
	return append(out, late...)
}

// orderAvoiding is order("", true) with avoid (when not "") moved to the
// end, behind the demoted nodes too: a follower that was slow a moment ago
// is still preferred to loading the leader, which carries every write
// (ReadOptions.PreferFollowers).
func (o *nodeOrder) orderAvoiding(avoid string) []string {
	out := o.order("", true)
	if avoid == "" {
		return out
	}
	i := slices.Index(out, avoid)
	if i < 0 {
		return out
	}
	return append(append(out[:i:i], out[i+1:]...), avoid)
}
