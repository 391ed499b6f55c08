package fsm

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRelocateDatabase walks lost-host recovery's catalog side: the host
// declared lost, its databases listed page by page, each relocated by
// compare-and-set (idempotent retry, conflicting second recovery, fenced
// leftover), heartbeats naming the new object at a higher generation, and
// the lost host's own registration unable to clear "lost".
func TestRelocateDatabase(t *testing.T) {
	ctx := context.Background()
	f := newFSM(t)
	d := newDriver(t, f)
	d.account("a1", 100)
	d.ok(CmdRegisterHost, RegisterHost{ID: "h1", Address: "10.0.0.1:1", Region: "weur", State: HostStateActive})
	d.ok(CmdRegisterHost, RegisterHost{ID: "h2", Address: "10.0.0.2:1", Region: "enam", State: HostStateActive})
	var onH1 []string
	for i := 1; i <= 9; i++ {
		c := createDB(uuidN(i), "a1", "db"+uuidN(i)[34:])
		if i%3 == 0 {
			c.HostID = "h2"
		} else {
			onH1 = append(onH1, uuidN(i))
		}
		d.ok(CmdCreateDatabase, c)
	}
	d.ok(CmdDeleteDatabase, DeleteDatabase{AccountID: "a1", UUID: uuidN(4)}) // deleted: not listed
	onH1 = append(onH1[:2], onH1[3:]...)

	// Declared lost; its own registration keeps it lost; readmit clears it.
	h := decodeValue[Host](t, d.ok(CmdSetHostState, SetHostState{ID: "h1", State: HostStateLost}))
	assert.Equal(t, HostStateLost, h.State)
	h = decodeValue[Host](t, d.ok(CmdRegisterHost, RegisterHost{ID: "h1", Address: "10.0.0.9:1", Region: "weur", State: HostStateActive}))
	assert.Equal(t, HostStateLost, h.State, "a lost host cannot readmit itself")
	assert.Equal(t, "10.0.0.9:1", h.Address)

	// Paging: every active database on h1 exactly once, in UUID order.
	var listed []string
	after := ""
	for {
		p, err := f.HostDatabasesPage(ctx, "h1", after, 2)
		require.NoError(t, err)
		for _, db := range p.Databases {
			assert.Equal(t, "h1", db.HostID)
			listed = append(listed, db.UUID)
		}
		if p.Next == "" {
			break
		}
		after = p.Next
	}
	assert.Equal(t, onH1, listed)

	// Relocate one: new object, host, the host's region, generation + 1.
	u := uuidN(1)
	req := RelocateDatabase{UUID: u, FromObjectID: "obj-" + u, ObjectID: "new-1", HostID: "h2"}
	db := decodeValue[Database](t, d.ok(CmdRelocateDatabase, req))
	assert.Equal(t, "new-1", db.ObjectID)
	assert.Equal(t, "h2", db.HostID)
	assert.Equal(t, "10.0.0.2:1", db.HostAddress)
	assert.Equal(t, "enam", db.Region)
	assert.Equal(t, int64(2), db.RoutingGeneration)
	// The retry of a relocation whose answer was lost: the same answer.
	again := decodeValue[Database](t, d.ok(CmdRelocateDatabase, req))
	assert.Equal(t, db, again)
	// A second recovery written against the old object loses.
	r := d.do(CmdRelocateDatabase, RelocateDatabase{UUID: u, FromObjectID: "obj-" + u, ObjectID: "other", HostID: "h2"})
	assert.ErrorIs(t, r.Err, ErrConflict)

	// Heartbeats name the new object: the old one is superseded (higher
	// generation, other object).
	hb, err := f.Heartbeat(ctx, []string{u})
	require.NoError(t, err)
	assert.Equal(t, HeartbeatState{UUID: u, Known: true, State: StateActive, AccountID: "a1", RoutingGeneration: 2, ObjectID: "new-1"}, hb.Databases[0])

	// A leftover of a relocation that never committed is fenced; the named
	// object is known; a fenced object can never be relocated to.
	u2 := uuidN(2)
	fa := decodeValue[FenceAnswer](t, d.ok(CmdFenceOrphans, FenceOrphans{HostID: "h2", Objects: []ObjectRef{{UUID: u2, ObjectID: "left"}, {UUID: u, ObjectID: "new-1"}}}))
	assert.Equal(t, []string{"left"}, fa.FencedObjects)
	assert.Equal(t, []string{"new-1"}, fa.KnownObjects)
	r = d.do(CmdRelocateDatabase, RelocateDatabase{UUID: u2, FromObjectID: "obj-" + u2, ObjectID: "left", HostID: "h2"})
	assert.ErrorIs(t, r.Err, ErrExists)

	// Deleted databases are not relocated.
	r = d.do(CmdRelocateDatabase, RelocateDatabase{UUID: uuidN(4), FromObjectID: "obj-" + uuidN(4), ObjectID: "x", HostID: "h2"})
	assert.ErrorIs(t, r.Err, ErrNotFound)

	// The automatic mode's compare-and-set on the host's last report.
	d.ok(CmdReportHostLoad, ReportHostLoad{ID: "h2", Databases: 3})
	h2 := decodeValue[Host](t, d.ok(CmdSetHostState, SetHostState{ID: "h2", State: HostStateActive}))
	r = d.do(CmdSetHostState, SetHostState{ID: "h2", State: HostStateLost, IdleSince: h2.UpdatedAt - 1})
	assert.ErrorIs(t, r.Err, ErrConflict, "reported after the bound: not lost")
	h2 = decodeValue[Host](t, d.ok(CmdSetHostState, SetHostState{ID: "h2", State: HostStateLost, IdleSince: h2.UpdatedAt}))
	assert.Equal(t, HostStateLost, h2.State)

	// Readmitted by the operator.
	h = decodeValue[Host](t, d.ok(CmdSetHostState, SetHostState{ID: "h1", State: HostStateActive}))
	assert.Equal(t, HostStateActive, h.State)
}
