package sqlexec

/*
#include "shim.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	v4 "github.com/shoaldb/shoal/internal/v4"
)

// SQLite result codes we branch on.
const (
	rcOK        = 0
	rcNoMem     = 7
	rcInterrupt = 9
	rcFull      = 13
	rcTooBig    = 18
	rcAuth      = 23
	rcRow       = 100
	rcDone      = 101
)

const (
	openReadWrite = 0x00000002
	openCreate    = 0x00000004
	openNoMutex   = 0x00008000
	openNoFollow  = 0x01000000
)

const (
	limitLength         = 0
	limitSQLLength      = 1
	limitColumn         = 2
	limitFunctionArg    = 6
	limitAttached       = 7
	limitLikePattern    = 8
	limitVariableNumber = 9
	limitVdbeOp         = 5
	limitWorkerThreads  = 11
)

const (
	stmtCacheSize   = 256    // prepared statements kept per connection
	maxCachedSQLLen = 16_384 // longer SQL is prepared, run and finalized
)

// d1Counts reports whether rows read and written are counted the way D1
// counts them, from the linked SQLite's per-instruction execution counts
// (shoal_d1_counts); it is a property of the linked library, checked once
// per process (shoal_counts_check). Without it, rows_read comes from scan
// statistics and rows_written from the preupdate hook (an approximation;
// TestD1Counters fails loudly then).
var d1Counts = sync.OnceValue(func() bool { return C.shoal_counts_check_mem() != 0 })

// errNeedWriter tells the DB that a request routed to a reader holds a
// statement that writes: it is re-queued on the writer. Nothing has run.
var errNeedWriter = errors.New("sqlexec: request needs the writer")

// cstmt is a prepared statement cached on one connection, keyed by the SQL
// text it was prepared from (the remainder of the statement string).
type cstmt struct {
	s        *C.sqlite3_stmt
	consumed int // bytes of the key this statement covers
	readonly bool
	ddl      bool
	grows    bool // adds rows or schema (INSERT, REPLACE, CREATE, ALTER, also through triggers)
	deferFK  bool // PRAGMA defer_foreign_keys: must not outlive its request
	// simpleCount: a top-level SELECT count(*) FROM t answered by OP_Count
	// (see shoal_simple_count); its result is its rows read.
	simpleCount bool
	nparams     int
	cols        []string
	colsGen     uint64 // schema generation cols were read at
	// plan is the row-object keys for planCols (Request.Encode, rowPlan).
	plan     []keyCol
	planCols []string
	// The schema it was prepared against (DB schemaGen, this connection's
	// DDL count): see prepare.
	prepGen, prepDDL uint64
}

// conn is one SQLite connection. It is used by one goroutine at a time (the
// writer goroutine, or the caller holding a reader from the pool); only the
// cancellation fields are touched from other goroutines, under cancelMu.
type conn struct {
	db     *C.sqlite3
	sc     *C.shoal_ctx
	writer bool
	lim    Limits

	stmts    map[string]*cstmt
	internal map[string]*C.sqlite3_stmt
	cells    *C.shoal_cell
	ncells   int
	pageSize int64

	// schemaGen is shared by all connections of a DB: bumped after a request
	// that ran DDL so cached column names and index info are refreshed.
	schemaGen *atomic.Uint64
	sizeHint  *atomic.Int64            // database size in bytes as the writer last measured it
	lastRowID *atomic.Int64            // last_insert_rowid as the writer last saw it (D1 reports it on reads too)
	d1counts  bool                     // rows counted by shoal_d1_counts (else scan status + preupdate hook)
	indexInfo map[string]*tableIndexes // writer only: for rows_written
	infoGen   uint64

	// While a script runs (writer goroutine only, see script.go): new
	// statements are not cached (a dump's statements are all different and
	// would only evict the writer's hot ones), and scriptSQLBytes, when > 0,
	// replaces Limits.MaxSQLBytes.
	scriptNoCache  bool
	scriptSQLBytes int

	// ddlRuns counts DDL statements run on this connection (see prepare).
	ddlRuns uint64

	// paramSlices and paramVals are decodeParams' scratch (see there).
	paramSlices [][]param
	paramVals   []param

	// stats receives shoal_stmt_done's counters: a local passed to C
	// escapes, and was an allocation per statement. It holds no Go
	// pointer (cgo's rule for a pointer to a struct field).
	stats C.shoal_stats

	cancelMu sync.Mutex
	reqGen   uint64      // guarded by cancelMu; odd while a request is armed
	armed    reqCtx      // guarded by cancelMu; the armed request
	timer    *time.Timer // guarded by cancelMu; runs onTimer
}

func openConn(path string, writer bool, lim Limits, schemaGen *atomic.Uint64, sizeHint, lastRowID *atomic.Int64) (*conn, error) {
	if err := registerVFS(); err != nil {
		return nil, err
	}
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var db *C.sqlite3
	flags := C.int(openReadWrite | openCreate | openNoMutex | openNoFollow)
	// unix-excl VFS: see shoal_open.
	if rc := C.shoal_open(cpath, flags, &db); rc != rcOK {
		msg := "unable to open database"
		if db != nil {
			msg = C.GoString(C.sqlite3_errmsg(db))
			C.sqlite3_close_v2(db)
		}
		return nil, fmt.Errorf("sqlexec: open: %s (code %d)", msg, int(rc))
	}
	c := &conn{
		db:        db,
		sc:        C.shoal_new_ctx(),
		writer:    writer,
		lim:       lim,
		stmts:     make(map[string]*cstmt),
		internal:  make(map[string]*C.sqlite3_stmt),
		schemaGen: schemaGen,
		sizeHint:  sizeHint,
		lastRowID: lastRowID,
		d1counts:  d1Counts(),
	}
	if err := c.setup(); err != nil {
		c.close()
		return nil, err
	}
	return c, nil
}

func (c *conn) setup() error {
	writer := C.int(0)
	if c.writer {
		writer = 1
	}
	d1c := C.int(0)
	if c.d1counts {
		d1c = 1
	}
	if rc := C.shoal_setup(c.db, c.sc, writer, d1c); rc != rcOK {
		return fmt.Errorf("sqlexec: configure connection: code %d", int(rc))
	}
	C.sqlite3_busy_timeout(c.db, 5000)
	C.sqlite3_limit(c.db, limitLength, C.int(c.lim.MaxValueBytes))
	// The per-statement SQL limit is checked on each statement's own length
	// (see runSQL): SQLite's SQL_LENGTH limit applies to the whole
	// multi-statement string handed to prepare, which is not D1's rule.
	C.sqlite3_limit(c.db, limitColumn, C.int(c.lim.MaxColumns))
	C.sqlite3_limit(c.db, limitFunctionArg, C.int(c.lim.MaxFunctionArgs))
	C.sqlite3_limit(c.db, limitAttached, 0)
	C.sqlite3_limit(c.db, limitLikePattern, C.int(c.lim.MaxLikePattern))
	C.sqlite3_limit(c.db, limitVariableNumber, C.int(c.lim.MaxParams))
	C.sqlite3_limit(c.db, limitVdbeOp, C.int(c.lim.MaxProgramOps))
	// No sorter helper threads: a query's CPU stays on its own thread,
	// which the host's per-account admission counts.
	C.sqlite3_limit(c.db, limitWorkerThreads, 0)
	c.sc.temp_limit = C.longlong(c.lim.MaxTempBytes)

	// One cgo call, no cached statements (see shoal_configure). The pragmas
	// it sets, and why:
	//   journal_mode=WAL (writer; persistent in the file, readers share it).
	//   synchronous=NORMAL (writer): in WAL mode a commit is durable against
	//     a process crash (the WAL is written before COMMIT returns) and the
	//     file can never be corrupted; only a power loss or kernel crash may
	//     lose the last transactions since the previous WAL fsync
	//     (checkpoint). FULL would fsync the WAL on every commit, capping
	//     writes at the disk's fsync rate per database; D1's own durability
	//     comes from replicating the WAL, not fsync.
	//   max_page_count (writer) = MaxDatabaseBytes / page_size.
	//   query_only=1 (readers): they can never write, even if a statement
	//     was misclassified.
	//   foreign keys on (all; D1 enforces them), through db_config.
	var ps C.longlong
	if rc := C.shoal_configure(c.db, writer, C.longlong(c.lim.MaxDatabaseBytes), &ps); rc != rcOK {
		return fmt.Errorf("sqlexec: configure connection: %s (code %d)", C.GoString(C.sqlite3_errmsg(c.db)), int(rc))
	}
	c.pageSize = int64(ps)
	return nil
}

func (c *conn) close() {
	c.cancelMu.Lock()
	if c.timer != nil {
		c.timer.Stop() // a callback still running finds nothing armed
	}
	c.cancelMu.Unlock()
	for _, s := range c.stmts {
		C.sqlite3_finalize(s.s)
	}
	for _, s := range c.internal {
		C.sqlite3_finalize(s)
	}
	c.stmts, c.internal = nil, nil
	C.sqlite3_close_v2(c.db)
	C.shoal_free_ctx(c.sc)
	if c.cells != nil {
		C.free(unsafe.Pointer(c.cells))
		c.cells = nil
	}
}

// internalStmt prepares (once) a statement of our own; the authorizer does
// not apply to it (sc.user is 0 whenever internal statements run).
func (c *conn) internalStmt(sql string) (*C.sqlite3_stmt, error) {
	if s, ok := c.internal[sql]; ok {
		return s, nil
	}
	csql := C.CString(sql)
	defer C.free(unsafe.Pointer(csql))
	var s *C.sqlite3_stmt
	var consumed C.int
	c.sc.user = 0
	if rc := C.shoal_prepare(c.db, csql, C.int(len(sql)), &s, &consumed, 1); rc != rcOK {
		return nil, fmt.Errorf("sqlexec: prepare %q: %s", sql, C.GoString(C.sqlite3_errmsg(c.db)))
	}
	c.internal[sql] = s
	return s, nil
}

func (c *conn) execInternal(sql string) error { return c.execInternalArgs(sql, nil) }

func (c *conn) queryInt(sql string) (int64, error) {
	s, err := c.internalStmt(sql)
	if err != nil {
		return 0, err
	}
	c.sc.user = 0
	rc := C.sqlite3_step(s)
	var v int64
	if rc == rcRow {
		v = int64(C.sqlite3_column_int64(s, 0))
		rc = C.sqlite3_step(s)
		for rc == rcRow {
			rc = C.sqlite3_step(s)
		}
	}
	C.sqlite3_reset(s)
	if rc != rcDone {
		return 0, c.errorFor(rc, -1)
	}
	return v, nil
}

// reqCtx bounds one request: the caller's context and the deadline from
// Limits.QueryTimeout. It replaces context.WithTimeout, whose allocations
// and cancel-tree locking showed in the point-read profile.
type reqCtx struct {
	ctx      context.Context
	deadline time.Time
}

func newReqCtx(ctx context.Context, timeout time.Duration) reqCtx {
	return reqCtx{ctx: ctx, deadline: time.Now().Add(timeout)}
}

// err returns the request's timeout or cancellation error, nil while alive.
func (r reqCtx) err() *Error {
	if !time.Now().Before(r.deadline) {
		return timeoutError()
	}
	if r.ctx.Err() != nil {
		return ctxError(r.ctx)
	}
	return nil
}

// cancelError explains an interrupted request: its deadline, its caller's
// cancellation, or else Close.
func (r reqCtx) cancelError() *Error {
	if e := r.err(); e != nil {
		return e
	}
	return &Error{Code: v4.CodeTimeout, Message: "request interrupted: the database is closing: SQLITE_INTERRUPT", Statement: -1}
}

// cancelPoll is how often a running request's context is polled for
// cancellation. Polling from the deadline timer replaces a
// context.AfterFunc per request, whose registration on the caller's context
// (a map insert and allocations) plus a new timer were ~22 % of sqlexec's
// CPU for a point read over HTTP; a canceled caller's long query now stops
// within cancelPoll.
const cancelPoll = 20 * time.Millisecond

// armCancel makes the request's deadline, or its context's end, interrupt
// this connection's current request until disarmCancel. One timer per
// connection, reset per request, checks both (see onTimer); requests that
// finish before cancelPoll never see it fire.
func (c *conn) armCancel(rq reqCtx) {
	c.cancelMu.Lock()
	c.reqGen++ // odd: a request is armed
	c.sc.cancel = 0
	c.armed = rq
	d := nextCheck(rq, time.Now())
	if c.timer == nil {
		c.timer = time.AfterFunc(d, c.onTimer)
	} else {
		c.timer.Reset(d)
	}
	c.cancelMu.Unlock()
}

// disarmCancel ends armCancel's watch; a timer callback already running
// finds nothing armed (or the next request, whose own deadline and context
// it checks), so it never interrupts the wrong request.
func (c *conn) disarmCancel() {
	c.cancelMu.Lock()
	c.timer.Stop()
	c.reqGen++
	c.sc.cancel = 0
	c.armed = reqCtx{}
	c.cancelMu.Unlock()
}

func nextCheck(rq reqCtx, now time.Time) time.Duration {
	d := rq.deadline.Sub(now)
	if rq.ctx.Done() != nil && d > cancelPoll {
		d = cancelPoll
	}
	return d
}

// onTimer interrupts the armed request if its deadline passed or its
// context ended, and otherwise checks again later.
func (c *conn) onTimer() {
	c.cancelMu.Lock()
	defer c.cancelMu.Unlock()
	if c.reqGen%2 == 0 {
		return // nothing armed
	}
	now := time.Now()
	if !now.Before(c.armed.deadline) || c.armed.ctx.Err() != nil {
		// The flag is read by the progress handler (it survives the
		// reset of sqlite3_interrupt's flag between statements);
		// sqlite3_interrupt also stops work inside long opcodes.
		c.sc.cancel = 1
		C.sqlite3_interrupt(c.db)
		return
	}
	c.timer.Reset(nextCheck(c.armed, now))
}

// interrupt stops whatever the connection is running now (used by Close).
func (c *conn) interrupt() {
	c.cancelMu.Lock()
	defer c.cancelMu.Unlock()
	if c.reqGen%2 == 1 { // a request is armed
		c.sc.cancel = 1
		C.sqlite3_interrupt(c.db)
	}
}

func (c *conn) canceled() bool {
	c.cancelMu.Lock()
	defer c.cancelMu.Unlock()
	return c.sc.cancel != 0
}

// errorFor turns the connection's last error into an *Error with D1's
// message shape: SQLite's text, then the result code name.
func (c *conn) errorFor(rc C.int, stmtIdx int) *Error {
	prim := int(rc) & 0xff
	msg := C.GoString(C.sqlite3_errmsg(c.db))
	e := &Error{Code: v4.CodeSQL, Statement: stmtIdx}
	if prim == 1 && msg == "no such function: load_extension" {
		// D1 lists load_extension and refuses to run it; its answer.
		return &Error{Code: v4.CodeSQL, Statement: stmtIdx, Message: "not authorized: SQLITE_ERROR"}
	}
	if c.sc.absent_fn[0] != 0 {
		// A function this build has and D1's does not: D1's answer.
		msg = "no such function: " + C.GoString(&c.sc.absent_fn[0])
		c.sc.absent_fn[0] = 0
	}
	// Like D1 (workerd's dbErrorMessage): where SQLite knows the offset
	// of the error in the SQL text, the message says so.
	if off := int(C.sqlite3_error_offset(c.db)); off >= 0 {
		msg += " at offset " + strconv.Itoa(off)
	}
	switch prim {
	case rcAuth:
		if c.sc.txn_denied != 0 {
			e.Code = v4.CodeTransactionDenied
			e.Message = TransactionMessage
			return e
		}
		// D1 says "not authorized: SQLITE_AUTH" and nothing more; the
		// authorizer's reason goes to Detail.
		e.Detail = C.GoString(&c.sc.reason[0])
	case rcTooBig:
		e.Code = v4.CodeTooLarge
	case rcFull:
		switch c.sc.temp_full {
		case 1: // this query's temporary files (vfs.c)
			return &Error{Code: v4.CodeTooLarge, Statement: stmtIdx, Message: fmt.Sprintf(TempTooLargeMessage, c.lim.MaxTempBytes)}
		case 2: // the host's
			return &Error{Code: v4.CodeOverloaded, Statement: stmtIdx, Message: TempHostFullMessage}
		}
		e.Code = v4.CodeStorageLimit
		msg = "database size limit reached: " + msg
	case rcInterrupt:
		e.Code = v4.CodeTimeout
		msg = "query exceeded its time limit and was interrupted: " + msg
	}
	e.Message = msg + ": " + rcName(prim)
	// Like D1: a constraint (or other) failure with a more precise
	// extended code names it too.
	if ext := int(C.sqlite3_extended_errcode(c.db)); ext != prim && ext&0xff == prim {
		if name := extendedName(ext); name != "" {
			e.Message += " (extended: " + name + ")"
		}
	}
	return e
}

// extendedName is SQLite's name for an extended result code ("" for codes
// not listed).
func extendedName(ext int) string {
	switch ext {
	case 275:
		return "SQLITE_CONSTRAINT_CHECK"
	case 531:
		return "SQLITE_CONSTRAINT_COMMITHOOK"
	case 787:
		return "SQLITE_CONSTRAINT_FOREIGNKEY"
	case 1043:
		return "SQLITE_CONSTRAINT_FUNCTION"
	case 1299:
		return "SQLITE_CONSTRAINT_NOTNULL"
	case 1555:
		return "SQLITE_CONSTRAINT_PRIMARYKEY"
	case 1811:
		return "SQLITE_CONSTRAINT_TRIGGER"
	case 2067:
		return "SQLITE_CONSTRAINT_UNIQUE"
	case 2323:
		return "SQLITE_CONSTRAINT_VTAB"
	case 2579:
		return "SQLITE_CONSTRAINT_ROWID"
	case 2835:
		return "SQLITE_CONSTRAINT_PINNED"
	case 3091:
		return "SQLITE_CONSTRAINT_DATATYPE"
	case 257:
		return "SQLITE_ERROR_MISSING_COLLSEQ"
	case 513:
		return "SQLITE_ERROR_RETRY"
	case 516:
		return "SQLITE_ABORT_ROLLBACK"
	case 264:
		return "SQLITE_READONLY_RECOVERY"
	}
	return ""
}

func rcName(rc int) string {
	names := [...]string{
		0: "SQLITE_OK", 1: "SQLITE_ERROR", 2: "SQLITE_INTERNAL", 3: "SQLITE_PERM", 4: "SQLITE_ABORT",
		5: "SQLITE_BUSY", 6: "SQLITE_LOCKED", 7: "SQLITE_NOMEM", 8: "SQLITE_READONLY", 9: "SQLITE_INTERRUPT",
		10: "SQLITE_IOERR", 11: "SQLITE_CORRUPT", 12: "SQLITE_NOTFOUND", 13: "SQLITE_FULL", 14: "SQLITE_CANTOPEN",
		15: "SQLITE_PROTOCOL", 16: "SQLITE_EMPTY", 17: "SQLITE_SCHEMA", 18: "SQLITE_TOOBIG", 19: "SQLITE_CONSTRAINT",
		20: "SQLITE_MISMATCH", 21: "SQLITE_MISUSE", 22: "SQLITE_NOLFS", 23: "SQLITE_AUTH", 24: "SQLITE_FORMAT",
		25: "SQLITE_RANGE", 26: "SQLITE_NOTADB", 27: "SQLITE_NOTICE", 28: "SQLITE_WARNING",
	}
	if rc >= 0 && rc < len(names) && names[rc] != "" {
		return names[rc]
	}
	return fmt.Sprintf("SQLITE_%d", rc)
}

func sqlErr(code int, stmtIdx int, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...), Statement: stmtIdx}
}

// prepare returns the cached statement for sql (the remainder of a
// statement string) or prepares one with the authorizer armed. s == nil with
// a nil error means sql holds no statement (whitespace, comments, ';').
func (c *conn) prepare(sql string, stmtIdx int) (*cstmt, error) {
	if cs, ok := c.stmts[sql]; ok {
		if !c.d1counts || cs.s == nil || cs.prepGen == c.schemaGen.Load() && cs.prepDDL == c.ddlRuns {
			return cs, nil
		}
		// The schema changed since it was prepared: prepare it again
		// here rather than let sqlite3_step re-prepare it, which leaves
		// some instructions' execution counts uninitialised (shim.c,
		// count_ops) and would spoil rows read/written for that run.
		C.sqlite3_finalize(cs.s)
		delete(c.stmts, sql)
	}
	c.sc.user = 1
	c.sc.txn_denied = 0
	c.sc.defer_fk = 0
	c.sc.ddl = 0
	c.sc.grows = 0
	if startsWithKeyword(sql, "ANALYZE") {
		// ANALYZE rewrites sqlite_stat1 through nested statements that the
		// authorizer sees before the SQLITE_ANALYZE action itself.
		c.sc.ddl = 1
	}
	c.sc.reason[0] = 0
	c.sc.absent_fn[0] = 0
	var s *C.sqlite3_stmt
	var consumed C.int
	p := (*C.char)(unsafe.Pointer(unsafe.StringData(sql)))
	cacheable := len(sql) <= maxCachedSQLLen && !c.scriptNoCache
	persist := C.int(0)
	if cacheable {
		persist = 1
	}
	rc := C.shoal_prepare(c.db, p, C.int(len(sql)), &s, &consumed, persist)
	if rc&0xff == rcNoMem {
		// SQLite reports a program over SQLITE_LIMIT_VDBE_OP as an
		// allocation failure; nothing else allocates unbounded memory
		// while preparing.
		return nil, sqlErr(v4.CodeTooLarge, stmtIdx, ProgramTooLargeMessage, c.lim.MaxProgramOps)
	}
	if rc != rcOK {
		return nil, c.errorFor(rc, stmtIdx)
	}
	if s == nil {
		return &cstmt{consumed: int(consumed)}, nil
	}
	if c.d1counts {
		C.shoal_counts_zero(s) // SQLite leaves some uninitialised (shim.c)
	}
	maxSQL := c.lim.MaxSQLBytes
	if c.scriptSQLBytes > 0 {
		maxSQL = c.scriptSQLBytes
	}
	if n := len(strings.TrimSpace(sql[:consumed])); n > maxSQL {
		C.sqlite3_finalize(s)
		return nil, sqlErr(v4.CodeTooLarge, stmtIdx, "statement too long: %d bytes, the limit is %d: SQLITE_TOOBIG", n, maxSQL)
	}
	cs := &cstmt{
		s:        s,
		prepGen:  c.schemaGen.Load(),
		prepDDL:  c.ddlRuns,
		consumed: int(consumed),
		readonly: C.sqlite3_stmt_readonly(s) != 0,
		ddl:      c.sc.ddl != 0,
		grows:    c.sc.grows != 0 && C.sqlite3_stmt_isexplain(s) == 0,
		deferFK:  c.sc.defer_fk != 0,
		nparams:  int(C.sqlite3_bind_parameter_count(s)),
	}
	if cs.readonly && containsFold(sql[:consumed], "count") {
		c.sc.user = 0 // EXPLAIN only lists the program the authorizer already saw
		cs.simpleCount = C.shoal_simple_count(c.db, p, consumed) != 0
		c.sc.user = 1
	}
	if cacheable {
		if len(c.stmts) >= stmtCacheSize {
			// Evict everything: simple, and a working set larger than the
			// cache is not the case we optimise for.
			for _, old := range c.stmts {
				C.sqlite3_finalize(old.s)
			}
			clear(c.stmts)
		}
		c.stmts[strings.Clone(sql)] = cs
	}
	return cs, nil
}

// release finalizes a statement that was not cached.
func (c *conn) release(sql string, cs *cstmt) {
	if cs.s == nil {
		return
	}
	if cached, ok := c.stmts[sql]; ok && cached == cs {
		C.sqlite3_reset(cs.s)
		return
	}
	C.sqlite3_finalize(cs.s)
}

func (c *conn) columns(cs *cstmt) []string {
	gen := c.schemaGen.Load()
	n := int(C.sqlite3_column_count(cs.s))
	if cs.cols != nil && cs.colsGen == gen && len(cs.cols) == n {
		return cs.cols
	}
	cols := make([]string, n)
	for i := range cols {
		cols[i] = C.GoString(C.sqlite3_column_name(cs.s, C.int(i)))
	}
	cs.cols, cs.colsGen = cols, gen
	return cols
}

func (c *conn) ensureCells(n int) {
	if n <= c.ncells {
		return
	}
	if c.cells != nil {
		C.free(unsafe.Pointer(c.cells))
	}
	c.cells = (*C.shoal_cell)(C.calloc(C.size_t(n), C.size_t(unsafe.Sizeof(C.shoal_cell{}))))
	c.ncells = n
}

func (c *conn) bind(cs *cstmt, params []param, stmtIdx int) error {
	if len(params) != cs.nparams {
		// D1 binds exactly as many values as the statement takes.
		return sqlErr(v4.CodeSQL, stmtIdx, WrongParamsMessage)
	}
	if cs.nparams == 0 {
		return nil
	}
	C.sqlite3_clear_bindings(cs.s)
	for i, p := range params {
		idx := C.int(i + 1)
		var rc C.int
		switch p.kind {
		case paramNull:
			rc = C.sqlite3_bind_null(cs.s, idx)
		case paramInt:
			rc = C.sqlite3_bind_int64(cs.s, idx, C.sqlite3_int64(p.i))
		case paramFloat:
			rc = C.sqlite3_bind_double(cs.s, idx, C.double(p.f))
		case paramText:
			rc = C.shoal_bind_text(cs.s, idx, (*C.char)(unsafe.Pointer(unsafe.StringData(p.s))), C.int(len(p.s)))
		case paramBlob:
			var ptr unsafe.Pointer
			if len(p.b) > 0 {
				ptr = unsafe.Pointer(&p.b[0])
			}
			rc = C.shoal_bind_blob(cs.s, idx, ptr, C.int(len(p.b)))
		}
		if rc != rcOK {
			return c.errorFor(rc, stmtIdx)
		}
	}
	return nil
}

// isBlank reports whether s holds no SQL: only whitespace, comments and
// semicolons. It decides whether a statement string holds more than one
// statement without preparing the rest (which may depend on the first).
func isBlank(s string) bool {
	for i := 0; i < len(s); {
		switch ch := s[i]; {
		case ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\f' || ch == '\v' || ch == ';':
			i++
		case ch == '-' && i+1 < len(s) && s[i+1] == '-':
			j := strings.IndexByte(s[i:], '\n')
			if j < 0 {
				return true
			}
			i += j + 1
		case ch == '/' && i+1 < len(s) && s[i+1] == '*':
			j := strings.Index(s[i+2:], "*/")
			if j < 0 {
				return true // an unterminated comment runs to the end
			}
			i += j + 4
		default:
			return false
		}
	}
	return true
}

