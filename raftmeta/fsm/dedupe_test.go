package fsm

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRequestIDRetryAnsweredWithOriginalResult(t *testing.T) {
	ctx := context.Background()
	f := newFSM(t)
	d := newDriver(t, f)
	d.account("a1", 1)

	orig := d.doRID(CmdCreateDatabase, "create-1", createDB(uuidN(1), "a1", "one"))
	require.Nil(t, orig.Err)
	before := dump(t, f)

	// The retry is applied at a later index, after the database changed:
	// it must answer the original result and change nothing.
	retry := d.doRID(CmdCreateDatabase, "create-1", createDB(uuidN(1), "a1", "one"))
	assert.Equal(t, orig, retry)
	assert.Equal(t, dumpCatalog(t, f), catalogPart(t, before))
	a, err := f.Account(ctx, "a1")
	require.NoError(t, err)
	assert.Equal(t, int64(1), a.ActiveDatabases, "applied once")

	// An original refusal is replayed too, even when the retry would now succeed.
	refused := d.doRID(CmdCreateDatabase, "create-2", createDB(uuidN(2), "a1", "two"))
	require.ErrorIs(t, refused.Err, ErrDatabaseLimit)
	d.ok(CmdDeleteDatabase, DeleteDatabase{AccountID: "a1", UUID: uuidN(1)})
	again := d.doRID(CmdCreateDatabase, "create-2", createDB(uuidN(2), "a1", "two"))
	assert.Equal(t, refused, again)
	_, err = f.Database(ctx, uuidN(2))
	assert.ErrorIs(t, err, ErrNotFound)

	// The same request ID with a different command body still answers the
	// original: the ID names the request.
	other := d.doRID(CmdNoop, "create-1", struct{}{})
	assert.Equal(t, orig, other)
}

func TestRequestIDDedupeSurvivesSnapshotRestore(t *testing.T) {
	for _, mode := range []SnapshotMode{SnapshotBackup, SnapshotSerialize} {
		f := newFSM(t, WithSnapshotMode(mode))
		d := newDriver(t, f)
		d.account("a1", 10)
		orig := d.doRID(CmdCreateDatabase, "create-1", createDB(uuidN(1), "a1", "one"))
		require.Nil(t, orig.Err)
		refused := d.doRID(CmdCreateDatabase, "create-2", createDB(uuidN(2), "zz", "two"))
		require.ErrorIs(t, refused.Err, ErrAccountNotFound)
		snap := snapshotBytes(t, f)

		g := newFSM(t)
		require.NoError(t, restoreBytes(g, snap))
		assert.Equal(t, f.AppliedIndex(), g.AppliedIndex())
		dg := &driver{t: t, f: g, index: d.index, now: d.now}
		assert.Equal(t, orig, dg.doRID(CmdCreateDatabase, "create-1", createDB(uuidN(1), "a1", "one")))
		assert.Equal(t, refused, dg.doRID(CmdCreateDatabase, "create-2", createDB(uuidN(2), "zz", "two")))
		a, err := g.Account(context.Background(), "a1")
		require.NoError(t, err)
		assert.Equal(t, int64(1), a.ActiveDatabases)
	}
}

