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
// check); POST /admin/fault sets how the store misbehaves (the suite's
// object-store failpoints that need it up): ?mode=503 answers every S3
// request 503 SlowDown (a throttling or overloaded store, which S3 clients
// retry), ?mode=slow&delay=2s answers each one after the delay, ?mode=none
// restores normal service. ?mode=lose&n=N&how=delete|corrupt|mixed&seed=S
// is not a lasting mode but an act: the store loses N objects it
// acknowledged (the object-store-loses failpoint), chosen at random among
// the archive's segments and snapshots, deleting them or overwriting each
// with one byte changed, and answers the keys it hit as JSON. The newest
// segment of each generation is never chosen: nothing in the archive says
// it existed (its host's record of what it shipped is the only witness,
// and a restore ends that generation — objecthost/history/DESIGN.md,
// "scrub"). Every other request is S3.
//
// One change to s3bolt: a listing with a prefix and no delimiter (what
// objecthost/history sends: one database's keys) seeks to the prefix
// instead of scanning, and decoding, the whole bucket from its first key.
// The bucket holds every host's history (tens of thousands of objects by
// the end of a scenario), and that scan made each listing cost a read of
// the whole store.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3bolt"
	bolt "go.etcd.io/bbolt"
	"gopkg.in/mgo.v2/bson"
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
	db, err := bolt.Open(dbPath, 0o600, nil)
	if err != nil {
		return fmt.Errorf("open %s: %w", dbPath, err)
	}
	defer db.Close()
	mux, err := handler(db, bucket)
	if err != nil {
		return err
	}
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

// handler serves S3 from db (bucket created if missing) and /healthz.
func handler(db *bolt.DB, bucket string) (http.Handler, error) {
	backend := &seekingBackend{Backend: s3bolt.New(db), db: db}
	exists, err := backend.BucketExists(bucket)
	if err != nil {
		return nil, err
	}
	if !exists {
		if err := backend.CreateBucket(bucket); err != nil {
			return nil, fmt.Errorf("create bucket %s: %w", bucket, err)
		}
	}
	// Quiet: gofakes3 logs every request otherwise, and the suite keeps
	// only the tail of each process's output.
	faker := gofakes3.New(backend, gofakes3.WithLogger(gofakes3.DiscardLog()))
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	f := faults{lose: func(w http.ResponseWriter, r *http.Request) { lose(w, r, backend, bucket) }}
	mux.HandleFunc("POST /admin/fault", f.set)
	mux.Handle("/", f.wrap(faker.Server()))
	return mux, nil
}

// faults is the store's injected misbehaviour (POST /admin/fault).
type faults struct {
	mode  atomic.Value // string: "", "503" or "slow"
	delay atomic.Int64 // nanoseconds, mode slow
	lose  http.HandlerFunc
}

func (f *faults) set(w http.ResponseWriter, r *http.Request) {
	mode := r.URL.Query().Get("mode")
	switch mode {
	case "lose":
		f.lose(w, r)
		return
	case "none", "":
		f.mode.Store("")
	case "503":
		f.mode.Store(mode)
	case "slow":
		d, err := time.ParseDuration(r.URL.Query().Get("delay"))
		if err != nil || d <= 0 {
			http.Error(w, "slow needs delay=DURATION", http.StatusBadRequest)
			return
		}
		f.delay.Store(int64(d))
		f.mode.Store(mode)
	default:
		http.Error(w, "mode is none, 503, slow or lose", http.StatusBadRequest)
		return
	}
	fmt.Fprintln(w, "ok")
}

