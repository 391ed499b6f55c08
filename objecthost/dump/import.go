package dump

import (
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"

	"github.com/shoaldb/shoal/internal/d1body"
	"github.com/shoaldb/shoal/objecthost/sqlexec"
)

// ImportOptions configure Import.
type ImportOptions struct {
	// MaxStatementBytes bounds one statement (and so the memory an import
	// needs); default 64 MiB, enough for a row holding a 2 MB blob as hex.
	// It is also the statement length limit sqlexec applies to the import
	// (ScriptOptions.MaxStatementBytes): a dump carries values as literals.
	MaxStatementBytes int
	// ProgressEvery is the number of statements between progress reports;
	// default 1000.
	ProgressEvery int
	// Progress, when set, is called on the database's writer goroutine
	// while the import runs: it must be quick and must not use the DB.
	Progress func(Progress)
	// BlockGrowth refuses an import that grows the file (the account is
	// over its storage limit), as for user SQL.
	BlockGrowth bool
	// Record, when set, is sqlexec's ScriptOptions.Record: internal
	// statements committed in the import's own transaction (the object
	// host's record of its import job), given the import's result; an
	// error rolls the import back.
	Record func(ImportResult) ([]sqlexec.InternalStatement, error)
	// AfterCommit, when set, is sqlexec's ScriptOptions.AfterCommit: called
	// on the writer goroutine right after the import's COMMIT, before any
	// other write can commit.
	AfterCommit func()
}

// ImportResult is what a successful import did.
type ImportResult struct {
	Statements   int64 // statements executed (skipped transaction lines excluded)
	Bytes        int64 // input bytes read
	RowsRead     int64 // D1's rows_read over the import
	RowsWritten  int64 // D1's rows_written (rows + index entries) over the import
	Changes      int64 // rows changed (sqlite3_changes summed)
	SizeAfter    int64 // database bytes after the import
	SkippedLines int64 // BEGIN/COMMIT/PRAGMA foreign_keys lines skipped
}

// StatementError is an import failure at one statement.
type StatementError struct {
	Number  int64  // 1-based, counting executed statements
	Line    int    // line of the input the statement starts on
	Snippet string // the statement's first 200 bytes
	Err     error  // usually an *sqlexec.Error
}

func (e *StatementError) Error() string {
	msg := e.Err.Error()
	var se *sqlexec.Error
	if errors.As(e.Err, &se) {
		msg = se.Message // D1's text without the numeric code
	}
	return fmt.Sprintf("statement %d (line %d) failed: %s: %s", e.Number, e.Line, msg, e.Snippet)
}

func (e *StatementError) Unwrap() error { return e.Err }

// TextError is an import refused because its input is not text SQLite would
// run exactly as written: a NUL byte (SQLite stops reading a statement at
// one, so the rest would be dropped without an error) or bytes that are not
// UTF-8. It is found before the statement holding it runs, and nothing of
// the import is kept.
type TextError struct {
	Problem d1body.Problem // d1body.NUL or d1body.InvalidUTF8
	Line    int            // 1-based line of the input
	Offset  int64          // byte offset in the input
}

func (e *TextError) Error() string {
	hint := "SQL cannot hold NUL (write such values as blob literals, X'00', or CAST(X'..' AS TEXT))"
	if e.Problem == d1body.InvalidUTF8 {
		hint = "the file must be UTF-8 (write other bytes as blob literals, X'..')"
	}
	return fmt.Sprintf("import refused: %s at line %d (byte offset %d of the file): %s; nothing was imported", e.Problem, e.Line, e.Offset, hint)
}

// skipRe matches the transaction and foreign-key lines that sqlite3's .dump
// and our Export write around a dump: the import already runs in one
// transaction with foreign keys deferred to its commit.
var skipRe = regexp.MustCompile(`(?is)^\s*(BEGIN(\s+(DEFERRED|IMMEDIATE|EXCLUSIVE))?(\s+TRANSACTION)?|COMMIT(\s+TRANSACTION)?|END(\s+TRANSACTION)?|PRAGMA\s+foreign_keys\s*=\s*(OFF|ON|0|1|FALSE|TRUE)|PRAGMA\s+defer_foreign_keys\s*=\s*(OFF|ON|0|1|FALSE|TRUE))\s*;?\s*$`)

