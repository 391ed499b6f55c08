package objecthost

import (
	"context"
	"time"
)

// UsageEvent is one query's metered usage (D1 counts index rows too; the
// counts come from sqlexec's meta).
type UsageEvent struct {
	AccountID    string
	DatabaseUUID string
	RowsRead     int64
	RowsWritten  int64
	Time         time.Time
	Duration     time.Duration // on the host, handle acquisition included
	SQL          string        // the request's first statement (shaped by the sink)
	Error        bool          // the request failed (SQL error, limit)
}

// SizeEvent is the latest size of one database, sent when it changes.
type SizeEvent struct {
	AccountID    string
	DatabaseUUID string
	SizeBytes    int64
	// Seq increases with every measurement on this host, across restarts
	// too: consumers keep the highest and ignore older or repeated ones.
	Seq  int64
	Time time.Time
}

// Route is a route publication: where a database lives and in which state.
// Consumers keep the highest Generation per UUID; a deleted state removes the
// route.
type Route struct {
	DatabaseUUID string
	ObjectID     string
	HostAddress  string
	AccountID    string
	State        string
	Generation   int64
}

// UsageSink receives one event per executed query.
//
// Concurrency contract: RecordUsage is called on the query path from many
// goroutines at once; it must not block on the network (buffer or
// pre-aggregate and ship asynchronously) and must be safe for concurrent use.
// Delivery is at-least-once from the pipeline's point of view; the host does
// not retry.
type UsageSink interface {
	RecordUsage(e UsageEvent)
}

// SizeSink receives a database's size whenever it changes (after writes, and
// 0 when a deleted database's file is swept).
//
// Concurrency contract: as UsageSink; implementations keep the latest value
// per database (later events supersede earlier ones).
type SizeSink interface {
	RecordSize(e SizeEvent)
}

// RouteSink publishes route changes (confirm, delete, heartbeat repair).
//
// Concurrency contract: PublishRoute may block briefly and may fail; on
// failure the host remembers the route as unpublished and the next heartbeat
// of that database retries. Safe for concurrent use.
type RouteSink interface {
	PublishRoute(ctx context.Context, r Route) error
}
