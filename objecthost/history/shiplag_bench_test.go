package history

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/objecthost/sqlexec"
)

// lagStore wraps a Store and, for every segment whose Put returned, notes
// for each record in it how old its commit was at that moment: the age of
// a commit when it lands in the store.
type lagStore struct {
	Store
	mu   sync.Mutex
	lags []time.Duration
}

func (s *lagStore) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	b, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	if err := s.Store.Put(ctx, key, bytes.NewReader(b), size); err != nil {
		return err
	}
	if !strings.Contains(key, "/seg/") {
		return nil
	}
	landed := time.Now()
	var lags []time.Duration
	if _, err := readRecords(bytes.NewReader(b), false, func(h recordHeader, _ []page) error {
		lags = append(lags, landed.Sub(time.UnixMicro(h.TimeUs)))
		return nil
	}); err != nil {
		return err
	}
	s.mu.Lock()
	s.lags = append(s.lags, lags...)
	s.mu.Unlock()
	return nil
}

// BenchmarkShippingLag: the age of a commit when it lands in the store,
// under a sustained write load on many databases: 100 databases on one
// host (one shipper, default options: MaxLag 1 s, 4 shipments in
// parallel), 8 writers inserting one-row commits into random databases
// as fast as they are acknowledged, for HISTORY_BENCH_SECONDS (default
// 10) seconds; then the writers stop and the shipper runs on until every
// commit landed. Reports the p50, p99 and maximum age over every commit,
// with the directory store (on the same disk) and with the S3 store
// (gofakes3 over HTTP on loopback). HISTORY_BENCH_CONC overrides
// ShipperOptions.Concurrency; the Put duration and per-shipment lag
// histograms are logged.
//
//	go test -run '^$' -bench BenchmarkShippingLag -benchtime 1x ./objecthost/history/
func BenchmarkShippingLag(b *testing.B) {
	secs := 10
	if s := os.Getenv("HISTORY_BENCH_SECONDS"); s != "" {
		fmt.Sscan(s, &secs)
	}
	for _, kind := range []string{"dir", "s3"} {
		b.Run("store="+kind, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				var inner Store
				if kind == "dir" {
					ds, err := NewDirStore(b.TempDir())
					require.NoError(b, err)
					inner = ds
				} else {
					_, inner = newS3(b)
				}
				shippingLag(b, &lagStore{Store: inner}, 100, 8, time.Duration(secs)*time.Second)
			}
		})
	}
}

func shippingLag(b *testing.B, store *lagStore, dbs, writers int, d time.Duration) {
	dir := b.TempDir()
	conc := 0 // the default
	fmt.Sscan(os.Getenv("HISTORY_BENCH_CONC"), &conc)
	reg := prometheus.NewRegistry()
	ship := NewShipper(store, ShipperOptions{Logger: slog.New(slog.DiscardHandler), Concurrency: conc, Registerer: reg})
	defer func() {
		mfs, _ := reg.Gather()
		for _, mf := range mfs {
			for _, m := range mf.Metric {
				if h := m.GetHistogram(); h != nil {
					b.Logf("%s count %d avg %.1fms", mf.GetName(), h.GetSampleCount(), 1000*h.GetSampleSum()/float64(max(1, h.GetSampleCount())))
				}
			}
		}
	}()
	ctx, cancel := context.WithCancel(context.Background())
	shipDone := make(chan struct{})
	go func() { defer close(shipDone); ship.Run(ctx) }()
	type live struct {
		db *sqlexec.DB
		c  *Capturer
	}
	all := make([]live, dbs)
	for i := range all {
		path := filepath.Join(dir, "data", fmt.Sprintf("db%03d.db", i))
		require.NoError(b, os.MkdirAll(filepath.Dir(path), 0o755))
		c, err := NewCapturer(fmt.Sprintf("db%03d", i), path, CaptureOptions{StagingDir: filepath.Join(dir, "staging"), OnAppend: ship.Notify})
		require.NoError(b, err)
		db, err := sqlexec.Open(path, sqlexec.Options{ReadConns: 1})
		require.NoError(b, err)
		require.NoError(b, c.Attach(context.Background(), db))
		ship.Add(c)
		_, err = execOn(db, "CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT, n INTEGER)")
		require.NoError(b, err)
		all[i] = live{db, c}
	}
	// Everything so far (creation) ships first; only the load is measured.
	for _, l := range all {
		require.NoError(b, ship.Sync(context.Background(), l.c))
	}
	store.mu.Lock()
	store.lags = store.lags[:0]
	store.mu.Unlock()

	b.ResetTimer()
	var commits atomic.Int64
	stop := time.Now().Add(d)
	var wg sync.WaitGroup
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for i := 0; time.Now().Before(stop); i++ {
				l := all[rng.IntN(len(all))]
				if _, err := execOn(l.db, "INSERT INTO t(v, n) VALUES (?, ?)", "some text of a row", i); err != nil {
					b.Error(err)
					return
				}
				commits.Add(1)
			}
		}(w)
	}
	wg.Wait()
	// Let the shipper ship the rest at its own pace.
	want := int64(0)
	for _, l := range all {
		_ = l.c.Current()               // every acknowledged commit captured
		want += l.c.Stats().Records - 1 // minus the CREATE TABLE's
	}
	deadline := time.Now().Add(time.Minute)
	for {
		store.mu.Lock()
		n := int64(len(store.lags))
		store.mu.Unlock()
		if n >= want {
			break
		}
		require.True(b, time.Now().Before(deadline), "everything shipped: %d of %d", n, want)
		time.Sleep(20 * time.Millisecond) // poll interval: until everything shipped
	}
	b.StopTimer()
	cancel()
	<-shipDone
	for _, l := range all {
		require.NoError(b, l.db.Close())
		require.NoError(b, l.c.Close())
	}
	store.mu.Lock()
	lags := append([]time.Duration(nil), store.lags...)
	store.mu.Unlock()
	sort.Slice(lags, func(i, j int) bool { return lags[i] < lags[j] })
	require.NotEmpty(b, lags)
	q := func(p float64) float64 { return float64(lags[int(float64(len(lags)-1)*p)].Microseconds()) / 1000 }
	b.ReportMetric(float64(commits.Load())/d.Seconds(), "inserts/s")
	b.ReportMetric(q(0.50), "p50-ms")
	b.ReportMetric(q(0.99), "p99-ms")
	b.ReportMetric(q(1), "max-ms")
	b.ReportMetric(float64(len(lags)), "records")
}
