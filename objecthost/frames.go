package objecthost

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shoaldb/shoal/internal/frame"
	v4 "github.com/shoaldb/shoal/internal/v4"
)

// frameServer serves the multiplexed query transport (internal/frame) on
// connections of the internal HTTP listener that an edge upgraded (GET
// /v1/frames, Upgrade: shoal-frames/1). The upgrade request went through
// apiHandler like any other, so the listener's mutual TLS and peerAllowed
// admitted the peer; every stream's request goes through apiHandler again
// (the same role check, routes, limits and error envelopes as over HTTP),
// with the connection's TLS state. Only the query routes (POST
// /v1/objects/{id}/query|raw, /v1/bound/query|raw) and the batched
// lifecycle calls of the create flow (POST /v1/batch/init and
// /v1/batch/confirm, batch.go) are served this way; the 101 answer says
// the latter with frame.HeaderRoutes, so an edge sends them here only to a
// host of this version or later (an earlier one refused them on streams).
//
// Each connection has one reading goroutine; each stream runs its handler
// on a worker goroutine of its own (never queued behind another stream),
// and its answer is queued on the connection's frame.Writer, which batches
// answers finishing together into one write. Workers outlive their stream
// and wait for the next (up to maxIdleWorkers wait, shared by every
// connection): a fresh goroutine per stream started on a small stack and
// grew it through the handler and SQLite on every query (runtime.newstack
// and copystack were ~15% of the host's CPU on this path in the deploy
// benchmark's profile); a worker keeps its grown stack between streams.
//
// Hijacked connections are not the HTTP server's any more: its Shutdown
// neither waits for them nor closes them. Host.Close drains them first
// (shutdown): a GoAway names the last stream accepted, streams up to it
// are answered, later ones are not executed (the edge may send them
// elsewhere), then the connection closes.
type frameServer struct {
	h *Host

	mu     sync.Mutex
	conns  map[*frameConn]struct{}
	closed bool
	wg     sync.WaitGroup // connections' readers, streams' handlers and workers

	// lifecycle: the batched lifecycle calls are served on streams (and
	// the 101 answer says so). Always true but in tests, which turn it off
	// to stand for a host of an earlier version.
	lifecycle bool

	work     chan *frameStream // idle workers receive here (unbuffered: never queues)
	idle     atomic.Int32      // workers waiting on work (approximately)
	stop     chan struct{}     // closed by shutdown: idle workers exit
	stopOnce sync.Once
}

// maxIdleWorkers bounds the workers kept waiting for a stream; a worker
// finishing while that many wait exits.
const maxIdleWorkers = 256

// frameDrain bounds how long Close waits for streams in flight (the HTTP
// listener's shutdown allows them the same).
const frameDrain = 30 * time.Second

// frameWriteTimeout: a stream's answer waits at most this long for the edge
// to take more of it (Window frames), as the HTTP listener's write timeout.
const frameWriteTimeout = 30 * time.Second

func newFrameServer(h *Host) *frameServer {
	return &frameServer{h: h, conns: map[*frameConn]struct{}{}, lifecycle: true, work: make(chan *frameStream), stop: make(chan struct{})}
}

// dispatch runs st on an idle worker, or on a new one when none waits.
// Called by a connection's reader (counted in wg, so wg.Add is safe while
// shutdown waits).
func (s *frameServer) dispatch(st *frameStream) {
	select {
	case s.work <- st:
	default:
		s.wg.Add(1)
		go s.worker(st)
	}
}

// worker runs streams until it finds maxIdleWorkers others waiting, or the
// server stops.
func (s *frameServer) worker(st *frameStream) {
	defer s.wg.Done()
	var scratch workerScratch
	for {
		st.run(&scratch)
		if s.idle.Add(1) > maxIdleWorkers {
			s.idle.Add(-1)
			return
		}
		select {
		case st = <-s.work:
			s.idle.Add(-1)
		case <-s.stop:
			s.idle.Add(-1)
			return
		}
	}
}