// startsWithKeyword reports whether the first token of sql (after
// whitespace and comments) is kw, case-insensitively.
func startsWithKeyword(sql, kw string) bool {
	for i := 0; i < len(sql); {
		switch ch := sql[i]; {
		case ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\f' || ch == '\v' || ch == ';':
			i++
		case ch == '-' && i+1 < len(sql) && sql[i+1] == '-':
			j := strings.IndexByte(sql[i:], '\n')
			if j < 0 {
				return false
			}
			i += j + 1
		case ch == '/' && i+1 < len(sql) && sql[i+1] == '*':
			j := strings.Index(sql[i+2:], "*/")
			if j < 0 {
				return false
			}
			i += j + 4
		default:
			rest := sql[i:]
			if len(rest) < len(kw) || !strings.EqualFold(rest[:len(kw)], kw) {
				return false
			}
			if len(rest) == len(kw) {
				return true
			}
			c := rest[len(kw)]
			return !(c == '_' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= 0x80)
		}
	}
	return false
}

// reqState is what one request needs while it runs on a connection.
type reqState struct {
	base      Meta
	classify  func(sql string, readonly bool)
	sizeKnown bool
	size      int64
	ddl       bool
	deferFK   bool
	// storageFull is Request.StorageFull: statements that grow (cstmt.grows)
	// are refused before they run.
	storageFull bool
	// readOnly is Request.ReadOnly: a statement SQLite compiled as writing
	// is refused before it runs.
	readOnly  bool
	stmtIdx   int
	discard   bool // keep no result rows (scripts)
	jsNumbers bool // Request.JSNumbers
	encode    bool // Request.Encode
	lease     *ResultLease
	// resultBytes is the request's results so far (exact when encoding, an
	// estimate otherwise), against Limits.MaxResultBytes.
	resultBytes int64
	// speculative: a reader runs SQL not known to be read-only (see
	// Execute); a statement it cannot prepare goes to the writer, whose
	// view of the schema may differ (a script's tables).
	speculative bool
}

