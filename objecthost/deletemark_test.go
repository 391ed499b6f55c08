package objecthost

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/objecthost/history"
)

// TestDeletedDatabaseIsNotRestoredFromArchive: a database its host
// deleted on the catalog's word leaves a delete marker in the archive, and
// an init that restores from the archive (lost-host recovery, a fork)
// refuses it — the zombie a catalog restored from an older backup lists
// again is never revived from its archive — while a database whose object
// was only superseded (relocated) still restores. An archive outage holds
// the marker back without losing it: the sweep keeps the record past
// DeletedRetention and a later pass writes it. Real SQLite files, a
// directory archive.
func TestDeletedDatabaseIsNotRestoredFromArchive(t *testing.T) {
	ctx := context.Background()
	dir, err := history.NewDirStore(t.TempDir())
	require.NoError(t, err)
	store := &flakyStore{Store: dir}
	th := historyHost(t, store)
	archive := history.NewArchive(store)

	fill := func(d db) {
		th.mustInit(t, d)
		th.exec(t, d, "CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT, r INTEGER DEFAULT (random()))")
		th.exec(t, d, "INSERT INTO t(v) VALUES ('secret')")
		th.archivedUpTo(t, d)
	}
	restore := func(from db) error {
		to := newDB(from.account)
		req := to.init()
		req.RestoreFrom = &RestoreSource{DatabaseUUID: from.uuid}
		_, err := th.Init(ctx, to.obj, req)
		if err != nil {
			_, _, lerr := th.lookup(to.obj)
			assert.ErrorIs(t, lerr, ErrNotFound, "a refused restore wrote nothing")
		}
		return err
	}

	// Deleted through the API (the catalog deleted it): marked, refused.
	gone := newDB("acct")
	fill(gone)
	_, err = th.Delete(ctx, gone.obj, 2)
	require.NoError(t, err)
	_, err = th.hist.markDeletes(ctx, th.Host)
	require.NoError(t, err)
	marks, err := archive.DeleteMarks(ctx, gone.uuid)
	require.NoError(t, err)
	require.Len(t, marks, 1)
	assert.Equal(t, gone.obj, marks[0].ObjectID)
	_, m, err := th.lookup(gone.obj)
	require.NoError(t, err)
	assert.True(t, m.CatalogDeleted && m.ArchiveMarked)
	err = restore(gone)
	require.ErrorIs(t, err, ErrDeletedInArchive)
	assert.Contains(t, err.Error(), "deleted on its host")
	status, _, _ := statusOf(err)
	assert.Equal(t, 410, status)

	// Superseded by a relocation: its database lives on; no marker, and
	// it restores.
	moved := newDB("acct")
	fill(moved)
	o, _, err := th.lookup(moved.obj)
	require.NoError(t, err)
	_, err = th.markDeletedAs(ctx, []*object{o}, 0, "test: superseded", deletedSuperseded)
	require.NoError(t, err)
	_, err = th.hist.markDeletes(ctx, th.Host)
	require.NoError(t, err)
	marks, err = archive.DeleteMarks(ctx, moved.uuid)
	require.NoError(t, err)
	assert.Empty(t, marks)
	require.NoError(t, restore(moved))

	// The archive is down at the delete: no marker yet, the record
	// outlives DeletedRetention, and the marker is written once the
	// archive is back.
	late := newDB("acct")
	fill(late)
	store.failPuts.Store(true)
	_, err = th.Delete(ctx, late.obj, 2)
	require.NoError(t, err)
	_, err = th.hist.markDeletes(ctx, th.Host)
	require.Error(t, err)
	th.clock.Advance(th.Host.cfg.DeletedRetention + time.Hour)
	first, err := th.Sweep(ctx)
	assert.Equal(t, 2, first, "the marked and the superseded records are swept")
	require.NoError(t, err)
	_, m, err = th.lookup(late.obj)
	require.NoError(t, err, "the sweep dropped a record whose marker is owed")
	assert.False(t, m.ArchiveMarked)
	store.failPuts.Store(false)
	n, err := th.hist.markDeletes(ctx, th.Host)
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	require.ErrorIs(t, restore(late), ErrDeletedInArchive)
	// Marked: the next sweep removes the record.
	swept, err := th.Sweep(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, swept)
	_, _, err = th.lookup(late.obj)
	assert.ErrorIs(t, err, ErrNotFound)
}
