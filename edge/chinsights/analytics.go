package chinsights

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/shoaldb/shoal/edge"
)

// The GraphQL datasets' reads (edge.UsageAnalytics) over chsink's tables.
// chsink has no method for a range bounded on both sides or for per-hour
// totals, so these two queries live here, written against the schema
// chsink documents (pipeline/chsink/schema.go) and following its rule for
// exact counts: group by the event identity in a subquery (any() of each
// measure), so an event stored twice before a merge counts once. Both read
// one account's key range only (the sorting key starts with day,
// account_id, database_uuid).

var _ edge.UsageAnalytics = (*Source)(nil)

// dayString is chsink's billing day of a time (UTC).
func dayString(t time.Time) string { return t.UTC().Format("2006-01-02") }

// sqlOrder maps the edge's orders onto SQL over the outer query's columns.
var sqlOrder = map[edge.ShapeOrder]string{
	edge.ShapeByDuration:       "d",
	edge.ShapeByRowsRead:       "r",
	edge.ShapeByRowsWritten:    "w",
	edge.ShapeByCount:          "q",
	edge.ShapeByAvgDuration:    "d / greatest(q, 1)",
	edge.ShapeByAvgRowsRead:    "r / greatest(q, 1)",
	edge.ShapeByAvgRowsWritten: "w / greatest(q, 1)",
}

// ShapesBetween implements edge.UsageAnalytics.
func (s *Source) ShapesBetween(ctx context.Context, accountID, databaseUUID string, from, to time.Time, order edge.ShapeOrder, ascending bool, limit int) ([]edge.QueryShape, error) {
	expr, ok := sqlOrder[order]
	if !ok {
		return nil, fmt.Errorf("chinsights: unknown order %v", order)
	}
	if limit < 1 {
		return nil, fmt.Errorf("chinsights: limit %d < 1", limit)
	}
	dir := "DESC"
	if ascending {
		dir = "ASC"
	}
	rows, err := s.st.Conn().Query(ctx, `SELECT shape_hash, sum(eq) AS q, sum(ee), sum(er) AS r, sum(ew) AS w, sum(ed) AS d, max(em) FROM (
    SELECT shape_hash, any(queries) AS eq, any(errors) AS ee, any(rows_read) AS er, any(rows_written) AS ew,
           any(duration_us) AS ed, any(max_duration_us) AS em
    FROM `+s.st.Database()+`.requests
    WHERE day >= toDate(?) AND day <= toDate(?) AND account_id = ? AND database_uuid = ?
      AND window_start_ms >= ? AND window_start_ms <= ? AND shape_hash != 0
    GROUP BY day, shape_hash, event_producer, event_seq)
GROUP BY shape_hash
ORDER BY `+expr+` `+dir+`, shape_hash
LIMIT ?`, dayString(from), dayString(to), accountID, databaseUUID, from.UnixMilli(), to.UnixMilli(), limit)
	if err != nil {
		return nil, fmt.Errorf("chinsights: shapes of %s: %w", databaseUUID, err)
	}
	defer rows.Close()
	var out []edge.QueryShape
	for rows.Next() {
		var q edge.QueryShape
		if err := rows.Scan(&q.Hash, &q.Queries, &q.Errors, &q.RowsRead, &q.RowsWritten, &q.DurationUs, &q.MaxDurationUs); err != nil {
			return nil, fmt.Errorf("chinsights: shapes: %w", err)
		}
		out = append(out, q)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("chinsights: shapes: %w", err)
	}
	if len(out) == 0 {
		return nil, nil
	}
	hashes := make([]uint64, len(out))
	for i := range out {
		hashes[i] = out[i].Hash
	}
	texts, err := s.texts(ctx, accountID, hashes)
	if err != nil {
		return nil, err
	}
	for i := range out {
		out[i].Text = texts[out[i].Hash]
	}
	return out, nil
}

