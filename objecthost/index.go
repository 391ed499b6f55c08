package objecthost

import (
	"fmt"
	"sync"

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
type index struct {
	db       *bolt.DB
	ops      chan *indexOp
	maxBatch int
	done     chan struct{}
	closeMu  sync.RWMutex
	closed   bool
	// batches counts committed transactions (tests and metrics).
	batches func(n int)
}

type indexOp struct {
	put    []*Meta
	remove []string
	err    chan error
}

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
	ix := &index{db: db, ops: make(chan *indexOp, 1024), maxBatch: 4096, done: make(chan struct{}), batches: batches}
	go ix.commitLoop()
	return ix, nil
}

// put durably stores the given records (replacing existing ones). It
// returns once they are fsynced.
func (ix *index) put(metas ...*Meta) error { return ix.submit(&indexOp{put: metas}) }

// remove durably deletes the records of the given object IDs.
func (ix *index) remove(ids ...string) error { return ix.submit(&indexOp{remove: ids}) }

func (ix *index) submit(op *indexOp) error {
	op.err = make(chan error, 1)
	ix.closeMu.RLock()
	if ix.closed {
		ix.closeMu.RUnlock()
		return errIndexClosed
	}
	ix.ops <- op
	ix.closeMu.RUnlock()
	return <-op.err
}

func (ix *index) commitLoop() {
	defer close(ix.done)
	for op := range ix.ops {
		batch := []*indexOp{op}
	drain:
		for len(batch) < ix.maxBatch {
			select {
			case o, ok := <-ix.ops:
				if !ok {
					break drain
				}
				batch = append(batch, o)
			default:
				break drain
			}
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
		for _, o := range batch {
			o.err <- err
		}
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
