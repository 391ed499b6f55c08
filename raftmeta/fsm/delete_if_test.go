package fsm

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestDeleteDatabaseIf: the compare-and-delete of `shoal cluster
// resurrected --delete` deletes only the object and routing generation it
// names. A database relocated since the caller's read (lost-host recovery:
// new object, generation + 1) is refused with ErrConflict and the catalog,
// audit log included, is left exactly as it was.
func TestDeleteDatabaseIf(t *testing.T) {
	ctx := context.Background()
	f := newFSM(t)
	d := newDriver(t, f)
	d.ok(CmdSetClusterLevel, SetClusterLevel{Level: 2}) // delete_database_if's level
	d.account("a1", 100)
	d.ok(CmdRegisterHost, RegisterHost{ID: "h1", Address: "10.0.0.1:1", State: HostStateActive})
	d.ok(CmdRegisterHost, RegisterHost{ID: "h2", Address: "10.0.0.2:1", State: HostStateActive})
	for i := 1; i <= 3; i++ {
		d.ok(CmdCreateDatabase, createDB(uuidN(i), "a1", "db"+uuidN(i)[34:]))
	}
	u1, u2 := uuidN(1), uuidN(2)

	// Relocated after the caller read it at (obj-u1, 1): refused.
	d.ok(CmdRelocateDatabase, RelocateDatabase{UUID: u1, FromObjectID: "obj-" + u1, ObjectID: "new-1", HostID: "h2"})
	before := dumpCatalog(t, f)
	r := d.do(CmdDeleteDatabaseIf, DeleteDatabaseIf{AccountID: "a1", UUID: u1, ExpectObjectID: "obj-" + u1, ExpectRoutingGeneration: 1})
	require.NotNil(t, r.Err)
	assert.ErrorIs(t, r.Err, ErrConflict)
	assert.Contains(t, r.Err.Message, `object "new-1" at routing generation 2`)
	// The right object at a stale generation: refused too.
	r = d.do(CmdDeleteDatabaseIf, DeleteDatabaseIf{AccountID: "a1", UUID: u1, ExpectObjectID: "new-1", ExpectRoutingGeneration: 1})
	assert.ErrorIs(t, r.Err, ErrConflict)
	assert.Equal(t, before, dumpCatalog(t, f), "a refused conditional delete left a trace")
	db, err := f.Database(ctx, u1)
	require.NoError(t, err)
	assert.Equal(t, StateActive, db.State)

	// Another account's or an unknown database: not found, as delete_database.
	assert.ErrorIs(t, d.do(CmdDeleteDatabaseIf, DeleteDatabaseIf{AccountID: "a2", UUID: u2, ExpectObjectID: "obj-" + u2, ExpectRoutingGeneration: 1}).Err, ErrNotFound)
	assert.ErrorIs(t, d.do(CmdDeleteDatabaseIf, DeleteDatabaseIf{AccountID: "a1", UUID: uuidN(9), ExpectObjectID: "x", ExpectRoutingGeneration: 1}).Err, ErrNotFound)
	// Both expectations are required: an empty one never means "any".
	assert.ErrorIs(t, d.do(CmdDeleteDatabaseIf, DeleteDatabaseIf{AccountID: "a1", UUID: u2, ExpectRoutingGeneration: 1}).Err, ErrInvalid)
	assert.ErrorIs(t, d.do(CmdDeleteDatabaseIf, DeleteDatabaseIf{AccountID: "a1", UUID: u2, ExpectObjectID: "obj-" + u2}).Err, ErrInvalid)
	assert.Equal(t, before, dumpCatalog(t, f))

	// A match deletes exactly as delete_database does: the same catalog.
	g := newFSM(t)
	e := newDriver(t, g)
	e.account("a1", 100)
	e.ok(CmdRegisterHost, RegisterHost{ID: "h1", Address: "10.0.0.1:1", State: HostStateActive})
	e.ok(CmdRegisterHost, RegisterHost{ID: "h2", Address: "10.0.0.2:1", State: HostStateActive})
	for i := 1; i <= 3; i++ {
		e.ok(CmdCreateDatabase, createDB(uuidN(i), "a1", "db"+uuidN(i)[34:]))
	}
	e.ok(CmdRelocateDatabase, RelocateDatabase{UUID: u1, FromObjectID: "obj-" + u1, ObjectID: "new-1", HostID: "h2"})
	got := decodeValue[Database](t, d.ok(CmdDeleteDatabaseIf, DeleteDatabaseIf{AccountID: "a1", UUID: u2, ExpectObjectID: "obj-" + u2, ExpectRoutingGeneration: 1}))
	want := decodeValue[Database](t, e.ok(CmdDeleteDatabase, DeleteDatabase{AccountID: "a1", UUID: u2}))
	assert.Equal(t, StateDeleted, got.State)
	assert.Equal(t, want.RoutingGeneration, got.RoutingGeneration)
	d.ok(CmdDeleteDatabaseIf, DeleteDatabaseIf{AccountID: "a1", UUID: u1, ExpectObjectID: "new-1", ExpectRoutingGeneration: 2})
	e.ok(CmdDeleteDatabase, DeleteDatabase{AccountID: "a1", UUID: u1})
	acct, err := f.Account(ctx, "a1")
	require.NoError(t, err)
	assert.Equal(t, int64(1), acct.ActiveDatabases)
	// Deleted: a second conditional delete finds nothing.
	assert.ErrorIs(t, d.do(CmdDeleteDatabaseIf, DeleteDatabaseIf{AccountID: "a1", UUID: u2, ExpectObjectID: "obj-" + u2, ExpectRoutingGeneration: 1}).Err, ErrNotFound)
	checkInvariants(t, f)
	checkInvariants(t, g)
	// The same heartbeat digests as after the unconditional deletes (the
	// rows' times differ: the two logs have different lengths).
	assert.Equal(t, tableOf(t, dump(t, g), "host_digests"), tableOf(t, dump(t, f), "host_digests"))
}

// tableOf is one table's section of a Dump.
func tableOf(t *testing.T, dump, table string) string {
	t.Helper()
	i := strings.Index(dump, "## "+table+" (")
	require.GreaterOrEqual(t, i, 0, "no table %s", table)
	rest := dump[i+3:]
	if j := strings.Index(rest, "## "); j >= 0 {
		rest = rest[:j]
	}
	return rest
}
