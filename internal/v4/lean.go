package v4

// The lean HTTP/1.1 path (issue #15): a server-side loop for the plainly
// simple requests of the routes ServerOptions.Lean names (the edge: every
// route but its two streamed ones, so that a client pool mixing control
// calls and queries stays on it), beside net/http, for everything else.
// See ServerOptions.Lean and the "lean path" section of edge/DESIGN.md.
//
// What it saves, per keep-alive request, against net/http (measured with
// BenchmarkKeepAliveRequestCPU): the background read goroutine with its
// start and abort, the per-request bufio writers, textproto's general
// parsing and most read-deadline moves (the idle deadline is moved only
// when it has drifted, the header and body deadlines only when the request
// did not arrive in one read).
//
// What it keeps: one request at a time per connection, read from a
// bufio.Reader that the whole header block must fit in; the request is
// served lean only when it is plainly simple (leanHead), and anything else
// hands the connection, with every byte already buffered, to net/http for
// the rest of its life — so each unusual request gets exactly net/http's
// behaviour and errors. Answers are written as net/http writes them (the
// same header order, Date, Content-Length under 2 KiB of body and chunked
// above, Connection: close where net/http would add it).
//
// What it does not do: honour http.Server.SetKeepAlivesEnabled (Shoal
// never calls it; Shutdown is honoured), cancel a request's context when the client goes
// away mid-request (net/http notices through its background read; here
// the handler runs to its end, bounded by its own timeouts, and the write
// fails), and serve TLS (ServeWrapped always uses net/http).

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// leanReadBuffer is each lean connection's read buffer: a request's line
// and headers must fit in it to be served lean (larger ones go to
// net/http, whose MaxHeaderBytes then applies).
const leanReadBuffer = 4096

// leanIdleSlack: the idle deadline is moved only once it is more than
// IdleTimeout/leanIdleSlack short of IdleTimeout.
const leanIdleSlack = 32

// leanMaxHeaders: a request with more header lines goes to net/http.
const leanMaxHeaders = 64

// maxPostHandlerReadBytes is net/http's bound on the request body it reads
// after a handler to keep the connection; lean bodies are always below it,
// so unread rest is always discarded, as net/http does at that size.
const maxPostHandlerReadBytes = 256 << 10

// bufferBeforeChunking is net/http's response buffer: an answer that
// fits and is complete when the handler returns gets a Content-Length,
// a longer one is chunked.
const bufferBeforeChunking = 2048

// leanServer holds a Server's lean connections (for Shutdown and Close).
type leanServer struct {
	srv      *Server
	handler  http.Handler // the role's handler, without bodyGuard (leanBody guards)
	hot      func(method, path string) bool
	maxBody  int64
	shutting atomic.Bool
	// served and handed count requests served lean and connections
	// handed to net/http (tests, and LeanStats).
	served, handed atomic.Int64

	mu    sync.Mutex
	conns map[*leanConn]bool // value: idle (waiting for a request)
}

func newLeanServer(s *Server, h http.Handler) *leanServer {
	maxBody := s.o.LeanMaxBody
	if maxBody <= 0 {
		maxBody = 128 << 10
	}
	maxBody = min(maxBody, maxPostHandlerReadBytes-1)
	return &leanServer{srv: s, handler: h, hot: s.o.Lean, maxBody: maxBody, conns: make(map[*leanConn]bool)}
}

// serve accepts on wl (already wrapped by WrapListener) and serves every
// connection lean until its first request that is not; net/http serves
// those connections through a handoff listener.
func (ls *leanServer) serve(wl net.Listener) error {
	hl := &handoffListener{inner: wl, ch: make(chan net.Conn), done: make(chan struct{})}
	served := make(chan error, 1)
	go func() { served <- ls.srv.Server.Serve(hl) }()
	var backoff time.Duration
	for {
		c, err := wl.Accept()
		if err != nil {
			if te, ok := err.(interface{ Temporary() bool }); ok && te.Temporary() && !ls.shutting.Load() {
				// As net/http: a temporary accept failure (out of
				// file descriptors) is retried with a growing pause.
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				time.Sleep(backoff)
				continue
			}
			_ = hl.Close()
			serr := <-served
			if ls.shutting.Load() || errors.Is(serr, http.ErrServerClosed) {
				return http.ErrServerClosed
			}
			return err
		}
		backoff = 0
		lc := &leanConn{ls: ls, c: c, hl: hl}
		if !ls.track(lc) {
			_ = c.Close()
			continue
		}
		go lc.serve()
	}
}

