package edge

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shoaldb/shoal/internal/frame"
)

// hostFrames forwards queries to object hosts over multiplexed frame
// connections (internal/frame): one long-lived connection per host carries
// every query in flight to it, each a stream; answers come back in any
// order. Frames queued together go out in one write (frame.Writer), so at
// 16–64 queries in flight most share their system calls and TLS records
// instead of paying one HTTP exchange each.
//
// A connection is the host's internal HTTP listener's own (same address,
// same mutual TLS and role check), switched by an HTTP/1.1 Upgrade. A host
// that does not know the protocol answers the upgrade with 404 (an older
// version during a rolling upgrade): the edge then uses HTTP (hostConns)
// for that host and asks again after httpRecheck.
//
// The create flow's batched lifecycle calls (POST /v1/batch/init and
// /v1/batch/confirm, createbatch.go) go the same way to a host whose 101
// answer names frame.RoutesLifecycle; to a host of an earlier version,
// which serves only queries on streams, they keep their own HTTP request.
//
// Retries follow the HTTP path's rule: a query is sent again only if it
// provably never reached the host — the dial failed, the connection failed
// before the request's frames were handed to it, or the host's GoAway
// (it is closing) says the stream was not accepted. A connection lost with
// a request on it fails that request: a query may be a write.
type hostFrames struct {
	p *hostConns // dials (and TLS); the HTTP pool the fallback uses

	mu     sync.Mutex
	hosts  map[string]*frameHost
	closed bool
}

type frameHost struct {
	conns     []*frameConn
	dialing   chan struct{} // closed when the dial in progress ends
	httpUntil time.Time     // the host refused the upgrade: HTTP until then
}

// httpRecheck is how long an edge uses HTTP with a host that refused the
// upgrade (404: an older version) before asking again; other refusals
// (a closing host's 503) are asked about again at the next request after
// httpRetry.
const (
	httpRecheck = time.Minute
	httpRetry   = time.Second
)

// errUseHTTP: this host is reached over HTTP.
var errUseHTTP = errors.New("host does not speak " + frame.Protocol)

func newHostFrames(p *hostConns) *hostFrames {
	return &hostFrames{p: p, hosts: map[string]*frameHost{}}
}

// roundTrip sends one request on a frame connection to addr: a query, or
// with lifecycle a batched lifecycle call. ok false: the host is reached
// over HTTP for it (the caller falls back); nothing was sent.
func (f *hostFrames) roundTrip(ctx context.Context, addr, path string, hdr http.Header, body []byte, timeout time.Duration, lifecycle bool) (resp *http.Response, ok bool, err error) {
	for attempt := 0; ; attempt++ {
		c, err := f.conn(ctx, addr, timeout)
		if errors.Is(err, errUseHTTP) {
			return nil, false, nil
		}
		if err != nil {
			return nil, true, &errNotSent{err}
		}
		if lifecycle && !c.lifecycle {
			return nil, false, nil // an earlier version: its streams take queries only
		}
		resp, err := c.roundTrip(ctx, path, hdr, body, timeout)
		var ns *errNotSent
		if err != nil && errors.As(err, &ns) && attempt < 2 && ctx.Err() == nil {
			continue // the connection failed or closed before the request left: another
		}
		return resp, true, err
	}
}

