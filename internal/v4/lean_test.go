package v4

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// leanTestHandler answers like the edge's handlers do, in every shape a
// response can take on the lean path.
func leanTestHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header()["X-Request-Id"] = []string{r.Header.Get("X-Request-Id")}
		var body []byte
		var rerr error
		if !strings.HasSuffix(r.URL.Path, "/noread") {
			body, rerr = io.ReadAll(r.Body)
		}
		if errors.Is(rerr, ErrSlowBody) {
			WriteError(w, SlowBodyStatus, CodeInvalidRequest, "slow body")
			return
		}
		switch strings.TrimPrefix(r.URL.Path, "/q") {
		case "/small", "/noread":
			WriteResult(w, map[string]any{"len": len(body), "host": r.Host, "ct": r.Header.Get("Content-Type"),
				"cl": r.ContentLength, "method": r.Method, "uri": r.RequestURI, "pragma": r.Header.Get("Cache-Control"),
				"url": r.URL.String(), "raw_query": r.URL.RawQuery, "query": r.URL.Query()})
		case "/big":
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(strings.Repeat("x", 5000)))
		case "/pieces":
			w.Header().Set("Content-Type", "application/json")
			for range 3 {
				_, _ = w.Write([]byte(strings.Repeat("y", 1500)))
			}
		case "/error":
			WriteRetryAfter(w, http.StatusServiceUnavailable, CodeUnavailable, "try again", time.Second)
		case "/sniff":
			_, _ = w.Write([]byte("<html><body>hi</body></html>"))
		case "/cl":
			w.Header().Set("Content-Length", "5")
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte("hello"))
		case "/short":
			w.Header().Set("Content-Length", "10")
			_, _ = w.Write([]byte("hello"))
		case "/nocontent":
			w.WriteHeader(http.StatusNoContent)
		case "/close":
			w.Header().Set("Connection", "close")
			WriteResult(w, "bye")
		case "/panic":
			panic("boom")
		default:
			WriteResult(w, "other "+r.Method+" "+r.URL.String())
		}
	})
}

func hotQ(method, path string) bool {
	return method == http.MethodPost && strings.HasPrefix(path, "/q/")
}

// startPair serves h on a lean server and on a plain one (net/http only),
// with the same options.
func startPair(t *testing.T, h http.Handler, o ServerOptions) (lean *Server, leanAddr, plainAddr string) {
	t.Helper()
	plainAddr = startServer(t, h, o)
	o.Lean = hotQ
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	lean = NewServer(h, o)
	go func() { _ = lean.Serve(ln) }()
	t.Cleanup(func() { _ = lean.Close() })
	return lean, ln.Addr().String(), plainAddr
}

var dateRE = regexp.MustCompile(`\r\nDate: [^\r]*\r\n`)

// converse sends each part and waits for the answers to the requests it
// starts (a part marked by partial starts none), then half-closes and
// returns everything the server sent until it closed, with Date values
// blanked.
func converse(t *testing.T, addr string, parts ...string) string {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.SetDeadline(time.Now().Add(20*time.Second)))
	var got strings.Builder
	br := bufio.NewReader(io.TeeReader(c, &got))
	for _, p := range parts {
		wait := !strings.HasPrefix(p, partialMark)
		p = strings.TrimPrefix(p, partialMark)
		_, err := io.WriteString(c, p)
		require.NoError(t, err)
		if !wait {
			time.Sleep(50 * time.Millisecond) // let the server read it alone (not a timing assertion)
			continue
		}
		// One answer per request line in the part (pipelined parts
		// hold several).
		n := strings.Count(p, " HTTP/1.")
		for range n {
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				break
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusContinue {
				n++
			}
		}
	}
	_ = c.(*net.TCPConn).CloseWrite()
	_, _ = io.Copy(io.Discard, br)
	return dateRE.ReplaceAllString(got.String(), "\r\nDate: X\r\n")
}

const partialMark = "\x00partial:"

// partial marks a part that starts no request of its own.
func partial(p string) string { return partialMark + p }

func post(path, body string, headers ...string) string {
	h := "Host: example.com\r\nContent-Type: application/json\r\nX-Request-Id: r1\r\n"
	for _, x := range headers {
		h += x + "\r\n"
	}
	return "POST " + path + " HTTP/1.1\r\n" + h + fmt.Sprintf("Content-Length: %d\r\n\r\n", len(body)) + body
}

