package main

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/objecthost"
	"github.com/shoaldb/shoal/raftmeta"
	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// fsmCatalog serves resurrectedCatalog from a real catalog state machine
// (raftmeta/fsm), applying each write as the next log entry, the way a
// node's Raft would. afterRead, when set, runs after each read: the test's
// way to change the catalog between the command's read and its write.
type fsmCatalog struct {
	t         *testing.T
	f         *fsm.FSM
	index     uint64
	now       int64
	afterRead func(uuid string, reads int)
	reads     map[string]int
}

func newFSMCatalog(t *testing.T) *fsmCatalog {
	f, err := fsm.New(t.TempDir())
	require.NoError(t, err)
	t.Cleanup(func() { f.Close() })
	return &fsmCatalog{t: t, f: f, now: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC).UnixNano(), reads: map[string]int{}}
}

func (c *fsmCatalog) apply(typ fsm.CommandType, body any) (json.RawMessage, error) {
	c.index++
	c.now += int64(time.Millisecond)
	cmd, err := fsm.NewCommand(typ, fmt.Sprintf("rid-%d", c.index), c.now, body)
	require.NoError(c.t, err)
	data, err := json.Marshal(cmd)
	require.NoError(c.t, err)
	r := c.f.Apply(&raft.Log{Index: c.index, Type: raft.LogCommand, Data: data}).(fsm.Result)
	if r.Err != nil {
		return nil, r.Err
	}
	return r.Value, nil
}

func (c *fsmCatalog) Database(ctx context.Context, id string, _ raftmeta.ReadOptions) (fsm.Database, error) {
	d, err := c.f.Database(ctx, id)
	c.reads[id]++
	if c.afterRead != nil {
		c.afterRead(id, c.reads[id])
	}
	return d, err
}

func (c *fsmCatalog) DeleteDatabaseIf(_ context.Context, d fsm.DeleteDatabaseIf) (fsm.Database, error) {
	var out fsm.Database
	v, err := c.apply(fsm.CmdDeleteDatabaseIf, d)
	if err == nil {
		err = json.Unmarshal(v, &out)
	}
	return out, err
}

// TestResurrectedDeleteIsConditional: `shoal cluster resurrected --delete`
// deletes each zombie only while the catalog still names the host's
// deleted object. A lost-host recovery that relocates one of them between
// the command's fresh read and its delete gets the relocated database kept
// (the catalog refuses: conflict), reported on its row with the catalog's
// new answer, and the command goes on with the next zombie and exits
// non-zero. With an unconditional delete, the relocated (live) database
// would be deleted.
func TestResurrectedDeleteIsConditional(t *testing.T) {
	ctx := context.Background()
	c := newFSMCatalog(t)
	_, err := c.apply(fsm.CmdSetClusterLevel, fsm.SetClusterLevel{Level: 2}) // delete_database_if's level
	require.NoError(t, err)
	_, err = c.apply(fsm.CmdCreateAccount, fsm.CreateAccount{ID: "a1", Name: "a1", Tier: fsm.TierFree,
		Limits: fsm.Limits{MaxDatabases: 10, MaxStorageBytes: 1 << 30, MaxDatabaseBytes: 1 << 30, RowsReadPerDay: 1 << 30, RowsWrittenPerDay: 1 << 30}})
	require.NoError(t, err)
	for _, h := range []string{"h1", "h2"} {
		_, err = c.apply(fsm.CmdRegisterHost, fsm.RegisterHost{ID: h, Address: h + ":1", State: fsm.HostStateActive})
		require.NoError(t, err)
	}
	var rows []resurrectedRow
	for i := 1; i <= 3; i++ {
		u := fmt.Sprintf("00000000-0000-4000-8000-%012x", i)
		_, err = c.apply(fsm.CmdCreateDatabase, fsm.CreateDatabase{UUID: u, AccountID: "a1", Name: fmt.Sprint("db", i),
			ObjectID: "obj-" + u, HostID: "h1", Region: "weur", ReadReplication: fsm.ReadReplicationDisabled})
		require.NoError(t, err)
		rows = append(rows, resurrectedRow{Host: "h1", ResurrectedDatabase: objecthost.ResurrectedDatabase{
			DatabaseUUID: u, AccountID: "a1", ObjectID: "obj-" + u}})
	}
	for i := range rows {
		rows[i].Catalog, rows[i].Error, _ = resurrectedVerdict(ctx, c, time.Second, rows[i])
		require.Equal(t, "active", rows[i].Catalog)
	}
	// The second database is relocated (lost-host recovery) right after
	// the command's fresh read, before its delete.
	moved := rows[1].DatabaseUUID
	c.afterRead = func(uuid string, reads int) {
		if uuid == moved && reads == 2 {
			_, err := c.apply(fsm.CmdRelocateDatabase, fsm.RelocateDatabase{UUID: moved, FromObjectID: "obj-" + moved, ObjectID: "recovered", HostID: "h2"})
			require.NoError(t, err)
		}
	}
	deleteZombies(ctx, c, time.Second, rows)

	assert.True(t, rows[0].Deleted)
	assert.True(t, rows[2].Deleted, "the command goes on after a refused delete")
	assert.False(t, rows[1].Deleted)
	assert.Equal(t, "other_object", rows[1].Catalog)
	assert.Contains(t, rows[1].Error, "the catalog changed since it was read")
	d, err := c.f.Database(ctx, moved)
	require.NoError(t, err)
	assert.Equal(t, fsm.StateActive, d.State, "the relocated database was deleted")
	assert.Equal(t, "recovered", d.ObjectID)
	for _, i := range []int{0, 2} {
		d, err := c.f.Database(ctx, rows[i].DatabaseUUID)
		require.NoError(t, err)
		assert.Equal(t, fsm.StateDeleted, d.State)
	}
	err = resurrectedFailures(rows)
	require.Error(t, err, "a refused delete makes the command exit non-zero")
	assert.Contains(t, err.Error(), "1 databases could not be checked or deleted")
}

