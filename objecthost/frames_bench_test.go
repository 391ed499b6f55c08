package objecthost

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/internal/frame"
)

// BenchmarkFramesPointSelect sends point SELECTs to a host over loopback
// frame connections (as an edge does, with the headers it sends) and
// reports the process's CPU time per query (client and host together,
// both in this process) and the allocations: the A/B figure for changes
// on the host's frame query path (issue 15). serial: one query at a time
// on one connection; parallel: 16 clients, each with its connection and
// one query at a time.
//
//	go test -run '^$' -bench FramesPointSelect -benchtime 20000x -benchmem ./objecthost/
func BenchmarkFramesPointSelect(b *testing.B) {
	h, err := Open(Config{ID: "bench", Dir: b.TempDir(), Manual: true})
	require.NoError(b, err)
	defer h.Close()
	srv := httptest.NewServer(h.Handler())
	defer srv.Close()
	d := newDB("bench")
	_, err = h.Init(context.Background(), d.obj, d.init())
	require.NoError(b, err)
	_, err = h.Query(context.Background(), d.obj, d.id(), q("CREATE TABLE kv (id INTEGER PRIMARY KEY, v TEXT); INSERT INTO kv SELECT value, 'value-' || value FROM json_each('[1,2,3,4,5,6,7,8,9,10]')"))
	require.NoError(b, err)
	addr := srv.Listener.Addr().String()
	b.Run("serial", func(b *testing.B) {
		one := frameQuerier(b, addr, d)
		for i := 0; i < 200; i++ { // warm the statement cache and the workers
			one(i)
		}
		b.ReportAllocs()
		b.ResetTimer()
		c0 := cpuTime()
		for i := 0; i < b.N; i++ {
			one(i)
		}
		b.ReportMetric(float64(cpuTime()-c0)/float64(b.N), "cpu-ns/op")
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.SetParallelism(8)
		c0 := cpuTime()
		b.RunParallel(func(pb *testing.PB) {
			one := frameQuerier(b, addr, d)
			for i := 0; pb.Next(); i++ {
				one(i)
			}
		})
		b.ReportMetric(float64(cpuTime()-c0)/float64(b.N), "cpu-ns/op")
	})
}

// frameQuerier dials addr, upgrades to frames and returns a function that
// sends one point SELECT (the i-th of ten) and waits for its answer.
func frameQuerier(b *testing.B, addr string, d db) func(i int) {
	nc, err := net.Dial("tcp", addr)
	require.NoError(b, err)
	b.Cleanup(func() { nc.Close() })
	_, err = io.WriteString(nc, "GET /v1/frames HTTP/1.1\r\nHost: h\r\nConnection: Upgrade\r\nUpgrade: "+frame.Protocol+"\r\n\r\n")
	require.NoError(b, err)
	br := bufio.NewReader(nc)
	resp, err := http.ReadResponse(br, nil)
	require.NoError(b, err)
	require.Equal(b, http.StatusSwitchingProtocols, resp.StatusCode)
	rd := frame.NewReader(br)

	hdr := http.Header{}
	hdr.Set("Content-Type", "application/json")
	hdr.Set(HeaderDatabase, d.uuid)
	hdr.Set(HeaderAccount, d.account)
	hdr.Set(HeaderGeneration, "1")
	bodies := make([][]byte, 10)
	for i := range bodies {
		bodies[i] = []byte(`{"sql":"SELECT id, v FROM kv WHERE id = ?","params":[` + strconv.Itoa(i+1) + `]}`)
	}
	path := "/v1/objects/" + d.obj + "/query"
	var id uint32
	var out []byte
	return func(i int) {
		id++
		out, err = frame.AppendRequest(out[:0], id, path, hdr, bodies[i%10])
		if err != nil {
			b.Error(err)
			return
		}
		if _, err := nc.Write(out); err != nil {
			b.Error(err)
			return
		}
		for {
			fh, p, err := rd.Next()
			if err != nil {
				b.Error(err)
				return
			}
			if fh.Type == frame.TypeResponse {
				r, err := frame.ParseResponse(p)
				if err != nil || r.Status != http.StatusOK {
					b.Errorf("answer %d: %v %s", r.Status, err, r.Chunk)
					return
				}
			}
			if fh.End() {
				return
			}
		}
	}
}
