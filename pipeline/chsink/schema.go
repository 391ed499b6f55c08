package chsink

import (
	"context"
	"fmt"
	"regexp"
	"strings"
)

// The tables the sink writes. The two event tables are ReplacingMergeTree
// tables whose sorting key ends in the event identity (event_producer,
// event_seq), and whose partition key and every other sorting-key column
// are functions of the event alone: a redelivered event therefore lands in
// the same partition with the same key as its first copy, background
// merges keep one of the two, and every read that deduplicates by the
// sorting key (FINAL, or GROUP BY the key) counts it once even before a
// merge has run. That is the whole exactly-once argument, so keep it true
// when changing the keys: never put anything in PARTITION BY or ORDER BY
// that two copies of one event could disagree on (insert time, sink ID).
//
// requests is the billing source of truth for rows read and written: one
// row per usage event (per account, database, query shape, window and
// host), sorted by billing day and account, so the limiter's per-day
// questions read one key range. query_insights holds the same events with
// the shape hash and slowest query, sorted by account and database for
// `d1 insights`; the shape texts are in query_shapes, one row per
// (account, shape), written once per Store rather than once per event
// (a third of the insert cost when they were inline). query_shapes needs
// no exactness: a repeated text is the same text.
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
    duration_us     Int64
) ENGINE = ReplacingMergeTree()
PARTITION BY toYYYYMM(day)
ORDER BY (day, account_id, database_uuid, event_producer, event_seq)`,
	`CREATE TABLE IF NOT EXISTS {db}.query_insights (
    day             Date,
    account_id      String,
    database_uuid   String,
    shape_hash      UInt64,
    event_producer  String,
    event_seq       UInt64,
    window_start_ms Int64,
    queries         Int64,
    errors          Int64,
    rows_read       Int64,
    rows_written    Int64,
    duration_us     Int64,
    max_duration_us Int64
) ENGINE = ReplacingMergeTree()
PARTITION BY toYYYYMM(day)
ORDER BY (account_id, database_uuid, day, shape_hash, event_producer, event_seq)`,
	`CREATE TABLE IF NOT EXISTS {db}.query_shapes (
    account_id String,
    shape_hash UInt64,
    shape      String
) ENGINE = ReplacingMergeTree()
ORDER BY (account_id, shape_hash)`,
}

// Column lists of the inserts. PrepareBatch must name its columns: against
// 18.16 an INSERT without a list gets a 0-column header from the server.
const (
	requestsColumns = "day, account_id, database_uuid, host, event_producer, event_seq, " +
		"window_start_ms, window_end_ms, queries, errors, rows_read, rows_written, duration_us"
	insightsColumns = "day, account_id, database_uuid, shape_hash, event_producer, event_seq, " +
		"window_start_ms, queries, errors, rows_read, rows_written, duration_us, max_duration_us"
	shapesColumns = "account_id, shape_hash, shape"
)

// Tables returns the names of the tables EnsureSchema creates.
func Tables() []string { return []string{"requests", "query_insights", "query_shapes"} }

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

// EnsureSchema creates the database and tables if they do not exist. It is
// idempotent and safe to run from several sinks at once; it never alters an
// existing table.
func (s *Store) EnsureSchema(ctx context.Context) error {
	for _, stmt := range SchemaDDL(s.db) {
		if err := s.conn.Exec(ctx, stmt); err != nil {
			return fmt.Errorf("chsink: ensure schema: %w", err)
		}
	}
	return nil
}