// The lean path writes the bytes net/http writes (Date aside), for every
// shape of answer, and serves those requests itself.
func TestLeanAnswersMatchNetHTTP(t *testing.T) {
	lean, la, pa := startPair(t, leanTestHandler(), ServerOptions{})
	body := `{"sql":"SELECT 1"}`
	for _, tc := range []struct {
		name  string
		parts []string
	}{
		{"small", []string{post("/q/small", body)}},
		{"no body", []string{"POST /q/small HTTP/1.1\r\nHost: h\r\n\r\n"}},
		{"zero body", []string{post("/q/small", "")}},
		{"keep-alive header, pragma", []string{post("/q/small", body, "Connection: Keep-Alive", "Pragma: no-cache")}},
		{"big, chunked", []string{post("/q/big", body)}},
		{"pieces, chunked", []string{post("/q/pieces", body)}},
		{"error with Retry-After", []string{post("/q/error", body)}},
		{"body not read", []string{post("/q/noread", body)}},
		{"sniffed type", []string{post("/q/sniff", body)}},
		{"explicit length", []string{post("/q/cl", body)}},
		{"short of its length", []string{post("/q/short", body), post("/q/small", body)}},
		{"no content", []string{post("/q/nocontent", body)}},
		{"handler closes", []string{post("/q/close", body), post("/q/small", body)}},
		{"panic", []string{post("/q/panic", body)}},
		{"keep-alive sequence", []string{post("/q/small", body), post("/q/big", body), post("/q/small", "{}")}},
		{"pipelined", []string{post("/q/small", body) + post("/q/big", body) + post("/q/noread", body)}},
		{"header in two segments", []string{partial(post("/q/small", body)[:60]), post("/q/small", body)[60:]}},
		{"body in a later segment", []string{partial(strings.TrimSuffix(post("/q/small", body), body)), body}},
		{"body split", []string{partial(strings.TrimSuffix(post("/q/small", body), body) + body[:5]), body[5:]}},
		{"CRLF after a POST", []string{post("/q/small", body), "\r\n" + post("/q/small", body)}},
		{"query string", []string{post("/q/small?x=1", body)}},
		{"query string, escapes and sub-delims", []string{post("/q/small?a=%20b+c&d=e;f&g=/h?i:j@k,(l)*m!n$o'p&x=%zz", body)}},
		{"query then none", []string{post("/q/small?page=2&per_page=10", body), post("/q/small", body)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			served, _ := lean.LeanStats()
			want := converse(t, pa, tc.parts...)
			got := converse(t, la, tc.parts...)
			assert.Equal(t, want, got)
			after, _ := lean.LeanStats()
			assert.Greater(t, after, served, "not served on the lean path")
			if tc.name == "small" {
				t.Logf("%q", got)
			}
		})
	}
}

