package objecthost

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/internal/frame"
	"github.com/shoaldb/shoal/internal/pki"
	v4 "github.com/shoaldb/shoal/internal/v4"
	"github.com/shoaldb/shoal/pipeline/event"
)

// frameClient is a bare client of the frame protocol, driving the host the
// way an edge does, one frame at a time.
type frameClient struct {
	t     *testing.T
	nc    net.Conn
	rd    *frame.Reader
	held  map[uint32][]heldFrame // frames read while waiting for another stream
	ended map[uint32]bool
	hdr   http.Header // the 101 answer's
}

type heldFrame struct {
	h frame.Header
	p []byte
}

// upgradeFrames dials addr (through tlsCfg if set), asks for the upgrade
// and returns the answer's status; the client when it is 101.
func upgradeFrames(t *testing.T, addr string, tlsCfg *tls.Config) (*frameClient, int) {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	if tlsCfg != nil {
		tc := tls.Client(nc, tlsCfg)
		require.NoError(t, tc.Handshake())
		nc = tc
	}
	t.Cleanup(func() { nc.Close() })
	_, err = io.WriteString(nc, "GET /v1/frames HTTP/1.1\r\nHost: h\r\nConnection: Upgrade\r\nUpgrade: "+frame.Protocol+"\r\n\r\n")
	require.NoError(t, err)
	br := bufio.NewReader(nc)
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	if resp.StatusCode != http.StatusSwitchingProtocols {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil, resp.StatusCode
	}
	return &frameClient{t: t, nc: nc, rd: frame.NewReader(br), held: map[uint32][]heldFrame{}, ended: map[uint32]bool{}, hdr: resp.Header}, resp.StatusCode
}

func dialFrames(t *testing.T, srv *httptest.Server) *frameClient {
	t.Helper()
	c, status := upgradeFrames(t, srv.Listener.Addr().String(), nil)
	require.Equal(t, http.StatusSwitchingProtocols, status)
	return c
}

func (c *frameClient) write(b []byte) {
	_, err := c.nc.Write(b)
	require.NoError(c.t, err)
}

func (c *frameClient) request(id uint32, path string, d *db, hdr http.Header, body string) {
	if hdr == nil {
		hdr = http.Header{}
	}
	if d != nil {
		hdr.Set(HeaderDatabase, d.uuid)
		hdr.Set(HeaderAccount, d.account)
	}
	b, err := frame.AppendRequest(nil, id, path, hdr, []byte(body))
	require.NoError(c.t, err)
	c.write(b)
}

// next reads one frame (10 s at most: a hang fails the test).
func (c *frameClient) next() (frame.Header, []byte, error) {
	_ = c.nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	h, p, err := c.rd.Next()
	return h, bytes.Clone(p), err
}

// answer collects stream id's whole answer.
func (c *frameClient) answer(id uint32) (int, http.Header, []byte) {
	c.t.Helper()
	status, var_hdr := 0, http.Header(nil)
	var body []byte
	for {
		var h frame.Header
		var p []byte
		if q := c.held[id]; len(q) > 0 {
			h, p, c.held[id] = q[0].h, q[0].p, q[1:]
		} else {
			var err error
			h, p, err = c.next()
			require.NoError(c.t, err)
			if h.Stream != id {
				c.held[h.Stream] = append(c.held[h.Stream], heldFrame{h, p})
				continue
			}
		}
		switch h.Type {
		case frame.TypeResponse:
			r, err := frame.ParseResponse(p)
			require.NoError(c.t, err)
			status, var_hdr = r.Status, r.Header
			body = append(body, r.Chunk...)
		case frame.TypeData:
			body = append(body, p...)
		default:
			c.t.Fatalf("stream %d: frame type %d", id, h.Type)
		}
		if h.End() {
			c.ended[id] = true
			return status, var_hdr, body
		}
	}
}

// closed reports whether the host closed the connection (reading
// returns an error, not a frame).
func (c *frameClient) closed() bool {
	for {
		_, _, err := c.next()
		if err != nil {
			var ne net.Error
			return !(errors.As(err, &ne) && ne.Timeout())
		}
	}
}

