package edge

import (
	"context"
	"time"
)

// UsageAnalytics is what the GraphQL endpoint (graphql.go) needs from the
// analytics store, beyond InsightsSource: usage bounded on both sides of
// time, per hour, and query shapes in either direction. It is an optional
// capability of Options.Insights, discovered by type assertion (the
// ClickHouse adapter, edge/chinsights, implements both); an edge whose
// source lacks it answers every GraphQL dataset with an "unavailable"
// error rather than zeros.
//
// Both methods read usage windows whose start lies in [from, to] (both
// inclusive), of one database of one account. The source must scope every
// read to accountID itself: the GraphQL endpoint does not resolve the
// database first (D1 keeps a deleted database's analytics readable), so
// another account's database UUID must simply match no usage. Every usage
// event counts once however often it was delivered. No usage is an empty
// slice and a nil error; an error means the store could not answer. ctx
// carries the request's deadline. Implementations must be safe for
// concurrent use.
type UsageAnalytics interface {
	// HourlyUsage returns one row per UTC hour (of the windows' starts)
	// that has usage, in ascending order of Hour.
	HourlyUsage(ctx context.Context, accountID, databaseUUID string, from, to time.Time) ([]HourUsage, error)
	// ShapesBetween returns at most limit (≥ 1) query shapes ranked by
	// order, descending, or ascending when ascending is set; ties are
	// broken by ascending Hash in both directions.
	ShapesBetween(ctx context.Context, accountID, databaseUUID string, from, to time.Time, order ShapeOrder, ascending bool, limit int) ([]QueryShape, error)
}

// HourUsage is one database's usage in one UTC hour. A usage event is the
// queries (requests) of one query shape in one window: ReadQueries are
// those of shapes that only read (their statement is a SELECT, VALUES,
// EXPLAIN, a read-only WITH or PRAGMA) and wrote no rows, WriteQueries all
// others; the two add up to every query of the hour.
type HourUsage struct {
	Hour         time.Time // start of the hour, UTC
	ReadQueries  int64
	WriteQueries int64
	RowsRead     int64
	RowsWritten  int64
	DurationUs   int64 // sum over the queries
}