// Whatever is not plainly simple goes to net/http with the connection,
// and gets exactly its answer.
func TestLeanHandsOver(t *testing.T) {
	lean, la, pa := startPair(t, leanTestHandler(), ServerOptions{MaxHeaderBytes: 8192, LeanMaxBody: 1024})
	body := `{"sql":"SELECT 1"}`
	for _, tc := range []struct {
		name  string
		parts []string
	}{
		{"chunked", []string{"POST /q/small HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"}},
		{"expect 100-continue", []string{post("/q/small", body, "Expect: 100-continue")}},
		{"HTTP/1.0", []string{"POST /q/small HTTP/1.0\r\nHost: h\r\nContent-Length: 2\r\n\r\n{}"}},
		{"HTTP/1.0 keep-alive", []string{"POST /q/small HTTP/1.0\r\nHost: h\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\n{}"}},
		{"duplicate Content-Length", []string{post("/q/small", body, "Content-Length: 18")}},
		{"conflicting Content-Length", []string{post("/q/small", body, "Content-Length: 3")}},
		{"Content-Length and Transfer-Encoding", []string{partial(post("/q/small", body, "Transfer-Encoding: chunked"))}},
		{"non-hot after hot", []string{post("/q/small", body), "GET /other HTTP/1.1\r\nHost: h\r\n\r\n", post("/q/small", body)}},
		{"pipelined then non-hot", []string{post("/q/small", body) + post("/q/small", body) + "GET /other HTTP/1.1\r\nHost: h\r\n\r\n" + post("/q/small", body)}},
		{"Connection: close", []string{post("/q/small", body, "Connection: close")}},
		{"Upgrade", []string{post("/q/small", body, "Upgrade: websocket", "Connection: Upgrade")}},
		{"bare LF", []string{"POST /q/small HTTP/1.1\nHost: h\nContent-Length: 2\n\n{}"}},
		{"obs-fold", []string{post("/q/small", body, "X-A: a", " folded")}},
		{"space before colon", []string{post("/q/small", body, "X-A : a")}},
		{"control character", []string{post("/q/small", body, "X-A: a\x01b")}},
		{"no Host", []string{"POST /q/small HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}"}},
		{"two Hosts", []string{post("/q/small", body, "Host: other")}},
		{"bad Host", []string{post("/q/small", body, "X: y")[:0] + "POST /q/small HTTP/1.1\r\nHost: a b\r\nContent-Length: 2\r\n\r\n{}"}},
		{"bare '?'", []string{post("/q/small?", body)}},
		{"fragment", []string{post("/q/small?x=1#f", body)}},
		{"quote in the query", []string{post("/q/small?x=\"1\"", body)}},
		{"escaped path", []string{post("/q/sm%61ll", body)}},
		{"body over the lean limit", []string{post("/q/small", strings.Repeat("a", 2000))}},
		{"bad Content-Length", []string{"POST /q/small HTTP/1.1\r\nHost: h\r\nContent-Length: +2\r\n\r\n{}"}},
		{"header block over the buffer", []string{post("/q/small", body, "X-Big: "+strings.Repeat("b", 5000))}},
		{"header block over MaxHeaderBytes", []string{post("/q/small", body, "X-Big: "+strings.Repeat("b", 20000))}},
		{"malformed second request", []string{post("/q/small", body), "NOT A REQUEST\r\n\r\n"}},
		{"HEAD", []string{partial("HEAD /q/small HTTP/1.1\r\nHost: h\r\n\r\n")}},
		{"unknown method", []string{"BREW /q/small HTTP/1.1\r\nHost: h\r\n\r\n"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, handed := lean.LeanStats()
			want := converse(t, pa, tc.parts...)
			got := converse(t, la, tc.parts...)
			assert.Equal(t, want, got)
			_, after := lean.LeanStats()
			assert.Greater(t, after, handed, "not handed to net/http")
		})
	}
}

// A header that does not arrive within ReadHeaderTimeout is cut off,
// on the first request of a connection and on a later one.
func TestLeanSlowHeaderCutOff(t *testing.T) {
	_, la, _ := startPair(t, leanTestHandler(), ServerOptions{ReadHeaderTimeout: 200 * time.Millisecond})
	for _, first := range []bool{true, false} {
		c, err := net.Dial("tcp", la)
		require.NoError(t, err)
		require.NoError(t, c.SetDeadline(time.Now().Add(20*time.Second)))
		br := bufio.NewReader(c)
		if !first {
			_, err = io.WriteString(c, post("/q/small", "{}"))
			require.NoError(t, err)
			resp, err := http.ReadResponse(br, nil)
			require.NoError(t, err)
			_, _ = io.Copy(io.Discard, resp.Body)
		}
		_, err = io.WriteString(c, "POST /q/small HTTP/1.1\r\nHost: h\r\n")
		require.NoError(t, err)
		// Never finished: the server closes the connection, no answer.
		rest, err := io.ReadAll(br)
		require.NoError(t, err, "the connection was not closed")
		assert.Empty(t, rest)
		c.Close()
	}
}

// A body that stops arriving fails the handler's read with ErrSlowBody.
func TestLeanSlowBody(t *testing.T) {
	lean, la, _ := startPair(t, leanTestHandler(), ServerOptions{BodyTimeout: 200 * time.Millisecond, ReadHeaderTimeout: time.Minute})
	c, err := net.Dial("tcp", la)
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.SetDeadline(time.Now().Add(20*time.Second)))
	req := post("/q/small", `{"sql":"SELECT 1"}`)
	_, err = io.WriteString(c, req[:len(req)-5])
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err)
	assert.Equal(t, SlowBodyStatus, resp.StatusCode)
	assert.True(t, resp.Close, "Connection: close")
	served, _ := lean.LeanStats()
	assert.EqualValues(t, 1, served)
}