// decodeParams decodes every parameter before the database is touched.
// The slices returned are the connection's scratch (two allocations per
// request before): valid until the next decodeParams on this connection,
// whose callers (run, runInSavepoint) are done with them by then, and
// cleared by releaseParams so no value outlives its request.
func (c *conn) decodeParams(req *Request) ([][]param, error) {
	n := len(req.Statements)
	if cap(c.paramSlices) < n {
		c.paramSlices = make([][]param, n)
	}
	params := c.paramSlices[:n]
	clear(params)
	vals := c.paramVals[:0]
	for i, s := range req.Statements {
		if len(s.Params) > c.lim.MaxParams {
			return nil, sqlErr(v4.CodeTooLarge, i, "too many SQL variables: %d bound parameters, the limit is %d: SQLITE_ERROR", len(s.Params), c.lim.MaxParams)
		}
		if len(s.Params) == 0 {
			continue
		}
		start := len(vals)
		for j, raw := range s.Params {
			p, err := decodeParam(raw)
			if err != nil {
				return nil, &Error{Code: v4.CodeInvalidRequest, Message: fmt.Sprintf("statement %d param %d: %s", i, j, err.Error()), Statement: i}
			}
			vals = append(vals, p)
		}
		// Full slice expression: a later statement's appends (which may
		// move vals) never write into this one's values.
		params[i] = vals[start:len(vals):len(vals)]
	}
	c.paramVals = vals
	return params, nil
}

