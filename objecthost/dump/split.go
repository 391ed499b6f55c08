package dump

import (
	"bufio"
	"errors"
	"fmt"
	"io"
)

// ErrStatementTooLarge is returned by Splitter.Next when one statement
// exceeds the splitter's size bound: the bound is what keeps an import's
// memory use independent of the file size.
var ErrStatementTooLarge = errors.New("dump: statement too large")

// Token classes of SQLite's sqlite3_complete state machine (complete.c).
const (
	tkSemi = iota
	tkWS
	tkOther
	tkExplain
	tkCreate
	tkTemp
	tkTrigger
	tkEnd
)

// trans is sqlite3_complete's transition table: state × token → state.
// State 1 (START) reached through a ';' means a statement just completed;
// states 5–7 are inside a CREATE TRIGGER body, where ';' only ends the
// statement after "END".
var trans = [8][8]uint8{
	/* 0 INVALID */ {1, 0, 2, 3, 4, 2, 2, 2},
	/* 1 START   */ {1, 1, 2, 3, 4, 2, 2, 2},
	/* 2 NORMAL  */ {1, 2, 2, 2, 2, 2, 2, 2},
	/* 3 EXPLAIN */ {1, 3, 3, 2, 4, 2, 2, 2},
	/* 4 CREATE  */ {1, 4, 2, 2, 2, 4, 5, 2},
	/* 5 TRIGGER */ {6, 5, 5, 5, 5, 5, 5, 5},
	/* 6 SEMI    */ {6, 6, 5, 5, 5, 5, 5, 7},
	/* 7 END     */ {1, 7, 5, 5, 5, 5, 5, 5},
}

// Splitter cuts a stream of SQL text into statements the way SQLite's
// sqlite3_complete decides a statement is complete: it understands '…',
// "…", `…` and […] quoting, -- and /* */ comments, and the BEGIN … END body
// of CREATE TRIGGER. It holds at most one statement in memory.
//
// Not safe for concurrent use.
type Splitter struct {
	r     *bufio.Reader
	max   int
	state uint8
	buf   []byte
	n     int64 // bytes consumed
	line  int   // current line (1-based)
	err   error
}

// Statement is one piece of the input.
type Statement struct {
	// Raw is the exact input text: leading whitespace and comments, the
	// statement, and its terminating ';' if any. Concatenating every Raw of
	// a stream gives back the stream.
	Raw string
	// Line is the line of the input the statement's first token is on.
	Line int
	// Blank is true when Raw holds only whitespace, comments and ';'.
	Blank bool
	// Complete is false only for trailing text without its final ';'.
	Complete bool
}

// NewSplitter returns a splitter reading r; a statement longer than
// maxBytes fails with ErrStatementTooLarge.
func NewSplitter(r io.Reader, maxBytes int) *Splitter {
	return &Splitter{r: bufio.NewReaderSize(r, 64<<10), max: maxBytes, line: 1}
}

// Offset returns the number of input bytes consumed so far.
func (s *Splitter) Offset() int64 { return s.n }

func (s *Splitter) read() (byte, bool) {
	if s.err != nil {
		return 0, false
	}
	if len(s.buf) >= s.max {
		s.err = fmt.Errorf("%w: over %d bytes", ErrStatementTooLarge, s.max)
		return 0, false
	}
	c, err := s.r.ReadByte()
	if err != nil {
		s.err = err
		return 0, false
	}
	s.n++
	if c == '\n' {
		s.line++
	}
	s.buf = append(s.buf, c)
	return c, true
}

func (s *Splitter) peek() (byte, bool) {
	if s.err != nil {
		return 0, false
	}
	b, err := s.r.Peek(1)
	if err != nil {
		return 0, false
	}
	return b[0], true
}

func isIDChar(c byte) bool {
	return c >= 0x80 || c == '_' || c == '$' || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
}

// Next returns the next statement, or io.EOF after the last one. Blank
// pieces (only whitespace/comments) are returned too, with Blank set, so
// the concatenation property holds; callers skip them.
func (s *Splitter) Next() (Statement, error) {
	s.buf = s.buf[:0]
	// A new statement starts in sqlite3_complete's state 0 (nothing seen).
	s.state = 0
	blank := true
	line := 0
	for {
		startLine := s.line
		c, ok := s.read()
		if !ok {
			break
		}
		tok := tkOther
		switch {
		case c == ';':
			tok = tkSemi
		case c == ' ' || c == '\t' || c == '\n' || c == '\f' || c == '\r':
			tok = tkWS
		case c == '/':
			if p, ok := s.peek(); ok && p == '*' {
				s.read()
				s.skipBlockComment()
				tok = tkWS
			}
		case c == '-':
			if p, ok := s.peek(); ok && p == '-' {
				for {
					d, ok := s.read()
					if !ok || d == '\n' {
						break
					}
				}
				tok = tkWS
			}
		case c == '[':
			s.readUntil(']')
		case c == '`' || c == '"' || c == '\'':
			s.readUntil(c)
		case isIDChar(c):
			start := len(s.buf) - 1
			for {
				p, ok := s.peek()
				if !ok || !isIDChar(p) {
					break
				}
				s.read()
			}
			if c >= '0' && c <= '9' {
				tok = tkOther
			} else {
				tok = keyword(s.buf[start:])
			}
		}
		if tok != tkWS && tok != tkSemi && blank {
			blank = false
			line = startLine
		}
		s.state = trans[s.state][tok]
		if tok == tkSemi && s.state == 1 {
			return Statement{Raw: string(s.buf), Line: line, Blank: blank, Complete: true}, nil
		}
	}
	if s.err != nil && !errors.Is(s.err, io.EOF) {
		if errors.Is(s.err, ErrStatementTooLarge) {
			return Statement{}, fmt.Errorf("%w (statement starting at line %d)", s.err, line)
		}
		return Statement{}, s.err
	}
	if len(s.buf) == 0 {
		return Statement{}, io.EOF
	}
	return Statement{Raw: string(s.buf), Line: line, Blank: blank, Complete: false}, nil
}

func (s *Splitter) skipBlockComment() {
	var prev byte
	for {
		c, ok := s.read()
		if !ok || (prev == '*' && c == '/') {
			return
		}
		prev = c
	}
}

func (s *Splitter) readUntil(q byte) {
	for {
		c, ok := s.read()
		if !ok || c == q {
			return
		}
	}
}

func keyword(b []byte) int {
	switch len(b) {
	case 3:
		if eqFold(b, "end") {
			return tkEnd
		}
	case 4:
		if eqFold(b, "temp") {
			return tkTemp
		}
	case 6:
		if eqFold(b, "create") {
			return tkCreate
		}
	case 7:
		if eqFold(b, "trigger") {
			return tkTrigger
		}
		if eqFold(b, "explain") {
			return tkExplain
		}
	case 9:
		if eqFold(b, "temporary") {
			return tkTemp
		}
	}
	return tkOther
}

func eqFold(b []byte, lower string) bool {
	for i := range b {
		c := b[i]
		if c >= 'A' && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != lower[i] {
			return false
		}
	}
	return true
}