// httpAnswer does the same request over HTTP.
func httpAnswer(t *testing.T, srv *httptest.Server, path string, d *db, hdr http.Header, body string) (int, http.Header, []byte) {
	req, err := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader(body))
	require.NoError(t, err)
	for k, v := range hdr {
		req.Header[k] = v
	}
	if d != nil {
		req.Header.Set(HeaderDatabase, d.uuid)
		req.Header.Set(HeaderAccount, d.account)
	}
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, resp.Header, b
}

// withoutDuration drops the timings (meta.duration, meta.timings) from a v4
// answer.
func withoutDuration(t *testing.T, b []byte) string {
	var v any
	require.NoError(t, json.Unmarshal(b, &v), "%s", b)
	var strip func(any)
	strip = func(x any) {
		switch x := x.(type) {
		case map[string]any:
			delete(x, "duration")
			delete(x, "timings")
			for _, y := range x {
				strip(y)
			}
		case []any:
			for _, y := range x {
				strip(y)
			}
		}
	}
	strip(v)
	out, _ := json.Marshal(v)
	return string(out)
}

// TestFramesAnswerAsHTTP: every kind of query answer — results, SQL
// errors, refusals of the body, the headers, the identity, the object —
// is the same over frames as over HTTP: status, content type, envelope.
func TestFramesAnswerAsHTTP(t *testing.T) {
	th := newTestHost(t, func(c *Config) { c.MaxBodyBytes = 2000 })
	srv := serve(t, th)
	d := newDB("acct")
	th.mustInit(t, d)
	_, err := th.Query(context.Background(), d.obj, d.id(), q("CREATE TABLE kv (k INTEGER PRIMARY KEY, v TEXT); INSERT INTO kv VALUES (1, 'one'), (2, 'two')"))
	require.NoError(t, err)
	other := newDB("acct")
	query := "/v1/objects/" + d.obj + "/query"
	cases := []struct {
		name, path string
		d          *db
		hdr        http.Header
		body       string
	}{
		{"select", query, &d, nil, `{"sql":"SELECT * FROM kv WHERE k = ?","params":[1]}`},
		{"raw", "/v1/objects/" + d.obj + "/raw", &d, nil, `{"sql":"SELECT * FROM kv"}`},
		{"sql error", query, &d, nil, `{"sql":"SELECT * FROM nope"}`},
		{"bad json", query, &d, nil, `{"sql":`},
		{"read-only write", query, &d, http.Header{HeaderReadOnly: {"1"}}, `{"sql":"INSERT INTO kv VALUES (3, 'three')"}`},
		{"numbers header", query, &d, http.Header{HeaderNumbers: {"float"}}, `{"sql":"SELECT 1"}`},
		{"body over the limit", query, &d, nil, `{"sql":"SELECT '` + strings.Repeat("x", 3000) + `'"}`},
		{"wrong database", query, &db{obj: d.obj, uuid: other.uuid, account: d.account}, nil, `{"sql":"SELECT 1"}`},
		{"unknown object", "/v1/objects/" + other.obj + "/query", &other, nil, `{"sql":"SELECT 1"}`},
		{"bound without token", "/v1/bound/query", nil, nil, `{"sql":"SELECT 1"}`},
	}
	fc := dialFrames(t, srv)
	for i, tc := range cases {
		id := uint32(2*i + 1)
		fc.request(id, tc.path, tc.d, tc.hdr.Clone(), tc.body)
		fs, fh, fb := fc.answer(id)
		hs, hh, hb := httpAnswer(t, srv, tc.path, tc.d, tc.hdr, tc.body)
		assert.Equal(t, hs, fs, tc.name)
		assert.Equal(t, hh.Get("Content-Type"), fh.Get("Content-Type"), tc.name)
		assert.Equal(t, hh.Get("Retry-After"), fh.Get("Retry-After"), tc.name)
		assert.Equal(t, withoutDuration(t, hb), withoutDuration(t, fb), tc.name)
	}
	// The write through frames happened once (the read-only one did not).
	res, err := th.Query(context.Background(), d.obj, d.id(), q("SELECT count(*) AS n FROM kv"))
	require.NoError(t, err)
	assert.Contains(t, mustJSON(t, res), `"n":2`)
}

