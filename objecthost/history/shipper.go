package history

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// ShipperOptions tune a host's shipper.
type ShipperOptions struct {
	// MaxLag bounds how long a commit stays only on this host while the
	// store answers (default 1 s): open segments are sealed once their
	// first record is MaxLag/2 old and the loop ticks every MaxLag/4.
	MaxLag time.Duration
	// AlarmLag: the alarm is raised while the oldest unshipped commit is
	// older than this (default 10 s: the store is down or too slow).
	AlarmLag time.Duration
	// Concurrency is the number of databases shipped in parallel (default
	// 32). A shipment mostly waits for the store (an HTTP round trip, or
	// fsyncs), and every busy database seals a segment every MaxLag/2:
	// with 4, 100 busy databases on one host fell seconds behind
	// (BenchmarkShippingLag, docs/bench/history.md).
	Concurrency int
	// PutTimeout bounds one Put (default 30 s).
	PutTimeout time.Duration
	// SnapshotMinBytes and SnapshotInterval: a database gets a new snapshot
	// once the records since its last one exceed max(SnapshotMinBytes, its
	// size) (default 16 MiB), or SnapshotInterval (default 1 h) after the
	// last one if it changed since. Restores replay at most about that much;
	// the retention sweeper can only delete what a newer snapshot replaces.
	SnapshotMinBytes int64
	SnapshotInterval time.Duration
	Now              func() time.Time
	Registerer       prometheus.Registerer
	Logger           *slog.Logger

	// addListed, tests only: called by Add right after it listed the
	// capturer's pending files (where a shipment by Run could interleave).
	addListed func(s *Shipper, c *Capturer)
}

// Shipper moves every registered database's sealed segments and snapshots
// from local staging into the Store, asynchronously: the query path only
// appends to local files and never waits for it. A failing store leaves
// the files where they are (the backlog), retried with backoff, and raises
// the lag alarm; nothing is dropped.
//
// Run, Notify, Add, Remove, Sync and Status are safe for concurrent use.
// Per database, files are shipped one at a time in log order.
type Shipper struct {
	store Store
	opts  ShipperOptions
	m     *shipMetrics

	mu    sync.Mutex
	dbs   map[*Capturer]*shipState
	dirty map[*Capturer]struct{}
	kick  chan struct{}

	statusMu  sync.Mutex
	lastErr   error
	lastErrAt time.Time
	lagUs     int64
	alarm     bool
}

type shipState struct {
	mu       sync.Mutex // one shipment of this database at a time
	nextTry  time.Time
	backoff  time.Duration
	lastSnap time.Time
}

