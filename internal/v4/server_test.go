package v4

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func startServer(t *testing.T, h http.Handler, o ServerOptions) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := NewServer(h, o)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return ln.Addr().String()
}

// rawExchange writes req on a fresh connection and returns the answer (the
// server closes the connection after a protocol error).
func rawExchange(t *testing.T, addr, req string) (*http.Response, Envelope) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.SetDeadline(time.Now().Add(10*time.Second)))
	_, err = io.WriteString(c, req)
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var env Envelope
	require.NoError(t, json.Unmarshal(body, &env), "not an envelope: %q", body)
	return resp, env
}

func errCode(env Envelope) int {
	if len(env.Errors) == 0 {
		return 0
	}
	return env.Errors[0].Code
}

// net/http answers protocol errors itself, before any handler: they come
// back in the envelope with their status.
func TestProtocolErrorsInEnvelope(t *testing.T) {
	addr := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { WriteResult(w, "ok") }),
		ServerOptions{MaxHeaderBytes: 4096})
	for _, tc := range []struct {
		name, req string
		status    int
		code      int
	}{
		{"bad request line", "NOT A REQUEST\r\n\r\n", 400, CodeInvalidRequest},
		{"no host", "GET / HTTP/1.1\r\n\r\n", 400, CodeInvalidRequest},
		{"bad header", "GET / HTTP/1.1\r\nHost: x\r\nBad Header: v\r\n\r\n", 400, CodeInvalidRequest},
		{"headers too large", "GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("a", 8192) + "\r\n\r\n", 431, CodeTooLarge},
		{"unknown transfer encoding", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: bogus\r\n\r\n", 501, CodeInvalidRequest},
		{"http version", "GET / HTTP/2.7\r\nHost: x\r\n\r\n", 505, CodeInvalidRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, env := rawExchange(t, addr, tc.req)
			assert.Equal(t, tc.status, resp.StatusCode)
			assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
			assert.False(t, env.Success)
			assert.Equal(t, tc.code, errCode(env))
			assert.NotEmpty(t, env.Errors[0].Message)
			t.Logf("%d %s", resp.StatusCode, env.Errors[0].Message)
		})
	}
	// A handler's own answers are untouched.
	resp, env := rawExchange(t, addr, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	assert.Equal(t, 200, resp.StatusCode)
	assert.True(t, env.Success)
}

// A body trickling in is cut off: the handler's read fails with
// ErrSlowBody; a body that keeps coming, and a handler that works long
// after reading its body, are not affected.
func TestBodyProgressDeadline(t *testing.T) {
	type outcome struct {
		n   int
		err error
		ctx error
	}
	got := make(chan outcome, 4)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if errors.Is(err, ErrSlowBody) {
			got <- outcome{n: len(b), err: err}
			WriteError(w, SlowBodyStatus, CodeInvalidRequest, err.Error())
			return
		}
		if r.URL.Path == "/work" {
			time.Sleep(600 * time.Millisecond) // past BodyTimeout
		}
		got <- outcome{n: len(b), err: err, ctx: r.Context().Err()}
		WriteResult(w, len(b))
	})
	addr := startServer(t, h, ServerOptions{BodyTimeout: 300 * time.Millisecond, BodyProgress: 1024})

	// 1 byte every 100 ms of a 100-byte body: cut off.
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer c.Close()
	_, err = io.WriteString(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n")
	require.NoError(t, err)
	stop := make(chan struct{})
	go func() {
		for i := 0; i < 100; i++ {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			if _, err := c.Write([]byte{'x'}); err != nil {
				return
			}
		}
	}()
	o := <-got
	close(stop)
	assert.ErrorIs(t, o.err, ErrSlowBody)
	assert.Less(t, o.n, 100)
	require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err)
	assert.Equal(t, SlowBodyStatus, resp.StatusCode)

	// A large body sent at full speed, then a handler that outlives
	// BodyTimeout: its context is not canceled.
	resp, err = http.Post("http://"+addr+"/work", "application/json", strings.NewReader(strings.Repeat("y", 1<<20)))
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, 200, resp.StatusCode)
	o = <-got
	assert.NoError(t, o.err)
	assert.Equal(t, 1<<20, o.n)
	assert.NoError(t, o.ctx, "the request's context outlives the body deadline")
}

// A client that sends part of its headers and stops is disconnected after
// ReadHeaderTimeout; one that stops reading an answer is disconnected after
// WriteTimeout, and the handler's write fails.
func TestSlowHeadersAndSlowReaders(t *testing.T) {
	wrote := make(chan error, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		chunk := []byte(strings.Repeat("z", 1<<20))
		var err error
		for i := 0; i < 256 && err == nil; i++ { // 256 MB: far more than socket buffers
			_, err = w.Write(chunk)
		}
		wrote <- err
	})
	addr := startServer(t, h, ServerOptions{ReadHeaderTimeout: 200 * time.Millisecond, WriteTimeout: 300 * time.Millisecond})

	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer c.Close()
	_, err = io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\nX-Slow: ")
	require.NoError(t, err)
	require.NoError(t, c.SetReadDeadline(time.Now().Add(20*time.Second)))
	_, err = io.ReadAll(c)
	var ne net.Error
	assert.False(t, errors.As(err, &ne) && ne.Timeout(), "the server closed the connection (not our 20 s deadline): %v", err)

	r, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer r.Close()
	_, err = io.WriteString(r, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	require.NoError(t, err)
	select {
	case err := <-wrote:
		assert.Error(t, err, "the write to a client that does not read failed")
	case <-time.After(60 * time.Second):
		t.Fatal("the handler is still writing to a client that does not read")
	}
}

// docs/security.md states the listeners' defaults.
func TestSecurityDocsStateServerDefaults(t *testing.T) {
	b, err := os.ReadFile("../../docs/security.md")
	require.NoError(t, err)
	doc := strings.Join(strings.Fields(string(b)), " ")
	var o ServerOptions
	o.defaults()
	for _, want := range []string{
		fmt.Sprintf("| header read time / size | %d s / %d KiB |", int(o.ReadHeaderTimeout/time.Second), o.MaxHeaderBytes>>10),
		fmt.Sprintf("| body progress | %d KiB per %d s |", o.BodyProgress>>10, int(o.BodyTimeout/time.Second)),
		fmt.Sprintf("| answer progress | %d KiB per %d s |", o.WriteChunk>>10, int(o.WriteTimeout/time.Second)),
		fmt.Sprintf("idle keep-alive connections close after %d s", int(o.IdleTimeout/time.Second)),
	} {
		assert.Contains(t, doc, want)
	}
}