// TestResurrectedDeleteNeedsLevel2: below catalog level 2 the command
// refuses before any write, naming what to do, from the cluster status
// (a node predating levels reports none: level 1); and should a delete
// reach a level-1 catalog anyway, the row says the same and nothing is
// deleted.
func TestResurrectedDeleteNeedsLevel2(t *testing.T) {
	for _, lvl := range []int64{0, 1} {
		err := deleteAllowedAt(raftmeta.ClusterStatus{ClusterLevel: lvl})
		require.ErrorIs(t, err, fsm.ErrClusterLevelTooLow, "level %d", lvl)
		assert.Contains(t, err.Error(), "upgrade every catalog node to a build that knows level 2 first")
	}
	require.NoError(t, deleteAllowedAt(raftmeta.ClusterStatus{ClusterLevel: 2}))

	ctx := context.Background()
	c := newFSMCatalog(t)
	_, err := c.apply(fsm.CmdCreateAccount, fsm.CreateAccount{ID: "a1", Name: "a1", Tier: fsm.TierFree,
		Limits: fsm.Limits{MaxDatabases: 10, MaxStorageBytes: 1 << 30, MaxDatabaseBytes: 1 << 30, RowsReadPerDay: 1 << 30, RowsWrittenPerDay: 1 << 30}})
	require.NoError(t, err)
	_, err = c.apply(fsm.CmdRegisterHost, fsm.RegisterHost{ID: "h1", Address: "h1:1", State: fsm.HostStateActive})
	require.NoError(t, err)
	u := "00000000-0000-4000-8000-000000000001"
	_, err = c.apply(fsm.CmdCreateDatabase, fsm.CreateDatabase{UUID: u, AccountID: "a1", Name: "db1",
		ObjectID: "obj-" + u, HostID: "h1", Region: "weur", ReadReplication: fsm.ReadReplicationDisabled})
	require.NoError(t, err)
	rows := []resurrectedRow{{Host: "h1", Catalog: "active", ResurrectedDatabase: objecthost.ResurrectedDatabase{
		DatabaseUUID: u, AccountID: "a1", ObjectID: "obj-" + u}}}
	deleteZombies(ctx, c, time.Second, rows)
	assert.False(t, rows[0].Deleted)
	assert.Contains(t, rows[0].Error, "upgrade every catalog node to a build that knows level 2 first")
	d, err := c.f.Database(ctx, u)
	require.NoError(t, err)
	assert.Equal(t, fsm.StateActive, d.State)
}
