package fsm

import (
	"context"
	"database/sql"
	"encoding/json"
)

// Column lists shared by the apply path and the readers, so a row is decoded
// the same way everywhere.
//
// Joined values are correlated scalar subqueries rather than LEFT JOINs:
// measured here, a one-row LEFT JOIN costs ~10 µs more per execution than the
// equivalent subquery, which was a third of the apply cost of a create.
const (
	databaseCols = `d.uuid, d.account_id, d.name, d.object_id, d.host_id,
		COALESCE((SELECT h.address FROM hosts h WHERE h.id = d.host_id), ''),
		d.region, d.jurisdiction, d.read_replication, d.state, d.created_at, d.deleted_at,
		d.routing_generation, COALESCE((SELECT s.size_bytes FROM database_stats s WHERE s.uuid = d.uuid), 0)`
	databaseFrom = `databases d`

	accountCols = `a.id, a.name, a.tier, a.max_databases, a.max_storage_bytes, a.max_database_bytes,
		a.rows_read_per_day, a.rows_written_per_day, a.heartbeat_interval_ms, a.active_databases,
		COALESCE((SELECT s.storage_bytes FROM account_database_stats s WHERE s.account_id = a.id), 0), a.created_at`
	accountFrom = `accounts a`

	tokenCols = `id, account_id, name, admin, revoked, created_at, scope, databases, expires_at`
	hostCols  = `id, address, region, jurisdiction, capacity, state, databases, bytes, updated_at`
)

type scanner interface{ Scan(dest ...any) error }

func scanDatabase(r scanner) (Database, error) {
	var d Database
	err := r.Scan(&d.UUID, &d.AccountID, &d.Name, &d.ObjectID, &d.HostID, &d.HostAddress,
		&d.Region, &d.Jurisdiction, &d.ReadReplication, &d.State, &d.CreatedAt, &d.DeletedAt,
		&d.RoutingGeneration, &d.SizeBytes)
	return d, err
}

func scanAccount(r scanner) (Account, error) {
	var a Account
	err := r.Scan(&a.ID, &a.Name, &a.Tier, &a.Limits.MaxDatabases, &a.Limits.MaxStorageBytes,
		&a.Limits.MaxDatabaseBytes, &a.Limits.RowsReadPerDay, &a.Limits.RowsWrittenPerDay,
		&a.Limits.HeartbeatIntervalMs, &a.ActiveDatabases, &a.StorageBytes, &a.CreatedAt)
	return a, err
}

func scanToken(r scanner) (Token, error) {
	var t Token
	var dbs string
	err := r.Scan(&t.ID, &t.AccountID, &t.Name, &t.Admin, &t.Revoked, &t.CreatedAt, &t.Scope, &dbs, &t.ExpiresAt)
	if err == nil && dbs != "" {
		err = json.Unmarshal([]byte(dbs), &t.Databases)
	}
	return t, err
}

func scanHost(r scanner) (Host, error) {
	var h Host
	err := r.Scan(&h.ID, &h.Address, &h.Region, &h.Jurisdiction, &h.Capacity, &h.State,
		&h.Databases, &h.Bytes, &h.UpdatedAt)
	return h, err
}

// stmts are the write connection's prepared statements (the apply path runs
// thousands of commands a second; preparing each time would dominate): the
// transaction's, and the row reads and writes several commands share. A
// statement only one command uses is prepared by that command (its file,
// cmd_<type>.go) and kept in cmds.
type stmts struct {
	all []*sql.Stmt

	begin, commit, rollback, savepoint, rollbackTo, release *sql.Stmt

	metaSet *sql.Stmt
	// metaPut inserts or updates a meta row that may be absent (batch_offset).
	metaPut *sql.Stmt

	accountGet, accountIncr *sql.Stmt
	tokenGet, hostGet       *sql.Stmt
	dbGet                   *sql.Stmt

	auditInsert, auditPrune *sql.Stmt

	// cmds holds every registered command with its own statements.
	cmds map[CommandType]boundCommand
}

func prepareStmts(ctx context.Context, c *sql.Conn) (*stmts, error) {
	s := &stmts{cmds: make(map[CommandType]boundCommand, len(commands))}
	p := &preparer{ctx: ctx, conn: c}
	s.begin = p.prep(`BEGIN IMMEDIATE`)
	s.commit = p.prep(`COMMIT`)
	s.rollback = p.prep(`ROLLBACK`)
	s.savepoint = p.prep(`SAVEPOINT cmd`)
	s.rollbackTo = p.prep(`ROLLBACK TO cmd`)
	s.release = p.prep(`RELEASE cmd`)

	s.metaSet = p.prep(`UPDATE meta SET value = ?2 WHERE key = ?1`)
	s.metaPut = p.prep(`INSERT INTO meta (key, value) VALUES (?1, ?2) ON CONFLICT (key) DO UPDATE SET value = excluded.value`)
	s.auditInsert = p.prep(`INSERT INTO audit_log (time, type, actor, source, account_id, subject, detail) VALUES (?, ?, ?, ?, ?, ?, ?)`)
	s.auditPrune = p.prep(`DELETE FROM audit_log WHERE id IN (SELECT id FROM audit_log ORDER BY id LIMIT ?1) AND time < ?2`)

	s.accountGet = p.prep(`SELECT ` + accountCols + ` FROM ` + accountFrom + ` WHERE a.id = ?`)
	// Creates add to active_databases once per run (flushActive), deletes
	// subtract one each.
	s.accountIncr = p.prep(`UPDATE accounts SET active_databases = active_databases + ?2 WHERE id = ?1`)
	s.tokenGet = p.prep(`SELECT ` + tokenCols + ` FROM api_tokens WHERE id = ?`)
	s.hostGet = p.prep(`SELECT ` + hostCols + ` FROM hosts WHERE id = ?`)
	s.dbGet = p.prep(`SELECT ` + databaseCols + ` FROM ` + databaseFrom + ` WHERE d.uuid = ?`)

	for t, spec := range commands {
		s.cmds[t] = boundCommand{spec: spec, st: spec.prepare(p)}
	}
	s.all = p.all
	if p.err != nil {
		s.close()
		return nil, p.err
	}
	return s, nil
}

func (s *stmts) close() {
	for _, st := range s.all {
		st.Close()
	}
	s.all = nil
}