// maxKeptParams bounds the parameter values a connection keeps room for
// between requests.
const maxKeptParams = 1024

// releaseParams forgets the last request's parameter values (their strings
// and blobs are not kept alive by the scratch).
func (c *conn) releaseParams() {
	clear(c.paramVals[:cap(c.paramVals)])
	clear(c.paramSlices[:cap(c.paramSlices)])
	if cap(c.paramVals) > maxKeptParams {
		c.paramVals = nil
	}
	if cap(c.paramSlices) > maxKeptParams {
		c.paramSlices = nil
	}
}

// run executes a request as its own transaction (reader connections). On
// any error the transaction is rolled back and no result is returned.
func (c *conn) run(rq reqCtx, req *Request, st *reqState) ([]StatementResult, error) {
	defer c.releaseParams()
	params, err := c.decodeParams(req)
	if err != nil {
		return nil, err
	}
	if len(req.Statements) == 1 && c.singleCached(req.Statements[0].SQL) {
		// One statement: SQLite's implicit transaction is the snapshot, and
		// BEGIN/COMMIT would be two more statements per point read.
		return c.body(rq, req, params, st)
	}
	if err := c.execInternal("BEGIN"); err != nil {
		return nil, err
	}
	results, err := c.body(rq, req, params, st)
	if err != nil {
		_ = c.execInternal("ROLLBACK")
		return nil, err
	}
	if err := c.execInternal("COMMIT"); err != nil {
		_ = c.execInternal("ROLLBACK")
		return nil, err
	}
	return results, nil
}

