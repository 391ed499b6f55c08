package edge_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/edge"
	"github.com/shoaldb/shoal/internal/binding"
	"github.com/shoaldb/shoal/internal/pki"
	v4 "github.com/shoaldb/shoal/internal/v4"
	"github.com/shoaldb/shoal/objecthost"
	"github.com/shoaldb/shoal/raftmeta"
)

// BenchmarkSerialEdgeCPU sends point SELECTs one at a time through a real
// edge to a real object host (one catalog node in the process; routes and
// tokens cached after the first request), with a bearer token and with a
// binding token, and reports the process's CPU time per request
// (cpu-ns/op: client, edge and host together). It is the A/B figure for
// changes on the edge's query path:
//
//	go test -run '^$' -bench SerialEdgeCPU -benchtime 10000x ./edge/
//
// "plain" runs the internal hops (edge → host, everything → catalog) over
// plain HTTP (an insecure cluster), "mtls" over mutual TLS with role
// checks, as clusters and shoal dev run them: the cost of the
// authenticated hop.
//
// "mtls+accesslog" is "mtls" with the edge logging at info, the default
// level of `shoal edge serve`: one access-log line per request, text
// format, written to a file (stderr in production is a pipe or the
// journal; a file keeps the write(2) in the figure). The other variants
// run the edge with logging discarded, like the deploy benchmark's
// --log-level warn.
//
// "mtls+lean" is "mtls" with the public listener's lean HTTP/1.1 path for
// the query routes (internal/v4 lean.go), as `shoal edge serve` runs it.
//
// "…-http" forwards over one HTTP/1.1 exchange per query
// (--host-transport http) instead of the multiplexed frame connection:
// the A/B of the edge→host transport when nothing runs concurrently (no
// batching to gain, one goroutine hand-over more per answer).
func BenchmarkSerialEdgeCPU(b *testing.B) {
	b.Run("plain", func(b *testing.B) { serialEdgeCPU(b, false, false, false, edge.TransportFrames) })
	b.Run("mtls", func(b *testing.B) { serialEdgeCPU(b, true, false, false, edge.TransportFrames) })
	b.Run("mtls+lean", func(b *testing.B) { serialEdgeCPU(b, true, false, true, edge.TransportFrames) })
	b.Run("mtls+accesslog", func(b *testing.B) { serialEdgeCPU(b, true, true, false, edge.TransportFrames) })
	b.Run("plain-http", func(b *testing.B) { serialEdgeCPU(b, false, false, false, edge.TransportHTTP) })
	b.Run("mtls-http", func(b *testing.B) { serialEdgeCPU(b, true, false, false, edge.TransportHTTP) })
}