// NewShipper returns a shipper into store; Run drives it.
func NewShipper(store Store, opts ShipperOptions) *Shipper {
	if opts.MaxLag <= 0 {
		opts.MaxLag = time.Second
	}
	if opts.AlarmLag <= 0 {
		opts.AlarmLag = 10 * time.Second
	}
	if opts.Concurrency <= 0 {
		opts.Concurrency = 32
	}
	if opts.PutTimeout <= 0 {
		opts.PutTimeout = 30 * time.Second
	}
	if opts.SnapshotMinBytes <= 0 {
		opts.SnapshotMinBytes = 16 << 20
	}
	if opts.SnapshotInterval <= 0 {
		opts.SnapshotInterval = time.Hour
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return &Shipper{
		store: store, opts: opts, m: newShipMetrics(opts.Registerer),
		dbs: map[*Capturer]*shipState{}, dirty: map[*Capturer]struct{}{},
		kick: make(chan struct{}, 1),
	}
}

// Add registers a capturer; files an earlier run left unshipped are
// shipped at the next tick. Set its CaptureOptions.OnAppend to s.Notify.
//
// The pending listing and its unshipped mark come before c is registered:
// once c is dirty, Run may ship it at any moment, and a shipment that
// empties the area ends with idle() clearing the mark and dropping c from
// the dirty set. A mark set after that (the former order: register, list,
// mark) was never cleared again: every later append saw a log that already
// had something unshipped (appendBatch's "became" false), so OnAppend never
// made c dirty again, and c's records stayed in open.seg, unsealed and
// unshipped, while the lag and the backlog (dirty databases only) read 0
// (issue #13: a new database's base snapshot shipped in that window, its
// every commit after it never did; TestAddRacingShipmentKeepsShipping).
func (s *Shipper) Add(c *Capturer) {
	// Started from a clean close in this process (CaptureOptions.Reopen)
	// and wrote nothing at attach (no new generation, so no base snapshot;
	// no catch-up records, whose OnAppend came before c was known here):
	// whatever the area still holds belongs to the capturer that closed,
	// which the shipper keeps until it is shipped (Retire). Nothing to
	// list; c becomes dirty when it appends (OnAppend → Notify).
	quiet := c.reopened && c.generations.Load() == 0 && !c.log.everAppended()
	if !quiet {
		files, err := c.log.pending(c.key)
		if s.opts.addListed != nil {
			s.opts.addListed(s, c)
		}
		if err != nil || len(files) > 0 {
			c.hadPending.Store(true)
			if err == nil {
				c.log.markUnshipped(s.opts.Now().UnixMicro())
			}
		}
	}
	s.mu.Lock()
	s.dbs[c] = &shipState{lastSnap: s.opts.Now()}
	if !quiet {
		s.dirty[c] = struct{}{}
	}
	s.mu.Unlock()
}

// Retire hands a closed capturer (its database closed, Capturer.Close
// done) to the shipper: what it still has locally is shipped in the
// background, then it is dropped.
func (s *Shipper) Retire(c *Capturer) {
	c.retired.Store(true)
	s.mu.Lock()
	if c.attached.Load() && !c.hadPending.Load() && c.generations.Load() == 0 && !c.log.everAppended() {
		// A read-only session: the capturer never appended a record
		// (so its close sealed nothing), started no generation (no base
		// snapshot), and Add found nothing pending (or skipped the
		// listing because the area belongs to an earlier capturer still
		// in the shipper's hands). Nothing of its own to ship: dropped
		// without a listing of its area, so a cold open's close does not
		// cost the shipper a directory scan.
		delete(s.dbs, c)
		delete(s.dirty, c)
		s.mu.Unlock()
		return
	}
	if _, ok := s.dbs[c]; !ok {
		s.dbs[c] = &shipState{lastSnap: s.opts.Now()}
	}
	s.dirty[c] = struct{}{}
	s.mu.Unlock()
}

// Remove unregisters a capturer (after Sync, when its database closes).
func (s *Shipper) Remove(c *Capturer) {
	s.mu.Lock()
	delete(s.dbs, c)
	delete(s.dirty, c)
	s.mu.Unlock()
}

// Notify marks c as having unshipped records (CaptureOptions.OnAppend).
func (s *Shipper) Notify(c *Capturer) {
	s.mu.Lock()
	if _, ok := s.dbs[c]; ok {
		s.dirty[c] = struct{}{}
	}
	s.mu.Unlock()
}

// Run ships until ctx ends.
func (s *Shipper) Run(ctx context.Context) {
	tick := time.NewTicker(s.opts.MaxLag / 4)
	defer tick.Stop()
	sem := make(chan struct{}, s.opts.Concurrency)
	var wg sync.WaitGroup
	defer wg.Wait()
	// The lag is measured on its own ticker: the dispatch below waits for a
	// free slot, as long as a Put hangs (a store that is stopped or cut off
	// rather than refusing: up to PutTimeout), and the lag and its alarm
	// must keep moving meanwhile (TestStoreHangsLagAlarm).
	wg.Add(1)
	go func() { defer wg.Done(); s.measureLag(ctx) }()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-s.kick:
		}
		now := s.opts.Now()
		s.mu.Lock()
		work := make([]*Capturer, 0, len(s.dirty))
		states := make([]*shipState, 0, len(s.dirty))
		for c := range s.dirty {
			work = append(work, c)
			states = append(states, s.dbs[c])
		}
		s.mu.Unlock()
		for i, c := range work {
			st := states[i]
			if st == nil || !st.mu.TryLock() {
				continue // gone, or still shipping since the last tick
			}
			if now.Before(st.nextTry) {
				st.mu.Unlock()
				continue // backing off
			}
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				st.mu.Unlock()
				return
			}
			wg.Add(1)
			go func(c *Capturer, st *shipState) {
				defer wg.Done()
				defer func() { <-sem }()
				defer st.mu.Unlock()
				s.shipOne(ctx, c, st, false)
			}(c, st)
		}
	}
}

