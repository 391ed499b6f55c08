package edge

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/internal/frame"
)

// scriptedHost is a scripted object host speaking the frame protocol (or
// refusing it), for the edge client's unit tests: onRequest decides what
// each request gets.
type scriptedHost struct {
	t         *testing.T
	ln        net.Listener
	refuse    int  // answer the upgrade with this status instead of 101
	lifecycle bool // the 101 answer names frame.RoutesLifecycle
	onRequest func(c *scriptedConn, id uint32, req frame.Request, body []byte)
	onHTTP    func(path string, body []byte) string // an HTTP request's 200 answer (nil: an echo)

	accepts, upgrades, httpPosts atomic.Int32
	resets                       chan uint32
	mu                           sync.Mutex
	conns                        []*scriptedConn
}

type scriptedConn struct {
	h       *scriptedHost
	nc      net.Conn
	wmu     sync.Mutex
	credits sync.Map // stream → chan uint32 (Window frames)
}

func newScriptedHost(t *testing.T, onRequest func(c *scriptedConn, id uint32, req frame.Request, body []byte)) *scriptedHost {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	h := &scriptedHost{t: t, ln: ln, onRequest: onRequest, resets: make(chan uint32, 100)}
	t.Cleanup(func() {
		ln.Close()
		h.mu.Lock()
		for _, c := range h.conns {
			c.nc.Close()
		}
		h.mu.Unlock()
	})
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			h.accepts.Add(1)
			c := &scriptedConn{h: h, nc: nc}
			h.mu.Lock()
			h.conns = append(h.conns, c)
			h.mu.Unlock()
			go c.serve()
		}
	}()
	return h
}

func (h *scriptedHost) addr() string { return h.ln.Addr().String() }

func (c *scriptedConn) send(b []byte) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_, _ = c.nc.Write(b)
}

func (c *scriptedConn) answer(id uint32, status int, body string) {
	b, err := frame.AppendResponse(nil, id, status, http.Header{"Content-Type": {"application/json"}}, []byte(body), true)
	require.NoError(c.h.t, err)
	c.send(b)
}

// answerLarge sends body within the stream's window, waiting for Window
// frames as a host does.
func (c *scriptedConn) answerLarge(id uint32, body []byte) {
	ch, _ := c.credits.LoadOrStore(id, make(chan uint32, 100))
	credit := frame.InitialWindow
	head := true
	for len(body) > 0 || head {
		for credit == 0 {
			credit += int(<-ch.(chan uint32))
		}
		n := min(len(body), credit, frame.MaxPayload)
		last := n == len(body)
		if head {
			b, _ := frame.AppendResponse(nil, id, 200, nil, body[:n], last)
			c.send(b)
			head = false
		} else {
			c.send(frame.AppendData(nil, id, body[:n], last))
		}
		body, credit = body[n:], credit-n
	}
}

func (c *scriptedConn) serve() {
	defer c.nc.Close()
	br := bufio.NewReader(c.nc)
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		body, _ := io.ReadAll(req.Body)
		if req.URL.Path == frame.UpgradePath {
			c.h.upgrades.Add(1)
			if c.h.refuse == 0 {
				extra := ""
				if c.h.lifecycle {
					extra = frame.HeaderRoutes + ": " + frame.RoutesLifecycle + "\r\n"
				}
				_, _ = io.WriteString(c.nc, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: "+frame.Protocol+"\r\n"+extra+"\r\n")
				c.frames(br)
				return
			}
			msg := `{"success":false,"errors":[{"code":7003,"message":"no such route"}]}`
			fmt.Fprintf(c.nc, "HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", c.h.refuse, len(msg), msg)
			continue
		}
		c.h.httpPosts.Add(1)
		ans := `{"result":"http ` + req.URL.Path + ` ` + string(body) + `","success":true}`
		if c.h.onHTTP != nil {
			ans = c.h.onHTTP(req.URL.Path, body)
		}
		fmt.Fprintf(c.nc, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(ans), ans)
	}
}