// track registers lc (false once shutting down).
func (ls *leanServer) track(lc *leanConn) bool {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.shutting.Load() {
		return false
	}
	ls.conns[lc] = false
	return true
}

func (ls *leanServer) forget(lc *leanConn) {
	ls.mu.Lock()
	delete(ls.conns, lc)
	ls.mu.Unlock()
}

// setIdle marks lc waiting for a request (true) or serving one; it
// reports false when lc was closed by a shutdown in between.
func (ls *leanServer) setIdle(lc *leanConn, idle bool) bool {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if _, ok := ls.conns[lc]; !ok {
		return false
	}
	if !idle && ls.shutting.Load() {
		return false
	}
	ls.conns[lc] = idle
	return true
}

// closeIdle closes the idle lean connections (all of them with all set)
// and reports how many remain.
func (ls *leanServer) closeIdle(all bool) int {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	for lc, idle := range ls.conns {
		if idle || all {
			_ = lc.c.Close()
			delete(ls.conns, lc)
		}
	}
	return len(ls.conns)
}

// handoffListener is what net/http serves: the connections the lean loop
// hands over. Closing it closes the real listener.
type handoffListener struct {
	inner net.Listener
	ch    chan net.Conn
	done  chan struct{}
	once  sync.Once
	err   error
}

func (l *handoffListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *handoffListener) Close() error {
	l.once.Do(func() { close(l.done); l.err = l.inner.Close() })
	return l.err
}

func (l *handoffListener) Addr() net.Addr { return l.inner.Addr() }

// give hands c to net/http; false once the server is closed.
func (l *handoffListener) give(c net.Conn) bool {
	select {
	case l.ch <- c:
		return true
	case <-l.done:
		return false
	}
}

// replayConn is a handed-over connection: what the lean loop had read
// but not consumed comes first.
type replayConn struct {
	net.Conn
	br *bufio.Reader
}

func (c *replayConn) Read(p []byte) (int, error) {
	if c.br != nil {
		if c.br.Buffered() > 0 {
			return c.br.Read(p) // only buffered bytes: no read of the socket
		}
		c.br = nil
	}
	return c.Conn.Read(p)
}

// leanConn is one connection served by the lean loop.
type leanConn struct {
	ls *leanServer
	c  net.Conn
	hl *handoffListener
	br *bufio.Reader
	bw *bufio.Writer
	rw *bufio.Writer // the current answer's buffer (serveRequest)
	ew errWriter
	// rdl is the read deadline last set (Unix ns; 0: none).
	rdl        int64
	remoteAddr string
}

// errWriter records the connection's first write error (net/http's
// checkConnErrorWriter): a connection that failed a write is not reused.
type errWriter struct {
	c   net.Conn
	err error
}

func (w *errWriter) Write(p []byte) (int, error) {
	n, err := w.c.Write(p)
	if err != nil && w.err == nil {
		w.err = err
		_ = w.c.Close()
	}
	return n, err
}

func (lc *leanConn) setReadDeadline(t time.Time) {
	if t.IsZero() {
		lc.rdl = 0
	} else {
		lc.rdl = t.UnixNano()
	}
	_ = lc.c.SetReadDeadline(t)
}

// idleDeadline sets the read deadline d from now unless the one set is
// already between d-d/leanIdleSlack and d away (an idle deadline set by an
// earlier request; a header or body deadline further away is replaced):
// under load the deadline is then moved about once per d/leanIdleSlack,
// not per request.
func (lc *leanConn) idleDeadline(now time.Time, d time.Duration) {
	if left := time.Duration(lc.rdl - now.UnixNano()); lc.rdl != 0 && left >= d-d/leanIdleSlack && left <= d {
		return
	}
	lc.setReadDeadline(now.Add(d))
}

