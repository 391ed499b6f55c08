package fsm

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
)

// CmdCreateDatabase records a new database: the checkpoint of the edge's
// create flow. It is the hottest command; its entries usually decode on a
// fast path (decodeCreateFast).
const CmdCreateDatabase CommandType = "create_database"

type CreateDatabase struct {
	UUID            string `json:"uuid"`
	AccountID       string `json:"account_id"`
	Name            string `json:"name"`
	ObjectID        string `json:"object_id"`
	HostID          string `json:"host_id"`
	Region          string `json:"region"`
	Jurisdiction    string `json:"jurisdiction"`
	ReadReplication string `json:"read_replication"` // "auto" | "disabled"
}

// createDatabaseCommand answers the new Database. Refusals, in the order
// they are checked: an unknown account (ErrAccountNotFound), a UUID ever
// used before or fenced by a host (ErrExists), an active database of that
// name in the account (ErrNameTaken), the account's limit
// (ErrDatabaseLimit).
var createDatabaseCommand = command[CreateDatabase, *createDatabaseStmts]{
	prepareS: prepareCreateDatabase,
	validate: validateCreateDatabase,
	apply:    applyCreateDatabase,
	refuses:  []error{ErrAccountNotFound, ErrExists, ErrNameTaken, ErrDatabaseLimit},
	// Every refusal is decided by validate and the check statement, before
	// the insert; the insert and the audit row are the only writes.
	refusesBeforeWrites: true,
	audit: func(b *CreateDatabase, v any) auditRow {
		return auditRow{account: b.AccountID, subject: b.UUID, detail: map[string]any{"name": b.Name, "host": b.HostID, "jurisdiction": b.Jurisdiction}}
	},
}

type createDatabaseStmts struct {
	check, insert *sql.Stmt
	// insertN[k] inserts createChunks[k] rows (flushCreates).
	insertN [len(createChunks)]*sql.Stmt
}

// createChunks are the row counts of the multi-row INSERTs flushCreates
// uses, largest first; the last must be 1.
var createChunks = [...]int{32, 8, 1}

const createInsertHead = `INSERT INTO databases (uuid, account_id, name, object_id, host_id, region,
		jurisdiction, read_replication, state, created_at, deleted_at, routing_generation) VALUES `

const createInsertRow = `(?, ?, ?, ?, ?, ?, ?, ?, 'active', ?, 0, 1)`

// createInsertSQL inserts n databases rows: their rowids are max+1 in the
// order of the VALUES, as n single-row inserts in that order would get.
func createInsertSQL(n int) string {
	return createInsertHead + strings.Repeat(createInsertRow+",", n-1) + createInsertRow
}

func prepareCreateDatabase(p *preparer) *createDatabaseStmts {
	st := &createDatabaseStmts{
		// Everything the create checks, in one statement: no row means no
		// such account. Each EXISTS is one search of a unique index (uuid;
		// the partial (account_id, name) index of active rows).
		check: p.prep(`SELECT a.active_databases, a.max_databases,
		EXISTS (SELECT 1 FROM databases WHERE uuid = ?2) OR EXISTS (SELECT 1 FROM meta WHERE key = 'fence/' || ?2),
		EXISTS (SELECT 1 FROM databases WHERE account_id = ?1 AND name = ?3 AND state = 'active'),
		COALESCE((SELECT h.address FROM hosts h WHERE h.id = ?4), '')
		FROM accounts a WHERE a.id = ?1`),
		insert: p.prep(createInsertSQL(1)),
	}
	for k, n := range createChunks {
		st.insertN[k] = p.prep(createInsertSQL(n))
	}
	return st
}

// validateCreateDatabase fills the default read replication mode
// (disabled) and checks every field.
func validateCreateDatabase(b *CreateDatabase) error {
	if b.ReadReplication == "" {
		b.ReadReplication = ReadReplicationDisabled
	}
	return firstErr(checkUUID(b.UUID), checkID("account id", b.AccountID), checkName(b.Name),
		checkID("object id", b.ObjectID), checkID("host id", b.HostID),
		checkText("region", b.Region, maxIDBytes), checkText("jurisdiction", b.Jurisdiction, maxIDBytes),
		checkReadReplication(b.ReadReplication))
}

