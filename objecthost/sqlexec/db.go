package sqlexec

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	v4 "github.com/shoaldb/shoal/internal/v4"
)

const maxClassifiedSQL = 4096     // statement strings longer than this always go to the writer
const maxClassifiedEntries = 8192 // read-only classification cache bound

// DB executes user SQL against one SQLite file with D1 semantics.
//
// Concurrency contract: Execute, ExecScript, Size, NumTables and Close are safe for
// concurrent use. Requests that may write run one at a time on the single
// writer connection, in arrival order (a FIFO queue served by one
// goroutine, with group commit, see group.go); requests known to be
// read-only run concurrently on the reader connections, in the caller's
// goroutine, each in its own read transaction (a WAL snapshot). At most
// MaxQueue requests wait for the writer, and at most MaxQueue read requests
// wait for a reader; beyond that Execute fails at once with CodeOverloaded.
// Close interrupts running requests, fails queued ones with ErrClosed and
// returns when no goroutine of the DB is left.
type DB struct {
	path string
	lim  Limits
	base Meta

	writeQ      chan *job
	readers     chan *conn // idle reader connections; nil without readers
	readWaiting atomic.Int64
	// Reader connections are opened lazily, by the first reads that find
	// none idle, up to cap(readers): a cold database's first request runs
	// on the writer anyway (its SQL is not yet known to be read-only), and
	// a database only ever written or read once never pays for them.
	readerSlots atomic.Int64 // readers opened or being opened

	mu       sync.RWMutex // guards closed against sends on closed queues
	closed   bool
	wg       sync.WaitGroup // the writer goroutine
	inflight sync.WaitGroup // reads running in callers' goroutines
	// closing is canceled by Close: readers waiting for a connection give up.
	closing     context.Context
	stopClosing context.CancelFunc

	// readonly maps a statement string to whether all its statements are
	// read-only, learned when it first runs. Unknown strings go to the writer.
	readonly    sync.Map
	nReadonly   atomic.Int64
	schemaGen   atomic.Uint64
	sizeHint    atomic.Int64
	lastRowID   atomic.Int64 // the writer's last_insert_rowid, reported by reads too
	writerConn  *conn
	connsMu     sync.Mutex // guards readerConns (appended by lazy opens)
	readerConns []*conn

	// carry is a script dequeued while a group was being gathered; it runs
	// next (writer goroutine only).
	carry *job
	// scripts counts ExecScript calls queued or running: while > 0, requests
	// of unknown SQL try a reader first instead of queueing behind the
	// script (a reader hands writes back untouched, errNeedWriter).
	scripts atomic.Int64

	maxGroupTime time.Duration // group commit window (tests widen it)
	commits      atomic.Int64  // group commits, for tests
	lostTxns     atomic.Int64  // transactions SQLite rolled back under a group, for tests
	hook         *commitHook   // writer goroutine only; see commithook.go
	// classifyFn is db.classify bound once at Open: a method value taken
	// per request was an allocation on every read.
	classifyFn func(sql string, ro bool)
}

type job struct {
	rq  reqCtx
	req *Request
	fn  func(*conn) error // internal jobs (NumTables) instead of req
	// script, when set, makes this an ExecScript job (run alone).
	script *scriptJob
	res    []StatementResult
	err    error
	done   chan struct{}
}

