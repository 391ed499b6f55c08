package fsm

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestCreateDatabaseAndReads(t *testing.T) {
	ctx := context.Background()
	f := newFSM(t)
	d := newDriver(t, f)
	d.account("a1", 10)
	d.ok(CmdRegisterHost, RegisterHost{ID: "h1", Address: "127.0.0.1:7001", Region: "weur", Capacity: 1000, State: HostStateActive})

	r := d.ok(CmdCreateDatabase, createDB(uuidN(1), "a1", "first"))
	db := decodeValue[Database](t, r)
	assert.Equal(t, uuidN(1), db.UUID)
	assert.Equal(t, "127.0.0.1:7001", db.HostAddress)
	assert.Equal(t, StateActive, db.State)
	assert.Equal(t, int64(1), db.RoutingGeneration)
	assert.Equal(t, d.now, db.CreatedAt)
	assert.Equal(t, d.index, r.Index)
	assert.Equal(t, d.index, f.AppliedIndex())

	got, err := f.Database(ctx, uuidN(1))
	require.NoError(t, err)
	assert.Equal(t, db, got)
	got, err = f.DatabaseByName(ctx, "a1", "first")
	require.NoError(t, err)
	assert.Equal(t, db, got)
	_, err = f.Database(ctx, uuidN(99))
	assert.ErrorIs(t, err, ErrNotFound)

	d.ok(CmdCreateDatabase, createDB(uuidN(2), "a1", "second"))
	d.ok(CmdCreateDatabase, createDB(uuidN(3), "a1", "third-db"))
	list, total, err := f.ListDatabases(ctx, "a1", ListQuery{PerPage: 2})
	require.NoError(t, err)
	assert.Equal(t, int64(3), total)
	require.Len(t, list, 2)
	assert.Equal(t, []string{"first", "second"}, []string{list[0].Name, list[1].Name})
	list, _, err = f.ListDatabases(ctx, "a1", ListQuery{PerPage: 2, Page: 2})
	require.NoError(t, err)
	require.Len(t, list, 1)
	assert.Equal(t, "third-db", list[0].Name)
	list, total, err = f.ListDatabases(ctx, "a1", ListQuery{Name: "ir"})
	require.NoError(t, err)
	assert.Equal(t, int64(2), total)
	assert.Len(t, list, 2)
	_, _, err = f.ListDatabases(ctx, "nope", ListQuery{})
	assert.ErrorIs(t, err, ErrAccountNotFound)

	a, err := f.Account(ctx, "a1")
	require.NoError(t, err)
	assert.Equal(t, int64(3), a.ActiveDatabases)
	assert.Equal(t, int64(10), a.Limits.MaxDatabases)
	_, err = f.Account(ctx, "a2")
	assert.ErrorIs(t, err, ErrAccountNotFound)

	hosts, err := f.Hosts(ctx)
	require.NoError(t, err)
	require.Len(t, hosts, 1)
	d.ok(CmdReportHostLoad, ReportHostLoad{ID: "h1", Databases: 3, Bytes: 4096})
	hosts, err = f.Hosts(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(3), hosts[0].Databases)
	assert.Equal(t, int64(4096), hosts[0].Bytes)
	assert.ErrorIs(t, d.do(CmdReportHostLoad, ReportHostLoad{ID: "h9"}).Err, ErrNotFound)
}

