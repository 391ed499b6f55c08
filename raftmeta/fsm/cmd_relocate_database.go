package fsm

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// CmdRelocateDatabase moves a database to a new object on another host:
// the checkpoint of lost-host recovery (edge/relocate.go). The new object
// was initialised from the database's archive before this command; after
// it commits, the catalog names the new object at a routing generation one
// higher, and the old object, if its host ever returns, learns from its
// heartbeat that it is superseded and retires.
const CmdRelocateDatabase CommandType = "relocate_database"

// RelocateDatabase replaces FromObjectID by ObjectID on HostID. It is a
// compare-and-set: it applies only while the catalog still names
// FromObjectID, so two recoveries of one database (a retry, two operators,
// two edges in automatic mode) cannot both win; the loser's object stays
// unconfirmed and dies as an orphan.
type RelocateDatabase struct {
	UUID         string `json:"uuid"`
	FromObjectID string `json:"from_object_id"`
	ObjectID     string `json:"object_id"`
	HostID       string `json:"host_id"`
}

// relocateDatabaseCommand answers the relocated Database. Refusals, in the
// order they are checked: no active database with that UUID (ErrNotFound),
// no such host (ErrNotFound), the new object fenced by a host as the
// orphan of a relocation that never committed (ErrExists: retry with a new
// object ID), the catalog naming another object than FromObjectID
// (ErrConflict). Relocating to the object already named is answered as a
// success (the retry of a relocation whose answer was lost).
var relocateDatabaseCommand = command[RelocateDatabase, *relocateDatabaseStmts]{
	prepareS: func(p *preparer) *relocateDatabaseStmts {
		return &relocateDatabaseStmts{
			host:   p.prep(`SELECT region FROM hosts WHERE id = ?1`),
			fenced: p.prep(`SELECT EXISTS (SELECT 1 FROM meta WHERE key = 'fenceobj/' || ?1)`),
			move: p.prep(`UPDATE databases SET object_id = ?2, host_id = ?3, region = ?4,
			routing_generation = routing_generation + 1 WHERE uuid = ?1 AND state = 'active'`),
		}
	},
	validate: func(b *RelocateDatabase) error {
		if err := firstErr(checkUUID(b.UUID), checkID("from object id", b.FromObjectID),
			checkID("object id", b.ObjectID), checkID("host id", b.HostID)); err != nil {
			return err
		}
		if b.ObjectID == b.FromObjectID {
			return fmt.Errorf("%w: object id equals from object id", ErrInvalid)
		}
		return nil
	},
	apply:   applyRelocateDatabase,
	refuses: []error{ErrNotFound, ErrExists, ErrConflict},
	audit: func(b *RelocateDatabase, v any) auditRow {
		d, _ := v.(Database)
		return auditRow{account: d.AccountID, subject: b.UUID, detail: map[string]any{"from_object": b.FromObjectID, "object": b.ObjectID, "host": b.HostID}}
	},
}

type relocateDatabaseStmts struct{ host, fenced, move *sql.Stmt }

func applyRelocateDatabase(f *FSM, ctx context.Context, _ *Command, st *relocateDatabaseStmts, b *RelocateDatabase) (any, error) {
	d, err := f.getDatabase(ctx, b.UUID)
	if err != nil {
		return nil, err
	}
	if d.State != StateActive {
		return nil, fmt.Errorf("%w: database %q is deleted", ErrNotFound, b.UUID)
	}
	if d.ObjectID == b.ObjectID {
		return d, nil // already done: the answer of an earlier try was lost
	}
	var region string
	switch err := st.host.QueryRowContext(ctx, b.HostID).Scan(&region); {
	case errors.Is(err, sql.ErrNoRows):
		return nil, fmt.Errorf("%w: host %q", ErrNotFound, b.HostID)
	case err != nil:
		return nil, storageErr(err)
	}
	var fenced bool
	if err := st.fenced.QueryRowContext(ctx, b.ObjectID).Scan(&fenced); err != nil {
		return nil, storageErr(err)
	}
	if fenced {
		return nil, fmt.Errorf("%w: object %q was fenced as an orphan by its host", ErrExists, b.ObjectID)
	}
	if d.ObjectID != b.FromObjectID {
		return nil, fmt.Errorf("%w: database %q is on object %q, not %q", ErrConflict, b.UUID, d.ObjectID, b.FromObjectID)
	}
	if _, err := exec(ctx, st.move, b.UUID, b.ObjectID, b.HostID, region); err != nil {
		return nil, err
	}
	// Out of the old host's heartbeat digest, into the new host's at the
	// new object and generation (hbdigest.go).
	f.digestAdd(d.HostID, d.UUID, d.ObjectID, d.RoutingGeneration, -1)
	f.digestAdd(b.HostID, d.UUID, b.ObjectID, d.RoutingGeneration+1, +1)
	return f.getDatabase(ctx, b.UUID)
}
