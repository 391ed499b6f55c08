package snapshot

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// put writes one row (kind database, account or pass) the way a pass does.
func put(t *testing.T, h *History, at time.Time, pass uint64, kind, account, db string, size, dbs int64) {
	t.Helper()
	require.NoError(t, h.send(context.Background(), []any{
		[]time.Time{at}, []time.Time{at}, []string{kind}, []string{account}, []string{db}, []uint64{pass},
		[]int64{size}, []int64{dbs}, []int64{0}, []int64{0}, []int64{0},
	}))
}

// Reads take, per bucket, the completed pass with the greatest ID, as a
// whole: a partial pass is ignored even with a greater ID, duplicates
// count once, an account absent from the selected pass reads as zero.
func TestHistoryReadsOneCompletedPassPerBucket(t *testing.T) {
	h := openHistory(t, requireCH(t))
	ctx := context.Background()
	T := time.Date(2026, 11, 30, 23, 0, 0, 0, time.UTC) // the buckets span two months
	T2 := T.Add(time.Hour)

	_, ok, err := h.LastCompleted(ctx)
	require.NoError(t, err)
	require.False(t, ok)
	_, err = h.StorageAt(ctx, "a", T)
	require.ErrorIs(t, err, ErrNoSnapshot)

	// Bucket T: pass 5 complete; pass 9 wrote a row and died.
	put(t, h, T, 5, KindAccount, "a", "", 100, 1)
	put(t, h, T, 5, KindAccount, "b", "", 10, 1)
	put(t, h, T, 5, KindDatabase, "a", "db-a1", 100, 0)
	put(t, h, T, 5, KindPass, "", "", 100, 1)
	put(t, h, T, 9, KindAccount, "a", "", 999, 1)
	at, err := h.StorageAt(ctx, "a", T.Add(time.Minute))
	require.NoError(t, err)
	assert.Equal(t, AccountStorage{SnapshotTime: T, AccountID: "a", SizeBytes: 100, Databases: 1}, at)

	// Pass 7 completes too (a second snapshotter), with a row stored twice
	// and without account b: it is the bucket now, b absent from it.
	put(t, h, T, 7, KindAccount, "a", "", 200, 2)
	put(t, h, T, 7, KindAccount, "a", "", 200, 2)
	put(t, h, T, 7, KindDatabase, "a", "db-a1", 150, 0)
	put(t, h, T, 7, KindDatabase, "a", "db-a2", 50, 0)
	put(t, h, T, 7, KindDatabase, "a", "db-a2", 50, 0)
	put(t, h, T, 7, KindPass, "", "", 200, 2)
	put(t, h, T, 7, KindPass, "", "", 200, 2)
	at, err = h.StorageAt(ctx, "a", T.Add(time.Minute))
	require.NoError(t, err)
	assert.Equal(t, AccountStorage{SnapshotTime: T, AccountID: "a", SizeBytes: 200, Databases: 2}, at)
	at, err = h.StorageAt(ctx, "b", T.Add(time.Minute))
	require.NoError(t, err)
	assert.Equal(t, AccountStorage{SnapshotTime: T, AccountID: "b"}, at)
	accts, err := h.AccountsAt(ctx, T)
	require.NoError(t, err)
	assert.Equal(t, []AccountStorage{{SnapshotTime: T, AccountID: "a", SizeBytes: 200, Databases: 2}}, accts)
	dbs, err := h.DatabasesAt(ctx, "a", T)
	require.NoError(t, err)
	assert.Equal(t, []DatabaseStorage{
		{SnapshotTime: T, AccountID: "a", UUID: "db-a1", SizeBytes: 150},
		{SnapshotTime: T, AccountID: "a", UUID: "db-a2", SizeBytes: 50},
	}, dbs)
	n, err := h.CountsAt(ctx, T)
	require.NoError(t, err)
	assert.Equal(t, Counts{Passes: 3, Stored: 12, Distinct: 3, Databases: 2, Accounts: 1, SizeBytes: 200}, n)

	// Bucket T2 (next month): b only.
	put(t, h, T2, 3, KindAccount, "b", "", 30, 1)
	put(t, h, T2, 3, KindPass, "", "", 30, 1)
	last, ok, err := h.LastCompleted(ctx)
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, Completed{SnapshotTime: T2, PassID: 3}, last)
	hist, err := h.AccountHistory(ctx, "a", T, T2)
	require.NoError(t, err)
	assert.Equal(t, []AccountStorage{
		{SnapshotTime: T, AccountID: "a", SizeBytes: 200, Databases: 2},
		{SnapshotTime: T2, AccountID: "a"},
	}, hist)
	hist, err = h.AccountHistory(ctx, "b", T, T2.Add(time.Hour))
	require.NoError(t, err)
	assert.Equal(t, []AccountStorage{
		{SnapshotTime: T, AccountID: "b"},
		{SnapshotTime: T2, AccountID: "b", SizeBytes: 30, Databases: 1},
	}, hist)
	hist, err = h.AccountHistory(ctx, "b", T2.Add(time.Second), T2.Add(time.Hour))
	require.NoError(t, err)
	assert.Empty(t, hist)
	at, err = h.StorageAt(ctx, "b", T2.Add(10*24*time.Hour))
	require.NoError(t, err)
	assert.Equal(t, AccountStorage{SnapshotTime: T2, AccountID: "b", SizeBytes: 30, Databases: 1}, at)
}