func (f *faults) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch mode, _ := f.mode.Load().(string); mode {
		case "503":
			w.Header().Set("Content-Type", "application/xml")
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprint(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>`)
			return
		case "slow":
			select {
			case <-time.After(time.Duration(f.delay.Load())):
			case <-r.Context().Done():
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// seekingBackend is s3bolt with prefix listings that seek (see the package
// comment). Every other call, and listings with a delimiter, are s3bolt's.
type seekingBackend struct {
	*s3bolt.Backend
	db *bolt.DB
}

// objectInfo is the part of s3bolt's stored object (bson, its schema.go
// boltObject) a listing returns; the contents are skipped, not copied.
type objectInfo struct {
	LastModified time.Time
	Size         int64
	Hash         []byte
}

func (b *seekingBackend) ListBucket(name string, prefix *gofakes3.Prefix, page gofakes3.ListBucketPage) (*gofakes3.ObjectList, error) {
	if prefix == nil || !prefix.HasPrefix || prefix.HasDelimiter {
		return b.Backend.ListBucket(name, prefix, page)
	}
	objects := gofakes3.NewObjectList()
	pfx := []byte(prefix.Prefix)
	err := b.db.View(func(tx *bolt.Tx) error {
		bk := tx.Bucket([]byte(name))
		if bk == nil {
			return gofakes3.BucketNotFound(name)
		}
		c := bk.Cursor()
		k, v := c.Seek(pfx)
		if page.HasMarker && page.Marker >= prefix.Prefix {
			if k, v = c.Seek([]byte(page.Marker)); string(k) == page.Marker {
				k, v = c.Next()
			}
		}
		var n int64
		for ; k != nil && bytes.HasPrefix(k, pfx); k, v = c.Next() {
			if page.MaxKeys > 0 && n == page.MaxKeys {
				objects.IsTruncated, objects.NextMarker = true, objects.Contents[len(objects.Contents)-1].Key
				break
			}
			var o objectInfo
			if err := bson.Unmarshal(v, &o); err != nil {
				return fmt.Errorf("object %q: %w", k, err)
			}
			objects.Add(&gofakes3.Content{Key: string(k), ETag: gofakes3.FormatETag(o.Hash), Size: o.Size,
				LastModified: gofakes3.NewContentTime(o.LastModified.UTC())})
			n++
		}
		return nil
	})
	return objects, err
}

// storedObject is s3bolt's stored object (bson, its schema.go boltObject).
type storedObject struct {
	Name         string
	Metadata     map[string]string
	LastModified time.Time
	Size         int64
	Contents     []byte
	Hash         []byte
}

// GetObject is s3bolt's, but copies the object's bytes inside the read
// transaction. bson (mgo) decodes a []byte field as a slice of the buffer
// it reads, here bbolt's memory map, which is valid only during the
// transaction; s3bolt's own GetObject hands those slices out after it. A
// read racing a write that grew the file (bbolt then maps it anew) read
// unmapped memory and the store died with a fault (4 of the 200 random
// schedules of 2026-12-03), or could read a page a later write had reused.
func (b *seekingBackend) GetObject(bucket, key string, rr *gofakes3.ObjectRangeRequest) (*gofakes3.Object, error) {
	var o storedObject
	err := b.db.View(func(tx *bolt.Tx) error {
		bk := tx.Bucket([]byte(bucket))
		if bk == nil {
			return gofakes3.BucketNotFound(bucket)
		}
		v := bk.Get([]byte(key))
		if v == nil {
			return gofakes3.KeyNotFound(key)
		}
		if err := bson.Unmarshal(v, &o); err != nil {
			return fmt.Errorf("object %q: %w", key, err)
		}
		o.Contents, o.Hash = bytes.Clone(o.Contents), bytes.Clone(o.Hash)
		return nil
	})
	if err != nil {
		return nil, err
	}
	rnge, err := rr.Range(o.Size)
	if err != nil {
		return nil, err
	}
	data := o.Contents
	if rnge != nil {
		data = data[rnge.Start : rnge.Start+rnge.Length]
	}
	return &gofakes3.Object{Name: key, Metadata: o.Metadata, Size: o.Size, Range: rnge, Hash: o.Hash,
		Contents: io.NopCloser(bytes.NewReader(data))}, nil
}

// HeadObject is GetObject without the body (s3bolt's calls its own).
func (b *seekingBackend) HeadObject(bucket, key string) (*gofakes3.Object, error) {
	o, err := b.GetObject(bucket, key, nil)
	if err != nil {
		return nil, err
	}
	o.Contents = io.NopCloser(bytes.NewReader(nil))
	return o, nil
}

type discard struct{}

func (discard) Write(b []byte) (int, error) { return len(b), nil }

// Lost is one object the lose act hit.
type Lost struct {
	Key string `json:"key"`
	How string `json:"how"` // "delete" or "corrupt"
}

// lose deletes or corrupts n of the bucket's archive objects (see the
// package comment), chosen with the seed.
func lose(w http.ResponseWriter, r *http.Request, b *seekingBackend, bucket string) {
	q := r.URL.Query()
	n, err := strconv.Atoi(q.Get("n"))
	how := q.Get("how")
	seed, serr := strconv.ParseUint(q.Get("seed"), 10, 64)
	if err != nil || n <= 0 || serr != nil || how != "delete" && how != "corrupt" && how != "mixed" {
		http.Error(w, "lose needs n>0, how=delete|corrupt|mixed and seed", http.StatusBadRequest)
		return
	}
	keys, err := archiveKeys(b, bucket)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	rnd := rand.New(rand.NewPCG(seed, 0x1057))
	rnd.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
	out := []Lost{}
	for _, k := range keys[:min(n, len(keys))] {
		h := how
		if h == "mixed" {
			h = []string{"delete", "corrupt"}[rnd.IntN(2)]
		}
		if h == "delete" {
			_, err = b.DeleteObject(bucket, k)
		} else {
			err = corrupt(b, bucket, k, rnd)
		}
		if err != nil {
			http.Error(w, fmt.Sprintf("%s %s: %v", h, k, err), http.StatusInternalServerError)
			return
		}
		out = append(out, Lost{Key: k, How: h})
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}

// archiveKeys lists the bucket's segments and snapshots, less the newest
// segment of each generation (<db>/<gen>/seg/<first>-<last>-<t>.seg: the
// names sort in log order).
func archiveKeys(b *seekingBackend, bucket string) ([]string, error) {
	var all []string
	err := b.db.View(func(tx *bolt.Tx) error {
		bk := tx.Bucket([]byte(bucket))
		if bk == nil {
			return gofakes3.BucketNotFound(bucket)
		}
		return bk.ForEach(func(k, _ []byte) error {
			all = append(all, string(k))
			return nil
		})
	})
	if err != nil {
		return nil, err
	}
	sort.Strings(all)
	newestSeg := map[string]string{} // <...>/<gen>/seg/ → its newest key
	for _, k := range all {
		if i := strings.LastIndex(k, "/seg/"); i >= 0 && strings.HasSuffix(k, ".seg") {
			newestSeg[k[:i]] = k
		}
	}
	var out []string
	for _, k := range all {
		switch {
		case strings.HasSuffix(k, ".snap"):
			out = append(out, k)
		case strings.HasSuffix(k, ".seg"):
			if i := strings.LastIndex(k, "/seg/"); i >= 0 && newestSeg[k[:i]] != k {
				out = append(out, k)
			}
		}
	}
	return out, nil
}

// corrupt overwrites the object with one byte changed (a new ETag, as a
// PUT behind the host's back would give it).
func corrupt(b *seekingBackend, bucket, key string, rnd *rand.Rand) error {
	o, err := b.GetObject(bucket, key, nil)
	if err != nil {
		return err
	}
	body, err := io.ReadAll(o.Contents)
	o.Contents.Close()
	if err != nil {
		return err
	}
	if len(body) == 0 {
		return fmt.Errorf("empty object")
	}
	body[rnd.IntN(len(body))] ^= byte(1 + rnd.IntN(255))
	_, err = b.PutObject(bucket, key, o.Metadata, bytes.NewReader(body), int64(len(body)), nil)
	return err
}