// Open opens (creating if missing) the SQLite file at path in WAL mode with
// one writer and opts.ReadConns reader connections.
func Open(path string, opts Options) (*DB, error) {
	lim := opts.Limits.withDefaults()
	nreaders := opts.ReadConns
	if nreaders == 0 {
		nreaders = 4
	}
	if nreaders < 0 {
		nreaders = 0
	}
	db := &DB{
		path: path,
		lim:  lim,
		// D1 and its SDKs' enums spell regions upper-case ("WEUR"); hosts
		// are configured with the location-hint spelling ("weur").
		base:         Meta{ServedByRegion: strings.ToUpper(opts.Region), ServedByPrimary: true, ServedByColo: opts.Host},
		maxGroupTime: defaultMaxGroupTime,
	}
	db.classifyFn = db.classify
	db.closing, db.stopClosing = context.WithCancel(context.Background())
	// The writer opens first: it sets WAL mode, which readers then share.
	w, err := openConn(path, true, lim, &db.schemaGen, &db.sizeHint, &db.lastRowID)
	if err != nil {
		return nil, err
	}
	db.writerConn = w
	if opts.CommitHook != nil {
		// Nothing else can use the connection yet: attach here rather than
		// through a job on the writer goroutine (SetCommitHook).
		if err := db.attachHook(w, opts.CommitHook, opts.HookAttach); err != nil {
			w.close()
			db.stopClosing()
			return nil, err
		}
	}
	if nreaders > 0 {
		db.readers = make(chan *conn, nreaders) // filled lazily, see readerSlots
	}
	db.writeQ = make(chan *job, lim.MaxQueue)
	db.wg.Add(1)
	go db.writer(w)
	return db, nil
}

// SizeHint is the database's size in bytes as its writer last measured it
// (UsedBytes after its latest write), 0 before any measurement. Two writes'
// results may reach their callers in either order; this is always the
// newer measurement.
func (db *DB) SizeHint() int64 { return db.sizeHint.Load() }

// Execute runs req as one transaction and returns one result per statement
// executed. Every failure is an *Error (or ErrClosed) and leaves the
// database as it was. SQL holding a NUL or invalid UTF-8 is refused
// (CodeInvalidRequest) before anything runs: SQLite would stop reading at
// the NUL and silently drop the rest of the request. The request is
// bounded by Limits.QueryTimeout and by ctx; either ending interrupts
// SQLite and rolls back.
func (db *DB) Execute(ctx context.Context, req Request) ([]StatementResult, error) {
	if len(req.Statements) == 0 {
		return nil, invalidf("no statements")
	}
	// Before anything runs: SQLite would silently stop reading at a NUL.
	if err := checkStatements(req.Statements); err != nil {
		return nil, err
	}
	if err := dropCommentOnly(&req); err != nil {
		return nil, err
	}
	rq := newReqCtx(ctx, db.lim.QueryTimeout)
	if ro := db.readers != nil && db.isReadonly(&req); ro || db.readers != nil && db.scripts.Load() > 0 {
		// While a script holds the writer, SQL not yet known to be
		// read-only tries a reader first (speculative): writes, and
		// statements a reader cannot even prepare, come back untouched.
		res, err := db.read(rq, &req, nil, !ro)
		if !errors.Is(err, errNeedWriter) {
			return res, err
		}
		// Misclassified (a statement string learned read-only changed
		// meaning after a schema change): nothing ran; use the writer.
	}
	j := &job{rq: rq, req: &req, done: make(chan struct{})}
	if err := db.enqueue(j); err != nil {
		return nil, err
	}
	<-j.done
	return j.res, j.err
}

// read runs a read-only request (or fn) on a reader connection in the
// caller's goroutine.
func (db *DB) read(rq reqCtx, req *Request, fn func(*conn) error, speculative bool) ([]StatementResult, error) {
	db.mu.RLock()
	if db.closed {
		db.mu.RUnlock()
		return nil, ErrClosed
	}
	db.inflight.Add(1)
	db.mu.RUnlock()
	defer db.inflight.Done()

	if db.readWaiting.Add(1) > int64(db.lim.MaxQueue+cap(db.readers)) {
		db.readWaiting.Add(-1)
		return nil, overloaded(db.lim.MaxQueue)
	}
	var c *conn
	select {
	case c = <-db.readers:
	default:
		var err error
		if c, err = db.openReader(); err != nil {
			db.readWaiting.Add(-1)
			return nil, errNeedWriter // nothing ran: the writer serves it
		}
		if c != nil {
			break
		}
		// Slow path: all readers busy. Wait, bounded by the request's
		// deadline (the timer is only paid for here).
		timer := time.NewTimer(time.Until(rq.deadline))
		defer timer.Stop()
		select {
		case c = <-db.readers:
		case <-rq.ctx.Done():
			db.readWaiting.Add(-1)
			return nil, ctxError(rq.ctx)
		case <-timer.C:
			db.readWaiting.Add(-1)
			return nil, timeoutError()
		case <-db.closing.Done():
			db.readWaiting.Add(-1)
			return nil, ErrClosed
		}
	}
	defer func() {
		db.readers <- c
		db.readWaiting.Add(-1)
	}()
	if db.closing.Err() != nil {
		return nil, ErrClosed
	}
	if fn != nil {
		return nil, fn(c)
	}
	st := reqState{base: db.base, classify: db.classifyFn, speculative: speculative}
	return c.run(rq, req, &st)
}

