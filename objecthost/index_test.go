package objecthost

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"
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

// crashCopy copies the index files at path into a new directory, as a
// killed process leaves them (what it wrote is in the page cache; nothing
// runs at exit), and returns the copy's index path. The caller makes sure
// no checkpoint is writing bbolt meanwhile.
func crashCopy(t *testing.T, path string) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "index.db")
	for _, p := range []string{path, journalPath(path, 0), journalPath(path, 1)} {
		b, err := os.ReadFile(p)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(filepath.Dir(dst), filepath.Base(p)), b, 0o600))
	}
	return dst
}

// openNoCheckpoint opens an index whose checkpoints run only when asked
// for (checkpointNow) or at close.
func openNoCheckpoint(t *testing.T, path string) *index {
	ix, _ := openTestIndex(t, path)
	ix.checkpointBytes.Store(1 << 62)
	ix.checkpointEvery = time.Hour
	return ix
}

// storedGen reads the journal generation bbolt records (every op of the
// generations before it is in bbolt).
func storedGen(t *testing.T, ix *index) uint64 {
	g := uint64(1) // a new index's first generation, not stored yet
	require.NoError(t, ix.db.View(func(tx *bolt.Tx) error {
		if v := tx.Bucket(bucketIndexMeta).Get(keyJournalGen); v != nil {
			g = binary.BigEndian.Uint64(v)
		}
		return nil
	}))
	return g
}

// checkpointNow makes the next commit start a checkpoint and waits until
// bbolt records the new generation.
func checkpointNow(t *testing.T, ix *index, trigger *Meta) {
	t.Helper()
	gen := storedGen(t, ix)
	ix.checkpointBytes.Store(0)
	require.NoError(t, ix.put(trigger))
	require.Eventually(t, func() bool { return storedGen(t, ix) > gen }, 10*time.Second, time.Millisecond)
	ix.checkpointBytes.Store(1 << 62)
}

func ids(m map[string]*Meta) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// Acknowledged puts and removes that never reached bbolt (no checkpoint
// ran) survive a crash: the replay applies them, in order; a lazy record
// that rode in an acknowledged commit too. The replayed index takes new
// commits, and a second crash (after the replay, before any checkpoint)
// loses nothing either.
func TestIndexCrashReplaysJournal(t *testing.T) {
	path := filepath.Join(t.TempDir(), "index.db")
	ix := openNoCheckpoint(t, path)
	defer ix.close()
	ix.lazyDelay = time.Hour
	require.NoError(t, ix.put(&Meta{ObjectID: "a", State: StateActive}, &Meta{ObjectID: "b", State: StateActive}))
	require.NoError(t, ix.remove("a"))
	require.NoError(t, ix.putLazy(&Meta{ObjectID: "c", State: StateActive, Confirmed: true}))
	require.NoError(t, ix.put(&Meta{ObjectID: "d", State: StateActive}))
	require.NoError(t, ix.put(&Meta{ObjectID: "b", State: StateDeleted}))
	require.Equal(t, []string{"b", "c", "d"}, ids(indexRecords(t, ix)), "load sees the overlay")

	crashed := crashCopy(t, path)
	var read []string
	require.NoError(t, ReadIndex(filepath.Dir(crashed), func(m *Meta) error { read = append(read, m.ObjectID); return nil }))
	require.Equal(t, []string{"b", "c", "d"}, read, "ReadIndex sees what the replay will apply")
	ix2 := openNoCheckpoint(t, crashed)
	got := indexRecords(t, ix2)
	require.Equal(t, []string{"b", "c", "d"}, ids(got))
	require.Equal(t, StateDeleted, got["b"].State, "the later put of b wins")
	require.True(t, got["c"].Confirmed)
	require.NoError(t, ix2.put(&Meta{ObjectID: "e", State: StateActive}))
	require.NoError(t, ix2.remove("d"))

	again := crashCopy(t, crashed)
	ix3 := openNoCheckpoint(t, again)
	defer ix3.close()
	require.Equal(t, []string{"b", "c", "e"}, ids(indexRecords(t, ix3)))
	require.NoError(t, ix2.close())
}

