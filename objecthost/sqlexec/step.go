package sqlexec

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"math"
	"strconv"
	"unsafe"

	v4 "github.com/shoaldb/shoal/internal/v4"
)

// maxSafeInt is 2^53, beyond which JavaScript numbers skip integers.
const maxSafeInt = 1 << 53

// keyCol is one key of a /query row object: the JSON text before the value
// ("{" or "," then the quoted name and ":") and the column whose value it
// takes (the last column of that name, as D1's object construction keeps).
type keyCol struct {
	prefix string
	col    int
}

// rowPlan returns the keys of cs's row objects for cols, built once per
// column list (a schema change gives the statement a new one).
func (cs *cstmt) rowPlan(cols []string) []keyCol {
	if len(cs.planCols) == len(cols) && (len(cols) == 0 || &cs.planCols[0] == &cols[0]) && cs.plan != nil {
		return cs.plan
	}
	plan := make([]keyCol, 0, len(cols))
	for i, c := range cols {
		if seenBefore(cols, i) {
			continue
		}
		last := i
		for j := len(cols) - 1; j > i; j-- {
			if cols[j] == c {
				last = j
				break
			}
		}
		p := []byte{','}
		if len(plan) == 0 {
			p[0] = '{'
		}
		p = appendString(p, c)
		p = append(p, ':')
		plan = append(plan, keyCol{prefix: string(p), col: last})
	}
	cs.plan, cs.planCols = plan, cols
	return plan
}

// stepAll runs a bound statement to completion and returns its results:
// Encoded (st.encode), else Rows or *RawResults (raw); with st.discard
// (scripts) no rows are kept. count is the value a simple count returned
// (its rows read). The request's results are measured as they are produced
// (exactly when encoding, by a lower bound otherwise) and the statement
// fails as soon as they pass Limits.MaxResultBytes, or when the result
// budget (st.lease) cannot cover them.
// Column names are read after the first step: a cached statement is
// re-prepared inside sqlite3_step when the schema changed, and its column
// list (SELECT *) may differ from the previous run's.
func (c *conn) stepAll(cs *cstmt, raw bool, stmtIdx int, st *reqState) (out any, count int64, err error) {
	rc := C.shoal_step(c.sc, cs.s, 0, nil)
	cols := c.columns(cs)
	ncol := len(cols)
	c.ensureCells(max(ncol, 1))
	cells := unsafe.Slice(c.cells, max(ncol, 1))
	if rc == rcRow && ncol > 0 {
		C.shoal_fill(cs.s, C.int(ncol), c.cells)
	}
	if cs.simpleCount && rc == rcRow && ncol == 1 && cells[0]._type == 1 {
		count = max(int64(cells[0].i), 0)
	}
	switch {
	case st.discard:
		for rc == rcRow {
			rc = C.shoal_step(c.sc, cs.s, 0, nil)
		}
		out = Rows{}
		if raw {
			out = &RawResults{Columns: cols, Rows: [][]any{}}
		}
	case st.encode:
		var b []byte
		b, rc, err = c.encodeRows(cs, cols, cells, raw, rc, stmtIdx, st)
		if err != nil {
			return nil, 0, err
		}
		st.resultBytes += int64(len(b))
		out = Encoded(b)
	default:
		out, rc, err = c.collectRows(cs, cols, cells, raw, rc, stmtIdx, st)
		if err != nil {
			return nil, 0, err
		}
	}
	if rc != rcDone {
		return nil, 0, c.errorFor(C.sqlite3_errcode(c.db), stmtIdx)
	}
	return out, count, nil
}

