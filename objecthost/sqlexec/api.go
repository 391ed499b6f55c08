package sqlexec

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	v4 "github.com/shoaldb/shoal/internal/v4"
)

// Limits are the per-database limits D1 documents. Each one, when exceeded,
// fails the whole request with an *Error and leaves the database unchanged.
type Limits struct {
	MaxParams        int           // bound parameters per statement (D1: 100)
	MaxSQLBytes      int           // bytes per SQL statement (D1: 100 KB)
	MaxValueBytes    int           // string/BLOB/row size, SQLITE_LIMIT_LENGTH (D1: 2 MB)
	MaxColumns       int           // columns per table / result, SQLITE_LIMIT_COLUMN (D1: 100)
	MaxLikePattern   int           // LIKE/GLOB pattern bytes (D1: 50)
	MaxFunctionArgs  int           // arguments per SQL function (D1: 32)
	QueryTimeout     time.Duration // per request, enforced with sqlite3_interrupt (D1: 30 s)
	MaxDatabaseBytes int64         // per database, enforced with max_page_count (D1: 10 GB)
	MaxQueue         int           // pending requests per database before CodeOverloaded
	// MaxResultBytes bounds a request's results, all statements together,
	// as the JSON the host answers with (D1: 50 MB). A request whose
	// results would exceed it fails with CodeTooLarge
	// (ResultTooLargeMessage) as soon as the limit is crossed, before the
	// rest of the rows are read: never a partial answer.
	MaxResultBytes int64
	// MaxTempBytes bounds the temporary files one request may hold open
	// at once (sorter runs, temporary b-trees of UNION, DISTINCT, IN,
	// materialized and recursive CTEs, statement journals): a write past
	// it fails the request with CodeTooLarge (TempTooLargeMessage). The
	// host-wide cap is SetTempSpaceLimit.
	MaxTempBytes int64
	// MaxProgramOps bounds the size of one prepared statement's program
	// (SQLITE_LIMIT_VDBE_OP): a statement that expands into more
	// instructions (CTEs inlined into each other, say) fails to prepare
	// instead of taking the memory and CPU to build it.
	MaxProgramOps int
}

// DefaultLimits returns D1's Workers Paid limits.
func DefaultLimits() Limits {
	return Limits{
		MaxParams:        100,
		MaxSQLBytes:      100_000,
		MaxValueBytes:    2_000_000,
		MaxColumns:       100,
		MaxLikePattern:   50,
		MaxFunctionArgs:  32,
		QueryTimeout:     30 * time.Second,
		MaxDatabaseBytes: 10_000_000_000,
		MaxQueue:         64,
		MaxResultBytes:   50_000_000,
		MaxTempBytes:     512 << 20,
		MaxProgramOps:    1_000_000,
	}
}

// withDefaults fills zero fields with DefaultLimits so a partly filled Limits
// (common in tests) never means "no limit".
func (l Limits) withDefaults() Limits {
	d := DefaultLimits()
	if l.MaxParams <= 0 {
		l.MaxParams = d.MaxParams
	}
	if l.MaxSQLBytes <= 0 {
		l.MaxSQLBytes = d.MaxSQLBytes
	}
	if l.MaxValueBytes <= 0 {
		l.MaxValueBytes = d.MaxValueBytes
	}
	if l.MaxColumns <= 0 {
		l.MaxColumns = d.MaxColumns
	}
	if l.MaxLikePattern <= 0 {
		l.MaxLikePattern = d.MaxLikePattern
	}
	if l.MaxFunctionArgs <= 0 {
		l.MaxFunctionArgs = d.MaxFunctionArgs
	}
	if l.QueryTimeout <= 0 {
		l.QueryTimeout = d.QueryTimeout
	}
	if l.MaxDatabaseBytes <= 0 {
		l.MaxDatabaseBytes = d.MaxDatabaseBytes
	}
	if l.MaxQueue <= 0 {
		l.MaxQueue = d.MaxQueue
	}
	if l.MaxResultBytes <= 0 {
		l.MaxResultBytes = d.MaxResultBytes
	}
	if l.MaxTempBytes <= 0 {
		l.MaxTempBytes = d.MaxTempBytes
	}
	if l.MaxProgramOps <= 0 {
		l.MaxProgramOps = d.MaxProgramOps
	}
	return l
}

