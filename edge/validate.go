package edge

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strconv"
	"strings"

	"github.com/google/uuid"

	"github.com/shoaldb/shoal/internal/d1body"
	v4 "github.com/shoaldb/shoal/internal/v4"
)

// Limits applied before any work is done. D1's published limits by default.
type Limits struct {
	MaxBodyBytes   int64 // whole request body; default 4 MiB (D1 allows 2 MB values)
	MaxSQLBytes    int   // per statement; default 100 KB (D1)
	MaxParams      int   // per statement; default 100 (D1)
	MaxBatch       int   // statements per request; default 1000
	MaxNameBytes   int   // database name; default 64
	MaxParamString int   // bytes per string/blob parameter; default 2 MB (D1)
}

func (l *Limits) defaults() {
	if l.MaxBodyBytes <= 0 {
		l.MaxBodyBytes = 4 << 20
	}
	if l.MaxSQLBytes <= 0 {
		l.MaxSQLBytes = 100_000
	}
	if l.MaxParams <= 0 {
		l.MaxParams = 100
	}
	if l.MaxBatch <= 0 {
		l.MaxBatch = 1000
	}
	if l.MaxNameBytes <= 0 {
		l.MaxNameBytes = 64
	}
	if l.MaxParamString <= 0 {
		l.MaxParamString = 2_000_000
	}
}

// validationError is a client error found before any work: it carries the
// HTTP status and v4 code to answer with.
type validationError struct {
	status int
	code   int
	msg    string
}

func (e *validationError) Error() string { return e.msg }

func invalid(format string, args ...any) error {
	return &validationError{status: 400, code: 7400, msg: fmt.Sprintf(format, args...)}
}

func tooLarge(format string, args ...any) error {
	return &validationError{status: 413, code: 7413, msg: fmt.Sprintf(format, args...)}
}

// readBody reads at most max bytes; more is a 413.
func readBody(r io.Reader, max int64) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, max+1))
	if errors.Is(err, v4.ErrSlowBody) {
		return nil, &validationError{status: v4.SlowBodyStatus, code: v4.CodeInvalidRequest,
			msg: "request body arrived too slowly: the connection was closed"}
	}
	if err != nil {
		return nil, invalid("could not read request body")
	}
	if int64(len(b)) > max {
		return nil, tooLarge("request body exceeds %d bytes", max)
	}
	return b, nil
}

// smallBodyBytes bounds the bodies of control calls (admin, export, import),
// which are a few small fields.
const smallBodyBytes = 64 << 10

// readJSON reads a body of at most max bytes and decodes it strictly into v.
func readJSON(r io.Reader, max int64, v any) error {
	b, err := readBody(r, max)
	if err != nil {
		return err
	}
	return decodeStrict(b, v)
}

// readD1JSON reads a body of at most max bytes and decodes it into v with
// decodeD1.
func readD1JSON(r io.Reader, max int64, v any) error {
	b, err := readBody(r, max)
	if err != nil {
		return err
	}
	return decodeD1(b, v)
}

// decodeStrict decodes exactly one JSON value into v, refusing unknown fields
// and trailing data, and text the decoder would not keep exactly (raw NUL,
// invalid UTF-8, unpaired surrogate escapes: d1body.CheckText) — it would
// replace the last two with U+FFFD without a word, changing SQL, parameters
// or names.
func decodeStrict(b []byte, v any) error { return decodeJSON(b, v, true) }

// decodeD1 decodes the body of a D1 control call (create, update, export,
// import) like decodeStrict, except that unknown fields are ignored, as
// Cloudflare's API does: a field D1 adds tomorrow must not break every
// client that sends it. Known fields are still checked for their types.
func decodeD1(b []byte, v any) error { return decodeJSON(b, v, false) }

func decodeJSON(b []byte, v any, strict bool) error {
	if terr := d1body.CheckText(b); terr != nil {
		return invalid("malformed JSON body: %s: %s", terr, terr.Problem.BodyHint())
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	if strict {
		dec.DisallowUnknownFields()
	}
	dec.UseNumber()
	if err := dec.Decode(v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			if te.Field == "" {
				return invalid("malformed JSON body: expected %s, got %s", jsonKind(te.Type), jsonValueName(te.Value))
			}
			return invalid("Invalid property: %s => expected %s, got %s", te.Field, jsonKind(te.Type), jsonValueName(te.Value))
		}
		return invalid("malformed JSON body: %s", jsonMsg(err))
	}
	if dec.More() {
		return invalid("malformed JSON body: trailing data")
	}
	if _, err := dec.Token(); err != io.EOF {
		return invalid("malformed JSON body: trailing data")
	}
	return nil
}