// upgrade answers GET /v1/frames: 101 and the connection becomes a frame
// connection, or a v4 error.
func (s *frameServer) upgrade(w http.ResponseWriter, r *http.Request, handler http.Handler) {
	if r.Method != http.MethodGet || !headerHas(r.Header, "Connection", "upgrade") || !headerHas(r.Header, "Upgrade", frame.Protocol) {
		v4.WriteError(w, http.StatusBadRequest, v4.CodeInvalidRequest, "GET "+frame.UpgradePath+" upgrades to "+frame.Protocol)
		return
	}
	s.mu.Lock()
	if s.closed || s.h.closed.Load() {
		s.mu.Unlock()
		writeErr(w, ErrClosed)
		return
	}
	s.wg.Add(1)
	s.mu.Unlock()
	nc, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		s.wg.Done()
		writeErr(w, fmt.Errorf("frames: %w", err))
		return
	}
	var br *bufio.Reader
	if n := brw.Reader.Buffered(); n > 0 {
		// Bytes past the upgrade request (a client should wait for the
		// 101, but they are the stream's either way).
		early, _ := brw.Reader.Peek(n)
		br = bufio.NewReaderSize(io.MultiReader(bytes.NewReader(bytes.Clone(early)), nc), 64<<10)
	} else {
		br = bufio.NewReaderSize(nc, 64<<10)
	}
	c := &frameConn{s: s, nc: nc, rd: frame.NewReader(br), streams: map[uint32]*frameStream{},
		tls: r.TLS, remote: r.RemoteAddr, host: r.Host, handler: handler}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.wr = frame.NewWriter(nc, func(error) { _ = nc.Close() })
	s.mu.Lock()
	s.conns[c] = struct{}{}
	s.mu.Unlock()
	answer := "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: " + frame.Protocol + "\r\n"
	if s.lifecycle {
		answer += frame.HeaderRoutes + ": " + frame.RoutesLifecycle + "\r\n"
	}
	if _, err := io.WriteString(nc, answer+"\r\n"); err != nil {
		c.close(err)
		s.wg.Done()
		return
	}
	go func() {
		defer s.wg.Done()
		c.serve()
	}()
}

// headerHas reports whether a comma-separated header holds token (case
// insensitive).
func headerHas(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for _, t := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}

// shutdown refuses new upgrades, sends every connection a GoAway, waits up
// to timeout for their streams to be answered and the connections to
// close, then closes what is left (cancelling its streams) and waits a
// little more for their handlers.
func (s *frameServer) shutdown(timeout time.Duration) {
	if s == nil {
		return
	}
	s.mu.Lock()
	s.closed = true
	s.stopOnce.Do(func() { close(s.stop) })
	conns := make([]*frameConn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, c := range conns {
		c.goAway()
	}
	done := make(chan struct{})
	go func() {
		s.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return
	case <-time.After(timeout):
	}
	s.mu.Lock()
	conns = conns[:0]
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, c := range conns {
		c.close(errors.New("object host closing"))
	}
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		s.h.log.Warn("frame streams still running after the drain; closing the host under them")
	}
}

type frameConn struct {
	s       *frameServer
	handler http.Handler // apiHandler: what serves each stream
	nc      net.Conn
	rd      *frame.Reader
	wr      *frame.Writer
	tls     *tls.ConnectionState
	remote  string
	host    string
	ctx     context.Context // cancelled when the connection ends: every stream's parent
	cancel  context.CancelFunc

	mu        sync.Mutex
	streams   map[uint32]*frameStream // opened, not yet answered (or reset before running)
	maxID     uint32                  // highest stream ID opened
	lastOK    uint32                  // highest stream ID accepted (the GoAway's)
	goingAway bool
	closeOnce sync.Once
}

type frameStream struct {
	c       *frameConn
	id      uint32
	path    string
	hdr     http.Header
	bodyLen int    // declared
	got     int    // received
	body    []byte // up to the host's MaxBodyBytes+1 bytes of it
	running bool
	ctx     context.Context
	cancel  context.CancelFunc

	// Answer side, under c.mu.
	credit int64 // answer bytes the edge will take
	// wake: a Window or reset arrived. Made (under c.mu) only when the
	// answer waits for the window, which a point query's never does;
	// signalled only when made.
	wake  chan struct{}
	reset bool // the edge abandoned the stream

	// Per-request values held here rather than allocated one by one for
	// every stream (each was an allocation per query): the request's body
	// reader, its URL, the response writer and apiHandler's recorder.
	bodyRd streamBody
	small  [smallBody]byte // the body when it fits (a point query's does)
	url    url.URL
	resp   frameResponse
	rec    failRecorder
}

// smallBody is the largest request body held in the stream itself.
const smallBody = 512

// streamBody is a stream's request body (http.Request.Body).
type streamBody struct{ bytes.Reader }

