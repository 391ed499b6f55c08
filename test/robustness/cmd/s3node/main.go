// Command s3node is the robustness suite's object store: an S3-protocol
// server over plain HTTP (gofakes3, path-style buckets) whose objects live
// in a bbolt file (gofakes3's s3bolt backend). bbolt fsyncs every commit
// before the PUT is answered, so a kill -9 keeps every object the store
// acknowledged — the durability point objecthost/history relies on ("S3's
// 200 is the durability point").
//
// It is test-only: the topology builds it (topology.Binary) and runs it in
// its own network namespace as node "s3"; production points cluster.hcl's
// archive block at a real S3-compatible store. There is no S3 server in
// Debian, hence this.
//
//	s3node --addr 10.213.7.4:4006 --db DIR/s3.bolt --bucket archive
//
// GET /healthz answers 200 once the bucket exists (the topology's health
// check); every other request is S3.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3bolt"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:4006", "listen address (host:port)")
	dbPath := flag.String("db", "s3.bolt", "bbolt file holding the objects (kept across restarts)")
	bucket := flag.String("bucket", "archive", "bucket created at start if missing")
	flag.Parse()
	if err := run(*addr, *dbPath, *bucket); err != nil {
		log.Fatal(err)
	}
}

func run(addr, dbPath, bucket string) error {
	backend, err := s3bolt.NewFile(dbPath)
	if err != nil {
		return fmt.Errorf("open %s: %w", dbPath, err)
	}
	exists, err := backend.BucketExists(bucket)
	if err != nil {
		return err
	}
	if !exists {
		if err := backend.CreateBucket(bucket); err != nil {
			return fmt.Errorf("create bucket %s: %w", bucket, err)
		}
	}
	// Quiet: gofakes3 logs every request otherwise, and the suite keeps
	// only the tail of each process's output.
	faker := gofakes3.New(backend, gofakes3.WithLogger(gofakes3.DiscardLog()))
	s3 := faker.Server()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.Handle("/", s3)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second,
		// gofakes3 writes some error headers twice; net/http logs each one.
		ErrorLog: log.New(discard{}, "", 0)}
	fmt.Printf("s3node: http %s, bucket %s, objects in %s\n", ln.Addr(), bucket, dbPath)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

type discard struct{}

func (discard) Write(b []byte) (int, error) { return len(b), nil }