// Shutdown lets a lean request in flight finish (its answer says
// Connection: close), closes idle lean connections (and those that have
// not sent a request yet) and returns.
func TestLeanShutdown(t *testing.T) {
	release := make(chan struct{})
	started := make(chan struct{}, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		if r.URL.Path == "/q/wait" {
			started <- struct{}{}
			<-release
		}
		WriteResult(w, "done")
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := NewServer(h, ServerOptions{Lean: hotQ, ReadHeaderTimeout: time.Minute})
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	addr := ln.Addr().String()

	// A connection that has sent nothing yet.
	fresh, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer fresh.Close()
	require.NoError(t, fresh.SetDeadline(time.Now().Add(20*time.Second)))

	idle, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer idle.Close()
	require.NoError(t, idle.SetDeadline(time.Now().Add(20*time.Second)))
	_, err = io.WriteString(idle, post("/q/now", "{}"))
	require.NoError(t, err)
	ibr := bufio.NewReader(idle)
	resp, err := http.ReadResponse(ibr, nil)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)

	busy, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer busy.Close()
	require.NoError(t, busy.SetDeadline(time.Now().Add(20*time.Second)))
	_, err = io.WriteString(busy, post("/q/wait", "{}"))
	require.NoError(t, err)
	<-started

	shut := make(chan error, 1)
	go func() { shut <- srv.Shutdown(context.Background()) }()
	// The idle connection is closed.
	rest, err := io.ReadAll(ibr)
	require.NoError(t, err)
	assert.Empty(t, rest)
	rest, err = io.ReadAll(fresh)
	require.NoError(t, err, "a connection without a request is closed too")
	assert.Empty(t, rest)
	close(release)
	resp, err = http.ReadResponse(bufio.NewReader(busy), nil)
	require.NoError(t, err)
	assert.Equal(t, 200, resp.StatusCode)
	assert.True(t, resp.Close, "Connection: close")
	require.NoError(t, <-shut)
	require.ErrorIs(t, <-served, http.ErrServerClosed)
	_, err = net.DialTimeout("tcp", addr, time.Second)
	assert.Error(t, err, "still accepting after Shutdown")
}

// Everything parseLeanHead accepts, net/http's parser reads the same way.
func FuzzParseLeanHead(f *testing.F) {
	for _, s := range []string{
		post("/q/small", ""),
		"POST /q/x HTTP/1.1\r\nHost: h\r\n\r\n",
		"POST /q/x HTTP/1.1\r\nhost: h:80\r\ncontent-length: 007\r\nx-a:  v \t\r\n\r\n",
		"POST /q/x HTTP/1.1\r\nHost: h\r\nPragma: no-cache\r\nConnection: keep-alive\r\n\r\n",
		"POST /q/x HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n",
		"POST /q/x HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n",
		"POST /q/x HTTP/1.1\r\nHost: h\r\nX: a\r\n b\r\n\r\n",
		"POST /q/x HTTP/1.1\r\nHost: h\r\nX-A: 1\r\nx-a: 2\r\n\r\n",
		"POST /q/x HTTP/1.1\r\nHost: h\r\nX-A: a\x01b\r\nHost: g\r\n\r\n",
		"POST /q/x?y HTTP/1.1\r\nHost: h\r\n\r\n",
		"GET /q/x?y=1&z=%20a+b HTTP/1.1\r\nHost: h\r\n\r\n",
		"GET /q/x?a=1?b=2;c=(3)&d=/e:f@g,h*i!j$k'l HTTP/1.1\r\nHost: h\r\n\r\n",
		"GET /q/x? HTTP/1.1\r\nHost: h\r\n\r\n",
		"GET /q/x?a#frag HTTP/1.1\r\nHost: h\r\n\r\n",
		"GET /q/x?%zz HTTP/1.1\r\nHost: h\r\n\r\n",
		"DELETE /q/x?? HTTP/1.1\r\nHost: h\r\n\r\n",
		"GET /q/x HTTP/1.0\r\nHost: h\r\n\r\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		i := strings.Index(string(b), "\r\n\r\n")
		if i < 0 {
			return
		}
		b = b[:i+4]
		h, ok := parseLeanHead(b, 1<<20, func(string, string) bool { return true })
		if !ok {
			return
		}
		r, err := http.ReadRequest(bufio.NewReader(strings.NewReader(string(b) + strings.Repeat("x", int(h.contentLength)))))
		if err != nil {
			t.Fatalf("lean accepted what net/http refuses (%v): %q", err, b)
		}
		if r.Method != h.method || r.URL.Path != h.path || r.URL.RawPath != "" || r.URL.RawQuery != h.rawQuery ||
			r.URL.ForceQuery || r.URL.Fragment != "" || r.URL.Opaque != "" ||
			r.RequestURI != h.uri || r.Host != h.host || r.ContentLength != h.contentLength || r.Close ||
			r.ProtoMajor != 1 || r.ProtoMinor != 1 || len(r.TransferEncoding) != 0 {
			t.Fatalf("differs from net/http: %+v vs %+v for %q", h, r, b)
		}
		if fmt.Sprint(r.Header) != fmt.Sprint(h.header) {
			t.Fatalf("headers differ: %v vs %v for %q", r.Header, h.header, b)
		}
		if h.n != len(b) {
			t.Fatalf("length %d of %d", h.n, len(b))
		}
	})
}

