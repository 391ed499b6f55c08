package history

import (
	"context"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestStoreOutage: the S3 server answers 503 for a while under a steady
// stream of writes. No write fails, the backlog stays on local disk, the
// lag alarm is raised (status and metric), and once the store is back the
// backlog ships, the lag falls under MaxLag again and the archive replays
// to the last write.
func TestStoreOutage(t *testing.T) {
	srv, store := newS3(t)
	reg := prometheus.NewRegistry()
	e := newEnv(t, store, CaptureOptions{CheckpointFrames: 64}, ShipperOptions{MaxLag: 200 * time.Millisecond, AlarmLag: 600 * time.Millisecond, PutTimeout: 2 * time.Second, Registerer: reg})
	e.exec("CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB, at TEXT DEFAULT (datetime('now')))")

	var writes, failures atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := execOn(e.db, "INSERT INTO t(v) VALUES (randomblob(500))"); err != nil {
				failures.Add(1)
			}
			writes.Add(1)
			time.Sleep(2 * time.Millisecond) // pacing: a writer during the outage
		}
	}()
	waitFor(t, 5*time.Second, "first shipments", func() bool { return gathered(t, reg, "shoal_history_shipped_objects_total") > 0 })
	assert.False(t, e.ship.Status().Alarm)

	srv.down.Store(true)
	downAt := writes.Load()
	waitFor(t, 10*time.Second, "the lag alarm", func() bool { return e.ship.Status().Alarm })
	assert.Equal(t, 1.0, gathered(t, reg, "shoal_history_lag_alarm"))
	waitFor(t, 10*time.Second, "failed shipments", func() bool { return gathered(t, reg, "shoal_history_ship_errors_total") > 0 })
	// Down for a while longer: until 50 more writes went on and the
	// shipper failed again (counted, not slept: a second on a loaded
	// machine held fewer than 50 writes).
	errs := gathered(t, reg, "shoal_history_ship_errors_total")
	waitFor(t, time.Minute, "writes while the store is down", func() bool { return writes.Load() > downAt+50 })
	waitFor(t, time.Minute, "more failed shipments", func() bool { return gathered(t, reg, "shoal_history_ship_errors_total") > errs })
	pending, err := e.cap.log.pending(e.key)
	require.NoError(t, err)
	assert.NotEmpty(t, pending, "the backlog is kept locally")
	assert.Greater(t, writes.Load(), downAt+50, "writes went on while the store was down")
	st := e.ship.Status()
	t.Logf("while down: %+v", st)
	assert.Greater(t, st.Lag, 600*time.Millisecond)

	srv.down.Store(false)
	waitFor(t, 20*time.Second, "the lag to recover", func() bool {
		s := e.ship.Status()
		return !s.Alarm && s.Lag < 200*time.Millisecond*2
	})
	close(stop)
	wg.Wait()
	assert.Zero(t, failures.Load(), "no write failed")
	want := e.cap.Current()
	e.close()

	ctx := context.Background()
	latest, err := e.archive.Latest(ctx, e.key)
	require.NoError(t, err)
	assert.Equal(t, want, latest)
	_, err = e.archive.Verify(ctx, e.key)
	require.NoError(t, err)
	out := filepath.Join(t.TempDir(), "r.db")
	_, err = e.archive.Restore(ctx, e.key, latest, out)
	require.NoError(t, err)
	assert.Equal(t, dumpFile(t, e.path), dumpFile(t, out))
	assert.Equal(t, 0.0, gathered(t, reg, "shoal_history_lag_alarm"))
	t.Logf("writes %d", writes.Load())
}

// gathered sums the values of a metric family (counters and gauges).
func gathered(t testing.TB, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if c := m.GetCounter(); c != nil {
				sum += c.GetValue()
			}
			if g := m.GetGauge(); g != nil {
				sum += g.GetValue()
			}
		}
	}
	return sum
}

// TestArchivedDurability: with durability = "archived" a write is
// acknowledged only once its record is in the store: right after each
// acknowledged write the archive alone restores it. With the store down,
// writes fail with CodeUnavailable (committed on the host, not confirmed
// archived) instead of being acknowledged, and are archived once the store
// is back.
func TestArchivedDurability(t *testing.T) {
	srv, store := newS3(t)
	e := newEnvMode(t, store, CaptureOptions{}, ShipperOptions{PutTimeout: time.Second}, true)
	e.exec("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)")
	ctx := context.Background()
	for i := 0; i < 20; i++ {
		e.exec("INSERT INTO t(v) VALUES (?)", "acked")
		latest, err := e.archive.Latest(ctx, e.key)
		require.NoError(t, err)
		require.Equal(t, e.cap.Current(), latest, "acknowledged ⇒ archived")
	}
	srv.down.Store(true)
	_, err := execOn(e.db, "INSERT INTO t(v) VALUES ('not confirmed')")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "7503")
	srv.down.Store(false)
	e.exec("INSERT INTO t(v) VALUES ('after')")
	latest, err := e.archive.Latest(ctx, e.key)
	require.NoError(t, err)
	assert.Equal(t, e.cap.Current(), latest)
	out := filepath.Join(t.TempDir(), "r.db")
	_, err = e.archive.Restore(ctx, e.key, latest, out)
	require.NoError(t, err)
	assert.Equal(t, dumpDB(t, e.db), dumpRestored(t, out))
}