func (c *scriptedConn) frames(br *bufio.Reader) {
	rd := frame.NewReader(br)
	bodies := map[uint32][]byte{}
	reqs := map[uint32]frame.Request{}
	var maxID uint32
	for {
		h, p, err := rd.Next()
		if err != nil {
			return
		}
		switch h.Type {
		case frame.TypeRequest:
			req, err := frame.ParseRequest(p)
			require.NoError(c.h.t, err)
			if h.Stream <= maxID {
				// A real host closes the connection (protocol error).
				c.h.t.Errorf("stream %d after stream %d: IDs must increase on the wire", h.Stream, maxID)
				return
			}
			maxID = h.Stream
			reqs[h.Stream], bodies[h.Stream] = req, append([]byte(nil), req.Chunk...)
		case frame.TypeData:
			bodies[h.Stream] = append(bodies[h.Stream], p...)
		case frame.TypeReset:
			c.h.resets <- h.Stream
			continue
		case frame.TypeWindow:
			ch, _ := c.credits.LoadOrStore(h.Stream, make(chan uint32, 100))
			ch.(chan uint32) <- frame.Uint32(p)
			continue
		}
		if h.End() {
			c.h.onRequest(c, h.Stream, reqs[h.Stream], bodies[h.Stream])
		}
	}
}

func forwardTo(ctx context.Context, hc *HostClient, addr, body string) (int, string, error) {
	resp, err := hc.forward(ctx, "http://"+addr+"/v1/objects/o/query", http.Header{HeaderDatabase: {"d"}}, []byte(body))
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

func echo(c *scriptedConn, id uint32, req frame.Request, body []byte) {
	c.answer(id, 200, `{"echo":"`+string(body)+`","db":"`+req.Header.Get(HeaderDatabase)+`"}`)
}

// TestFramesConcurrentOutOfOrder: many queries in flight on one
// connection, answered in a shuffled order, each get their own answer.
func TestFramesConcurrentOutOfOrder(t *testing.T) {
	fh := newScriptedHost(t, func(c *scriptedConn, id uint32, req frame.Request, body []byte) {
		go func() {
			time.Sleep(time.Duration(rand.IntN(300)) * time.Microsecond) // deliberate: a random delay shuffles the order of the answers
			echo(c, id, req, body)
		}()
	})
	hc := NewHostClient(10 * time.Second)
	defer hc.Close()
	const clients = 128
	var wg sync.WaitGroup
	for g := 0; g < clients; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 50; i++ {
				body := fmt.Sprintf("q-%d-%d", g, i)
				status, ans, err := forwardTo(context.Background(), hc, fh.addr(), body)
				if !assert.NoError(t, err) {
					return
				}
				assert.Equal(t, 200, status)
				assert.Equal(t, `{"echo":"`+body+`","db":"d"}`, ans)
			}
		}()
	}
	wg.Wait()
	assert.Equal(t, int32(1), fh.upgrades.Load(), "one connection carried them all")
	assert.Equal(t, int64(clients*50), hc.sentFrames.Load())
	assert.Zero(t, hc.sentHTTP.Load())
}

// TestFramesAnswersInReverseOrder: the second query's answer arrives
// first; each caller still gets its own.
func TestFramesAnswersInReverseOrder(t *testing.T) {
	var mu sync.Mutex
	var held []func()
	fh := newScriptedHost(t, func(c *scriptedConn, id uint32, req frame.Request, body []byte) {
		mu.Lock()
		defer mu.Unlock()
		held = append(held, func() { echo(c, id, req, body) })
		if len(held) == 2 {
			held[1]()
			held[0]()
		}
	})
	hc := NewHostClient(10 * time.Second)
	defer hc.Close()
	var wg sync.WaitGroup
	for _, q := range []string{"first", "second"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, ans, err := forwardTo(context.Background(), hc, fh.addr(), q)
			assert.NoError(t, err)
			assert.Contains(t, ans, `"echo":"`+q+`"`)
		}()
	}
	wg.Wait()
}

// TestFramesCancelledRequest: a caller giving up resets its stream; the
// connection goes on serving.
func TestFramesCancelledRequest(t *testing.T) {
	arrived := make(chan uint32, 1)
	fh := newScriptedHost(t, func(c *scriptedConn, id uint32, req frame.Request, body []byte) {
		if string(body) == "never" {
			arrived <- id
			return
		}
		echo(c, id, req, body)
	})
	hc := NewHostClient(10 * time.Second)
	defer hc.Close()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, _, err := forwardTo(ctx, hc, fh.addr(), "never")
		errc <- err
	}()
	id := <-arrived
	cancel()
	assert.ErrorIs(t, <-errc, context.Canceled)
	select {
	case r := <-fh.resets:
		assert.Equal(t, id, r)
	case <-time.After(10 * time.Second):
		t.Fatal("the host never saw the reset")
	}
	_, ans, err := forwardTo(context.Background(), hc, fh.addr(), "after")
	require.NoError(t, err)
	assert.Contains(t, ans, "after")
	assert.Equal(t, int32(1), fh.upgrades.Load())

	// A deadline is the same: the request fails, the connection stays.
	hc2 := NewHostClient(50 * time.Millisecond)
	defer hc2.Close()
	_, _, err = forwardTo(context.Background(), hc2, fh.addr(), "never")
	assert.ErrorIs(t, err, errDeadline)
	<-arrived
	_, ans, err = forwardTo(context.Background(), hc2, fh.addr(), "after deadline")
	require.NoError(t, err)
	assert.Contains(t, ans, "after deadline")
	assert.Equal(t, int32(3), fh.upgrades.Load(), "a connection silent past a deadline takes no new queries")
}