// ImportDB executes the SQL read from r against db in ONE transaction on
// db's writer connection (sqlexec.DB.ExecScript): either every statement
// applies or none does (a failing statement rolls everything back and is
// reported as a *StatementError; input holding a NUL byte or invalid UTF-8,
// anywhere, as a *TextError). The statements run in sqlexec's sandbox
// for user SQL — the same authorizer (no ATTACH, no transaction control,
// PRAGMA allowlist, no temp objects, no reserved names), defensive mode,
// limits and max_page_count — and their rows read and written are
// counted as for queries. Memory is bounded by MaxStatementBytes whatever
// the input size. BEGIN/COMMIT and PRAGMA foreign_keys lines written by
// .dump are skipped, and foreign keys are checked at commit
// (defer_foreign_keys), so a dump's table order does not matter.
//
// While it runs, other writes to db queue behind it and run after its
// commit; reads keep being served from the state before it.
//
// An error wrapping *sqlexec.CommittedError is the one failure after which
// the import HAS applied (the commit hook refused to acknowledge it, e.g.
// durability "archived" without the archive's confirmation): the result
// is then complete.
func ImportDB(ctx context.Context, db *sqlexec.DB, r io.Reader, o ImportOptions) (ImportResult, error) {
	if o.MaxStatementBytes <= 0 {
		o.MaxStatementBytes = 64 << 20
	}
	sp := NewSplitter(r, o.MaxStatementBytes)
	var res ImportResult
	var last Statement // the statement next returned last: the one running
	var offset int64   // of the next piece: the pieces concatenate to the input
	line := 1
	next := func() (string, error) {
		for {
			st, err := sp.Next()
			if err != nil {
				return "", err // io.EOF ends the script
			}
			// Every piece, comments included: the file is refused whole.
			if terr := d1body.CheckString(st.Raw); terr != nil {
				return "", &TextError{Problem: terr.Problem, Line: line + strings.Count(st.Raw[:terr.Offset], "\n"), Offset: offset + int64(terr.Offset)}
			}
			offset += int64(len(st.Raw))
			line += strings.Count(st.Raw, "\n")
			if st.Blank {
				continue
			}
			if skipRe.MatchString(st.Raw) {
				res.SkippedLines++
				continue
			}
			last = st
			return st.Raw, nil
		}
	}
	report := func(n int) {
		res.Bytes = sp.Offset()
		res.Statements = int64(n)
		if o.Progress != nil {
			o.Progress(Progress{Bytes: res.Bytes, Statements: res.Statements})
		}
	}
	so := sqlexec.ScriptOptions{
		Progress:          report,
		ProgressEvery:     o.ProgressEvery,
		DeferForeignKeys:  true,
		BlockGrowth:       o.BlockGrowth,
		MaxStatementBytes: o.MaxStatementBytes,
		// .dump restores AUTOINCREMENT counters with DML on sqlite_sequence.
		AllowSequenceWrites: true,
	}
	if o.Record != nil {
		so.Record = func(sr sqlexec.ScriptResult) ([]sqlexec.InternalStatement, error) {
			r := res // writer goroutine, as next: no race on res
			r.Bytes, r.Statements = sp.Offset(), int64(sr.Statements)
			r.RowsRead, r.RowsWritten, r.Changes, r.SizeAfter = sr.RowsRead, sr.RowsWritten, sr.Changes, sr.SizeAfter
			return o.Record(r)
		}
	}
	so.AfterCommit = o.AfterCommit
	sr, err := db.ExecScript(ctx, next, so)
	res.Bytes = sp.Offset()
	var committed *sqlexec.CommittedError
	if err != nil && !errors.As(err, &committed) {
		var te *TextError
		if errors.As(err, &te) {
			return res, te
		}
		var se *sqlexec.ScriptError
		if errors.As(err, &se) {
			res.Statements = int64(se.Statement)
			var sqlErr *sqlexec.Error
			if se.Statement > 0 && errors.As(se.Err, &sqlErr) && !errors.Is(err, context.Canceled) {
				// The failing statement is the last one next returned:
				// ExecScript runs each before asking for the next.
				return res, &StatementError{Number: int64(se.Statement), Line: last.Line, Snippet: snippet(last.Raw), Err: sqlErr}
			}
			if errors.Is(err, ErrStatementTooLarge) || errors.Is(err, context.Canceled) || errors.Is(err, sqlexec.ErrClosed) {
				return res, err
			}
			if se.Statement == 0 {
				return res, fmt.Errorf("import: commit: %w", err)
			}
		}
		return res, fmt.Errorf("import: %w", err)
	}
	res.Statements = int64(sr.Statements)
	res.RowsRead, res.RowsWritten, res.Changes, res.SizeAfter = sr.RowsRead, sr.RowsWritten, sr.Changes, sr.SizeAfter
	return res, err // nil, or the import applied: *sqlexec.CommittedError
}

// Import opens the SQLite file at path with sqlexec (default limits, no
// reader connections), runs ImportDB and closes it. For tools and tests;
// the object host imports into the DB it already has open, since a
// second sqlexec.DB on the same file would be a second writer.
func Import(ctx context.Context, path string, r io.Reader, o ImportOptions) (ImportResult, error) {
	db, err := sqlexec.Open(path, sqlexec.Options{ReadConns: -1})
	if err != nil {
		return ImportResult{}, fmt.Errorf("import: open: %w", err)
	}
	defer db.Close()
	return ImportDB(ctx, db, r, o)
}

func snippet(s string) string {
	s = strings.TrimSpace(s)
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}
