package fsm

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestReadsConcurrentWithApplyAndRestore runs readers while the apply
// goroutine creates databases, takes snapshots and restores one. Readers
// must never see an error other than not-found, and must see a consistent
// state: an account's active count never below the databases a reader has
// already seen in that account's list total.
func TestReadsConcurrentWithApplyAndRestore(t *testing.T) {
	ctx := context.Background()
	f := newFSM(t, WithReadConns(4))
	d := newDriver(t, f)
	d.account("a1", 1<<30)
	d.ok(CmdRegisterHost, RegisterHost{ID: "h1", Address: "127.0.0.1:1", State: HostStateActive})
	var created atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var readErrs atomic.Int64
	for r := 0; r < 3; r++ {
		wg.Add(1)
		go func(r int) {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				n := created.Load()
				var err error
				switch i % 4 {
				case 0:
					_, _, err = f.ListDatabases(ctx, "a1", ListQuery{PerPage: 10})
				case 1:
					_, err = f.Account(ctx, "a1")
				case 2:
					if n > 0 {
						_, err = f.Database(ctx, uuidN(int(n-1)))
					}
				case 3:
					_, err = f.Heartbeat(ctx, []string{uuidN(1), uuidN(2), uuidN(3)})
				}
				if err != nil && !errors.Is(err, ErrNotFound) {
					readErrs.Add(1)
					t.Errorf("reader %d: %v", r, err)
					return
				}
			}
		}(r)
	}
	var snap []byte
	for i := 0; i < 600; i++ {
		d.ok(CmdCreateDatabase, createDB(uuidN(i), "a1", fmt.Sprintf("db-%d", i)))
		created.Store(int64(i + 1))
		if i == 200 {
			snap = snapshotBytes(t, f)
		}
		if i == 400 {
			require.NoError(t, restoreBytes(f, snap))
			d.index = f.AppliedIndex() // raft would replay from here
		}
	}
	close(stop)
	wg.Wait()
	assert.Zero(t, readErrs.Load())
	a, err := f.Account(ctx, "a1")
	require.NoError(t, err)
	assert.Equal(t, int64(201+199), a.ActiveDatabases, "restore rolled back to 201 databases, then 199 more")
	checkInvariants(t, f)
}

func TestCloseWaitsAndRefuses(t *testing.T) {
	f, err := New(t.TempDir())
	require.NoError(t, err)
	snap, err := f.Snapshot()
	require.NoError(t, err)
	closed := make(chan struct{})
	go func() {
		f.Close()
		close(closed)
	}()
	data := persistBytes(t, snap) // Close waits for the snapshot
	snap.Release()
	<-closed
	assert.NotEmpty(t, data)
	_, err = f.Account(context.Background(), "x")
	assert.ErrorIs(t, err, ErrClosed)
	_, err = f.Snapshot()
	assert.ErrorIs(t, err, ErrClosed)
	assert.NoError(t, f.Close())
}

func TestNewWipesOldCatalog(t *testing.T) {
	dir := t.TempDir()
	f, err := New(dir)
	require.NoError(t, err)
	d := newDriver(t, f)
	d.account("a1", 1)
	require.NoError(t, f.Close())
	g, err := New(dir)
	require.NoError(t, err)
	defer g.Close()
	_, err = g.Account(context.Background(), "a1")
	assert.ErrorIs(t, err, ErrAccountNotFound)
	assert.Zero(t, g.AppliedIndex())
}
