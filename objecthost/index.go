package objecthost

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
)

var (
	bucketObjects = []byte("objects")
	// bucketIndexMeta holds keyJournalGen: every op of a journal
	// generation below it is in bbolt.
	bucketIndexMeta = []byte("index_meta")
	keyJournalGen   = []byte("journal_gen")
)

// errIndexClosed is returned by writes submitted after the index closed
// (the host is closing: callers see ErrClosed).
var errIndexClosed = fmt.Errorf("object index closed: %w", ErrClosed)

// index is the host-local durable metadata store: one bbolt file holding one
// JSON record per object, keyed by object ID, in front of which a
// write-ahead journal (journal.go) takes the commits.
//
// Writes go through a group committer: callers submit an op and block until
// the batch holding it is durable. One goroutine commits; every op submitted
// while a commit is in flight rides in the next batch, so the batch size
// adapts to the load with no added delay (bbolt's own Batch waits a fixed
// MaxBatchDelay before committing, which caps throughput at
// concurrency/delay). put and remove are safe for concurrent use.
//
// A commit is one journal record holding the whole batch and one fdatasync
// of the journal file: that fdatasync is the checkpoint of every op in the
// batch (a bbolt transaction costs two, data then meta, plus the page
// writes). Committed ops are kept in memory (the overlay) until a
// checkpoint, off the callers' path, writes them to bbolt in one ordinary
// (fsynced) transaction that also records the journal generation they
// came from; the journal file that held them is then reused. bbolt is
// therefore only ever written by fsynced transactions, so a power loss
// cannot leave it half-written (bbolt with NoSync can: it reuses freed
// pages and alternates its meta pages, and nothing checksums a data page).
// Opening replays the journal's live generations into bbolt, in order.
//
// The crash windows (each op is acknowledged only after its journal
// fdatasync):
//   - mid-append: the record is torn; its checksum fails and the replay
//     stops there. The batch was never acknowledged.
//   - after the journal fdatasync, before the checkpoint: the replay puts
//     the batch into bbolt.
//   - during a checkpoint: its bbolt transaction either committed (with
//     the new generation: the replay skips what it holds) or did not (the
//     replay applies it); the journal generation it came from is only
//     overwritten after that commit returned.
//   - during the replay: one bbolt transaction, the journal untouched
//     until it committed; a crash before replays again (put and remove of
//     whole records are idempotent in order).
//
// putLazy is for records whose loss in a crash is repaired by someone else
// (a confirm: the next heartbeat confirms again from the catalog). The
// caller does not wait, and the record does not cost a commit of its own: it
// rides in the next commit that a waiting put or remove triggers, or, if
// none comes within lazyDelay, in a commit of its own. Lazy records only
// share commits, which are durable as above. Ops are applied in submission
// order, so a later put of the same object always wins.
//
// Readers read bbolt and the overlay (load); the host reads the index once,
// at open, after the replay.
type index struct {
	db        *bolt.DB
	j         *journal
	ops       chan *indexOp
	maxBatch  int
	lazyDelay time.Duration
	// A generation is checkpointed once its journal holds checkpointBytes
	// or its first op is checkpointEvery old.
	checkpointBytes atomic.Int64 // atomic: tests change it while the index runs
	checkpointEvery time.Duration
	done            chan struct{}
	closeMu         sync.RWMutex
	closed          bool
	closeErr        error // a checkpoint that failed at close (the journal keeps its ops)

	// mu guards the overlay: object ID → encoded record (nil: removed) of
	// the ops committed to the journal but not yet to bbolt. cur is the
	// generation being appended; frozen the one being checkpointed (nil
	// when none). Only the commit loop writes cur; only the checkpointer
	// clears frozen.
	mu     sync.Mutex
	cur    map[string][]byte
	frozen map[string][]byte

	ckptReq  chan checkpointReq
	ckptDone chan error
	quit     chan struct{} // closed by close: a failing checkpoint stops retrying
	ckptExit chan struct{} // closed when the checkpointer returned

	// batches counts committed batches (tests and metrics).
	batches func(n int)
	// lazyFailed is told how many lazy records a failed commit dropped.
	lazyFailed func(n int)
	// checkpointFailed is told why a checkpoint failed (it is retried).
	checkpointFailed func(error)
	// beforeCheckpoint, if set, runs in the checkpointer before each
	// checkpoint's bbolt transaction (tests hold a checkpoint there).
	beforeCheckpoint func()
}

type indexOp struct {
	put    []*Meta
	remove []string
	lazy   bool       // nobody waits: err is nil
	err    chan error // buffered; nil for lazy ops
}

type checkpointReq struct {
	ops map[string][]byte
	gen uint64 // the generation bbolt records once it holds ops
}