// jsonMsg is encoding/json's message for a syntax error (which names no Go
// type); any other decoder error gets a generic text, since its message
// may name the Go types it decodes into.
func jsonMsg(err error) string {
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Sprintf("%s (at byte %d)", strings.TrimPrefix(se.Error(), "json: "), se.Offset)
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return "unexpected end of JSON input"
	}
	msg := strings.TrimPrefix(err.Error(), "json: ")
	if strings.HasPrefix(msg, "unknown field ") {
		return msg // `unknown field "x"`: the client's own text
	}
	return "not valid for this request"
}

// jsonKind names the JSON a Go type decodes from: what a client must send,
// never the Go type (which would leak internals such as "[]edge.Statement").
func jsonKind(t reflect.Type) string {
	if t == nil {
		return "a value"
	}
	if t == reflect.TypeFor[json.Number]() {
		return "a number"
	}
	if t == reflect.TypeFor[json.RawMessage]() {
		return "a JSON value"
	}
	switch t.Kind() {
	case reflect.Pointer:
		return jsonKind(t.Elem())
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "an integer"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a non-negative integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Map, reflect.Struct:
		return "an object"
	}
	return "a value"
}

// jsonValueName is encoding/json's description of the value it found
// ("string", "number 1e400", "array", …), kept to its first word plus a
// short number: it is the client's own input, bounded.
func jsonValueName(v string) string {
	if len(v) > 40 {
		v = v[:40] + "…"
	}
	return v
}

// Statement is one SQL statement with its parameters.
type Statement struct {
	SQL    *string           `json:"sql"`
	Params []json.RawMessage `json:"params,omitempty"`
}

// QueryBody is the body of /query and /raw: either one statement or a batch.
type QueryBody struct {
	SQL    *string           `json:"sql,omitempty"`
	Params []json.RawMessage `json:"params,omitempty"`
	Batch  []Statement       `json:"batch,omitempty"`
}

// parseQueryBody validates a /query or /raw body: strict shape, SQL length,
// parameter count and types. The original bytes are forwarded to the host
// unchanged (after this check), so numbers keep their exact text.
func parseQueryBody(b []byte, l Limits) (QueryBody, error) {
	var q QueryBody
	if len(bytes.TrimSpace(b)) == 0 {
		return q, invalid("request body is empty: expected {\"sql\": …} or {\"batch\": […]}")
	}
	if err := decodeStrict(b, &q); err != nil {
		return q, err
	}
	switch {
	case q.Batch != nil && (q.SQL != nil || q.Params != nil):
		return q, invalid("use either sql/params or batch, not both")
	case q.Batch != nil:
		if len(q.Batch) == 0 {
			return q, invalid("batch is empty")
		}
		if len(q.Batch) > l.MaxBatch {
			return q, tooLarge("batch has %d statements, the limit is %d", len(q.Batch), l.MaxBatch)
		}
		for i, st := range q.Batch {
			if err := checkStatement(st.SQL, st.Params, l, fmt.Sprintf("batch[%d].", i)); err != nil {
				return q, err
			}
		}
	default:
		if err := checkStatement(q.SQL, q.Params, l, ""); err != nil {
			return q, err
		}
	}
	return q, nil
}

func checkStatement(sql *string, params []json.RawMessage, l Limits, where string) error {
	if sql == nil {
		return invalid("Invalid property: %ssql => required", where)
	}
	if terr := d1body.CheckString(*sql); terr != nil {
		// SQLite would stop at a NUL and drop the rest of the request
		// without an error: refuse it, and say where it is.
		return invalid("Invalid property: %ssql => contains %s: %s", where, terr, terr.Problem.SQLHint())
	}
	// Empty and whitespace-only SQL go to the object host, which answers as
	// D1 does (7500 "No SQL statements detected."; an empty batch entry is
	// dropped): docs/d1-compatibility.md.
	if len(*sql) > l.MaxSQLBytes {
		return tooLarge("%ssql is %d bytes, the limit is %d bytes per statement", where, len(*sql), l.MaxSQLBytes)
	}
	if len(params) > l.MaxParams {
		return invalid("%sparams has %d values, the limit is %d bound parameters", where, len(params), l.MaxParams)
	}
	for i, p := range params {
		if err := checkParam(p, l); err != nil {
			return invalid("Invalid property: %sparams[%d] => %s", where, i, err.Error())
		}
	}
	return nil
}

