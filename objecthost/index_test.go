package objecthost

import (
	"path/filepath"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

func indexRecords(t *testing.T, ix *index) map[string]*Meta {
	got := map[string]*Meta{}
	require.NoError(t, ix.load(func(m *Meta) error { got[m.ObjectID] = m; return nil }))
	return got
}

func openTestIndex(t *testing.T, path string) (*index, *[]int) {
	var mu sync.Mutex
	var batches []int
	ix, err := openIndex(path, func(n int) { mu.Lock(); batches = append(batches, n); mu.Unlock() })
	require.NoError(t, err)
	return ix, &batches
}

// A lazy record rides in the next waited-for commit: one transaction, no
// commit of its own.
func TestIndexLazyRidesWithNextCommit(t *testing.T) {
	ix, batches := openTestIndex(t, filepath.Join(t.TempDir(), "index.db"))
	defer ix.close()
	ix.lazyDelay = time.Hour // only a waited-for op can commit it
	require.NoError(t, ix.putLazy(&Meta{ObjectID: "a", State: StateActive, Confirmed: true}))
	require.NoError(t, ix.put(&Meta{ObjectID: "b", State: StateActive}))
	got := indexRecords(t, ix)
	require.True(t, got["a"].Confirmed, "the lazy record is durable once a later put returned")
	require.Contains(t, got, "b")
	require.Equal(t, []int{2}, *batches, "one transaction for both")
}

// Alone, a lazy record is committed after lazyDelay, not before: in a
// synctest bubble, the commit loop's timer runs on the bubble's clock, so
// the test steps time to just before and to the delay itself (bbolt's file
// I/O is real; synctest.Wait waits for it).
func TestIndexLazyAloneCommitsAfterDelay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ix, _ := openTestIndex(t, filepath.Join(t.TempDir(), "index.db"))
		defer ix.close()
		ix.lazyDelay = 20 * time.Millisecond
		require.NoError(t, ix.putLazy(&Meta{ObjectID: "a", State: StateActive, Confirmed: true}))
		synctest.Wait()
		require.Nil(t, indexRecords(t, ix)["a"], "nothing commits a lazy record at once")
		time.Sleep(ix.lazyDelay - time.Nanosecond) // synctest's fake clock: no real time passes
		synctest.Wait()
		require.Nil(t, indexRecords(t, ix)["a"], "nor before lazyDelay")
		time.Sleep(time.Nanosecond) // synctest's fake clock: no real time passes
		synctest.Wait()
		require.NotNil(t, indexRecords(t, ix)["a"], "committed once lazyDelay passed")
	})
}

// Submission order wins within a transaction: a lazy confirm followed by a
// waited-for delete of the same object leaves the delete.
func TestIndexLazyKeepsSubmissionOrder(t *testing.T) {
	ix, _ := openTestIndex(t, filepath.Join(t.TempDir(), "index.db"))
	defer ix.close()
	ix.lazyDelay = time.Hour
	require.NoError(t, ix.putLazy(&Meta{ObjectID: "a", State: StateActive, Confirmed: true}))
	require.NoError(t, ix.put(&Meta{ObjectID: "a", State: StateDeleted, Confirmed: true}))
	require.Equal(t, StateDeleted, indexRecords(t, ix)["a"].State)
}

// Closing commits what is still waiting; nothing lazy is dropped by a clean
// shutdown, and a closed index refuses more.
func TestIndexCloseFlushesLazy(t *testing.T) {
	path := filepath.Join(t.TempDir(), "index.db")
	ix, _ := openTestIndex(t, path)
	ix.lazyDelay = time.Hour
	for _, id := range []string{"a", "b", "c"} {
		require.NoError(t, ix.putLazy(&Meta{ObjectID: id, State: StateActive, Confirmed: true}))
	}
	require.NoError(t, ix.close())
	require.ErrorIs(t, ix.putLazy(&Meta{ObjectID: "d"}), ErrClosed)
	ix2, _ := openTestIndex(t, path)
	defer ix2.close()
	got := indexRecords(t, ix2)
	require.Len(t, got, 3)
	for _, m := range got {
		require.True(t, m.Confirmed)
	}
}
