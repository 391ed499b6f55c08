package fsm

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
)

// migrateFile brings the catalog file at path from an older schema version
// to schemaVersion in place, in one transaction, before the restore checks
// run on it (Restore migrates the file it is about to swap in, CheckSnapshot
// its copy). A file of this build's version is not touched, and neither is
// anything that is not a catalog of a version this build knows how to
// migrate: checkCatalogFile then refuses it with its usual reasons. An old
// catalog must first match a catalog of its own version object for object
// (the same check checkCatalogFile makes for the current version), so a
// migration never runs on a file it was not written for; a refusal wraps
// ErrInvalidSnapshot.
//
// The migrated file is in rollback-journal mode (so nothing is left in a
// -wal beside it); opening it as the catalog turns WAL back on.
func migrateFile(ctx context.Context, path string) error {
	head := make([]byte, len(sqliteMagic))
	fh, err := os.Open(path)
	if err != nil {
		return err
	}
	n, _ := io.ReadFull(fh, head)
	fh.Close()
	if n < len(head) || string(head) != sqliteMagic {
		return nil
	}
	db, err := sql.Open("sqlite3", "file:"+path+"?_busy_timeout=1000&_synchronous=OFF")
	if err != nil {
		return err
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil // not openable: checkCatalogFile says why
	}
	defer conn.Close()
	var version string
	if err := conn.QueryRowContext(ctx, `SELECT value FROM meta WHERE key = 'schema_version'`).Scan(&version); err != nil {
		return nil // not a catalog, or unreadable: checkCatalogFile says why
	}
	from, err := strconv.Atoi(version)
	if err != nil || from < 1 || from >= len(migrations)+1 || strconv.Itoa(from) != version {
		return nil // the current version, or one this build cannot migrate
	}

	got, err := schemaObjects(ctx, conn)
	if err != nil {
		return invalidSnapshot("the payload does not open as a SQLite database (%s)", sqliteReason(err))
	}
	want, err := catalogSchemaObjects(ctx, from)
	if err != nil {
		return err
	}
	if err := compareSchema(version, want, got); err != nil {
		return err
	}

	fail := func(err error) error {
		return invalidSnapshot("migrating the catalog from schema version %q to %q failed (%s)", version, schemaVersion, sqliteReason(err))
	}
	var mode string
	if err := conn.QueryRowContext(ctx, `PRAGMA journal_mode = DELETE`).Scan(&mode); err != nil {
		return fail(err)
	}
	if mode != "delete" {
		return fail(fmt.Errorf("journal mode %q", mode))
	}
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		return fail(err)
	}
	defer tx.Rollback() //nolint:errcheck // no-op after commit
	for _, m := range migrations[from-1:] {
		if _, err := tx.ExecContext(ctx, m); err != nil {
			return fail(err)
		}
	}
	// Version 4's host_digests is derived from databases: an older catalog
	// gets it computed here, in the same transaction (every replica
	// migrating the same snapshot writes the same rows).
	if from < 4 {
		if err := rebuildHostDigests(ctx, tx); err != nil {
			return fail(err)
		}
	}
	r, err := tx.ExecContext(ctx, `UPDATE meta SET value = ? WHERE key = 'schema_version'`, schemaVersion)
	if err != nil {
		return fail(err)
	}
	if k, err := r.RowsAffected(); err != nil || k != 1 {
		return fail(errors.Join(err, errors.New("schema_version not updated")))
	}
	if err := tx.Commit(); err != nil {
		return fail(err)
	}
	return nil
}