// TestFramesStreamsShareNoAnswerState: a worker lends each stream it runs
// the same header map and answer buffer (frames.go, workerScratch); one
// stream's answer never carries another's headers or bytes. Streams one
// at a time on one connection run on the same worker.
func TestFramesStreamsShareNoAnswerState(t *testing.T) {
	th := newTestHost(t, nil)
	srv := serve(t, th)
	d := newDB("acct")
	th.mustInit(t, d)
	_, err := th.Query(context.Background(), d.obj, d.id(), q("CREATE TABLE kv (k INTEGER PRIMARY KEY, v TEXT); INSERT INTO kv VALUES (1, 'one'), (2, 'two')"))
	require.NoError(t, err)
	query := "/v1/objects/" + d.obj + "/query"
	fc := dialFrames(t, srv)

	// A refusal with Retry-After (the account's row limit), then answers
	// without it.
	th.SetAccountLimited(d.account, th.clock.Now().Add(time.Hour))
	fc.request(1, query, &d, nil, `{"sql":"SELECT v FROM kv WHERE k = 1"}`)
	status, hdr, _ := fc.answer(1)
	require.Equal(t, http.StatusTooManyRequests, status)
	require.NotEmpty(t, hdr.Get("Retry-After"))
	th.SetAccountLimited(d.account, time.Time{})

	long := strings.Repeat(" ", 2*smallBody) // a body over the stream's own buffer
	for i, tc := range []struct{ body, want string }{
		{`{"sql":"SELECT v FROM kv WHERE k = ?","params":[2]}`, `"results":[{"v":"two"}]`},
		{`{"sql":"SELECT v FROM kv WHERE k = ?` + long + `","params":[1]}`, `"results":[{"v":"one"}]`},
		{`{"sql":"SELECT 7 AS n"}`, `"results":[{"n":7}]`},
	} {
		id := uint32(3 + 2*i)
		fc.request(id, query, &d, nil, tc.body)
		status, hdr, body := fc.answer(id)
		require.Equal(t, http.StatusOK, status, "%s", body)
		assert.Empty(t, hdr.Get("Retry-After"), "stream %d", id)
		assert.Equal(t, []string{"application/json"}, hdr.Values("Content-Type"), "stream %d", id)
		assert.Empty(t, hdr.Get("Content-Length"), "frames delimit the answer")
		assert.Contains(t, string(body), tc.want, "stream %d", id)
		var env envelope
		require.NoError(t, json.Unmarshal(body, &env), "one whole answer: %s", body)
		assert.True(t, env.Success)
	}
}

// TestFramesOnlyQueryRoutes: a stream to any route but the query routes
// and the batched lifecycle calls is refused without running it.
func TestFramesOnlyQueryRoutes(t *testing.T) {
	th := newTestHost(t, nil)
	srv := serve(t, th)
	d := newDB("acct")
	fc := dialFrames(t, srv)
	fc.request(1, "/v1/objects/"+d.obj+"/init", nil, nil, mustJSON(t, d.init()))
	status, _, body := fc.answer(1)
	assert.Equal(t, http.StatusBadRequest, status, "%s", body)
	_, err := th.Info(context.Background(), d.obj)
	assert.ErrorIs(t, err, ErrNotFound, "init did not run")
	fc.request(3, "/v1/objects/"+d.obj+"/query?x=1", &d, nil, `{"sql":"SELECT 1"}`)
	status, _, _ = fc.answer(3)
	assert.Equal(t, http.StatusBadRequest, status)
}