var errDeadline = os.ErrDeadlineExceeded

// TestFramesConnectionLost: a connection lost with a query on it fails
// that query (it may have run: never resent), and the next query dials
// again.
func TestFramesConnectionLost(t *testing.T) {
	var executed atomic.Int32
	fh := newScriptedHost(t, func(c *scriptedConn, id uint32, req frame.Request, body []byte) {
		executed.Add(1)
		if string(body) == "crash" {
			c.nc.Close()
			return
		}
		echo(c, id, req, body)
	})
	hc := NewHostClient(10 * time.Second)
	defer hc.Close()
	_, _, err := forwardTo(context.Background(), hc, fh.addr(), "crash")
	require.Error(t, err)
	assert.ErrorIs(t, err, errConnLost)
	assert.False(t, neverSent(err))
	assert.Equal(t, int32(1), executed.Load(), "a request that may have run is not sent again")
	_, ans, err := forwardTo(context.Background(), hc, fh.addr(), "next")
	require.NoError(t, err)
	assert.Contains(t, ans, "next")
	assert.Equal(t, int32(2), fh.upgrades.Load(), "redialled")
}

// TestFramesGoAway: streams the closing host did not accept (above its
// GoAway's last ID) are sent again on a new connection; the accepted one
// is answered on the old.
func TestFramesGoAway(t *testing.T) {
	var mu sync.Mutex
	var first *scriptedConn
	var firstID uint32
	var seen []string
	arrived := make(chan struct{}, 1)
	fh := newScriptedHost(t, func(c *scriptedConn, id uint32, req frame.Request, body []byte) {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, string(body))
		switch {
		case first == nil:
			first, firstID = c, id
			arrived <- struct{}{}
		case c == first:
			// The second request on the first connection: refuse it
			// (GoAway after the first), answer the first, close.
			// The connection stays open: the GoAway alone must send b
			// elsewhere.
			c.send(frame.AppendGoAway(nil, firstID))
			echo(c, firstID, req, []byte("a"))
		default:
			echo(c, id, req, body)
		}
	})
	hc := NewHostClient(10 * time.Second)
	defer hc.Close()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		_, ans, err := forwardTo(context.Background(), hc, fh.addr(), "a")
		assert.NoError(t, err)
		assert.Contains(t, ans, `"echo":"a"`)
	}()
	<-arrived
	go func() {
		defer wg.Done()
		_, ans, err := forwardTo(context.Background(), hc, fh.addr(), "b")
		assert.NoError(t, err)
		assert.Contains(t, ans, `"echo":"b"`)
	}()
	wg.Wait()
	assert.Equal(t, int32(2), fh.upgrades.Load())
	mu.Lock()
	assert.Equal(t, []string{"a", "b", "b"}, seen, "b was refused by the closing host, then sent on a new connection")
	mu.Unlock()
}

// TestFramesFallBackToHTTP: a host that does not know the protocol (an
// older version) answers the upgrade with 404; the edge uses HTTP — on
// the same connection — and does not ask again for a while.
func TestFramesFallBackToHTTP(t *testing.T) {
	fh := newScriptedHost(t, nil)
	fh.refuse = http.StatusNotFound
	hc := NewHostClient(10 * time.Second)
	defer hc.Close()
	for _, q := range []string{"one", "two", "three"} {
		status, ans, err := forwardTo(context.Background(), hc, fh.addr(), q)
		require.NoError(t, err)
		assert.Equal(t, 200, status)
		assert.Equal(t, `{"result":"http /v1/objects/o/query `+q+`","success":true}`, ans)
	}
	assert.Equal(t, int32(1), fh.upgrades.Load(), "asked once")
	assert.Equal(t, int32(3), fh.httpPosts.Load())
	assert.Equal(t, int32(1), fh.accepts.Load(), "the refused upgrade's connection serves HTTP")
	assert.Equal(t, int64(3), hc.sentHTTP.Load())

	// --host-transport http: never asks.
	fh2 := newScriptedHost(t, echo)
	hc2 := NewHostClient(10 * time.Second)
	defer hc2.Close()
	require.NoError(t, hc2.UseTransport(TransportHTTP))
	_, ans, err := forwardTo(context.Background(), hc2, fh2.addr(), "plain")
	require.NoError(t, err)
	assert.Contains(t, ans, "http /v1/objects/o/query plain")
	assert.Zero(t, fh2.upgrades.Load())
}