// Options configure Open.
type Options struct {
	Limits Limits
	// ReadConns is the number of read-only connections that run read-only
	// requests concurrently with the single writer (WAL). 0 means 4; a
	// negative value means none (every request goes to the writer). They
	// are opened lazily, by reads that find none idle.
	ReadConns int
	// Region and Host fill meta.served_by_region and meta.served_by_colo.
	Region, Host string
	// CommitHook, when set, is attached by Open itself, as SetCommitHook
	// would attach it with HookAttach as its attach function, but on the
	// opening goroutine before the writer goroutine starts: no request can
	// be queued yet, and a cold open costs no round trip to the writer
	// (what SetCommitHook costs). If HookAttach fails, Open fails and
	// closes what it opened.
	CommitHook CommitHook
	HookAttach func(HookConn) error
}

// Request is one D1 /query or /raw call: its statements run in order as one
// transaction.
type Request struct {
	Statements []Statement
	// Raw selects the /raw result shape (RawResults) instead of row objects.
	Raw bool
	// BlockGrowth is set while the database is at its size limit: a request
	// that grows the database file is rolled back with CodeStorageLimit
	// (DatabaseSizeLimitMessage); reads, DELETE and DROP still work.
	BlockGrowth bool
	// StorageFull is set while the account is over its storage limit: any
	// statement that adds rows or schema (INSERT, REPLACE, upsert, CREATE
	// TABLE/INDEX/VIEW/TRIGGER, ALTER TABLE, also when a trigger of the
	// statement inserts) is refused before it runs, even if it would fit in
	// free pages, and so is a request that grows the file (an UPDATE that
	// enlarges rows); reads, UPDATE that fits, DELETE and DROP work. The
	// refusal is CodeStorageLimit with AccountStorageLimitMessage.
	StorageFull bool
	// ReadOnly refuses, before it runs, every statement SQLite compiled as
	// writing (sqlite3_stmt_readonly: the program, not the SQL text; a
	// write through a trigger or a writing PRAGMA counts), with
	// CodeForbidden and ReadOnlyMessage. Set for D1 Read tokens.
	ReadOnly bool
	// JSNumbers renders integers outside ±2^53 as the nearest double, the
	// way D1 (through JavaScript) returns them: 9007199254740993 comes back
	// as 9007199254740992. Off by default: Shoal returns every 64-bit
	// integer exactly (docs/d1-compatibility.md).
	JSNumbers bool
	// Encode makes each statement's Results an Encoded: its JSON, written
	// while the statement steps, instead of Rows or *RawResults. The bytes
	// are what AppendResults writes for the other form; a request then
	// holds its results once, as the answer's bytes, and is measured
	// exactly against Limits.MaxResultBytes. The object host's HTTP path
	// sets it.
	Encode bool
	// Lease, when set with Encode, is charged for the encoded bytes beyond
	// the budget's free allowance; a charge the budget cannot cover fails
	// the request with CodeOverloaded (ResultMemoryMessage). The caller
	// releases the lease once it no longer holds the results.
	Lease *ResultLease
}

// Encoded is one statement's results as JSON (Request.Encode): a /query
// statement's array of row objects, or a /raw statement's
// {"columns":[…],"rows":[…]}. It marshals as itself.
type Encoded []byte

// MarshalJSON returns e unchanged.
func (e Encoded) MarshalJSON() ([]byte, error) {
	if e == nil {
		return []byte("null"), nil
	}
	return e, nil
}

// Statement is one SQL string with its JSON-encoded parameters. The SQL may
// hold several ';'-separated statements; params then apply only when it holds
// exactly one (see Execute). It must be UTF-8 without NUL (a NUL inside a
// string parameter is fine: parameters are bound, not parsed).
type Statement struct {
	SQL    string
	Params []json.RawMessage
}

// StatementResult is one entry of D1's result array.
type StatementResult struct {
	// Results is Rows (row objects, JSON keys in column order) or
	// *RawResults for raw requests.
	Results any  `json:"results"`
	Success bool `json:"success"`
	Meta    Meta `json:"meta"`
}

// Timings is meta.timings.
type Timings struct {
	SQLDurationMs float64 `json:"sql_duration_ms"`
}

