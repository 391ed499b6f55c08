package chsink

import (
	"context"
	"fmt"
	"regexp"
	"strings"
)

// The tables the sink writes. requests is a ReplacingMergeTree table whose
// sorting key ends in the event identity (event_producer, event_seq), and
// whose partition key and every other sorting-key column are functions of
// the event alone: a redelivered event therefore lands in the same
// partition with the same key as its first copy, background merges keep
// one of the two, and every read that deduplicates by the sorting key
// (FINAL, or GROUP BY the key) counts it once even before a merge has run.
// That is the whole exactly-once argument, so keep it true when changing
// the keys: never put anything in PARTITION BY or ORDER BY that two copies
// of one event could disagree on (insert time, sink ID).
//
// requests is the billing source of truth for rows read and written and
// the source of `d1 insights`: one row per usage event (per account,
// database, query shape, window and host), sorted by billing day,
// account and database, so the limiter's per-day questions and one
// database's shapes read one key range per day. shape_hash 0 means the
// event has no shape (such events count for billing, not for insights).
// The shape texts are in query_shapes, one row per (account, shape),
// written once per Store rather than once per event (a third of the
// insert cost when they were inline). query_shapes needs no exactness: a
// repeated text is the same text.
//
// Until December 2026 every event was also written to a second table,
// query_insights, sorted by account and database; serving insights from
// requests halved the rows inserted per event. EnsureSchema no longer
// creates query_insights and migrates a requests table created before
// (see migrations); an old query_insights table is left alone and unused
// (drop it by hand).
//
// day is the UTC date of window_start_ms: a window that straddles midnight
// counts to the day it started on. ClickHouse 18.16 has no DateTime64,
// TTL, CODEC or (non-experimental) LowCardinality, so the schema uses
// none of them; retention is `ALTER TABLE … DROP PARTITION 'YYYYMM'`.
//
// {db} is replaced by the configured database name.
var schemaDDL = []string{
	`CREATE DATABASE IF NOT EXISTS {db}`,
	`CREATE TABLE IF NOT EXISTS {db}.requests (
    day             Date,
    account_id      String,
    database_uuid   String,
    host            String,
    event_producer  String,
    event_seq       UInt64,
    window_start_ms Int64,
    window_end_ms   Int64,
    queries         Int64,
    errors          Int64,
    rows_read       Int64,
    rows_written    Int64,
    duration_us     Int64,
    shape_hash      UInt64,
    max_duration_us Int64
) ENGINE = ReplacingMergeTree()
PARTITION BY toYYYYMM(day)
ORDER BY (day, account_id, database_uuid, event_producer, event_seq)`,
	`CREATE TABLE IF NOT EXISTS {db}.query_shapes (
    account_id String,
    shape_hash UInt64,
    shape      String
) ENGINE = ReplacingMergeTree()
ORDER BY (account_id, shape_hash)`,
}

// migrations bring a table created by an older EnsureSchema to the current
// columns. Adding a column is a metadata change in ClickHouse (existing
// parts read the column's default, 0): rows inserted before the migration
// have no shape and so are absent from TopShapes (their insights stayed in
// the old query_insights table); their billing totals are unchanged.
var migrations = []struct {
	table, column, ddl string
}{
	{"requests", "shape_hash", `ALTER TABLE {db}.requests ADD COLUMN shape_hash UInt64`},
	{"requests", "max_duration_us", `ALTER TABLE {db}.requests ADD COLUMN max_duration_us Int64`},
}

// Column lists of the inserts. PrepareBatch must name its columns: against
// 18.16 an INSERT without a list gets a 0-column header from the server.
const (
	requestsColumns = "day, account_id, database_uuid, host, event_producer, event_seq, " +
		"window_start_ms, window_end_ms, queries, errors, rows_read, rows_written, duration_us, shape_hash, max_duration_us"
	shapesColumns = "account_id, shape_hash, shape"
)

// Tables returns the names of the tables EnsureSchema creates.
func Tables() []string { return []string{"requests", "query_shapes"} }

var validDatabase = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// SchemaDDL returns the statements EnsureSchema runs, for a database name
// (documentation and operators who create the schema by hand).
func SchemaDDL(database string) []string {
	out := make([]string, len(schemaDDL))
	for i, s := range schemaDDL {
		out[i] = strings.ReplaceAll(s, "{db}", database)
	}
	return out
}

// EnsureSchema creates the database and tables if they do not exist and
// adds the columns a table created by an older version lacks (migrations).
// It is idempotent and safe to run from several sinks at once (a column
// another sink added meanwhile is not an error); it never changes or drops
// an existing column.
func (s *Store) EnsureSchema(ctx context.Context) error {
	for _, stmt := range SchemaDDL(s.db) {
		if err := s.conn.Exec(ctx, stmt); err != nil {
			return fmt.Errorf("chsink: ensure schema: %w", err)
		}
	}
	for _, m := range migrations {
		has, err := s.hasColumn(ctx, m.table, m.column)
		if err != nil {
			return fmt.Errorf("chsink: ensure schema: %w", err)
		}
		if has {
			continue
		}
		if err := s.conn.Exec(ctx, strings.ReplaceAll(m.ddl, "{db}", s.db)); err != nil {
			if has, err2 := s.hasColumn(ctx, m.table, m.column); err2 != nil || !has {
				return fmt.Errorf("chsink: migrate %s.%s: %w", m.table, m.column, err)
			}
		}
	}
	return nil
}

func (s *Store) hasColumn(ctx context.Context, table, column string) (bool, error) {
	var n uint64
	err := s.conn.QueryRow(ctx, `SELECT count() FROM system.columns WHERE database = ? AND table = ? AND name = ?`,
		s.db, table, column).Scan(&n)
	return n > 0, err
}
