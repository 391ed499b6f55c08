package fsm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// gatedDelete is a level-2 command that would delete uuidN(1) if applied.
func gatedDelete() DeleteDatabaseIf {
	return DeleteDatabaseIf{AccountID: "a1", UUID: uuidN(1), ExpectObjectID: "obj-" + uuidN(1), ExpectRoutingGeneration: 1}
}

func levelCatalog(t *testing.T, opts ...Option) (*FSM, *driver) {
	t.Helper()
	f := newFSM(t, opts...)
	d := newDriver(t, f)
	d.account("a1", 100)
	d.ok(CmdRegisterHost, RegisterHost{ID: "h1", Address: "10.0.0.1:1", State: HostStateActive})
	d.ok(CmdCreateDatabase, createDB(uuidN(1), "a1", "one"))
	return f, d
}

// TestClusterLevelGate: below its level a command is refused with
// cluster_level_too_low and leaves the catalog exactly as a build that does
// not know the command leaves it (unknown_command): same dump, meta and
// remembered requests included. At its level it applies.
func TestClusterLevelGate(t *testing.T) {
	f, d := levelCatalog(t)
	old, o := levelCatalog(t)
	require.Equal(t, int64(1), f.ClusterLevel())
	require.Equal(t, dump(t, f), dump(t, old))

	r := d.do(CmdDeleteDatabaseIf, gatedDelete())
	require.NotNil(t, r.Err)
	assert.Equal(t, CodeClusterLevelTooLow, r.Err.Code)
	assert.ErrorIs(t, r.Err, ErrClusterLevelTooLow)
	assert.True(t, IsRefusal(r.Err))
	assert.Contains(t, r.Err.Message, "needs catalog level 2, the cluster is at level 1")
	assert.Contains(t, r.Err.Message, "upgrade every catalog node to a build that knows level 2 first")

	// The older build's view of the same entry: a type it does not know.
	raw := o.do("delete_database_if_unknown_here", gatedDelete())
	require.NotNil(t, raw.Err)
	require.Equal(t, CodeUnknownCommand, raw.Err.Code)
	assert.Equal(t, dump(t, old), dump(t, f), "the refusal changed the catalog")
	assert.NotContains(t, dump(t, f), clusterLevelKey, "the level row appeared without set_cluster_level")

	// Raised: the same request ID now applies (a refusal is not remembered).
	lv := decodeValue[ClusterLevelResult](t, d.ok(CmdSetClusterLevel, SetClusterLevel{Level: 2}))
	assert.Equal(t, int64(2), lv.Level)
	assert.Equal(t, int64(2), f.ClusterLevel())
	r = d.doRID(CmdDeleteDatabaseIf, "rid-4", gatedDelete())
	require.Nil(t, r.Err, "%v", r.Err)
	db, err := f.Database(context.Background(), uuidN(1))
	require.NoError(t, err)
	assert.Equal(t, StateDeleted, db.State)
}

// TestSetClusterLevelNeverLowers: raising writes the row once; the same or
// a lower level is a success that changes nothing but the applied index
// and the remembered request; level 0 is invalid.
func TestSetClusterLevelNeverLowers(t *testing.T) {
	f, d := levelCatalog(t)
	// At the cluster's own level: nothing written, no row.
	assert.Equal(t, int64(1), decodeValue[ClusterLevelResult](t, d.ok(CmdSetClusterLevel, SetClusterLevel{Level: 1})).Level)
	assert.NotContains(t, dump(t, f), clusterLevelKey)

	assert.Equal(t, int64(2), decodeValue[ClusterLevelResult](t, d.ok(CmdSetClusterLevel, SetClusterLevel{Level: 2})).Level)
	before := dumpCatalog(t, f)
	for _, l := range []int64{2, 1, 2} {
		assert.Equal(t, int64(2), decodeValue[ClusterLevelResult](t, d.ok(CmdSetClusterLevel, SetClusterLevel{Level: l})).Level, "set %d", l)
		assert.Equal(t, int64(2), f.ClusterLevel())
	}
	assert.Equal(t, before, dumpCatalog(t, f))
	assert.Contains(t, dump(t, f), `"cluster_level"`)
	assert.ErrorIs(t, d.do(CmdSetClusterLevel, SetClusterLevel{Level: 0}).Err, ErrInvalid)
	assert.Equal(t, int64(2), f.ClusterLevel())
}