// Messages of the storage refusals (code v4.CodeStorageLimit). They name the
// limit that applies: the account's total storage, or this database's size.
const (
	AccountStorageLimitMessage = "storage limit exceeded: the account is over its storage limit, so statements that add data or schema (INSERT, REPLACE, CREATE, ALTER, or an UPDATE that grows the database) are refused; reads, DELETE and DROP still work: SQLITE_FULL"
	DatabaseSizeLimitMessage   = "database size limit exceeded: the database has reached its maximum size, so writes that grow it are refused; reads, DELETE and DROP still work: SQLITE_FULL"
)

// ReadOnlyMessage is the refusal of a writing statement in a read-only
// request (a D1 Read token).
const ReadOnlyMessage = "not authorized: the API token is read-only (D1 Read), and this statement writes to the database: SQLITE_AUTH"

func accountStorageErr(idx int) error {
	return sqlErr(v4.CodeStorageLimit, idx, AccountStorageLimitMessage)
}

// singleCached reports whether sql is known (cached) to hold exactly one
// statement.
func (c *conn) singleCached(sql string) bool {
	cs, ok := c.stmts[sql]
	return ok && cs.s != nil && isBlank(sql[cs.consumed:])
}

// body runs a request's statements inside an open transaction (or, on the
// writer, a savepoint). On error the caller rolls back.
func (c *conn) body(rq reqCtx, req *Request, params [][]param, st *reqState) (results []StatementResult, err error) {
	c.armCancel(rq)
	defer c.disarmCancel()
	defer C.shoal_clear_recs(c.sc)
	if e := rq.err(); e != nil {
		return nil, e
	}
	st.storageFull = req.StorageFull
	st.readOnly = req.ReadOnly
	st.jsNumbers = req.JSNumbers
	st.encode = req.Encode
	st.lease = req.Lease
	st.resultBytes = 0
	c.sc.temp_full = 0
	checkPages := (req.BlockGrowth || req.StorageFull) && c.writer
	var pagesBefore int64
	if checkPages {
		if pagesBefore, err = c.queryInt("PRAGMA page_count"); err != nil {
			return nil, err
		}
	}
	results = make([]StatementResult, 0, len(req.Statements))
	for i := range req.Statements {
		results, err = c.runSQL(rq, req, i, params[i], st, results)
		if err != nil {
			return nil, err
		}
	}
	if checkPages {
		after, err := c.queryInt("PRAGMA page_count")
		if err != nil {
			return nil, err
		}
		if after > pagesBefore {
			if req.StorageFull {
				return nil, accountStorageErr(-1)
			}
			return nil, sqlErr(v4.CodeStorageLimit, -1, DatabaseSizeLimitMessage)
		}
	}
	if c.writer && C.shoal_deferred_fks(c.db) != 0 {
		// Deferred foreign keys are checked at COMMIT, which the writer
		// shares among a group of requests: check this request's here so
		// its violation fails it alone. Earlier requests of the group
		// ended with none, so any outstanding now are this request's.
		return nil, sqlErr(v4.CodeSQL, -1, "FOREIGN KEY constraint failed: SQLITE_CONSTRAINT (extended: SQLITE_CONSTRAINT_FOREIGNKEY)")
	}
	if c.canceled() {
		return nil, rq.cancelError()
	}
	return results, nil
}

