package edge

import (
	"context"
	"time"
)

// InsightsSource is where the edge reads query-shape analytics from: the
// usage the object hosts report, aggregated per normalised statement
// (pipeline/shape) and stored by the pipeline (in production ClickHouse,
// through chsink.Store; edge/chinsights adapts it). The edge declares it so
// that it imports no analytics driver; the insights endpoint (insights.go)
// and, later, a GraphQL d1QueriesAdaptiveGroups endpoint read through it.
//
// TopShapes returns the shapes of one database of one account with the
// highest order over usage windows starting at or after since, at most
// limit of them (limit ≥ 1), in descending order of order, ties broken by
// ascending Hash so the answer is stable. Every usage event counts once,
// however often it was delivered. A database with no usage in the period
// gets an empty slice and a nil error: an error means the store could not
// answer (unreachable, timed out, refused the query), never "no data", and
// the edge then answers 503 rather than presenting zeros.
//
// The edge has checked that the database belongs to the account before
// calling; the source must still scope every read to accountID (shape texts
// are per account, so one account's statements never reach another).
// ctx carries the request's deadline. Implementations must be safe for
// concurrent use.
type InsightsSource interface {
	TopShapes(ctx context.Context, accountID, databaseUUID string, since time.Time, order ShapeOrder, limit int) ([]QueryShape, error)
}

// ShapeOrder is what TopShapes ranks shapes by, descending. The orders are
// `wrangler d1 insights`' --sort-by {time,reads,writes,count} with
// --sort-type {sum,avg} (count has no average).
type ShapeOrder int

// The orders. Their numbering is not part of any wire format.
const (
	ShapeByDuration       ShapeOrder = iota + 1 // total time
	ShapeByRowsRead                             // total rows read
	ShapeByRowsWritten                          // total rows written
	ShapeByCount                                // number of queries
	ShapeByAvgDuration                          // time per query
	ShapeByAvgRowsRead                          // rows read per query
	ShapeByAvgRowsWritten                       // rows written per query
)

// String names the order for logs and errors.
func (o ShapeOrder) String() string {
	switch o {
	case ShapeByDuration:
		return "sum(time)"
	case ShapeByRowsRead:
		return "sum(reads)"
	case ShapeByRowsWritten:
		return "sum(writes)"
	case ShapeByCount:
		return "count"
	case ShapeByAvgDuration:
		return "avg(time)"
	case ShapeByAvgRowsRead:
		return "avg(reads)"
	case ShapeByAvgRowsWritten:
		return "avg(writes)"
	}
	return "unknown"
}

// QueryShape is one query shape's usage over a period: sums over every
// query of that shape (averages are derived by the caller).
type QueryShape struct {
	Hash          uint64 // the shape's 64-bit hash (pipeline/shape)
	Text          string // normalised statement; "" if its text was never stored
	Queries       int64
	Errors        int64
	RowsRead      int64
	RowsWritten   int64
	DurationUs    int64 // sum over the queries, microseconds
	MaxDurationUs int64 // the slowest query
}
