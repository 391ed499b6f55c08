package chinsights

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/edge"
	"github.com/shoaldb/shoal/pipeline/chlocal/chtest"
	"github.com/shoaldb/shoal/pipeline/chsink"
	"github.com/shoaldb/shoal/pipeline/event"
	"github.com/shoaldb/shoal/pipeline/shape"
)

func TestMain(m *testing.M) { chtest.Main(m) }

func TestReadOnlyShape(t *testing.T) {
	for text, want := range map[string]bool{
		"SELECT * FROM t WHERE id = ?":                         true,
		"select 1":                                             true,
		"( SELECT 1 ) UNION SELECT 2":                          true,
		"VALUES (?), (?)":                                      true,
		"EXPLAIN QUERY PLAN SELECT 1":                          true,
		"WITH x AS (SELECT 1) SELECT * FROM x":                 true,
		`WITH x AS (SELECT 1) SELECT "insert" FROM x`:          true, // a quoted name is not a keyword
		"WITH x AS (SELECT 1) INSERT INTO t SELECT * FROM x":   false,
		"PRAGMA table_info(t)":                                 true,
		"PRAGMA wal_checkpoint(TRUNCATE)":                      false,
		"PRAGMA foreign_keys":                                  true,
		"PRAGMA defer_foreign_keys = ?":                        false,
		"INSERT INTO t VALUES (?)":                             false,
		"INSERT INTO t VALUES (?) ON CONFLICT DO NOTHING":      false,
		"CREATE TABLE t(x)":                                    false,
		"UPDATE t SET x = ?":                                   false,
		"":                                                     false,
		"-- nothing":                                           false,
		"DELETE FROM t WHERE id IN (SELECT id FROM t LIMIT ?)": false,
		"REPLACE INTO t VALUES (?)":                            false,
		"SELECT * FROM t; DELETE FROM t":                       true, // the shape is the request's first statement
	} {
		assert.Equal(t, want, ReadOnlyShape(text), "%q", text)
	}
}

// The GraphQL reads against real ClickHouse, on events written by the
// pipeline's own sink: windows bounded on both sides, per-hour read and
// write queries, redelivered events counted once, and nothing of another
// account even for the same database UUID.
func TestUsageAnalyticsOnClickHouse(t *testing.T) {
	ch := chtest.Require(t)
	ctx := context.Background()
	st, err := chsink.Open(chsink.StoreConfig{Options: ch.Options(), Database: "chinsights_analytics"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = st.Close() })
	require.NoError(t, st.EnsureSchema(ctx))
	src := NewSource(st)

	const acctA, acctB, db = "acct-a", "acct-b", "01a234b6-0000-7000-8000-000000000001"
	h0 := time.Date(2026, 12, 1, 22, 0, 0, 0, time.UTC)
	h1 := h0.Add(time.Hour)                          // the next hour
	h2 := h0.Add(2 * time.Hour).Add(5 * time.Minute) // the next day (00:05)
	seq := uint64(0)
	ev := func(acct, sql string, at time.Time, queries, read, written, durUs int64) event.Usage {
		seq++
		text, hash := shape.Of(sql)
		return event.Usage{V: event.Version, EventID: event.ID{Producer: "p", Seq: seq}, Host: "h", AccountID: acct, DatabaseUUID: db,
			Shape: text, ShapeHash: hash, WindowStart: at.UnixMilli(), WindowEnd: at.Add(time.Second).UnixMilli(),
			Queries: queries, RowsRead: read, RowsWritten: written, DurationUs: durUs, MaxDuration: durUs / max(queries, 1)}
	}
	evs := []event.Usage{
		ev(acctA, "SELECT * FROM t WHERE id = 1", h0.Add(10*time.Minute), 5, 5, 0, 500),
		ev(acctA, "INSERT INTO t VALUES (1)", h0.Add(20*time.Minute), 2, 0, 4, 300),
		ev(acctA, "INSERT INTO t VALUES (1) ON CONFLICT DO NOTHING", h0.Add(30*time.Minute), 3, 3, 0, 90), // a write that wrote nothing
		ev(acctA, "SELECT * FROM t WHERE id = 2", h1.Add(time.Minute), 1, 1, 0, 40),
		ev(acctA, "SELECT * FROM t WHERE id = 3", h2, 7, 70, 0, 700), // outside the range asked below
		ev(acctB, "SELECT secret FROM b", h0.Add(15*time.Minute), 100, 1000, 0, 9999),
	}
	require.NoError(t, st.Insert(ctx, evs))
	require.NoError(t, st.Insert(ctx, evs[:3]), "a redelivery")

	from, to := h0, h1.Add(59*time.Minute)
	hours, err := src.HourlyUsage(ctx, acctA, db, from, to)
	require.NoError(t, err)
	assert.Equal(t, []edge.HourUsage{
		{Hour: h0, ReadQueries: 5, WriteQueries: 5, RowsRead: 8, RowsWritten: 4, DurationUs: 890},
		{Hour: h1, ReadQueries: 1, RowsRead: 1, DurationUs: 40},
	}, hours)
	hours, err = src.HourlyUsage(ctx, acctA, db, from, h2)
	require.NoError(t, err)
	require.Len(t, hours, 3, "across the day boundary")
	assert.Equal(t, h2.Truncate(time.Hour), hours[2].Hour)
	assert.Equal(t, int64(7), hours[2].ReadQueries)

	none, err := src.HourlyUsage(ctx, "acct-c", db, from, h2)
	require.NoError(t, err)
	assert.Empty(t, none, "another account's view of the same UUID")

	desc, err := src.ShapesBetween(ctx, acctA, db, from, to, edge.ShapeByCount, false, 10)
	require.NoError(t, err)
	require.Len(t, desc, 3, "SELECT id = ? is one shape; the h2 window is outside")
	assert.Equal(t, "SELECT * FROM t WHERE id = ?", desc[0].Text)
	assert.Equal(t, int64(6), desc[0].Queries, "5 + 1, the redelivery counted once")
	assert.Equal(t, int64(3), desc[1].Queries)
	asc, err := src.ShapesBetween(ctx, acctA, db, from, to, edge.ShapeByCount, true, 1)
	require.NoError(t, err)
	require.Len(t, asc, 1)
	assert.Equal(t, "INSERT INTO t VALUES (?)", asc[0].Text)
	assert.Equal(t, int64(4), asc[0].RowsWritten)
	b, err := src.ShapesBetween(ctx, acctB, db, from, to, edge.ShapeByDuration, false, 10)
	require.NoError(t, err)
	require.Len(t, b, 1)
	assert.Equal(t, "SELECT secret FROM b", b[0].Text, "B's own shapes, only")
}