func (lc *leanConn) serve() {
	ls := lc.ls
	handed := false
	defer func() {
		if !handed {
			_ = lc.c.Close()
		}
		ls.forget(lc)
	}()
	lc.br = bufio.NewReaderSize(lc.c, leanReadBuffer)
	lc.ew.c = lc.c
	lc.bw = bufio.NewWriterSize(&lc.ew, 4<<10)
	lc.remoteAddr = lc.c.RemoteAddr().String()
	ctx := context.WithValue(context.Background(), http.ServerContextKey, ls.srv.Server)
	ctx = context.WithValue(ctx, http.LocalAddrContextKey, lc.c.LocalAddr())
	o := &ls.srv.o
	for first := true; ; first = false {
		now := time.Now()
		// Idle while waiting: Shutdown closes the connection (one that
		// has not sent its first request yet too; net/http gives those
		// 5 s, then closes them as well).
		if !ls.setIdle(lc, true) {
			return
		}
		if first {
			// net/http: the first request's line and headers within
			// ReadHeaderTimeout of the accept.
			lc.setReadDeadline(now.Add(o.ReadHeaderTimeout))
		} else {
			lc.idleDeadline(now, o.IdleTimeout)
		}
		if _, err := lc.br.Peek(1); err != nil {
			return // closed, idle or header timeout: net/http closes silently
		}
		if !ls.setIdle(lc, false) {
			return
		}
		if !first {
			// RFC 7230 section 3's tolerance after a POST, as net/http.
			peek, _ := lc.br.Peek(min(4, lc.br.Buffered()))
			k := 0
			for k < len(peek) && (peek[k] == '\r' || peek[k] == '\n') {
				k++
			}
			_, _ = lc.br.Discard(k)
			if lc.br.Buffered() == 0 {
				// Only line ends arrived: wait for the request as
				// net/http's request read would.
				if _, err := lc.br.Peek(1); err != nil {
					return
				}
			}
		}
		head, ok, err := lc.readHead(first)
		if err != nil {
			return // a header timeout: net/http closes without an answer
		}
		if !ok {
			// Checkpoint of the hand-over: from here net/http owns the
			// connection; nothing of it was consumed by the lean loop.
			lc.setReadDeadline(time.Time{})
			// Counted before the hand-over: once net/http has the
			// connection it may answer before this goroutine runs
			// again, and whoever reads the count after the answer
			// (tests, the handovers metric) must see it.
			ls.handed.Add(1)
			handed = lc.hl.give(&replayConn{Conn: lc.c, br: lc.br})
			if !handed {
				ls.handed.Add(-1)
			}
			return
		}
		if !lc.serveRequest(ctx, head) {
			return
		}
	}
}

// readHead waits until the buffer holds a whole header block and parses
// it. ok false: hand the connection over (the block is not plainly simple,
// does not fit the buffer, or the read failed otherwise than by timing
// out, which net/http then reports as it would). err: the header did not
// arrive in time.
func (lc *leanConn) readHead(first bool) (leanHead, bool, error) {
	deadlineSet := first
	for {
		buf, _ := lc.br.Peek(lc.br.Buffered())
		end := bytes.Index(buf, []byte("\r\n\r\n"))
		if bareLF(buf, end) {
			// Lines ended by LF alone (net/http accepts them): its
			// end may never be a CRLF CRLF, so do not wait for one.
			return leanHead{}, false, nil
		}
		if end >= 0 {
			h, ok := parseLeanHead(buf[:end+4], lc.ls.maxBody, lc.ls.hot)
			return h, ok, nil
		}
		if len(buf) >= lc.br.Size() {
			return leanHead{}, false, nil
		}
		if !deadlineSet {
			// The request did not arrive in one read: its header must
			// complete within ReadHeaderTimeout, as with net/http.
			lc.setReadDeadline(time.Now().Add(lc.ls.srv.o.ReadHeaderTimeout))
			deadlineSet = true
		}
		if _, err := lc.br.Peek(len(buf) + 1); err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return leanHead{}, false, err
			}
			return leanHead{}, false, nil
		}
	}
}

