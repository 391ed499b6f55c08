package fsm

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// ErrInvalidSnapshot means a snapshot stream (or a backup file, which is one)
// is not a complete, intact catalog of this build's schema version. The
// errors wrapping it are *InvalidSnapshotError, whose Reason says what is
// wrong in words an operator can act on; they never contain file paths.
var ErrInvalidSnapshot = errors.New("invalid catalog snapshot")

// InvalidSnapshotError is the refusal of a snapshot stream: truncated,
// corrupted, not a catalog, or a catalog of another schema version.
type InvalidSnapshotError struct {
	Reason string
}

func (e *InvalidSnapshotError) Error() string { return "invalid catalog snapshot: " + e.Reason }

func (e *InvalidSnapshotError) Is(target error) bool { return target == ErrInvalidSnapshot }

func invalidSnapshot(format string, a ...any) error {
	return &InvalidSnapshotError{Reason: fmt.Sprintf(format, a...)}
}

// SnapshotInfo describes a snapshot stream that CheckSnapshot accepted.
type SnapshotInfo struct {
	Bytes        int64  // the whole stream: header, payload, checksum
	PayloadBytes int64  // the SQLite file inside it
	AppliedIndex uint64 // the last log index the catalog reflects
}

// CheckSnapshot validates a whole snapshot stream read from r, as Restore
// would receive it, without touching any catalog: the frame (magic, length,
// CRC-32C, nothing after the checksum), then the payload as a catalog of this
// schema version, after migrating a copy of an older one (a SQLite file
// whose schema objects are exactly the
// catalog's, whose meta rows parse, and which passes PRAGMA
// integrity_check). The payload is copied into a temporary directory under
// dir, removed before CheckSnapshot returns.
//
// A refusal wraps ErrInvalidSnapshot (an *InvalidSnapshotError); any other
// error is a failure to read r or to write under dir. Restore runs the same
// checks except the integrity and column type checks, which read every
// page, index entry and row and so are left to the operator-facing path (a
// backup upload) rather than every start and InstallSnapshot. Last, the
// copy is opened and loaded the way Restore opens it, so what CheckSnapshot
// accepts Restore accepts.
func CheckSnapshot(ctx context.Context, r io.Reader, dir string) (SnapshotInfo, error) {
	tmpDir, err := os.MkdirTemp(dir, "snapshot-check-*")
	if err != nil {
		return SnapshotInfo{}, fmt.Errorf("check snapshot: %w", err)
	}
	defer os.RemoveAll(tmpDir) //nolint:errcheck // best effort cleanup of a temp dir
	path := filepath.Join(tmpDir, "catalog.db")
	fh, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return SnapshotInfo{}, fmt.Errorf("check snapshot: %w", err)
	}
	payload, err := readFramed(r, fh)
	if cerr := fh.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("check snapshot: %w", cerr)
	}
	if err != nil {
		return SnapshotInfo{}, err
	}
	// An older catalog is checked as Restore will see it: migrated.
	if err := migrateFile(ctx, path); err != nil {
		return SnapshotInfo{}, err
	}
	applied, level, err := checkCatalogFile(ctx, path, true)
	if err != nil {
		return SnapshotInfo{}, err
	}
	// A backup of a cluster at a higher catalog level than this build
	// knows may hold the effects of commands this build cannot apply, and
	// restoring it would halt every replica (see Restore).
	if level > BuildLevel {
		return SnapshotInfo{}, invalidSnapshot("the backup is of catalog level %d, this build knows up to level %d: restore it with a build of level %d or later",
			level, BuildLevel, level)
	}
	if err := trialLoad(ctx, path); err != nil {
		return SnapshotInfo{}, err
	}
	return SnapshotInfo{Bytes: frameOverhead + payload, PayloadBytes: payload, AppliedIndex: applied}, nil
}

// trialLoad opens the file at path the way Restore opens a restored catalog
// (statements prepared, apply state, heartbeat digests and remembered
// request IDs loaded), so
// whatever CheckSnapshot accepts, Restore's own open accepts too. It
// changes the file (the requests table is emptied): callers pass a copy.
func trialLoad(ctx context.Context, path string) error {
	f := &FSM{cfg: config{readConns: 1}, dir: filepath.Dir(path), path: path, dd: newDedupe(), activeDelta: map[string]int64{},
		dig: newDigestMem()}
	if err := f.open(); err != nil {
		return notLoading(err)
	}
	defer f.closeHandles() //nolint:errcheck // a throwaway copy
	if _, err := f.loadDigests(ctx); err != nil {
		return notLoading(err)
	}
	if err := f.loadDedupe(ctx); err != nil {
		return notLoading(err)
	}
	f.dd.free()
	return nil
}