func TestTokens(t *testing.T) {
	ctx := context.Background()
	f := newFSM(t)
	d := newDriver(t, f)
	d.account("a1", 10)
	hash := "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
	tok := decodeValue[Token](t, d.ok(CmdCreateToken, CreateToken{ID: "t1", AccountID: "a1", Hash: hash, Name: "ci"}))
	assert.Equal(t, "a1", tok.AccountID)
	got, err := f.TokenByHash(ctx, hash)
	require.NoError(t, err)
	assert.Equal(t, tok, got)
	assert.ErrorIs(t, d.do(CmdCreateToken, CreateToken{ID: "t2", AccountID: "a1", Hash: hash, Name: "dup"}).Err, ErrExists)
	assert.ErrorIs(t, d.do(CmdCreateToken, CreateToken{ID: "t3", AccountID: "zz", Hash: hash[:63] + "0", Name: "x"}).Err, ErrAccountNotFound)
	assert.ErrorIs(t, d.do(CmdCreateToken, CreateToken{ID: "t4", Hash: hash[:63] + "1", Name: "x"}).Err, ErrInvalid, "non-admin without account")
	d.ok(CmdCreateToken, CreateToken{ID: "admin", Hash: hash[:63] + "2", Name: "root", Admin: true})
	assert.ErrorIs(t, d.do(CmdCreateToken, CreateToken{ID: "t5", AccountID: "a1", Hash: "ABC", Name: "x"}).Err, ErrInvalid)

	d.ok(CmdRevokeToken, RevokeToken{ID: "t1"})
	got, err = f.TokenByHash(ctx, hash)
	require.NoError(t, err)
	assert.True(t, got.Revoked)
	assert.ErrorIs(t, d.do(CmdRevokeToken, RevokeToken{ID: "nope"}).Err, ErrNotFound)
	_, err = f.TokenByHash(ctx, "00")
	assert.ErrorIs(t, err, ErrNotFound)
}

func TestAccounts(t *testing.T) {
	ctx := context.Background()
	f := newFSM(t)
	d := newDriver(t, f)
	d.account("a1", 1)
	assert.ErrorIs(t, d.do(CmdCreateAccount, CreateAccount{ID: "a1", Name: "again", Tier: TierFree}).Err, ErrExists)
	assert.ErrorIs(t, d.do(CmdCreateAccount, CreateAccount{ID: "a2", Name: "x", Tier: "gold"}).Err, ErrInvalid)
	paid := TierPaid
	l := bigLimits()
	l.MaxDatabases = 5
	a := decodeValue[Account](t, d.ok(CmdUpdateAccount, UpdateAccount{ID: "a1", Tier: &paid, Limits: &l}))
	assert.Equal(t, TierPaid, a.Tier)
	assert.Equal(t, int64(5), a.Limits.MaxDatabases)
	got, err := f.Account(ctx, "a1")
	require.NoError(t, err)
	assert.Equal(t, a, got)
	assert.ErrorIs(t, d.do(CmdUpdateAccount, UpdateAccount{ID: "zz", Tier: &paid}).Err, ErrAccountNotFound)
}

func TestNameUniquenessPerAccountAmongActive(t *testing.T) {
	ctx := context.Background()
	f := newFSM(t)
	d := newDriver(t, f)
	d.account("a1", 100)
	d.account("a2", 100)
	d.ok(CmdCreateDatabase, createDB(uuidN(1), "a1", "shop"))

	before := dumpCatalog(t, f)
	r := d.do(CmdCreateDatabase, createDB(uuidN(2), "a1", "shop"))
	require.NotNil(t, r.Err)
	assert.ErrorIs(t, r.Err, ErrNameTaken)
	assert.Equal(t, CodeNameTaken, r.Err.Code)
	assert.Equal(t, before, dumpCatalog(t, f), "a refused create leaves the catalog unchanged")

	d.ok(CmdCreateDatabase, createDB(uuidN(3), "a2", "shop")) // other account: fine

	d.ok(CmdDeleteDatabase, DeleteDatabase{AccountID: "a1", UUID: uuidN(1)})
	r = d.ok(CmdCreateDatabase, createDB(uuidN(4), "a1", "shop")) // deleted name is reusable
	assert.Equal(t, uuidN(4), decodeValue[Database](t, r).UUID)
	got, err := f.DatabaseByName(ctx, "a1", "shop")
	require.NoError(t, err)
	assert.Equal(t, uuidN(4), got.UUID)
	old, err := f.Database(ctx, uuidN(1))
	require.NoError(t, err)
	assert.Equal(t, StateDeleted, old.State)
}