// conn returns an open connection to addr with room for a stream, dialing
// one if needed (one dial per host at a time; the others wait for it);
// timeout is the requests' (it sets a new connection's reapTick).
func (f *hostFrames) conn(ctx context.Context, addr string, timeout time.Duration) (*frameConn, error) {
	f.mu.Lock()
	for {
		if f.closed {
			f.mu.Unlock()
			return nil, net.ErrClosed
		}
		fh := f.hosts[addr]
		if fh == nil {
			fh = &frameHost{}
			f.hosts[addr] = fh
		}
		if !fh.httpUntil.IsZero() && time.Now().Before(fh.httpUntil) {
			f.mu.Unlock()
			return nil, errUseHTTP
		}
		for _, c := range fh.conns {
			if c.available() {
				f.mu.Unlock()
				return c, nil
			}
		}
		if ch := fh.dialing; ch != nil {
			f.mu.Unlock()
			select {
			case <-ch:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			f.mu.Lock()
			continue
		}
		ch := make(chan struct{})
		fh.dialing = ch
		f.mu.Unlock()
		c, err := f.dial(ctx, addr, timeout)
		f.mu.Lock()
		fh.dialing = nil
		close(ch)
		var ue *upgradeRefused
		switch {
		case errors.As(err, &ue):
			wait := httpRetry
			if ue.status == http.StatusNotFound {
				wait = httpRecheck
			}
			fh.httpUntil = time.Now().Add(wait)
			f.mu.Unlock()
			return nil, errUseHTTP
		case err != nil:
			f.mu.Unlock()
			return nil, err
		case f.closed:
			f.mu.Unlock()
			c.die(net.ErrClosed)
			return nil, net.ErrClosed
		}
		fh.httpUntil = time.Time{}
		fh.conns = append(fh.conns, c)
		c.onDone = func() { f.remove(addr, c) }
		f.mu.Unlock()
		c.start()
		return c, nil
	}
}

// remove forgets a connection that died or is going away.
func (f *hostFrames) remove(addr string, c *frameConn) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fh := f.hosts[addr]
	if fh == nil {
		return
	}
	for i, x := range fh.conns {
		if x == c {
			fh.conns = append(fh.conns[:i], fh.conns[i+1:]...)
			break
		}
	}
	if len(fh.conns) == 0 && fh.dialing == nil && fh.httpUntil.IsZero() {
		delete(f.hosts, addr)
	}
}

func (f *hostFrames) close() {
	f.mu.Lock()
	f.closed = true
	var all []*frameConn
	for _, fh := range f.hosts {
		all = append(all, fh.conns...)
	}
	f.hosts = map[string]*frameHost{}
	f.mu.Unlock()
	for _, c := range all {
		c.die(net.ErrClosed)
	}
}

// upgradeRefused is a host answering the upgrade with another status.
type upgradeRefused struct{ status int }

func (e *upgradeRefused) Error() string {
	return fmt.Sprintf("object host answered the %s upgrade with %d", frame.Protocol, e.status)
}

// upgradeTimeout bounds the upgrade exchange after the dial.
const upgradeTimeout = 10 * time.Second