func (*streamBody) Close() error { return nil }

// wakeLocked signals a wait for the window, if the answer waits (c.mu held).
func (st *frameStream) wakeLocked() {
	if st.wake == nil {
		return
	}
	select {
	case st.wake <- struct{}{}:
	default:
	}
}

// serve reads frames until the connection fails or closes.
func (c *frameConn) serve() {
	err := c.read()
	c.close(err)
}

func (c *frameConn) read() error {
	maxBody := int(c.s.h.cfg.MaxBodyBytes)
	for {
		h, p, err := c.rd.Next()
		if err != nil {
			return err
		}
		switch h.Type {
		case frame.TypeRequest:
			req, err := frame.ParseRequest(p)
			if err != nil {
				return err
			}
			c.mu.Lock()
			if h.Stream <= c.maxID {
				c.mu.Unlock()
				return fmt.Errorf("%w: stream %d after %d", frame.ErrProtocol, h.Stream, c.maxID)
			}
			c.maxID = h.Stream
			if c.goingAway {
				// After the GoAway: not executed (the edge knows from
				// the GoAway's last ID); its Data frames are ignored.
				c.mu.Unlock()
				continue
			}
			if len(c.streams) >= frame.MaxStreams {
				c.mu.Unlock()
				return fmt.Errorf("%w: over %d streams", frame.ErrProtocol, frame.MaxStreams)
			}
			c.lastOK = h.Stream
			st := &frameStream{c: c, id: h.Stream, path: req.Path, hdr: req.Header, bodyLen: req.BodyLen,
				credit: frame.InitialWindow}
			c.streams[h.Stream] = st
			c.mu.Unlock()
			if err := st.addBody(req.Chunk, h.End(), maxBody); err != nil {
				return err
			}
		case frame.TypeData:
			c.mu.Lock()
			st := c.streams[h.Stream]
			known := h.Stream <= c.maxID
			c.mu.Unlock()
			if st == nil {
				if !known {
					return fmt.Errorf("%w: data on stream %d never opened", frame.ErrProtocol, h.Stream)
				}
				continue // reset, refused after a GoAway, or answered early
			}
			if st.running {
				return fmt.Errorf("%w: data after the end of stream %d", frame.ErrProtocol, h.Stream)
			}
			if err := st.addBody(p, h.End(), maxBody); err != nil {
				return err
			}
		case frame.TypeReset:
			c.mu.Lock()
			st := c.streams[h.Stream]
			if st != nil {
				st.reset = true
				if !st.running {
					delete(c.streams, h.Stream)
					c.idleCheckLocked()
				}
				st.wakeLocked()
			}
			c.mu.Unlock()
			if st != nil && st.running {
				st.cancel()
			}
		case frame.TypeWindow:
			n := int64(frame.Uint32(p))
			c.mu.Lock()
			if st := c.streams[h.Stream]; st != nil {
				st.credit += n
				if st.credit > 1<<31 {
					c.mu.Unlock()
					return fmt.Errorf("%w: window over 2 GiB", frame.ErrProtocol)
				}
				st.wakeLocked()
			}
			c.mu.Unlock()
		default:
			return fmt.Errorf("%w: frame type %d from a client", frame.ErrProtocol, h.Type)
		}
	}
}

// addBody takes the next bytes of the request body (only the reading
// goroutine calls it); at the end the stream starts. Bytes past max are
// counted, not kept: the handler's size check refuses the request as over
// HTTP (it sees ContentLength, the declared length).
func (st *frameStream) addBody(p []byte, end bool, max int) error {
	st.got += len(p)
	if st.got > st.bodyLen {
		return fmt.Errorf("%w: stream %d body past its declared %d bytes", frame.ErrProtocol, st.id, st.bodyLen)
	}
	if keep := min(len(p), max+1-len(st.body)); keep > 0 {
		if st.body == nil {
			if n := min(st.bodyLen, max+1); n <= smallBody {
				st.body = st.small[:0:n]
			} else {
				st.body = make([]byte, 0, n)
			}
		}
		st.body = append(st.body, p[:keep]...)
	}
	if !end {
		return nil
	}
	if st.got != st.bodyLen {
		return fmt.Errorf("%w: stream %d body of %d bytes, %d declared", frame.ErrProtocol, st.id, st.got, st.bodyLen)
	}
	c := st.c
	c.mu.Lock()
	if st.reset {
		c.mu.Unlock()
		return nil
	}
	st.running = true
	st.ctx, st.cancel = context.WithCancel(c.ctx)
	c.s.wg.Add(1)
	c.mu.Unlock()
	c.s.dispatch(st)
	return nil
}

