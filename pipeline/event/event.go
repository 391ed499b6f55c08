// Package event owns the records of Shoal's background plane: the values
// that cross process boundaries on Kafka topics (usage, storage, routes,
// limits, accounts). Every record carries a schema version (V), an identity
// (EventID: producer ID + per-producer sequence, so consumers drop
// duplicates of at-least-once delivery), and per-object streams carry a
// monotonically increasing sequence (Seq for sizes, Generation for routes)
// so consumers ignore stale versions. Encoding is JSON: topics are read by
// other services and by kcat, and the rate is kept low by per-host
// pre-aggregation, not by a binary format.
//
// This package has no dependencies on Shoal's components; producers
// (objecthost, the limiter) and consumers (ClickHouse sink, storage
// consumer, route feed) all import it, so the types are defined once.
package event

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// Topic names (docs/pipeline.md: keys, partitions, retention, producers and
// consumers of each).
const (
	TopicUsage    = "usage"    // key: account ID
	TopicStorage  = "storage"  // key: database UUID
	TopicRoutes   = "routes"   // compacted; key: database UUID
	TopicLimits   = "limits"   // compacted; key: account ID
	TopicAccounts = "accounts" // key: account ID
	// TopicRateLimits carries the edges' admitted-request counts (RateUsage)
	// so that per-account and per-database rate limits hold across edges;
	// key: account ID.
	TopicRateLimits = "ratelimits"
)

// Version is the schema version every record of this package is written
// with. A consumer refuses (counts and skips) a record of a newer version
// it does not know.
const Version = 1

// ID identifies one record: the producer that wrote it and its sequence in
// that producer's output. Producers choose IDs that are unique and stable
// across restarts (a host ID plus a boot epoch, say), so (Producer, Seq)
// never repeats for different records.
type ID struct {
	Producer string `json:"producer"`
	Seq      uint64 `json:"seq"`
}

// String is "producer/seq", for logs and messages (ClickHouse stores the
// two parts in event_producer and event_seq).
func (id ID) String() string { return id.Producer + "/" + strconv.FormatUint(id.Seq, 10) }

// ParseID reverses ID.String.
func ParseID(s string) (ID, error) {
	i := strings.LastIndexByte(s, '/')
	if i <= 0 {
		return ID{}, fmt.Errorf("event id %q: want producer/seq", s)
	}
	seq, err := strconv.ParseUint(s[i+1:], 10, 64)
	if err != nil {
		return ID{}, fmt.Errorf("event id %q: %w", s, err)
	}
	return ID{Producer: s[:i], Seq: seq}, nil
}

// Usage is the usage of one (account, database, query shape) over one
// pre-aggregation window on one host: the billing source of rows read and
// written, and what query insights report. Shape is a normalised statement
// (literals replaced) and ShapeHash its stable hash; WindowStart and
// WindowEnd are Unix milliseconds.
type Usage struct {
	V            int    `json:"v"`
	EventID      ID     `json:"event_id"`
	Host         string `json:"host"`
	AccountID    string `json:"account_id"`
	DatabaseUUID string `json:"database_uuid"`
	Shape        string `json:"shape,omitempty"`
	ShapeHash    uint64 `json:"shape_hash,omitempty"`
	WindowStart  int64  `json:"window_start_ms"`
	WindowEnd    int64  `json:"window_end_ms"`
	Queries      int64  `json:"queries"`
	Errors       int64  `json:"errors"`
	RowsRead     int64  `json:"rows_read"`
	RowsWritten  int64  `json:"rows_written"`
	DurationUs   int64  `json:"duration_us"`     // sum over the queries
	MaxDuration  int64  `json:"max_duration_us"` // the slowest one
}

// Size is the latest size of one database as its host last measured it.
// Seq increases with every measurement of that database on that host
// (objects never move between hosts without a new generation), so a
// consumer keeps the highest Seq and ignores older or repeated ones.
type Size struct {
	V            int    `json:"v"`
	EventID      ID     `json:"event_id"`
	Host         string `json:"host"`
	AccountID    string `json:"account_id"`
	DatabaseUUID string `json:"database_uuid"`
	SizeBytes    int64  `json:"size_bytes"`
	Seq          int64  `json:"seq"`
	Time         int64  `json:"time_ms"`
}

// Route is where a database lives and in which state. Consumers keep the
// highest Generation per database; a record in state "deleted" removes the
// route (and is followed by a tombstone on the compacted topic).
type Route struct {
	V            int    `json:"v"`
	EventID      ID     `json:"event_id"`
	DatabaseUUID string `json:"database_uuid"`
	ObjectID     string `json:"object_id"`
	HostAddress  string `json:"host_address"`
	AccountID    string `json:"account_id"`
	State        string `json:"state"`
	Generation   int64  `json:"generation"`
	Time         int64  `json:"time_ms"`
}

// Limit flags an account as limited until UntilMs (the end of the UTC day
// for the daily row limits). A record with UntilMs ≤ now, or a tombstone,
// clears it.
type Limit struct {
	V         int    `json:"v"`
	EventID   ID     `json:"event_id"`
	AccountID string `json:"account_id"`
	Reason    string `json:"reason"` // e.g. "rows_read_per_day"
	UntilMs   int64  `json:"until_ms"`
	Time      int64  `json:"time_ms"`
}

// Account is a change of an account's tier or limits.
type Account struct {
	V         int    `json:"v"`
	EventID   ID     `json:"event_id"`
	AccountID string `json:"account_id"`
	Tier      string `json:"tier"`
	Time      int64  `json:"time_ms"`
}

// RateUsage is what one edge admitted for one account since its previous
// report (WindowStart to WindowEnd, Unix milliseconds): Requests against
// the account's rate limit and, per database UUID of that account, against
// each database's. Only keys with traffic are reported. Every other edge
// charges these counts to its own token buckets; the reporting edge (Edge)
// ignores its own records. Counts are deltas, so a consumer must not apply
// a record twice (EventID) and may drop old ones (they only loosen the
// limit, never tighten it).
type RateUsage struct {
	V           int              `json:"v"`
	EventID     ID               `json:"event_id"`
	Edge        string           `json:"edge"`
	AccountID   string           `json:"account_id"`
	Requests    int64            `json:"requests"`
	Databases   map[string]int64 `json:"databases,omitempty"`
	WindowStart int64            `json:"window_start_ms"`
	WindowEnd   int64            `json:"window_end_ms"`
}

// Encode marshals a record.
func Encode(v any) ([]byte, error) { return json.Marshal(v) }

// header is what Decode reads first, to refuse versions it does not know.
type header struct {
	V int `json:"v"`
}

// ErrNewerVersion is wrapped by Decode for a record of a schema version
// newer than this build knows.
var ErrNewerVersion = fmt.Errorf("record of a newer schema version than %d", Version)

// Decode unmarshals a record into out (a pointer to one of this package's
// types), refusing a newer version.
func Decode(b []byte, out any) error {
	var h header
	if err := json.Unmarshal(b, &h); err != nil {
		return fmt.Errorf("decode event: %w", err)
	}
	if h.V > Version {
		return fmt.Errorf("%w: v=%d", ErrNewerVersion, h.V)
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("decode event: %w", err)
	}
	return nil
}
