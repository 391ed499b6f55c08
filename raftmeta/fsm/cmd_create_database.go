package fsm

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
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

type createDatabaseStmts struct{ check, insert *sql.Stmt }

func prepareCreateDatabase(p *preparer) *createDatabaseStmts {
	return &createDatabaseStmts{
		// Everything the create checks, in one statement: no row means no
		// such account. Each EXISTS is one search of a unique index (uuid;
		// the partial (account_id, name) index of active rows).
		check: p.prep(`SELECT a.active_databases, a.max_databases,
		EXISTS (SELECT 1 FROM databases WHERE uuid = ?2) OR EXISTS (SELECT 1 FROM meta WHERE key = 'fence/' || ?2),
		EXISTS (SELECT 1 FROM databases WHERE account_id = ?1 AND name = ?3 AND state = 'active'),
		COALESCE((SELECT h.address FROM hosts h WHERE h.id = ?4), '')
		FROM accounts a WHERE a.id = ?1`),
		insert: p.prep(`INSERT INTO databases (uuid, account_id, name, object_id, host_id, region,
		jurisdiction, read_replication, state, created_at, deleted_at, routing_generation)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'active', ?, 0, 1)`),
	}
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
	if uuidUsed {
		return nil, fmt.Errorf("%w: database %q", ErrExists, b.UUID)
	}
	if nameTaken {
		return nil, fmt.Errorf("%w: %q", ErrNameTaken, b.Name)
	}
	active += f.activeDelta[b.AccountID] // creates earlier in this run of creates
	if active >= maxDBs {
		return nil, fmt.Errorf("%w: %d of %d", ErrDatabaseLimit, active, maxDBs)
	}
	if _, err := exec(ctx, st.insert, b.UUID, b.AccountID, b.Name, b.ObjectID, b.HostID, b.Region,
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
