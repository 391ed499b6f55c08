package test

import (
	"bufio"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/internal/pki"
	v4 "github.com/shoaldb/shoal/internal/v4"
	"github.com/shoaldb/shoal/test/harness"
)

// TestListenersRefuseSlowAndMalformedClients runs the shoal binary (`shoal
// dev`: the edge, an object host and a catalog node, each on the listener
// the binary sets up) and attacks each listener as a hostile client would:
// a malformed request line and oversized headers are answered in the v4
// envelope; a client that sends half its headers, or its body at 1 byte/s,
// is disconnected by the server (ReadHeaderTimeout 10 s; a body must
// deliver 64 KiB or its end every 30 s). Every serve command of the binary
// (pipeline and limiter status included) goes through the same
// constructor (cmd/shoal serveRole takes a *v4.Server), whose timeouts
// internal/v4's tests check in detail.
func TestListenersRefuseSlowAndMalformedClients(t *testing.T) {
	bin := shoalBin.Path(t)
	dir := filepath.Join(t.TempDir(), "dev")
	addr := harness.FreeAddr(t)
	base := harness.DevBasePort(t)
	cmd, _ := runDevUntilReady(t, bin, "http://"+addr, "--dir", dir, "--addr", addr, "--base-port", fmt.Sprint(base))
	defer stopDev(t, cmd)
	var st struct {
		AccountID string `json:"account_id"`
		Token     string `json:"token"`
	}
	raw, err := os.ReadFile(filepath.Join(dir, "dev.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(raw, &st))

	// The internal listeners run mutual TLS (dev's CA): this test talks to
	// them with dev's operator certificate. Inside TLS, net/http's own
	// answers to protocol errors stay its plain text (the TLS listener must
	// wrap the envelope rewriter so net/http sees the peer's certificate);
	// only cluster components can reach that far.
	ops, err := pki.NewLoader(pki.Files{CA: filepath.Join(dir, "pki", "ca.crt"),
		Cert: filepath.Join(dir, "pki", "operator.crt"), Key: filepath.Join(dir, "pki", "operator.key")})
	require.NoError(t, err)
	opsTLS := ops.ClientFor()
	listeners := []listenerUnderTest{
		{"edge", addr, "/client/v4/accounts/" + st.AccountID + "/d1/database/01900000-0000-7000-8000-000000000000/query", "Bearer " + st.Token, nil},
		{"object host", fmt.Sprintf("127.0.0.1:%d", base+200), "/v1/objects/" + strings.Repeat("0", 32) + "/query", "", opsTLS},
		{"catalog", fmt.Sprintf("127.0.0.1:%d", base+100), "/v1/apply", "", opsTLS},
	}
	for _, l := range listeners {
		for _, tc := range []struct {
			name, req string
			status    int
		}{
			{"bad request line", "NOT HTTP AT ALL\r\n\r\n", 400},
			{"headers over 64 KiB", "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("a", 100<<10) + "\r\n\r\n", 431},
		} {
			resp, env := exchange(t, l, tc.req)
			assert.Equal(t, tc.status, resp.StatusCode, "%s %s", l.name, tc.name)
			if l.tls != nil {
				continue
			}
			assert.Equal(t, "application/json", resp.Header.Get("Content-Type"), "%s %s", l.name, tc.name)
			if assert.NotEmpty(t, env.Errors, "%s %s", l.name, tc.name) {
				assert.False(t, env.Success)
				t.Logf("%s, %s: %d %d %q", l.name, tc.name, resp.StatusCode, env.Errors[0].Code, env.Errors[0].Message)
			}
		}
		if l.tls != nil {
			// Plain HTTP gets Go's TLS server's canned 400 ("Client sent
			// an HTTP request to an HTTPS server") and nothing else.
			c, err := net.Dial("tcp", l.addr)
			require.NoError(t, err)
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			_, _ = io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			c.Close()
			if err == nil {
				assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "%s answers plain HTTP", l.name)
			}
		}
	}

	// Slow clients, every listener at once (each takes up to the timeout).
	var wg sync.WaitGroup
	for _, l := range listeners {
		wg.Add(2)
		go func() {
			defer wg.Done()
			c, err := l.dial()
			if !assert.NoError(t, err) {
				return
			}
			defer c.Close()
			start := time.Now()
			_, err = io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
			assert.NoError(t, err)
			closed := closedByServer(c, 40*time.Second)
			assert.True(t, closed, "%s: a client stuck in its headers is disconnected", l.name)
			t.Logf("%s: slow headers disconnected after %s", l.name, time.Since(start).Round(time.Second))
		}()
		go func() {
			defer wg.Done()
			c, err := l.dial()
			if !assert.NoError(t, err) {
				return
			}
			defer c.Close()
			start := time.Now()
			head := "POST " + l.bodyPath + " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n"
			if l.auth != "" {
				head += "Authorization: " + l.auth + "\r\n"
			}
			_, err = io.WriteString(c, head+"\r\n")
			assert.NoError(t, err)
			sent := 0
			answered := make(chan *http.Response, 1)
			go func() {
				_ = c.SetReadDeadline(time.Now().Add(70 * time.Second))
				resp, err := http.ReadResponse(bufio.NewReader(c), nil)
				if err == nil {
					resp.Body.Close()
				}
				answered <- resp
			}()
			var resp *http.Response
		trickle:
			for sent < 1000 {
				select {
				case resp = <-answered:
					break trickle
				case <-time.After(time.Second):
				}
				if _, err := c.Write([]byte{' '}); err != nil {
					resp = <-answered
					break
				}
				sent++
			}
			assert.Less(t, sent, 1000, "%s: a body trickling at 1 byte/s is cut off", l.name)
			status := 0
			if resp != nil {
				status = resp.StatusCode
			}
			t.Logf("%s: 1 byte/s body cut off after %s, %d bytes (answer %d)", l.name, time.Since(start).Round(time.Second), sent, status)
			if l.name == "edge" {
				assert.Equal(t, v4.SlowBodyStatus, status, "the edge says why")
			}
		}()
	}
	wg.Wait()
	// The server is fine afterwards.
	a := harness.Call(t, "GET", "http://"+addr+"/client/v4/accounts/"+st.AccountID+"/d1/database", "Bearer "+st.Token, nil)
	assert.Equal(t, 200, a.Status, "%s", a.Raw)
}

// listenerUnderTest is one listener of the shoal binary; tls, when set, is
// the client configuration of an internal (mutual TLS) listener.
type listenerUnderTest struct {
	name, addr, bodyPath, auth string
	tls                        *tls.Config
}

func (l listenerUnderTest) dial() (net.Conn, error) {
	if l.tls == nil {
		return net.Dial("tcp", l.addr)
	}
	return tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", l.addr, l.tls)
}

func exchange(t *testing.T, l listenerUnderTest, req string) (*http.Response, v4.Envelope) {
	t.Helper()
	c, err := l.dial()
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.SetDeadline(time.Now().Add(10*time.Second)))
	_, _ = io.WriteString(c, req) // the server may answer and close before reading it all
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var env v4.Envelope
	if l.tls == nil {
		require.NoError(t, json.Unmarshal(body, &env), "not an envelope: %q", body)
	}
	return resp, env
}

// closedByServer reads until the server closes the connection (true) or
// within passes (false).
func closedByServer(c net.Conn, within time.Duration) bool {
	_ = c.SetReadDeadline(time.Now().Add(within))
	_, err := io.Copy(io.Discard, c)
	var ne net.Error
	return !(errors.As(err, &ne) && ne.Timeout())
}