// dial opens a connection (TLS when configured) and upgrades it. A host
// refusing the upgrade keeps its connection for HTTP (it goes to the
// HTTP pool when its answer allows).
func (f *hostFrames) dial(ctx context.Context, addr string, timeout time.Duration) (*frameConn, error) {
	hc, err := f.p.dial(ctx, addr)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(upgradeTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	_ = hc.nc.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { _ = hc.nc.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	req := "GET " + frame.UpgradePath + " HTTP/1.1\r\nHost: " + addr + "\r\nConnection: Upgrade\r\nUpgrade: " + frame.Protocol + "\r\n\r\n"
	if _, err := io.WriteString(hc.nc, req); err != nil {
		hc.nc.Close()
		return nil, err
	}
	resp, err := http.ReadResponse(hc.br, nil)
	if err != nil {
		hc.nc.Close()
		return nil, err
	}
	if resp.StatusCode != http.StatusSwitchingProtocols || resp.Header.Get("Upgrade") != frame.Protocol {
		_, err := io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		if err == nil && !resp.Close && stop() {
			_ = hc.nc.SetDeadline(time.Time{})
			f.p.put(addr, hc)
		} else {
			hc.nc.Close()
		}
		return nil, &upgradeRefused{status: resp.StatusCode}
	}
	if !stop() {
		hc.nc.Close()
		return nil, ctx.Err()
	}
	_ = hc.nc.SetDeadline(time.Time{})
	c := &frameConn{nc: hc.nc, rd: frame.NewReader(hc.br), streams: map[uint32]*frameStream{}, done: make(chan struct{}),
		reapTick: min(max(timeout/32, 5*time.Millisecond), time.Second), lifecycle: headerToken(resp.Header, frame.HeaderRoutes, frame.RoutesLifecycle)}
	c.wr = frame.NewWriter(hc.nc, func(err error) { c.die(err) })
	return c, nil
}

// headerToken reports whether a comma-separated header holds token (case
// insensitive).
func headerToken(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for _, t := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}

// frameConn is one multiplexed connection to a host.
type frameConn struct {
	nc     net.Conn
	rd     *frame.Reader
	wr     *frame.Writer
	onDone func()        // set before start: removes it from the pool
	done   chan struct{} // closed by die: the reaper stops
	// reapTick is how often the reaper looks for streams past their
	// deadline: a request's timeout takes effect up to one tick late
	// (1/32 of it, between 5 ms and 1 s).
	reapTick time.Duration
	// lifecycle: the host serves the batched lifecycle calls on streams
	// (its 101 answer named frame.RoutesLifecycle).
	lifecycle bool

	mu      sync.Mutex
	streams map[uint32]*frameStream
	nextID  uint32
	err     error  // why it died (nil: alive)
	handed  uint64 // the writer's Handed() when it died
	goAway  bool   // the host is closing: no new streams
	lastOK  uint32 // the GoAway's last accepted stream
	retired bool   // silent past a request's deadline: no new streams
	removed bool

	lastRead atomic.Int64 // unix nanoseconds of the last frame read
}

type frameStream struct {
	c        *frameConn
	id       uint32
	start    uint64 // the writer's offset of its request (set before waiting)
	sent     int64  // unix nanoseconds when it was opened
	deadline int64  // unix nanoseconds: the reaper expires it from then on
	wake     chan struct{}

	// Under c.mu.
	head     bool
	status   int
	hdr      http.Header
	chunks   [][]byte
	recv     int64 // answer body bytes received
	granted  int64 // window granted beyond frame.InitialWindow
	consumed int64 // read by the caller, not yet granted back
	eof      bool
	err      error
	expired  bool // past its deadline (set by the reaper)
}

func (c *frameConn) start() {
	go c.readLoop()
	go c.reap()
}

// reap expires the streams past their deadline, every reapTick, until the
// connection dies. One ticker per connection instead of a timer per
// request: creating and stopping a runtime timer on every query was ~2%
// of the edge's CPU in the deploy benchmark's profile.
func (c *frameConn) reap() {
	t := time.NewTicker(c.reapTick)
	defer t.Stop()
	for {
		select {
		case <-c.done:
			return
		case now := <-t.C:
			n := now.UnixNano()
			c.mu.Lock()
			for _, st := range c.streams {
				if !st.expired && st.deadline <= n {
					st.expired = true
					signal(st.wake)
				}
			}
			c.mu.Unlock()
		}
	}
}

// available reports room for a new stream.
func (c *frameConn) available() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err == nil && !c.goAway && !c.retired && len(c.streams) < frame.MaxStreams && c.nextID < 1<<31
}

// errConnLost: the connection failed with a request on it, which may have
// run.
var errConnLost = errors.New("object host connection lost")

// errNotAccepted: the host, closing, did not accept the stream (GoAway).
var errNotAccepted = errors.New("object host closing: request not accepted")

// errStreamReset: the host abandoned the answer.
var errStreamReset = errors.New("object host reset the stream")

func (c *frameConn) roundTrip(ctx context.Context, path string, hdr http.Header, body []byte, timeout time.Duration) (*http.Response, error) {
	now := time.Now()
	wait := timeout
	if d, ok := ctx.Deadline(); ok && d.Sub(now) < wait {
		wait = d.Sub(now)
	}
	st := &frameStream{c: c, wake: make(chan struct{}, 1), sent: now.UnixNano(), deadline: now.Add(wait).UnixNano()}
	var encErr, refused error
	// The stream ID is chosen inside Send, under the writer's lock, so IDs
	// reach the wire in increasing order (the host requires it, and its
	// GoAway's "last accepted" depends on it); the stream is registered
	// before its frames can be written, so no answer finds it missing.
	// Lock order: the writer's, then c.mu.
	start, queued, err := c.wr.Send(func(b []byte) []byte {
		c.mu.Lock()
		if c.err != nil || c.goAway || c.retired || len(c.streams) >= frame.MaxStreams {
			refused = c.err
			if refused == nil {
				refused = errNotAccepted
			}
			c.mu.Unlock()
			return b
		}
		c.nextID++
		st.id = c.nextID
		c.streams[st.id] = st
		c.mu.Unlock()
		b, encErr = frame.AppendRequest(b, st.id, path, hdr, body)
		if encErr != nil {
			c.mu.Lock()
			delete(c.streams, st.id)
			c.mu.Unlock()
		}
		return b
	})
	switch {
	case encErr != nil:
		return nil, fmt.Errorf("forward: %w", encErr) // the same on any connection: not retried
	case refused != nil:
		return nil, &errNotSent{refused}
	case !queued:
		return nil, &errNotSent{err}
	}
	st.start = start
	// err != nil: the write carrying it failed; the connection is dead and
	// the stream fails below like every other on it.
	_ = err

	b := &frameBody{st: st, ctx: ctx, timeout: timeout}
	if err := b.wait(func() bool { return st.head || st.err != nil }); err != nil {
		b.abandon()
		return nil, err
	}
	c.mu.Lock()
	status, h := st.status, st.hdr
	c.mu.Unlock()
	if h == nil {
		h = http.Header{}
	}
	return &http.Response{Status: strconv.Itoa(status) + " " + http.StatusText(status), StatusCode: status,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, Header: h, Body: b, ContentLength: -1}, nil
}

// forget drops a stream; reset tells the host (the request is
// abandoned: its handler's context is cancelled).
func (c *frameConn) forget(st *frameStream, reset bool) {
	c.mu.Lock()
	_, open := c.streams[st.id]
	delete(c.streams, st.id)
	alive := c.err == nil
	idle := (c.goAway || c.retired) && len(c.streams) == 0
	c.mu.Unlock()
	if open && reset && alive {
		_, _, _ = c.wr.Send(func(b []byte) []byte { return frame.AppendReset(b, st.id) })
	}
	if idle {
		c.die(errNotAccepted) // the host closes it too
	}
}

// readLoop reads the host's frames until the connection fails.
func (c *frameConn) readLoop() {
	c.die(c.read())
}

func (c *frameConn) read() error {
	for {
		h, p, err := c.rd.Next()
		if err != nil {
			return err
		}
		c.lastRead.Store(time.Now().UnixNano())
		switch h.Type {
		case frame.TypeResponse, frame.TypeData:
			if err := c.deliver(h, p); err != nil {
				return err
			}
		case frame.TypeReset:
			c.mu.Lock()
			st := c.streams[h.Stream]
			if st != nil {
				delete(c.streams, h.Stream)
				st.err = errStreamReset
				signal(st.wake)
			}
			c.mu.Unlock()
		case frame.TypeGoAway:
			last := frame.Uint32(p)
			c.mu.Lock()
			c.goAway, c.lastOK = true, last
			for id, st := range c.streams {
				if id > last {
					delete(c.streams, id)
					st.err = &errNotSent{errNotAccepted}
					signal(st.wake)
				}
			}
			idle := len(c.streams) == 0
			c.mu.Unlock()
			c.removeFromPool()
			if idle {
				return errNotAccepted
			}
		default:
			return fmt.Errorf("%w: frame type %d from a host", frame.ErrProtocol, h.Type)
		}
	}
}

// deliver hands a Response or Data frame to its stream.
func (c *frameConn) deliver(h frame.Header, p []byte) error {
	var resp frame.Response
	chunk := p
	if h.Type == frame.TypeResponse {
		var err error
		if resp, err = frame.ParseResponse(p); err != nil {
			return err
		}
		chunk = resp.Chunk
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.streams[h.Stream]
	if st == nil {
		if h.Stream > c.nextID {
			return fmt.Errorf("%w: answer on stream %d never opened", frame.ErrProtocol, h.Stream)
		}
		return nil // abandoned by its caller
	}
	if (h.Type == frame.TypeResponse) == st.head {
		return fmt.Errorf("%w: frame type %d out of order on stream %d", frame.ErrProtocol, h.Type, h.Stream)
	}
	if h.Type == frame.TypeResponse {
		st.head, st.status, st.hdr = true, resp.Status, resp.Header
	}
	st.recv += int64(len(chunk))
	if st.recv > frame.InitialWindow+st.granted {
		return fmt.Errorf("%w: stream %d over its window", frame.ErrProtocol, h.Stream)
	}
	if len(chunk) > 0 {
		st.chunks = append(st.chunks, append([]byte(nil), chunk...))
	}
	if h.End() {
		st.eof = true
		delete(c.streams, h.Stream)
	}
	signal(st.wake)
	return nil
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

func (c *frameConn) removeFromPool() {
	c.mu.Lock()
	done := c.removed
	c.removed = true
	c.mu.Unlock()
	if !done && c.onDone != nil {
		c.onDone()
	}
}

// die closes the connection; its streams fail (not sent, if their frames
// never reached the connection or the host's GoAway refused them).
func (c *frameConn) die(err error) {
	if err == nil {
		err = io.EOF
	}
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.err = err // no stream opens from here on
	c.mu.Unlock()
	close(c.done)
	// The writer's lock is taken outside c.mu (Send's encoder takes c.mu
	// under it).
	c.wr.Fail(err)
	handed := c.wr.Handed()
	c.mu.Lock()
	c.handed = handed
	for id, st := range c.streams {
		delete(c.streams, id)
		switch {
		case c.goAway && id > c.lastOK:
			st.err = &errNotSent{errNotAccepted}
		default:
			st.err = fmt.Errorf("%w: %w", errConnLost, err)
		}
		signal(st.wake)
	}
	c.mu.Unlock()
	_ = c.nc.Close()
	c.removeFromPool()
}

// retireIfSilent stops opening streams on a connection that has not
// delivered a single frame since a request that has now timed out was
// sent: the host may be gone without a word (a partition, a frozen
// machine), which only TCP keepalive would notice, minutes later. New
// queries dial a new connection; the ones in flight keep their own
// deadlines, and the connection closes when they are done.
func (c *frameConn) retireIfSilent(since int64) {
	if c.lastRead.Load() >= since {
		return
	}
	c.mu.Lock()
	c.retired = true
	idle := len(c.streams) == 0
	c.mu.Unlock()
	c.removeFromPool()
	if idle {
		c.die(errors.New("object host silent"))
	}
}

// frameBody is a stream's answer body; it also waits for the head.
type frameBody struct {
	st      *frameStream
	ctx     context.Context
	timeout time.Duration
	done    bool
}

// wait blocks until ready (checked under c.mu) or the request ends: the
// context, the deadline, a failed stream.
func (b *frameBody) wait(ready func() bool) error {
	st := b.st
	c := st.c
	for {
		c.mu.Lock()
		ok := ready()
		err := st.err
		buffered := len(st.chunks) > 0
		expired := st.expired
		c.mu.Unlock()
		if ok && (err == nil || buffered) {
			return nil // what arrived is read before a failure shows
		}
		if err != nil {
			var ns *errNotSent
			if errors.As(err, &ns) {
				return err
			}
			if errors.Is(err, errConnLost) {
				c.mu.Lock()
				never := c.handed <= st.start
				c.mu.Unlock()
				if never {
					return &errNotSent{err}
				}
			}
			return err
		}
		if expired {
			c.retireIfSilent(st.sent)
			return fmt.Errorf("object host did not answer within %s: %w", b.timeout, os.ErrDeadlineExceeded)
		}
		select {
		case <-st.wake:
		case <-b.ctx.Done():
			return b.ctx.Err()
		}
	}
}

func (b *frameBody) Read(p []byte) (int, error) {
	if b.done {
		return 0, io.ErrClosedPipe
	}
	st := b.st
	c := st.c
	if err := b.wait(func() bool { return len(st.chunks) > 0 || st.eof }); err != nil {
		b.abandon()
		return 0, err
	}
	c.mu.Lock()
	if len(st.chunks) == 0 { // eof
		c.mu.Unlock()
		b.finish()
		return 0, io.EOF
	}
	n := copy(p, st.chunks[0])
	if n == len(st.chunks[0]) {
		st.chunks[0] = nil
		st.chunks = st.chunks[1:]
	} else {
		st.chunks[0] = st.chunks[0][n:]
	}
	var grant int64
	if !st.eof {
		st.consumed += int64(n)
		if st.consumed >= frame.InitialWindow/2 {
			grant, st.consumed = st.consumed, 0
			st.granted += grant
		}
	}
	c.mu.Unlock()
	if grant > 0 {
		_, _, _ = c.wr.Send(func(b []byte) []byte { return frame.AppendWindow(b, st.id, uint32(grant)) })
	}
	return n, nil
}

// Close ends the exchange; an answer not read to its end is abandoned (the
// host is told).
func (b *frameBody) Close() error {
	if b.done {
		return nil
	}
	b.abandon()
	return nil
}

func (b *frameBody) finish() {
	b.done = true
}

func (b *frameBody) abandon() {
	if b.done {
		return
	}
	b.finish()
	b.st.c.forget(b.st, true)
}

// compile-time check: the body is what http.Response carries.
var _ io.ReadCloser = (*frameBody)(nil)