const (
	// defaultLazyDelay bounds how long a lazy record waits for a commit to
	// ride in before it gets its own.
	defaultLazyDelay = 250 * time.Millisecond
	// At ~1,000 inits and confirms per second a host's journal grows by
	// ~0.5 MB/s: a checkpoint a second, each one bbolt transaction.
	defaultCheckpointBytes = 1 << 20
	defaultCheckpointEvery = time.Second
	checkpointRetry        = time.Second
)

func openIndex(path string, batches func(n int)) (*index, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{})
	if err != nil {
		return nil, fmt.Errorf("open index %s: %w", path, err)
	}
	var gen uint64
	if err := db.Update(func(tx *bolt.Tx) error {
		if _, err := tx.CreateBucketIfNotExists(bucketObjects); err != nil {
			return err
		}
		m, err := tx.CreateBucketIfNotExists(bucketIndexMeta)
		if err != nil {
			return err
		}
		gen = 1
		if v := m.Get(keyJournalGen); len(v) == 8 {
			gen = binary.BigEndian.Uint64(v)
		}
		return nil
	}); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("init index: %w", err)
	}
	j, err := openJournalFiles(path)
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	if gen, err = replayJournal(db, j, gen); err != nil {
		_ = j.close()
		_ = db.Close()
		return nil, fmt.Errorf("replay index journal: %w", err)
	}
	j.start(gen)
	if batches == nil {
		batches = func(int) {}
	}
	ix := &index{db: db, j: j, ops: make(chan *indexOp, 1024), maxBatch: 4096, lazyDelay: defaultLazyDelay,
		checkpointEvery: defaultCheckpointEvery,
		done:            make(chan struct{}), batches: batches, lazyFailed: func(int) {}, checkpointFailed: func(error) {},
		cur: map[string][]byte{}, ckptReq: make(chan checkpointReq, 1), ckptDone: make(chan error, 1),
		quit: make(chan struct{}), ckptExit: make(chan struct{})}
	ix.checkpointBytes.Store(defaultCheckpointBytes)
	go ix.checkpointer()
	go ix.commitLoop()
	return ix, nil
}

// replayJournal applies the journal's live generations — gen (bbolt holds
// every op before it) and gen+1 (begun if a checkpoint of gen was in
// flight) — to bbolt, in order, in one transaction that also records
// gen+2, and returns the generation to append next. With nothing to
// replay it returns gen: file gen%2 holds no record of gen, and the other
// file only ops of gen-1, which bbolt holds.
func replayJournal(db *bolt.DB, j *journal, gen uint64) (uint64, error) {
	first, err := j.read(gen)
	if err != nil {
		return 0, err
	}
	second, err := j.read(gen + 1)
	if err != nil {
		return 0, err
	}
	if len(first)+len(second) == 0 {
		return gen, nil
	}
	next := gen + 2
	err = db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketObjects)
		for _, ops := range [][]replayOp{first, second} {
			for _, op := range ops {
				var err error
				if op.value == nil {
					err = b.Delete(op.key)
				} else {
					err = b.Put(op.key, op.value)
				}
				if err != nil {
					return err
				}
			}
		}
		return putJournalGen(tx, next)
	})
	return next, err
}

func putJournalGen(tx *bolt.Tx, gen uint64) error {
	return tx.Bucket(bucketIndexMeta).Put(keyJournalGen, binary.BigEndian.AppendUint64(nil, gen))
}

// put durably stores the given records (replacing existing ones). It
// returns once they are fsynced.
func (ix *index) put(metas ...*Meta) error { return ix.submit(&indexOp{put: metas}) }

// putLazy stores the records with the next commit and returns at once (see
// index). The only error is errIndexClosed.
func (ix *index) putLazy(metas ...*Meta) error { return ix.submit(&indexOp{put: metas, lazy: true}) }

// remove durably deletes the records of the given object IDs.
func (ix *index) remove(ids ...string) error { return ix.submit(&indexOp{remove: ids}) }

func (ix *index) submit(op *indexOp) error {
	if !op.lazy {
		op.err = make(chan error, 1)
	}
	ix.closeMu.RLock()
	if ix.closed {
		ix.closeMu.RUnlock()
		return errIndexClosed
	}
	ix.ops <- op
	ix.closeMu.RUnlock()
	if op.lazy {
		return nil
	}
	return <-op.err
}

