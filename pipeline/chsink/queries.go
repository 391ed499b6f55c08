package chsink

import (
	"context"
	"fmt"
	"time"
)

// Every read counts each event once although rows of one event that
// background merges have not collapsed yet may be stored twice. Two forms
// do that, and each query uses the one measured cheaper for its shape on
// 18.16 (TestFigureFinalCost: one day of 2,000,000 events of 20,000
// accounts, 100,000 duplicate rows not merged yet; pipeline/DESIGN.md):
//   - narrow key ranges (one account's day, one database's shapes):
//     GROUP BY the event identity in a subquery, 3.5–4.4 ms against
//     12–13 ms with FINAL (no dedupe at all: 2–3 ms);
//   - wide scans (every account of a day): FINAL, 0.6 s against 2.8–2.9 s
//     for GROUP BY event (no dedupe: 0.06 s).

// Totals is one account's usage over a period.
type Totals struct {
	Events      uint64 // distinct usage events counted
	Queries     int64
	Errors      int64
	RowsRead    int64
	RowsWritten int64
	DurationUs  int64
}

// AccountTotals is Totals for one account.
type AccountTotals struct {
	AccountID string
	Totals
}

func dayString(day time.Time) string { return day.UTC().Format("2006-01-02") }

// TotalsForAccountDay returns an account's usage on the UTC day containing
// day (windows are assigned to the day they start on): what the limiter
// compares with the daily free-tier row limits. An account with no usage
// gets zero Totals and no error.
func (s *Store) TotalsForAccountDay(ctx context.Context, account string, day time.Time) (Totals, error) {
	var t Totals
	row := s.conn.QueryRow(ctx, `SELECT count(), sum(q), sum(e), sum(r), sum(w), sum(d) FROM (
    SELECT any(queries) AS q, any(errors) AS e, any(rows_read) AS r, any(rows_written) AS w, any(duration_us) AS d
    FROM `+s.db+`.requests
    WHERE day = toDate(?) AND account_id = ?
    GROUP BY database_uuid, event_producer, event_seq)`, dayString(day), account)
	if err := row.Scan(&t.Events, &t.Queries, &t.Errors, &t.RowsRead, &t.RowsWritten, &t.DurationUs); err != nil {
		return Totals{}, fmt.Errorf("chsink: totals for %s on %s: %w", account, dayString(day), err)
	}
	return t, nil
}

// AccountsOver returns every account whose usage on the UTC day
// containing day has rows read > maxRead or rows written > maxWritten
// (`GROUP BY account_id HAVING reads > ? OR writes > ?`), ordered by
// account ID: the limiter's periodic question. Pass math.MaxInt64 to leave
// one side out.
func (s *Store) AccountsOver(ctx context.Context, day time.Time, maxRead, maxWritten int64) ([]AccountTotals, error) {
	rows, err := s.conn.Query(ctx, `SELECT account_id, count(), sum(queries) AS q, sum(errors), sum(rows_read) AS r, sum(rows_written) AS w, sum(duration_us)
FROM `+s.db+`.requests FINAL
WHERE day = toDate(?)
GROUP BY account_id
HAVING r > ? OR w > ?
ORDER BY account_id`, dayString(day), maxRead, maxWritten)
	if err != nil {
		return nil, fmt.Errorf("chsink: accounts over limits on %s: %w", dayString(day), err)
	}
	defer rows.Close()
	var out []AccountTotals
	for rows.Next() {
		var a AccountTotals
		if err := rows.Scan(&a.AccountID, &a.Events, &a.Queries, &a.Errors, &a.RowsRead, &a.RowsWritten, &a.DurationUs); err != nil {
			return nil, fmt.Errorf("chsink: accounts over limits: %w", err)
		}
		out = append(out, a)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("chsink: accounts over limits: %w", err)
	}
	return out, nil
}

// ShapeOrder is what TopShapes ranks query shapes by (descending).
type ShapeOrder int