// checkParam accepts the JSON types D1 binds: string, number, boolean, null,
// and an array of byte values (a blob).
func checkParam(p json.RawMessage, l Limits) error {
	t := bytes.TrimSpace(p)
	if len(t) == 0 {
		return errors.New("empty value")
	}
	switch t[0] {
	case '"':
		if len(t) > l.MaxParamString+2 {
			return fmt.Errorf("string longer than %d bytes", l.MaxParamString)
		}
		return nil
	case 't', 'f', 'n', '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		return nil
	case '[':
		var blob []json.Number
		if err := json.Unmarshal(t, &blob); err != nil {
			return errors.New("arrays must hold byte values (a blob)")
		}
		if len(blob) > l.MaxParamString {
			return fmt.Errorf("blob longer than %d bytes", l.MaxParamString)
		}
		for _, n := range blob {
			v, err := n.Int64()
			if err != nil || v < 0 || v > 255 {
				return errors.New("arrays must hold byte values 0..255 (a blob)")
			}
		}
		return nil
	}
	return errors.New("expected a string, number, boolean, null or blob")
}

// CreateBody is the body of POST /d1/database.
type CreateBody struct {
	Name                *string `json:"name"`
	PrimaryLocationHint *string `json:"primary_location_hint,omitempty"`
	Jurisdiction        *string `json:"jurisdiction,omitempty"`
	// ReadReplication is the initial mode; absent or null means "disabled".
	ReadReplication *readReplicationBody `json:"read_replication,omitempty"`
}

// readReplicationBody is D1's read_replication input object.
type readReplicationBody struct {
	Mode *string `json:"mode"`
}

// mode validates the object: mode is required and "auto" or "disabled".
func (rr *readReplicationBody) mode() (string, error) {
	if rr.Mode == nil {
		return "", invalid("Invalid property: read_replication.mode => required")
	}
	if m := *rr.Mode; m != "auto" && m != "disabled" {
		return "", invalid("Invalid property: read_replication.mode => must be \"auto\" or \"disabled\"")
	}
	return *rr.Mode, nil
}

var (
	locationHints = map[string]bool{"wnam": true, "enam": true, "weur": true, "eeur": true, "apac": true, "oc": true}
	jurisdictions = map[string]bool{"eu": true, "fedramp": true, "us": true}
)

func parseCreateBody(b []byte, l Limits) (CreateBody, error) {
	var c CreateBody
	if err := decodeD1(b, &c); err != nil {
		return c, err
	}
	if c.Name == nil {
		return c, invalid("Invalid property: name => required")
	}
	if err := checkName(*c.Name, l); err != nil {
		return c, err
	}
	if c.PrimaryLocationHint != nil && *c.PrimaryLocationHint != "" {
		if err := checkLocationHint(*c.PrimaryLocationHint); err != nil {
			return c, err
		}
	}
	if c.Jurisdiction != nil && *c.Jurisdiction != "" && !jurisdictions[strings.ToLower(*c.Jurisdiction)] {
		return c, invalid("Invalid property: jurisdiction => must be one of eu, fedramp, us")
	}
	if c.ReadReplication != nil {
		if _, err := c.ReadReplication.mode(); err != nil {
			return c, err
		}
	}
	return c, nil
}

func checkLocationHint(h string) error {
	if !locationHints[strings.ToLower(h)] {
		return invalid("Invalid property: primary_location_hint => must be one of wnam, enam, weur, eeur, apac, oc")
	}
	return nil
}