// A torn last record (a crash mid-append: part of the record reached the
// disk) is dropped by its checksum; the records before it are kept, and
// the next commit overwrites it, so a later crash loses nothing behind it.
func TestIndexCrashTornTailDropped(t *testing.T) {
	path := filepath.Join(t.TempDir(), "index.db")
	ix := openNoCheckpoint(t, path)
	defer ix.close()
	require.NoError(t, ix.put(&Meta{ObjectID: "a", State: StateActive}))
	start := ix.j.off
	require.NoError(t, ix.put(&Meta{ObjectID: "b", State: StateActive, Name: "torn"}))
	end := ix.j.off
	file := ix.j.gen % 2

	crashed := crashCopy(t, path)
	// The second half of b's record never reached the disk: the old
	// contents (zeros here) are there instead.
	f, err := os.OpenFile(journalPath(crashed, int(file)), os.O_RDWR, 0)
	require.NoError(t, err)
	mid := start + (end-start)/2
	_, err = f.WriteAt(make([]byte, end-mid), mid)
	require.NoError(t, err)
	require.NoError(t, f.Close())

	ix2 := openNoCheckpoint(t, crashed)
	require.Equal(t, []string{"a"}, ids(indexRecords(t, ix2)), "the torn record was never acknowledged")
	require.NoError(t, ix2.put(&Meta{ObjectID: "c", State: StateActive}))
	ix3 := openNoCheckpoint(t, crashCopy(t, crashed))
	defer ix3.close()
	require.Equal(t, []string{"a", "c"}, ids(indexRecords(t, ix3)))
	require.NoError(t, ix2.close())
}

// A reused journal file still holds an older generation's records behind
// the newer ones; after a crash they are not replayed, so a removed record
// does not come back. Generation 1 (file 1) puts q and a; generation 2
// (file 0) removes a; generation 3 (file 1 again) puts b, whose record is
// exactly as long as q's, so the next record in file 1 is generation 1's
// intact "put a".
func TestIndexCrashOldGenerationNotResurrected(t *testing.T) {
	path := filepath.Join(t.TempDir(), "index.db")
	ix := openNoCheckpoint(t, path)
	defer ix.close()
	require.NoError(t, ix.put(&Meta{ObjectID: "q", State: StateActive}))
	require.NoError(t, ix.put(&Meta{ObjectID: "a", State: StateActive}))
	checkpointNow(t, ix, &Meta{ObjectID: "t1", State: StateActive})
	require.NoError(t, ix.remove("a"))
	checkpointNow(t, ix, &Meta{ObjectID: "t2", State: StateActive})
	checkpointNow(t, ix, &Meta{ObjectID: "b", State: StateActive}) // overwrites "put q" in file 1
	require.Eventually(t, func() bool { ix.mu.Lock(); defer ix.mu.Unlock(); return ix.frozen == nil }, 10*time.Second, time.Millisecond)

	ix2 := openNoCheckpoint(t, crashCopy(t, path))
	defer ix2.close()
	require.Equal(t, []string{"b", "q", "t1", "t2"}, ids(indexRecords(t, ix2)), "an old generation's put of a was replayed")
}

// A crash while a checkpoint is in flight (its bbolt transaction not
// committed) replays both live generations, oldest first: the frozen one's
// put of a, then the newer one's remove of a and put of b.
func TestIndexCrashDuringCheckpoint(t *testing.T) {
	path := filepath.Join(t.TempDir(), "index.db")
	ix := openNoCheckpoint(t, path)
	held, release := make(chan struct{}), make(chan struct{})
	ix.beforeCheckpoint = func() { close(held); <-release }
	require.NoError(t, ix.put(&Meta{ObjectID: "a", State: StateActive}))
	ix.checkpointBytes.Store(0)
	require.NoError(t, ix.put(&Meta{ObjectID: "z", State: StateActive}))
	<-held // the checkpoint of {a, z} waits before its transaction
	require.NoError(t, ix.remove("a"))
	require.NoError(t, ix.put(&Meta{ObjectID: "b", State: StateActive}))

	ix2 := openNoCheckpoint(t, crashCopy(t, path))
	defer ix2.close()
	require.Equal(t, []string{"b", "z"}, ids(indexRecords(t, ix2)))

	ix.beforeCheckpoint = nil
	close(release)
	require.NoError(t, ix.close())
	ix3 := openNoCheckpoint(t, path)
	defer ix3.close()
	require.Equal(t, []string{"b", "z"}, ids(indexRecords(t, ix3)), "after a clean close")
}