// notLoading is the refusal of a file that passed the checks but does not
// open or load as a catalog.
func notLoading(err error) error {
	return invalidSnapshot("the catalog does not load (%s)", sqliteReason(err))
}

// sqliteMagic starts every SQLite database file.
const sqliteMagic = "SQLite format 3\x00"

// checkCatalogFile checks that the SQLite file at path is a catalog of this
// schema version and returns its applied index. With integrity it also runs
// PRAGMA integrity_check and columnTypeCheck. It opens the file read-only (query_only) and
// leaves it unchanged; failures that say something about the file are
// *InvalidSnapshotError.
func checkCatalogFile(ctx context.Context, path string, integrity bool) (uint64, int64, error) {
	head := make([]byte, len(sqliteMagic))
	fh, err := os.Open(path)
	if err != nil {
		return 0, 0, err
	}
	n, _ := io.ReadFull(fh, head)
	fh.Close()
	if n < len(head) || string(head) != sqliteMagic {
		return 0, 0, invalidSnapshot("the payload is not a SQLite database")
	}

	db, err := sql.Open("sqlite3", "file:"+path+"?_query_only=1&_busy_timeout=1000")
	if err != nil {
		return 0, 0, err
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	got, err := schemaObjects(ctx, db)
	if err != nil {
		return 0, 0, invalidSnapshot("the payload does not open as a SQLite database (%s)", sqliteReason(err))
	}
	if _, ok := got["table meta"]; !ok {
		return 0, 0, invalidSnapshot("not a catalog: the SQLite file has no meta table")
	}
	var version string
	switch err := db.QueryRowContext(ctx, `SELECT value FROM meta WHERE key = 'schema_version'`).Scan(&version); {
	case errors.Is(err, sql.ErrNoRows):
		return 0, 0, invalidSnapshot("not a catalog: meta has no schema_version")
	case err != nil:
		return 0, 0, invalidSnapshot("not a catalog: reading meta failed (%s)", sqliteReason(err))
	}
	if version != schemaVersion {
		return 0, 0, invalidSnapshot("catalog schema version %q unsupported (this build restores version %q, and migrates versions 1 to %d)",
			version, schemaVersion, len(migrations))
	}
	want, err := catalogSchemaObjects(ctx, len(migrations)+1)
	if err != nil {
		return 0, 0, err
	}
	if err := compareSchema(schemaVersion, want, got); err != nil {
		return 0, 0, err
	}
	applied, _, err := loadMeta(ctx, db)
	if err != nil {
		return 0, 0, invalidSnapshot("catalog meta unreadable (%s)", sqliteReason(err))
	}
	level, err := loadClusterLevel(ctx, db)
	if err != nil {
		return 0, 0, invalidSnapshot("catalog meta unreadable (%s)", sqliteReason(err))
	}
	if _, err := loadBatchOffset(ctx, db); err != nil {
		return 0, 0, invalidSnapshot("catalog meta unreadable (%s)", sqliteReason(err))
	}
	if integrity {
		if err := integrityCheck(ctx, db); err != nil {
			return 0, 0, err
		}
		if err := columnTypeCheck(ctx, db); err != nil {
			return 0, 0, err
		}
		if err := checkHostDigests(ctx, db); err != nil {
			return 0, 0, err
		}
	}
	return applied, level, nil
}

// columnTypeCheck refuses rows whose values have another type than their
// column's: SQLite stores what it is given (an INTEGER column keeps text
// that does not look like a number), and the catalog's code reads every
// column into a Go type. integrity_check does not look at types. The
// expected types come from the catalog's own schema (INTEGER and TEXT
// columns; BLOB columns take any bytes), one scan per table.
func columnTypeCheck(ctx context.Context, db *sql.DB) error {
	for _, t := range dumpTables() {
		rows, err := db.QueryContext(ctx, `SELECT name, upper(type) FROM pragma_table_info(?)`, t.name)
		if err != nil {
			return invalidSnapshot("reading the columns of %s failed (%s)", t.name, sqliteReason(err))
		}
		var conds []string
		for rows.Next() {
			var col, typ string
			if err := rows.Scan(&col, &typ); err != nil {
				rows.Close()
				return invalidSnapshot("reading the columns of %s failed (%s)", t.name, sqliteReason(err))
			}
			switch typ {
			case "INTEGER":
				conds = append(conds, fmt.Sprintf(`typeof("%s") != 'integer'`, col))
			case "TEXT":
				conds = append(conds, fmt.Sprintf(`typeof("%s") != 'text'`, col))
			}
		}
		err = rows.Err()
		rows.Close()
		if err != nil {
			return invalidSnapshot("reading the columns of %s failed (%s)", t.name, sqliteReason(err))
		}
		if len(conds) == 0 {
			continue
		}
		var bad int64
		q := fmt.Sprintf(`SELECT count(*) FROM "%s" WHERE %s`, t.name, strings.Join(conds, " OR "))
		if err := db.QueryRowContext(ctx, q).Scan(&bad); err != nil {
			return invalidSnapshot("SQLite integrity check failed (%s)", sqliteReason(err))
		}
		if bad > 0 {
			return invalidSnapshot("table %s has %d row(s) with a value of the wrong type for its column", t.name, bad)
		}
	}
	return nil
}

// schemaObjects maps "type name" to the whitespace-normalised SQL of every
// schema object that is not SQLite's own (sqlite_autoindex_*, sqlite_stat*,
// sqlite_sequence).
func schemaObjects(ctx context.Context, db interface {
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
}) (map[string]string, error) {
	rows, err := db.QueryContext(ctx, `SELECT type, name, COALESCE(sql, '') FROM sqlite_schema WHERE name NOT LIKE 'sqlite\_%' ESCAPE '\'`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var typ, name, text string
		if err := rows.Scan(&typ, &name, &text); err != nil {
			return nil, err
		}
		out[typ+" "+name] = strings.Join(strings.Fields(text), " ")
	}
	return out, rows.Err()
}

// catalogSchemaObjects is schemaObjects of a fresh catalog of schema version
// v (built in memory from schema and the first v-1 migrations, so it is
// always this build's idea of that version).
func catalogSchemaObjects(ctx context.Context, v int) (map[string]string, error) {
	db, err := sql.Open("sqlite3", "file::memory:")
	if err != nil {
		return nil, err
	}
	defer db.Close()
	db.SetMaxOpenConns(1) // one connection: each has its own in-memory database
	if _, err := db.ExecContext(ctx, schemaAt(v)); err != nil {
		return nil, fmt.Errorf("build reference schema: %w", err)
	}
	return schemaObjects(ctx, db)
}

// compareSchema refuses a file whose schema objects differ from those of a
// catalog of schema version version: a missing table or index, a table
// with other columns, or an extra trigger or view (which Apply would run)
// are all "not a catalog".
func compareSchema(version string, want, got map[string]string) error {
	var missing, differ, extra []string
	for k, w := range want {
		g, ok := got[k]
		switch {
		case !ok:
			missing = append(missing, k)
		case g != w:
			differ = append(differ, k)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			extra = append(extra, k)
		}
	}
	if len(missing)+len(differ)+len(extra) == 0 {
		return nil
	}
	var parts []string
	for _, p := range []struct {
		what string
		keys []string
	}{{"missing", missing}, {"defined differently", differ}, {"unexpected", extra}} {
		if len(p.keys) > 0 {
			sort.Strings(p.keys)
			parts = append(parts, p.what+": "+strings.Join(p.keys, ", "))
		}
	}
	return invalidSnapshot("not a catalog of schema version %q (%s)", version, strings.Join(parts, "; "))
}

// integrityCheck runs PRAGMA integrity_check (every page, every index entry
// against its table, NOT NULL and CHECK constraints) and reports the first
// problems it names.
func integrityCheck(ctx context.Context, db *sql.DB) error {
	rows, err := db.QueryContext(ctx, `PRAGMA integrity_check(10)`)
	if err != nil {
		return invalidSnapshot("SQLite integrity check failed (%s)", sqliteReason(err))
	}
	defer rows.Close()
	var problems []string
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			return invalidSnapshot("SQLite integrity check failed (%s)", sqliteReason(err))
		}
		if line != "ok" {
			problems = append(problems, line)
		}
	}
	if err := rows.Err(); err != nil {
		return invalidSnapshot("SQLite integrity check failed (%s)", sqliteReason(err))
	}
	if len(problems) > 0 {
		if len(problems) > 3 {
			problems = append(problems[:3], "…")
		}
		return invalidSnapshot("SQLite integrity check failed: %s", strings.Join(problems, "; "))
	}
	return nil
}

// sqliteReason is err's message without anything that could name a file
// (the SQLite driver's messages do not, but wrapped os errors would).
func sqliteReason(err error) string {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err.Error()
	}
	return err.Error()
}

// isMagicPrefix reports whether b could be the start of a snapshot header.
func isMagicPrefix(b []byte) bool {
	return bytes.HasPrefix([]byte(snapshotMagic), b)
}
