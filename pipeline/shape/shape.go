// Package shape normalises SQL into query shapes: the statement with its
// literals replaced by ?, whitespace collapsed and keywords kept as written,
// so "SELECT * FROM t WHERE id = 7" and "... id = 42" are one shape. Usage
// is pre-aggregated per shape on the hosts and query insights (what
// `wrangler d1 insights` reports) are ranked per shape.
package shape

import (
	"hash/fnv"
	"strings"
)

// MaxLen bounds a shape's text; longer ones are cut (the hash is of the
// whole normalised text, so two long shapes that differ late stay apart).
const MaxLen = 512

// Of returns the shape of sql and its 64-bit FNV-1a hash.
func Of(sql string) (string, uint64) {
	var b strings.Builder
	b.Grow(min(len(sql), MaxLen+16))
	h := fnv.New64a()
	space := false
	emit := func(s string) {
		_, _ = h.Write([]byte(s))
		if b.Len() < MaxLen {
			b.WriteString(s)
		}
	}
	for i := 0; i < len(sql); {
		c := sql[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f':
			space = true
			i++
			continue
		case c == '-' && i+1 < len(sql) && sql[i+1] == '-': // line comment
			for i < len(sql) && sql[i] != '\n' {
				i++
			}
			space = true
			continue
		case c == '/' && i+1 < len(sql) && sql[i+1] == '*': // block comment
			j := strings.Index(sql[i+2:], "*/")
			if j < 0 {
				i = len(sql)
			} else {
				i += j + 4
			}
			space = true
			continue
		}
		if space && b.Len() > 0 {
			emit(" ")
		}
		space = false
		switch {
		case c == '\'': // string literal ('' escapes a quote)
			i++
			for i < len(sql) {
				if sql[i] == '\'' {
					if i+1 < len(sql) && sql[i+1] == '\'' {
						i += 2
						continue
					}
					i++
					break
				}
				i++
			}
			emit("?")
		case (c == 'x' || c == 'X') && i+1 < len(sql) && sql[i+1] == '\'' && !identBefore(sql, i): // blob literal
			i += 2
			for i < len(sql) && sql[i] != '\'' {
				i++
			}
			i++
			emit("?")
		case isDigit(c) && !identBefore(sql, i):
			for i < len(sql) && (isDigit(sql[i]) || sql[i] == '.' || sql[i] == 'e' || sql[i] == 'E' || sql[i] == 'x' || sql[i] == 'X' ||
				(sql[i] >= 'a' && sql[i] <= 'f') || (sql[i] >= 'A' && sql[i] <= 'F') ||
				((sql[i] == '+' || sql[i] == '-') && (sql[i-1] == 'e' || sql[i-1] == 'E'))) {
				i++
			}
			emit("?")
		case c == '?': // a numbered parameter ?NNN stays as written
			j := i + 1
			for j < len(sql) && isDigit(sql[j]) {
				j++
			}
			emit(sql[i:j])
			i = j
		case c == '"' || c == '`' || c == '[': // quoted identifier: kept
			end := byte('"')
			switch c {
			case '`':
				end = '`'
			case '[':
				end = ']'
			}
			j := i + 1
			for j < len(sql) && sql[j] != end {
				j++
			}
			j = min(j+1, len(sql))
			emit(sql[i:j])
			i = j
		default:
			j := i + 1
			if isIdent(c) {
				for j < len(sql) && isIdent(sql[j]) {
					j++
				}
			}
			emit(sql[i:j])
			i = j
		}
	}
	return b.String(), h.Sum64()
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func isIdent(c byte) bool {
	return c == '_' || c == '$' || isDigit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80
}

// identBefore reports whether sql[i] continues an identifier (t1, x'…' in
// "max'" cannot happen, but "col1" must keep its digit).
func identBefore(sql string, i int) bool { return i > 0 && isIdent(sql[i-1]) }
