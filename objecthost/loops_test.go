package objecthost

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCloseStopsBackgroundLoops runs the real loops (real clock, short
// periods) and checks Close leaves no goroutine behind.
func TestCloseStopsBackgroundLoops(t *testing.T) {
	before := runtime.NumGoroutine()
	cat := newFakeCatalog()
	h, err := Open(Config{
		ID: "h", Dir: t.TempDir(), Catalog: cat,
		HeartbeatInterval: 20 * time.Millisecond, HeartbeatTick: 5 * time.Millisecond,
		SweepInterval: 5 * time.Millisecond, LoadReportInterval: 5 * time.Millisecond,
	})
	require.NoError(t, err)
	d := newDB("a")
	_, err = h.Init(context.Background(), d.obj, d.init())
	require.NoError(t, err)
	_, err = h.Query(context.Background(), d.obj, d.id(), q("CREATE TABLE t (x)"))
	require.NoError(t, err)
	// Wait (not a timing assertion) until every loop has run at least once.
	require.Eventually(t, func() bool {
		cat.mu.Lock()
		defer cat.mu.Unlock()
		return len(cat.hosts) == 1 && len(cat.loads) > 0 && cat.calls > 0
	}, 10*time.Second, 5*time.Millisecond)

	require.NoError(t, h.Close())
	require.NoError(t, h.Close(), "Close is idempotent")
	// (testify's Eventually runs its condition in a goroutine: poll by hand.)
	after := runtime.NumGoroutine()
	for deadline := time.Now().Add(5 * time.Second); after > before && time.Now().Before(deadline); after = runtime.NumGoroutine() {
		time.Sleep(10 * time.Millisecond) // poll interval: goroutines counted until they are gone (deadline above)
	}
	assert.LessOrEqual(t, after, before, "goroutines leaked")
	_, err = h.Query(context.Background(), d.obj, d.id(), q("SELECT 1"))
	assert.ErrorIs(t, err, ErrClosed)
	_, err = h.Init(context.Background(), newObjectID(), newDB("a").init())
	assert.ErrorIs(t, err, ErrClosed)
}
