package objecthost

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/objecthost/sqlexec"
)

func q(sql string) sqlexec.Request {
	return sqlexec.Request{Statements: []sqlexec.Statement{{SQL: sql}}}
}

func TestInitIdempotentAndConflict(t *testing.T) {
	th := newTestHost(t, nil)
	ctx := context.Background()
	d := newDB("acct-1")

	first := th.mustInit(t, d)
	assert.Equal(t, StateActive, first.State)
	assert.False(t, first.Confirmed)
	assert.Equal(t, d.uuid, first.DatabaseUUID)

	again, err := th.Init(ctx, d.obj, d.init())
	require.NoError(t, err)
	assert.Equal(t, first, again, "a repeated init returns the stored object unchanged")

	other := d.init()
	other.DatabaseUUID = uuid.NewString()
	_, err = th.Init(ctx, d.obj, other)
	assert.ErrorIs(t, err, ErrConflict, "another database for the same object")
	other = d.init()
	other.AccountID = "acct-2"
	_, err = th.Init(ctx, d.obj, other)
	assert.ErrorIs(t, err, ErrConflict, "another account for the same object")

	_, err = th.Delete(ctx, d.obj, 1)
	require.NoError(t, err)
	_, err = th.Init(ctx, d.obj, d.init())
	assert.ErrorIs(t, err, ErrConflict, "a repeated init after the object died must not succeed")

	_, err = th.Init(ctx, "NOT-HEX", d.init())
	assert.ErrorIs(t, err, ErrInvalid)
	bad := d.init()
	bad.DatabaseUUID = "ABC"
	_, err = th.Init(ctx, newObjectID(), bad)
	assert.ErrorIs(t, err, ErrInvalid)

	// The database file is created lazily: init writes only the index row,
	// and Info on a never-queried database does not create it.
	info, err := th.Info(ctx, d.obj)
	require.NoError(t, err)
	assert.Zero(t, info.FileSize)
	assert.Zero(t, info.NumTables)
	_, err = os.Stat(th.path(d.obj))
	assert.True(t, errors.Is(err, os.ErrNotExist), "no file before the first query")
}

func TestConcurrentInitsOfOneObjectAgree(t *testing.T) {
	th := newTestHost(t, nil)
	obj := newObjectID()
	var wg sync.WaitGroup
	var mu sync.Mutex
	winners := map[string]int{}
	for i := 0; i < 16; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d := db{obj: obj, uuid: uuid.NewString(), account: "a"}
			if _, err := th.Init(context.Background(), obj, d.init()); err == nil {
				mu.Lock()
				winners[d.uuid]++
				mu.Unlock()
			} else {
				assert.ErrorIs(t, err, ErrConflict)
			}
		}()
	}
	wg.Wait()
	assert.Len(t, winners, 1, "exactly one database owns the object")
}

func TestStatesSurviveRestart(t *testing.T) {
	th := newTestHost(t, nil)
	ctx := context.Background()
	active, confirmed, deleted := newDB("a"), newDB("a"), newDB("b")
	for _, d := range []db{active, confirmed, deleted} {
		th.mustInit(t, d)
	}
	_, err := th.Query(ctx, confirmed.obj, confirmed.id(), q("CREATE TABLE t (x); INSERT INTO t VALUES (1)"))
	require.NoError(t, err)
	_, err = th.Confirm(ctx, confirmed.obj, 3)
	require.NoError(t, err)
	_, err = th.Delete(ctx, deleted.obj, 4)
	require.NoError(t, err)

	th.reopen(t)

	info, err := th.Info(ctx, active.obj)
	require.NoError(t, err)
	assert.Equal(t, StateActive, info.State)
	assert.False(t, info.Confirmed)

	info, err = th.Info(ctx, confirmed.obj)
	require.NoError(t, err)
	assert.True(t, info.Confirmed)
	assert.EqualValues(t, 3, info.RoutingGeneration)
	assert.EqualValues(t, 1, info.NumTables)
	assert.Positive(t, info.FileSize)
	res, err := th.Query(ctx, confirmed.obj, confirmed.id(), q("SELECT x FROM t"))
	require.NoError(t, err)
	require.Len(t, res, 1)

	info, err = th.Info(ctx, deleted.obj)
	require.NoError(t, err)
	assert.Equal(t, StateDeleted, info.State)
	_, err = th.Query(ctx, deleted.obj, deleted.id(), q("SELECT 1"))
	assert.ErrorIs(t, err, ErrDeleted)

	st := th.Stats()
	assert.Equal(t, 2, st.Active)
	assert.Equal(t, 1, st.Deleted)

	// The heartbeat schedule is rebuilt from the index: the two active
	// databases beat within one interval, the deleted one never.
	th.clock.Advance(th.Host.cfg.HeartbeatInterval + time.Millisecond)
	rep := th.RunHeartbeats(ctx)
	assert.Equal(t, 2, rep.Sent)
	assert.NotContains(t, th.cat.seen(), deleted.uuid)
}

