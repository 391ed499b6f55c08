package dump

import (
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"
)

// ImportOptions configure Import.
type ImportOptions struct {
	// MaxStatementBytes bounds one statement (and so the memory an import
	// needs); default 64 MiB, enough for a row holding a 2 MB blob as hex.
	MaxStatementBytes int
	// MaxDatabaseBytes, when > 0, caps the file (PRAGMA max_page_count), as
	// for user SQL.
	MaxDatabaseBytes int64
	// ProgressEvery is the number of statements between progress reports
	// and cancellation checks; default 1000.
	ProgressEvery int
	// Progress, when set, is called from the importing goroutine.
	Progress func(Progress)
}

// ImportResult is what a successful import did.
type ImportResult struct {
	Statements   int64 // statements executed (skipped transaction lines excluded)
	Bytes        int64 // input bytes read
	RowsWritten  int64 // sqlite3_total_changes over the import
	SizeAfter    int64 // database bytes after the import
	SkippedLines int64 // BEGIN/COMMIT/PRAGMA foreign_keys lines skipped
}

// StatementError is an import failure at one statement.
type StatementError struct {
	Number  int64  // 1-based, counting executed statements
	Line    int    // line of the input the statement starts on
	Snippet string // the statement's first 200 bytes
	Err     error
}

func (e *StatementError) Error() string {
	return fmt.Sprintf("statement %d (line %d) failed: %v: %s", e.Number, e.Line, e.Err, e.Snippet)
}

func (e *StatementError) Unwrap() error { return e.Err }

// ErrDenied wraps a statement refused by the import authorizer.
var ErrDenied = errors.New("not authorized")

// skipRe matches the transaction and foreign-key lines that sqlite3's .dump
// and our Export write around a dump: the import already runs in one
// transaction with foreign keys deferred to its commit.
var skipRe = regexp.MustCompile(`(?is)^\s*(BEGIN(\s+(DEFERRED|IMMEDIATE|EXCLUSIVE))?(\s+TRANSACTION)?|COMMIT(\s+TRANSACTION)?|END(\s+TRANSACTION)?|PRAGMA\s+foreign_keys\s*=\s*(OFF|ON|0|1|FALSE|TRUE)|PRAGMA\s+defer_foreign_keys\s*=\s*(OFF|ON|0|1|FALSE|TRUE))\s*;?\s*$`)

// Import executes the SQL read from r against the SQLite file at path, in
// ONE transaction on its own connection: either every statement applies or
// none does (a failing statement rolls everything back and is reported as a
// *StatementError). Memory is bounded by MaxStatementBytes whatever the
// input size. Statements are held to the rules of user SQL by an authorizer
// (no ATTACH, no transaction control, PRAGMA allowlist, no temp objects, no
// reserved names); BEGIN/COMMIT and PRAGMA foreign_keys lines written by
// .dump are skipped, and foreign keys are checked at commit
// (defer_foreign_keys), so a dump's table order does not matter.
//
// The caller must make sure no other connection writes the file meanwhile
// or accept that those writers wait (busy timeout) for the import's write
// lock.
func Import(ctx context.Context, path string, r io.Reader, o ImportOptions) (ImportResult, error) {
	if o.MaxStatementBytes <= 0 {
		o.MaxStatementBytes = 64 << 20
	}
	if o.ProgressEvery <= 0 {
		o.ProgressEvery = 1000
	}
	g := &guard{}
	db := openDB(path, g, false)
	defer db.Close()
	conn, err := db.Conn(ctx)
	if err != nil {
		return ImportResult{}, fmt.Errorf("import: open: %w", err)
	}
	defer conn.Close()
	internal := func(q string) error {
		g.internal.Store(true)
		defer g.internal.Store(false)
		_, err := conn.ExecContext(context.Background(), q)
		return err
	}
	queryInt := func(q string) (int64, error) {
		g.internal.Store(true)
		defer g.internal.Store(false)
		var n int64
		err := conn.QueryRowContext(context.Background(), q).Scan(&n)
		return n, err
	}
	if err := internal("PRAGMA journal_mode=WAL"); err != nil {
		return ImportResult{}, fmt.Errorf("import: wal: %w", err)
	}
	if err := internal("PRAGMA foreign_keys=ON"); err != nil {
		return ImportResult{}, err
	}
	if o.MaxDatabaseBytes > 0 {
		ps, err := queryInt("PRAGMA page_size")
		if err != nil {
			return ImportResult{}, err
		}
		if err := internal(fmt.Sprintf("PRAGMA max_page_count=%d", max(1, o.MaxDatabaseBytes/ps))); err != nil {
			return ImportResult{}, err
		}
	}
	before, err := queryInt("SELECT total_changes()")
	if err != nil {
		return ImportResult{}, err
	}
	if err := internal("BEGIN IMMEDIATE"); err != nil {
		return ImportResult{}, fmt.Errorf("import: begin: %w", err)
	}
	committed := false
	defer func() {
		if !committed {
			_ = internal("ROLLBACK")
		}
	}()
	if err := internal("PRAGMA defer_foreign_keys=ON"); err != nil {
		return ImportResult{}, err
	}

	sp := NewSplitter(r, o.MaxStatementBytes)
	var res ImportResult
	report := func() {
		res.Bytes = sp.Offset()
		if o.Progress != nil {
			o.Progress(Progress{Bytes: res.Bytes, Statements: res.Statements})
		}
	}
	for {
		st, err := sp.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return res, fmt.Errorf("import: read: %w", err)
		}
		if st.Blank {
			continue
		}
		if skipRe.MatchString(st.Raw) {
			res.SkippedLines++
			continue
		}
		res.Statements++
		g.denied.Store(nil)
		if _, err := conn.ExecContext(ctx, st.Raw); err != nil {
			if why := g.denied.Load(); why != nil && strings.Contains(err.Error(), "not authorized") {
				err = fmt.Errorf("%w: %s", ErrDenied, *why)
			}
			return res, &StatementError{Number: res.Statements, Line: st.Line, Snippet: snippet(st.Raw), Err: err}
		}
		if res.Statements%int64(o.ProgressEvery) == 0 {
			if err := ctx.Err(); err != nil {
				return res, err
			}
			report()
		}
	}
	// Checkpoint: COMMIT. Deferred foreign-key violations surface here and
	// roll the whole import back.
	if err := internal("COMMIT"); err != nil {
		return res, fmt.Errorf("import: commit: %w", err)
	}
	committed = true
	report()
	if after, err := queryInt("SELECT total_changes()"); err == nil {
		res.RowsWritten = after - before
	}
	pages, err1 := queryInt("PRAGMA page_count")
	ps, err2 := queryInt("PRAGMA page_size")
	if err1 == nil && err2 == nil {
		res.SizeAfter = pages * ps
	}
	return res, nil
}

func snippet(s string) string {
	s = strings.TrimSpace(s)
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}