func serialEdgeCPU(b *testing.B, mtls, accessLog, lean bool, transport string) {
	quiet := slog.New(slog.DiscardHandler)
	edgeLog := quiet
	if accessLog {
		f, err := os.Create(filepath.Join(b.TempDir(), "edge.log"))
		require.NoError(b, err)
		defer f.Close()
		edgeLog = slog.New(slog.NewTextHandler(f, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	var catTLS, hostTLS, edgeTLS *pki.Loader
	if mtls {
		dir := b.TempDir()
		_, err := pki.InitCA(filepath.Join(dir, "ca"), "bench", time.Hour)
		require.NoError(b, err)
		issue := func(node string, roles ...string) *pki.Loader {
			f, err := pki.Issue(filepath.Join(dir, "ca"), dir, pki.IssueRequest{Node: node, Roles: roles, Validity: time.Hour}, false)
			require.NoError(b, err)
			l, err := pki.NewLoader(f)
			require.NoError(b, err)
			return l
		}
		catTLS, hostTLS, edgeTLS = issue("c0", pki.RoleCatalog), issue("h0", pki.RoleHost), issue("e0", pki.RoleEdge, pki.RoleOperator)
	}
	node, err := raftmeta.NewNode(raftmeta.Config{ID: "c0", Dir: b.TempDir(), RaftAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
		Bootstrap: true, Logger: quiet, RaftLogOutput: io.Discard, TLS: catTLS})
	require.NoError(b, err)
	defer node.Close()
	require.Eventually(b, node.IsLeader, 20*time.Second, 20*time.Millisecond)
	keys, err := binding.KeyringFromSecrets("bench-binding-secret-0123456789")
	require.NoError(b, err)
	hcl, err := raftmeta.NewClient([]string{node.HTTPAddr()}, raftmeta.WithTLS(hostTLS))
	require.NoError(b, err)
	cl, err := raftmeta.NewClient([]string{node.HTTPAddr()}, raftmeta.WithTLS(edgeTLS))
	require.NoError(b, err)
	hln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(b, err)
	h, err := objecthost.Open(objecthost.Config{ID: "h0", Dir: b.TempDir(), Address: hln.Addr().String(), Region: "weur",
		Capacity: 100, Catalog: objecthost.RaftmetaCatalog{C: hcl}, Bindings: keys, Logger: quiet, TLS: hostTLS})
	require.NoError(b, err)
	defer h.Close()
	hs := serveEdgeBench(h.Handler())
	if hostTLS != nil {
		go func() { _ = hs.ServeWrapped(hln, hostTLS.Listen) }()
	} else {
		go func() { _ = hs.Serve(hln) }()
	}
	defer hs.Close()
	srv, err := edge.New(edge.Options{Catalog: edge.RaftmetaCatalog{C: cl}, Dir: b.TempDir(), Region: "weur",
		AdminToken: "bench-admin", BindingKeys: keys, Logger: edgeLog, HostTLS: edgeTLS, HostTransport: transport,
		AccountRate: edge.RateLimit{Rate: 1e6, Burst: 1e6}, DatabaseRate: edge.RateLimit{Rate: 1e6, Burst: 1e6}})
	require.NoError(b, err)
	defer srv.Close()
	eln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(b, err)
	es := serveEdgeBench(srv)
	if lean {
		// The public listener as `shoal edge serve` builds it: the
		// query routes on the lean HTTP/1.1 path.
		es = v4.NewServer(srv, v4.ServerOptions{Lean: srv.LeanRoute})
	}
	go func() { _ = es.Serve(eln) }()
	defer es.Close()
	base := "http://" + eln.Addr().String()
	c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4, DisableCompression: true}}
	call := func(method, url, auth string, body []byte) (json.RawMessage, error) {
		req, err := http.NewRequest(method, url, bytes.NewReader(body))
		if err != nil {
			return nil, err
		}
		req.Header.Set("Authorization", auth)
		resp, err := c.Do(req)
		if err != nil {
			return nil, err
		}
		raw, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return nil, err
		}
		if resp.StatusCode != 200 {
			return nil, fmt.Errorf("%s %s: %d %s", method, url, resp.StatusCode, raw)
		}
		var env struct{ Result json.RawMessage }
		return env.Result, json.Unmarshal(raw, &env)
	}
	var res json.RawMessage
	require.Eventually(b, func() bool {
		res, err = call("POST", base+"/admin/v1/accounts", "Bearer bench-admin", []byte(`{"name":"bench","tier":"paid"}`))
		return err == nil
	}, 20*time.Second, 50*time.Millisecond, "%v", err)
	var acct struct{ ID string }
	require.NoError(b, json.Unmarshal(res, &acct))
	res, err = call("POST", base+"/admin/v1/accounts/"+acct.ID+"/tokens", "Bearer bench-admin", []byte(`{"name":"bench"}`))
	require.NoError(b, err)
	var tok struct{ Token string }
	require.NoError(b, json.Unmarshal(res, &tok))
	bearer := "Bearer " + tok.Token
	dbs := base + "/client/v4/accounts/" + acct.ID + "/d1/database"
	require.Eventually(b, func() bool {
		res, err = call("POST", dbs, bearer, []byte(`{"name":"bench"}`))
		return err == nil
	}, 20*time.Second, 50*time.Millisecond, "%v", err)
	var db struct{ UUID string }
	require.NoError(b, json.Unmarshal(res, &db))
	_, err = call("POST", dbs+"/"+db.UUID+"/query", bearer, []byte(`{"sql":"CREATE TABLE kv (id INTEGER PRIMARY KEY, v TEXT); INSERT INTO kv SELECT value, 'value-' || value FROM json_each('[1,2,3,4,5,6,7,8,9,10]')"}`))
	require.NoError(b, err)
	res, err = call("POST", dbs+"/"+db.UUID+"/binding", bearer, nil)
	require.NoError(b, err)
	var mint struct{ Token string }
	require.NoError(b, json.Unmarshal(res, &mint))
	bodies := make([][]byte, 10)
	for i := range bodies {
		bodies[i] = []byte(`{"sql":"SELECT id, v FROM kv WHERE id = ?","params":[` + strconv.Itoa(i+1) + `]}`)
	}
	run := func(b *testing.B, url, auth string) {
		// The queries on a connection of their own: one that carried a
		// control-plane call (the set-up above) is net/http's for the
		// rest of its life on a lean listener.
		c.CloseIdleConnections()
		served0, _ := es.LeanStats()
		for i := 0; i < 100; i++ {
			_, err := call("POST", url, auth, bodies[i%10])
			require.NoError(b, err)
		}
		b.ResetTimer()
		c0 := benchCPU()
		for i := 0; i < b.N; i++ {
			if _, err := call("POST", url, auth, bodies[i%10]); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(benchCPU()-c0)/float64(b.N), "cpu-ns/op")
		if served, _ := es.LeanStats(); lean && served-served0 < int64(b.N) {
			b.Fatalf("only %d of %d queries on the lean path", served-served0, b.N)
		}
	}
	b.Run("Bearer", func(b *testing.B) { run(b, dbs+"/"+db.UUID+"/query", bearer) })
	b.Run("Binding", func(b *testing.B) { run(b, base+"/client/v4/bound/query", "Binding "+mint.Token) })
}

func benchCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// serveEdgeBench is an HTTP server as the serve commands build it.
func serveEdgeBench(h http.Handler) *v4.Server { return v4.NewServer(h, v4.ServerOptions{}) }