// checkName applies D1's database name rules: lowercase ASCII letters,
// digits, '-' and '_', starting with a letter or digit.
func checkName(name string, l Limits) error {
	if name == "" || len(name) > l.MaxNameBytes {
		return invalid("Invalid property: name => must be 1 to %d characters", l.MaxNameBytes)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		ok := (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || ((c == '-' || c == '_') && i > 0)
		if !ok {
			return invalid("Invalid property: name => use lowercase letters, digits, '-' and '_' (starting with a letter or digit); byte offset %d is %s", i, nameByte(c))
		}
	}
	return nil
}

// nameByte describes a byte a name may not hold, without echoing control
// characters or broken UTF-8 back.
func nameByte(c byte) string {
	switch {
	case c == 0:
		return "a NUL character (U+0000)"
	case c < 0x20 || c == 0x7f:
		return fmt.Sprintf("the control character 0x%02x", c)
	case c >= 0x80:
		return "not ASCII"
	}
	return strconv.Quote(string(c))
}

// checkNameFilter validates the name filter of a list: any text, but
// exactly as sent (no NUL, valid UTF-8).
func checkNameFilter(name string) error {
	if len(name) > 256 {
		return invalid("Invalid property: name => too long")
	}
	if terr := d1body.CheckString(name); terr != nil {
		return invalid("Invalid property: name => contains %s", terr)
	}
	return nil
}

// UpdateBody is the body of PUT/PATCH /d1/database/{id}.
type UpdateBody struct {
	ReadReplication *readReplicationBody `json:"read_replication"`
}

// parseUpdateBody returns the new read replication mode, or "" when the
// body changes nothing (`{}`: D1 answers the database unchanged).
func parseUpdateBody(b []byte) (string, error) {
	var u UpdateBody
	if err := decodeD1(b, &u); err != nil {
		return "", err
	}
	if u.ReadReplication == nil {
		return "", nil
	}
	return u.ReadReplication.mode()
}

// canonicalUUID validates a database id from a path: the hyphenated 36-char
// form (any case); it returns the canonical lowercase text.
func canonicalUUID(s string) (string, error) {
	if len(s) != 36 {
		return "", invalid("Invalid property: databaseId => Invalid uuid")
	}
	u, err := uuid.Parse(s)
	if err != nil {
		return "", invalid("Invalid property: databaseId => Invalid uuid")
	}
	return u.String(), nil
}

// checkAccountID validates an account id from a path: 1..64 of [A-Za-z0-9_-].
func checkAccountID(s string) error {
	if s == "" || len(s) > 64 {
		return invalid("Invalid property: account_id => invalid")
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_') {
			return invalid("Invalid property: account_id => invalid")
		}
	}
	return nil
}

// validateQueryBody is parseQueryBody for the query path, which forwards the
// original bytes and needs no tree: the common body, {"sql": "...",
// "params": [scalars]}, is checked by a single scan (validSimpleQuery) that
// allocates nothing; anything it does not recognise — and every error, so the
// messages are the decoder's — goes through parseQueryBody. The scan accepts
// a strict subset of what parseQueryBody accepts (FuzzValidateQueryBody).
func validateQueryBody(b []byte, l Limits) error {
	if validSimpleQuery(b, l) {
		return nil
	}
	_, err := parseQueryBody(b, l)
	return err
}

// validSimpleQuery reports whether b is one JSON object with exactly the key
// "sql" (a string without escapes or control characters, valid UTF-8, not
// blank, within MaxSQLBytes) and optionally "params" (at most MaxParams
// values, each a string of the same kind within MaxParamString, a valid JSON
// number, true, false or null), keys spelled exactly, no duplicates, nothing
// after the object but whitespace. false means "not sure", not "invalid".
func validSimpleQuery(b []byte, l Limits) bool {
	n := 0
	sql, _, ok := d1body.Scan(b, func(start, end int, isString bool) bool {
		n++
		if n > l.MaxParams {
			return false
		}
		if isString {
			return end-start-2 <= l.MaxParamString // quotes excluded
		}
		return scalarLiteral(b[start:end])
	})
	return ok && len(sql) <= l.MaxSQLBytes && len(bytes.TrimSpace(sql)) > 0
}

// scalarLiteral accepts exactly true, false, null and JSON numbers.
func scalarLiteral(v []byte) bool {
	if len(v) == 0 {
		return false
	}
	switch string(v) {
	case "true", "false", "null":
		return true
	}
	if v[0] != '-' && (v[0] < '0' || v[0] > '9') {
		return false
	}
	return json.Valid(v)
}
