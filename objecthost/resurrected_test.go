package objecthost

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// snapSink is a raft.SnapshotSink into memory.
type snapSink struct{ bytes.Buffer }

func (*snapSink) ID() string    { return "backup" }
func (*snapSink) Cancel() error { return nil }
func (*snapSink) Close() error  { return nil }

// backup is `shoal cluster backup` of the fsmCatalog: its state now.
func (c *fsmCatalog) backup() []byte {
	snap, err := c.f.Snapshot()
	require.NoError(c.t, err)
	var sink snapSink
	require.NoError(c.t, snap.Persist(&sink))
	snap.Release()
	return sink.Bytes()
}

// restoreBackup is `shoal cluster restore`: the whole catalog replaced by
// the backup, then the leader's catalog_restored command (the count the
// heartbeat answers carry).
func (c *fsmCatalog) restoreBackup(b []byte) {
	require.NoError(c.t, c.f.Restore(io.NopCloser(bytes.NewReader(b))))
	c.must(fsm.CmdCatalogRestored, fsm.CatalogRestored{})
}

// deleteDB is the edge's delete flow: the catalog write, then the host.
func deleteDB(t *testing.T, th *testHost, cat *fsmCatalog, d db) {
	t.Helper()
	cat.must(fsm.CmdDeleteDatabase, fsm.DeleteDatabase{AccountID: "acct", UUID: d.uuid})
	_, err := th.Delete(context.Background(), d.obj, 0)
	require.NoError(t, err)
}

func uuidsOf(dbs ...db) []string {
	out := make([]string, 0, len(dbs))
	for _, d := range dbs {
		out = append(out, d.uuid)
	}
	sort.Strings(out)
	return out
}

func resurrectedUUIDs(th *testHost) []string {
	var out []string
	for _, r := range th.Resurrected() {
		out = append(out, r.DatabaseUUID)
	}
	sort.Strings(out)
	return out
}

func alarmOf(th *testHost, kind string) *Alarm {
	for _, a := range th.Alarms() {
		if a.Kind == kind {
			return &a
		}
	}
	return nil
}

func catalogState(t *testing.T, cat *fsmCatalog, u string) fsm.HeartbeatState {
	t.Helper()
	ans, err := cat.f.Heartbeat(context.Background(), []string{u})
	require.NoError(t, err)
	require.Len(t, ans.Databases, 1)
	return ans.Databases[0]
}

