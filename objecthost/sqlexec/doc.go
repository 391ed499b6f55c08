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
// own result and meta. Parameters bind only when the string holds exactly
// one statement (several statements with params are refused; use a batch).
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
// rows_read is SQLite's scan statistics: after each statement,
// sqlite3_stmt_scanstatus_v2(stmt, i, SQLITE_SCANSTAT_NVISIT) summed over
// all loops i, then reset (statements are cached and reused). It needs the
// bundled SQLite compiled with -DSQLITE_ENABLE_STMT_SCANSTATUS (build.env);
// TestRowsReadCounters fails loudly on a build without it. A full scan of N
// rows reads N, a primary-key or indexed-equality lookup reads 1, an
// indexed range reads the rows in the range. Loops of trigger programs are
// not included. A top-level SELECT count(*) FROM t, which SQLite answers
// with OP_Count on the b-tree and no loop, reads its result (the table's
// row count, as D1 reports); it is recognised once per cached statement by
// reading its program with EXPLAIN (shoal_simple_count). A count inside a
// subquery or compound SELECT is not recognised and reads 0.
//
// rows_written comes from the preupdate hook (build tag
// sqlite_preupdate_hook) on the writer: every row INSERTed or DELETEd counts
// 1 + the number of indexes on its table (D1 counts index writes); an
// UPDATE counts 1 + the indexes whose key columns changed value (compared
// old vs new in the hook; expression indexes count as changed; a rowid
// change counts all). A WITHOUT ROWID table's primary key is the table
// itself and is not counted twice. Changes made by triggers, foreign-key
// actions and FTS5's shadow tables are included; SQLite's own tables
// (sqlite_schema, sqlite_sequence, sqlite_stat*) are not. Index info comes
// from pragma_index_list/pragma_index_xinfo and is cached until DDL runs.
//
// # Limits and safety
//
// See Limits. Each limit fails the request with an *Error and rolls back.
// An authorizer (shim.c) refuses ATTACH/DETACH, transaction control,
// PRAGMAs outside a read-only allowlist (plus foreign_keys,
// defer_foreign_keys, optimize, and data_version, which FTS5 queries
// itself), temporary schema objects, access to the reserved _cf_* and
// _shoal_* names, and writes to SQLite's internal tables except through
// DDL and ANALYZE. SQLITE_LIMIT_ATTACHED is 0, defensive mode is on (no
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