type tempErr struct{}

func (tempErr) Error() string   { return "accept: too many open files" }
func (tempErr) Timeout() bool   { return false }
func (tempErr) Temporary() bool { return true }

// flakyListener fails its first Accept with a temporary error.
type flakyListener struct {
	net.Listener
	failed bool
}

func (l *flakyListener) Accept() (net.Conn, error) {
	if !l.failed {
		l.failed = true
		return nil, tempErr{}
	}
	return l.Listener.Accept()
}

// A temporary accept error (out of file descriptors) does not stop the
// server, as with net/http.
func TestLeanAcceptRetries(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := NewServer(leanTestHandler(), ServerOptions{Lean: hotQ})
	go func() { _ = srv.Serve(&flakyListener{Listener: ln}) }()
	t.Cleanup(func() { _ = srv.Close() })
	got := converse(t, ln.Addr().String(), post("/q/small", "{}"))
	assert.True(t, strings.HasPrefix(got, "HTTP/1.1 200 OK\r\n"), "%q", got)
}

// The limits edge/DESIGN.md states for the lean path are the code's.
func TestLeanDocumentedLimits(t *testing.T) {
	doc, err := os.ReadFile("../../edge/DESIGN.md")
	require.NoError(t, err)
	text := strings.Join(strings.Fields(string(doc)), " ")
	s := NewServer(http.NotFoundHandler(), ServerOptions{Lean: hotQ})
	for _, want := range []string{
		fmt.Sprintf("a %d KiB `bufio.Reader`", leanReadBuffer>>10),
		fmt.Sprintf("`LeanMaxBody` (%d KiB;", s.lean.maxBody>>10),
		fmt.Sprintf("at most %d headers", leanMaxHeaders),
		fmt.Sprintf("fit in %d KiB", bufferBeforeChunking>>10),
		fmt.Sprintf("up to 1/%d earlier", leanIdleSlack),
	} {
		assert.Contains(t, text, want)
	}
}

// A keep-alive connection idle for IdleTimeout after a lean request is
// closed.
func TestLeanIdleTimeout(t *testing.T) {
	lean, la, _ := startPair(t, leanTestHandler(), ServerOptions{IdleTimeout: 300 * time.Millisecond, ReadHeaderTimeout: time.Minute})
	c, err := net.Dial("tcp", la)
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.SetDeadline(time.Now().Add(20*time.Second)))
	_, err = io.WriteString(c, post("/q/small", "{}"))
	require.NoError(t, err)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	rest, err := io.ReadAll(br)
	require.NoError(t, err, "the idle connection was not closed")
	assert.Empty(t, rest)
	served, _ := lean.LeanStats()
	assert.EqualValues(t, 1, served)
}