// Meta is D1's per-statement meta object.
type Meta struct {
	ServedByRegion  string  `json:"served_by_region"`
	ServedByPrimary bool    `json:"served_by_primary"`
	ServedByColo    string  `json:"served_by_colo"`
	Timings         Timings `json:"timings"`
	Duration        float64 `json:"duration"`
	Changes         int64   `json:"changes"`
	LastRowID       int64   `json:"last_row_id"`
	ChangedDB       bool    `json:"changed_db"`
	SizeAfter       int64   `json:"size_after"`
	RowsRead        int64   `json:"rows_read"`
	RowsWritten     int64   `json:"rows_written"`
}

// Error is a request failure with its D1 code (internal/v4). Message is
// user-facing: SQLite's text with the result code name, like D1
// ("no such table: t: SQLITE_ERROR"), never a file path.
type Error struct {
	Code      int
	Message   string
	Statement int // index of the failing statement in execution order, -1 if n/a
	// Detail says why the sandbox refused a statement ("writes to internal
	// table not allowed: sqlite_stat1"). It is not part of Message, which
	// is D1's text ("not authorized: SQLITE_AUTH"); it is for logs and tests.
	Detail string
}

func (e *Error) Error() string { return fmt.Sprintf("%d: %s", e.Code, e.Message) }

// Is lets errors.Is match an *Error by code against the sentinels below.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Message == "" && t.Code == e.Code
}

// Sentinels for errors.Is(err, sqlexec.ErrOverloaded) etc.; they match any
// *Error with the same code.
var (
	ErrOverloaded   = &Error{Code: v4.CodeOverloaded, Statement: -1}
	ErrTimeout      = &Error{Code: v4.CodeTimeout, Statement: -1}
	ErrStorageLimit = &Error{Code: v4.CodeStorageLimit, Statement: -1}
	ErrTooLarge     = &Error{Code: v4.CodeTooLarge, Statement: -1}
	ErrInvalid      = &Error{Code: v4.CodeInvalidRequest, Statement: -1}
	ErrSQL          = &Error{Code: v4.CodeSQL, Statement: -1}
)

// ErrClosed is returned by Execute after Close.
var ErrClosed = errors.New("sqlexec: database closed")

// D1's own messages (code 7500, no result-code suffix: they come from
// D1, not from SQLite).
const (
	// NoSQLMessage: the request holds no statement once D1's comment
	// filter has run (empty SQL, whitespace, lines of "--" comments).
	NoSQLMessage = "No SQL statements detected."
	// NoStatementMessage: SQLite found no statement in the text (only
	// ";" or /* */ comments).
	NoStatementMessage = "SQL code did not contain a statement."
	// WrongParamsMessage: the number of params differs from the number
	// of parameters the statement takes.
	WrongParamsMessage = "Wrong number of parameter bindings for SQL query."
	// MultiParamsMessage: a statement other than the last of a
	// multi-statement string takes parameters.
	MultiParamsMessage = "When executing multiple SQL statements in a single call, only the last statement can have parameters."
)

// Messages of the resource limits (code v4.CodeTooLarge, or
// v4.CodeOverloaded for ResultMemoryMessage). %d is the limit in bytes.
const (
	ResultTooLargeMessage = "result too large: the query's results would exceed the limit of %d bytes per request; select fewer rows or columns (LIMIT, or page through the table by its key): SQLITE_TOOBIG"
	TempTooLargeMessage   = "query needs too much temporary storage: the limit is %d bytes per query (sorting, DISTINCT, UNION, GROUP BY and CTEs over many rows use it; add an index or narrow the query): SQLITE_FULL"
	TempHostFullMessage   = "query needs temporary storage the host cannot give it now (other queries hold it); retry later, or narrow the query: SQLITE_FULL"
	ResultMemoryMessage   = "the host is short of memory for query results; retry later, or select fewer rows: SQLITE_NOMEM"
	// ProgramTooLargeMessage: %d is Limits.MaxProgramOps.
	ProgramTooLargeMessage = "statement too complex: it would compile to more than %d instructions; split it or simplify it (a CTE referenced many times is copied at each reference unless MATERIALIZED): SQLITE_TOOBIG"
)

// TransactionMessage is D1's text for refused BEGIN/COMMIT/SAVEPOINT… statements.
const TransactionMessage = "To execute a transaction, please use the state.storage.transaction() or state.storage.transactionSync() APIs instead of the SQL BEGIN TRANSACTION or SAVEPOINT statements. The JavaScript API is safer because it will automatically roll back on exceptions, and because it interacts correctly with Durable Objects' automatic atomic write coalescing."
