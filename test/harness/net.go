package harness

import (
	"context"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Listen opens a TCP listener on a free loopback port and returns it with
// its address (host:port).
func Listen(t testing.TB) (net.Listener, string) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	return ln, ln.Addr().String()
}

// Serve serves h on ln until the test ends, then shuts the server down
// (waiting up to 5 s for requests in flight).
func Serve(t testing.TB, ln net.Listener, h http.Handler) {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
}

// FreeAddr is a loopback host:port that was free a moment ago, for a child
// process to listen on. Another process may take it meanwhile; the tests
// accept that race.
func FreeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().String()
}

// WaitHTTP200 waits until a GET of url answers 200, failing t with
// msgAndArgs after within.
func WaitHTTP200(t testing.TB, url string, within time.Duration, msgAndArgs ...any) {
	t.Helper()
	require.Eventually(t, func() bool {
		resp, err := http.Get(url)
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
