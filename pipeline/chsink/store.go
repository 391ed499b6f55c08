// Package chsink moves query usage from Kafka into ClickHouse and answers
// the questions asked of it: the Sink is a consumer-group consumer of the
// usage topic that writes batches into the requests table (shape texts
// into query_shapes); the Store owns those tables (schema, idempotent
// inserts, and the queries the limiter and `d1 insights` use).
//
// Delivery is at least once in (offsets are committed only after a batch's
// inserts were acknowledged) and exactly once in effect out: requests is
// a ReplacingMergeTree keyed on the event identity and every query
// deduplicates by that key (FINAL, or GROUP BY the identity: queries.go),
// so an event inserted twice — a redelivery after a sink crash, a retried
// insert, a producer that replayed its spill — counts once. See schema.go for the keys and pipeline/DESIGN.md for why this
// design and not another.
//
// ClickHouse 18.16 (Debian's package) is what dev mode and the tests run;
// the SQL here keeps to what both it and current ClickHouse accept, and
// production should run a current ClickHouse (the driver, clickhouse-go
// v2.51, supports 25.8 and later).
package chsink

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"golang.org/x/sync/errgroup"

	"github.com/shoaldb/shoal/pipeline/event"
)

// DefaultDatabase is the ClickHouse database of the tables unless
// StoreConfig.Database says otherwise.
const DefaultDatabase = "shoal"

// StoreConfig configures a Store.
type StoreConfig struct {
	// Options are the connection options (addresses, auth, TLS). The
	// protocol must be native; Store sets it if left zero. Required.
	Options *clickhouse.Options
	// Database holds the tables (default DefaultDatabase).
	Database string
	// Logger receives the driver's messages (default: discarded).
	Logger *slog.Logger
}

// Store reads and writes Shoal's usage tables in one ClickHouse database.
// It is safe for concurrent use; Close releases its connections.
type Store struct {
	conn driver.Conn
	db   string

	shapesMu sync.Mutex
	shapes   map[shapeKey]struct{} // shape texts written by this Store
}

// Open connects to ClickHouse. It does not contact the server (the driver
// dials lazily), so it succeeds while ClickHouse is down; EnsureSchema,
// Insert and the queries report that.
func Open(cfg StoreConfig) (*Store, error) {
	if cfg.Options == nil {
		return nil, errors.New("chsink: StoreConfig.Options is required")
	}
	db := cfg.Database
	if db == "" {
		db = DefaultDatabase
	}
	if !validDatabase.MatchString(db) {
		return nil, fmt.Errorf("chsink: invalid database name %q", db)
	}
	opts := *cfg.Options
	if opts.Protocol != clickhouse.Native {
		opts.Protocol = clickhouse.Native // HTTP fails against 18.16 (client_protocol_version)
	}
	if opts.Logger == nil && cfg.Logger != nil {
		opts.Logger = cfg.Logger
	}
	conn, err := clickhouse.Open(&opts)
	if err != nil {
		return nil, fmt.Errorf("chsink: open clickhouse: %w", err)
	}
	return &Store{conn: conn, db: db, shapes: make(map[shapeKey]struct{})}, nil
}

// Close closes the connections.
func (s *Store) Close() error { return s.conn.Close() }

// Database is the database the tables live in.
func (s *Store) Database() string { return s.db }

// Conn is the underlying connection, for operators' ad-hoc queries and
// tests; the Store's own methods are the supported reads.
func (s *Store) Conn() driver.Conn { return s.conn }

// Ping checks that ClickHouse answers.
func (s *Store) Ping(ctx context.Context) error { return s.conn.Ping(ctx) }

// Insert writes events into requests (one row each, shape hash and
// slowest query included), and the shape texts this Store has not written
// yet into query_shapes. It is idempotent: inserting the same
// events again, in whole or in part, leaves every total unchanged, so a
// caller that does not know whether an attempt landed simply retries it.
// The events are durable on the server's disk when Insert returns nil (in
// the page cache: 18.16 does not fsync inserts; a machine crash can lose
// the last seconds, a server crash cannot).
func (s *Store) Insert(ctx context.Context, events []event.Usage) error {
	if len(events) == 0 {
		return nil
	}
	shapes := s.newShapes(events)
	// The tables are written concurrently, on separate connections: a
	// shape text may then be missing while its events are stored (or the
	// reverse), which a retry of the whole call repairs (every insert is
	// idempotent).
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return s.insertRequests(gctx, events) })
	if len(shapes) > 0 {
		g.Go(func() error { return s.insertShapes(gctx, shapes) })
	}
	if err := g.Wait(); err != nil {
		return err
	}
	s.rememberShapes(shapes)
	return nil
}