// bareLF reports whether buf has an LF not preceded by CR before end (or
// anywhere, end < 0).
func bareLF(buf []byte, end int) bool {
	if end >= 0 {
		buf = buf[:end]
	}
	for i := bytes.IndexByte(buf, '\n'); i >= 0; {
		if i == 0 || buf[i-1] != '\r' {
			return true
		}
		j := bytes.IndexByte(buf[i+1:], '\n')
		if j < 0 {
			break
		}
		i += 1 + j
	}
	return false
}

// serveRequest runs the handler on one parsed request and writes its
// answer; false: the connection is done (closed by the caller).
func (lc *leanConn) serveRequest(connCtx context.Context, h leanHead) (keep bool) {
	_, _ = lc.br.Discard(h.n)
	ctx, cancel := context.WithCancel(connCtx)
	defer cancel()
	req := &http.Request{
		Method: h.method, URL: &url.URL{Path: h.path, RawQuery: h.rawQuery}, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: h.header, ContentLength: h.contentLength, Host: h.host, RemoteAddr: lc.remoteAddr,
		RequestURI: h.uri, Body: http.NoBody,
	}
	var body *leanBody
	if h.contentLength > 0 {
		body = &leanBody{lc: lc, n: h.contentLength}
		req.Body = body
	}
	req = req.WithContext(ctx)
	w := &leanResponse{lc: lc, req: req, body: body, handlerHeader: make(http.Header, 4), contentLength: -1}
	w.cw.res = w
	// One response buffer per connection (one request at a time; finish
	// flushes it), as net/http pools its own: not 2 KiB per request.
	if lc.rw == nil {
		lc.rw = bufio.NewWriterSize(&w.cw, bufferBeforeChunking)
	} else {
		lc.rw.Reset(&w.cw)
	}
	w.w = lc.rw
	defer func() {
		if p := recover(); p != nil {
			if p != http.ErrAbortHandler {
				const size = 64 << 10
				buf := make([]byte, size)
				buf = buf[:runtime.Stack(buf, false)]
				lc.ls.srv.logf("http: panic serving %v: %v\n%s", lc.remoteAddr, p, buf)
			}
			_ = lc.bw.Flush() // what net/http's close would flush
			keep = false
		}
	}()
	lc.ls.served.Add(1)
	lc.ls.handler.ServeHTTP(w, req)
	w.finish()
	if lc.ew.err != nil || !w.shouldReuse() {
		if lc.ew.err == nil {
			closeWriteAndWait(lc.c)
		}
		return false
	}
	return true
}

// closeWriteAndWait is net/http's closing of a connection after an answer
// with "Connection: close": the write side first, then a pause so that a
// client still sending is not answered with a reset that could destroy
// the answer in flight.
func closeWriteAndWait(c net.Conn) {
	type closeWriter interface{ CloseWrite() error }
	if cw, ok := c.(closeWriter); ok {
		_ = cw.CloseWrite()
	} else if u, ok := c.(interface{ NetConn() net.Conn }); ok {
		if cw, ok := u.NetConn().(closeWriter); ok {
			_ = cw.CloseWrite()
		}
	}
	time.Sleep(500 * time.Millisecond)
}

func (s *Server) logf(format string, args ...any) {
	if s.Server.ErrorLog != nil {
		s.Server.ErrorLog.Printf(format, args...)
	}
}

// leanBody is a lean request's body: Content-Length bytes from the
// connection's buffer. Reads that must wait for the socket make progress
// under ServerOptions.BodyTimeout/BodyProgress as bodyGuard's do (and
// fail with ErrSlowBody); a body already buffered moves no deadline.
type leanBody struct {
	lc       *leanConn
	n        int64 // bytes left
	since    int64 // bytes since the deadline was moved
	deadline bool  // a body deadline is set
	closed   bool
	failed   bool
}