func TestDatabaseLimit(t *testing.T) {
	ctx := context.Background()
	f := newFSM(t)
	d := newDriver(t, f)
	d.account("a1", 2)
	d.ok(CmdCreateDatabase, createDB(uuidN(1), "a1", "one"))
	d.ok(CmdCreateDatabase, createDB(uuidN(2), "a1", "two"))
	r := d.do(CmdCreateDatabase, createDB(uuidN(3), "a1", "three"))
	assert.ErrorIs(t, r.Err, ErrDatabaseLimit)
	assert.Equal(t, CodeDatabaseLimit, r.Err.Code)
	a, err := f.Account(ctx, "a1")
	require.NoError(t, err)
	assert.Equal(t, int64(2), a.ActiveDatabases)

	d.ok(CmdDeleteDatabase, DeleteDatabase{AccountID: "a1", UUID: uuidN(1)}) // deleted ones do not count
	d.ok(CmdCreateDatabase, createDB(uuidN(3), "a1", "three"))
	assert.ErrorIs(t, d.do(CmdCreateDatabase, createDB(uuidN(4), "missing", "x")).Err, ErrAccountNotFound)
}

func TestCreateExistingUUIDRefused(t *testing.T) {
	f := newFSM(t)
	d := newDriver(t, f)
	d.account("a1", 10)
	d.ok(CmdCreateDatabase, createDB(uuidN(1), "a1", "one"))
	assert.ErrorIs(t, d.do(CmdCreateDatabase, createDB(uuidN(1), "a1", "other")).Err, ErrExists)
	d.ok(CmdDeleteDatabase, DeleteDatabase{AccountID: "a1", UUID: uuidN(1)})
	assert.ErrorIs(t, d.do(CmdCreateDatabase, createDB(uuidN(1), "a1", "one")).Err, ErrExists, "a UUID is never reused")
}

func TestDeleteDatabase(t *testing.T) {
	ctx := context.Background()
	f := newFSM(t)
	d := newDriver(t, f)
	d.account("a1", 10)
	d.account("a2", 10)
	d.ok(CmdCreateDatabase, createDB(uuidN(1), "a1", "one"))
	assert.ErrorIs(t, d.do(CmdDeleteDatabase, DeleteDatabase{AccountID: "a2", UUID: uuidN(1)}).Err, ErrNotFound, "other account's database")
	r := d.ok(CmdDeleteDatabase, DeleteDatabase{AccountID: "a1", UUID: uuidN(1)})
	db := decodeValue[Database](t, r)
	assert.Equal(t, StateDeleted, db.State)
	assert.Equal(t, d.now, db.DeletedAt)
	assert.Equal(t, int64(2), db.RoutingGeneration)
	assert.ErrorIs(t, d.do(CmdDeleteDatabase, DeleteDatabase{AccountID: "a1", UUID: uuidN(1)}).Err, ErrNotFound)
	assert.ErrorIs(t, d.do(CmdUpdateDatabase, UpdateDatabase{AccountID: "a1", UUID: uuidN(1)}).Err, ErrNotFound)
	a, err := f.Account(ctx, "a1")
	require.NoError(t, err)
	assert.Equal(t, int64(0), a.ActiveDatabases)
	_, err = f.DatabaseByName(ctx, "a1", "one")
	assert.ErrorIs(t, err, ErrNotFound)
	list, total, err := f.ListDatabases(ctx, "a1", ListQuery{})
	require.NoError(t, err)
	assert.Empty(t, list)
	assert.Zero(t, total)

	hb, err := f.Heartbeat(ctx, []string{uuidN(1), uuidN(2)})
	require.NoError(t, err)
	require.Len(t, hb.Databases, 2)
	assert.Equal(t, HeartbeatState{UUID: uuidN(1), Known: true, State: StateDeleted, AccountID: "a1", RoutingGeneration: 2, ObjectID: "obj-" + uuidN(1), DeletedAt: db.DeletedAt}, hb.Databases[0])
	assert.Equal(t, HeartbeatState{UUID: uuidN(2)}, hb.Databases[1])
}