// shapeKey identifies a shape text: shapes are kept per account, so one
// account's statement text is never shown to another, whatever the hash.
type shapeKey struct {
	account string
	hash    uint64
}

// maxKnownShapes bounds the Store's memory of shapes already written;
// when full it starts over (and rewrites texts, which is harmless).
const maxKnownShapes = 1 << 17

// newShapes returns the distinct shapes of events not known to be written.
func (s *Store) newShapes(events []event.Usage) map[shapeKey]string {
	s.shapesMu.Lock()
	defer s.shapesMu.Unlock()
	var out map[shapeKey]string
	for i := range events {
		u := &events[i]
		if u.Shape == "" {
			continue
		}
		k := shapeKey{u.AccountID, u.ShapeHash}
		if _, ok := s.shapes[k]; ok {
			continue
		}
		if out == nil {
			out = make(map[shapeKey]string)
		}
		out[k] = u.Shape
	}
	return out
}

func (s *Store) rememberShapes(shapes map[shapeKey]string) {
	if len(shapes) == 0 {
		return
	}
	s.shapesMu.Lock()
	defer s.shapesMu.Unlock()
	if len(s.shapes)+len(shapes) > maxKnownShapes {
		clear(s.shapes)
	}
	for k := range shapes {
		s.shapes[k] = struct{}{}
	}
}

// Inserts append whole columns, several times faster than Batch.Append
// per row.

func (s *Store) insertRequests(ctx context.Context, events []event.Usage) error {
	n := len(events)
	day := make([]time.Time, n)
	account, database, host, producer := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	seq, hash := make([]uint64, n), make([]uint64, n)
	start, end, queries, errs, read, written, dur, maxDur := make([]int64, n), make([]int64, n), make([]int64, n),
		make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n)
	for i := range events {
		u := &events[i]
		day[i] = Day(u.WindowStart)
		account[i], database[i], host[i], producer[i] = u.AccountID, u.DatabaseUUID, u.Host, u.EventID.Producer
		seq[i], hash[i] = u.EventID.Seq, u.ShapeHash
		start[i], end[i], queries[i], errs[i] = u.WindowStart, u.WindowEnd, u.Queries, u.Errors
		read[i], written[i], dur[i], maxDur[i] = u.RowsRead, u.RowsWritten, u.DurationUs, u.MaxDuration
	}
	return s.send(ctx, "requests", requestsColumns, []any{
		day, account, database, host, producer, seq, start, end, queries, errs, read, written, dur, hash, maxDur,
	})
}

func (s *Store) insertShapes(ctx context.Context, shapes map[shapeKey]string) error {
	account, hash, text := make([]string, 0, len(shapes)), make([]uint64, 0, len(shapes)), make([]string, 0, len(shapes))
	for k, v := range shapes {
		account, hash, text = append(account, k.account), append(hash, k.hash), append(text, v)
	}
	return s.send(ctx, "query_shapes", shapesColumns, []any{account, hash, text})
}

// hasShape reports whether an event is an insight row: shape hash 0 is
// reserved for events without a shape.
func hasShape(u *event.Usage) bool { return u.ShapeHash != 0 }

func (s *Store) send(ctx context.Context, table, cols string, values []any) (err error) {
	b, err := s.conn.PrepareBatch(ctx, "INSERT INTO "+s.db+"."+table+" ("+cols+")")
	if err != nil {
		return fmt.Errorf("chsink: insert %s: %w", table, err)
	}
	defer func() {
		if err != nil {
			_ = b.Abort()
		}
	}()
	for i, v := range values {
		if err := b.Column(i).Append(v); err != nil {
			return fmt.Errorf("chsink: insert %s column %d: %w", table, i, err)
		}
	}
	if err := b.Send(); err != nil {
		return fmt.Errorf("chsink: insert %s: %w", table, err)
	}
	return nil
}

// Day is the billing day of a window starting at startMs (Unix ms): its
// UTC date, as midnight UTC.
func Day(startMs int64) time.Time {
	return time.UnixMilli(startMs).UTC().Truncate(24 * time.Hour)
}