// frameRoute reports whether path is one of the routes served over frames
// (plain paths only: no query string or escapes): the query routes, and
// with lifecycle the batched lifecycle calls.
func frameRoute(path string, lifecycle bool) bool {
	if strings.ContainsAny(path, "?#%") {
		return false
	}
	if _, _, ok := queryRoute(path); ok {
		return true
	}
	switch path {
	case "/v1/bound/query", "/v1/bound/raw":
		return true
	case batchInitPath, batchConfirmPath:
		return lifecycle
	}
	return false
}

// workerScratch is what a worker lends each stream it runs and takes back
// after: the answer's header map and its buffer. Both are done with when
// run returns (the frame writer copies the answer into its queue inside
// Send), so the next stream reuses them instead of allocating its own.
type workerScratch struct {
	hdr http.Header
	buf []byte
}

// maxScratchBuf bounds the answer buffer a worker keeps between streams.
const maxScratchBuf = 64 << 10

// run serves the stream's request through the host's handler and queues
// its answer.
func (st *frameStream) run(scratch *workerScratch) {
	c := st.c
	if scratch.hdr == nil {
		scratch.hdr = make(http.Header, 2)
	}
	st.resp = frameResponse{st: st, hdr: scratch.hdr, buf: scratch.buf[:0]}
	w := &st.resp
	defer func() {
		clear(scratch.hdr)
		if cap(w.buf) <= maxScratchBuf {
			scratch.buf = w.buf[:0]
		}
	}()
	defer func() {
		if p := recover(); p != nil {
			if p != http.ErrAbortHandler {
				c.s.h.log.Error("panic serving a frame stream", "path", st.path, "panic", p, "stack", string(debug.Stack()))
			}
			w.abort()
		}
		st.cancel()
		c.finished(st)
		c.s.wg.Done()
	}()
	if !frameRoute(st.path, c.s.lifecycle) {
		v4.WriteError(w, http.StatusBadRequest, v4.CodeInvalidRequest, "route not served over "+frame.Protocol)
		w.finish()
		return
	}
	st.url = url.URL{Path: st.path}
	st.bodyRd.Reset(st.body)
	base := http.Request{Method: http.MethodPost, URL: &st.url, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: st.hdr, Body: &st.bodyRd, ContentLength: int64(st.bodyLen),
		Host: c.host, RemoteAddr: c.remote, RequestURI: st.path, TLS: c.tls}
	r := base.WithContext(st.ctx) // base stays on the stack: one Request allocated, not two
	if a, ok := c.handler.(*apiHandler); ok {
		st.rec = failRecorder{ResponseWriter: w, status: http.StatusOK}
		a.serveRecorded(&st.rec, r)
	} else {
		c.handler.ServeHTTP(w, r)
	}
	w.finish()
}

// finished forgets an answered stream; the last one after a GoAway closes
// the connection once its answers are written.
func (c *frameConn) finished(st *frameStream) {
	c.mu.Lock()
	delete(c.streams, st.id)
	c.idleCheckLocked()
	c.mu.Unlock()
}

func (c *frameConn) idleCheckLocked() {
	if c.goingAway && len(c.streams) == 0 {
		c.wr.CloseWhenFlushed(func() { _ = c.nc.Close() })
	}
}

// goAway stops accepting streams: the GoAway names the last one accepted.
func (c *frameConn) goAway() {
	c.mu.Lock()
	if c.goingAway {
		c.mu.Unlock()
		return
	}
	c.goingAway = true
	last := c.lastOK
	// Queued under c.mu: no stream is accepted between choosing last and
	// the GoAway going out in order with the answers.
	_, _, _ = c.wr.Send(func(b []byte) []byte { return frame.AppendGoAway(b, last) })
	c.idleCheckLocked()
	c.mu.Unlock()
}

// close ends the connection: streams still running are cancelled.
func (c *frameConn) close(err error) {
	c.closeOnce.Do(func() {
		c.wr.Fail(net.ErrClosed)
		_ = c.nc.Close()
		c.cancel()
		c.s.mu.Lock()
		delete(c.s.conns, c)
		c.s.mu.Unlock()
		if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) && errors.Is(err, frame.ErrProtocol) {
			c.s.h.log.LogAttrs(context.Background(), slog.LevelWarn, "frame connection closed: peer broke the protocol",
				slog.String("peer", c.remote), slog.String("err", err.Error()))
		}
	})
}