func (b *leanBody) Read(p []byte) (int, error) {
	if b.closed {
		return 0, http.ErrBodyReadAfterClose
	}
	if b.failed {
		return 0, io.ErrUnexpectedEOF
	}
	if b.n == 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > b.n {
		p = p[:b.n]
	}
	br := b.lc.br
	if br.Buffered() == 0 {
		o := &b.lc.ls.srv.o
		if !b.deadline || b.since >= o.BodyProgress {
			b.lc.setReadDeadline(time.Now().Add(o.BodyTimeout))
			b.deadline, b.since = true, 0
		}
	}
	m, err := br.Read(p)
	b.n -= int64(m)
	b.since += int64(m)
	if err != nil {
		b.failed = true
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return m, ErrSlowBody
		}
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return m, err
	}
	if b.n == 0 {
		return m, io.EOF
	}
	return m, nil
}

// Close discards what the handler left unread (always under net/http's
// maxPostHandlerReadBytes for a lean request).
func (b *leanBody) Close() error {
	if b.closed {
		return nil
	}
	b.discard()
	b.closed = true
	return nil
}

// discard reads the rest of the body; false when that failed.
func (b *leanBody) discard() bool {
	var buf [512]byte
	for b.n > 0 && !b.failed && !b.closed {
		if k := min(b.n, int64(b.lc.br.Buffered())); k > 0 {
			_, _ = b.lc.br.Discard(int(k))
			b.n -= k
			continue
		}
		if _, err := b.Read(buf[:]); err != nil && err != io.EOF {
			return false
		}
	}
	return b.n == 0 && !b.failed
}

// leanResponse is the lean path's http.ResponseWriter: net/http's
// response and chunkWriter reduced to what a handler of the lean routes
// can do (no Hijack, no trailers, no 100-continue), writing the same bytes.
type leanResponse struct {
	lc            *leanConn
	req           *http.Request
	body          *leanBody // nil: no body
	handlerHeader http.Header
	snap          http.Header // the header as of WriteHeader, once Header() was called
	calledHeader  bool
	wroteHeader   bool // logically
	status        int
	contentLength int64 // -1: not declared
	written       int64
	handlerDone   bool
	closeAfter    bool
	w             *bufio.Writer // bufferBeforeChunking bytes, into cw
	cw            leanChunkWriter
}

func (w *leanResponse) Header() http.Header {
	if w.snap == nil && w.wroteHeader && !w.cw.wroteHeader {
		w.snap = w.handlerHeader.Clone()
	}
	w.calledHeader = true
	return w.handlerHeader
}

func (w *leanResponse) WriteHeader(code int) {
	if w.wroteHeader {
		w.lc.ls.srv.logf("http: superfluous response.WriteHeader call")
		return
	}
	if code < 100 || code > 999 {
		panic(fmt.Sprintf("invalid WriteHeader code %v", code))
	}
	if code >= 100 && code <= 199 && code != http.StatusSwitchingProtocols {
		bw := w.lc.bw
		writeStatusLine(bw, code)
		_ = w.handlerHeader.WriteSubset(bw, excludedHeadersNoBody)
		_, _ = bw.WriteString("\r\n")
		_ = bw.Flush()
		return
	}
	w.wroteHeader = true
	w.status = code
	if w.calledHeader && w.snap == nil {
		w.snap = w.handlerHeader.Clone()
	}
	if cl := headerGet(w.handlerHeader, "Content-Length"); cl != "" {
		v, err := strconv.ParseInt(cl, 10, 64)
		if err == nil && v >= 0 {
			w.contentLength = v
		} else {
			w.lc.ls.srv.logf("http: invalid Content-Length of %q", cl)
			w.handlerHeader.Del("Content-Length")
		}
	}
}

func (w *leanResponse) Write(p []byte) (int, error) {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if len(p) == 0 {
		return 0, nil
	}
	if !bodyAllowedForStatus(w.status) {
		return 0, http.ErrBodyNotAllowed
	}
	w.written += int64(len(p))
	if w.contentLength != -1 && w.written > w.contentLength {
		return 0, http.ErrContentLength
	}
	return w.w.Write(p)
}

