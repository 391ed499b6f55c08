package edge

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// hostConns forwards queries to object hosts over pooled keep-alive HTTP/1.1
// connections, doing the whole round trip on the caller's goroutine.
//
// net/http's Transport gives every connection a reader and a writer
// goroutine, so each forwarded query was handed from the handler to the
// writer, then from the reader back: two more wake-ups per query, each a
// wait in a run queue when the two cores are busy. The query path is the
// edge's hottest (TestEdgeBench), and the host is our own server speaking
// plain HTTP/1.1, so the request is written and the answer read right here
// (http.ReadResponse parses it, chunked or not).
//
// A pooled connection the host closed (a host restart) is detected before
// reuse with a non-blocking peek; a request is retried on another connection
// only when it provably was never sent (dial refused, or the write itself
// failed on a reused connection). Everything else is an error for the
// caller: a query may be a write.
type hostConns struct {
	mu      sync.Mutex
	idle    map[string][]*hostConn
	maxIdle int // per host
	dialer  net.Dialer
	closed  bool
	// tls, when set, wraps every connection (mutual TLS to the hosts).
	// Hosts send no session tickets, so an idle TLS connection has no
	// bytes pending and open's peek at the socket stays exact.
	tls *tls.Config
}

type hostConn struct {
	nc  net.Conn
	br  *bufio.Reader
	buf []byte // request head, reused
}

func newHostConns(maxIdle int) *hostConns {
	return &hostConns{idle: map[string][]*hostConn{}, maxIdle: maxIdle,
		dialer: net.Dialer{Timeout: 2 * time.Second, KeepAlive: 30 * time.Second}}
}

// errNotSent marks a failure before any byte of the request reached the host.
type errNotSent struct{ err error }

func (e *errNotSent) Error() string { return "request not sent: " + e.err.Error() }
func (e *errNotSent) Unwrap() error { return e.err }

func (p *hostConns) get(ctx context.Context, addr string) (*hostConn, bool, error) {
	for {
		p.mu.Lock()
		l := p.idle[addr]
		if n := len(l); n > 0 {
			c := l[n-1]
			l[n-1] = nil
			p.idle[addr] = l[:n-1]
			p.mu.Unlock()
			if c.open() {
				return c, true, nil
			}
			c.nc.Close()
			continue
		}
		p.mu.Unlock()
		c, err := p.dial(ctx, addr)
		return c, false, err
	}
}

// dial opens a new connection to addr (TLS when configured).
func (p *hostConns) dial(ctx context.Context, addr string) (*hostConn, error) {
	nc, err := p.dialer.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	if p.tls != nil {
		tc := tls.Client(nc, p.tls)
		hctx, cancel := context.WithTimeout(ctx, p.dialer.Timeout)
		err := tc.HandshakeContext(hctx)
		cancel()
		if err != nil {
			nc.Close()
			return nil, err // before any byte of a request: not sent
		}
		nc = tc
	}
	return &hostConn{nc: nc, br: bufio.NewReaderSize(nc, 16<<10)}, nil
}

func (p *hostConns) put(addr string, c *hostConn) {
	p.mu.Lock()
	if !p.closed && len(p.idle[addr]) < p.maxIdle {
		p.idle[addr] = append(p.idle[addr], c)
		c = nil
	}
	p.mu.Unlock()
	if c != nil {
		c.nc.Close()
	}
}

func (p *hostConns) close() {
	p.mu.Lock()
	p.closed = true
	idle := p.idle
	p.idle = map[string][]*hostConn{}
	p.mu.Unlock()
	for _, l := range idle {
		for _, c := range l {
			c.nc.Close()
		}
	}
}

// open reports whether an idle connection is still usable: nothing to read
// and no end of stream (the host has not closed it).
func (c *hostConn) open() bool {
	if c.br.Buffered() > 0 {
		return false // bytes nobody asked for: the stream is out of step
	}
	nc := c.nc
	if tc, ok := nc.(*tls.Conn); ok {
		nc = tc.NetConn() // the socket under TLS: a close_notify or FIN shows there
	}
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return true
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	open := false
	var b [1]byte
	if err := rc.Read(func(fd uintptr) bool {
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		open = n < 0 && (errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.EWOULDBLOCK))
		return true // never wait
	}); err != nil {
		return false
	}
	return open
}