func TestRequestIDsExpireByWindowAndByEntries(t *testing.T) {
	ctx := context.Background()
	f := newFSM(t, WithDedupeWindow(time.Minute), WithDedupeMaxEntries(1000))
	d := newDriver(t, f)
	d.account("a1", 10)
	orig := d.doRID(CmdCreateDatabase, "c1", createDB(uuidN(1), "a1", "one"))
	require.Nil(t, orig.Err)

	// Inside the window: deduplicated.
	d.now += int64(30 * time.Second)
	assert.Equal(t, orig, d.doRID(CmdCreateDatabase, "c1", createDB(uuidN(1), "a1", "one")))

	// A proposer with a slow clock cannot resurrect an expired ID: the
	// window is measured from the largest time applied so far.
	d.now += int64(2 * time.Minute)
	d.ok(CmdNoop, struct{}{})
	d.now -= int64(10 * time.Minute)
	late := d.doRID(CmdCreateDatabase, "c1", createDB(uuidN(1), "a1", "one"))
	assert.ErrorIs(t, late.Err, ErrExists, "expired: applied again (and refused on its own merits)")
	assert.NotEqual(t, orig.Index, late.Index)

	// An ID applied with an expired time is not remembered.
	n := countRequests(t, f, "c1")
	assert.Equal(t, 0, n, "an ID applied with an already-expired time is not remembered")

	// Entry bound: after 1000 more entries the ID is forgotten.
	d.now += int64(20 * time.Minute)
	r := d.doRID(CmdCreateDatabase, "c2", createDB(uuidN(2), "a1", "two"))
	require.Nil(t, r.Err)
	for i := 0; i < 1000; i++ {
		d.raw(encode(t, CmdNoop, "", d.now, struct{}{})) // refused envelopes still advance the index
	}
	again := d.doRID(CmdCreateDatabase, "c2", createDB(uuidN(2), "a1", "two"))
	assert.ErrorIs(t, again.Err, ErrExists)
	a, err := f.Account(ctx, "a1")
	require.NoError(t, err)
	assert.Equal(t, int64(2), a.ActiveDatabases)
}

func countRequests(t *testing.T, f *FSM, rid string) int {
	t.Helper()
	if f.dd.get(rid) != nil {
		return 1
	}
	return 0
}

func TestApplyBatchRefusalDoesNotUndoOthers(t *testing.T) {
	ctx := context.Background()
	f := newFSM(t)
	var logs []*raft.Log
	add := func(typ CommandType, rid string, body any) {
		logs = append(logs, &raft.Log{Index: uint64(len(logs) + 1), Type: raft.LogCommand,
			Data: encode(t, typ, rid, baseTime+int64(len(logs)), body)})
	}
	add(CmdCreateAccount, "r1", CreateAccount{ID: "a1", Name: "a", Tier: TierFree, Limits: bigLimits()})
	add(CmdCreateDatabase, "r2", createDB(uuidN(1), "a1", "one"))
	add(CmdCreateDatabase, "r3", createDB(uuidN(2), "a1", "one")) // name taken
	logs = append(logs, &raft.Log{Index: 4, Type: raft.LogNoop})
	add(CmdCreateDatabase, "r4", createDB(uuidN(3), "a1", "three"))
	add(CmdCreateDatabase, "r2", createDB(uuidN(1), "a1", "one")) // retry inside the batch

	out := f.ApplyBatch(logs)
	require.Len(t, out, 6)
	assert.Nil(t, out[0].(Result).Err)
	assert.Nil(t, out[1].(Result).Err)
	assert.ErrorIs(t, out[2].(Result).Err, ErrNameTaken)
	assert.Nil(t, out[3], "non-command entries get nil")
	assert.Nil(t, out[4].(Result).Err)
	assert.Equal(t, out[1], out[5])
	assert.Equal(t, uint64(6), f.AppliedIndex())
	a, err := f.Account(ctx, "a1")
	require.NoError(t, err)
	assert.Equal(t, int64(2), a.ActiveDatabases)
}

// encodeResult must store exactly what json.Marshal would: replicas running
// builds with and without the fast path must keep byte-identical catalogs.
func TestEncodeResultMatchesJSONMarshal(t *testing.T) {
	db := Database{UUID: uuidN(7), AccountID: "a<b>&c", Name: "n", ObjectID: "o", HostID: "h",
		HostAddress: "10.0.0.1:80", Region: "weur", Jurisdiction: "eu\u2028x", ReadReplication: ReadReplicationDisabled,
		State: StateActive, CreatedAt: 12345, RoutingGeneration: 1}
	v, err := json.Marshal(db)
	require.NoError(t, err)
	for _, r := range []Result{
		{Index: 1},
		{Index: 1<<63 + 5, Value: v},
		{Index: 3, Value: json.RawMessage(`{"applied":1,"skipped":0}`)},
		{Index: 4, Err: &Error{Code: CodeNameTaken, Message: `"x" <taken>`}},
	} {
		want, err := json.Marshal(r)
		require.NoError(t, err)
		got, err := encodeResult(r)
		require.NoError(t, err)
		require.Equal(t, string(want), string(got))
	}
}
