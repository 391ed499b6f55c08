package edge

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// hostConnsServer counts the connections it accepts.
func hostConnsServer(t *testing.T, h http.HandlerFunc) (*httptest.Server, *atomic.Int64) {
	var conns atomic.Int64
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, &conns
}

func readAll(t *testing.T, resp *http.Response) string {
	t.Helper()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	return string(b)
}

func TestHostConnsReuseAndHeaders(t *testing.T) {
	srv, conns := hostConnsServer(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("X-Got", r.Header.Get("X-Shoal-Database")+"|"+r.URL.Path+"|"+r.Host)
		w.Write(b)
	})
	p := newHostConns(4)
	defer p.close()
	for i := 0; i < 5; i++ {
		h := http.Header{}
		h.Set("X-Shoal-Database", "db1")
		resp, err := p.roundTrip(context.Background(), srv.URL+"/v1/objects/o1/query", h, []byte(`{"sql":"select 1"}`), 5*time.Second)
		require.NoError(t, err)
		require.Equal(t, 200, resp.StatusCode)
		require.Equal(t, "db1|/v1/objects/o1/query|"+strings.TrimPrefix(srv.URL, "http://"), resp.Header.Get("X-Got"))
		require.Equal(t, `{"sql":"select 1"}`, readAll(t, resp))
	}
	require.Equal(t, int64(1), conns.Load(), "one keep-alive connection for sequential requests")
}

func TestHostConnsChunkedAndLargeBodies(t *testing.T) {
	big := strings.Repeat("x", 200_000)
	srv, conns := hostConnsServer(t, func(w http.ResponseWriter, r *http.Request) {
		for i := 0; i < 4; i++ { // no Content-Length: chunked
			io.WriteString(w, big[:50_000])
			w.(http.Flusher).Flush()
		}
	})
	p := newHostConns(4)
	defer p.close()
	for i := 0; i < 3; i++ {
		resp, err := p.roundTrip(context.Background(), srv.URL+"/q", http.Header{}, []byte(big), 5*time.Second)
		require.NoError(t, err)
		require.Equal(t, big, readAll(t, resp))
	}
	require.Equal(t, int64(1), conns.Load())
}

// A host that restarts closes its connections; the next request notices the
// closed idle connection before writing and dials again.
func TestHostConnsHostRestart(t *testing.T) {
	srv, conns := hostConnsServer(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	p := newHostConns(4)
	defer p.close()
	resp, err := p.roundTrip(context.Background(), srv.URL+"/q", http.Header{}, nil, 5*time.Second)
	require.NoError(t, err)
	require.Equal(t, "ok", readAll(t, resp))
	srv.CloseClientConnections()
	waitPeerClosed(t, p, strings.TrimPrefix(srv.URL, "http://")) // the FIN reaches us
	resp, err = p.roundTrip(context.Background(), srv.URL+"/q", http.Header{}, nil, 5*time.Second)
	require.NoError(t, err)
	require.Equal(t, "ok", readAll(t, resp))
	require.Equal(t, int64(2), conns.Load())
}

// waitPeerClosed blocks until the pool's idle connection to addr has seen
// its peer close it (end of stream readable), on the runtime's poller: no
// sleep, no guess at how long a FIN takes. (Real sockets: synctest cannot
// run this test.)
func waitPeerClosed(t *testing.T, p *hostConns, addr string) {
	t.Helper()
	p.mu.Lock()
	idle := p.idle[addr]
	p.mu.Unlock()
	require.Len(t, idle, 1, "one idle connection to %s", addr)
	rc, err := idle[0].nc.(syscall.Conn).SyscallConn()
	require.NoError(t, err)
	require.NoError(t, rc.Read(func(fd uintptr) bool {
		var b [1]byte
		_, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		return !errors.Is(err, syscall.EAGAIN) // readable: EOF (or data)
	}))
}

// A body closed before its end, a cancelled request and a refused dial.
func TestHostConnsFailures(t *testing.T) {
	slow := make(chan struct{})
	srv, conns := hostConnsServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			select {
			case <-slow:
			case <-r.Context().Done():
			}
		}
		io.WriteString(w, strings.Repeat("y", 100_000))
	})
	defer close(slow)
	p := newHostConns(4)
	defer p.close()

	resp, err := p.roundTrip(context.Background(), srv.URL+"/q", http.Header{}, nil, 5*time.Second)
	require.NoError(t, err)
	buf := make([]byte, 10)
	_, err = io.ReadFull(resp.Body, buf)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close()) // early: the connection is not reused
	resp, err = p.roundTrip(context.Background(), srv.URL+"/q", http.Header{}, nil, 5*time.Second)
	require.NoError(t, err)
	readAll(t, resp)
	require.Equal(t, int64(2), conns.Load())

	// The context's deadline aborts the exchange: the host never answers
	// and the round trip's own timeout is an hour, so only the context can
	// end it (a regression hangs here until go test's -timeout). No clock
	// is read: real sockets, so synctest cannot run this. (The error is
	// the context's, or the connection's "i/o timeout" when the deadline
	// roundTrip set from the context fires before the context's own timer.)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err = p.roundTrip(ctx, srv.URL+"/slow", http.Header{}, nil, time.Hour)
	require.Error(t, err, "the context's deadline aborts the exchange")

	h := http.Header{}
	h.Set("X-Shoal-Request-Id", "a\r\nX-Evil: 1")
	_, err = p.roundTrip(context.Background(), srv.URL+"/q", h, nil, 5*time.Second)
	require.ErrorContains(t, err, "invalid value")

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	ln.Close()
	_, err = p.roundTrip(context.Background(), "http://"+addr+"/q", http.Header{}, nil, time.Second)
	require.Error(t, err)
	require.True(t, neverSent(err), "a refused dial is never sent: %v", err)
}
