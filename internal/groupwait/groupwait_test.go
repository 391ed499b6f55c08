package groupwait

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A wait ends when the condition holds after a wake, holds the lock on
// return, and never waits when the condition already holds.
func TestLockedEndsOnItsCondition(t *testing.T) {
	var mu sync.Mutex
	wake := make(chan struct{}, 1)
	n := 0
	mu.Lock()
	Locked(&mu, wake, time.Hour, nil, func() bool { return true }) // no wait at all
	go func() {
		for range 3 {
			mu.Lock()
			n++
			mu.Unlock()
			wake <- struct{}{}
		}
	}()
	Locked(&mu, wake, time.Hour, nil, func() bool { return n >= 3 })
	assert.Equal(t, 3, n)
	require.False(t, mu.TryLock(), "the lock is held on return")
	mu.Unlock()
}

// With nothing coming, the wait ends at its bound or when stop closes.
func TestLockedEndsAtItsBoundOrStop(t *testing.T) {
	var mu sync.Mutex
	never := func() bool { return false }
	mu.Lock()
	Locked(&mu, make(chan struct{}), time.Millisecond, nil, never)
	stop := make(chan struct{})
	close(stop)
	Locked(&mu, make(chan struct{}), time.Hour, stop, never)
	require.False(t, mu.TryLock(), "the lock is held on return")
	mu.Unlock()
}

// The gate admits waits while they fill, closes after three in a row run
// out, then admits only every ProbeEvery-th chance until probes fill
// again; a filled probe is followed by another at once.
func TestGateFollowsHowWaitsEnd(t *testing.T) {
	var g Gate
	for i := range 10 { // a closed loop: every wait fills
		wait, probe := g.Admit()
		require.True(t, wait, "chance %d", i)
		require.False(t, probe)
		g.Record(true)
	}
	for i := range 2 {
		wait, _ := g.Admit()
		require.True(t, wait)
		g.Record(false)
		require.True(t, g.Open(), "%d waits in a row that ran out do not close the gate", i+1)
	}
	wait, _ := g.Admit()
	require.True(t, wait)
	g.Record(false) // three in a row: closed
	require.False(t, g.Open(), "three waits in a row that ran out close the gate")

	// An open loop: nothing fills; one chance in ProbeEvery is a probe.
	waits, probes := 0, 0
	for range 10 * ProbeEvery {
		if wait, probe := g.Admit(); wait {
			waits++
			if probe {
				probes++
			}
			g.Record(false)
		}
	}
	assert.Equal(t, 10, waits, "one wait per %d chances while closed", ProbeEvery)
	assert.Equal(t, waits, probes, "every wait admitted while closed is a probe")

	// The callers turn into a closed loop: probes fill, the next chance
	// after a filled probe is a probe too, and a few reopen the gate.
	chances := 0
	for !g.Open() {
		chances++
		require.Less(t, chances, 2*ProbeEvery, "the gate never reopened")
		if wait, _ := g.Admit(); wait {
			g.Record(true)
		}
	}
	assert.LessOrEqual(t, chances, ProbeEvery+5, "chances until the gate reopened")
}

// A wait filled when at least 7/8 of the calls it expected came: a
// straggler of many does not count against it, one missing of a few does.
func TestFilledTakesSevenEighths(t *testing.T) {
	assert.True(t, Filled(64, 64))
	assert.True(t, Filled(56, 64), "8 of 64 came after the bound")
	assert.False(t, Filled(55, 64))
	assert.True(t, Filled(7, 8))
	assert.False(t, Filled(2, 3), "one of three missing")
	assert.False(t, Filled(1, 2))
	assert.True(t, Filled(0, 0))
}
