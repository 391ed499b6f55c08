package objecthost

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/objecthost/sqlexec"
	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// TestStorageRefreshNearTheLimit: an account near its storage limit has its
// total re-read between heartbeats — one read per account whatever its
// number of databases — so crossing the limit blocks growth on all its
// databases, and dropping back lifts it, without waiting for a heartbeat;
// accounts far from their limit are never read this way.
func TestStorageRefreshNearTheLimit(t *testing.T) {
	th := hbHost(t, nil) // beat() makes every database due
	ctx := context.Background()
	var near []db
	for range 3 {
		d := newDB("near")
		th.mustInit(t, d)
		th.cat.set(d.uuid, "near", fsm.StateActive, 1)
		near = append(near, d)
	}
	far := newDB("far")
	th.mustInit(t, far)
	th.cat.set(far.uuid, "far", fsm.StateActive, 1)
	limits := fsm.Limits{MaxStorageBytes: 1 << 20}
	th.cat.setAccount(fsm.Account{ID: "near", StorageBytes: 950 << 10, Limits: limits}) // 93%
	th.cat.setAccount(fsm.Account{ID: "far", StorageBytes: 10 << 10, Limits: limits})
	rep := th.beat()
	require.Equal(t, 4, rep.Sent, "every database heartbeated: %+v", rep)
	for _, d := range near {
		_, err := th.Query(ctx, d.obj, d.id(), q("CREATE TABLE t (x)"))
		require.NoError(t, err)
	}

	// The account crosses its limit; no heartbeat runs.
	th.cat.setAccount(fsm.Account{ID: "near", StorageBytes: 1 << 20, Limits: limits})
	before := th.cat.accountReads
	assert.Equal(t, 1, th.RefreshStorage(ctx), "one read for the account, not one per database")
	assert.Equal(t, 1, th.cat.accountReads-before)
	for _, d := range near {
		_, err := th.Query(ctx, d.obj, d.id(), q("INSERT INTO t VALUES (1)"))
		var se *sqlexec.Error
		require.ErrorAs(t, err, &se, "growth blocked on every database of the account")
		_, err = th.Query(ctx, d.obj, d.id(), q("SELECT count(*) FROM t"))
		assert.NoError(t, err, "reads still work")
	}
	_, err := th.Query(ctx, far.obj, far.id(), q("CREATE TABLE t (x); INSERT INTO t VALUES (1)"))
	require.NoError(t, err, "another account is not affected")

	// Back under: lifted by the next refresh.
	th.cat.setAccount(fsm.Account{ID: "near", StorageBytes: 900 << 10, Limits: limits})
	th.RefreshStorage(ctx)
	_, err = th.Query(ctx, near[0].obj, near[0].id(), q("INSERT INTO t VALUES (1)"))
	assert.NoError(t, err, "lifted without a heartbeat")

	// A catalog that fails keeps the last answer.
	th.cat.setAccount(fsm.Account{ID: "near", StorageBytes: 2 << 20, Limits: limits})
	th.cat.mu.Lock()
	th.cat.fail = true
	th.cat.mu.Unlock()
	assert.Zero(t, th.RefreshStorage(ctx))
	_, err = th.Query(ctx, near[0].obj, near[0].id(), q("INSERT INTO t VALUES (1)"))
	assert.NoError(t, err, "no answer, no change")
}
