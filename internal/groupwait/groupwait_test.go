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
