package groupwait

// Gate decides whether a group-commit wait is worth entering, from how
// recent waits ended. The wait pays off when the callers it expects come
// back (a closed loop: each caller waits for its answer, then calls
// again), so it fills long before its bound; callers arriving
// independently of their answers (an open loop) do not come back, so
// nearly every wait runs out its bound and each call queued behind it pays
// the bound for nothing.
//
// The gate keeps a score of recent waits, an EWMA of "filled" (1: at least
// 7/8 of the calls expected came, Filled) or "ran out its bound" short of
// them (0) with weight 1/4, starting at 1, and admits a wait
// while the score is at least 1/2: one or two waits that run out do not
// close it, three in a row do (1 → 0.75 → 0.56 → 0.42). While closed,
// every ProbeEvery-th chance is admitted anyway (a probe), and a probe
// that fills makes the next chance a probe too, so callers that turned
// into a closed loop reopen it within a few chances (one filled probe
// after three waits ran out, three from a score near 0).
//
// The zero Gate is open. It is not safe for concurrent use: its owner
// calls it under the lock that guards its queue.
type Gate struct {
	miss       float64 // 1 - the score: the zero Gate is open
	sinceProbe int     // chances refused since the last admitted wait
}

const (
	// gateWeight is a wait's outcome's weight in the score.
	gateWeight = 0.25
	// gateOpenMiss is the largest miss (1 - score) at which waits are
	// admitted. 1/4 (two misses in a row close the gate) closed it for
	// half the chances of 64 closed-loop writers on a machine at load
	// 12–20, where one gather in nine ran out (docs/benchmarks.md).
	gateOpenMiss = 0.5
	// ProbeEvery: while the gate is closed, every this many chances is
	// admitted as a probe. A probe that runs out costs its calls one bound.
	ProbeEvery = 16
)

// Admit is one chance to wait (a batch of two or more came back): whether
// to wait, and whether that wait is a probe of a closed gate.
func (g *Gate) Admit() (wait, probe bool) {
	if g.miss <= gateOpenMiss {
		g.sinceProbe = 0
		return true, false
	}
	g.sinceProbe++
	if g.sinceProbe < ProbeEvery {
		return false, false
	}
	g.sinceProbe = 0
	return true, true
}

// Filled is the outcome of a wait for expected calls of which arrived
// queued before it ended: filled when at least 7/8 of them came (or none
// were expected). A closed loop's wait reaches its target long before its
// bound, but on a loaded machine one or two of 64 callers may come back
// after it; an open loop's wait for as many as the last round trip
// collected gets about bound ÷ round trip of them.
func Filled(arrived, expected int) bool { return 8*arrived >= 7*expected }

// Record adds an admitted wait's outcome: filled (Filled: the calls
// expected came before the bound) or not (it ran out its bound short of
// them). A wait ended by its owner closing is no evidence either way and
// is not recorded.
func (g *Gate) Record(filled bool) {
	if filled {
		g.miss -= gateWeight * g.miss
		if g.miss > gateOpenMiss {
			g.sinceProbe = ProbeEvery - 1 // still closed: probe again at once
		}
		return
	}
	g.miss += gateWeight * (1 - g.miss)
}

// Open reports whether the next chance would be admitted without a probe.
func (g *Gate) Open() bool { return g.miss <= gateOpenMiss }