// openReader opens one more reader connection if fewer than cap(readers)
// exist, in the caller's goroutine (the caller is counted in inflight, so
// Close waits for it and then closes the new connection too). It returns
// nil, nil when every reader is already open (the caller waits for an idle
// one). A failed open frees its slot for a later attempt; the caller hands
// the request to the writer.
func (db *DB) openReader() (*conn, error) {
	for {
		n := db.readerSlots.Load()
		if n >= int64(cap(db.readers)) {
			return nil, nil
		}
		if db.readerSlots.CompareAndSwap(n, n+1) {
			break
		}
	}
	c, err := openConn(db.path, false, db.lim, &db.schemaGen, &db.sizeHint, &db.lastRowID)
	if err != nil {
		db.readerSlots.Add(-1)
		return nil, err
	}
	db.connsMu.Lock()
	db.readerConns = append(db.readerConns, c)
	db.connsMu.Unlock()
	return c, nil
}

func (db *DB) isReadonly(req *Request) bool {
	for _, s := range req.Statements {
		v, ok := db.readonly.Load(s.SQL)
		if !ok || !v.(bool) {
			return false
		}
	}
	return true
}

func (db *DB) classify(sql string, ro bool) {
	if len(sql) > maxClassifiedSQL {
		return
	}
	if v, ok := db.readonly.Load(sql); ok && v.(bool) == ro {
		return // the hot path: no write to the shared map
	}
	if _, loaded := db.readonly.Swap(sql, ro); !loaded {
		if db.nReadonly.Add(1) > maxClassifiedEntries {
			// Bounded memory: forget everything and relearn.
			db.readonly.Clear()
			db.nReadonly.Store(0)
		}
	}
}

// commentLines is D1's filter for statements that hold only "--" comments
// (miniflare's D1 Durable Object: sql.replace(/^\s+--.*/gm, "").trim()).
var commentLines = regexp.MustCompile(`(?m)^\s+--.*`)

// dropCommentOnly removes the statements D1 drops before running a request:
// those that are empty once lines of "--" comments preceded by whitespace
// are taken out. They get no result. A request left with none fails with
// D1's NoSQLMessage. (A statement that is only "--" comments from its
// first character, ";" or /* */ comments is not dropped: SQLite finds no
// statement in it, NoStatementMessage.)
func dropCommentOnly(req *Request) error {
	var keep []Statement // allocated at the first statement dropped: most requests drop none
	dropped := false
	for i, s := range req.Statements {
		if strings.TrimSpace(s.SQL) == "" || strings.Contains(s.SQL, "--") && strings.TrimSpace(commentLines.ReplaceAllString(s.SQL, "")) == "" {
			if !dropped {
				keep = append(make([]Statement, 0, len(req.Statements)-1), req.Statements[:i]...)
				dropped = true
			}
			continue
		}
		if dropped {
			keep = append(keep, s)
		}
	}
	if !dropped {
		return nil
	}
	if len(keep) == 0 {
		return &Error{Code: v4.CodeSQL, Message: NoSQLMessage, Statement: -1}
	}
	req.Statements = keep
	return nil
}

