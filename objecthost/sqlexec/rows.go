package sqlexec

import (
	"math"
	"strconv"
	"unicode/utf8"
)

// Values in results are one of: nil (NULL), int64, float64, string, Blob.

// Blob is a SQLite BLOB; it marshals as a JSON array of byte values like D1
// (not base64).
type Blob []byte

// MarshalJSON renders the bytes as [1,2,3].
func (b Blob) MarshalJSON() ([]byte, error) { return appendBlob(nil, b), nil }

// Row is one result row of a /query request: column names (shared by the
// rows of a statement) and values in column order. It marshals as a JSON
// object whose keys keep column order; with duplicate column names the key
// appears once, at its first position, with the last value, which is what
// D1's JavaScript object construction produces.
type Row struct {
	cols []string
	vals []any
}

// Columns returns the column names in order (shared; do not modify).
func (r Row) Columns() []string { return r.cols }

// Values returns the values in column order.
func (r Row) Values() []any { return r.vals }

// Get returns the value of the last column named name, like D1's object.
func (r Row) Get(name string) (any, bool) {
	for i := len(r.cols) - 1; i >= 0; i-- {
		if r.cols[i] == name {
			return r.vals[i], true
		}
	}
	return nil, false
}

// MarshalJSON renders the row as an ordered JSON object.
func (r Row) MarshalJSON() ([]byte, error) { return r.appendJSON(make([]byte, 0, 64)), nil }

func (r Row) appendJSON(b []byte) []byte {
	b = append(b, '{')
	first := true
	for i, c := range r.cols {
		if seenBefore(r.cols, i) {
			continue
		}
		v := r.vals[i]
		for j := len(r.cols) - 1; j > i; j-- { // last one wins
			if r.cols[j] == c {
				v = r.vals[j]
				break
			}
		}
		if !first {
			b = append(b, ',')
		}
		first = false
		b = appendString(b, c)
		b = append(b, ':')
		b = appendValue(b, v)
	}
	return append(b, '}')
}

func seenBefore(cols []string, i int) bool {
	for j := 0; j < i; j++ {
		if cols[j] == cols[i] {
			return true
		}
	}
	return false
}

// Rows is the result of a /query statement. Its MarshalJSON renders all rows
// in one pass without reflection.
type Rows []Row

// MarshalJSON renders [] for no rows, never null.
func (rs Rows) MarshalJSON() ([]byte, error) {
	b := make([]byte, 0, 16+48*len(rs))
	b = append(b, '[')
	for i, r := range rs {
		if i > 0 {
			b = append(b, ',')
		}
		b = r.appendJSON(b)
	}
	return append(b, ']'), nil
}

// RawResults is the result of a /raw statement: columns are kept as SQLite
// names them, duplicates included.
type RawResults struct {
	Columns []string `json:"columns"`
	Rows    [][]any  `json:"rows"`
}

// MarshalJSON renders {"columns":[...],"rows":[[...]]} with BLOBs as byte
// arrays and integers exact.
func (r *RawResults) MarshalJSON() ([]byte, error) {
	return r.appendJSON(make([]byte, 0, 32+32*len(r.Rows))), nil
}

func (r *RawResults) appendJSON(b []byte) []byte {
	b = append(b, `{"columns":[`...)
	for i, c := range r.Columns {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, c)
	}
	b = append(b, `],"rows":[`...)
	for i, row := range r.Rows {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '[')
		for j, v := range row {
			if j > 0 {
				b = append(b, ',')
			}
			b = appendValue(b, v)
		}
		b = append(b, ']')
	}
	return append(b, "]}"...)
}

func appendValue(b []byte, v any) []byte {
	switch x := v.(type) {
	case nil:
		return append(b, "null"...)
	case int64:
		return strconv.AppendInt(b, x, 10)
	case float64:
		// JSON has no NaN/Infinity; JavaScript's JSON.stringify (D1) writes null.
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return append(b, "null"...)
		}
		return appendFloat(b, x)
	case string:
		return appendString(b, x)
	case Blob:
		return appendBlob(b, x)
	case []byte:
		return appendBlob(b, x)
	case bool:
		return strconv.AppendBool(b, x)
	case int:
		return strconv.AppendInt(b, int64(x), 10)
	default:
		return append(b, "null"...)
	}
}

// appendFloat formats like encoding/json (ES6 number formatting), so 1.0
// renders as 1, as in JavaScript.
func appendFloat(b []byte, f float64) []byte {
	if f == 0 {
		return append(b, '0') // -0 too, as JSON.stringify writes it (D1)
	}
	abs := math.Abs(f)
	fmtc := byte('f')
	if abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		fmtc = 'e'
	}
	b = strconv.AppendFloat(b, f, fmtc, -1, 64)
	if fmtc == 'e' {
		// clean up e-09 to e-9
		n := len(b)
		if n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
	}
	return b
}

func appendBlob(b []byte, x []byte) []byte {
	b = append(b, '[')
	for i, c := range x {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendUint(b, uint64(c), 10)
	}
	return append(b, ']')
}

const hexDigits = "0123456789abcdef"

// appendString writes a JSON string; invalid UTF-8 becomes U+FFFD like
// encoding/json. HTML characters are not escaped (D1 does not).
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		// U+2028 and U+2029 are valid JSON but break JavaScript eval; escape like encoding/json.
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