// TestFramesCancelledStreamDoesNotWedge: a query that would run forever is
// reset by the edge; the host cancels it (its stream ends), and the
// connection serves other queries throughout — answered while the first
// still runs, so out of order.
func TestFramesCancelledStreamDoesNotWedge(t *testing.T) {
	th := newTestHost(t, nil)
	srv := serve(t, th)
	slow, fast := newDB("acct"), newDB("acct")
	th.mustInit(t, slow)
	th.mustInit(t, fast)
	fc := dialFrames(t, srv)
	fc.request(1, "/v1/objects/"+slow.obj+"/query", &slow, nil,
		`{"sql":"WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"}`)
	for i := uint32(3); i < 13; i += 2 {
		fc.request(i, "/v1/objects/"+fast.obj+"/query", &fast, nil, `{"sql":"SELECT 42 AS answer"}`)
	}
	for i := uint32(3); i < 13; i += 2 {
		status, _, body := fc.answer(i)
		require.Equal(t, http.StatusOK, status, "%s", body)
		assert.Contains(t, string(body), `"answer":42`)
	}
	assert.False(t, fc.ended[1], "the endless query is still running")
	conn := onlyConn(t, th.Host)
	require.Eventually(t, func() bool { return streamCount(conn) == 1 }, 10*time.Second, 10*time.Millisecond)
	fc.write(frame.AppendReset(nil, 1))
	require.Eventually(t, func() bool { return streamCount(conn) == 0 }, 20*time.Second, 10*time.Millisecond,
		"the reset stream's handler never ended: the query was not cancelled")
	fc.request(13, "/v1/objects/"+slow.obj+"/query", &slow, nil, `{"sql":"SELECT 7 AS n"}`)
	status, _, body := fc.answer(13)
	require.Equal(t, http.StatusOK, status, "%s", body)
	assert.Contains(t, string(body), `"n":7`)
}

// TestFramesConnectionLossCancelsRunningQueries: when the edge's
// connection goes away, a query still running on it is cancelled (its
// handler ends) rather than running on with no one to answer.
func TestFramesConnectionLossCancelsRunningQueries(t *testing.T) {
	th := newTestHost(t, nil)
	srv := serve(t, th)
	slow := newDB("acct")
	th.mustInit(t, slow)
	fc := dialFrames(t, srv)
	fc.request(1, "/v1/objects/"+slow.obj+"/query", &slow, nil,
		`{"sql":"WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"}`)
	conn := onlyConn(t, th.Host)
	require.Eventually(t, func() bool {
		conn.mu.Lock()
		defer conn.mu.Unlock()
		st := conn.streams[1]
		return st != nil && st.running
	}, 10*time.Second, 10*time.Millisecond)
	require.NoError(t, fc.nc.Close())
	require.Eventually(t, func() bool { return streamCount(conn) == 0 }, 20*time.Second, 10*time.Millisecond,
		"the lost connection's query was not cancelled")
}

func onlyConn(t *testing.T, h *Host) *frameConn {
	t.Helper()
	h.frames.mu.Lock()
	defer h.frames.mu.Unlock()
	require.Len(t, h.frames.conns, 1)
	for c := range h.frames.conns {
		return c
	}
	return nil
}

func streamCount(c *frameConn) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.streams)
}

// TestFramesProtocolErrorsCloseTheConnection: a peer's bad frames close
// its connection, nothing else; the host goes on serving.
func TestFramesProtocolErrorsCloseTheConnection(t *testing.T) {
	th := newTestHost(t, nil)
	srv := serve(t, th)
	d := newDB("acct")
	th.mustInit(t, d)
	okReq, err := frame.AppendRequest(nil, 1, "/v1/objects/"+d.obj+"/query", http.Header{HeaderDatabase: {d.uuid}, HeaderAccount: {d.account}}, []byte(`{"sql":"SELECT 1"}`))
	require.NoError(t, err)
	bad := map[string][]byte{
		"oversized frame":      append(frame.AppendHeader(nil, frame.Header{Len: frame.MaxPayload + 1, Type: frame.TypeData, Stream: 1}), make([]byte, 100)...),
		"unknown type":         frame.AppendHeader(nil, frame.Header{Type: 42, Stream: 1}),
		"data never opened":    frame.AppendData(nil, 9, []byte("x"), true),
		"response from client": frame.AppendHeader(nil, frame.Header{Type: frame.TypeResponse, Stream: 1}),
		"stream id reused":     append(bytes.Clone(okReq), okReq...),
		"body past declared":   append(frame.AppendHeader(nil, frame.Header{Len: 10, Type: frame.TypeRequest, Flags: frame.FlagEnd, Stream: 1}), 0, 0, 0, 0, 0, 1, '/', 0, 0, 'x'),
		"garbage":              []byte("GET / HTTP/1.1\r\n\r\n"),
		"truncated request":    okReq[:len(okReq)-3],
	}
	for name, b := range bad {
		fc := dialFrames(t, srv)
		fc.write(b)
		if name == "truncated request" {
			fc.nc.(*net.TCPConn).CloseWrite()
		}
		assert.True(t, fc.closed(), name)
	}
	fc := dialFrames(t, srv)
	fc.write(okReq)
	status, _, body := fc.answer(1)
	assert.Equal(t, http.StatusOK, status, "%s", body)
}

