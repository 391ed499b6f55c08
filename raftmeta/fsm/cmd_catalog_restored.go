package fsm

import (
	"context"
	"database/sql"
	"errors"
	"strconv"
)

// CmdCatalogRestored marks that the whole catalog was just replaced by a
// backup (`shoal cluster restore`): the leader proposes it right after the
// raft user restore, instead of the plain no-op it proposed before. It
// counts restores in meta ("catalog_restores"), and heartbeat answers carry
// the count (HeartbeatAnswer.CatalogRestores): an object host that sees it
// grow knows the catalog's per-database figures — the sizes in
// database_stats above all — went back to the backup's, and publishes its
// databases' sizes again (objecthost/sizerepublish.go). The count lives in
// the catalog's own state, so a node restored from a snapshot or a backup
// keeps the one it held then; only this command moves it.
const CmdCatalogRestored CommandType = "catalog_restored"

// CatalogRestored names the backup the catalog was restored from, for the
// log and the audit (the answer does not depend on it).
type CatalogRestored struct {
	// BackupIndex is the applied index the backup was taken at.
	BackupIndex int64 `json:"backup_index"`
}

// CatalogRestoredResult is the restore count after the command.
type CatalogRestoredResult struct {
	Restores int64 `json:"restores"`
}

// catalogRestoresKey is the meta row holding the restore count.
const catalogRestoresKey = "catalog_restores"

var catalogRestoredCommand = command[CatalogRestored, *catalogRestoredStmts]{
	prepareS: func(p *preparer) *catalogRestoredStmts {
		return &catalogRestoredStmts{
			get: p.prep(`SELECT value FROM meta WHERE key = '` + catalogRestoresKey + `'`),
			put: p.prep(`INSERT INTO meta (key, value) VALUES ('` + catalogRestoresKey + `', ?1)
				ON CONFLICT (key) DO UPDATE SET value = excluded.value`),
		}
	},
	validate: func(*CatalogRestored) error { return nil },
	apply:    applyCatalogRestored,
}

type catalogRestoredStmts struct{ get, put *sql.Stmt }

func applyCatalogRestored(_ *FSM, ctx context.Context, _ *Command, st *catalogRestoredStmts, _ *CatalogRestored) (any, error) {
	n, err := readCatalogRestores(ctx, st.get.QueryRowContext(ctx))
	if err != nil {
		return nil, err
	}
	n++
	if _, err := exec(ctx, st.put, strconv.FormatInt(n, 10)); err != nil {
		return nil, err
	}
	return CatalogRestoredResult{Restores: n}, nil
}

// readCatalogRestores scans the restore count (0 when the row is missing:
// never restored).
func readCatalogRestores(_ context.Context, row *sql.Row) (int64, error) {
	var v string
	switch err := row.Scan(&v); {
	case errors.Is(err, sql.ErrNoRows):
		return 0, nil
	case err != nil:
		return 0, storageErr(err)
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, storageErr(err)
	}
	return n, nil
}
