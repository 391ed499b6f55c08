package v4

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// BenchmarkKeepAliveRequestCPU sends small POSTs one at a time on one
// keep-alive connection through a Server (the listener wrapping every
// Shoal role uses) and reports the process's CPU time per request
// (cpu-ns/op: the server's and a minimal client's, which writes prepared
// bytes and reads the answer by its length). It is the A/B figure for the
// per-request cost of the wrapped connection (deadline moves):
//
//	go test -run '^$' -bench KeepAliveRequestCPU -benchtime 20000x ./internal/v4/
func BenchmarkKeepAliveRequestCPU(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	answer := []byte(`{"result":[],"success":true,"errors":[],"messages":[]}`)
	srv := NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header()["Content-Type"] = []string{"application/json"}
		_, _ = w.Write(answer)
	}), ServerOptions{})
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
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