// TestFramesCloseDrains: Host.Close sends a GoAway naming the last
// stream accepted, answers it (the host is open until it is), refuses —
// without running — streams opened after, then closes the connection.
func TestFramesCloseDrains(t *testing.T) {
	th := newTestHost(t, nil)
	srv := serve(t, th)
	d := newDB("acct")
	th.mustInit(t, d)
	_, err := th.Query(context.Background(), d.obj, d.id(), q("CREATE TABLE t (x)"))
	require.NoError(t, err)
	fc := dialFrames(t, srv)
	path := "/v1/objects/" + d.obj + "/query"
	body := []byte(`{"sql":"INSERT INTO t VALUES (1)"}`)
	// Stream 1's body is left incomplete: accepted, not yet running.
	b, err := frame.AppendRequest(nil, 1, path, http.Header{HeaderDatabase: {d.uuid}, HeaderAccount: {d.account}}, body)
	require.NoError(t, err)
	head := b[:len(b)-len(body)]
	head[5] = 0 // no FlagEnd
	putLen(head, len(head)-frame.HeaderLen)
	fc.write(head)
	require.Eventually(t, func() bool { return streamCount(onlyConn(t, th.Host)) == 1 }, 10*time.Second, 10*time.Millisecond)

	closed := make(chan error, 1)
	go func() { closed <- th.Host.Close() }()
	h, p, err := fc.next()
	require.NoError(t, err)
	require.Equal(t, frame.TypeGoAway, h.Type)
	assert.Equal(t, uint32(1), frame.Uint32(p))
	// Stream 3, after the GoAway: never run.
	fc.request(3, path, &d, nil, `{"sql":"INSERT INTO t VALUES (3)"}`)
	fc.write(frame.AppendData(nil, 1, body, true))
	status, _, ans := fc.answer(1)
	assert.Equal(t, http.StatusOK, status, "%s", ans)
	assert.True(t, fc.closed(), "the connection closes once its streams are answered")
	require.NoError(t, <-closed)
	th.open(t)
	res, err := th.Query(context.Background(), d.obj, d.id(), q("SELECT group_concat(x) AS xs FROM t"))
	require.NoError(t, err)
	assert.Contains(t, mustJSON(t, res), `"xs":"1"`, "stream 1 ran, stream 3 did not")
	// A closed host refuses the upgrade (srv still serves the closed
	// host's handler).
	_, st := upgradeFrames(t, srv.Listener.Addr().String(), nil)
	assert.Equal(t, http.StatusServiceUnavailable, st)
}

func putLen(b []byte, n int) { b[0], b[1], b[2], b[3] = byte(n>>24), byte(n>>16), byte(n>>8), byte(n) }