// measureLag updates the lag, its alarm and the backlog every MaxLag/4
// from the oldest unshipped commit of every registered database, until
// ctx ends.
//
// Every registered database, not only the dirty ones: a database with
// unshipped records that is not dirty would never be shipped and, measured
// over the dirty set only, would read as lag 0 and no backlog (issue #13
// was such a database). Such a database is made dirty again here, a
// backstop of OnAppend/Notify: at worst it is shipped one tick late. (An
// append that has set the log's mark but not yet called OnAppend is also
// seen here; making it dirty a moment early is harmless.) The cost is one
// mutex per registered capturer per tick, and registered capturers are the
// open handles plus the closed ones still shipping.
func (s *Shipper) measureLag(ctx context.Context) {
	tick := time.NewTicker(s.opts.MaxLag / 4)
	defer tick.Stop()
	var all, stray []*Capturer
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		all, stray = all[:0], stray[:0]
		s.mu.Lock()
		for c := range s.dbs {
			all = append(all, c)
		}
		s.mu.Unlock()
		var oldest int64
		for _, c := range all {
			u := c.log.oldestUnshipped()
			if u == 0 {
				continue
			}
			if oldest == 0 || u < oldest {
				oldest = u
			}
			stray = append(stray, c)
		}
		if len(stray) > 0 {
			s.mu.Lock()
			n := 0
			for _, c := range stray {
				if _, ok := s.dbs[c]; !ok {
					continue
				}
				if _, ok := s.dirty[c]; !ok {
					s.dirty[c] = struct{}{}
					n++
				}
			}
			s.mu.Unlock()
			if n > 0 {
				select {
				case s.kick <- struct{}{}:
				default:
				}
			}
		}
		s.setLag(s.opts.Now(), oldest)
	}
}