// HourlyUsage implements edge.UsageAnalytics. Each (hour, shape) row says
// how many of its queries came in events that wrote rows; a shape whose
// text is a read-only statement counts its other queries as reads, every
// other shape (and any event that wrote) as writes.
func (s *Source) HourlyUsage(ctx context.Context, accountID, databaseUUID string, from, to time.Time) ([]edge.HourUsage, error) {
	rows, err := s.st.Conn().Query(ctx, `SELECT intDiv(ws, 3600000) AS h, shape_hash, sum(eq), sumIf(eq, ew > 0), sum(er), sum(ew), sum(ed) FROM (
    SELECT shape_hash, any(window_start_ms) AS ws, any(queries) AS eq, any(rows_read) AS er, any(rows_written) AS ew,
           any(duration_us) AS ed
    FROM `+s.st.Database()+`.requests
    WHERE day >= toDate(?) AND day <= toDate(?) AND account_id = ? AND database_uuid = ?
      AND window_start_ms >= ? AND window_start_ms <= ?
    GROUP BY day, shape_hash, event_producer, event_seq)
GROUP BY h, shape_hash
ORDER BY h, shape_hash`, dayString(from), dayString(to), accountID, databaseUUID, from.UnixMilli(), to.UnixMilli())
	if err != nil {
		return nil, fmt.Errorf("chinsights: hourly usage of %s: %w", databaseUUID, err)
	}
	defer rows.Close()
	type part struct {
		hour                  int64
		hash                  uint64
		q, wq, read, wr, durs int64
	}
	var parts []part
	hashSet := map[uint64]bool{}
	for rows.Next() {
		var p part
		if err := rows.Scan(&p.hour, &p.hash, &p.q, &p.wq, &p.read, &p.wr, &p.durs); err != nil {
			return nil, fmt.Errorf("chinsights: hourly usage: %w", err)
		}
		parts = append(parts, p)
		if p.hash != 0 {
			hashSet[p.hash] = true
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("chinsights: hourly usage: %w", err)
	}
	if len(parts) == 0 {
		return nil, nil
	}
	hashes := make([]uint64, 0, len(hashSet))
	for h := range hashSet {
		hashes = append(hashes, h)
	}
	sort.Slice(hashes, func(i, j int) bool { return hashes[i] < hashes[j] })
	texts := map[uint64]string{}
	if len(hashes) > 0 {
		if texts, err = s.texts(ctx, accountID, hashes); err != nil {
			return nil, err
		}
	}
	var out []edge.HourUsage
	for _, p := range parts {
		if len(out) == 0 || out[len(out)-1].Hour.UnixMilli() != p.hour*3600000 {
			out = append(out, edge.HourUsage{Hour: time.UnixMilli(p.hour * 3600000).UTC()})
		}
		h := &out[len(out)-1]
		reads := int64(0)
		if ReadOnlyShape(texts[p.hash]) {
			reads = p.q - p.wq
		}
		h.ReadQueries += reads
		h.WriteQueries += p.q - reads
		h.RowsRead += p.read
		h.RowsWritten += p.wr
		h.DurationUs += p.durs
	}
	return out, nil
}

// texts looks up the texts of an account's shapes.
func (s *Source) texts(ctx context.Context, accountID string, hashes []uint64) (map[uint64]string, error) {
	rows, err := s.st.Conn().Query(ctx, `SELECT shape_hash, any(shape) FROM `+s.st.Database()+`.query_shapes
WHERE account_id = ? AND has(?, shape_hash)
GROUP BY shape_hash`, accountID, hashes)
	if err != nil {
		return nil, fmt.Errorf("chinsights: shape texts: %w", err)
	}
	defer rows.Close()
	out := make(map[uint64]string, len(hashes))
	for rows.Next() {
		var h uint64
		var text string
		if err := rows.Scan(&h, &text); err != nil {
			return nil, fmt.Errorf("chinsights: shape texts: %w", err)
		}
		out[h] = text
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("chinsights: shape texts: %w", err)
	}
	return out, nil
}

// ReadOnlyShape reports whether a query shape (pipeline/shape's normalised
// statement: literals are ?, keywords as written) is a statement that only
// reads: SELECT, VALUES, EXPLAIN, a WITH whose statement is a SELECT, or a
// PRAGMA that sets nothing (no value, and an argument only for the schema
// and check pragmas). An empty or unknown text is not.
func ReadOnlyShape(text string) bool {
	words := shapeWords(text)
	if len(words) == 0 {
		return false
	}
	switch words[0] {
	case "SELECT", "VALUES", "EXPLAIN":
		return true
	case "WITH":
		for _, w := range words[1:] {
			switch w {
			case "INSERT", "UPDATE", "DELETE", "REPLACE":
				return false
			}
		}
		return true
	case "PRAGMA":
		if strings.Contains(text, "=") {
			return false // sets a value
		}
		if !strings.Contains(text, "(") || len(words) < 2 {
			return true // reads a value
		}
		return readPragmas[words[1]] // an argument: only the query pragmas
	}
	return false
}

// readPragmas are the pragmas that take an argument and only read (the
// schema and check pragmas D1 allows).
var readPragmas = map[string]bool{
	"TABLE_INFO": true, "TABLE_XINFO": true, "TABLE_LIST": true, "INDEX_LIST": true, "INDEX_INFO": true,
	"INDEX_XINFO": true, "FOREIGN_KEY_LIST": true, "FOREIGN_KEY_CHECK": true, "INTEGRITY_CHECK": true, "QUICK_CHECK": true,
}

// shapeWords returns the upper-cased bare words of a shape, outside
// quoted identifiers (string literals are already ?).
func shapeWords(text string) []string {
	var words []string
	for i := 0; i < len(text); {
		c := text[i]
		switch {
		case c == '"' || c == '`' || c == '[':
			end := byte('"')
			if c == '`' {
				end = '`'
			} else if c == '[' {
				end = ']'
			}
			j := strings.IndexByte(text[i+1:], end)
			if j < 0 {
				return words
			}
			i += j + 2
		case c == '_' || (c|0x20 >= 'a' && c|0x20 <= 'z'):
			j := i + 1
			for j < len(text) && (text[j] == '_' || text[j] == '$' || (text[j] >= '0' && text[j] <= '9') || (text[j]|0x20 >= 'a' && text[j]|0x20 <= 'z')) {
				j++
			}
			words = append(words, strings.ToUpper(text[i:j]))
			i = j
		default:
			i++
		}
	}
	return words
}
