// Package snapshot is the storage snapshotter of Shoal's background plane:
// once per interval (default one hour, interval-aligned UTC buckets) it
// reads every database's size and every account's storage total from the
// catalog (stale, keyset-paged reads) and writes them into the ClickHouse
// table storage_snapshots, the storage-billing history; History answers the
// billing questions from it (StorageAt, AccountHistory, AccountsAt,
// DatabasesAt).
//
// Exactly one effect per bucket: every row carries its pass's ID, the
// completion marker is written after all of a pass's rows, and every read
// takes, per bucket, the completed pass with the greatest ID, deduplicating
// rows a retried insert stored twice (history.go). A pass that fails
// midway retries the failed step in place (same rows, same pass ID); a
// snapshotter that dies mid-pass starts the bucket over with a new pass ID;
// two snapshotters running at once each write a whole pass and readers see
// one of them. The last completed bucket is read back from ClickHouse at
// start, so a restart neither redoes nor skips a bucket it could still
// take. See pipeline/DESIGN.md ("Storage snapshotter").
package snapshot

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/shoaldb/shoal/pipeline/chsink"
	"github.com/shoaldb/shoal/raftmeta"
	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// Defaults of Config.
const (
	DefaultInterval       = time.Hour
	DefaultPageSize       = fsm.MaxStoragePage // 10,000
	DefaultBatchRows      = 50_000
	DefaultAttemptTimeout = 30 * time.Second
)

// Catalog is what the snapshotter needs of the catalog: the paged storage
// reads (raftmeta.StorageReader; see its contract).
type Catalog interface {
	DatabaseStoragePage(ctx context.Context, after string, limit int, o raftmeta.ReadOptions) (fsm.DatabaseStoragePage, error)
	AccountStoragePage(ctx context.Context, after string, limit int, o raftmeta.ReadOptions) (fsm.AccountStoragePage, error)
}

var _ Catalog = (*raftmeta.Client)(nil)

// Config configures a Snapshotter. Zero values take the documented
// defaults.
type Config struct {
	// Catalog is read (a *raftmeta.Client), required.
	Catalog Catalog
	// Store is the ClickHouse sink's store: the snapshotter uses its
	// connection and database. Or set Conn (and Database, default
	// "shoal") instead. One of the two is required; the snapshotter does
	// not close either.
	Store    *chsink.Store
	Conn     driver.Conn
	Database string
	// Interval is the snapshot period and bucket size (default 1 h; a
	// whole number of seconds, at least 1 s). Buckets are aligned on
	// multiples of Interval since the Unix epoch, UTC (an hour, a day).
	Interval time.Duration
	// PageSize is the catalog page (default and maximum
	// fsm.MaxStoragePage, 10,000).
	PageSize int
	// BatchRows bounds the rows of one ClickHouse insert (default 50,000).
	BatchRows int
	// Read is the consistency of the catalog pages (default stale within
	// the serving node's bound).
	Read raftmeta.ReadOptions
	// RetryMin and RetryMax bound the backoff between failed attempts
	// (defaults 100 ms doubling to 5 s); AttemptTimeout bounds one
	// (default 30 s).
	RetryMin, RetryMax time.Duration
	AttemptTimeout     time.Duration
	// Logger receives failures (default: discarded).
	Logger *slog.Logger
	// Registerer receives the metrics (shoal_pipeline_snapshot_*),
	// unregistered by Close. Nil: the snapshotter owns a registry
	// (Snapshotter.Registry).
	Registerer prometheus.Registerer
	// Now is the clock that picks buckets and ends them (default
	// time.Now).
	Now func() time.Time
}

