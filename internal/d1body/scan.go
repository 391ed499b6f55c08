// Package d1body recognises the common shape of a D1 query body,
// {"sql": "...", "params": [scalars]}, in one pass without allocating. It is
// the fast path shared by the edge (which validates and forwards the original
// bytes) and the object host's sqlexec (which builds its Request from it);
// both fall back to a strict encoding/json decoder for anything else, so the
// scanner only has to be right about what it accepts, never about errors.
//
// It also holds the text rules both sides enforce so that SQL is executed
// exactly as sent or refused, never changed silently: no NUL in SQL, no
// invalid UTF-8 or unpaired surrogate escapes anywhere (CheckText for bodies
// before a decoder sees them, CheckString for decoded SQL and names).
package d1body

import (
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// ParamFunc is called for each parameter with its span b[start:end] (quotes
// included for strings) and whether it is a string. Returning false stops the
// scan with ok == false.
type ParamFunc func(start, end int, isString bool) bool

// Scan reports whether b is exactly one JSON object whose keys are "sql" (a
// string) and optionally "params" (an array of strings and bare literals), in
// either order, spelled exactly, without duplicates, with nothing after the
// object but whitespace. Strings must have no escapes or control characters
// and be valid UTF-8, so their bytes are their decoded value (and sql holds
// no NUL: CheckString(sql) is always nil, FuzzScan). Bare literals
// are only delimited here (characters of numbers, true, false, null): param
// must check them. sql aliases b. ok == false means "not this shape", not
// "invalid": the caller then uses its decoder.
func Scan(b []byte, param ParamFunc) (sql []byte, hasParams bool, ok bool) {
	p := scanner{b: b}
	if !p.byte('{') {
		return nil, false, false
	}
	seenSQL := false
	for {
		key, ok := p.str()
		if !ok || !p.byte(':') {
			return nil, false, false
		}
		switch {
		case string(key) == "sql" && !seenSQL:
			if sql, ok = p.str(); !ok {
				return nil, false, false
			}
			seenSQL = true
		case string(key) == "params" && !hasParams:
			if !p.params(param) {
				return nil, false, false
			}
			hasParams = true
		default:
			return nil, false, false
		}
		if p.byte(',') {
			continue
		}
		if !p.byte('}') {
			return nil, false, false
		}
		break
	}
	p.ws()
	if p.i != len(p.b) || !seenSQL {
		return nil, false, false
	}
	return sql, hasParams, true
}

type scanner struct {
	b []byte
	i int
}

func (p *scanner) ws() {
	for p.i < len(p.b) {
		switch p.b[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

// byte skips whitespace and consumes c if it is next.
func (p *scanner) byte(c byte) bool {
	p.ws()
	if p.i < len(p.b) && p.b[p.i] == c {
		p.i++
		return true
	}
	return false
}

// str consumes a string without escapes or control characters and returns
// its contents (which are then its decoded value).
func (p *scanner) str() ([]byte, bool) {
	if !p.byte('"') {
		return nil, false
	}
	start := p.i
	for p.i < len(p.b) {
		c := p.b[p.i]
		switch {
		case c == '"':
			v := p.b[start:p.i]
			p.i++
			if !utf8.Valid(v) {
				return nil, false
			}
			return v, true
		case c == '\\' || c < 0x20:
			return nil, false
		}
		p.i++
	}
	return nil, false
}

// params consumes an array of strings and bare literals, handing each to fn.
func (p *scanner) params(fn ParamFunc) bool {
	if !p.byte('[') {
		return false
	}
	if p.byte(']') {
		return true
	}
	for {
		p.ws()
		start := p.i
		isString := p.i < len(p.b) && p.b[p.i] == '"'
		if isString {
			if _, ok := p.str(); !ok {
				return false
			}
		} else {
			for p.i < len(p.b) {
				c := p.b[p.i]
				if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c == '-' || c == '+' || c == '.' || c == 'E') {
					break
				}
				p.i++
			}
			if p.i == start {
				return false
			}
		}
		if !fn(start, p.i, isString) {
			return false
		}
		if p.byte(',') {
			continue
		}
		return p.byte(']')
	}
}

// Problem is a way text can fail to arrive exactly.
type Problem uint8

// The problems CheckText and CheckString report.
const (
	// NUL is a U+0000 character: SQLite ends SQL text at the first one, so
	// everything after it would be dropped silently. (A raw NUL byte is
	// not even JSON; inside a parameter string, escaped as \u0000, it is
	// legitimate data.)
	NUL Problem = iota + 1
	// InvalidUTF8 is a byte sequence that is not UTF-8: a JSON decoder
	// replaces it with U+FFFD, which changes the text silently.
	InvalidUTF8
	// LoneSurrogate is a \u escape of a UTF-16 surrogate without its pair:
	// it encodes no character, and a JSON decoder replaces it with U+FFFD.
	LoneSurrogate
)

func (p Problem) String() string {
	switch p {
	case NUL:
		return "a NUL character (U+0000)"
	case InvalidUTF8:
		return "invalid UTF-8"
	case LoneSurrogate:
		return "an unpaired UTF-16 surrogate escape"
	}
	return "invalid text"
}

// BodyHint tells a client how to send what CheckText refused.
func (p Problem) BodyHint() string {
	switch p {
	case NUL:
		return `JSON text cannot hold a raw NUL byte (in a parameter string write it as \u0000; SQL cannot hold one)`
	case InvalidUTF8:
		return "the body must be UTF-8 (send binary data as a blob parameter, an array of byte values)"
	case LoneSurrogate:
		return "it encodes no character"
	}
	return "the text cannot be decoded exactly"
}

// SQLHint tells a client why SQL that CheckString refused cannot run.
func (p Problem) SQLHint() string {
	switch p {
	case NUL:
		return "SQLite would ignore everything after it (bind values holding NUL as parameters)"
	case InvalidUTF8:
		return "SQL must be UTF-8"
	}
	return "SQL must be UTF-8 text"
}

// TextError locates the first problem in a body or SQL string.
type TextError struct {
	Problem Problem
	Offset  int // byte offset of the problem in the text checked
}

func (e *TextError) Error() string {
	return e.Problem.String() + " at byte offset " + strconv.Itoa(e.Offset)
}

// CheckText returns a *TextError for the first place where decoding the
// JSON body b would not give back exactly the text that was sent: a raw NUL
// byte (which no JSON value may hold), a byte sequence that is not UTF-8, or
// a \u escape of an unpaired surrogate (the last two a decoder replaces with
// U+FFFD without saying so). It returns nil otherwise, including for
// malformed JSON, which is the decoder's to report. \u0000 escapes are not
// reported: where a NUL is allowed (parameters) or not (SQL) is decided on
// the decoded values (CheckString). Bodies Scan accepts always pass.
func CheckText(b []byte) *TextError {
	inString := false
	for i := 0; i < len(b); {
		c := b[i]
		switch {
		case c == 0:
			return &TextError{Problem: NUL, Offset: i}
		case c >= utf8.RuneSelf:
			r, n := utf8.DecodeRune(b[i:])
			if r == utf8.RuneError && n == 1 {
				return &TextError{Problem: InvalidUTF8, Offset: i}
			}
			i += n
			continue
		case !inString:
			inString = c == '"'
		case c == '"':
			inString = false
		case c == '\\':
			if i+1 >= len(b) || b[i+1] == 0 || b[i+1] >= utf8.RuneSelf {
				break // the next byte is checked on its own
			}
			if b[i+1] == 'u' {
				if r, ok := hex4(b[i+2:]); ok && utf16.IsSurrogate(r) {
					if lo, ok := escapedHex4(b[i+6:]); r < 0xdc00 && ok && lo >= 0xdc00 && lo <= 0xdfff {
						i += 12 // a pair: one character
						continue
					}
					return &TextError{Problem: LoneSurrogate, Offset: i}
				}
			}
			i += 2
			continue
		}
		i++
	}
	return nil
}

// hex4 decodes four hex digits at the start of b.
func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range b[:4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		case c >= 'A' && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

// escapedHex4 decodes a \uXXXX escape at the start of b.
func escapedHex4(b []byte) (rune, bool) {
	if len(b) < 6 || b[0] != '\\' || b[1] != 'u' {
		return 0, false
	}
	return hex4(b[2:])
}

// CheckString returns a *TextError for the first NUL character or invalid
// UTF-8 in a decoded string (SQL, a name), nil if there is none. SQL with
// either is refused wherever it enters: SQLite would stop at the NUL
// (dropping the rest of the request without an error), and text that is not
// UTF-8 cannot have arrived unchanged through JSON.
func CheckString(s string) *TextError {
	if i := strings.IndexByte(s, 0); i >= 0 {
		if j := invalidUTF8(s[:i]); j >= 0 {
			return &TextError{Problem: InvalidUTF8, Offset: j}
		}
		return &TextError{Problem: NUL, Offset: i}
	}
	if j := invalidUTF8(s); j >= 0 {
		return &TextError{Problem: InvalidUTF8, Offset: j}
	}
	return nil
}

// invalidUTF8 returns the offset of the first invalid UTF-8 in s, or -1.
func invalidUTF8(s string) int {
	if utf8.ValidString(s) {
		return -1
	}
	for i, r := range s {
		if r == utf8.RuneError {
			if _, n := utf8.DecodeRuneInString(s[i:]); n == 1 {
				return i
			}
		}
	}
	return -1 // unreachable: s is not valid
}
