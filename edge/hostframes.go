package edge

import (
	"context"
	"crypto/tls"
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
	"syscall"
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

	reads *frameReads // the HostClient's
}

// frameReads counts the batches of frames read, by who read them.
type frameReads struct {
	led    atomic.Int64 // by a waiting request (its stream's leader)
	loop   atomic.Int64 // by readLoop
	checks atomic.Int64 // idle checks (checkIdle's peeks)
	// handoffs: the role given by its holder to a parked waiter (a
	// wake-up); the others left it to nobody or kept it.
	handoffs atomic.Int64
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

func newHostFrames(p *hostConns, reads *frameReads) *hostFrames {
	return &hostFrames{p: p, hosts: map[string]*frameHost{}, reads: reads}
}

// roundTrip sends one request on a frame connection to addr: a query, or
// with lifecycle a batched lifecycle call. ok false: the host is reached
// over HTTP for it (the caller falls back); nothing was sent.
func (f *hostFrames) roundTrip(ctx context.Context, addr, path string, hdr http.Header, body []byte, timeout time.Duration, lifecycle bool) (resp *http.Response, ok bool, err error) {
	for attempt := 0; ; attempt++ {
		c, check, err := f.conn(ctx, addr, timeout)
		if errors.Is(err, errUseHTTP) {
			return nil, false, nil
		}
		if err != nil {
			return nil, true, &errNotSent{err}
		}
		if check {
			if err := c.checkIdle(); err != nil {
				if attempt < 2 && ctx.Err() == nil {
					continue // closed while idle: nothing was sent on it
				}
				return nil, true, &errNotSent{err}
			}
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
// timeout is the requests' (it sets a new connection's reapTick). check:
// the caller holds the connection's reading role and must checkIdle.
func (f *hostFrames) conn(ctx context.Context, addr string, timeout time.Duration) (*frameConn, bool, error) {
	now := time.Now().UnixNano()
	f.mu.Lock()
	for {
		if f.closed {
			f.mu.Unlock()
			return nil, false, net.ErrClosed
		}
		fh := f.hosts[addr]
		if fh == nil {
			fh = &frameHost{}
			f.hosts[addr] = fh
		}
		if !fh.httpUntil.IsZero() && time.Now().Before(fh.httpUntil) {
			f.mu.Unlock()
			return nil, false, errUseHTTP
		}
		for _, c := range fh.conns {
			if ok, check := c.available(now); ok {
				f.mu.Unlock()
				return c, check, nil
			}
		}
		if ch := fh.dialing; ch != nil {
			f.mu.Unlock()
			select {
			case <-ch:
			case <-ctx.Done():
				return nil, false, ctx.Err()
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
			return nil, false, errUseHTTP
		case err != nil:
			f.mu.Unlock()
			return nil, false, err
		case f.closed:
			f.mu.Unlock()
			c.die(net.ErrClosed)
			return nil, false, net.ErrClosed
		}
		fh.httpUntil = time.Time{}
		fh.conns = append(fh.conns, c)
		c.onDone = func() { f.remove(addr, c) }
		f.mu.Unlock()
		c.start()
		return c, false, nil
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
	c := &frameConn{reads: f.reads, nc: hc.nc, rd: frame.NewReader(hc.br), streams: map[uint32]*frameStream{}, done: make(chan struct{}),
		loopWake: make(chan struct{}, 1), idleSince: time.Now().UnixNano(),
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
	reads  *frameReads
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

	// The reading role (see "Who reads" below). Under mu.
	reading    bool           // a goroutine holds the role
	leader     *frameStream   // the waiter holding it (nil: readLoop or an idle check)
	parked     []*frameStream // waiters that may take it, oldest first from parkedHead (stale entries: !st.parked)
	parkedHead int
	idleSince  int64         // unix nanoseconds: when the role was last given up
	loopWake   chan struct{} // readLoop is given the role

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
	expired  bool   // past its deadline (set by the reaper)
	parked   bool   // waiting on wake for its answer or the reading role
	listed   bool   // in c.parked
	events   uint32 // wakeStream calls: its leader stops reading when this moves
}

// Who reads. One goroutine at a time holds a connection's reading role
// (c.reading) and reads its frames, handing each to its stream. Mostly it
// is a request's own goroutine waiting for its answer (the stream's
// leader): a waiter that finds nobody reading reads the connection itself,
// so the answer it waits for wakes it straight from the network poller,
// not a reader goroutine that then wakes it — one goroutine hand-over less
// per answer it reads. A leader reads whole batches (every frame already
// buffered) and, once its own stream has news, passes the role on: to the
// longest-parked waiter (a wake-up it would otherwise get with its answer)
// or, with none parked, to nobody — an idle connection is not read (the
// kernel keeps what arrives; the next waiter reads it).
//
// readLoop, one goroutine per connection, reads only when given the role:
// by the reaper, when nobody has read for a tick (so a GoAway or a close
// of a connection without traffic is seen, as when readLoop always read),
// and it gives the role to a parked waiter after each batch, or up when no
// stream is open. A sender finding the connection unread for longer than
// idleCheck first looks at the socket (checkIdle: one non-blocking peek),
// so that a host that closed it while nobody read is found before a
// request goes into it (that request would fail as "may have run").
//
// A leader blocked in a read whose context ends (context.AfterFunc) or
// whose deadline passes (the reaper) is interrupted by a read deadline in
// the past; frame.Reader resumes after it, and the reader that sees the
// timeout clears the deadline under c.mu before looking at why — so a stale
// interruption costs one more look and a fresh one is never lost.
// Every change of the role is made under c.mu, which also orders the
// reads of successive holders.

// idleCheck is how long a connection may go unread before a sender checks
// its socket (checkIdle) before sending on it.
const idleCheck = time.Millisecond

func (c *frameConn) start() {
	go c.readLoop()
	go c.reap()
}

// reap expires the streams past their deadline, every reapTick, until the
// connection dies, and gives the reading role to readLoop on a connection
// nobody has read for a tick. One ticker per connection instead of a timer
// per request: creating and stopping a runtime timer on every query was
// ~2% of the edge's CPU in the deploy benchmark's profile.
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
					c.wakeStream(st)
					if c.leader == st {
						c.interruptLocked()
					}
				}
			}
			if !c.reading && c.err == nil && n-c.idleSince >= int64(c.reapTick) {
				c.reading, c.leader = true, nil
				signal(c.loopWake)
			}
			c.mu.Unlock()
		}
	}
}

// wakeStream tells st's goroutine that its state changed (under c.mu): a
// parked one is woken; a leader sees events move at its next batch end.
func (c *frameConn) wakeStream(st *frameStream) {
	st.events++
	st.parked = false
	if c.leader != st {
		signal(st.wake)
	}
}

// interruptLocked makes the role holder's blocked read return (under c.mu).
func (c *frameConn) interruptLocked() { _ = c.nc.SetReadDeadline(time.Unix(1, 0)) }

// clearInterruptLocked is the reader's answer to a timed-out read (under
// c.mu): reads block again, and whatever asked for the interruption is
// already visible to the reader.
func (c *frameConn) clearInterruptLocked() { _ = c.nc.SetReadDeadline(time.Time{}) }

func isTimeout(err error) bool { return errors.Is(err, os.ErrDeadlineExceeded) }

// park queues st to be given the role (under c.mu).
func (c *frameConn) park(st *frameStream) {
	st.parked = true
	if st.listed {
		return
	}
	if n := len(c.parked) - c.parkedHead; n >= 16 && n > 2*len(c.streams) {
		// Mostly stale entries (streams woken since, or gone): keep the
		// parked ones, so a long-lived leader cannot make the list grow.
		kept := c.parked[:0]
		for _, w := range c.parked[c.parkedHead:] {
			if w.parked {
				kept = append(kept, w)
			} else {
				w.listed = false
			}
		}
		clear(c.parked[len(kept):])
		c.parked, c.parkedHead = kept, 0
	}
	st.listed = true
	c.parked = append(c.parked, st)
}

// handOffLocked gives up the role (under c.mu): to the longest-parked
// waiter, or, with none, to nobody if release (reporting whether the role
// left its holder).
func (c *frameConn) handOffLocked(release bool) bool {
	for c.parkedHead < len(c.parked) {
		w := c.parked[c.parkedHead]
		c.parked[c.parkedHead] = nil
		c.parkedHead++
		w.listed = false
		if w.parked {
			w.parked = false
			c.leader = w
			signal(w.wake)
			c.reads.handoffs.Add(1)
			return true
		}
	}
	c.parked, c.parkedHead = c.parked[:0], 0
	if !release {
		return false
	}
	c.reading, c.leader = false, nil
	c.idleSince = time.Now().UnixNano()
	return true
}

// resign gives up the role if st holds it, and un-parks st.
func (c *frameConn) resign(st *frameStream) {
	c.mu.Lock()
	st.parked = false
	if c.leader == st {
		c.handOffLocked(true)
	}
	c.mu.Unlock()
}

// available reports room for a new stream, and, if nobody has read the
// connection for idleCheck, takes the reading role for the caller to
// checkIdle before sending.
func (c *frameConn) available(now int64) (ok, check bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ok = c.err == nil && !c.goAway && !c.retired && len(c.streams) < frame.MaxStreams && c.nextID < 1<<31
	if ok && !c.reading && now-c.idleSince >= int64(idleCheck) {
		c.reading, c.leader, check = true, nil, true
	}
	return ok, check
}

// checkIdle runs holding the reading role (taken by available) on a
// connection nobody read for idleCheck: it hands out the whole frames
// already buffered, then one non-blocking peek at the socket says whether
// the host closed it (it dies: the caller's request, not sent, goes on
// another connection) or sent something meanwhile — then readLoop takes
// the role and reads it, so a GoAway among it refuses the caller's stream
// (not sent: sent again elsewhere) — or nothing (the role goes on as a
// leader's would). The caller never waits for the network here: a host
// that sent half a frame and stopped holds no request before its deadline.
func (c *frameConn) checkIdle() error {
	c.reads.checks.Add(1)
	for c.rd.Ready() {
		h, p, err := c.rd.Next()
		if err == nil {
			err = c.handle(h, p)
		}
		if err != nil {
			c.die(err)
			return err
		}
	}
	pending, err := c.peek()
	if err != nil {
		c.die(err)
		return err
	}
	c.mu.Lock()
	if pending || c.rd.Buffered() > 0 {
		c.leader = nil
		signal(c.loopWake)
	} else {
		c.handOffLocked(true)
	}
	c.mu.Unlock()
	return nil
}

// errHostClosed: the host closed a connection nobody was reading.
var errHostClosed = errors.New("object host closed the connection")

// peek reports bytes waiting on the socket under the connection (TLS
// records included), without reading them or waiting; the end of the
// stream is errHostClosed.
func (c *frameConn) peek() (bool, error) {
	nc := c.nc
	if tc, ok := nc.(*tls.Conn); ok {
		nc = tc.NetConn()
	}
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return false, nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false, err
	}
	var n int
	var perr error
	var b [1]byte
	if err := rc.Read(func(fd uintptr) bool {
		n, _, perr = syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		return true // never wait
	}); err != nil {
		return false, err
	}
	switch {
	case n > 0:
		return true, nil
	case perr == nil:
		return false, errHostClosed
	case errors.Is(perr, syscall.EAGAIN) || errors.Is(perr, syscall.EWOULDBLOCK) || errors.Is(perr, syscall.EINTR):
		return false, nil
	default:
		return false, perr
	}
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

// readLoop reads the host's frames whenever it is given the reading role
// (by the reaper), until the connection fails.
func (c *frameConn) readLoop() {
	for {
		select {
		case <-c.done:
			return
		case <-c.loopWake:
		}
		if err := c.readAsLoop(); err != nil {
			c.die(err)
			return
		}
	}
}

// readAsLoop reads batches while readLoop holds the role; after each it
// gives the role to a parked waiter, or up when no stream is open.
func (c *frameConn) readAsLoop() error {
	for {
		err := c.readBatch()
		c.reads.loop.Add(1)
		if err != nil && !isTimeout(err) {
			return err
		}
		c.mu.Lock()
		if err != nil {
			c.clearInterruptLocked() // not readLoop's: nothing interrupts it
		}
		left := c.err != nil || c.handOffLocked(len(c.streams) == 0)
		c.mu.Unlock()
		if left {
			return nil
		}
	}
}

// readBatch reads a frame (waiting for it) and then every whole frame
// already buffered, handing each to its stream. Only the role's holder
// calls it.
func (c *frameConn) readBatch() error {
	for {
		h, p, err := c.rd.Next()
		if err != nil {
			return err
		}
		if err := c.handle(h, p); err != nil {
			return err
		}
		if !c.rd.Ready() {
			return nil
		}
	}
}

// lead reads as st's leader until st's state changes, its read is
// interrupted (its context or deadline; back in wait, which looks why),
// or the connection fails. events is st's count when it took the role.
func (c *frameConn) lead(b *frameBody, events uint32) {
	st := b.st
	var stop func() bool
	if b.ctx.Done() != nil {
		stop = context.AfterFunc(b.ctx, func() {
			c.mu.Lock()
			if c.leader == st {
				c.interruptLocked()
			}
			c.mu.Unlock()
		})
	}
	for {
		err := c.readBatch()
		c.reads.led.Add(1)
		if err != nil && !isTimeout(err) {
			c.die(err)
			break
		}
		c.mu.Lock()
		if err != nil {
			c.clearInterruptLocked()
		}
		moved := st.events != events || c.leader != st
		c.mu.Unlock()
		if err != nil || moved {
			break
		}
	}
	if stop != nil {
		stop()
	}
}

// handle acts on one frame from the host.
func (c *frameConn) handle(h frame.Header, p []byte) error {
	c.lastRead.Store(time.Now().UnixNano())
	switch h.Type {
	case frame.TypeResponse, frame.TypeData:
		return c.deliver(h, p)
	case frame.TypeReset:
		c.mu.Lock()
		st := c.streams[h.Stream]
		if st != nil {
			delete(c.streams, h.Stream)
			st.err = errStreamReset
			c.wakeStream(st)
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
				c.wakeStream(st)
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
	return nil
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
	c.wakeStream(st)
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
		c.wakeStream(st)
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
// context, the deadline, a failed stream. Meanwhile it reads the
// connection itself when nobody else does (lead), else parks.
func (b *frameBody) wait(ready func() bool) error {
	st := b.st
	c := st.c
	led := false
	for {
		if led && b.ctx.Err() != nil {
			c.resign(st)
			return b.ctx.Err()
		}
		c.mu.Lock()
		ok := ready()
		err := st.err
		buffered := len(st.chunks) > 0
		expired := st.expired
		st.parked = false
		if (ok && (err == nil || buffered)) || err != nil || expired {
			if c.leader == st {
				c.handOffLocked(true)
			}
			c.mu.Unlock()
			return b.end(ok, err, buffered, expired)
		}
		lead := c.leader == st
		if !lead && !c.reading && c.err == nil {
			c.reading, c.leader, lead = true, st, true
		}
		if lead && c.err != nil {
			c.handOffLocked(true) // dying: die wakes st with its error
			lead = false
		}
		if !lead {
			c.park(st)
		}
		events := st.events
		c.mu.Unlock()
		if lead {
			c.lead(b, events)
			led = true
			continue
		}
		select {
		case <-st.wake:
		case <-b.ctx.Done():
			c.resign(st)
			return b.ctx.Err()
		}
	}
}

// end is wait's outcome once the stream is ready, failed or expired.
func (b *frameBody) end(ok bool, err error, buffered, expired bool) error {
	st := b.st
	c := st.c
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
	c.retireIfSilent(st.sent)
	return fmt.Errorf("object host did not answer within %s: %w", b.timeout, os.ErrDeadlineExceeded)
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
