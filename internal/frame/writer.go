package frame

import (
	"errors"
	"io"
	"runtime"
	"sync"
)

// Writer batches frames onto a connection. Frames queued while a write is
// in progress go out together in the next one: at 16–64 requests in flight
// many share one write (one TLS record, one system call). There is no
// writer goroutine: the first goroutine to queue onto an idle Writer writes,
// and keeps writing until the queue is empty; the others queue and return.
// So a lone request costs no goroutine hand-over, and under load the writes
// combine by themselves.
//
// After a failed write every later Send fails with that error; fail (given
// to NewWriter) is called once with it, to close the connection. Safe for
// concurrent use.
type Writer struct {
	w    io.Writer
	fail func(error)

	mu      sync.Mutex
	buf     []byte // queued, not yet handed to w
	spare   []byte
	writing bool
	err     error
	closer  func() // CloseWhenFlushed's
	queued  uint64 // bytes ever queued
	handed  uint64 // bytes ever handed to w.Write (written or not)
}

// NewWriter writes to w; fail is called once, with the first write error.
func NewWriter(w io.Writer, fail func(error)) *Writer { return &Writer{w: w, fail: fail} }

// maxKeep bounds the buffer kept between writes: a large body's buffer is
// left to the garbage collector.
const maxKeep = 1 << 20

// Send queues the bytes enc appends to its argument (whole frames) and
// writes them unless another goroutine is writing (then that one does). It
// returns the queue offset of the first byte (once the connection failed,
// the frames were never handed to it if Handed() <= start) and whether
// they were queued: not if the connection had failed before (err is that
// failure). An error with queued true is the failure of the write that
// carried them.
func (w *Writer) Send(enc func([]byte) []byte) (start uint64, queued bool, err error) {
	w.mu.Lock()
	if w.err != nil {
		err = w.err
		w.mu.Unlock()
		return 0, false, err
	}
	if w.closer != nil {
		w.mu.Unlock()
		return 0, false, ErrClosing
	}
	start = w.queued
	n0 := len(w.buf)
	w.buf = enc(w.buf)
	w.queued += uint64(len(w.buf) - n0)
	if w.writing {
		w.mu.Unlock()
		return start, true, nil
	}
	w.writing = true
	if n0 == 0 {
		// Alone in the queue: let the goroutines that are ready run
		// first, so that the frames they are about to send (on a busy
		// process, many) go out in this write instead of one each. With
		// nothing else ready this returns at once.
		w.mu.Unlock()
		runtime.Gosched()
		w.mu.Lock()
	}
	for len(w.buf) > 0 && w.err == nil {
		out := w.buf
		w.buf = w.spare[:0]
		w.handed += uint64(len(out))
		w.mu.Unlock()
		_, werr := w.w.Write(out)
		w.mu.Lock()
		if cap(out) <= maxKeep {
			w.spare = out[:0]
		} else {
			w.spare = nil
		}
		if werr != nil {
			w.err = werr
			err = werr
		}
	}
	w.writing = false
	failed := err != nil
	closer := w.closer
	w.mu.Unlock()
	if failed {
		w.fail(err)
	}
	if closer != nil {
		closer()
	}
	return start, true, err
}

// ErrClosing is Send's error after CloseWhenFlushed.
var ErrClosing = errors.New("frame: connection closing")

// CloseWhenFlushed calls closer once everything queued so far is written
// (at once if nothing is being written); later Sends fail with ErrClosing.
func (w *Writer) CloseWhenFlushed(closer func()) {
	w.mu.Lock()
	if w.closer != nil {
		w.mu.Unlock()
		return
	}
	w.closer = closer
	writing := w.writing
	w.mu.Unlock()
	if !writing {
		closer()
	}
}

// Handed is how many queued bytes were handed to the connection.
func (w *Writer) Handed() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.handed
}

// Fail makes every later Send fail with err (the connection is closing);
// frames still queued are never written.
func (w *Writer) Fail(err error) {
	w.mu.Lock()
	if w.err == nil {
		w.err = err
		w.buf = nil
	}
	w.mu.Unlock()
}
