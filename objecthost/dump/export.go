package dump

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Options select what a dump holds (D1's dump_options).
type Options struct {
	NoData   bool     `json:"no_data,omitempty"`
	NoSchema bool     `json:"no_schema,omitempty"`
	Tables   []string `json:"tables,omitempty"` // only these tables (and their indexes and triggers)
}

// Progress is reported during exports and imports.
type Progress struct {
	Bytes      int64 // bytes written (export) or read (import)
	Statements int64 // statements written or executed
}

// ErrNoSuchTable is returned by Export when Options.Tables names a table
// the database does not have (or a reserved one).
var ErrNoSuchTable = errors.New("no such table")

type schemaObj struct {
	typ, name, tbl, sql string
	virtual             bool // CREATE VIRTUAL TABLE
	shadow              bool // a virtual table's shadow table
}

var contentOpt = regexp.MustCompile(`(?i)\bcontent\s*=\s*('([^']|'')*'|"([^"]|"")*"|[A-Za-z_0-9]+)`)

// Header is the first line of every export: D1's exports start with it,
// so that a dump whose tables reference each other imports in any order
// (foreign keys are checked at the import's commit).
const Header = "PRAGMA defer_foreign_keys=TRUE;"

// Export writes an SQL dump of the SQLite file at path to w. The dump is
// taken from one read transaction on its own connection, so it is a
// consistent snapshot while the database keeps serving reads and writes
// (WAL). A file that does not exist dumps as an empty database.
//
// Format: D1's own export — Header ("PRAGMA defer_foreign_keys=TRUE;"),
// each table's CREATE and its rows, sqlite_sequence, then indexes,
// triggers and views in creation order; no BEGIN TRANSACTION / COMMIT,
// which D1's import refuses (D1 runs an import in a transaction of its
// own, as Shoal's import does). Integers are
// exact, reals are Go's shortest round-trip form, text is quoted, blobs are
// X'…'. A virtual table is dumped as its CREATE VIRTUAL TABLE plus its rows
// (with rowids) instead of its shadow tables, so FTS5 tables round-trip;
// an external-content FTS5 table gets a 'rebuild' after all data. Reserved
// tables (_cf_*, _shoal_*, sqlite_*) are never dumped.
func Export(ctx context.Context, path string, w io.Writer, opts Options, progress func(Progress)) (err error) {
	cw := &countWriter{w: w}
	bw := bufio.NewWriterSize(cw, 64<<10)
	e := &exporter{bw: bw, cw: cw, progress: progress}
	// Nothing is flushed on error: a failure before the first 64 KB (an
	// unknown table, an unreadable file) reaches w as no bytes at all.
	defer func() {
		if err == nil {
			err = bw.Flush()
		}
		e.report()
	}()
	if _, serr := os.Stat(path); errors.Is(serr, os.ErrNotExist) {
		if len(opts.Tables) > 0 {
			return fmt.Errorf("%w: %s", ErrNoSuchTable, opts.Tables[0])
		}
		e.line(Header)
		return e.err
	}
	db := openDB(path, true)
	defer db.Close()
	conn, err := db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("dump: open: %w", err)
	}
	defer conn.Close()
	// Checkpoint: the first read inside BEGIN fixes the snapshot; everything
	// below reads that one state of the database.
	if _, err := conn.ExecContext(ctx, "BEGIN"); err != nil {
		return fmt.Errorf("dump: begin: %w", err)
	}
	defer conn.ExecContext(context.Background(), "ROLLBACK") //nolint:errcheck // read-only
	e.conn = conn
	objs, err := e.schema(ctx)
	if err != nil {
		return err
	}
	sel, err := selectTables(objs, opts.Tables)
	if err != nil {
		return err
	}
	e.line(Header)
	var rebuild []string
	for _, o := range objs {
		if o.typ != "table" || o.shadow || !sel[strings.ToLower(o.name)] {
			continue
		}
		if !opts.NoSchema {
			e.line(o.sql + ";")
		}
		if opts.NoData {
			continue
		}
		if o.virtual {
			m := contentOpt.FindStringSubmatch(o.sql)
			if m != nil {
				v := strings.Trim(m[1], `'"`)
				if v == "" {
					e.line("-- contentless virtual table " + quoteIdent(o.name) + ": rows cannot be exported")
				} else {
					rebuild = append(rebuild, fmt.Sprintf("INSERT INTO %s(%s) VALUES('rebuild');", quoteIdent(o.name), quoteIdent(o.name)))
				}
				continue
			}
		}
		if err := e.rows(ctx, o); err != nil {
			return err
		}
	}
	if !opts.NoData {
		if err := e.sequence(ctx, sel); err != nil {
			return err
		}
		for _, s := range rebuild {
			e.line(s)
		}
	}
	if !opts.NoSchema {
		for _, o := range objs {
			if o.typ == "table" {
				continue
			}
			if o.typ == "view" && len(opts.Tables) > 0 {
				continue
			}
			if o.typ != "view" && !sel[strings.ToLower(o.tbl)] {
				continue
			}
			e.line(o.sql + ";")
		}
	}
	return e.err
}

