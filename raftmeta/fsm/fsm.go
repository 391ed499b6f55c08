package fsm

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	_ "github.com/mattn/go-sqlite3" // registers the "sqlite3" driver
)

// Defaults for Options.
const (
	DefaultDedupeWindow     = 10 * time.Minute
	DefaultDedupeMaxEntries = 200_000
	DefaultPerPage          = 100
	MaxPerPage              = 10_000
	MaxHeartbeatBatch       = 10_000
	maxPage                 = 1 << 30
	defaultReadConns        = 8
)

// Option configures an FSM (functional options).
type Option func(*config)

type config struct {
	dedupeWindow     time.Duration
	dedupeMaxEntries uint64
	readConns        int
	snapshotMode     SnapshotMode
	buildLevel       int64
}

// WithDedupeWindow sets how long (in Command.Time, the proposers' clock) a
// request ID is remembered. Every replica must use the same value: it is
// part of the state machine's definition.
func WithDedupeWindow(d time.Duration) Option { return func(c *config) { c.dedupeWindow = d } }

// WithDedupeMaxEntries bounds the remembered request IDs to those applied in
// the last n log entries (whichever of this and the window is smaller). Every
// replica must use the same value.
func WithDedupeMaxEntries(n uint64) Option { return func(c *config) { c.dedupeMaxEntries = n } }

// WithReadConns sets the size of the read-only connection pool.
func WithReadConns(n int) Option { return func(c *config) { c.readConns = n } }

// WithSnapshotMode chooses how Persist copies the catalog (see SnapshotMode).
func WithSnapshotMode(m SnapshotMode) Option { return func(c *config) { c.snapshotMode = m } }

// WithBuildLevel makes the FSM apply only up to catalog level n, as a
// build of that level would (tests: an older replica in a mixed group).
// Values below 1 or above BuildLevel are clamped.
func WithBuildLevel(n int64) Option {
	return func(c *config) { c.buildLevel = min(max(n, 1), BuildLevel) }
}

// FSM is the catalog state machine: a SQLite database derived from the Raft
// log. It implements raft.FSM and raft.BatchingFSM.
//
// Concurrency contract: Apply, ApplyBatch, Snapshot and Restore are called by
// raft from one goroutine, never concurrently with each other. Persist of a
// snapshot may run concurrently with Apply (it reads a WAL snapshot opened in
// Snapshot). The read methods are safe from any goroutine at any time: they
// use a separate pool of read-only connections and see the state as of the
// last committed Apply; they block only while Restore swaps the file.
type FSM struct {
	cfg  config
	dir  string
	path string

	// mu guards the database handles against Restore swapping them: readers
	// and live snapshots hold it shared, Restore and Close exclusively.
	mu     sync.RWMutex
	closed bool
	wdb    *sql.DB // single write connection
	wconn  *sql.Conn
	rdb    *sql.DB // read-only pool
	stmts  *stmts

	// Apply-goroutine state, persisted in meta in every apply transaction.
	// applied is atomic so AppliedIndex can be read from any goroutine.
	applied atomic.Uint64
	maxTime int64
	// level is the cluster's catalog level (meta cluster_level, 1 when
	// absent): written by the apply goroutine (set_cluster_level, open),
	// read by any goroutine.
	level atomic.Int64
	// dd remembers request IDs (apply goroutine only; see dedupe).
	dd *dedupe
	// batchOffset is how many request-ID positions batch entries took
	// beyond one each (apply goroutine only; meta batch_offset,
	// batchentry.go); batchEntries counts the batch entries seen.
	batchOffset  uint64
	batchEntries atomic.Uint64
	// activeDelta holds creates not yet added to accounts.active_databases
	// (apply goroutine only; see flushActive). Empty between batches.
	activeDelta map[string]int64
	// digestCmd: the running command's heartbeat digest changes;
	// digestBatch: the batch's, added to dig when the batch commits
	// (apply goroutine only; hbdigest.go).
	digestCmd   []digestChange
	digestBatch map[digestKey]digestDelta
	// dig holds the heartbeat digests (hbdigest.go, digestMem): changed
	// by the apply goroutine, read by any goroutine under dig.mu.
	dig *digestMem
}

var (
	_ raft.FSM         = (*FSM)(nil)
	_ raft.BatchingFSM = (*FSM)(nil)
)

// New opens dir/catalog.db as an EMPTY catalog, removing any previous file:
// hashicorp/raft restores the latest snapshot and replays the log on every
// start, so whatever was there is rebuilt (and a stale file could only
// disagree with the log).
func New(dir string, opts ...Option) (*FSM, error) {
	cfg := config{
		dedupeWindow:     DefaultDedupeWindow,
		dedupeMaxEntries: DefaultDedupeMaxEntries,
		readConns:        defaultReadConns,
		snapshotMode:     SnapshotBackup,
		buildLevel:       BuildLevel,
	}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.readConns < 1 {
		cfg.readConns = 1
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create fsm dir: %w", err)
	}
	f := &FSM{cfg: cfg, dir: dir, path: filepath.Join(dir, "catalog.db"), dd: newDedupe(),
		activeDelta: map[string]int64{}, dig: newDigestMem()}
	if err := removeDBFiles(f.path); err != nil {
		return nil, err
	}
	if err := createCatalog(f.path); err != nil {
		return nil, err
	}
	if err := f.open(); err != nil {
		return nil, err
	}
	return f, nil
}