// TestFramesHostBreaksProtocol: a malformed frame from the host fails
// the queries on that connection (no hang, no crash); the next dials anew.
func TestFramesHostBreaksProtocol(t *testing.T) {
	fh := newScriptedHost(t, func(c *scriptedConn, id uint32, req frame.Request, body []byte) {
		switch string(body) {
		case "oversized":
			c.send(frame.AppendHeader(nil, frame.Header{Len: frame.MaxPayload + 1, Type: frame.TypeData, Stream: id}))
		case "unopened":
			c.answer(id+100, 200, "{}")
		default:
			echo(c, id, req, body)
		}
	})
	hc := NewHostClient(10 * time.Second)
	defer hc.Close()
	for i, q := range []string{"oversized", "unopened"} {
		_, _, err := forwardTo(context.Background(), hc, fh.addr(), q)
		require.Error(t, err, q)
		assert.ErrorIs(t, err, frame.ErrProtocol, q)
		_, ans, err := forwardTo(context.Background(), hc, fh.addr(), "fine")
		require.NoError(t, err, q)
		assert.Contains(t, ans, "fine")
		assert.Equal(t, int32(i+2), fh.upgrades.Load())
	}
}

// TestFramesLargeAnswer: an answer larger than the window arrives whole;
// the edge grants the window as it reads.
func TestFramesLargeAnswer(t *testing.T) {
	big := []byte(strings.Repeat("0123456789", 100_000))
	fh := newScriptedHost(t, func(c *scriptedConn, id uint32, _ frame.Request, _ []byte) {
		go c.answerLarge(id, big)
	})
	hc := NewHostClient(10 * time.Second)
	defer hc.Close()
	status, ans, err := forwardTo(context.Background(), hc, fh.addr(), "big")
	require.NoError(t, err)
	assert.Equal(t, 200, status)
	assert.Equal(t, string(big), ans)
}

// TestFramesDialRefusedIsNeverSent: a host that is down is "never sent"
// (the edge may try the database's new route), as over HTTP.
func TestFramesDialRefusedIsNeverSent(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	ln.Close()
	hc := NewHostClient(10 * time.Second)
	defer hc.Close()
	_, _, err = forwardTo(context.Background(), hc, addr, "x")
	require.Error(t, err)
	assert.True(t, neverSent(err), "%v", err)
}

// The query path sets and reads X-Request-ID by its canonical key
// directly (no canonicalisation per request): the constant must be it.
func TestRequestIDHeaderKeyIsCanonical(t *testing.T) {
	assert.Equal(t, http.CanonicalHeaderKey(HeaderRequestID), headerRequestIDCanonical)
}

// TestFramesConnectionLostWakesEveryWaiter: the host drops a connection
// with many queries waiting on it; every one fails at once as "may have
// run" (none resent), none is left waiting for its deadline.
func TestFramesConnectionLostWakesEveryWaiter(t *testing.T) {
	const n = 8
	var executed atomic.Int32
	var mu sync.Mutex
	var conn *scriptedConn
	fh := newScriptedHost(t, func(c *scriptedConn, id uint32, req frame.Request, body []byte) {
		mu.Lock()
		conn = c
		mu.Unlock()
		executed.Add(1)
	})
	hc := NewHostClient(time.Minute)
	defer hc.Close()
	errc := make(chan error, n)
	for i := 0; i < n; i++ {
		go func() {
			_, _, err := forwardTo(context.Background(), hc, fh.addr(), fmt.Sprint("q", i))
			errc <- err
		}()
	}
	require.Eventually(t, func() bool { return executed.Load() == n }, 10*time.Second, time.Millisecond)
	mu.Lock()
	conn.nc.Close()
	mu.Unlock()
	for i := 0; i < n; i++ {
		select {
		case err := <-errc:
			assert.ErrorIs(t, err, errConnLost)
			assert.False(t, neverSent(err))
		case <-time.After(10 * time.Second):
			t.Fatal("a waiter was not woken by the connection's loss")
		}
	}
	assert.Equal(t, int32(n), executed.Load(), "none resent")
}