// encodeRows writes the rows as the JSON AppendResults would write for
// them, reading each row's cells straight from SQLite (no Go value per
// cell). It returns the bytes and the step result that ended the loop.
func (c *conn) encodeRows(cs *cstmt, cols []string, cells []C.shoal_cell, raw bool, rc C.int, stmtIdx int, st *reqState) ([]byte, C.int, error) {
	ncol := len(cols)
	b := make([]byte, 0, 128)
	var plan []keyCol
	if raw {
		b = append(b, `{"columns":[`...)
		for i, name := range cols {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendString(b, name)
		}
		b = append(b, `],"rows":[`...)
	} else {
		plan = cs.rowPlan(cols)
		b = append(b, '[')
	}
	limit := c.lim.MaxResultBytes
	for first := true; rc == rcRow; first = false {
		if !first {
			b = append(b, ',')
		}
		if raw {
			b = append(b, '[')
			for i := 0; i < ncol; i++ {
				if i > 0 {
					b = append(b, ',')
				}
				b = appendCell(b, &cells[i], st.jsNumbers)
			}
			b = append(b, ']')
		} else if len(plan) == 0 {
			b = append(b, "{}"...)
		} else {
			for _, k := range plan {
				b = append(b, k.prefix...)
				b = appendCell(b, &cells[k.col], st.jsNumbers)
			}
			b = append(b, '}')
		}
		total := st.resultBytes + int64(len(b))
		if total > limit {
			return nil, rc, resultTooLarge(stmtIdx, limit)
		}
		if !st.lease.cover(total) {
			return nil, rc, &Error{Code: v4.CodeOverloaded, Statement: stmtIdx, Message: ResultMemoryMessage}
		}
		rc = C.shoal_step(c.sc, cs.s, C.int(ncol), c.cells)
	}
	if raw {
		b = append(b, "]}"...)
	} else {
		b = append(b, ']')
	}
	return b, rc, nil
}

// collectRows builds Rows or *RawResults (Request.Encode not set), measuring
// them by encodedSize, a lower bound of the JSON they encode to.
func (c *conn) collectRows(cs *cstmt, cols []string, cells []C.shoal_cell, raw bool, rc C.int, stmtIdx int, st *reqState) (any, C.int, error) {
	ncol := len(cols)
	var rows Rows
	var rawRows [][]any
	rowOverhead := int64(2 + ncol) // brackets and commas
	if !raw {
		for _, name := range cols {
			rowOverhead += int64(len(name)) + 3
		}
	}
	limit := c.lim.MaxResultBytes
	for rc == rcRow {
		vals := make([]any, ncol)
		size := rowOverhead
		for i := 0; i < ncol; i++ {
			cell := &cells[i]
			switch cell._type {
			case 1:
				v := int64(cell.i)
				if st.jsNumbers && (v > maxSafeInt || v < -maxSafeInt) {
					vals[i] = float64(v)
				} else {
					vals[i] = v
				}
				size++
			case 2:
				vals[i] = float64(cell.f)
				size++
			case 3:
				vals[i] = C.GoStringN((*C.char)(cell.p), cell.n)
				size += int64(cell.n) + 2
			case 4:
				vals[i] = Blob(C.GoBytes(cell.p, cell.n))
				size += 2 * int64(cell.n)
			default:
				size += 4
			}
		}
		st.resultBytes += size
		if st.resultBytes > limit {
			return nil, rc, resultTooLarge(stmtIdx, limit)
		}
		if raw {
			rawRows = append(rawRows, vals)
		} else {
			rows = append(rows, Row{cols: cols, vals: vals})
		}
		rc = C.shoal_step(c.sc, cs.s, C.int(ncol), c.cells)
	}
	if raw {
		if rawRows == nil {
			rawRows = [][]any{}
		}
		return &RawResults{Columns: cols, Rows: rawRows}, rc, nil
	}
	if rows == nil {
		rows = Rows{}
	}
	return rows, rc, nil
}

func resultTooLarge(stmtIdx int, limit int64) *Error {
	return &Error{Code: v4.CodeTooLarge, Statement: stmtIdx, Message: fmt.Sprintf(ResultTooLargeMessage, limit)}
}

// appendCell writes one result cell as appendValue writes the Go value
// collectRows would make of it.
func appendCell(b []byte, cell *C.shoal_cell, jsNumbers bool) []byte {
	switch cell._type {
	case 1:
		v := int64(cell.i)
		if jsNumbers && (v > maxSafeInt || v < -maxSafeInt) {
			return appendFloat(b, float64(v))
		}
		return strconv.AppendInt(b, v, 10)
	case 2:
		f := float64(cell.f)
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return append(b, "null"...)
		}
		return appendFloat(b, f)
	case 3:
		if cell.n <= 0 {
			return append(b, `""`...)
		}
		return appendString(b, unsafe.String((*byte)(cell.p), int(cell.n)))
	case 4:
		if cell.n <= 0 {
			return append(b, "[]"...)
		}
		return appendBlob(b, unsafe.Slice((*byte)(cell.p), int(cell.n)))
	}
	return append(b, "null"...)
}