// createCatalog writes a fresh catalog file of schemaVersion (schema, then
// every migration: see migrations).
func createCatalog(path string) error {
	db, err := sql.Open("sqlite3", writeDSN(path))
	if err != nil {
		return fmt.Errorf("open catalog: %w", err)
	}
	defer db.Close()
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("create schema: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // no-op after commit
	if _, err := tx.ExecContext(ctx, currentSchema()); err != nil {
		return fmt.Errorf("create schema: %w", err)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO meta (key, value) VALUES
		('schema_version', ?), ('applied_index', '0'), ('max_time', '0')`, schemaVersion); err != nil {
		return fmt.Errorf("create schema: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("create schema: %w", err)
	}
	return nil
}

func removeDBFiles(path string) error {
	for _, p := range []string{path, path + "-wal", path + "-shm", path + "-journal"} {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove %s: %w", filepath.Base(p), err)
		}
	}
	return nil
}

// writeDSN: the catalog is derived state (the Raft log and snapshots are the
// durable truth, and New wipes the file), so it runs without fsync.
func writeDSN(path string) string {
	return "file:" + path + "?_journal_mode=WAL&_synchronous=OFF&_mutex=no&_busy_timeout=10000&_cache_size=-131072&_temp_store=memory"
}

func readDSN(path string) string {
	return "file:" + path + "?_query_only=1&_busy_timeout=10000&_cache_size=-16384&_stmt_cache_size=32"
}

// open opens the write connection (and its prepared statements) and the read
// pool on f.path, and loads the apply state from meta. Callers hold mu
// exclusively or own f exclusively.
func (f *FSM) open() error {
	ctx := context.Background()
	wdb, err := sql.Open("sqlite3", writeDSN(f.path))
	if err != nil {
		return fmt.Errorf("open catalog: %w", err)
	}
	wdb.SetMaxOpenConns(1)
	wconn, err := wdb.Conn(ctx)
	if err != nil {
		wdb.Close()
		return fmt.Errorf("open catalog: %w", err)
	}
	st, err := prepareStmts(ctx, wconn)
	if err != nil {
		wconn.Close()
		wdb.Close()
		return err
	}
	rdb, err := sql.Open("sqlite3", readDSN(f.path))
	if err != nil {
		st.close()
		wconn.Close()
		wdb.Close()
		return fmt.Errorf("open catalog readers: %w", err)
	}
	rdb.SetMaxOpenConns(f.cfg.readConns)
	rdb.SetMaxIdleConns(f.cfg.readConns)
	f.wdb, f.wconn, f.rdb, f.stmts = wdb, wconn, rdb, st
	applied, maxTime, err := loadMeta(ctx, wconn)
	if err != nil {
		f.closeHandles()
		return err
	}
	level, err := loadClusterLevel(ctx, wconn)
	if err != nil {
		f.closeHandles()
		return err
	}
	off, err := loadBatchOffset(ctx, wconn)
	if err != nil {
		f.closeHandles()
		return err
	}
	f.applied.Store(applied)
	f.maxTime = maxTime
	f.level.Store(level)
	f.batchOffset = off
	return nil
}

// loadBatchOffset reads the batch_offset meta row (0 when absent).
func loadBatchOffset(ctx context.Context, q interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}) (uint64, error) {
	var v string
	switch err := q.QueryRowContext(ctx, `SELECT value FROM meta WHERE key = '`+batchOffsetKey+`'`).Scan(&v); {
	case errors.Is(err, sql.ErrNoRows):
		return 0, nil
	case err != nil:
		return 0, fmt.Errorf("read batch offset: %w", err)
	}
	off, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parse batch offset %q: bad value", v)
	}
	return off, nil
}

func loadMeta(ctx context.Context, q interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}) (applied uint64, maxTime int64, err error) {
	var v string
	if err := q.QueryRowContext(ctx, `SELECT value FROM meta WHERE key = 'schema_version'`).Scan(&v); err != nil {
		return 0, 0, fmt.Errorf("read catalog schema version: %w", err)
	}
	if v != schemaVersion {
		return 0, 0, fmt.Errorf("catalog schema version %q, want %q", v, schemaVersion)
	}
	if err := q.QueryRowContext(ctx, `SELECT value FROM meta WHERE key = 'applied_index'`).Scan(&v); err != nil {
		return 0, 0, fmt.Errorf("read applied index: %w", err)
	}
	if applied, err = strconv.ParseUint(v, 10, 64); err != nil {
		return 0, 0, fmt.Errorf("parse applied index: %w", err)
	}
	if err := q.QueryRowContext(ctx, `SELECT value FROM meta WHERE key = 'max_time'`).Scan(&v); err != nil {
		return 0, 0, fmt.Errorf("read max time: %w", err)
	}
	if maxTime, err = strconv.ParseInt(v, 10, 64); err != nil {
		return 0, 0, fmt.Errorf("parse max time: %w", err)
	}
	return applied, maxTime, nil
}

func (f *FSM) closeHandles() error {
	var errs []error
	if f.stmts != nil {
		f.stmts.close()
		f.stmts = nil
	}
	if f.wconn != nil {
		errs = append(errs, f.wconn.Close())
		f.wconn = nil
	}
	if f.wdb != nil {
		errs = append(errs, f.wdb.Close())
		f.wdb = nil
	}
	if f.rdb != nil {
		errs = append(errs, f.rdb.Close())
		f.rdb = nil
	}
	return errors.Join(errs...)
}

// Close closes the catalog. It waits for in-flight reads and snapshots.
func (f *FSM) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nil
	}
	f.closed = true
	f.dd.free() // no Apply after Close: Raft has shut down
	return f.closeHandles()
}

// AppliedIndex is the index of the last log entry applied (or restored),
// safe from any goroutine. It advances after the apply transaction commits,
// so a reader that sees index i can read the effects of every entry <= i.
func (f *FSM) AppliedIndex() uint64 { return f.applied.Load() }
