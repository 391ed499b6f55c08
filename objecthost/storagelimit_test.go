package objecthost

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	v4 "github.com/shoaldb/shoal/internal/v4"
	"github.com/shoaldb/shoal/objecthost/sqlexec"
	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// TestAccountOverStorageLimitOnEveryDatabase: one heartbeat answer about
// the account (keyed by account) blocks INSERT and CREATE TABLE on all of
// its databases, even small inserts that fit in free pages, while SELECT and
// DELETE work; the next heartbeat after the total drops lifts it.
func TestAccountOverStorageLimitOnEveryDatabase(t *testing.T) {
	th := hbHost(t, nil)
	ctx := context.Background()
	dbs := []db{newDB("full"), newDB("full"), newDB("full")}
	other := newDB("roomy")
	for _, d := range append(dbs, other) {
		th.mustInit(t, d)
		_, err := th.Query(ctx, d.obj, d.id(), q("CREATE TABLE t (x); INSERT INTO t VALUES (1), (2)"))
		require.NoError(t, err)
		th.cat.set(d.uuid, d.account, fsm.StateActive, 1)
	}
	th.cat.setAccount(fsm.Account{ID: "full", StorageBytes: 5000, Limits: fsm.Limits{MaxStorageBytes: 5000}})
	th.cat.setAccount(fsm.Account{ID: "roomy", StorageBytes: 10, Limits: fsm.Limits{MaxStorageBytes: 5000}})
	th.beat()

	refused := func(d db, sql string) {
		t.Helper()
		_, err := th.Query(ctx, d.obj, d.id(), q(sql))
		var se *sqlexec.Error
		require.ErrorAs(t, err, &se, sql)
		assert.Equal(t, v4.CodeStorageLimit, se.Code)
		assert.Equal(t, sqlexec.AccountStorageLimitMessage, se.Message)
		status, _, _ := statusOf(err)
		assert.Equal(t, 400, status)
	}
	for _, d := range dbs {
		refused(d, "INSERT INTO t VALUES (3)")
		refused(d, "CREATE TABLE u (y)")
		res, err := th.Query(ctx, d.obj, d.id(), q("SELECT count(*) AS n FROM t"))
		require.NoError(t, err, "reads work")
		assert.Len(t, res, 1)
		_, err = th.Query(ctx, d.obj, d.id(), q("DELETE FROM t WHERE x = 1"))
		assert.NoError(t, err, "deletes work")
	}
	_, err := th.Query(ctx, other.obj, other.id(), q("INSERT INTO t VALUES (3)"))
	assert.NoError(t, err, "another account is unaffected")

	th.cat.setAccount(fsm.Account{ID: "full", StorageBytes: 4000, Limits: fsm.Limits{MaxStorageBytes: 5000}})
	th.beat()
	for _, d := range dbs {
		_, err := th.Query(ctx, d.obj, d.id(), q("INSERT INTO t VALUES (3); CREATE TABLE u (y)"))
		assert.NoError(t, err, "writes resume by the next heartbeat")
	}
}

// TestPerDatabaseSizeRefusalNamesItsLimit: a database at the account's
// per-database size limit is refused with the database-size message, not
// the account-storage one.
func TestPerDatabaseSizeRefusalNamesItsLimit(t *testing.T) {
	th := hbHost(t, nil)
	ctx := context.Background()
	d := newDB("small")
	th.mustInit(t, d)
	_, err := th.Query(ctx, d.obj, d.id(), q("CREATE TABLE t (x); INSERT INTO t VALUES (randomblob(50000))"))
	require.NoError(t, err)
	th.cat.set(d.uuid, "small", fsm.StateActive, 1)
	th.cat.setAccount(fsm.Account{ID: "small", Limits: fsm.Limits{MaxDatabaseBytes: 40000, MaxStorageBytes: 1 << 30}})
	th.beat()
	_, err = th.Query(ctx, d.obj, d.id(), q("INSERT INTO t VALUES (randomblob(50000))"))
	var se *sqlexec.Error
	require.ErrorAs(t, err, &se)
	assert.Equal(t, v4.CodeStorageLimit, se.Code)
	assert.Equal(t, sqlexec.DatabaseSizeLimitMessage, se.Message)
	assert.NotContains(t, se.Message, "account")
}