// The orders TopShapes accepts; they match `wrangler d1 insights`
// --sort-by {time,reads,writes,count} with --sort-type {sum,avg}.
const (
	ByDuration       ShapeOrder = iota // total time
	ByRowsRead                         // total rows read
	ByRowsWritten                      // total rows written
	ByCount                            // number of queries
	ByAvgDuration                      // time per query
	ByAvgRowsRead                      // rows read per query
	ByAvgRowsWritten                   // rows written per query
)

// orderExpr maps an order to its SQL; only these fixed strings reach the
// query text.
var orderExpr = map[ShapeOrder]string{
	ByDuration:       "d",
	ByRowsRead:       "r",
	ByRowsWritten:    "w",
	ByCount:          "q",
	ByAvgDuration:    "d / greatest(q, 1)",
	ByAvgRowsRead:    "r / greatest(q, 1)",
	ByAvgRowsWritten: "w / greatest(q, 1)",
}

// ShapeStats is one query shape's usage over a period.
type ShapeStats struct {
	ShapeHash     uint64
	Shape         string // "" if the text was never written (an event without one)
	Queries       int64
	Errors        int64
	RowsRead      int64
	RowsWritten   int64
	DurationUs    int64 // sum
	MaxDurationUs int64 // the slowest query
}

// TopShapes returns a database's query shapes with the highest orderBy
// over windows starting at or after since, at most limit of them (limit
// ≤ 0 means 20). Ties are broken by shape hash, so the answer is stable.
func (s *Store) TopShapes(ctx context.Context, account, database string, since time.Time, orderBy ShapeOrder, limit int) ([]ShapeStats, error) {
	expr, ok := orderExpr[orderBy]
	if !ok {
		return nil, fmt.Errorf("chsink: unknown shape order %d", orderBy)
	}
	if limit <= 0 {
		limit = 20
	}
	rows, err := s.conn.Query(ctx, `SELECT shape_hash, sum(eq) AS q, sum(ee), sum(er) AS r, sum(ew) AS w, sum(ed) AS d, max(em) FROM (
    SELECT shape_hash, any(queries) AS eq, any(errors) AS ee, any(rows_read) AS er, any(rows_written) AS ew,
           any(duration_us) AS ed, any(max_duration_us) AS em
    FROM `+s.db+`.requests
    WHERE day >= toDate(?) AND account_id = ? AND database_uuid = ? AND window_start_ms >= ? AND shape_hash != 0
    GROUP BY day, shape_hash, event_producer, event_seq)
GROUP BY shape_hash
ORDER BY `+expr+` DESC, shape_hash
LIMIT ?`, dayString(since), account, database, since.UnixMilli(), limit)
	if err != nil {
		return nil, fmt.Errorf("chsink: top shapes of %s: %w", database, err)
	}
	defer rows.Close()
	var out []ShapeStats
	for rows.Next() {
		var st ShapeStats
		if err := rows.Scan(&st.ShapeHash, &st.Queries, &st.Errors, &st.RowsRead, &st.RowsWritten, &st.DurationUs, &st.MaxDurationUs); err != nil {
			return nil, fmt.Errorf("chsink: top shapes: %w", err)
		}
		out = append(out, st)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("chsink: top shapes: %w", err)
	}
	if len(out) == 0 {
		return nil, nil
	}
	texts, err := s.shapeTexts(ctx, account, out)
	if err != nil {
		return nil, err
	}
	for i := range out {
		out[i].Shape = texts[out[i].ShapeHash]
	}
	return out, nil
}

