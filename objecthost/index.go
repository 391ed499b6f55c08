package objecthost

import (
	"fmt"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
)

var bucketObjects = []byte("objects")

// errIndexClosed is returned by writes submitted after the index closed
// (the host is closing: callers see ErrClosed).
var errIndexClosed = fmt.Errorf("object index closed: %w", ErrClosed)

// index is the host-local durable metadata store: one bbolt file holding one
// JSON record per object, keyed by object ID.
//
// Writes go through a group committer: callers submit an op and block until
// the transaction holding it has been fsynced. One goroutine commits; every
// op submitted while a commit is in flight rides in the next transaction, so
// the batch size adapts to the load with no added delay (bbolt's own Batch
// waits a fixed MaxBatchDelay before committing, which caps throughput at
// concurrency/delay). put and remove are safe for concurrent use.
//
// putLazy is for records whose loss in a crash is repaired by someone else
// (a confirm: the next heartbeat confirms again from the catalog). The
// caller does not wait, and the record does not cost a commit of its own: it
// rides in the next transaction that a waiting put or remove triggers, or,
// if none comes within lazyDelay, in a transaction of its own. Every commit
// is fsynced as before; lazy records only share them. Ops are applied in
// submission order, so a later put of the same object always wins.
type index struct {
	db        *bolt.DB
	ops       chan *indexOp
	maxBatch  int
	lazyDelay time.Duration
	done      chan struct{}
	closeMu   sync.RWMutex
	closed    bool
	// batches counts committed transactions (tests and metrics).
	batches func(n int)
	// lazyFailed is told how many lazy records a failed commit dropped.
	lazyFailed func(n int)
}

type indexOp struct {
	put    []*Meta
	remove []string
	lazy   bool       // nobody waits: err is nil
	err    chan error // buffered; nil for lazy ops
}

// defaultLazyDelay bounds how long a lazy record waits for a commit to ride
// in before it gets its own.
const defaultLazyDelay = 250 * time.Millisecond

func openIndex(path string, batches func(n int)) (*index, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{})
	if err != nil {
		return nil, fmt.Errorf("open index %s: %w", path, err)
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		_, err := tx.CreateBucketIfNotExists(bucketObjects)
		return err
	}); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("init index: %w", err)
	}
	if batches == nil {
		batches = func(int) {}
	}
	ix := &index{db: db, ops: make(chan *indexOp, 1024), maxBatch: 4096, lazyDelay: defaultLazyDelay,
		done: make(chan struct{}), batches: batches, lazyFailed: func(int) {}}
	go ix.commitLoop()
	return ix, nil
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
	)
	for {
		select {
		case op, ok := <-ix.ops:
			if !ok {
				ix.commit(batch) // close: lazy records are not dropped
				return
			}
			batch = append(batch, op)
		case <-timer:
			waiting = false
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
		if onlyLazy(batch) && len(batch) < ix.maxBatch {
			if !waiting && timer == nil {
				waiting, timer = true, time.After(ix.lazyDelay)
			}
			if waiting {
				continue
			}
		}
		ix.commit(batch)
		batch, waiting, timer = nil, false, nil
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

// commit writes batch in one fsynced transaction, in submission order, and
// answers the waiting ops.
func (ix *index) commit(batch []*indexOp) {
	if len(batch) == 0 {
		return
	}
	err := ix.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketObjects)
		for _, o := range batch {
			for _, m := range o.put {
				v, err := encodeMeta(m)
				if err != nil {
					return err
				}
				if err := b.Put([]byte(m.ObjectID), v); err != nil {
					return err
				}
			}
			for _, id := range o.remove {
				if err := b.Delete([]byte(id)); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		err = fmt.Errorf("commit index: %w", err)
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

// load calls fn for every stored record, in key order.
func (ix *index) load(fn func(*Meta) error) error {
	return ix.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketObjects).ForEach(func(k, v []byte) error {
			m, err := decodeMeta(v)
			if err != nil {
				return fmt.Errorf("decode record %q: %w", k, err)
			}
			return fn(m)
		})
	})
}

// size returns the index file's size in bytes.
func (ix *index) size() int64 {
	var n int64
	_ = ix.db.View(func(tx *bolt.Tx) error { n = tx.Size(); return nil })
	return n
}

// close waits for in-flight commits and closes the file.
func (ix *index) close() error {
	ix.closeMu.Lock()
	if ix.closed {
		ix.closeMu.Unlock()
		return nil
	}
	ix.closed = true
	close(ix.ops)
	ix.closeMu.Unlock()
	<-ix.done
	return ix.db.Close()
}
