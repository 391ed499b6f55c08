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

// AppendResultsParts is AppendResults for answers too large to copy: the
// answer prefix + AppendResults(res) + suffix, as a list of byte slices in
// order. The small parts are appended to b (returned for reuse); Encoded
// results are referenced, not copied, so a large answer is held once.
func AppendResultsParts(b []byte, prefix, suffix string, res []StatementResult) ([]byte, [][]byte) {
	type span struct {
		off, end int
		enc      Encoded
	}
	var spans []span
	start := len(b)
	b = append(b, prefix...)
	b = append(b, '[')
	for i := range res {
		if i > 0 {
			b = append(b, ',')
		}
		r := &res[i]
		if e, ok := r.Results.(Encoded); ok && e != nil {
			b = append(b, `{"results":`...)
			spans = append(spans, span{off: start, end: len(b)}, span{enc: e})
			start = len(b)
			b = appendResultTail(b, r)
			continue
		}
		b = appendResult(b, r)
	}
	b = append(b, ']')
	b = append(b, suffix...)
	spans = append(spans, span{off: start, end: len(b)})
	parts := make([][]byte, len(spans))
	for i, s := range spans {
		if s.enc != nil {
			parts[i] = s.enc
		} else {
			parts[i] = b[s.off:s.end]
		}
	}
	return b, parts
}

func appendResult(b []byte, r *StatementResult) []byte {
	b = append(b, `{"results":`...)
	b = appendResultsValue(b, r)
	return appendResultTail(b, r)
}

// appendResultTail writes what follows a statement's results: success,
// meta and the closing brace.
func appendResultTail(b []byte, r *StatementResult) []byte {
	b = append(b, `,"success":`...)
	b = strconv.AppendBool(b, r.Success)
	b = append(b, `,"meta":`...)
	b = r.Meta.appendJSON(b)
	return append(b, '}')
}

func appendResultsValue(b []byte, r *StatementResult) []byte {
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
	return b
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
