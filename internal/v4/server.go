package v4

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"
)

// ServerOptions bound how long a client may hold a connection without
// making progress, on every listener Shoal serves (the edge's public API,
// object hosts, catalog nodes, the pipeline's and limiter's status). Zero
// values take the defaults.
type ServerOptions struct {
	// ReadHeaderTimeout: the request line and headers must arrive within
	// it (default 10 s); slower clients are disconnected.
	ReadHeaderTimeout time.Duration
	// MaxHeaderBytes bounds the request line and headers (default 64 KiB);
	// more is refused with 431 in the envelope.
	MaxHeaderBytes int
	// BodyTimeout and BodyProgress: a request body must deliver
	// BodyProgress bytes (default 64 KiB), or its end, within every
	// BodyTimeout (default 30 s), so a client trickling its body is cut off
	// (the handler's read fails with ErrSlowBody) while a large upload at
	// any reasonable speed is not.
	BodyTimeout  time.Duration
	BodyProgress int64
	// WriteTimeout and WriteChunk: the client must take WriteChunk bytes
	// (default 64 KiB) of an answer within every WriteTimeout (default
	// 30 s), or the connection is closed: a client that stops reading
	// cannot hold a handler forever. (A write may start with a deadline
	// set by an earlier one, up to WriteTimeout/32 closer: it is not
	// moved on every write.)
	WriteTimeout time.Duration
	WriteChunk   int
	// IdleTimeout closes keep-alive connections idle this long (default
	// 120 s). On the lean path a connection may close up to IdleTimeout/32
	// earlier (its deadline is not moved on every request).
	IdleTimeout time.Duration
	// Lean, when set, names the routes served by the lean HTTP/1.1
	// path (lean.go) instead of net/http (it is given the path without
	// the query): a plainly simple request
	// (parseLeanHead) whose method and path Lean accepts is served by the
	// same handler with a cheaper ResponseWriter; a connection's first
	// request that is not is handed, with the bytes already read, to
	// net/http for the rest of the connection's life. Only Serve uses it
	// (not ServeWrapped: no TLS). nil: net/http serves everything.
	Lean func(method, path string) bool
	// LeanMaxBody is the largest Content-Length the lean path serves
	// (default 128 KiB, at most 256 KiB - 1); larger bodies go to net/http.
	LeanMaxBody int64
}

func (o *ServerOptions) defaults() {
	if o.ReadHeaderTimeout <= 0 {
		o.ReadHeaderTimeout = 10 * time.Second
	}
	if o.MaxHeaderBytes <= 0 {
		o.MaxHeaderBytes = 64 << 10
	}
	if o.BodyTimeout <= 0 {
		o.BodyTimeout = 30 * time.Second
	}
	if o.BodyProgress <= 0 {
		o.BodyProgress = 64 << 10
	}
	if o.WriteTimeout <= 0 {
		o.WriteTimeout = 30 * time.Second
	}
	if o.WriteChunk <= 0 {
		o.WriteChunk = 64 << 10
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = 120 * time.Second
	}
}

// ErrSlowBody is the read error of a request body that stopped making
// progress (ServerOptions.BodyTimeout); handlers answer it with
// SlowBodyStatus and a message.
var ErrSlowBody = errors.New("request body arrived too slowly")

// SlowBodyStatus is the answer to ErrSlowBody: 408 Request Timeout.
const SlowBodyStatus = http.StatusRequestTimeout

// Server is an HTTP server with ServerOptions applied. Serve it with
// Serve(ln): the listener is wrapped so that protocol errors (a malformed
// request line, headers over the limit, …), which net/http answers itself
// in plain text, come back in the envelope, and answers are written with
// the write timeout.
type Server struct {
	*http.Server
	o    ServerOptions
	lean *leanServer // nil without ServerOptions.Lean
}

// NewServer returns a server of h with o's limits.
func NewServer(h http.Handler, o ServerOptions) *Server {
	o.defaults()
	s := &Server{o: o, Server: &http.Server{
		Handler:           &bodyGuard{h: h, timeout: o.BodyTimeout, progress: o.BodyProgress},
		ReadHeaderTimeout: o.ReadHeaderTimeout,
		MaxHeaderBytes:    o.MaxHeaderBytes,
		IdleTimeout:       o.IdleTimeout,
		// net/http's own messages (failed TLS handshakes, malformed
		// requests from scanners) go through the role's slog logger at
		// debug: they are the peer's fault, one per connection, and at
		// info they would flood an exposed listener's log.
		ErrorLog: slog.NewLogLogger(slog.Default().Handler(), slog.LevelDebug),
	}}
	if o.Lean != nil {
		s.lean = newLeanServer(s, h)
	}
	return s
}