func TestQueryRefusals(t *testing.T) {
	th := newTestHost(t, nil)
	ctx := context.Background()
	d := newDB("a")

	_, err := th.Query(ctx, d.obj, d.id(), q("SELECT 1"))
	assert.ErrorIs(t, err, ErrNotFound, "never initialised")

	th.mustInit(t, d)
	_, err = th.Query(ctx, d.obj, d.id(), q("SELECT 1"))
	require.NoError(t, err, "accepted once initialised, before confirm")

	_, err = th.Query(ctx, d.obj, Identity{DatabaseUUID: uuid.NewString(), AccountID: d.account}, q("SELECT 1"))
	assert.ErrorIs(t, err, ErrWrongHost)
	_, err = th.Query(ctx, d.obj, Identity{DatabaseUUID: d.uuid, AccountID: "other"}, q("SELECT 1"))
	assert.ErrorIs(t, err, ErrWrongHost)

	_, err = th.Delete(ctx, d.obj, 1)
	require.NoError(t, err)
	_, err = th.Query(ctx, d.obj, d.id(), q("SELECT 1"))
	assert.ErrorIs(t, err, ErrDeleted, "refused immediately after delete")
	_, err = th.Confirm(ctx, d.obj, 2)
	assert.ErrorIs(t, err, ErrDeleted, "a late confirm does not resurrect")

	info, err := th.Delete(ctx, d.obj, 1)
	require.NoError(t, err, "delete is idempotent")
	assert.Equal(t, StateDeleted, info.State)

	r, ok := th.sink.LastRoute(d.uuid)
	require.True(t, ok)
	assert.Equal(t, StateDeleted, r.State, "delete publishes the route's removal")
}

func TestConfirmPublishesRoute(t *testing.T) {
	th := newTestHost(t, nil)
	d := newDB("a")
	th.mustInit(t, d)
	info, err := th.Confirm(context.Background(), d.obj, 7)
	require.NoError(t, err)
	assert.True(t, info.Confirmed)
	r, ok := th.sink.LastRoute(d.uuid)
	require.True(t, ok)
	assert.Equal(t, Route{DatabaseUUID: d.uuid, ObjectID: d.obj, HostAddress: "127.0.0.1:1", AccountID: "a", State: StateActive, Generation: 7}, r)
}

func TestUsageAndSizeEvents(t *testing.T) {
	th := newTestHost(t, nil)
	ctx := context.Background()
	d := newDB("acct")
	th.mustInit(t, d)
	_, err := th.Query(ctx, d.obj, d.id(), q("CREATE TABLE t (x INTEGER PRIMARY KEY, y)"))
	require.NoError(t, err)
	_, err = th.Query(ctx, d.obj, d.id(), q("INSERT INTO t (y) VALUES (1), (2), (3)"))
	require.NoError(t, err)
	_, err = th.Query(ctx, d.obj, d.id(), q("SELECT * FROM t"))
	require.NoError(t, err)

	_, err = th.Query(ctx, d.obj, d.id(), q("SELECT * FROM nope"))
	require.Error(t, err)

	usage := th.sink.Usage()
	require.Len(t, usage, 4, "a failed request is metered too")
	assert.Equal(t, "acct", usage[1].AccountID)
	assert.Equal(t, d.uuid, usage[1].DatabaseUUID)
	assert.EqualValues(t, 3, usage[1].RowsWritten)
	assert.EqualValues(t, 3, usage[2].RowsRead)
	assert.Equal(t, "SELECT * FROM t", usage[2].SQL)
	assert.Positive(t, usage[2].Duration)
	assert.False(t, usage[2].Error)
	assert.True(t, usage[3].Error)
	assert.Zero(t, usage[3].RowsRead)

	sizes := th.sink.Sizes()
	require.NotEmpty(t, sizes)
	last := sizes[len(sizes)-1]
	assert.Equal(t, d.uuid, last.DatabaseUUID)
	assert.Positive(t, last.SizeBytes)
	assert.Equal(t, last.SizeBytes, th.Stats().Bytes)
	for i := 1; i < len(sizes); i++ {
		assert.Greater(t, sizes[i].Seq, sizes[i-1].Seq, "sizes carry increasing sequences")
	}
	// Size events are sent on change only: a read adds none.
	n := len(sizes)
	_, err = th.Query(ctx, d.obj, d.id(), q("SELECT * FROM t"))
	require.NoError(t, err)
	assert.Len(t, th.sink.Sizes(), n)
}