func (ix *index) commitLoop() {
	defer close(ix.done)
	var (
		batch   []*indexOp
		waiting bool             // batch holds only lazy ops, waiting to ride along
		timer   <-chan time.Time // fires when they have waited lazyDelay
		busy    bool             // a checkpoint is in flight
		failed  bool             // a checkpoint failed at close: never switch again
		due     bool             // the generation is checkpointEvery old
		ckpt    <-chan time.Time // fires checkpointEvery after the generation's first commit
	)
	// maybeCheckpoint hands the current generation to the checkpointer
	// once it is big or old enough and no checkpoint is in flight.
	maybeCheckpoint := func() {
		if busy || failed || len(ix.cur) == 0 {
			return
		}
		if !due && ix.j.off < ix.checkpointBytes.Load() {
			if ckpt == nil {
				ckpt = time.After(ix.checkpointEvery)
			}
			return
		}
		ix.startCheckpoint()
		busy, due, ckpt = true, false, nil
	}
	for {
		select {
		case op, ok := <-ix.ops:
			if !ok {
				ix.commit(batch) // close: lazy records are not dropped
				ix.finish(busy, failed)
				return
			}
			batch = append(batch, op)
		case <-timer:
			waiting = false
		case <-ckpt:
			ckpt, due = nil, true
		case err := <-ix.ckptDone:
			busy = false
			failed = err != nil
		}
	drain:
		for len(batch) < ix.maxBatch {
			select {
			case o, ok := <-ix.ops:
				if !ok {
					break drain // seen again (closed) by the next receive
				}
				batch = append(batch, o)
			default:
				break drain
			}
		}
		if len(batch) > 0 && onlyLazy(batch) && len(batch) < ix.maxBatch {
			if !waiting && timer == nil {
				waiting, timer = true, time.After(ix.lazyDelay)
			}
			if waiting {
				maybeCheckpoint()
				continue
			}
		}
		ix.commit(batch)
		batch, waiting, timer = nil, false, nil
		maybeCheckpoint()
	}
}

func onlyLazy(batch []*indexOp) bool {
	for _, o := range batch {
		if !o.lazy {
			return false
		}
	}
	return true
}

// commit appends batch to the journal as one record, fdatasyncs it, adds
// its ops to the overlay in submission order, and answers the waiting ops.
// Checkpoint: the journal's fdatasync.
func (ix *index) commit(batch []*indexOp) {
	if len(batch) == 0 {
		return
	}
	type kv struct {
		key   string
		value []byte
	}
	var ops []kv
	ix.j.begin()
	err := func() error {
		for _, o := range batch {
			for _, m := range o.put {
				v, err := encodeMeta(m)
				if err != nil {
					return err
				}
				ix.j.putOp(m.ObjectID, v)
				ops = append(ops, kv{m.ObjectID, v})
			}
			for _, id := range o.remove {
				ix.j.removeOp(id)
				ops = append(ops, kv{id, nil})
			}
		}
		return ix.j.append()
	}()
	if err != nil {
		err = fmt.Errorf("commit index: %w", err)
	} else {
		ix.mu.Lock()
		for _, op := range ops {
			ix.cur[op.key] = op.value
		}
		ix.mu.Unlock()
	}
	ix.batches(len(batch))
	dropped := 0
	for _, o := range batch {
		if o.lazy {
			if err != nil {
				dropped += len(o.put)
			}
			continue
		}
		o.err <- err
	}
	if dropped > 0 {
		ix.lazyFailed(dropped)
	}
}

// startCheckpoint freezes the current generation's overlay, hands it to
// the checkpointer and starts appending the next generation, in the other
// file. Called by the commit loop with no checkpoint in flight, so that
// file's previous generation is already in bbolt.
func (ix *index) startCheckpoint() {
	ix.mu.Lock()
	frozen := ix.cur
	ix.frozen, ix.cur = frozen, map[string][]byte{}
	ix.mu.Unlock()
	next := ix.j.gen + 1
	ix.j.start(next)
	ix.ckptReq <- checkpointReq{ops: frozen, gen: next}
}

// checkpointer writes each frozen generation to bbolt, retrying until it
// succeeds or the index closes, and reports to the commit loop.
func (ix *index) checkpointer() {
	defer close(ix.ckptExit)
	for req := range ix.ckptReq {
		var err error
		for {
			if err = ix.checkpoint(req); err == nil {
				break
			}
			ix.checkpointFailed(err)
			select {
			case <-time.After(checkpointRetry):
				continue
			case <-ix.quit:
			}
			break
		}
		ix.ckptDone <- err
	}
}

// checkpoint writes req's ops and generation to bbolt in one fsynced
// transaction. Checkpoint: that transaction's commit; only after it may
// the journal file of req.gen-1 be reused.
func (ix *index) checkpoint(req checkpointReq) error {
	if ix.beforeCheckpoint != nil {
		ix.beforeCheckpoint()
	}
	err := ix.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketObjects)
		for k, v := range req.ops {
			var err error
			if v == nil {
				err = b.Delete([]byte(k))
			} else {
				err = b.Put([]byte(k), v)
			}
			if err != nil {
				return err
			}
		}
		return putJournalGen(tx, req.gen)
	})
	if err != nil {
		return fmt.Errorf("checkpoint index: %w", err)
	}
	ix.mu.Lock()
	ix.frozen = nil
	ix.mu.Unlock()
	return nil
}

