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

// LockedIdle ends once idle passes with no wake, long before its bound
// (an hour here: returning at all is the check), and a wake within the
// gap keeps it waiting for its condition (a one-minute gap: the three
// wakes come far sooner).
func TestLockedIdleEndsAfterAQuietGap(t *testing.T) {
	var mu sync.Mutex
	never := func() bool { return false }
	mu.Lock()
	LockedIdle(&mu, make(chan struct{}), time.Hour, time.Millisecond, nil, never)
	require.False(t, mu.TryLock(), "the lock is held on return")

	wake := make(chan struct{}, 1)
	n := 0
	go func() {
		for range 3 {
			mu.Lock()
			n++
			mu.Unlock()
			wake <- struct{}{}
		}
	}()
	LockedIdle(&mu, wake, time.Hour, time.Minute, nil, func() bool { return n >= 3 })
	assert.Equal(t, 3, n, "ended on its condition, not the gap")
	mu.Unlock()
}
