package sqlexec

import (
	"encoding/json"
	"strconv"
)

// AppendResults appends res as the JSON array D1 returns in an envelope's
// "result", byte for byte what encoding/json (with SetEscapeHTML(false))
// writes for []StatementResult, without reflection and without the
// re-validation encoding/json does of every MarshalJSON output: the object
// host writes its query answers with it straight into the response.
func AppendResults(b []byte, res []StatementResult) []byte {
	b = append(b, '[')
	for i := range res {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendResult(b, &res[i])
	}
	return append(b, ']')
}

func appendResult(b []byte, r *StatementResult) []byte {
	b = append(b, `{"results":`...)
	switch x := r.Results.(type) {
	case Rows: // nil renders [] too, as Rows.MarshalJSON does
		b = append(b, '[')
		for i, row := range x {
			if i > 0 {
				b = append(b, ',')
			}
			b = row.appendJSON(b)
		}
		b = append(b, ']')
	case Encoded:
		if x == nil {
			b = append(b, "null"...)
			break
		}
		b = append(b, x...)
	case *RawResults:
		if x == nil {
			b = append(b, "null"...)
			break
		}
		b = x.appendJSON(b)
	case nil:
		b = append(b, "null"...)
	default:
		// Not produced by Execute; kept correct for callers building
		// results by hand.
		enc, err := json.Marshal(x)
		if err != nil {
			enc = []byte("null")
		}
		b = append(b, enc...)
	}
	b = append(b, `,"success":`...)
	b = strconv.AppendBool(b, r.Success)
	b = append(b, `,"meta":`...)
	b = r.Meta.appendJSON(b)
	return append(b, '}')
}

// appendJSON writes m with the field order and names of its struct tags.
func (m *Meta) appendJSON(b []byte) []byte {
	b = append(b, `{"served_by_region":`...)
	b = appendString(b, m.ServedByRegion)
	b = append(b, `,"served_by_primary":`...)
	b = strconv.AppendBool(b, m.ServedByPrimary)
	b = append(b, `,"served_by_colo":`...)
	b = appendString(b, m.ServedByColo)
	b = append(b, `,"timings":{"sql_duration_ms":`...)
	b = appendJSONFloat(b, m.Timings.SQLDurationMs)
	b = append(b, `},"duration":`...)
	b = appendJSONFloat(b, m.Duration)
	b = append(b, `,"changes":`...)
	b = strconv.AppendInt(b, m.Changes, 10)
	b = append(b, `,"last_row_id":`...)
	b = strconv.AppendInt(b, m.LastRowID, 10)
	b = append(b, `,"changed_db":`...)
	b = strconv.AppendBool(b, m.ChangedDB)
	b = append(b, `,"size_after":`...)
	b = strconv.AppendInt(b, m.SizeAfter, 10)
	b = append(b, `,"rows_read":`...)
	b = strconv.AppendInt(b, m.RowsRead, 10)
	b = append(b, `,"rows_written":`...)
	b = strconv.AppendInt(b, m.RowsWritten, 10)
	return append(b, '}')
}

// appendJSONFloat is appendFloat for meta durations; they are always
// finite (encoding/json would fail on NaN, we write 0).
func appendJSONFloat(b []byte, f float64) []byte {
	if f != f || f > 1e308 || f < -1e308 {
		return append(b, '0')
	}
	return appendFloat(b, f)
}