func selectTables(objs []schemaObj, want []string) (map[string]bool, error) {
	sel := map[string]bool{}
	for _, o := range objs {
		if o.typ == "table" && (len(want) == 0) {
			sel[strings.ToLower(o.name)] = true
		}
	}
	for _, t := range want {
		found := false
		for _, o := range objs {
			if o.typ == "table" && !o.shadow && strings.EqualFold(o.name, t) {
				found = true
				sel[strings.ToLower(o.name)] = true
			}
		}
		if !found {
			return nil, fmt.Errorf("%w: %s", ErrNoSuchTable, t)
		}
	}
	return sel, nil
}

type exporter struct {
	conn     *sql.Conn
	bw       *bufio.Writer
	cw       *countWriter
	stmts    int64
	err      error
	progress func(Progress)
	buf      []byte
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

func (e *exporter) line(s string) {
	if e.err != nil {
		return
	}
	if _, err := e.bw.WriteString(s); err != nil {
		e.err = err
		return
	}
	e.err = e.bw.WriteByte('\n')
	e.stmts++
}

func (e *exporter) report() {
	if e.progress != nil {
		e.progress(Progress{Bytes: e.cw.n, Statements: e.stmts})
	}
}

// schema lists user objects in creation (rowid) order, tagging virtual and
// shadow tables from PRAGMA table_list.
func (e *exporter) schema(ctx context.Context) ([]schemaObj, error) {
	kinds := map[string]string{}
	rows, err := e.conn.QueryContext(ctx, "SELECT name, type FROM pragma_table_list WHERE schema='main'")
	if err != nil {
		return nil, fmt.Errorf("dump: table list: %w", err)
	}
	for rows.Next() {
		var n, t string
		if err := rows.Scan(&n, &t); err != nil {
			rows.Close()
			return nil, err
		}
		kinds[strings.ToLower(n)] = t
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	rows, err = e.conn.QueryContext(ctx, "SELECT type, name, tbl_name, sql FROM sqlite_schema WHERE sql IS NOT NULL ORDER BY rowid")
	if err != nil {
		return nil, fmt.Errorf("dump: schema: %w", err)
	}
	defer rows.Close()
	var out []schemaObj
	for rows.Next() {
		var o schemaObj
		if err := rows.Scan(&o.typ, &o.name, &o.tbl, &o.sql); err != nil {
			return nil, err
		}
		if internalName(o.name) || reservedName(o.name) || reservedName(o.tbl) || internalName(o.tbl) {
			continue
		}
		k := kinds[strings.ToLower(o.name)]
		o.virtual = k == "virtual"
		o.shadow = k == "shadow"
		if o.shadow {
			continue
		}
		out = append(out, o)
	}
	return out, rows.Err()
}

// rows writes one INSERT per row. Values are selected as "+col": an
// expression has no declared type, so the driver returns SQLite's storage
// class untouched (no DATETIME → time.Time or BOOLEAN → bool conversion).
func (e *exporter) rows(ctx context.Context, o schemaObj) error {
	cols, err := e.columns(ctx, o.name)
	if err != nil {
		return err
	}
	if len(cols) == 0 {
		return nil
	}
	sel := make([]string, 0, len(cols)+1)
	names := make([]string, 0, len(cols)+1)
	if o.virtual {
		sel = append(sel, "+rowid")
		names = append(names, "rowid")
	}
	for _, c := range cols {
		sel = append(sel, "+"+quoteIdent(c))
		names = append(names, quoteIdent(c))
	}
	prefix := "INSERT INTO " + quoteIdent(o.name) + "(" + strings.Join(names, ",") + ") VALUES("
	q := "SELECT " + strings.Join(sel, ",") + " FROM " + quoteIdent(o.name)
	rows, err := e.conn.QueryContext(ctx, q)
	if err != nil {
		return fmt.Errorf("dump: read %s: %w", o.name, err)
	}
	defer rows.Close()
	vals := make([]any, len(sel))
	ptrs := make([]any, len(sel))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	for rows.Next() {
		if err := rows.Scan(ptrs...); err != nil {
			return err
		}
		b := append(e.buf[:0], prefix...)
		for i, v := range vals {
			if i > 0 {
				b = append(b, ',')
			}
			b = AppendLiteral(b, v)
		}
		b = append(b, ");"...)
		e.buf = b
		e.line(string(b))
		if e.err != nil {
			return e.err
		}
		if e.stmts%4096 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
			e.report()
		}
	}
	return rows.Err()
}

// columns are the table's stored, visible columns (generated and hidden
// columns cannot be inserted).
func (e *exporter) columns(ctx context.Context, table string) ([]string, error) {
	rows, err := e.conn.QueryContext(ctx, "SELECT name, hidden FROM pragma_table_xinfo(?)", table)
	if err != nil {
		return nil, fmt.Errorf("dump: columns of %s: %w", table, err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var n string
		var hidden int
		if err := rows.Scan(&n, &hidden); err != nil {
			return nil, err
		}
		if hidden == 0 {
			out = append(out, n)
		}
	}
	return out, rows.Err()
}

// sequence restores AUTOINCREMENT counters of the dumped tables, as .dump does.
func (e *exporter) sequence(ctx context.Context, sel map[string]bool) error {
	var n int
	if err := e.conn.QueryRowContext(ctx, "SELECT count(*) FROM sqlite_schema WHERE name='sqlite_sequence'").Scan(&n); err != nil || n == 0 {
		return err
	}
	rows, err := e.conn.QueryContext(ctx, "SELECT name, seq FROM sqlite_sequence ORDER BY rowid")
	if err != nil {
		return err
	}
	defer rows.Close()
	var lines []string
	for rows.Next() {
		var name string
		var seq int64
		if err := rows.Scan(&name, &seq); err != nil {
			return err
		}
		if !sel[strings.ToLower(name)] {
			continue
		}
		lines = append(lines, fmt.Sprintf("INSERT INTO sqlite_sequence(name,seq) VALUES(%s,%d);", quoteText(name), seq))
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if len(lines) > 0 {
		// Only the rows for the dumped tables are replaced, so a partial
		// dump does not wipe other tables' counters.
		names := make([]string, 0, len(lines))
		for name := range sel {
			names = append(names, quoteText(name))
		}
		sort.Strings(names)
		e.line("DELETE FROM sqlite_sequence WHERE lower(name) IN (" + strings.Join(names, ",") + ");")
		for _, l := range lines {
			e.line(l)
		}
	}
	return nil
}

// AppendLiteral appends v (a value as database/sql returns it from SQLite)
// as an SQL literal that reads back as the same value and storage class.
func AppendLiteral(b []byte, v any) []byte {
	switch x := v.(type) {
	case nil:
		return append(b, "NULL"...)
	case int64:
		return strconv.AppendInt(b, x, 10)
	case float64:
		switch {
		case math.IsInf(x, 1):
			return append(b, "1e999"...)
		case math.IsInf(x, -1):
			return append(b, "-1e999"...)
		case math.IsNaN(x):
			return append(b, "NULL"...)
		}
		n := len(b)
		b = strconv.AppendFloat(b, x, 'g', -1, 64)
		if !strings.ContainsAny(string(b[n:]), ".eE") {
			b = append(b, ".0"...) // keep it a REAL, not an INTEGER
		}
		return b
	case []byte:
		b = append(b, "X'"...)
		b = hex.AppendEncode(b, x)
		return append(b, '\'')
	case string:
		if strings.IndexByte(x, 0) >= 0 || !utf8.ValidString(x) {
			// A NUL cannot appear in SQL text; keep the exact bytes.
			b = append(b, "CAST(X'"...)
			b = hex.AppendEncode(b, []byte(x))
			return append(b, "' AS TEXT)"...)
		}
		return appendQuoted(b, x)
	case bool:
		if x {
			return append(b, '1')
		}
		return append(b, '0')
	default:
		return appendQuoted(b, fmt.Sprint(x))
	}
}

func appendQuoted(b []byte, s string) []byte {
	b = append(b, '\'')
	for i := 0; i < len(s); i++ {
		if s[i] == '\'' {
			b = append(b, '\'')
		}
		b = append(b, s[i])
	}
	return append(b, '\'')
}

func quoteText(s string) string { return string(appendQuoted(nil, s)) }

func quoteIdent(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

// Tables lists the user tables of the file at path (none if it does not
// exist): what Options.Tables may name.
func Tables(ctx context.Context, path string) ([]string, error) {
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	db := openDB(path, true)
	defer db.Close()
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	e := &exporter{conn: conn}
	objs, err := e.schema(ctx)
	if err != nil {
		return nil, err
	}
	out := []string{}
	for _, o := range objs {
		if o.typ == "table" {
			out = append(out, o.name)
		}
	}
	return out, nil
}