// Flush sends what is buffered (http.Flusher).
func (w *leanResponse) Flush() {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	_ = w.w.Flush()
	if !w.cw.wroteHeader {
		w.cw.writeHeader(nil)
	}
	_ = w.lc.bw.Flush()
}

// finish is net/http's finishRequest.
func (w *leanResponse) finish() {
	w.handlerDone = true
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	_ = w.w.Flush()
	w.cw.close()
	_ = w.lc.bw.Flush()
	if w.body != nil {
		_ = w.body.Close()
	}
}

func (w *leanResponse) shouldReuse() bool {
	if w.closeAfter {
		return false
	}
	if w.contentLength != -1 && bodyAllowedForStatus(w.status) && w.contentLength != w.written {
		return false
	}
	if w.body != nil && w.body.closed && w.body.n != 0 {
		return false
	}
	return true
}

// leanChunkWriter is net/http's chunkWriter: it writes the header on the
// first flush of the response buffer, then the body, chunked or not.
type leanChunkWriter struct {
	res         *leanResponse
	wroteHeader bool
	chunking    bool
}

func (cw *leanChunkWriter) Write(p []byte) (int, error) {
	if !cw.wroteHeader {
		cw.writeHeader(p)
	}
	bw := cw.res.lc.bw
	if cw.chunking {
		var hexBuf [20]byte
		b := strconv.AppendInt(hexBuf[:0], int64(len(p)), 16)
		b = append(b, '\r', '\n')
		if _, err := bw.Write(b); err != nil {
			return 0, err
		}
	}
	n, err := bw.Write(p)
	if cw.chunking && err == nil {
		_, err = bw.WriteString("\r\n")
	}
	return n, err
}

func (cw *leanChunkWriter) close() {
	if !cw.wroteHeader {
		cw.writeHeader(nil)
	}
	if cw.chunking {
		_, _ = cw.res.lc.bw.WriteString("0\r\n\r\n")
	}
}

var (
	excludedHeadersNoBody  = map[string]bool{"Content-Length": true, "Transfer-Encoding": true}
	suppressedHeaders304   = []string{"Content-Type", "Content-Length", "Transfer-Encoding"}
	suppressedHeadersNoBod = []string{"Content-Length", "Transfer-Encoding"}
)

