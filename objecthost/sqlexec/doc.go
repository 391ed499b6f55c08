// Package sqlexec executes user SQL against one SQLite database file with
// Cloudflare D1's semantics. It is the object host's data-plane core: the
// objecthost package owns lifecycles and the HTTP API and calls DB.Execute
// for every /query and /raw request.
//
// # Semantics
//
// A request (one SQL string, possibly holding several ';'-separated
// statements, or a batch) runs as one SQL transaction; any failure rolls all
// of it back and no result is returned. The string is split with SQLite's
// prepare tail, never by naive ';' splitting, and each statement gets its
// own result and meta. Parameters bind to the string's last statement, and
// exactly as many as it takes; a statement before the last may take none
// (D1's rules and messages).
// BEGIN/COMMIT/ROLLBACK/SAVEPOINT/RELEASE are refused with D1's message.
// Foreign keys are on. Writes are serialized in arrival order on a single
// writer connection, with group commit (requests queued together share one
// transaction, each in its own savepoint; see group.go); read-only requests
// run concurrently on reader connections (WAL). A request is read-only when every statement of it was
// seen to be read-only (sqlite3_stmt_readonly) the first time its SQL text
// ran; unknown SQL goes to the writer, and a reader that finds a writing
// statement hands the request, untouched, to the writer.
//
// # Measuring rows read and rows written
//
// rows_read and rows_written are D1's: D1 counts with libSQL's statement
// counters, a patch to SQLite's bytecode engine, and shoal_d1_counts
// (shim.c) derives the same numbers from stock SQLite's per-instruction
// execution counts (SQLITE_ENABLE_STMT_SCANSTATUS, build.env) after each
// statement: a row is read per cursor positioning (Rewind, Last, Sort,
// SorterSort, SeekGE/GT/LE/LT, SeekRowid, NotExists), per Next, Prev or
// SorterNext that moves to a row (sqlite3_stmt_status counters 0, 1, 3),
// per VNext, and a top-level SELECT count(*) FROM t reads its result (its
// Count instruction's rows; recognised once per cached statement with
// EXPLAIN, shoal_simple_count); a row is written per Insert and IdxInsert
// on a real (non-ephemeral) cursor, per Delete that counts as a change,
// per VUpdate, and per row a Clear removes. Trigger sub-programs count.
// So DDL writes its sqlite_schema rows, an UPDATE writes the row and the
// new entries of the indexes whose columns changed, REPLACE over a row
// does not count the deletion, and DELETE without WHERE reads nothing.
// The program is private to SQLite: shim.c mirrors SQLite 3.54.1's
// VdbeOp/Vdbe layout, checked once per process against EXPLAIN
// (shoal_counts_check). Without it (another SQLite linked) rows_read falls
// back to scan statistics and rows_written to the preupdate hook's records
// (written.go), an approximation; TestD1Counters fails loudly then.
//
// changes is the difference of total_changes around the statement (rows
// changed by triggers, foreign-key actions and FTS5's shadow tables
// included), last_row_id the connection's last_insert_rowid (reads report
// the writer's), size_after the pages in use ((page_count -
// freelist_count) × page_size) and changed_db whether any of those three
// changed, all as D1 reports them. docs/d1-compatibility.md and the
// differential suite in test/compat hold the evidence.
//
// # Limits and safety
//
// See Limits. Each limit fails the request with an *Error and rolls back.
// An authorizer (shim.c) refuses ATTACH/DETACH, transaction control,
// PRAGMAs outside a read-only allowlist (plus foreign_keys,
// defer_foreign_keys, optimize, and data_version, which FTS5 queries
// itself), temporary schema objects, access to the reserved _cf_* and
// _shoal_* names, writes to SQLite's internal tables except through
// DDL and ANALYZE, virtual-table modules other than FTS5, and the
// functions D1 refuses (sqlite_version(), load_extension(), …; shim.c's
// lists). Its refusals read "not authorized: SQLITE_AUTH", as on D1 (the
// reason is Error.Detail). SQLITE_LIMIT_ATTACHED is 0, defensive mode is on (no
// writable_schema, no writes to virtual tables' shadow tables), the schema
// is untrusted, and load_extension is compiled out. VACUUM cannot run
// inside the request's transaction. testdata/hostile.sql is the corpus
// TestHostileCorpus and FuzzExecute's seeds check.
//
// # Scripts
//
// DB.ExecScript runs a stream of statements (an import) on the writer as
// one transaction, alone (never grouped), through the same sandbox, limits
// and counters; see ScriptOptions for its three opt-in differences
// (deferred foreign keys, statement length, sqlite_sequence writes). Its
// statements are never cached. TestExecScriptHostileCorpus runs the
// hostile corpus through it.
package sqlexec