// TestClusterLevelTravelsInSnapshots: a snapshot of a level-2 catalog
// restores at level 2 (the gated command applies on the restored replica),
// one of a level-1 catalog at level 1 — also onto a replica that was at 2.
func TestClusterLevelTravelsInSnapshots(t *testing.T) {
	f, d := levelCatalog(t)
	low := snapshotBytes(t, f)
	d.ok(CmdSetClusterLevel, SetClusterLevel{Level: 2})
	high := snapshotBytes(t, f)

	g := newFSM(t)
	require.NoError(t, restoreBytes(g, high))
	assert.Equal(t, int64(2), g.ClusterLevel())
	e := newDriver(t, g)
	e.index, e.now = d.index, d.now
	require.Nil(t, e.do(CmdDeleteDatabaseIf, gatedDelete()).Err)

	require.NoError(t, restoreBytes(g, low))
	assert.Equal(t, int64(1), g.ClusterLevel())
	assert.ErrorIs(t, e.do(CmdDeleteDatabaseIf, gatedDelete()).Err, ErrClusterLevelTooLow)

	_, err := CheckSnapshot(context.Background(), bytes.NewReader(high), t.TempDir())
	require.NoError(t, err)
}

// TestOlderBuildHalts: a replica whose build knows a lower level than the
// one the log or a snapshot raises the cluster to panics with a HaltError
// naming both levels, before writing anything — it does not go on to
// refuse commands the others apply.
func TestOlderBuildHalts(t *testing.T) {
	f, d := levelCatalog(t, WithBuildLevel(1))
	assert.Equal(t, int64(1), f.BuildLevel())
	before := dump(t, f)
	halt := func(fn func()) *HaltError {
		t.Helper()
		var got any
		func() {
			defer func() { got = recover() }()
			fn()
		}()
		require.NotNil(t, got, "no halt")
		he, ok := got.(*HaltError)
		require.True(t, ok, "panic value %v", got)
		var old *BuildTooOldError
		require.True(t, errors.As(he, &old))
		assert.Equal(t, BuildTooOldError{Build: 1, Cluster: 2}, *old)
		assert.Contains(t, he.Error(), "this build (catalog level 1) is older than the cluster (catalog level 2); upgrade it")
		return he
	}
	he := halt(func() { d.do(CmdSetClusterLevel, SetClusterLevel{Level: 2}) })
	assert.Equal(t, d.index, he.Index)
	assert.Equal(t, before, dump(t, f), "the halted batch wrote something")
	assert.Equal(t, int64(1), f.ClusterLevel())

	// A snapshot of a level-2 cluster, sent to the old replica.
	g, e := levelCatalog(t)
	e.ok(CmdSetClusterLevel, SetClusterLevel{Level: 2})
	snap := snapshotBytes(t, g)
	halt(func() { _ = restoreBytes(f, snap) })
	assert.Equal(t, before, dump(t, f), "the old replica's catalog was replaced")

	// A backup of a cluster above this build's level is refused on upload.
	above := strconv.FormatInt(BuildLevel+1, 10)
	_, err := g.wconn.ExecContext(context.Background(), `UPDATE meta SET value = ? WHERE key = 'cluster_level'`, above)
	require.NoError(t, err)
	_, err = CheckSnapshot(context.Background(), bytes.NewReader(snapshotBytes(t, g)), t.TempDir())
	require.ErrorIs(t, err, ErrInvalidSnapshot)
	assert.Contains(t, err.Error(), fmt.Sprintf("the backup is of catalog level %s, this build knows up to level %d", above, BuildLevel))
}

// TestEveryCommandHasALevel: the registry says which level each command
// needs, and no command needs more than this build knows.
func TestEveryCommandHasALevel(t *testing.T) {
	for typ := range commands {
		l, ok := commandLevels[typ]
		if assert.True(t, ok, "%s has no level in commandLevels", typ) {
			assert.True(t, l >= 1 && l <= BuildLevel, "%s: level %d", typ, l)
		}
	}
	for typ := range commandLevels {
		_, ok := commands[typ]
		assert.True(t, ok, "%s has a level but is not a command", typ)
	}
	assert.Equal(t, int64(2), CommandLevel(CmdDeleteDatabaseIf))
	assert.Equal(t, int64(1), CommandLevel(CmdCreateDatabase))
}

// TestFirstBatchOfUnrememberedRefusals: a catalog whose first batch holds
// only entries that are not remembered (a level refusal, an unknown type)
// commits it. (The dedupe prune indexed an empty chunk list and panicked.)
func TestFirstBatchOfUnrememberedRefusals(t *testing.T) {
	for _, typ := range []CommandType{CmdDeleteDatabaseIf, "not_a_command"} {
		f := newFSM(t)
		r := newDriver(t, f).do(typ, gatedDelete())
		require.NotNil(t, r.Err, "%s", typ)
		assert.Equal(t, uint64(1), f.AppliedIndex())
	}
}
