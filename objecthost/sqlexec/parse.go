package sqlexec

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strconv"

	"github.com/shoaldb/shoal/internal/d1body"
	v4 "github.com/shoaldb/shoal/internal/v4"
)

type bodyStatement struct {
	SQL    *string           `json:"sql"`
	Params []json.RawMessage `json:"params"`
}

type body struct {
	SQL    *string           `json:"sql"`
	Params []json.RawMessage `json:"params"`
	Batch  []bodyStatement   `json:"batch"`
}

// ParseBody decodes a D1 /query or /raw body: {"sql": "...", "params": [...]}
// or {"batch": [{"sql": "...", "params": [...]}, ...]}. It is strict: unknown
// fields, wrong types, both or neither of sql and batch, an empty batch, and
// parameters that are not null, booleans, numbers, strings or arrays of byte
// values fail with *Error CodeInvalidRequest. So does text that would not
// reach SQLite exactly as sent (see checkSQL): a NUL in SQL, and anywhere
// in the body invalid UTF-8 or an unpaired surrogate escape (which a JSON
// decoder would replace with U+FFFD); a NUL inside a parameter string is
// data and binds as sent. Raw and BlockGrowth are left for the caller to
// set.
func ParseBody(data []byte) (Request, error) {
	if req, ok := parseSimple(data); ok {
		return req, nil
	}
	return parseBodyDecoder(data)
}

// parseBodyDecoder is ParseBody through encoding/json: every body the fast
// path does not take, and every error message.
func parseBodyDecoder(data []byte) (Request, error) {
	if terr := d1body.CheckText(data); terr != nil {
		return Request{}, invalidf("invalid request body: %s: %s", terr, terr.Problem.BodyHint())
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var b body
	if err := dec.Decode(&b); err != nil {
		return Request{}, invalidf("invalid request body: %s", jsonErrText(err))
	}
	if _, err := dec.Token(); err != io.EOF {
		return Request{}, invalidf("invalid request body: trailing data after JSON object")
	}
	var req Request
	switch {
	case b.SQL != nil && b.Batch != nil:
		return Request{}, invalidf("invalid request body: give either sql or batch, not both")
	case b.SQL != nil:
		req.Statements = []Statement{{SQL: *b.SQL, Params: b.Params}}
	case b.Batch != nil:
		if b.Params != nil {
			return Request{}, invalidf("invalid request body: params belong inside each batch entry")
		}
		if len(b.Batch) == 0 {
			return Request{}, invalidf("invalid request body: batch is empty")
		}
		req.Statements = make([]Statement, len(b.Batch))
		for i, s := range b.Batch {
			if s.SQL == nil {
				return Request{}, invalidf("invalid request body: batch[%d].sql is required", i)
			}
			req.Statements[i] = Statement{SQL: *s.SQL, Params: s.Params}
		}
	default:
		return Request{}, invalidf("invalid request body: sql is required")
	}
	if err := checkStatements(req.Statements); err != nil {
		return Request{}, err
	}
	for i, s := range req.Statements {
		for j, p := range s.Params {
			if _, err := decodeParam(p); err != nil {
				return Request{}, invalidf("invalid request body: statement %d param %d: %s", i, j, err.Error())
			}
		}
	}
	return req, nil
}

// checkSQL refuses SQL that SQLite would not run exactly as given
// (CodeInvalidRequest): SQLite reads SQL text only up to its first NUL, so
// the rest would be dropped without an error; and text that is not UTF-8
// cannot have come through JSON unchanged. The message says at which byte.
func checkSQL(sql string) *Error {
	terr := d1body.CheckString(sql)
	if terr == nil {
		return nil
	}
	return &Error{Code: v4.CodeInvalidRequest, Statement: -1,
		Message: fmt.Sprintf("SQL contains %s: %s", terr, terr.Problem.SQLHint())}
}

// checkStatements is checkSQL for every statement of a request, before any
// runs; the message names the statement (0-based, as in Request.Statements).
func checkStatements(stmts []Statement) error {
	for i := range stmts {
		if e := checkSQL(stmts[i].SQL); e != nil {
			e.Statement, e.Message = i, fmt.Sprintf("statement %d: %s", i, e.Message)
			return e
		}
	}
	return nil
}

func invalidf(format string, args ...any) *Error {
	return &Error{Code: v4.CodeInvalidRequest, Message: fmt.Sprintf(format, args...), Statement: -1}
}

// jsonErrText keeps decoder errors short and free of Go type names.
func jsonErrText(err error) string {
	switch e := err.(type) {
	case *json.UnmarshalTypeError:
		if e.Field != "" {
			return "wrong type for field " + strconv.Quote(e.Field)
		}
		return "wrong type: expected an object"
	case *json.SyntaxError:
		return "malformed JSON at offset " + strconv.FormatInt(e.Offset, 10)
	}
	if err == io.EOF {
		return "empty body"
	}
	return err.Error()
}

// paramKind enumerates the SQLite storage classes a JSON parameter binds as.
type paramKind uint8

const (
	paramNull paramKind = iota
	paramInt
	paramFloat
	paramText
	paramBlob
)

type param struct {
	kind paramKind
	i    int64
	f    float64
	s    string
	b    []byte
}

// decodeParam maps one JSON value to a SQLite value without going through
// float64 for integers: true/false → 1/0, integers exact within int64 (beyond
// it, the nearest double, as JavaScript would have it), other numbers as
// doubles, strings as TEXT, arrays of 0–255 as BLOB.
func decodeParam(raw json.RawMessage) (param, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return param{}, fmt.Errorf("empty value")
	}
	switch c := raw[0]; {
	case c == 'n':
		if string(raw) == "null" {
			return param{kind: paramNull}, nil
		}
	case c == 't':
		if string(raw) == "true" {
			return param{kind: paramInt, i: 1}, nil
		}
	case c == 'f':
		if string(raw) == "false" {
			return param{kind: paramInt, i: 0}, nil
		}
	case c == '"':
		if s, ok := unquoteSimple(raw); ok {
			return param{kind: paramText, s: s}, nil
		}
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return param{}, fmt.Errorf("malformed string")
		}
		return param{kind: paramText, s: s}, nil
	case c == '-' || (c >= '0' && c <= '9'):
		if !json.Valid(raw) {
			return param{}, fmt.Errorf("malformed number")
		}
		s := string(raw)
		if bytes.IndexAny(raw, ".eE") < 0 {
			if i, err := strconv.ParseInt(s, 10, 64); err == nil {
				return param{kind: paramInt, i: i}, nil
			}
		}
		f, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return param{}, fmt.Errorf("number out of range")
		}
		return param{kind: paramFloat, f: f}, nil
	case c == '[':
		var nums []json.Number
		d := json.NewDecoder(bytes.NewReader(raw))
		d.UseNumber()
		if err := d.Decode(&nums); err != nil {
			return param{}, fmt.Errorf("arrays must hold byte values 0-255")
		}
		b := make([]byte, len(nums))
		for i, n := range nums {
			v, err := strconv.ParseUint(string(n), 10, 8)
			if err != nil {
				return param{}, fmt.Errorf("arrays must hold byte values 0-255")
			}
			b[i] = byte(v)
		}
		return param{kind: paramBlob, b: b}, nil
	}
	return param{}, fmt.Errorf("unsupported parameter value: must be null, boolean, number, string or array of bytes")
}

