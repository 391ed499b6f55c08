package history

import (
	"context"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type fakeClock struct{ us atomic.Int64 }

func (c *fakeClock) now() time.Time          { return time.UnixMicro(c.us.Load()) }
func (c *fakeClock) advance(d time.Duration) { c.us.Add(d.Microseconds()) }

// TestRetentionSweep: after a sweep with cutoff C, every point at or after
// C still restores exactly, what only older points needed is gone, and the
// kept archive verifies.
func TestRetentionSweep(t *testing.T) {
	store, err := NewDirStore(t.TempDir())
	require.NoError(t, err)
	clk := &fakeClock{}
	clk.us.Store(time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC).UnixMicro())
	e := newEnv(t, store, CaptureOptions{Now: clk.now, CheckpointFrames: 8}, ShipperOptions{Now: clk.now})
	e.exec("CREATE TABLE t(id INTEGER PRIMARY KEY, d TEXT, v BLOB)")
	var moments []moment
	for day := 0; day < 10; day++ {
		for i := 0; i < 5; i++ {
			e.exec("INSERT INTO t(d, v) VALUES (?, randomblob(2000))", fmt.Sprint(day))
			clk.advance(time.Hour)
			moments = append(moments, moment{pos: e.cap.Current(), dump: dumpDB(t, e.db)})
		}
		e.exec("DELETE FROM t WHERE id % 3 = 0")
		moments = append(moments, moment{pos: e.cap.Current(), dump: dumpDB(t, e.db)})
		// A daily snapshot (what the shipper's SnapshotInterval does).
		e.sync()
		// (The shipper may have taken it already during the sync: its
		// SnapshotInterval is an hour of the fake clock.)
		_, err := e.cap.Snapshot()
		require.NoError(t, err)
		e.sync()
		clk.advance(19 * time.Hour)
	}
	e.close()
	ctx := context.Background()
	before, err := store.List(ctx, e.key+"/")
	require.NoError(t, err)

	cutoff := time.Date(2026, 11, 6, 12, 0, 0, 0, time.UTC)
	st, err := e.archive.Sweep(ctx, e.key, cutoff)
	require.NoError(t, err)
	t.Logf("sweep: %+v of %d objects", st, len(before))
	assert.Greater(t, st.Deleted, 0)
	after, err := store.List(ctx, e.key+"/")
	require.NoError(t, err)
	assert.Len(t, after, len(before)-st.Deleted)
	_, err = e.archive.Verify(ctx, e.key)
	require.NoError(t, err)

	dir := t.TempDir()
	restorable := 0
	for i, m := range moments {
		out := filepath.Join(dir, fmt.Sprintf("m%d.db", i))
		_, err := e.archive.Restore(ctx, e.key, m.pos, out)
		if m.pos.Time().Before(cutoff.Add(-24 * time.Hour)) {
			assert.ErrorIs(t, err, ErrNoHistory, "moment %d (%v) is past retention and its base is gone", i, m.pos.Time())
			continue
		}
		if !m.pos.Time().Before(cutoff) {
			require.NoError(t, err, "moment %d within retention", i)
			assert.Equal(t, m.dump, dumpRestored(t, out))
			restorable++
		}
	}
	assert.Greater(t, restorable, 20)
}
