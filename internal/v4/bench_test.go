package v4

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// BenchmarkKeepAliveRequestCPU sends small POSTs one at a time on one
// keep-alive connection and reports the process's CPU time per request
// (cpu-ns/op: the server's and a minimal client's, which writes prepared
// bytes and reads the answer by its length):
//
//	go test -run '^$' -bench KeepAliveRequestCPU -benchtime 20000x ./internal/v4/
//
// "server" is a Server (net/http behind the listener wrapping every Shoal
// role), "lean" the same Server with the route on its lean path (lean.go),
// "floor" a bare loop on the same connection — read the request
// line and headers, skip Content-Length bytes, write a prepared answer
// with its Date in one write(2) — that does none of what net/http and the
// wrapper do for robustness (no timeouts, limits, pipelining or chunked
// bodies): the lower bound of what a leaner public HTTP/1.1 server could
// cost per request, measured in the same run (docs/benchmarks.md,
// issue #15).
func BenchmarkKeepAliveRequestCPU(b *testing.B) {
	answer := []byte(`{"result":[],"success":true,"errors":[],"messages":[]}`)
	b.Run("server", func(b *testing.B) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		srv := NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header()["Content-Type"] = []string{"application/json"}
			_, _ = w.Write(answer)
		}), ServerOptions{})
		go func() { _ = srv.Serve(ln) }()
		defer srv.Close()
		keepAliveClient(b, ln.Addr().String())
	})
	b.Run("lean", func(b *testing.B) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		srv := NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header()["Content-Type"] = []string{"application/json"}
			_, _ = w.Write(answer)
		}), ServerOptions{Lean: func(method, path string) bool { return method == http.MethodPost && path == "/q" }})
		go func() { _ = srv.Serve(ln) }()
		defer srv.Close()
		keepAliveClient(b, ln.Addr().String())
		if served, _ := srv.LeanStats(); served < int64(b.N) {
			b.Fatalf("only %d of %d requests on the lean path", served, b.N)
		}
	})
	b.Run("floor", func(b *testing.B) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		defer ln.Close()
		go floorServe(ln, answer)
		keepAliveClient(b, ln.Addr().String())
	})
}

// floorServe answers every request on the first connection it accepts.
func floorServe(ln net.Listener, answer []byte) {
	c, err := ln.Accept()
	if err != nil {
		return
	}
	defer c.Close()
	br := bufio.NewReaderSize(c, 4096)
	out := make([]byte, 0, 512)
	for {
		n := 0
		for {
			line, err := br.ReadSlice('\n')
			if err != nil {
				return
			}
			if len(line) <= 2 {
				break
			}
			if v, ok := bytes.CutPrefix(line, []byte("Content-Length: ")); ok {
				n, _ = strconv.Atoi(string(bytes.TrimSpace(v)))
			}
		}
		if _, err := br.Discard(n); err != nil {
			return
		}
		out = append(out[:0], "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nDate: "...)
		out = time.Now().UTC().AppendFormat(out, http.TimeFormat)
		out = append(out, "\r\nContent-Length: "...)
		out = strconv.AppendInt(out, int64(len(answer)), 10)
		out = append(out, "\r\n\r\n"...)
		out = append(out, answer...)
		if _, err := c.Write(out); err != nil {
			return
		}
	}
}

func keepAliveClient(b *testing.B, addr string) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	body := `{"sql":"SELECT 1"}`
	req := []byte("POST /q HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body)
	br := bufio.NewReader(c)
	one := func() {
		if _, err := c.Write(req); err != nil {
			b.Fatal(err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	for range 100 {
		one()
	}
	b.ResetTimer()
	c0 := cpuTime()
	for range b.N {
		one()
	}
	b.ReportMetric(float64(cpuTime()-c0)/float64(b.N), "cpu-ns/op")
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
