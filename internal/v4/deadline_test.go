package v4

import (
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// deadlineRecorder is a net.Conn that records the deadlines applied to it.
type deadlineRecorder struct {
	net.Conn
	mu    sync.Mutex
	reads []time.Time
	write []time.Time
}

func (d *deadlineRecorder) SetReadDeadline(t time.Time) error {
	d.mu.Lock()
	d.reads = append(d.reads, t)
	d.mu.Unlock()
	return d.Conn.SetReadDeadline(t)
}

func (d *deadlineRecorder) SetWriteDeadline(t time.Time) error {
	d.mu.Lock()
	d.write = append(d.write, t)
	d.mu.Unlock()
	return d.Conn.SetWriteDeadline(t)
}

func (d *deadlineRecorder) counts() (reads, writes int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.reads), len(d.write)
}

// The connection applies every read deadline a read could tell apart from
// the one in force, and skips the rest: the same deadline again, a clear
// after a clear, one later by at most readSlack.
func TestConnReadDeadlineSkipsOnlyNoOps(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	rec := &deadlineRecorder{Conn: a}
	c := &conn{Conn: rec, o: &ServerOptions{}}
	c.o.defaults()

	t0 := time.Now().Add(10 * time.Second)
	require.NoError(t, c.SetReadDeadline(time.Time{}))                  // unknown state: applied
	require.NoError(t, c.SetReadDeadline(time.Time{}))                  // a clear after a clear: skipped
	require.NoError(t, c.SetReadDeadline(t0))                           // applied
	require.NoError(t, c.SetReadDeadline(t0))                           // the same: skipped
	require.NoError(t, c.SetReadDeadline(t0.Add(50*time.Microsecond)))  // later by < readSlack: skipped
	require.NoError(t, c.SetReadDeadline(t0.Add(-50*time.Microsecond))) // earlier: applied
	require.NoError(t, c.SetReadDeadline(t0.Add(time.Second)))          // later by more: applied
	require.NoError(t, c.SetReadDeadline(time.Unix(1, 0)))              // "a long time ago": applied
	require.NoError(t, c.SetReadDeadline(time.Time{}))                  // clear: applied
	require.NoError(t, c.SetDeadline(t0))                               // both: applied
	require.NoError(t, c.SetReadDeadline(t0))                           // the same as SetDeadline's: skipped
	assert.Equal(t, []time.Time{{}, t0, t0.Add(-50 * time.Microsecond), t0.Add(time.Second), time.Unix(1, 0), {}}, rec.reads)

	// What a read sees is what was asked, within readSlack.
	require.NoError(t, c.SetReadDeadline(time.Now().Add(-time.Second)))
	_, err := c.Read(make([]byte, 1))
	var ne net.Error
	require.ErrorAs(t, err, &ne)
	assert.True(t, ne.Timeout(), "a past deadline is in force")
}

// A clear of the write deadline (net/http's, after every answer) leaves
// the one write armed in force: the next answer's write does not move it
// again, and a write still never runs without a deadline.
func TestConnWriteDeadlineNotClearedBetweenAnswers(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	go func() {
		buf := make([]byte, 64)
		for {
			if _, err := b.Read(buf); err != nil {
				return
			}
		}
	}()
	rec := &deadlineRecorder{Conn: a}
	c := &conn{Conn: rec, o: &ServerOptions{}}
	c.o.defaults()
	for i := 0; i < 10; i++ {
		_, err := c.Write([]byte("answer"))
		require.NoError(t, err)
		require.NoError(t, c.SetWriteDeadline(time.Time{}))
	}
	_, writes := rec.counts()
	assert.Equal(t, 1, writes, "armed once, not cleared and armed again per answer: %v", rec.write)
	assert.False(t, rec.write[0].IsZero())

	// Someone else's deadline makes the next write arm its own again.
	require.NoError(t, c.SetWriteDeadline(time.Now().Add(time.Hour)))
	_, err := c.Write([]byte("answer"))
	require.NoError(t, err)
	_, writes = rec.counts()
	assert.Equal(t, 3, writes)
}

// recordingListener hands out deadlineRecorders.
type recordingListener struct {
	net.Listener
	mu    sync.Mutex
	conns []*deadlineRecorder
}

func (l *recordingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	r := &deadlineRecorder{Conn: c}
	l.mu.Lock()
	l.conns = append(l.conns, r)
	l.mu.Unlock()
	return r, nil
}

// Through net/http, on one keep-alive connection: the write deadline is
// not moved per request, and fewer read deadline moves reach the socket
// than net/http asks for (8 per request with a body on Go 1.26; 6.9
// reach it with the skips).
func TestKeepAliveRequestsMoveFewerDeadlines(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	rl := &recordingListener{Listener: ln}
	srv := NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		buf := make([]byte, 64)
		for {
			if _, err := r.Body.Read(buf); err != nil {
				break
			}
		}
		WriteResult(w, "ok")
	}), ServerOptions{})
	go func() { _ = srv.Serve(rl) }()
	defer srv.Close()

	c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
	const n = 50
	for i := 0; i < n; i++ {
		resp, err := c.Post("http://"+ln.Addr().String()+"/", "application/json", strings.NewReader(`{"sql":"SELECT 1"}`))
		require.NoError(t, err)
		_, _ = resp.Body.Read(make([]byte, 512))
		resp.Body.Close()
		require.Equal(t, 200, resp.StatusCode)
	}
	rl.mu.Lock()
	require.Len(t, rl.conns, 1, "one keep-alive connection")
	rec := rl.conns[0]
	rl.mu.Unlock()
	reads, writes := rec.counts()
	assert.LessOrEqual(t, writes, 2, "write deadline armed once, not per answer")
	assert.Less(t, reads, 8*n, "read deadlines per request")
	t.Logf("%d requests: %d read deadline moves, %d write deadline moves reached the socket", n, reads, writes)
}
