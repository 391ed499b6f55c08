package fsm

import (
	"context"
	"fmt"
)

// CmdDeleteDatabaseIf deletes a database only while the catalog still
// names the object and routing generation the proposer read: the
// compare-and-delete of `shoal cluster resurrected --delete`, which must
// never delete a database that a relocation (lost-host recovery) moved to
// a new object between its read and its write.
//
// A command type of its own rather than optional fields on
// delete_database: a replica of an older build decodes bodies leniently
// (unknown JSON fields are dropped), so it would apply a
// delete_database carrying an expectation as an unconditional delete. A
// new type is refused by such a replica as unknown_command instead. As
// for every new command (raftmeta/DESIGN.md, "Adding a catalog command"),
// roll the build out to every replica before anything proposes it.
const CmdDeleteDatabaseIf CommandType = "delete_database_if"

// DeleteDatabaseIf is DeleteDatabase with the state it was written
// against. Both expectations are required.
type DeleteDatabaseIf struct {
	AccountID string `json:"account_id"`
	UUID      string `json:"uuid"`
	// ExpectObjectID is the object the catalog must name for the database.
	ExpectObjectID string `json:"expect_object_id"`
	// ExpectRoutingGeneration is the routing generation it must be at
	// (relocate_database raises it with the object; time-travel restores
	// change neither: they rewrite the same object in place).
	ExpectRoutingGeneration int64 `json:"expect_routing_generation"`
}

// deleteDatabaseIfCommand answers the deleted Database. Refusals, in the
// order they are checked: no active database with that UUID in that
// account (ErrNotFound, as delete_database), another object or generation
// than expected (ErrConflict; nothing written).
var deleteDatabaseIfCommand = command[DeleteDatabaseIf, *deleteDatabaseStmts]{
	prepareS: deleteDatabaseCommand.prepareS,
	validate: func(b *DeleteDatabaseIf) error {
		if err := firstErr(checkDatabaseRef(b.AccountID, b.UUID), checkID("expected object id", b.ExpectObjectID)); err != nil {
			return err
		}
		if b.ExpectRoutingGeneration < 1 {
			return fmt.Errorf("%w: expected routing generation must be at least 1", ErrInvalid)
		}
		return nil
	},
	apply: func(f *FSM, ctx context.Context, c *Command, st *deleteDatabaseStmts, b *DeleteDatabaseIf) (any, error) {
		d, err := f.activeDatabaseOf(ctx, b.AccountID, b.UUID)
		if err != nil {
			return nil, err
		}
		if d.ObjectID != b.ExpectObjectID || d.RoutingGeneration != b.ExpectRoutingGeneration {
			return nil, fmt.Errorf("%w: database %q is object %q at routing generation %d, not object %q at %d: not deleted",
				ErrConflict, b.UUID, d.ObjectID, d.RoutingGeneration, b.ExpectObjectID, b.ExpectRoutingGeneration)
		}
		return applyDeleteDatabase(f, ctx, c, st, &DeleteDatabase{AccountID: b.AccountID, UUID: b.UUID})
	},
	refuses: []error{ErrNotFound, ErrConflict},
	audit: func(b *DeleteDatabaseIf, v any) auditRow {
		d, _ := v.(Database)
		return auditRow{account: b.AccountID, subject: b.UUID, detail: map[string]any{"name": d.Name, "object": b.ExpectObjectID}}
	},
}