func applyCreateDatabase(f *FSM, ctx context.Context, c *Command, st *createDatabaseStmts, b *CreateDatabase) (any, error) {
	// One statement answers every question the create asks before writing
	// (it replaced five: account, uuid, name, host address). The refusals
	// keep their order: account, then UUID, then name, then limit.
	var (
		active, maxDBs int64
		uuidUsed       bool
		nameTaken      bool
		hostAddress    string
	)
	err := st.check.QueryRowContext(ctx, b.AccountID, b.UUID, b.Name, b.HostID).
		Scan(&active, &maxDBs, &uuidUsed, &nameTaken, &hostAddress)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return nil, fmt.Errorf("%w: %q", ErrAccountNotFound, b.AccountID)
	case err != nil:
		return nil, storageErr(err)
	}
	// A UUID is never reused, not even after deletion: a retry with new IDs
	// must never meet an old object under the same UUID. A UUID a host
	// fenced as an orphan (fence_orphans) counts as used: its object is
	// being deleted, and the edge retries with new IDs.
	// The queued rows of earlier creates in this run (f.creates) count as
	// written: the check statement does not see them yet.
	if uuidUsed || f.creates.uuids[b.UUID] {
		return nil, fmt.Errorf("%w: database %q", ErrExists, b.UUID)
	}
	if nameTaken || f.creates.names[accountName{b.AccountID, b.Name}] {
		return nil, fmt.Errorf("%w: %q", ErrNameTaken, b.Name)
	}
	active += f.activeDelta[b.AccountID] // creates earlier in this run of creates
	if active >= maxDBs {
		return nil, fmt.Errorf("%w: %d of %d", ErrDatabaseLimit, active, maxDBs)
	}
	if f.deferWrites {
		// Every refusal is decided: the row is queued for flushCreates,
		// which inserts the run's rows in order (the same rows and rowids
		// as one insert per create). Nothing can refuse it there: the
		// checks above saw the catalog and the queue.
		f.creates.add(b, c.Time)
	} else if _, err := exec(ctx, st.insert, b.UUID, b.AccountID, b.Name, b.ObjectID, b.HostID, b.Region,
		b.Jurisdiction, b.ReadReplication, c.Time); err != nil {
		return nil, err
	}
	// A new database is active at generation 1 on its host: its heartbeat
	// digest goes in with the row (hbdigest.go).
	f.digestAdd(b.HostID, b.UUID, b.ObjectID, 1, +1)
	// The account's active count is bumped once per run of consecutive
	// creates (flushActive), not once per create.
	f.activeDelta[b.AccountID]++
	// The new row is exactly the command's fields (a fresh database has no
	// stats and generation 1) plus the host address read above. This saves
	// re-reading the row on the hottest command.
	db := Database{UUID: b.UUID, AccountID: b.AccountID, Name: b.Name, ObjectID: b.ObjectID,
		HostID: b.HostID, HostAddress: hostAddress, Region: b.Region, Jurisdiction: b.Jurisdiction,
		ReadReplication: b.ReadReplication, State: StateActive, CreatedAt: c.Time, RoutingGeneration: 1}
	return db, nil
}

// pendingCreates are the databases rows of the running run of creates not
// yet inserted (apply goroutine only; empty between batches). Creates on
// the fast path (applyOne's deferWrites) queue their row here instead of
// inserting it; flushActive inserts the queue, in order, before any other
// command and at the end of the batch, in multi-row statements: one
// statement per up to 32 creates instead of one each (with the audit rows,
// the same for audit_log). A crash with rows queued loses nothing: they
// belong to the batch's open transaction, whose COMMIT is the checkpoint
// (FSM.commit), and the catalog is rebuilt from snapshot + log on start.
type pendingCreates struct {
	rows  []pendingCreate
	uuids map[string]bool
	names map[accountName]bool
	args  []any
}

type pendingCreate struct {
	b    CreateDatabase
	time int64
}

type accountName struct{ account, name string }

func (p *pendingCreates) add(b *CreateDatabase, t int64) {
	if p.uuids == nil {
		p.uuids, p.names = map[string]bool{}, map[accountName]bool{}
	}
	p.rows = append(p.rows, pendingCreate{b: *b, time: t})
	p.uuids[b.UUID] = true
	p.names[accountName{b.AccountID, b.Name}] = true
}

// flushCreates inserts the queued databases rows in queue order and empties
// the queue. An error is fatal: the creates were answered as applied.
func (f *FSM) flushCreates(ctx context.Context) error {
	p := &f.creates
	st := f.stmts.cmds[CmdCreateDatabase].st.(*createDatabaseStmts)
	rows := p.rows
	for k, n := range createChunks {
		for len(rows) >= n {
			args := p.args[:0]
			for i := range rows[:n] {
				r := &rows[i]
				args = append(args, r.b.UUID, r.b.AccountID, r.b.Name, r.b.ObjectID, r.b.HostID, r.b.Region,
					r.b.Jurisdiction, r.b.ReadReplication, r.time)
			}
			p.args = args[:0]
			if _, err := exec(ctx, st.insertN[k], args...); err != nil {
				return err
			}
			rows = rows[n:]
		}
	}
	clear(p.rows)
	p.rows = p.rows[:0]
	clear(p.uuids)
	clear(p.names)
	return nil
}
