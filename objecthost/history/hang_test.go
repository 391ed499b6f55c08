package history

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/objecthost/sqlexec"
)

// hangingStore is a store that stops answering: while hang is set, every
// Put blocks until its context ends (a store that is SIGSTOPped or cut off
// the network, as opposed to one that refuses at once).
type hangingStore struct {
	Store
	hang atomic.Bool
}

func (s *hangingStore) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	if s.hang.Load() {
		<-ctx.Done()
		return ctx.Err()
	}
	return s.Store.Put(ctx, key, r, size)
}

// TestStoreHangsLagAlarm: when the store hangs rather than refuses, with
// more databases to ship than the shipper's Concurrency, the lag (status
// and metric) still follows the oldest unshipped commit and the alarm
// rises past AlarmLag — not only once the hung Puts time out
// (PutTimeout, 30 s by default). Found by the robustness suite
// (test/robustness, object-store-down by SIGSTOP or a cut link): the ship
// loop waited for a free shipping slot, so it stopped computing the lag
// while every slot was stuck in a Put.
func TestStoreHangsLagAlarm(t *testing.T) {
	_, s3 := newS3(t)
	store := &hangingStore{Store: s3}
	dir := t.TempDir()
	ship := NewShipper(store, ShipperOptions{MaxLag: 200 * time.Millisecond, AlarmLag: 600 * time.Millisecond,
		Concurrency: 2, PutTimeout: time.Minute, Logger: slog.New(slog.DiscardHandler)})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); ship.Run(ctx) }()
	var dbs []*sqlexec.DB
	var caps []*Capturer
	for i := range 4 { // more databases than shipping slots
		path := filepath.Join(dir, fmt.Sprintf("db%d", i), "x.db")
		require.NoError(t, mkdirAll(filepath.Dir(path)))
		c, err := NewCapturer(fmt.Sprintf("db%d", i), path, CaptureOptions{StagingDir: filepath.Join(dir, "staging"), OnAppend: ship.Notify})
		require.NoError(t, err)
		db, err := sqlexec.Open(path, sqlexec.Options{})
		require.NoError(t, err)
		require.NoError(t, c.Attach(context.Background(), db))
		ship.Add(c)
		dbs, caps = append(dbs, db), append(caps, c)
		_, err = execOn(db, "CREATE TABLE t(v INTEGER)")
		require.NoError(t, err)
	}
	t.Cleanup(func() {
		cancel() // ends the hung Puts
		<-done
		for i, db := range dbs {
			_ = db.Close()
			_ = caps[i].Close()
		}
	})
	waitFor(t, 5*time.Second, "every database shipped", func() bool { return ship.Status().Backlog == 0 })

	store.hang.Store(true)
	writeAll := func() {
		for _, db := range dbs {
			_, err := execOn(db, "INSERT INTO t VALUES (1)")
			require.NoError(t, err)
		}
	}
	writeAll()
	deadline := time.Now().Add(5 * time.Second) // a few AlarmLags, far below PutTimeout
	for !ship.Status().Alarm {
		if time.Now().After(deadline) {
			t.Fatalf("lag alarm not raised while the store hangs: %+v", ship.Status())
		}
		writeAll()
		time.Sleep(50 * time.Millisecond) // pacing: writes until the alarm (the loop's condition)
	}
}