// Serve serves on ln (wrapped, see Server) until Shutdown or Close; with
// ServerOptions.Lean, the hot routes on the lean path (lean.go).
func (s *Server) Serve(ln net.Listener) error {
	if s.lean != nil {
		return s.lean.serve(WrapListener(ln, s.o))
	}
	return s.Server.Serve(WrapListener(ln, s.o))
}

// Shutdown is http.Server's graceful shutdown, lean connections included:
// it stops accepting, closes idle connections, lets each request in
// flight finish (its answer then carries "Connection: close", as
// net/http's do) and returns when every connection is gone or ctx ends.
func (s *Server) Shutdown(ctx context.Context) error {
	if s.lean == nil {
		return s.Server.Shutdown(ctx)
	}
	s.lean.shutting.Store(true)
	s.lean.closeIdle(false)
	err := s.Server.Shutdown(ctx)
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for s.lean.closeIdle(false) > 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return err
}

// LeanStats reports how many requests the lean path served and how many
// connections it handed to net/http (zeros without ServerOptions.Lean).
func (s *Server) LeanStats() (served, handed int64) {
	if s.lean == nil {
		return 0, 0
	}
	return s.lean.served.Load(), s.lean.handed.Load()
}

// Close closes the listeners and every connection, lean ones included.
func (s *Server) Close() error {
	if s.lean == nil {
		return s.Server.Close()
	}
	s.lean.shutting.Store(true)
	err := s.Server.Close()
	s.lean.closeIdle(true)
	return err
}

// ServeWrapped is Serve with outer wrapping ln after this package's own
// (TLS: net/http must see the *tls.Conn to know its peer, so it goes
// outermost; protocol errors then stay net/http's plain text inside TLS).
func (s *Server) ServeWrapped(ln net.Listener, outer func(net.Listener) net.Listener) error {
	return s.Server.Serve(outer(WrapListener(ln, s.o)))
}

// ListenAndServe listens on s.Addr and serves.
func (s *Server) ListenAndServe() error {
	ln, err := net.Listen("tcp", s.Addr)
	if err != nil {
		return err
	}
	return s.Serve(ln)
}

// bodyGuard gives each request body a progress deadline (see
// ServerOptions.BodyTimeout). The deadline is the connection's read
// deadline, cleared when the body ends: net/http reads the connection in
// the background once the body is consumed, and a deadline left behind
// would cancel the request's context while the handler still works.
type bodyGuard struct {
	h        http.Handler
	timeout  time.Duration
	progress int64
}

type readDeadliner interface{ SetReadDeadline(time.Time) error }

func (g *bodyGuard) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.ContentLength == 0 || r.Body == nil || r.Body == http.NoBody {
		g.h.ServeHTTP(w, r)
		return
	}
	rd, ok := w.(readDeadliner)
	if !ok || rd.SetReadDeadline(time.Now().Add(g.timeout)) != nil {
		g.h.ServeHTTP(w, r)
		return
	}
	r.Body = &guardedBody{ReadCloser: r.Body, rd: rd, g: g}
	g.h.ServeHTTP(w, r)
}

type guardedBody struct {
	io.ReadCloser
	rd    readDeadliner
	g     *bodyGuard
	since int64 // bytes since the deadline was last moved
	done  bool
}

func (b *guardedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if b.done {
		return n, err
	}
	b.since += int64(n)
	switch {
	case err == io.EOF:
		b.done = true
		_ = b.rd.SetReadDeadline(time.Time{})
	case err != nil:
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			b.done = true
			return n, ErrSlowBody
		}
	case b.since >= b.g.progress:
		b.since = 0
		_ = b.rd.SetReadDeadline(time.Now().Add(b.g.timeout))
	}
	return n, err
}

// WrapListener wraps ln's connections: net/http's own plain-text answers to
// protocol errors are rewritten into the envelope, and every write must make
// progress within o.WriteTimeout (per o.WriteChunk bytes). NewServer's
// Serve does this; servers built otherwise can use it directly.
func WrapListener(ln net.Listener, o ServerOptions) net.Listener {
	o.defaults()
	return &listener{Listener: ln, o: o}
}

type listener struct {
	net.Listener
	o ServerOptions
}

func (l *listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &conn{Conn: c, o: &l.o}, nil
}

