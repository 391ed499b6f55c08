package harness

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	v4 "github.com/shoaldb/shoal/internal/v4"
)

// Listen opens a TCP listener on a free loopback port and returns it with
// its address (host:port).
func Listen(t testing.TB) (net.Listener, string) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	return ln, ln.Addr().String()
}

// Serve serves h on ln until the test ends, then shuts the server down
// (waiting up to 5 s for requests in flight). A handler with hot routes
// (an edge: LeanRoute) is served as `shoal edge serve` serves it, those
// routes on the v4 server's lean path.
func Serve(t testing.TB, ln net.Listener, h http.Handler) {
	type shutdowner interface {
		Shutdown(context.Context) error
	}
	var srv shutdowner
	if lr, ok := h.(interface {
		LeanRoute(method, path string) bool
	}); ok {
		s := v4.NewServer(h, v4.ServerOptions{Lean: lr.LeanRoute})
		go func() { _ = s.Serve(ln) }()
		srv = s
	} else {
		s := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = s.Serve(ln) }()
		srv = s
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
}

// FreeAddr is a loopback host:port that was free a moment ago, for a child
// process to listen on. Another process may take it meanwhile; the tests
// accept that race. It never hands out the same address twice in one test
// process: the kernel may give a just-closed port to the next listen on
// port 0, and two children of one cluster then collided on it (CI,
// TestFaultFreshTokenWorksOnEveryEdgeAtOnce: an edge and a host both got
// 127.0.0.1:34343).
func FreeAddr(t testing.TB) string {
	t.Helper()
	for range 1000 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		addr := ln.Addr().String()
		ln.Close()
		freeAddrMu.Lock()
		seen := freeAddrHanded[addr]
		freeAddrHanded[addr] = true
		freeAddrMu.Unlock()
		if !seen {
			return addr
		}
	}
	t.Fatal("FreeAddr: no loopback port not handed out before")
	return ""
}

var (
	freeAddrMu     sync.Mutex
	freeAddrHanded = map[string]bool{}
)

// WaitHTTP200 waits until a GET of url answers 200, failing t with
// msgAndArgs after within.
func WaitHTTP200(t testing.TB, url string, within time.Duration, msgAndArgs ...any) {
	t.Helper()
	WaitHTTP200With(t, http.DefaultClient, url, within, msgAndArgs...)
}

// WaitHTTP200With is WaitHTTP200 through hc (a cluster certificate's TLS
// client, PKI.HTTPClient).
func WaitHTTP200With(t testing.TB, hc *http.Client, url string, within time.Duration, msgAndArgs ...any) {
	t.Helper()
	require.Eventually(t, func() bool {
		resp, err := hc.Get(url)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	}, within, 50*time.Millisecond, msgAndArgs...)
}

// WaitReady waits up to 20 s until the raftmeta node serving HTTP on addr
// answers /readyz with 200.
func WaitReady(t testing.TB, addr string) {
	t.Helper()
	WaitHTTP200(t, "http://"+addr+"/readyz", 20*time.Second, "node at %s never ready", addr)
}

// DevBasePort finds a --base-port p for `shoal dev` with every port it
// derives from p free on 127.0.0.1: p (Raft), p+100 (catalog), p+200
// (object host), p+300, p+310 and p+311 (the Kafka-protocol broker and the
// pipeline's ClickHouse).
func DevBasePort(t testing.TB) int { return FreePortBase(t, 0, 100, 200, 300, 310, 311) }

// FreePortBase finds a base port p in [20000, 32000) with p+off free for
// every offset (free when probed: another process may take one before the
// caller binds it, as with FreeAddr). The range stays below Linux's
// ephemeral ports (32768–60999 by default): a shoal dev binds its later
// ports seconds after the probe, after opening many outgoing connections
// of its own, any of which could otherwise be handed one of them (seen in
// CI: "object host: bind: address already in use").
//
// SHOAL_TEST_PORT_RANGE=LO-HI keeps every probed port within [LO, HI]
// (engineers sharing a machine each run in their own range).
func FreePortBase(t testing.TB, offsets ...int) int {
	t.Helper()
	lo, span := 20000, 12000-400
	if r := os.Getenv("SHOAL_TEST_PORT_RANGE"); r != "" {
		a, b, ok := strings.Cut(r, "-")
		l, err1 := strconv.Atoi(a)
		h, err2 := strconv.Atoi(b)
		top := 0
		for _, off := range offsets {
			top = max(top, off)
		}
		if !ok || err1 != nil || err2 != nil || h-l-top < 1 {
			t.Fatalf("SHOAL_TEST_PORT_RANGE %q: want LO-HI wider than %d", r, top)
		}
		lo, span = l, h-l-top+1
	}
	for range 200 {
		p := lo + rand.IntN(span)
		ok := true
		for _, off := range offsets {
			ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p+off))
			if err != nil {
				ok = false
				break
			}
			ln.Close()
		}
		if ok {
			return p
		}
	}
	t.Fatal("no free port range")
	return 0
}