// TestFramesWindow: a large answer is sent only as far as the window the
// client granted; the rest follows its Window frames.
func TestFramesWindow(t *testing.T) {
	th := newTestHost(t, nil)
	srv := serve(t, th)
	d := newDB("acct")
	th.mustInit(t, d)
	fc := dialFrames(t, srv)
	fc.request(1, "/v1/objects/"+d.obj+"/query", &d, nil, `{"sql":"SELECT hex(zeroblob(400000)) AS big"}`)
	got := 0
	var body []byte
	for got < frame.InitialWindow {
		h, p, err := fc.next()
		require.NoError(t, err)
		require.False(t, h.End(), "the answer is larger than the window")
		if h.Type == frame.TypeResponse {
			r, err := frame.ParseResponse(p)
			require.NoError(t, err)
			p = r.Chunk
		}
		got += len(p)
		body = append(body, p...)
	}
	assert.Equal(t, frame.InitialWindow, got, "no more than the window before a Window frame")
	_ = fc.nc.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	_, _, err := fc.rd.Next()
	var ne net.Error
	require.True(t, errors.As(err, &ne) && ne.Timeout(), "nothing past the window: %v", err)
	// A grant smaller than a frame: exactly that much more comes.
	fc.write(frame.AppendWindow(nil, 1, 1000))
	more := 0
	for more < 1000 {
		h, p, err := fc.next()
		require.NoError(t, err)
		require.Equal(t, frame.TypeData, h.Type)
		more += len(p)
		body = append(body, p...)
	}
	assert.Equal(t, 1000, more)
	_ = fc.nc.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	_, _, err = fc.rd.Next()
	require.True(t, errors.As(err, &ne) && ne.Timeout(), "nothing past the window: %v", err)
	fc.write(frame.AppendWindow(nil, 1, 1<<30))
	for {
		h, p, err := fc.next()
		require.NoError(t, err)
		body = append(body, p...)
		if h.End() {
			break
		}
	}
	assert.Contains(t, string(body), strings.Repeat("00", 1000))
	assert.True(t, json.Valid(body))
}

// TestFramesAuthenticated: with mutual TLS the upgrade is a request like
// any other: a certificate without the edge (or operator) role is refused,
// and streams on an edge's connection pass the same role check.
func TestFramesAuthenticated(t *testing.T) {
	issue := testCA(t)
	hostTLS := issue("h1", pki.RoleHost)
	th := newTestHost(t, func(c *Config) { c.TLS = hostTLS })
	ln := serveTLS(t, th, hostTLS)
	d := newDB("acct")
	th.mustInit(t, d)

	_, status := upgradeFrames(t, ln.Addr().String(), issue("p1", pki.RolePipeline).ClientFor(pki.RoleHost))
	assert.Equal(t, http.StatusForbidden, status)
	fc, status := upgradeFrames(t, ln.Addr().String(), issue("e1", pki.RoleEdge).ClientFor(pki.RoleHost))
	require.Equal(t, http.StatusSwitchingProtocols, status)
	fc.request(1, "/v1/objects/"+d.obj+"/query", &d, nil, `{"sql":"SELECT 5 AS five"}`)
	st, _, body := fc.answer(1)
	assert.Equal(t, http.StatusOK, st, "%s", body)
	assert.Contains(t, string(body), `"five":5`)
}

// FuzzFrameConn sends arbitrary bytes on an upgraded connection to a real
// host: whatever they are, the host answers or closes that connection —
// it never crashes, never hangs the connection past the peer's end, and
// goes on serving others.
func FuzzFrameConn(f *testing.F) {
	h, err := Open(Config{ID: "fuzz", Dir: f.TempDir(), Manual: true})
	require.NoError(f, err)
	defer h.Close()
	srv := httptest.NewServer(h.Handler())
	defer srv.Close()
	d := newDB("acct")
	_, err = h.Init(context.Background(), d.obj, d.init())
	require.NoError(f, err)
	hdr := http.Header{HeaderDatabase: {d.uuid}, HeaderAccount: {d.account}}
	req, _ := frame.AppendRequest(nil, 1, "/v1/objects/"+d.obj+"/query", hdr, []byte(`{"sql":"SELECT 1"}`))
	f.Add(req)
	long, _ := frame.AppendRequest(nil, 3, "/v1/objects/"+d.obj+"/raw", hdr, bytes.Repeat([]byte(" "), frame.MaxPayload+10))
	f.Add(append(append(bytes.Clone(req), long...), frame.AppendReset(nil, 3)...))
	f.Add(append(frame.AppendWindow(nil, 1, 5), frame.AppendData(nil, 1, []byte("x"), true)...))
	f.Fuzz(func(t *testing.T, b []byte) {
		fc, status := upgradeFrames(t, srv.Listener.Addr().String(), nil)
		require.Equal(t, http.StatusSwitchingProtocols, status)
		_, _ = fc.nc.Write(b)
		_ = fc.nc.(*net.TCPConn).CloseWrite()
		_ = fc.nc.SetReadDeadline(time.Now().Add(20 * time.Second))
		for {
			if _, _, err := fc.rd.Next(); err != nil {
				var ne net.Error
				require.False(t, errors.As(err, &ne) && ne.Timeout(), "the host kept the connection after the peer's end")
				break
			}
		}
		fc.nc.Close()
	})
}