func (c *Config) setDefaults() error {
	if c.Catalog == nil {
		return errors.New("snapshot: no catalog")
	}
	if c.Store == nil && c.Conn == nil {
		return errors.New("snapshot: no ClickHouse store or connection")
	}
	if c.Store != nil {
		c.Conn, c.Database = c.Store.Conn(), c.Store.Database()
	}
	if c.Interval == 0 {
		c.Interval = DefaultInterval
	}
	if c.Interval < time.Second || c.Interval%time.Second != 0 {
		return fmt.Errorf("snapshot: interval %v: want a whole number of seconds, at least 1 s", c.Interval)
	}
	if c.PageSize <= 0 || c.PageSize > fsm.MaxStoragePage {
		c.PageSize = DefaultPageSize
	}
	if c.BatchRows <= 0 {
		c.BatchRows = DefaultBatchRows
	}
	if c.Read.Consistency == "" {
		c.Read.Consistency = raftmeta.Stale
	}
	c.Read.NoCache = true
	if c.RetryMin <= 0 {
		c.RetryMin = 100 * time.Millisecond
	}
	if c.RetryMax < c.RetryMin {
		c.RetryMax = max(5*time.Second, c.RetryMin)
	}
	if c.AttemptTimeout <= 0 {
		c.AttemptTimeout = DefaultAttemptTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return nil
}

// Snapshotter takes the storage snapshots. Run (or Start) runs it until
// Close; RunOnce takes the current bucket's snapshot once. Stats and the
// metrics are safe from any goroutine.
type Snapshotter struct {
	cfg  Config
	hist *History
	log  *slog.Logger
	m    *metrics
	reg  *prometheus.Registry
	regr prometheus.Registerer
	cols []prometheus.Collector

	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	mu     sync.Mutex
	done   chan struct{} // closed when Run returns; nil before Run
	closed bool

	// afterBatch, when set (tests), runs after each acknowledged insert of
	// a pass with the number of batches so far.
	afterBatch func(batches int)
}

// New returns a snapshotter; Run starts it.
func New(cfg Config) (*Snapshotter, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	h, err := NewHistory(cfg.Conn, cfg.Database)
	if err != nil {
		return nil, err
	}
	s := &Snapshotter{cfg: cfg, hist: h, log: cfg.Logger, m: newMetrics()}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.cols = s.m.collectors()
	s.regr = cfg.Registerer
	if s.regr == nil {
		s.reg = prometheus.NewRegistry()
		s.regr = s.reg
	}
	for i, col := range s.cols {
		if err := s.regr.Register(col); err != nil {
			for _, c := range s.cols[:i] {
				s.regr.Unregister(c)
			}
			return nil, fmt.Errorf("snapshot: register metrics: %w", err)
		}
	}
	return s, nil
}

// Start returns a snapshotter already running (New, then Run in a
// goroutine); Close stops it. This is the constructor `shoal dev` and
// `shoal pipeline serve` use.
func Start(cfg Config) (*Snapshotter, error) {
	s, err := New(cfg)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.done = make(chan struct{})
	s.mu.Unlock()
	go func() { _ = s.run(context.Background()) }()
	return s, nil
}

// History is the table the snapshotter writes, with the billing reads.
func (s *Snapshotter) History() *History { return s.hist }

// Registry is the snapshotter's own registry when Config.Registerer was
// nil (nil otherwise).
func (s *Snapshotter) Registry() *prometheus.Registry { return s.reg }

// Stats returns the counters.
func (s *Snapshotter) Stats() Stats { return s.m.stats() }

// Run takes a snapshot of every bucket from the current one on until ctx
// is done or Close is called, then returns nil. At start it creates the
// table and reads the last completed bucket from ClickHouse; if the current
// bucket has no completed pass it runs one at once, then one at the start
// of every following bucket. Nothing waits for ClickHouse but the inserts,
// which retry (re-creating the table) until it answers. Run may be called
// once.
func (s *Snapshotter) Run(ctx context.Context) error {
	s.mu.Lock()
	if s.closed || s.done != nil {
		s.mu.Unlock()
		return errors.New("snapshot: Run called twice or after Close")
	}
	s.done = make(chan struct{})
	s.mu.Unlock()
	return s.run(ctx)
}

func (s *Snapshotter) run(ctx context.Context) error {
	defer close(s.done)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(s.ctx, cancel)
	defer stop()
	if s.ctx.Err() != nil {
		return nil // closed before it started
	}

	// The table and the last completed bucket, one attempt each: with
	// ClickHouse down the pass runs anyway (the catalog is read within its
	// bucket; the inserts wait for ClickHouse and create the table when
	// they retry), so an outage at start costs no bucket, at worst a
	// second complete pass of one, which reads ignore.
	s.ensureSchemaOnce(ctx)
	var last time.Time
	if c, ok, err := s.lastCompletedOnce(ctx); err == nil && ok {
		last = c.SnapshotTime
		s.m.succeeded(last)
	}
	for {
		b := s.bucket(s.cfg.Now())
		if b.After(last) {
			p, ran, err := s.takeBucket(ctx, b)
			switch {
			case err == nil:
				if ran && !last.IsZero() {
					if n := int64(b.Sub(last)/s.cfg.Interval) - 1; n > 0 {
						s.m.missed.Add(uint64(n))
						s.log.Warn("storage snapshot buckets missed", "from", last.Add(s.cfg.Interval), "buckets", n)
					}
				}
				if ran {
					s.log.Info("storage snapshot taken", "snapshot_time", p.SnapshotTime, "pass", p.ID,
						"databases", p.Databases, "accounts", p.Accounts, "duration", p.Duration)
				}
				last = b
			case errors.Is(err, errBucketOver):
				s.log.Warn("storage snapshot missed: the catalog could not be read within its bucket", "snapshot_time", b)
			default:
				return nil // stopped
			}
		}
		wait := s.bucket(s.cfg.Now()).Add(s.cfg.Interval).Sub(s.cfg.Now())
		t := time.NewTimer(max(wait, time.Millisecond))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// Close stops Run (a pass in flight is abandoned: its bucket is taken again
// by the next snapshotter to start within it), waits for it to return and
// unregisters the metrics.
func (s *Snapshotter) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	done := s.done
	s.mu.Unlock()
	s.cancel()
	if done != nil {
		<-done
	}
	for _, c := range s.cols {
		s.regr.Unregister(c)
	}
	return nil
}

// Pass describes a completed pass.
type Pass struct {
	SnapshotTime time.Time // the bucket, UTC
	ID           uint64
	Databases    int           // database rows written
	Accounts     int           // account rows written
	SizeBytes    int64         // sum of the database sizes
	Read         time.Duration // the catalog pages, retries included
	Duration     time.Duration // read, inserts and marker, retries included
}

// RunOnce takes the snapshot of the bucket containing Now unless a pass of
// it already completed (ran false). Failed steps are retried until they
// succeed, ctx is done, or (catalog reads only) the bucket ends.
func (s *Snapshotter) RunOnce(ctx context.Context) (p Pass, ran bool, err error) {
	s.ensureSchemaOnce(ctx)
	return s.takeBucket(ctx, s.bucket(s.cfg.Now()))
}

// errBucketOver: the catalog could not be read before the bucket ended.
var errBucketOver = errors.New("snapshot: bucket ended before the catalog was read")

// bucket is the start of the interval containing t, UTC.
func (s *Snapshotter) bucket(t time.Time) time.Time {
	sec := int64(s.cfg.Interval / time.Second)
	u := t.Unix()
	u -= ((u % sec) + sec) % sec
	return time.Unix(u, 0).UTC()
}

// ensureSchemaOnce creates the table, one attempt (a failure is counted
// and logged; the inserts' retries create it later).
func (s *Snapshotter) ensureSchemaOnce(ctx context.Context) {
	actx, cancel := context.WithTimeout(ctx, s.cfg.AttemptTimeout)
	defer cancel()
	if err := s.hist.EnsureSchema(actx); err != nil && ctx.Err() == nil {
		s.m.fail(stageSchema)
		s.log.Warn("storage snapshot: creating the table failed; the inserts will retry it", "err", err)
	}
}

// lastCompletedOnce reads the newest completed bucket, one attempt (a
// failure is counted and logged).
func (s *Snapshotter) lastCompletedOnce(ctx context.Context) (Completed, bool, error) {
	actx, cancel := context.WithTimeout(ctx, s.cfg.AttemptTimeout)
	defer cancel()
	c, ok, err := s.hist.LastCompleted(actx)
	if err != nil && ctx.Err() == nil {
		s.m.fail(stageState)
		s.log.Warn("storage snapshot: reading the last completed bucket failed", "err", err)
	}
	return c, ok, err
}

// takeBucket runs a pass for bucket b unless ClickHouse already records a
// completed one (another snapshotter's): then ran is false. If ClickHouse
// cannot say, the pass runs (a second complete pass is harmless).
func (s *Snapshotter) takeBucket(ctx context.Context, b time.Time) (Pass, bool, error) {
	c, ok, err := s.lastCompletedOnce(ctx)
	if err == nil && ok && !c.SnapshotTime.Before(b) {
		s.m.succeeded(c.SnapshotTime)
		return Pass{}, false, nil
	}
	p, err := s.pass(ctx, b)
	if err != nil {
		return Pass{}, false, err
	}
	return p, true, nil
}

// figures are a pass's figures, column by column.
type figures struct {
	dbUUID, dbAccount          []string
	dbSize, dbSeq, dbUpdated   []int64
	account                    []string
	acctSize, acctDBs, acctUpd []int64
	sizeSum                    int64
}

// pass reads the catalog, writes the rows in batches and then the
// completion marker, all under one new pass ID.
func (s *Snapshotter) pass(ctx context.Context, b time.Time) (Pass, error) {
	start := time.Now()
	id := uint64(s.cfg.Now().UnixMilli())<<16 | uint64(rand.N(1<<16))
	r, err := s.read(ctx, b)
	if err != nil {
		return Pass{}, err
	}
	readDone := s.cfg.Now()
	read := time.Since(start)
	if err := s.insert(ctx, b, id, r, readDone); err != nil {
		return Pass{}, err
	}
	p := Pass{SnapshotTime: b, ID: id, Databases: len(r.dbUUID), Accounts: len(r.account), SizeBytes: r.sizeSum,
		Read: read, Duration: time.Since(start)}
	s.m.passes.Add(1)
	s.m.succeeded(b)
	s.m.passDuration.Observe(p.Duration.Seconds())
	return p, nil
}

// read walks both kinds of catalog pages. A page that fails is retried
// until the bucket ends; then the pass is abandoned (errBucketOver): the
// figures still to read would be taken after their bucket. A read that
// succeeds late (a pass started just before the bucket's end) is kept.
func (s *Snapshotter) read(ctx context.Context, b time.Time) (*figures, error) {
	end := b.Add(s.cfg.Interval)
	r := &figures{}
	after := ""
	for {
		var page fsm.DatabaseStoragePage
		if err := s.retry(ctx, stageRead, end, func(actx context.Context, _ int) error {
			t0 := time.Now()
			var err error
			page, err = s.cfg.Catalog.DatabaseStoragePage(actx, after, s.cfg.PageSize, s.cfg.Read)
			if err == nil {
				err = checkNext(after, page.Next, len(page.Databases))
			}
			if err == nil {
				s.m.pageDuration.Observe(time.Since(t0).Seconds())
			}
			return err
		}); err != nil {
			return nil, err
		}
		s.m.pages.Add(1)
		for _, d := range page.Databases {
			r.dbUUID, r.dbAccount = append(r.dbUUID, d.UUID), append(r.dbAccount, d.AccountID)
			r.dbSize, r.dbSeq, r.dbUpdated = append(r.dbSize, d.SizeBytes), append(r.dbSeq, d.Seq), append(r.dbUpdated, d.UpdatedAt)
			r.sizeSum += d.SizeBytes
		}
		if page.Next == "" {
			break
		}
		after = page.Next
	}
	after = ""
	for {
		var page fsm.AccountStoragePage
		if err := s.retry(ctx, stageRead, end, func(actx context.Context, _ int) error {
			t0 := time.Now()
			var err error
			page, err = s.cfg.Catalog.AccountStoragePage(actx, after, s.cfg.PageSize, s.cfg.Read)
			if err == nil {
				err = checkNext(after, page.Next, len(page.Accounts))
			}
			if err == nil {
				s.m.pageDuration.Observe(time.Since(t0).Seconds())
			}
			return err
		}); err != nil {
			return nil, err
		}
		s.m.pages.Add(1)
		for _, a := range page.Accounts {
			r.account = append(r.account, a.AccountID)
			r.acctSize, r.acctDBs, r.acctUpd = append(r.acctSize, a.StorageBytes), append(r.acctDBs, a.ActiveDatabases), append(r.acctUpd, a.UpdatedAt)
		}
		if page.Next == "" {
			break
		}
		after = page.Next
	}
	return r, nil
}

// checkNext refuses a page that would not move the walk forward (a walk
// that never ends).
func checkNext(after, next string, n int) error {
	if next != "" && (next <= after || n == 0) {
		return fmt.Errorf("snapshot: catalog page after %q returned next %q", after, next)
	}
	return nil
}

// insert writes the database rows, then the account rows, in batches of
// BatchRows, then the marker. Each insert is retried until it is
// acknowledged or ctx is done (the rows were read within their bucket, so
// they stay valid however late they land); a retry first re-creates the
// table in case it was dropped.
func (s *Snapshotter) insert(ctx context.Context, b time.Time, id uint64, r *figures, readDone time.Time) error {
	batches := 0
	send := func(values func(lo, hi int) []any, n int) error {
		for lo := 0; lo < n; lo += s.cfg.BatchRows {
			hi := min(lo+s.cfg.BatchRows, n)
			v := values(lo, hi)
			if err := s.retry(ctx, stageInsert, time.Time{}, func(actx context.Context, attempt int) error {
				if attempt > 0 {
					if err := s.hist.EnsureSchema(actx); err != nil {
						return err
					}
				}
				return s.hist.send(actx, v)
			}); err != nil {
				return err
			}
			s.m.rows.Add(uint64(hi - lo))
			batches++
			if s.afterBatch != nil {
				s.afterBatch(batches)
			}
		}
		return nil
	}
	// Constant columns, sliced per batch.
	n := max(len(r.dbUUID), len(r.account), 1)
	n = min(n, s.cfg.BatchRows)
	times, ids, zeros, empty := make([]time.Time, n), make([]uint64, n), make([]int64, n), make([]string, n)
	for i := range times {
		times[i], ids[i] = b, id
	}
	kinds := func(k string, m int) []string {
		out := make([]string, m)
		for i := range out {
			out[i] = k
		}
		return out
	}
	dbKinds, acctKinds := kinds(KindDatabase, n), kinds(KindAccount, n)
	if err := send(func(lo, hi int) []any {
		m := hi - lo
		return []any{times[:m], times[:m], dbKinds[:m], r.dbAccount[lo:hi], r.dbUUID[lo:hi], ids[:m],
			r.dbSize[lo:hi], zeros[:m], zeros[:m], r.dbSeq[lo:hi], r.dbUpdated[lo:hi]}
	}, len(r.dbUUID)); err != nil {
		return err
	}
	if err := send(func(lo, hi int) []any {
		m := hi - lo
		return []any{times[:m], times[:m], acctKinds[:m], r.account[lo:hi], empty[:m], ids[:m],
			r.acctSize[lo:hi], r.acctDBs[lo:hi], zeros[:m], zeros[:m], r.acctUpd[lo:hi]}
	}, len(r.account)); err != nil {
		return err
	}
	return send(func(lo, hi int) []any {
		return []any{times[:1], times[:1], []string{KindPass}, empty[:1], empty[:1], ids[:1],
			[]int64{r.sizeSum}, []int64{int64(len(r.dbUUID))}, []int64{int64(len(r.account))}, zeros[:1],
			[]int64{readDone.UnixNano()}}
	}, 1)
}

// retry runs fn (attempt 0, 1, …, each bounded by AttemptTimeout) until it
// succeeds, ctx is done (ctx.Err()), or deadline (if not zero) has passed on
// the configured clock (errBucketOver). Failures are counted per stage and
// logged: the first of a run at Warn, the following at Debug.
func (s *Snapshotter) retry(ctx context.Context, stage string, deadline time.Time, fn func(ctx context.Context, attempt int) error) error {
	backoff := s.cfg.RetryMin
	for attempt := 0; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, s.cfg.AttemptTimeout)
		err := fn(actx, attempt)
		cancel()
		if err == nil {
			if attempt > 0 {
				s.log.Info("storage snapshot: recovered", "stage", stage, "attempts", attempt+1)
			}
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		s.m.fail(stage)
		lvl := slog.LevelDebug
		if attempt == 0 {
			lvl = slog.LevelWarn
		}
		s.log.Log(ctx, lvl, "storage snapshot: attempt failed, retrying", "stage", stage, "attempt", attempt+1, "err", err)
		if !deadline.IsZero() && !s.cfg.Now().Before(deadline) {
			return fmt.Errorf("%w (last error: %v)", errBucketOver, err)
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		backoff = min(backoff*2, s.cfg.RetryMax)
	}
}