func TestSweeperRemovesFilesAfterRetention(t *testing.T) {
	th := newTestHost(t, func(c *Config) { c.DeletedRetention = time4h })
	ctx := context.Background()
	d, keep := newDB("a"), newDB("a")
	for _, x := range []db{d, keep} {
		th.mustInit(t, x)
		_, err := th.Query(ctx, x.obj, x.id(), q("CREATE TABLE t (x); INSERT INTO t VALUES (randomblob(10000))"))
		require.NoError(t, err)
	}
	_, err := th.Delete(ctx, d.obj, 1)
	require.NoError(t, err)
	_, err = os.Stat(th.path(d.obj))
	require.NoError(t, err, "file kept during the retention")

	th.clock.Advance(time4h - 1)
	n, err := th.Sweep(ctx)
	require.NoError(t, err)
	assert.Zero(t, n, "not yet")

	th.clock.Advance(1)
	n, err = th.Sweep(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	matches, _ := filepath.Glob(th.path(d.obj) + "*")
	assert.Empty(t, matches, "database file and its -wal/-shm are gone")
	_, err = th.Info(ctx, d.obj)
	assert.ErrorIs(t, err, ErrNotFound, "index row removed")
	_, err = os.Stat(th.path(keep.obj))
	assert.NoError(t, err, "live databases untouched")

	all := th.sink.Sizes()
	last := all[len(all)-1]
	assert.Greater(t, last.Seq, all[len(all)-2].Seq, "the sweep's size 0 supersedes every earlier size")
	last.Seq = 0
	assert.Equal(t, SizeEvent{AccountID: "a", DatabaseUUID: d.uuid, SizeBytes: 0, Time: th.clock.Now()}, last)

	th.reopen(t)
	_, err = th.Info(ctx, d.obj)
	assert.ErrorIs(t, err, ErrNotFound, "sweep is durable")
	assert.Equal(t, 1, th.Stats().Active)
}

// Concurrent writes to one database: whatever order their results reach
// noteSize in, the size with the highest sequence is the database's final
// size (two queries used to swap and emit out of order).
func TestConcurrentWritesEmitSizesInMeasurementOrder(t *testing.T) {
	th := newTestHost(t, nil)
	ctx := context.Background()
	d := newDB("acct")
	th.mustInit(t, d)
	_, err := th.Query(ctx, d.obj, d.id(), q("CREATE TABLE t (x)"))
	require.NoError(t, err)
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 20; i++ {
				_, err := th.Query(ctx, d.obj, d.id(), q("INSERT INTO t VALUES (randomblob(3000))"))
				assert.NoError(t, err)
			}
		}()
	}
	wg.Wait()
	// A last write measures the final size.
	res, err := th.Query(ctx, d.obj, d.id(), q("INSERT INTO t VALUES (randomblob(5000))"))
	require.NoError(t, err)
	want := res[0].Meta.SizeAfter
	require.Positive(t, want)
	var best SizeEvent
	for _, e := range th.sink.Sizes() {
		if e.DatabaseUUID == d.uuid && e.Seq > best.Seq {
			best = e
		}
	}
	assert.EqualValues(t, want, best.SizeBytes)
	assert.EqualValues(t, want, th.Stats().Bytes)
}

// An init whose index commit fails (the journal's fdatasync, as on a disk
// error) answers the error and leaves no object: Info does not find it, a
// retry of the same init creates it, and after a restart the host holds
// exactly the objects whose init succeeded.
func TestInitFailedIndexCommitLeavesNoObject(t *testing.T) {
	th := newTestHost(t, nil)
	ctx := context.Background()
	ok1 := newDB("acct-1")
	th.mustInit(t, ok1)

	failNext := make(chan error, 1)
	th.ix.j.sync = func(f *os.File) error {
		select {
		case err := <-failNext:
			return err
		default:
			return fdatasync(f)
		}
	}
	failed := newDB("acct-1")
	failNext <- fmt.Errorf("injected: %w", syscall.EIO)
	_, err := th.Init(ctx, failed.obj, failed.init())
	require.ErrorIs(t, err, syscall.EIO)
	_, err = th.Info(ctx, failed.obj)
	require.ErrorIs(t, err, ErrNotFound, "a failed init leaves no object behind")

	ok2 := newDB("acct-1")
	th.mustInit(t, ok2)
	retried := newDB("acct-1")
	failNext <- fmt.Errorf("injected: %w", syscall.EIO)
	_, err = th.Init(ctx, retried.obj, retried.init())
	require.ErrorIs(t, err, syscall.EIO)
	th.mustInit(t, retried) // the same init again, now durable

	th.reopen(t)
	for _, d := range []db{ok1, ok2, retried} {
		_, err := th.Info(ctx, d.obj)
		require.NoError(t, err, "an acknowledged init survives the restart")
	}
	_, err = th.Info(ctx, failed.obj)
	require.ErrorIs(t, err, ErrNotFound, "the failed init stays gone after the restart")
}