// runSQL runs the statements of one statement string, splitting it with
// prepare's tail so each gets its own result.
func (c *conn) runSQL(rq reqCtx, req *Request, i int, params []param, st *reqState, results []StatementResult) ([]StatementResult, error) {
	sql := req.Statements[i].SQL
	if isBlank(sql) {
		return results, sqlErr(v4.CodeSQL, st.stmtIdx, NoStatementMessage)
	}
	allReadonly := true
	rest := sql
	for !isBlank(rest) {
		if c.canceled() {
			return results, rq.cancelError()
		}
		cs, err := c.prepare(rest, st.stmtIdx)
		if err != nil {
			if st.speculative && !c.writer {
				return results, errNeedWriter
			}
			return results, err
		}
		if cs.s == nil { // trailing text SQLite treats as blank (comments)
			if cs.consumed <= 0 {
				break
			}
			rest = rest[cs.consumed:]
			continue
		}
		key := rest
		rest = rest[cs.consumed:]
		// Params bind to the last statement of a string, as D1 does; the
		// ones before it may not take any.
		stmtParams := params
		if !isBlank(rest) {
			if cs.nparams > 0 {
				c.release(key, cs)
				return results, sqlErr(v4.CodeSQL, st.stmtIdx, MultiParamsMessage)
			}
			stmtParams = nil
		}
		if !cs.readonly {
			allReadonly = false
			if !c.writer {
				c.release(key, cs)
				if st.classify != nil {
					st.classify(sql, false)
				}
				return results, errNeedWriter
			}
		}
		if cs.deferFK {
			st.deferFK = true
		}
		res, err := c.exec(rq, cs, stmtParams, req.Raw, st)
		c.release(key, cs)
		if err != nil {
			return results, err
		}
		results = append(results, res)
		st.stmtIdx++
	}
	if st.classify != nil {
		st.classify(sql, allReadonly)
	}
	return results, nil
}