func TestUpdateDatabase(t *testing.T) {
	f := newFSM(t)
	d := newDriver(t, f)
	d.account("a1", 10)
	d.ok(CmdCreateDatabase, createDB(uuidN(1), "a1", "one"))
	auto := ReadReplicationAuto
	db := decodeValue[Database](t, d.ok(CmdUpdateDatabase, UpdateDatabase{AccountID: "a1", UUID: uuidN(1), ReadReplication: &auto}))
	assert.Equal(t, ReadReplicationAuto, db.ReadReplication)
	bad := "sometimes"
	assert.ErrorIs(t, d.do(CmdUpdateDatabase, UpdateDatabase{AccountID: "a1", UUID: uuidN(1), ReadReplication: &bad}).Err, ErrInvalid)
}

func TestHeartbeatAccountsOncePerAccount(t *testing.T) {
	ctx := context.Background()
	f := newFSM(t)
	d := newDriver(t, f)
	d.account("a1", 10)
	d.account("a2", 10)
	d.ok(CmdCreateDatabase, createDB(uuidN(1), "a1", "one"))
	d.ok(CmdCreateDatabase, createDB(uuidN(2), "a1", "two"))
	d.ok(CmdCreateDatabase, createDB(uuidN(3), "a2", "three"))
	d.ok(CmdSetDatabaseStats, SetDatabaseStats{Stats: []DatabaseStat{{UUID: uuidN(1), SizeBytes: 100}, {UUID: uuidN(2), SizeBytes: 50}}})
	d.ok(CmdDrainStats, DrainStats{})
	hb, err := f.Heartbeat(ctx, []string{uuidN(3), uuidN(1), "not-a-uuid", uuidN(2)})
	require.NoError(t, err)
	require.Len(t, hb.Databases, 4)
	assert.Equal(t, []string{uuidN(3), uuidN(1), "not-a-uuid", uuidN(2)},
		[]string{hb.Databases[0].UUID, hb.Databases[1].UUID, hb.Databases[2].UUID, hb.Databases[3].UUID})
	assert.False(t, hb.Databases[2].Known)
	require.Len(t, hb.Accounts, 2)
	assert.Equal(t, int64(150), hb.Accounts["a1"].StorageBytes)
	assert.Equal(t, int64(2), hb.Accounts["a1"].ActiveDatabases)
	assert.Equal(t, "a1", hb.Accounts["a1"].ID)
	assert.Equal(t, int64(0), hb.Accounts["a2"].StorageBytes)
	assert.Zero(t, hb.Databases[1].DeletedAt, "active")
	// A deleted database answers its deletion time (archive sweeping).
	del := decodeValue[Database](t, d.ok(CmdDeleteDatabase, DeleteDatabase{AccountID: "a1", UUID: uuidN(2)}))
	hb, err = f.Heartbeat(ctx, []string{uuidN(2)})
	require.NoError(t, err)
	assert.Equal(t, StateDeleted, hb.Databases[0].State)
	assert.NotZero(t, hb.Databases[0].DeletedAt)
	assert.Equal(t, del.DeletedAt, hb.Databases[0].DeletedAt)
	_, err = f.Heartbeat(ctx, make([]string, MaxHeartbeatBatch+1))
	assert.ErrorIs(t, err, ErrInvalid)
}

func TestToErrorDeterministicCode(t *testing.T) {
	both := fmt.Errorf("%w and %w", ErrNotFound, ErrNameTaken)
	for i := 0; i < 50; i++ {
		assert.Equal(t, CodeNameTaken, ToError(both).Code)
	}
	assert.Equal(t, CodeInvalid, ToError(errors.New("other")).Code)
	assert.ErrorIs(t, ToError(fmt.Errorf("x: %w", ErrDatabaseLimit)), ErrDatabaseLimit)
}