// shapeTexts looks up the texts of the given shapes of an account.
func (s *Store) shapeTexts(ctx context.Context, account string, shapes []ShapeStats) (map[uint64]string, error) {
	hashes := make([]uint64, len(shapes))
	for i := range shapes {
		hashes[i] = shapes[i].ShapeHash
	}
	rows, err := s.conn.Query(ctx, `SELECT shape_hash, any(shape) FROM `+s.db+`.query_shapes
WHERE account_id = ? AND has(?, shape_hash)
GROUP BY shape_hash`, account, hashes)
	if err != nil {
		return nil, fmt.Errorf("chsink: shape texts: %w", err)
	}
	defer rows.Close()
	out := make(map[uint64]string, len(hashes))
	for rows.Next() {
		var h uint64
		var text string
		if err := rows.Scan(&h, &text); err != nil {
			return nil, fmt.Errorf("chsink: shape texts: %w", err)
		}
		out[h] = text
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("chsink: shape texts: %w", err)
	}
	return out, nil
}

// TableCounts is a table's stored rows against its distinct events.
type TableCounts struct {
	Rows     uint64 // rows stored, duplicates not yet merged included
	Distinct uint64 // rows counted by FINAL: distinct events
}

// PendingDuplicates is the number of stored duplicate rows that merges
// have not collapsed yet (reads are exact regardless).
func (c TableCounts) PendingDuplicates() uint64 { return c.Rows - c.Distinct }

// Counts returns a table's stored and distinct row counts (a full scan of
// the key columns; for reconciliation and operators, not the hot path).
// "query_insights" names the insight rows of requests (those with a
// shape), where insights have lived since they stopped having a table of
// their own.
func (s *Store) Counts(ctx context.Context, table string) (TableCounts, error) {
	where := ""
	switch table {
	case "requests":
	case "query_insights":
		where = " WHERE shape_hash != 0"
	default:
		return TableCounts{}, fmt.Errorf("chsink: unknown table %q", table)
	}
	var c TableCounts
	q := `SELECT (SELECT count() FROM ` + s.db + `.requests` + where + `), (SELECT count() FROM ` + s.db + `.requests FINAL` + where + `)`
	if err := s.conn.QueryRow(ctx, q).Scan(&c.Rows, &c.Distinct); err != nil {
		return TableCounts{}, fmt.Errorf("chsink: counts of %s: %w", table, err)
	}
	return c, nil
}

// ProducerGaps is one usage producer's sequence range stored since a day:
// usage events carry a contiguous sequence per producer (see
// pipeline/DESIGN.md, "Reconciliation"), so every sequence between the
// lowest and the highest stored one that is not stored is an event that
// never reached ClickHouse (dropped by a full spill, or lost).
type ProducerGaps struct {
	Producer string
	MinSeq   uint64
	MaxSeq   uint64
	Stored   uint64 // distinct sequences stored
	Missing  uint64 // MaxSeq - MinSeq + 1 - Stored
}

// Gaps returns every usage producer's range and missing count over the
// UTC days from since on (one GROUP BY over those days' partitions).
// Events after a producer's highest stored one are invisible here (still
// in flight, or a lost tail); sequences before the first day are outside
// the range.
func (s *Store) Gaps(ctx context.Context, since time.Time) ([]ProducerGaps, error) {
	rows, err := s.conn.Query(ctx, `SELECT event_producer, min(event_seq), max(event_seq), uniqExact(event_seq)
    FROM `+s.db+`.requests WHERE day >= toDate(?) GROUP BY event_producer ORDER BY event_producer`, dayString(since))
	if err != nil {
		return nil, fmt.Errorf("chsink: gaps: %w", err)
	}
	defer rows.Close()
	var out []ProducerGaps
	for rows.Next() {
		var g ProducerGaps
		if err := rows.Scan(&g.Producer, &g.MinSeq, &g.MaxSeq, &g.Stored); err != nil {
			return nil, fmt.Errorf("chsink: gaps: %w", err)
		}
		if span := g.MaxSeq - g.MinSeq + 1; span > g.Stored {
			g.Missing = span - g.Stored
		}
		out = append(out, g)
	}
	return out, rows.Err()
}