// exec binds and runs one prepared statement and builds its meta.
func (c *conn) exec(rq reqCtx, cs *cstmt, params []param, raw bool, st *reqState) (StatementResult, error) {
	idx := st.stmtIdx
	if err := c.bind(cs, params, idx); err != nil {
		return StatementResult{}, err
	}
	var reservedBefore int64
	if cs.ddl {
		st.ddl = true
		n, err := c.reservedObjects()
		if err != nil {
			return StatementResult{}, err
		}
		reservedBefore = n
	}
	totalBefore := int64(C.sqlite3_total_changes64(c.db))
	if c.writer {
		C.shoal_clear_recs(c.sc)
		if !st.sizeKnown && c.sizeHint.Load() == 0 {
			// Not measured since the database was opened: changed_db
			// needs the size this statement starts from.
			size, err := c.usedBytes()
			if err != nil {
				return StatementResult{}, err
			}
			c.sizeHint.Store(size)
		}
	}
	start := time.Now()
	if st.storageFull && cs.grows {
		return StatementResult{}, accountStorageErr(idx)
	}
	if st.readOnly && !cs.readonly {
		return StatementResult{}, sqlErr(v4.CodeForbidden, idx, ReadOnlyMessage)
	}
	c.sc.user = 1
	c.sc.ddl = 0 // the authorizer sets it again if the statement is re-prepared
	if cs.ddl {
		c.sc.ddl = 1
	}
	c.sc.grows = 0 // likewise: a re-prepare (a new trigger) may make it grow
	out, count, err := c.stepAll(cs, raw, idx, st)
	c.sc.user = 0
	if cs.ddl {
		c.ddlRuns++
	}
	if err == nil && st.storageFull && c.sc.grows != 0 && C.sqlite3_stmt_isexplain(cs.s) == 0 {
		// Re-prepared after a schema change into a growing statement: it
		// ran inside the request's transaction, which the error rolls back.
		C.sqlite3_reset(cs.s)
		return StatementResult{}, accountStorageErr(idx)
	}
	elapsed := time.Since(start)
	stats := &c.stats
	d1c := C.int(0)
	if c.d1counts {
		d1c = 1
	}
	C.shoal_stmt_done(c.db, cs.s, d1c, C.longlong(totalBefore), stats) // also resets the counters
	if err != nil {
		C.sqlite3_reset(cs.s)
		if c.canceled() {
			return StatementResult{}, rq.cancelError()
		}
		return StatementResult{}, err
	}
	if cs.ddl {
		n, err := c.reservedObjects()
		if err != nil {
			return StatementResult{}, err
		}
		if n > reservedBefore {
			return StatementResult{}, sqlErr(v4.CodeSQL, idx, "not authorized: names starting with _cf_ or _shoal_ are reserved: SQLITE_AUTH")
		}
	}
	m := st.base
	ms := float64(elapsed.Nanoseconds()) / 1e6
	m.Duration = ms
	m.Timings.SQLDurationMs = ms
	m.RowsRead = int64(stats.rows_read)
	if cs.simpleCount {
		m.RowsRead += count
	}
	// D1's changes: every row the statement changed, including those of
	// its triggers, foreign-key actions and FTS5's shadow tables (the
	// difference of total_changes around it).
	m.Changes = int64(stats.total_changes) - totalBefore
	// D1 reports the connection's last_insert_rowid on every statement,
	// reads included; readers report the writer's.
	lastBefore := c.lastRowID.Load()
	if c.writer {
		m.LastRowID = int64(stats.last_rowid)
		c.lastRowID.Store(m.LastRowID)
	} else {
		m.LastRowID = lastBefore
	}
	sizeBefore := st.size
	if !st.sizeKnown {
		sizeBefore = c.sizeHint.Load()
	}
	if c.writer && !cs.readonly {
		if stats.rows_written >= 0 {
			m.RowsWritten = int64(stats.rows_written)
		} else {
			w, err := c.rowsWritten()
			if err != nil {
				return StatementResult{}, err
			}
			m.RowsWritten = w
		}
		st.sizeKnown = false
	}
	if !st.sizeKnown {
		if !c.writer && c.sizeHint.Load() > 0 {
			// Readers take the size the writer last saw instead of asking
			// SQLite: a read does not change it, and it saves a statement.
			st.size = c.sizeHint.Load()
		} else {
			size, err := c.usedBytes()
			if err != nil {
				return StatementResult{}, err
			}
			st.size = size
			c.sizeHint.Store(st.size)
		}
		st.sizeKnown = true
	}
	m.SizeAfter = st.size
	// D1's changed_db: the statement changed rows, last_row_id or the
	// database's size.
	m.ChangedDB = m.Changes != 0 || m.LastRowID != lastBefore || m.SizeAfter != sizeBefore
	return StatementResult{Results: out, Success: true, Meta: m}, nil
}