// Concurrent writers with a checkpoint after every commit, load running
// beside them: every acknowledged op is seen, after close and after a
// crash (race detector food).
func TestIndexConcurrentCheckpoints(t *testing.T) {
	path := filepath.Join(t.TempDir(), "index.db")
	ix := openNoCheckpoint(t, path)
	ix.checkpointBytes.Store(0)
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				id := fmt.Sprintf("w%d-%03d", w, i)
				assert.NoError(t, ix.put(&Meta{ObjectID: id, State: StateActive}))
				if i%3 == 0 {
					assert.NoError(t, ix.remove(id))
				}
			}
		}()
	}
	stop := make(chan struct{})
	loaded := make(chan struct{})
	go func() {
		defer close(loaded)
		for {
			select {
			case <-stop:
				return
			default:
				_ = indexRecords(t, ix)
			}
		}
	}()
	wg.Wait()
	close(stop)
	<-loaded
	want := 8 * 33
	require.Len(t, indexRecords(t, ix), want)
	ix.checkpointBytes.Store(1 << 62) // no new checkpoint: the crash copy reads bbolt
	require.Eventually(t, func() bool { ix.mu.Lock(); defer ix.mu.Unlock(); return ix.frozen == nil }, 10*time.Second, time.Millisecond)
	crashed := openNoCheckpoint(t, crashCopy(t, path))
	defer crashed.close()
	require.Len(t, indexRecords(t, crashed), want)
	require.NoError(t, ix.close())
	ix2, _ := openTestIndex(t, path)
	defer ix2.close()
	require.Len(t, indexRecords(t, ix2), want)
}

// An index written by a build before the journal (bbolt only: no
// index_meta bucket, no journal files) reads the same through ReadIndex
// and opens: the journal files are created then, and the records kept.
func TestIndexOpensPreJournalIndex(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "index.db")
	db, err := bolt.Open(path, 0o600, nil)
	require.NoError(t, err)
	v, err := encodeMeta(&Meta{ObjectID: "old", State: StateActive})
	require.NoError(t, err)
	require.NoError(t, db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucket(bucketObjects)
		if err != nil {
			return err
		}
		return b.Put([]byte("old"), v)
	}))
	require.NoError(t, db.Close())

	var read []string
	require.NoError(t, ReadIndex(dir, func(m *Meta) error { read = append(read, m.ObjectID); return nil }))
	require.Equal(t, []string{"old"}, read)
	ix := openNoCheckpoint(t, path)
	require.Equal(t, []string{"old"}, ids(indexRecords(t, ix)))
	require.NoError(t, ix.put(&Meta{ObjectID: "new", State: StateActive}))
	require.NoError(t, ix.close())
	read = nil
	require.NoError(t, ReadIndex(dir, func(m *Meta) error { read = append(read, m.ObjectID); return nil }))
	require.Equal(t, []string{"new", "old"}, read)
	for i := range 2 {
		st, err := os.Stat(journalPath(path, i))
		require.NoError(t, err)
		require.EqualValues(t, journalPrealloc, st.Size())
	}
}

// A commit whose fdatasync fails answers its ops the error and changes
// nothing they can see; the index keeps working, and the next commit
// overwrites the failed record in the journal, so a crash after it replays
// every acknowledged op and not the failed one — not even the tail of a
// failed record longer than the one written over it.
func TestIndexFailedSyncIsNotAcknowledged(t *testing.T) {
	path := filepath.Join(t.TempDir(), "index.db")
	ix := openNoCheckpoint(t, path)
	defer ix.close()
	require.NoError(t, ix.put(&Meta{ObjectID: "a", State: StateActive}))

	failNext := make(chan error, 1)
	ix.j.sync = func(f *os.File) error {
		select {
		case err := <-failNext:
			return err
		default:
			return fdatasync(f)
		}
	}
	failNext <- fmt.Errorf("injected: %w", syscall.EIO)
	var long []*Meta // a record several pages long
	for i := range 200 {
		long = append(long, &Meta{ObjectID: fmt.Sprintf("b%03d", i), State: StateActive})
	}
	before := ix.j.off
	err := ix.put(long...)
	require.ErrorIs(t, err, syscall.EIO, "the failed fdatasync is the ops' answer")
	require.Equal(t, before, ix.j.off, "the journal does not move past a failed record")
	require.Equal(t, []string{"a"}, ids(indexRecords(t, ix)), "nothing of the failed commit is visible")

	require.NoError(t, ix.put(&Meta{ObjectID: "c", State: StateActive}), "the next commit works")
	require.NoError(t, ix.remove("a"))
	require.Equal(t, []string{"c"}, ids(indexRecords(t, ix)))

	crashed := crashCopy(t, path)
	var read []string
	require.NoError(t, ReadIndex(filepath.Dir(crashed), func(m *Meta) error { read = append(read, m.ObjectID); return nil }))
	require.Equal(t, []string{"c"}, read, "ReadIndex: acknowledged ops only")
	ix2 := openNoCheckpoint(t, crashed)
	defer ix2.close()
	require.Equal(t, []string{"c"}, ids(indexRecords(t, ix2)), "the replay: acknowledged ops only")
}