// frameWorkers counts the goroutines running frameServer.worker.
func frameWorkers() int {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	return strings.Count(string(buf), "objecthost.(*frameServer).worker(")
}

// TestFramesWorkersOutliveStreamsAndStopOnClose: streams run on worker
// goroutines that wait for the next stream once theirs is answered (so
// their grown stacks are reused), and Host.Close stops the waiting ones.
func TestFramesWorkersOutliveStreamsAndStopOnClose(t *testing.T) {
	before := frameWorkers()
	th := newTestHost(t, nil)
	srv := serve(t, th)
	d := newDB("acct")
	th.mustInit(t, d)
	fc := dialFrames(t, srv)
	for i := uint32(1); i < 40; i += 2 {
		fc.request(i, "/v1/objects/"+d.obj+"/query", &d, nil, `{"sql":"SELECT 42 AS answer"}`)
		status, _, body := fc.answer(i)
		require.Equal(t, http.StatusOK, status, "%s", body)
	}
	require.Eventually(t, func() bool { return th.Host.frames.idle.Load() >= 1 }, 10*time.Second, time.Millisecond,
		"no worker waits for the next stream")
	assert.LessOrEqual(t, frameWorkers()-before, 2, "20 streams one after another reuse their worker")
	require.NoError(t, th.Host.Close())
	require.Eventually(t, func() bool { return frameWorkers() == before }, 10*time.Second, 10*time.Millisecond,
		"workers still running after Close")
}

// DESIGN.md states how many workers wait.
func TestFrameWorkersAsDocumented(t *testing.T) {
	doc, err := os.ReadFile("DESIGN.md")
	require.NoError(t, err)
	assert.Contains(t, string(doc), "(up to 256 wait,")
	assert.Equal(t, 256, maxIdleWorkers)
	flat := strings.Join(strings.Fields(string(doc)), " ")
	assert.Contains(t, flat, "(in the stream itself up to 512 bytes)")
	assert.Equal(t, 512, smallBody)
	assert.Contains(t, flat, "reuses up to 64 freed account slots")
	assert.Equal(t, 64, maxFreeSlots)
}