// unquoteSimple handles the common string without escapes cheaply.
func unquoteSimple(raw []byte) (string, bool) {
	if len(raw) < 2 || raw[len(raw)-1] != '"' {
		return "", false
	}
	inner := raw[1 : len(raw)-1]
	for _, c := range inner {
		if c == '\\' || c == '"' || c < 0x20 {
			return "", false
		}
	}
	return string(inner), true
}

// parseSimple decodes the common body, {"sql": "...", "params": [scalars]}
// (keys in either order, params optional), without reflection. It accepts
// a strict subset of what the decoder in ParseBody accepts and returns the
// same Request for it: strings without escapes or control characters and
// valid UTF-8, parameters that are strings of the same kind, numbers, true,
// false or null, each of which decodeParam accepts, exactly-spelled keys,
// no duplicates. Anything else reports ok == false and goes through the
// decoder, which also produces the error messages. The result does not
// alias data.
func parseSimple(data []byte) (req Request, ok bool) {
	var spanBuf [8][2]int // on the stack: most requests have a few params
	spans := spanBuf[:0]
	sql, hasParams, ok := d1body.Scan(data, func(start, end int, _ bool) bool {
		spans = append(spans, [2]int{start, end})
		return true
	})
	if !ok {
		return Request{}, false
	}
	var params []json.RawMessage
	if hasParams {
		params = []json.RawMessage{}
	}
	if len(spans) > 0 {
		// The values are copied into one new buffer, so the Request does
		// not alias data.
		base := spans[0][0]
		buf := bytes.Clone(data[base:spans[len(spans)-1][1]])
		params = make([]json.RawMessage, len(spans))
		for k, sp := range spans {
			params[k] = json.RawMessage(buf[sp[0]-base : sp[1]-base : sp[1]-base])
			// Literals and numbers must be exactly what the decoder accepts;
			// decodeParam checks both (json.Valid for numbers).
			if _, err := decodeParam(params[k]); err != nil {
				return Request{}, false
			}
		}
	}
	return Request{Statements: []Statement{{SQL: string(sql), Params: params}}}, true
}