// frameResponse is a stream's http.ResponseWriter: the answer's head and
// its first bytes go in one Response frame when the handler returns (or
// once a frame's worth is written); a larger answer follows in Data
// frames, each within the edge's window (the handler's Write waits for it,
// as it would for a slow HTTP client).
type frameResponse struct {
	st          *frameStream
	hdr         http.Header
	status      int
	wroteHeader bool
	sentHead    bool
	ended       bool
	buf         []byte // written, less than a frame, not yet sent
	err         error
}

func (w *frameResponse) Header() http.Header { return w.hdr }

func (w *frameResponse) WriteHeader(status int) {
	if w.wroteHeader || status < 200 {
		return
	}
	w.status, w.wroteHeader = status, true
}

func (w *frameResponse) Write(p []byte) (int, error) {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if w.err != nil {
		return 0, w.err
	}
	total := len(p)
	if len(w.buf) > 0 {
		k := min(len(p), frame.MaxPayload-len(w.buf))
		w.buf = append(w.buf, p[:k]...)
		p = p[k:]
		if len(w.buf) == frame.MaxPayload {
			if w.err = w.sendAll(w.buf, false); w.err != nil {
				return 0, w.err
			}
			w.buf = w.buf[:0]
		}
	}
	// Whole frames straight from p (a large answer is not copied here).
	for len(p) >= frame.MaxPayload {
		if w.err = w.sendAll(p[:frame.MaxPayload], false); w.err != nil {
			return 0, w.err
		}
		p = p[frame.MaxPayload:]
	}
	w.buf = append(w.buf, p...)
	return total, nil
}

// finish sends what is left, ending the answer.
func (w *frameResponse) finish() {
	if w.ended || w.err != nil {
		return
	}
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	w.err = w.sendAll(w.buf, true)
}

// abort resets the stream (a panic mid-answer, a stalled edge): the edge's
// read fails.
func (w *frameResponse) abort() {
	if w.ended {
		return
	}
	w.ended = true
	st := w.st
	_, _, _ = st.c.wr.Send(func(b []byte) []byte { return frame.AppendReset(b, st.id) })
}

var errStreamReset = errors.New("frames: the edge reset the stream")

// sendAll sends data as the answer's next bytes, within the stream's
// window; end ends the answer with them.
func (w *frameResponse) sendAll(data []byte, end bool) error {
	for {
		n, err := w.send(data, end)
		if err != nil {
			return err
		}
		data = data[n:]
		if len(data) == 0 {
			return nil
		}
	}
}

// send sends as much of data as the window allows (at least the head, and
// the end when all of data went), waiting for the window if it is closed.
func (w *frameResponse) send(data []byte, end bool) (int, error) {
	st := w.st
	c := st.c
	var timer *time.Timer
	c.mu.Lock()
	for st.credit <= 0 && len(data) > 0 && !st.reset {
		if st.wake == nil {
			st.wake = make(chan struct{}, 1)
		}
		c.mu.Unlock()
		if timer == nil {
			timer = time.NewTimer(frameWriteTimeout)
			defer timer.Stop()
		}
		select {
		case <-st.wake:
		case <-st.ctx.Done():
			return 0, st.ctx.Err()
		case <-timer.C:
			w.abort()
			return 0, errors.New("frames: the edge took no more of the answer within the write timeout")
		}
		c.mu.Lock()
	}
	if st.reset {
		c.mu.Unlock()
		w.ended = true
		return 0, errStreamReset
	}
	n := min(len(data), int(st.credit))
	st.credit -= int64(n)
	c.mu.Unlock()
	chunk := data[:n]
	last := end && n == len(data)
	var encErr error
	_, _, err := c.wr.Send(func(b []byte) []byte {
		if w.sentHead {
			return frame.AppendData(b, st.id, chunk, last)
		}
		delete(w.hdr, "Content-Length") // the frames delimit the answer
		b, encErr = frame.AppendResponse(b, st.id, w.status, w.hdr, chunk, last)
		return b
	})
	if encErr != nil {
		// A header the frame cannot carry: the answer cannot go out.
		w.abort()
		return 0, encErr
	}
	w.sentHead = true
	if last {
		w.ended = true
	}
	return n, err
}