// writeHeader is net/http's chunkWriter.writeHeader for an HTTP/1.1
// request that is not HEAD, has no Expect, no "Connection: close" and a
// Content-Length body (what leanHead admits); p is the first body bytes.
func (cw *leanChunkWriter) writeHeader(p []byte) {
	cw.wroteHeader = true
	w := cw.res
	keepAlives := !w.lc.ls.shutting.Load()
	header := w.snap
	if header == nil {
		header = w.handlerHeader
	}
	var exclude map[string]bool
	del := func(k string) {
		if _, ok := header[k]; !ok {
			return
		}
		if exclude == nil {
			exclude = make(map[string]bool)
		}
		exclude[k] = true
	}
	var date, clen []byte
	var contentType, connection, transferEncoding string

	te := headerGet(header, "Transfer-Encoding")
	hasTE := te != ""
	if w.handlerDone && !hasTE && bodyAllowedForStatus(w.status) && !headerHas(header, "Content-Length") {
		w.contentLength = int64(len(p))
		clen = strconv.AppendInt(make([]byte, 0, 12), int64(len(p)), 10)
	}
	hasCL := w.contentLength != -1
	if headerGet(header, "Connection") == "close" || !keepAlives {
		w.closeAfter = true
	}
	if w.body != nil && !w.closeAfter {
		// net/http: consume the rest of the body before answering (it is
		// under maxPostHandlerReadBytes); a failure closes the connection.
		if w.body.closed {
			if w.body.n != 0 {
				w.closeAfter = true
			}
		} else if !w.body.discard() {
			w.closeAfter = true
		} else {
			w.body.closed = true
		}
	}
	code := w.status
	if bodyAllowedForStatus(code) {
		_, haveType := header["Content-Type"]
		if header.Get("Content-Encoding") == "" && !haveType && !hasTE && len(p) > 0 {
			contentType = http.DetectContentType(p)
		}
	} else {
		sup := suppressedHeadersNoBod
		if code == http.StatusNotModified {
			sup = suppressedHeaders304
		}
		for _, k := range sup {
			del(k)
		}
	}
	if !headerHas(header, "Date") {
		date = time.Now().UTC().AppendFormat(make([]byte, 0, 29), http.TimeFormat)
	}
	if hasCL && hasTE && te != "identity" {
		w.lc.ls.srv.logf("http: WriteHeader called with both Transfer-Encoding of %q and a Content-Length of %d", te, w.contentLength)
		del("Content-Length")
		hasCL = false
	}
	switch {
	case !bodyAllowedForStatus(code) || code == http.StatusNoContent:
		del("Transfer-Encoding")
	case hasCL:
		del("Transfer-Encoding")
	case hasTE && te == "identity":
		cw.chunking = false
		w.closeAfter = true
		del("Transfer-Encoding")
	default:
		cw.chunking = true
		transferEncoding = "chunked"
		if hasTE && te == "chunked" {
			del("Transfer-Encoding")
		}
	}
	if cw.chunking {
		del("Content-Length")
	}
	if w.closeAfter && (!keepAlives || !hasToken(headerGet(w.snap, "Connection"), "close")) && code != http.StatusSwitchingProtocols {
		del("Connection")
		connection = "close"
	}
	bw := w.lc.bw
	writeStatusLine(bw, code)
	_ = header.WriteSubset(bw, exclude)
	if date != nil {
		_, _ = bw.WriteString("Date: ")
		_, _ = bw.Write(date)
		_, _ = bw.WriteString("\r\n")
	}
	if clen != nil {
		_, _ = bw.WriteString("Content-Length: ")
		_, _ = bw.Write(clen)
		_, _ = bw.WriteString("\r\n")
	}
	for i, v := range [3]string{contentType, connection, transferEncoding} {
		if v != "" {
			_, _ = bw.WriteString([3]string{"Content-Type: ", "Connection: ", "Transfer-Encoding: "}[i])
			_, _ = bw.WriteString(v)
			_, _ = bw.WriteString("\r\n")
		}
	}
	_, _ = bw.WriteString("\r\n")
}

func writeStatusLine(bw *bufio.Writer, code int) {
	_, _ = bw.WriteString("HTTP/1.1 ")
	var scratch [4]byte
	if text := http.StatusText(code); text != "" {
		_, _ = bw.Write(strconv.AppendInt(scratch[:0], int64(code), 10))
		_ = bw.WriteByte(' ')
		_, _ = bw.WriteString(text)
		_, _ = bw.WriteString("\r\n")
	} else {
		// As net/http: no reason phrase for an unknown code.
		fmt.Fprintf(bw, "%03d status code %d\r\n", code, code)
	}
}

func bodyAllowedForStatus(status int) bool {
	switch {
	case status >= 100 && status <= 199:
		return false
	case status == 204, status == 304:
		return false
	}
	return true
}

// headerGet is http.Header.Get for a canonical key (nil header: "").
func headerGet(h http.Header, k string) string {
	if v := h[k]; len(v) > 0 {
		return v[0]
	}
	return ""
}

func headerHas(h http.Header, k string) bool { _, ok := h[k]; return ok }

// hasToken reports whether token appears in the comma-separated v
// (ASCII case-insensitively), as net/http's hasToken.
func hasToken(v, token string) bool {
	for len(v) > 0 {
		var part string
		part, v, _ = cutByte(v, ',')
		if asciiEqualFold(trimOWS(part), token) {
			return true
		}
	}
	return false
}

func cutByte(s string, c byte) (string, string, bool) {
	for i := 0; i < len(s); i++ {
		if s[i] == c {
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}

func trimOWS(s string) string {
	for len(s) > 0 && (s[0] == ' ' || s[0] == '\t') {
		s = s[1:]
	}
	for len(s) > 0 && (s[len(s)-1] == ' ' || s[len(s)-1] == '\t') {
		s = s[:len(s)-1]
	}
	return s
}

func asciiEqualFold(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		x, y := a[i], b[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}