func overloaded(limit int) *Error {
	return &Error{Code: v4.CodeOverloaded, Message: fmt.Sprintf("D1 DB is overloaded. Too many requests queued (limit %d).", limit), Statement: -1}
}

func (db *DB) enqueue(j *job) error {
	db.mu.RLock()
	defer db.mu.RUnlock()
	if db.closed {
		return ErrClosed
	}
	select {
	case db.writeQ <- j:
		return nil
	default:
		return overloaded(db.lim.MaxQueue)
	}
}

func (db *DB) isClosed() bool {
	db.mu.RLock()
	defer db.mu.RUnlock()
	return db.closed
}

// Size returns the bytes on disk: the database file plus its WAL.
func (db *DB) Size() (int64, error) {
	var total int64
	for _, p := range []string{db.path, db.path + "-wal"} {
		fi, err := os.Stat(p)
		if errors.Is(err, os.ErrNotExist) && p != db.path {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("sqlexec: size: %w", err)
		}
		total += fi.Size()
	}
	return total, nil
}

// NumTables counts user tables: SQLite's own and reserved (_cf_*, _shoal_*)
// tables are excluded; FTS5 shadow tables count (they are real tables).
func (db *DB) NumTables() (int, error) {
	var n int64
	err := db.inspect(func(c *conn) error {
		var err error
		n, err = c.queryInt(`SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite\_%' ESCAPE '\' AND name NOT LIKE '\_cf\_%' ESCAPE '\' AND name NOT LIKE '\_shoal\_%' ESCAPE '\'`)
		return err
	})
	return int(n), err
}

// UsedBytes is the database's size as D1's size_after counts it: its pages
// less its free pages, times the page size (a DROP shrinks it although the
// file keeps its length until VACUUM; the WAL is not counted). It is the
// one measure the host publishes for storage accounting.
func (db *DB) UsedBytes() (int64, error) {
	var n int64
	err := db.inspect(func(c *conn) error {
		var err error
		n, err = c.usedBytes()
		return err
	})
	return n, err
}

// inspect runs a read-only fn on a reader connection, or on the writer
// when the database has no readers or fn needs it.
func (db *DB) inspect(fn func(c *conn) error) error {
	rq := newReqCtx(context.Background(), db.lim.QueryTimeout)
	if db.readers != nil {
		_, err := db.read(rq, nil, fn, false)
		if !errors.Is(err, errNeedWriter) {
			return err
		}
	}
	j := &job{rq: rq, done: make(chan struct{}), fn: fn}
	if err := db.enqueue(j); err != nil {
		return err
	}
	<-j.done
	return j.err
}

// Close stops accepting requests, interrupts running ones (they fail and
// roll back), fails queued ones with ErrClosed, waits for the writer
// goroutine and for reads in flight, and closes the connections (the writer
// last, so SQLite checkpoints the WAL into the database file).
func (db *DB) Close() error {
	db.mu.Lock()
	if db.closed {
		db.mu.Unlock()
		return nil
	}
	db.closed = true
	db.stopClosing()
	close(db.writeQ)
	db.mu.Unlock()
	// Interrupt until every request has returned: a request that armed its
	// connection after one round of interrupts is caught by the next.
	idle := make(chan struct{})
	go func() {
		db.wg.Wait()
		db.inflight.Wait()
		close(idle)
	}()
	for {
		db.writerConn.interrupt()
		db.connsMu.Lock()
		for _, c := range db.readerConns {
			c.interrupt()
		}
		db.connsMu.Unlock()
		select {
		case <-idle:
		case <-time.After(5 * time.Millisecond):
			continue
		}
		break
	}
	db.connsMu.Lock()
	for _, c := range db.readerConns {
		c.close()
	}
	db.readerConns = nil
	db.connsMu.Unlock()
	db.writerConn.close()
	return nil
}