// finish runs at close, after the last commit: it waits for the checkpoint
// in flight and checkpoints what remains, so the next open has nothing to
// replay. If a checkpoint fails the journal still holds every op.
func (ix *index) finish(busy, failed bool) {
	defer close(ix.ckptReq)
	if busy {
		if err := <-ix.ckptDone; err != nil {
			ix.closeErr = err
			return
		}
	}
	if failed || len(ix.cur) == 0 {
		return
	}
	ix.startCheckpoint()
	ix.closeErr = <-ix.ckptDone
}

// load calls fn for every stored record, in key order: bbolt's, with the
// overlay's ops applied.
func (ix *index) load(fn func(*Meta) error) error {
	// Under mu, a read transaction and the overlay agree: a checkpoint
	// clears frozen only after its transaction committed, so the frozen
	// ops are either in the overlay copy or in what tx reads (or both:
	// they are whole records, applying them twice is harmless).
	ix.mu.Lock()
	tx, err := ix.db.Begin(false)
	if err != nil {
		ix.mu.Unlock()
		return err
	}
	over := make(map[string][]byte, len(ix.frozen)+len(ix.cur))
	for k, v := range ix.frozen {
		over[k] = v
	}
	for k, v := range ix.cur {
		over[k] = v
	}
	ix.mu.Unlock()
	defer func() { _ = tx.Rollback() }()
	return mergeRecords(tx, over, fn)
}

// mergeRecords calls fn, in key order, for every record of tx's objects
// bucket with over's ops applied (a nil value removes the record).
func mergeRecords(tx *bolt.Tx, over map[string][]byte, fn func(*Meta) error) error {
	keys := make([]string, 0, len(over))
	for k := range over {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	emit := func(k, v []byte) error {
		if v == nil {
			return nil
		}
		m, err := decodeMeta(v)
		if err != nil {
			return fmt.Errorf("decode record %q: %w", k, err)
		}
		return fn(m)
	}
	c := tx.Bucket(bucketObjects).Cursor()
	k, v := c.First()
	for k != nil || len(keys) > 0 {
		var err error
		switch {
		case len(keys) == 0 || (k != nil && bytes.Compare(k, []byte(keys[0])) < 0):
			err = emit(k, v)
			k, v = c.Next()
		default:
			ok := []byte(keys[0])
			if k != nil && bytes.Equal(k, ok) {
				k, v = c.Next()
			}
			err = emit(ok, over[keys[0]])
			keys = keys[1:]
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// ReadIndex calls fn, in key order, for every record of the index a
// stopped host left in dir, as the host will load it at its next start —
// bbolt's records with the journal's live generations applied — without
// writing anything (checks of a killed host's files use it; bbolt's lock
// is exclusive, so the host must not be running).
func ReadIndex(dir string, fn func(*Meta) error) error {
	path := filepath.Join(dir, "index.db")
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: 5 * time.Second})
	if err != nil {
		return fmt.Errorf("open index %s: %w", path, err)
	}
	defer db.Close()
	return db.View(func(tx *bolt.Tx) error {
		if tx.Bucket(bucketObjects) == nil {
			return nil
		}
		gen := uint64(1)
		if m := tx.Bucket(bucketIndexMeta); m != nil {
			if v := m.Get(keyJournalGen); len(v) == 8 {
				gen = binary.BigEndian.Uint64(v)
			}
		}
		over := map[string][]byte{}
		for g := gen; g <= gen+1; g++ {
			f, err := os.Open(journalPath(path, int(g%2)))
			if errors.Is(err, os.ErrNotExist) {
				continue
			} else if err != nil {
				return err
			}
			ops, err := readGeneration(f, g)
			_ = f.Close()
			if err != nil {
				return fmt.Errorf("read index journal: %w", err)
			}
			for _, op := range ops {
				over[string(op.key)] = op.value
			}
		}
		return mergeRecords(tx, over, fn)
	})
}

// size returns the index file's size in bytes (bbolt's; the journal's two
// preallocated files add 2 × journalPrealloc).
func (ix *index) size() int64 {
	var n int64
	_ = ix.db.View(func(tx *bolt.Tx) error { n = tx.Size(); return nil })
	return n
}

// close waits for in-flight commits, checkpoints, and closes the files.
func (ix *index) close() error {
	ix.closeMu.Lock()
	if ix.closed {
		ix.closeMu.Unlock()
		return nil
	}
	ix.closed = true
	close(ix.ops)
	close(ix.quit)
	ix.closeMu.Unlock()
	<-ix.done
	<-ix.ckptExit
	err := ix.closeErr
	if jerr := ix.j.close(); err == nil {
		err = jerr
	}
	if derr := ix.db.Close(); err == nil {
		err = derr
	}
	return err
}