// TestResurrectedDatabasesAlarmAfterCatalogRestore: databases deleted after
// a catalog backup come back active when it is restored; the host, which
// still holds their tombstones, names exactly them in the
// resurrected_databases alarm (status, /v1/resurrected, the gauge) — not
// the database deleted before the backup, not an orphan killed after it,
// not the live ones — keeps them deleted, writes nothing to the catalog,
// and clears each as the operator deletes it again.
func TestResurrectedDatabasesAlarmAfterCatalogRestore(t *testing.T) {
	th, cat := digestHost(t, func(c *Config) { c.CreationGrace = time.Minute })
	dbs := create(t, th, cat, 20)
	deleteDB(t, th, cat, dbs[0]) // before the backup: stays deleted
	runAll(th)
	runAll(th)
	bak := cat.backup()

	zombies := []db{dbs[3], dbs[7], dbs[11]}
	for _, d := range zombies {
		deleteDB(t, th, cat, d)
	}
	orphan := newDB("acct")
	th.mustInit(t, orphan) // its create never reaches the catalog
	runAll(th)
	rep := runAll(th)
	require.Equal(t, 1, rep.OrphansKilled, "the orphan died after the backup")
	assert.Nil(t, alarmOf(th, alarmResurrected), "no restore yet")
	assert.Zero(t, rep.Resurrection.Checked, "no check without a restore")

	cat.restoreBackup(bak)
	for _, d := range zombies {
		require.Equal(t, fsm.StateActive, catalogState(t, cat, d.uuid).State, "the backup's word: active again")
	}
	rep = runAll(th)
	assert.Equal(t, 3, rep.Resurrection.Found)
	assert.Equal(t, 5, rep.Resurrection.Checked, "every tombstone: the three, the one deleted before the backup, the orphan")
	assert.Equal(t, uuidsOf(zombies...), resurrectedUUIDs(th))
	a := alarmOf(th, alarmResurrected)
	require.NotNil(t, a, "alarm raised")
	assert.Equal(t, 3, a.Databases)
	assert.ElementsMatch(t, uuidsOf(zombies...), a.Sample)
	assert.Contains(t, a.Message, "active again in the catalog")
	st := th.Status()
	assert.Equal(t, 3, st.Resurrected)
	assert.Equal(t, 3.0, gaugeValue(t, th, "shoal_objecthost_resurrected_databases"))
	for _, r := range th.Resurrected() {
		assert.False(t, r.DeletedAt.IsZero(), "when the delete was done")
		assert.Equal(t, "acct", r.AccountID)
	}

	// The host revives nothing and deletes nothing in the catalog.
	for _, d := range zombies {
		info, err := th.Info(context.Background(), d.obj)
		require.NoError(t, err)
		assert.Equal(t, StateDeleted, info.State, "the object stays deleted")
		assert.Equal(t, fsm.StateActive, catalogState(t, cat, d.uuid).State, "the catalog is left to the operator")
	}

	// The alarm stays while they are listed (re-checks), and GET
	// /v1/resurrected lists them in full.
	rep = runAll(th)
	assert.Equal(t, 3, rep.Resurrection.Checked, "the re-check asks about the held ones only")
	assert.Equal(t, 0, rep.Resurrection.Found, "found once")
	require.NotNil(t, alarmOf(th, alarmResurrected))
	srv := httptest.NewServer(th.Handler())
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/v1/resurrected")
	require.NoError(t, err)
	var env struct {
		Result struct {
			Databases []ResurrectedDatabase `json:"databases"`
		} `json:"result"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&env))
	resp.Body.Close()
	require.Len(t, env.Result.Databases, 3)

	// The operator deletes them again: each leaves the alarm, which clears.
	cat.must(fsm.CmdDeleteDatabase, fsm.DeleteDatabase{AccountID: "acct", UUID: zombies[0].uuid})
	rep = runAll(th)
	assert.Equal(t, 1, rep.Resurrection.Cleared)
	assert.Equal(t, uuidsOf(zombies[1:]...), resurrectedUUIDs(th))
	require.NotNil(t, alarmOf(th, alarmResurrected))
	assert.Equal(t, 2, alarmOf(th, alarmResurrected).Databases)
	for _, d := range zombies[1:] {
		cat.must(fsm.CmdDeleteDatabase, fsm.DeleteDatabase{AccountID: "acct", UUID: d.uuid})
	}
	rep = runAll(th)
	assert.Equal(t, 2, rep.Resurrection.Cleared)
	assert.Nil(t, alarmOf(th, alarmResurrected), "cleared")
	assert.Empty(t, th.Resurrected())
	assert.Equal(t, 0.0, gaugeValue(t, th, "shoal_objecthost_resurrected_databases"))
	rep = runAll(th)
	assert.Zero(t, rep.Resurrection.Checked, "nothing held: no more calls")
}

// TestResurrectedFoundAfterARestart: a catalog restored while the host was
// down is seen at the first answer after its start (the count is above 0):
// the tombstones are checked then.
func TestResurrectedFoundAfterARestart(t *testing.T) {
	th, cat := digestHost(t, nil)
	dbs := create(t, th, cat, 10)
	runAll(th)
	bak := cat.backup()
	deleteDB(t, th, cat, dbs[4])
	require.NoError(t, th.Host.Close())
	cat.restoreBackup(bak)
	th.open(t)

	runAll(th)
	assert.Equal(t, []string{dbs[4].uuid}, resurrectedUUIDs(th))
	require.NotNil(t, alarmOf(th, alarmResurrected))
}

// TestResurrectedTombstoneOutlivesTheSweep: the sweep removes a held
// tombstone's files on schedule but keeps its record while the catalog
// lists it, so the alarm does not vanish by itself; once it is deleted
// again the next sweep removes the record.
func TestResurrectedTombstoneOutlivesTheSweep(t *testing.T) {
	th, cat := digestHost(t, func(c *Config) { c.DeletedRetention = time.Minute })
	dbs := create(t, th, cat, 5)
	th.exec(t, dbs[2], "CREATE TABLE t (x)")
	runAll(th)
	bak := cat.backup()
	deleteDB(t, th, cat, dbs[2])
	cat.restoreBackup(bak)
	runAll(th)
	th.clock.Advance(2 * time.Minute) // past the retention
	require.Equal(t, []string{dbs[2].uuid}, resurrectedUUIDs(th))

	sizes := len(th.sink.Sizes())
	n, err := th.Sweep(context.Background())
	require.NoError(t, err)
	assert.Zero(t, n, "the record is kept")
	assert.NoFileExists(t, th.path(dbs[2].obj), "the file went on schedule")
	got := th.sink.Sizes()[sizes:]
	require.Len(t, got, 1, "its size 0 published, as a sweep does")
	assert.Equal(t, dbs[2].uuid, got[0].DatabaseUUID)
	assert.Zero(t, got[0].SizeBytes)
	info, err := th.Info(context.Background(), dbs[2].obj)
	require.NoError(t, err)
	assert.Equal(t, StateDeleted, info.State)
	runAll(th)
	require.NotNil(t, alarmOf(th, alarmResurrected), "still named after the sweep")

	cat.must(fsm.CmdDeleteDatabase, fsm.DeleteDatabase{AccountID: "acct", UUID: dbs[2].uuid})
	runAll(th)
	assert.Nil(t, alarmOf(th, alarmResurrected))
	n, err = th.Sweep(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	assert.Len(t, th.sink.Sizes(), sizes+1, "size 0 published once")
}

// TestResurrectedCheckFailureRetries: a failed linearizable read raises
// nothing and changes nothing; the check runs again after the retry delay.
func TestResurrectedCheckFailureRetries(t *testing.T) {
	th, cat := digestHost(t, nil)
	dbs := create(t, th, cat, 5)
	runAll(th)
	bak := cat.backup()
	deleteDB(t, th, cat, dbs[1])
	cat.restoreBackup(bak)
	fc := &failingConfirm{fsmCatalog: cat, fail: true}
	th.cfg.Catalog = fc
	th.Host.cfg.Catalog = fc

	rep := runAll(th)
	assert.True(t, rep.Resurrection.Failed)
	assert.Nil(t, alarmOf(th, alarmResurrected))
	fc.fail = false
	rep = runAll(th)
	assert.Equal(t, 1, rep.Resurrection.Found)
	assert.Equal(t, []string{dbs[1].uuid}, resurrectedUUIDs(th))
}

// failingConfirm fails ConfirmHeartbeat while fail is set.
type failingConfirm struct {
	*fsmCatalog
	fail bool
}

func (f *failingConfirm) ConfirmHeartbeat(ctx context.Context, uuids []string) (fsm.HeartbeatAnswer, error) {
	if f.fail {
		return fsm.HeartbeatAnswer{}, context.DeadlineExceeded
	}
	return f.fsmCatalog.ConfirmHeartbeat(ctx, uuids)
}

// TestResurrectedIgnoresSupersededObjects: an object retired here because
// its database was relocated to another host (after the backup) is named
// again by the restored catalog; its database lives on elsewhere, so it is
// not reported as resurrected (deleting it again would destroy the live
// database).
func TestResurrectedIgnoresSupersededObjects(t *testing.T) {
	th, cat := digestHost(t, nil)
	dbs := create(t, th, cat, 10)
	runAll(th)
	bak := cat.backup()
	moved := dbs[6]
	cat.must(fsm.CmdRelocateDatabase, fsm.RelocateDatabase{UUID: moved.uuid, FromObjectID: moved.obj, ObjectID: newObjectID(), HostID: "host-2"})
	rep := runAll(th)
	require.Equal(t, 1, rep.Superseded)
	gone := dbs[8]
	deleteDB(t, th, cat, gone)

	cat.restoreBackup(bak)
	st := catalogState(t, cat, moved.uuid)
	require.Equal(t, moved.obj, st.ObjectID, "the restored catalog names the retired object again")
	runAll(th)
	assert.Equal(t, []string{gone.uuid}, resurrectedUUIDs(th), "only the deleted database, not the relocated one")
}
