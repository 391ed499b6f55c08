// Package dump exports one SQLite database file as an SQL dump and imports
// an SQL stream into one, for D1's export and import APIs.
//
// Export reads a consistent snapshot (one read transaction on its own
// connection; WAL lets the database keep serving reads and writes) and writes
// .dump-compatible SQL, dumping virtual tables (FTS5) as their CREATE
// VIRTUAL TABLE and rows rather than their shadow tables. Import splits the
// input with a streaming, sqlite3_complete-equivalent tokenizer (Splitter)
// and runs every statement in one transaction on the database's sqlexec
// writer (sqlexec.DB.ExecScript), in exactly user SQL's sandbox, so an
// import is all-or-nothing and uses memory bounded by the largest
// statement, not the file.
//
// Concurrency: Export and Import are safe to call concurrently on different
// files; on one database an import holds the writer, so other writes (and
// other imports) queue behind it while reads continue. A Splitter is used
// by one goroutine.
package dump