// usedBytes is D1's size_after: the database's pages less its free pages
// (page_count - freelist_count) times the page size, so a DROP shrinks it
// although the file keeps its length until VACUUM.
func (c *conn) usedBytes() (int64, error) {
	if c.pageSize == 0 { // a reader: shoal_configure reads the page size for the writer only
		ps, err := c.queryInt("PRAGMA page_size")
		if err != nil {
			return 0, err
		}
		c.pageSize = ps
	}
	pages, err := c.internalStmt("PRAGMA page_count")
	if err != nil {
		return 0, err
	}
	free, err := c.internalStmt("PRAGMA freelist_count")
	if err != nil {
		return 0, err
	}
	c.sc.user = 0
	var rc C.int
	n := C.shoal_used_pages(pages, free, &rc)
	if rc != rcOK {
		return 0, c.errorFor(rc, -1)
	}
	return int64(n) * c.pageSize, nil
}

// containsFold reports whether s contains the ASCII lower-case word w in
// any letter case.
func containsFold(s, w string) bool {
	for i := 0; i+len(w) <= len(s); i++ {
		if strings.EqualFold(s[i:i+len(w)], w) {
			return true
		}
	}
	return false
}

// reservedObjects counts schema objects with reserved names, so DDL that
// creates one indirectly (ALTER TABLE … RENAME TO _cf_x, or a virtual
// table's shadow tables) is caught and rolled back.
func (c *conn) reservedObjects() (int64, error) {
	return c.queryInt(`SELECT count(*) FROM sqlite_schema WHERE name LIKE '\_cf\_%' ESCAPE '\' OR name LIKE '\_shoal\_%' ESCAPE '\'`)
}

func timeoutError() *Error {
	return &Error{Code: v4.CodeTimeout, Message: "query exceeded its time limit and was interrupted: SQLITE_INTERRUPT", Statement: -1}
}

func ctxError(ctx context.Context) *Error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return timeoutError()
	}
	return &Error{Code: v4.CodeTimeout, Message: "request canceled: SQLITE_INTERRUPT", Statement: -1}
}