// roundTrip POSTs body to url ("http://host:port/path") with hdr and
// returns the response; its Body returns the connection to the pool once
// read to the end and closed. The deadline is timeout, or ctx's if earlier;
// cancelling ctx aborts the exchange.
func (p *hostConns) roundTrip(ctx context.Context, url string, hdr http.Header, body []byte, timeout time.Duration) (*http.Response, error) {
	addr, path, err := splitHostURL(url)
	if err != nil {
		return nil, err
	}
	// net/http refuses header fields that would split the request; so do we.
	for k, vs := range hdr {
		if strings.ContainsAny(k, "\r\n:") {
			return nil, &errNotSent{fmt.Errorf("forward: invalid header name %q", k)}
		}
		for _, v := range vs {
			if strings.ContainsAny(v, "\r\n") {
				return nil, &errNotSent{fmt.Errorf("forward: invalid value for header %q", k)}
			}
		}
	}
	for attempt := 0; ; attempt++ {
		c, reused, err := p.get(ctx, addr)
		if err != nil {
			return nil, &errNotSent{err}
		}
		deadline := time.Now().Add(timeout)
		if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
			deadline = d
		}
		_ = c.nc.SetDeadline(deadline)
		stop := context.AfterFunc(ctx, func() { _ = c.nc.SetDeadline(time.Unix(1, 0)) })

		// Head and body in one writev: the body is not copied, and the
		// buffer a connection keeps stays header-sized.
		c.buf = appendRequestHead(c.buf[:0], addr, path, hdr, len(body))
		bufs := net.Buffers{c.buf, body}
		if _, err := bufs.WriteTo(c.nc); err != nil {
			stop()
			c.nc.Close()
			if reused && attempt == 0 && ctx.Err() == nil {
				continue // the host had closed it: nothing was processed
			}
			return nil, err
		}
		resp, err := http.ReadResponse(c.br, nil)
		if err != nil {
			stop()
			c.nc.Close()
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, err
		}
		resp.Body = &hostBody{ReadCloser: resp.Body, p: p, c: c, addr: addr, stop: stop, keep: !resp.Close}
		return resp, nil
	}
}

// splitHostURL splits "http://host:port/path" (or https: the pool's TLS
// decides) into address and path.
func splitHostURL(url string) (addr, path string, err error) {
	rest, ok := strings.CutPrefix(url, "http://")
	if !ok {
		rest, ok = strings.CutPrefix(url, "https://")
	}
	if !ok {
		return "", "", fmt.Errorf("forward: unsupported URL %q", url)
	}
	addr, path = rest, "/"
	if i := strings.IndexByte(rest, '/'); i >= 0 {
		addr, path = rest[:i], rest[i:]
	}
	return addr, path, nil
}

func appendRequestHead(b []byte, host, path string, hdr http.Header, bodyLen int) []byte {
	b = append(b, "POST "...)
	b = append(b, path...)
	b = append(b, " HTTP/1.1\r\nHost: "...)
	b = append(b, host...)
	b = append(b, "\r\nContent-Length: "...)
	b = strconv.AppendInt(b, int64(bodyLen), 10)
	b = append(b, "\r\n"...)
	for k, vs := range hdr {
		for _, v := range vs {
			b = append(b, k...)
			b = append(b, ": "...)
			b = append(b, v...)
			b = append(b, "\r\n"...)
		}
	}
	return append(b, "\r\n"...)
}

// hostBody gives the connection back when the response was read to its
// end; a body closed early (or a failed read) closes the connection.
type hostBody struct {
	io.ReadCloser
	p    *hostConns
	c    *hostConn
	addr string
	stop func() bool
	keep bool
	eof  bool
	done bool
}

func (b *hostBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.eof = true
	} else if err != nil {
		b.keep = false
	}
	return n, err
}

func (b *hostBody) Close() error {
	if b.done {
		return nil
	}
	b.done = true
	if !b.eof {
		// Closed before the end (the client went away, a copy failed):
		// drop the connection first, so net/http's body does not drain
		// the rest of the answer from the host.
		b.c.nc.Close()
		b.stop()
		_ = b.ReadCloser.Close()
		return nil
	}
	err := b.ReadCloser.Close()
	// stop reports false if the context's cancellation already fired (the
	// deadline was moved into the past): that connection is not reusable.
	live := b.stop()
	if b.keep && b.eof && live && err == nil {
		_ = b.c.nc.SetDeadline(time.Time{})
		b.p.put(b.addr, b.c)
		return nil
	}
	b.c.nc.Close()
	return err
}
