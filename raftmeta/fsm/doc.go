// Package fsm is the Raft state machine of the catalog: a SQLite database
// (dir/catalog.db) derived from the Raft log, with typed, versioned,
// deterministic commands and concurrent read-only queries.
//
// Commands. Every log entry is a Command envelope (command.go: version,
// type, request ID, proposer time, JSON body), or, from catalog level 3, a
// batch entry carrying many such envelopes, each applied as if it were an
// entry of its own (batchentry.go). Each command type is one
// file, cmd_<type>.go, holding its CommandType constant, body type,
// validation, apply function, the prepared statements only it uses and the
// refusals it can answer, as a command[B, S] value; the one table commands
// (registry.go) lists them all, and Apply knows no other type. Apply
// decodes the body, validates it, and applies it inside the command's
// savepoint (none for a command that decides every refusal before its
// first write, command.refusesBeforeWrites: create_database), all in the
// batch's one transaction (the create and stats entries may decode on a fast path,
// fastdecode.go, then run the same validation and apply). Statements and
// row reads several commands share are in stmts.go and apply.go, field
// checks in validate.go.
//
// Refusals. A refused command answers Result.Err, an *Error whose Code is
// stable on the wire and matches a sentinel (ErrNameTaken, …) with
// errors.Is. refusal.go holds the one list of them; IsRefusal and
// RefusalCode tell a refusal (final: the same command gets the same answer)
// from a failure to reach the catalog, for raftmeta's HTTP API and the
// edge alike.
//
// Schema. accounts (tier, limits, active_databases kept in the same
// transaction as every create/delete, so limit checks and list totals are
// O(1)); api_tokens (SHA-256 hashes only); hosts (address, region,
// jurisdiction, capacity, state, reported load); databases (uuid, account,
// name, object id, host, region, jurisdiction, read_replication, state
// active/deleted, created/deleted timestamps, routing_generation); a partial
// UNIQUE index on (account_id, name) WHERE state='active' (a deleted name is
// reusable) and a partial list index on (account_id, created_at, uuid);
// database_stats with triggers that append every size difference (also −size
// when a database is deleted) to account_database_stats_changes;
// account_database_stats (drained totals); requests (remembered request IDs,
// filled only in snapshots); meta (schema
// version, applied index, largest command time, cluster level, batch
// offset). database_stats carries
// each size's seq (schema version 2). Every read is a primary-key
// or index search; list pages skip OFFSET rows inside a covering index.
//
// Invariants. Apply never reads the wall clock or randomness: all
// timestamps come from Command.Time, so replicas applying the same log reach
// byte-identical catalogs (Dump). A refused command (Result.Err, a sentinel
// code) leaves the catalog unchanged: each command runs in a SAVEPOINT
// inside the batch's single transaction. A UUID is never reused. Failures of
// SQLite itself (I/O, corruption) are not refusals: Apply panics so that the
// replica restarts from snapshot + log rather than diverge.
//
// Dedupe. Every command carries a RequestID. Its Result (including a
// refusal) is remembered in memory by the apply goroutine (dedupe.go); a
// retry within the window is answered with the original Result and not
// applied. The window is deterministic: the last 10 minutes of Command.Time
// measured back from the largest time applied so far, and at most the last
// 200,000 log entries (both configurable, and every replica must agree).
// Snapshots carry the remembered IDs in the copy's requests table (the live
// table stays empty); Restore loads them back.
//
// Storage totals. SetDatabaseStats records sizes in database_stats, each
// only if its seq is greater than the stored one (so a duplicate or late
// size never moves a total backwards; unknown or deleted databases are
// skipped); the size differences go to account_database_stats_changes in
// the same transaction (one row per account per command for updates, the
// insert and delete triggers for first sizes and deleted databases);
// DrainStats folds up to Max oldest deltas into account_database_stats
// with one upsert per account. Change ids stay contiguous, so the pending
// count is O(1).
//
// Schema versions. A fresh catalog is the version-1 schema plus every
// migration (schema.go); Restore and CheckSnapshot migrate an older
// snapshot's file in place before checking it against a fresh catalog
// (migrate.go), so snapshots and backups of version 1 still restore.
//
// Snapshots. Snapshot() opens a read transaction on a read connection (pins
// a WAL read snapshot) and takes a view of the remembered request IDs that
// shares their records (O(1) in the entries; 52–101 µs in all at 110,000
// entries); Persist copies
// that state while Apply continues, via the SQLite backup API (default) or
// sqlite3_serialize into a temp file, adds the request IDs to the copy's
// requests table, and streams the file framed with length and CRC-32C.
// Restore writes the stream to a temp file, checks frame, schema version and
// schema objects, then swaps the file in and opens it, putting the old
// catalog back on any failure; bad input is an error wrapping
// ErrInvalidSnapshot, never a panic. CheckSnapshot runs the same checks plus
// integrity_check and a column type scan on a copy, without touching the
// catalog: raftmeta runs it on an uploaded backup before Raft sees it
// (snapshotcheck.go). The catalog runs with synchronous=OFF: the
// Raft log and snapshots are the durable truth and New starts empty.
package fsm