// Sync seals c's open segment and ships everything it has, now (restore
// and fork call it to make the latest commit archived; tests too).
func (s *Shipper) Sync(ctx context.Context, c *Capturer) error {
	s.mu.Lock()
	st := s.dbs[c]
	s.mu.Unlock()
	if st == nil {
		st = &shipState{}
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	return s.shipOne(ctx, c, st, true)
}

// WaitArchived seals c's open segment and ships it (and anything before
// it) now, bounded by PutTimeout: CaptureOptions.WaitArchived for
// `durability = "archived"`. It runs on the database's writer goroutine,
// so it never takes a snapshot.
func (s *Shipper) WaitArchived(c *Capturer) error {
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.PutTimeout)
	defer cancel()
	s.mu.Lock()
	st := s.dbs[c]
	s.mu.Unlock()
	if st == nil {
		return errors.New("history: database not registered with the shipper")
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	return s.ship(ctx, c, st, true, false)
}

// Drain ships everything every registered database has, once, bounded by
// ctx (a host closing: what is left stays local and ships after the next
// start). It returns the first error.
func (s *Shipper) Drain(ctx context.Context) error {
	s.mu.Lock()
	cs := make([]*Capturer, 0, len(s.dbs))
	for c := range s.dbs {
		cs = append(cs, c)
	}
	s.mu.Unlock()
	var first error
	for _, c := range cs {
		if err := s.Sync(ctx, c); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// shipOne seals (when due, or always with force), snapshots when due and
// ships c's pending files in order (st.mu held).
func (s *Shipper) shipOne(ctx context.Context, c *Capturer, st *shipState, force bool) error {
	return s.ship(ctx, c, st, force, true)
}

func (s *Shipper) ship(ctx context.Context, c *Capturer, st *shipState, force, snapshots bool) error {
	now := s.opts.Now()
	if first := c.log.openFirstUs(); first != 0 && (force || now.Sub(time.UnixMicro(first)) >= s.opts.MaxLag/2) {
		if _, err := c.log.seal(); err != nil {
			return s.failed(c, st, fmt.Errorf("history: seal: %w", err))
		}
	}
	if snapshots && s.snapshotDue(c, st, now) {
		if _, err := c.Snapshot(); err != nil {
			s.opts.Logger.Warn("history: snapshot failed", "db", c.key, "err", err)
		} else {
			st.lastSnap = now
		}
	}
	files, err := c.log.pending(c.key)
	if err != nil {
		return s.failed(c, st, err)
	}
	for _, pf := range files {
		if err := s.put(ctx, pf); err != nil {
			if errors.Is(err, errGone) {
				continue // shipped and removed by another capturer of this database
			}
			return s.failed(c, st, err)
		}
		// Checkpoint: the Put. Removing the local file is cleanup; a crash
		// before it ships the same bytes again under the same key.
		if err := c.log.shipped(pf); err != nil {
			return s.failed(c, st, err)
		}
	}
	st.backoff, st.nextTry = 0, time.Time{}
	if since := c.log.oldestUnshipped(); since != 0 && len(files) > 0 {
		s.m.shipLag.Observe(s.opts.Now().Sub(time.UnixMicro(since)).Seconds())
	}
	if c.log.idle() {
		s.mu.Lock()
		delete(s.dirty, c)
		if c.retired.Load() {
			delete(s.dbs, c)
		}
		s.mu.Unlock()
		// A record appended between idle and the delete re-marks the log
		// (became = true) and Notify adds it back: nothing is stranded.
		if c.log.oldestUnshipped() != 0 {
			s.Notify(c)
		}
	}
	return nil
}

func (s *Shipper) snapshotDue(c *Capturer, st *shipState, now time.Time) bool {
	since := c.bytesSince.Load()
	if since == 0 {
		return false
	}
	size := int64(0)
	if fi, err := os.Stat(c.dbPath); err == nil {
		size = fi.Size()
	}
	return since >= max(s.opts.SnapshotMinBytes, size) || now.Sub(st.lastSnap) >= s.opts.SnapshotInterval
}

// errGone: the local file was removed since it was listed.
var errGone = errors.New("history: local file already shipped")

func (s *Shipper) put(ctx context.Context, pf pendingFile) error {
	f, err := os.Open(pf.path)
	if errors.Is(err, os.ErrNotExist) {
		return errGone
	}
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	pctx, cancel := context.WithTimeout(ctx, s.opts.PutTimeout)
	defer cancel()
	start := time.Now()
	if err := s.store.Put(pctx, pf.key, f, fi.Size()); err != nil {
		return err
	}
	kind := "segment"
	switch {
	case pf.isSnap:
		kind = "snapshot"
	case pf.isPrev:
		kind = "marker"
	}
	s.m.putSeconds.Observe(time.Since(start).Seconds())
	s.m.bytes.WithLabelValues(kind).Add(float64(fi.Size()))
	s.m.objects.WithLabelValues(kind).Inc()
	return nil
}

func (s *Shipper) failed(c *Capturer, st *shipState, err error) error {
	if errors.Is(err, context.Canceled) {
		return err
	}
	s.m.errors.Inc()
	st.backoff = min(max(2*st.backoff, s.opts.MaxLag/4), 10*time.Second)
	st.nextTry = s.opts.Now().Add(st.backoff)
	s.statusMu.Lock()
	s.lastErr, s.lastErrAt = err, s.opts.Now()
	s.statusMu.Unlock()
	s.opts.Logger.Warn("history: ship failed, kept locally", "db", c.key, "err", err, "retry_in", st.backoff)
	return err
}

func (s *Shipper) setLag(now time.Time, oldestUs int64) {
	lag := time.Duration(0)
	if oldestUs != 0 {
		lag = now.Sub(time.UnixMicro(oldestUs))
	}
	s.m.lag.Set(lag.Seconds())
	s.statusMu.Lock()
	s.lagUs = lag.Microseconds()
	s.alarm = lag > s.opts.AlarmLag
	s.statusMu.Unlock()
	if lag > s.opts.AlarmLag {
		s.m.alarm.Set(1)
	} else {
		s.m.alarm.Set(0)
	}
	s.mu.Lock()
	s.m.backlog.Set(float64(len(s.dirty)))
	s.mu.Unlock()
}

// ShipperStatus is what `GET /v1/status` shows of the shipper.
type ShipperStatus struct {
	Lag       time.Duration // age of the oldest commit not yet in the store
	Alarm     bool          // Lag > AlarmLag
	Backlog   int           // databases with unshipped records
	LastError string
	LastErrAt time.Time
}

// Status is the shipper's state as of its last tick.
func (s *Shipper) Status() ShipperStatus {
	s.mu.Lock()
	n := len(s.dirty)
	s.mu.Unlock()
	s.statusMu.Lock()
	defer s.statusMu.Unlock()
	st := ShipperStatus{Lag: time.Duration(s.lagUs) * time.Microsecond, Alarm: s.alarm, Backlog: n, LastErrAt: s.lastErrAt}
	if s.lastErr != nil {
		st.LastError = s.lastErr.Error()
	}
	return st
}

type shipMetrics struct {
	lag        prometheus.Gauge
	shipLag    prometheus.Histogram
	putSeconds prometheus.Histogram
	bytes      *prometheus.CounterVec
	objects    *prometheus.CounterVec
	errors     prometheus.Counter
	alarm      prometheus.Gauge
	backlog    prometheus.Gauge
}

func newShipMetrics(reg prometheus.Registerer) *shipMetrics {
	m := &shipMetrics{
		lag: prometheus.NewGauge(prometheus.GaugeOpts{Name: "shoal_history_lag_seconds", Help: "Age of the oldest commit on this host not yet in the archive store."}),
		shipLag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "shoal_history_ship_lag_seconds", Help: "Per shipment: time from the oldest shipped commit to the end of its upload.",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 14),
		}),
		putSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "shoal_history_put_duration_seconds", Help: "Duration of one archive Put.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shoal_history_shipped_bytes_total", Help: "Bytes put into the archive store, by kind (segment, snapshot, marker).",
		}, []string{"kind"}),
		objects: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shoal_history_shipped_objects_total", Help: "Objects put into the archive store, by kind (segment, snapshot, marker: a generation's prev marker).",
		}, []string{"kind"}),
		errors:  prometheus.NewCounter(prometheus.CounterOpts{Name: "shoal_history_ship_errors_total", Help: "Failed shipments (kept locally, retried)."}),
		alarm:   prometheus.NewGauge(prometheus.GaugeOpts{Name: "shoal_history_lag_alarm", Help: "1 while the shipping lag exceeds the alarm threshold."}),
		backlog: prometheus.NewGauge(prometheus.GaugeOpts{Name: "shoal_history_backlog_databases", Help: "Databases with commits not yet in the archive store."}),
	}
	if reg != nil {
		reg.MustRegister(m.lag, m.shipLag, m.putSeconds, m.bytes, m.objects, m.errors, m.alarm, m.backlog)
	}
	return m
}
