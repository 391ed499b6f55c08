package objecthost

import (
	"context"
	"net"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	v4 "github.com/shoaldb/shoal/internal/v4"
)

// BenchmarkSerialRPCCPU sends point SELECTs one at a time over loopback
// HTTP to a host served the way `shoal objecthost serve` serves it
// (serveForBench) and reports the process's CPU time per request
// (cpu-ns/op: client and host together, both in this process). It is the
// A/B figure for changes on the host's query path:
//
//	go test -run '^$' -bench SerialRPCCPU -benchtime 20000x ./objecthost/
func BenchmarkSerialRPCCPU(b *testing.B) {
	h, err := Open(Config{ID: "bench", Dir: b.TempDir(), Manual: true})
	require.NoError(b, err)
	defer h.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(b, err)
	srv := serveForBench(h)
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	r := rpc{c: keepAliveClient(), base: "http://" + ln.Addr().String()}
	d := newDB("bench")
	_, err = h.Init(context.Background(), d.obj, d.init())
	require.NoError(b, err)
	_, err = h.Query(context.Background(), d.obj, d.id(), q("CREATE TABLE kv (id INTEGER PRIMARY KEY, v TEXT); INSERT INTO kv SELECT value, 'value-' || value FROM json_each('[1,2,3,4,5,6,7,8,9,10]')"))
	require.NoError(b, err)
	bodies := make([][]byte, 10)
	for i := range bodies {
		bodies[i] = []byte(`{"sql":"SELECT id, v FROM kv WHERE id = ?","params":[` + strconv.Itoa(i+1) + `]}`)
	}
	path := "/v1/objects/" + d.obj + "/query"
	for i := 0; i < 100; i++ { // warm the connection and the statement cache
		require.NoError(b, r.do(path, d, bodies[i%10]))
	}
	b.ResetTimer()
	c0 := cpuTime()
	for i := 0; i < b.N; i++ {
		if err := r.do(path, d, bodies[i%10]); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(cpuTime()-c0)/float64(b.N), "cpu-ns/op")
}

// serveForBench is the host's HTTP server as the serve command builds it.
func serveForBench(h *Host) *v4.Server { return v4.NewServer(h.Handler(), v4.ServerOptions{}) }
