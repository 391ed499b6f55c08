// Package d1body recognises the common shape of a D1 query body,
// {"sql": "...", "params": [scalars]}, in one pass without allocating. It is
// the fast path shared by the edge (which validates and forwards the original
// bytes) and the object host's sqlexec (which builds its Request from it);
// both fall back to a strict encoding/json decoder for anything else, so the
// scanner only has to be right about what it accepts, never about errors.
package d1body

import "unicode/utf8"

// ParamFunc is called for each parameter with its span b[start:end] (quotes
// included for strings) and whether it is a string. Returning false stops the
// scan with ok == false.
type ParamFunc func(start, end int, isString bool) bool

// Scan reports whether b is exactly one JSON object whose keys are "sql" (a
// string) and optionally "params" (an array of strings and bare literals), in
// either order, spelled exactly, without duplicates, with nothing after the
// object but whitespace. Strings must have no escapes or control characters
// and be valid UTF-8, so their bytes are their decoded value. Bare literals
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