// TestFramesLifecycleBatches: the batched lifecycle calls on a stream get
// the answer the same call gets over HTTP — per-item refusals included —
// and run (the inits are there, the confirm took); the 101 answer says
// the host serves them. A host standing for an earlier version (lifecycle
// off) says nothing, and refuses them on streams without running them.
func TestFramesLifecycleBatches(t *testing.T) {
	th := newTestHost(t, nil)
	srv := serve(t, th)
	fc := dialFrames(t, srv)
	assert.Equal(t, frame.RoutesLifecycle, fc.hdr.Get(frame.HeaderRoutes))

	a, b, taken := newDB("acct"), newDB("acct"), newDB("acct")
	th.mustInit(t, taken)
	inits := mustJSON(t, event.InitBatchRequest{Inits: []event.InitBatchItem{
		{ObjectID: a.obj, Init: a.init()},
		{ObjectID: "not-hex", Init: b.init()},
		{ObjectID: taken.obj, Init: InitRequest{DatabaseUUID: uuid.NewString(), AccountID: "acct"}},
		{ObjectID: b.obj, Init: b.init()},
	}})
	hdr := func() http.Header { return http.Header{"Content-Type": {"application/json"}} }
	fc.request(1, "/v1/batch/init", nil, hdr(), inits)
	fs, fh, fb := fc.answer(1)
	require.Equal(t, http.StatusOK, fs, "%s", fb)
	var ans envelope
	require.NoError(t, json.Unmarshal(fb, &ans))
	items := batchItems(t, ans)
	require.Len(t, items, 4)
	assert.Nil(t, items[0].Error)
	require.NotNil(t, items[1].Error)
	assert.Equal(t, http.StatusBadRequest, items[1].Error.Status)
	require.NotNil(t, items[2].Error)
	assert.Equal(t, http.StatusConflict, items[2].Error.Status)
	assert.Nil(t, items[3].Error)
	for _, d := range []db{a, b} {
		info, err := th.Info(context.Background(), d.obj)
		require.NoError(t, err, "the init over frames ran")
		assert.Equal(t, d.uuid, info.DatabaseUUID)
	}
	// The same batch over HTTP (init is idempotent): the same answer.
	hs, hh, hb := httpAnswer(t, srv, "/v1/batch/init", nil, hdr(), inits)
	assert.Equal(t, hs, fs)
	assert.Equal(t, hh.Get("Content-Type"), fh.Get("Content-Type"))
	assert.JSONEq(t, string(hb), string(fb))

	confirms := mustJSON(t, event.ConfirmBatchRequest{Confirms: []event.ConfirmBatchItem{
		{ObjectID: a.obj, DatabaseUUID: a.uuid, AccountID: a.account, RoutingGeneration: 1},
		{ObjectID: b.obj, DatabaseUUID: a.uuid, AccountID: b.account, RoutingGeneration: 1}, // wrong database
		{ObjectID: newObjectID(), DatabaseUUID: b.uuid, AccountID: b.account, RoutingGeneration: 1},
	}})
	fc.request(3, "/v1/batch/confirm", nil, hdr(), confirms)
	fs, _, fb = fc.answer(3)
	require.Equal(t, http.StatusOK, fs, "%s", fb)
	require.NoError(t, json.Unmarshal(fb, &ans))
	items = batchItems(t, ans)
	require.Len(t, items, 3)
	assert.Nil(t, items[0].Error)
	require.NotNil(t, items[1].Error)
	assert.Equal(t, v4.CodeWrongHost, items[1].Error.Code)
	require.NotNil(t, items[2].Error)
	assert.Equal(t, http.StatusNotFound, items[2].Error.Status)
	info, err := th.Info(context.Background(), a.obj)
	require.NoError(t, err)
	assert.True(t, info.Confirmed, "the confirm over frames took")
	info, err = th.Info(context.Background(), b.obj)
	require.NoError(t, err)
	assert.False(t, info.Confirmed)
	hs, _, hb = httpAnswer(t, srv, "/v1/batch/confirm", nil, hdr(), confirms)
	assert.Equal(t, hs, fs)
	assert.JSONEq(t, string(hb), string(fb))

	// A refused request: the same refusal both ways.
	fc.request(5, "/v1/batch/init", nil, hdr(), `{"inits":[]}`)
	fs, _, fb = fc.answer(5)
	hs, _, hb = httpAnswer(t, srv, "/v1/batch/init", nil, hdr(), `{"inits":[]}`)
	assert.Equal(t, http.StatusBadRequest, fs)
	assert.Equal(t, hs, fs)
	assert.JSONEq(t, string(hb), string(fb))

	// An earlier version: no lifecycle in the 101 answer, refused on a
	// stream, nothing run.
	old := newTestHost(t, nil)
	old.frames.lifecycle = false
	oldSrv := serve(t, old)
	oc := dialFrames(t, oldSrv)
	assert.Empty(t, oc.hdr.Get(frame.HeaderRoutes))
	c := newDB("acct")
	oc.request(1, "/v1/batch/init", nil, hdr(), mustJSON(t, event.InitBatchRequest{Inits: []event.InitBatchItem{{ObjectID: c.obj, Init: c.init()}}}))
	status, _, body := oc.answer(1)
	assert.Equal(t, http.StatusBadRequest, status, "%s", body)
	_, err = old.Info(context.Background(), c.obj)
	assert.ErrorIs(t, err, ErrNotFound, "the init did not run")
}