type conn struct {
	net.Conn
	o *ServerOptions
	// wdl is the write deadline write last set (Unix nanoseconds; 0: none
	// or set by someone else): a deadline still at least
	// WriteTimeout-writeSlack away is left as it is instead of being moved
	// on every write (each move is a lock and a timer update in the
	// runtime's poller, several per request).
	wdl atomic.Int64
}

// writeSlack: a write may run with a deadline up to WriteTimeout/32
// closer than WriteTimeout (29 s of a 30 s timeout), set by an earlier
// write.
func writeSlack(timeout time.Duration) time.Duration { return timeout / 32 }

func (c *conn) SetWriteDeadline(t time.Time) error {
	c.wdl.Store(0)
	return c.Conn.SetWriteDeadline(t)
}

func (c *conn) SetDeadline(t time.Time) error {
	c.wdl.Store(0)
	return c.Conn.SetDeadline(t)
}

// cannedHeaders is what net/http writes after the status line of the
// answers it sends itself, without a handler (server.go, "errorHeaders"):
// a handler's answer always has a Date header, so it never matches.
const cannedHeaders = "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"

func (c *conn) Write(p []byte) (int, error) {
	if bytes.HasPrefix(p, []byte("HTTP/1.1 ")) {
		if out, ok := envelopeFor(p); ok {
			if _, err := c.write(out); err != nil {
				return 0, err
			}
			return len(p), nil
		}
	}
	return c.write(p)
}

// write writes p in chunks, each with a deadline WriteTimeout away (less
// at most writeSlack, see conn.wdl).
func (c *conn) write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		chunk := p
		if len(chunk) > c.o.WriteChunk {
			chunk = chunk[:c.o.WriteChunk]
		}
		now := time.Now()
		if d := c.wdl.Load(); d == 0 || time.Duration(d-now.UnixNano()) < c.o.WriteTimeout-writeSlack(c.o.WriteTimeout) {
			dl := now.Add(c.o.WriteTimeout)
			_ = c.Conn.SetWriteDeadline(dl)
			c.wdl.Store(dl.UnixNano())
		}
		m, err := c.Conn.Write(chunk)
		n += m
		if err != nil {
			return n, err
		}
		p = p[m:]
	}
	return n, nil
}

// envelopeFor rewrites one of net/http's canned protocol-error answers
// ("HTTP/1.1 400 Bad Request" + cannedHeaders + text) into the same status
// with a v4 envelope body.
func envelopeFor(p []byte) ([]byte, bool) {
	line, rest, ok := bytes.Cut(p, []byte("\r\n"))
	if !ok || !bytes.HasPrefix(rest, []byte(cannedHeaders[2:])) || len(line) < len("HTTP/1.1 400") {
		return nil, false
	}
	status, err := strconv.Atoi(string(line[9:12]))
	if err != nil || status < 400 || status > 599 {
		return nil, false
	}
	// The reason after the status text, when net/http gives one (a
	// constant of its own, never request bytes).
	detail := ""
	if _, after, ok := bytes.Cut(line[12:], []byte(": ")); ok {
		detail = string(after)
	}
	code, msg := CodeInvalidRequest, "Bad Request: malformed HTTP request"
	switch status {
	case http.StatusRequestHeaderFieldsTooLarge:
		code, msg = CodeTooLarge, "Request Header Fields Too Large: the request line and headers are over the limit"
	case http.StatusNotImplemented:
		msg = "Not Implemented: unsupported transfer encoding"
	case http.StatusHTTPVersionNotSupported:
		msg = "HTTP Version Not Supported"
	}
	if detail != "" {
		msg = http.StatusText(status) + ": " + detail
	}
	var body bytes.Buffer
	w := &bufferResponse{h: http.Header{}, body: &body}
	WriteError(w, status, code, msg)
	out := make([]byte, 0, 160+body.Len())
	out = append(out, line[:12]...)
	out = append(out, ' ')
	out = append(out, http.StatusText(status)...)
	out = append(out, "\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: "...)
	out = strconv.AppendInt(out, int64(body.Len()), 10)
	out = append(out, "\r\n\r\n"...)
	return append(out, body.Bytes()...), true
}

// bufferResponse collects what WriteError writes.
type bufferResponse struct {
	h    http.Header
	body *bytes.Buffer
}

func (b *bufferResponse) Header() http.Header         { return b.h }
func (b *bufferResponse) Write(p []byte) (int, error) { return b.body.Write(p) }
func (b *bufferResponse) WriteHeader(int)             {}
