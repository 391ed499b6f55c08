package fsm

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// The two-query Heartbeat answers exactly what the single joined query
// before it answered (heartbeatV1, kept here as the reference): deleted,
// unknown, repeated and relocated databases, accounts with and without a
// drained storage total, several accounts in one batch, the empty batch.
func TestHeartbeatMatchesJoinedQuery(t *testing.T) {
	ctx := context.Background()
	f := newFSM(t)
	d := newDriver(t, f)
	d.account("a1", 1000)
	d.account("a2", 1000)
	d.account("a3", 1000) // no databases
	for i := 1; i <= 30; i++ {
		acct := []string{"a1", "a2"}[i%2]
		d.ok(CmdCreateDatabase, createDB(uuidN(i), acct, fmt.Sprintf("db-%d", i)))
	}
	d.ok(CmdDeleteDatabase, DeleteDatabase{AccountID: "a1", UUID: uuidN(4)})
	d.ok(CmdDeleteDatabase, DeleteDatabase{AccountID: "a2", UUID: uuidN(7)})
	d.ok(CmdSetDatabaseStats, SetDatabaseStats{Stats: []DatabaseStat{{UUID: uuidN(2), SizeBytes: 4096, Seq: 1}}})
	d.ok(CmdDrainStats, DrainStats{})
	d.ok(CmdRegisterHost, RegisterHost{ID: "h2", Address: "127.0.0.1:2", Region: "weur", Capacity: 10, State: HostStateActive})
	d.ok(CmdRelocateDatabase, RelocateDatabase{UUID: uuidN(6), FromObjectID: "obj-" + uuidN(6), ObjectID: "moved-6", HostID: "h2"})

	batches := [][]string{
		{},
		{uuidN(1)},
		{uuidN(99)},
		{uuidN(4), uuidN(99), uuidN(1), uuidN(1), uuidN(2), uuidN(7), uuidN(6), uuidN(3)},
	}
	var all []string
	for i := 0; i <= 40; i++ {
		all = append(all, uuidN(i))
	}
	batches = append(batches, all)
	for _, b := range batches {
		want, err := heartbeatV1(ctx, f, b)
		require.NoError(t, err)
		got, err := f.Heartbeat(ctx, b)
		require.NoError(t, err)
		require.Equal(t, want, got, "batch %v", b)
		wj, _ := json.Marshal(want)
		gj, _ := json.Marshal(got)
		require.JSONEq(t, string(wj), string(gj))
	}
	got, err := f.Heartbeat(ctx, all)
	require.NoError(t, err)
	require.Len(t, got.Accounts, 2, "a1 and a2; a3 has no database in the batch")
	require.Equal(t, int64(4096), got.Accounts["a1"].StorageBytes)
	require.Equal(t, "moved-6", got.Databases[6].ObjectID)
	require.Equal(t, StateDeleted, got.Databases[4].State)
	require.False(t, got.Databases[0].Known)
}

// heartbeatV1 is FSM.Heartbeat as it was before the two-query version: one
// joined query per batch, sorted by the input position. The reference of
// TestHeartbeatMatchesJoinedQuery and the baseline of BenchmarkHeartbeat.
func heartbeatV1(ctx context.Context, f *FSM, uuids []string) (HeartbeatAnswer, error) {
	ans := HeartbeatAnswer{Databases: make([]HeartbeatState, 0, len(uuids)), Accounts: map[string]Account{}}
	if len(uuids) > MaxHeartbeatBatch {
		return ans, fmt.Errorf("%w: %d uuids in one heartbeat, at most %d", ErrInvalid, len(uuids), MaxHeartbeatBatch)
	}
	if len(uuids) == 0 {
		return ans, nil
	}
	list, err := json.Marshal(uuids)
	if err != nil {
		return ans, err
	}
	err = f.reader(func(db *sql.DB) error {
		rows, err := db.QueryContext(ctx, `SELECT j.value, d.uuid IS NOT NULL, COALESCE(d.state, ''),
			COALESCE(d.account_id, ''), COALESCE(d.routing_generation, 0), COALESCE(d.object_id, ''), a.id IS NOT NULL,
			COALESCE(a.name, ''), COALESCE(a.tier, ''), COALESCE(a.max_databases, 0),
			COALESCE(a.max_storage_bytes, 0), COALESCE(a.max_database_bytes, 0),
			COALESCE(a.rows_read_per_day, 0), COALESCE(a.rows_written_per_day, 0),
			COALESCE(a.heartbeat_interval_ms, 0), COALESCE(a.active_databases, 0),
			COALESCE(s.storage_bytes, 0), COALESCE(a.created_at, 0), COALESCE(d.deleted_at, 0)
			FROM json_each(?) j
			LEFT JOIN databases d ON d.uuid = j.value
			LEFT JOIN accounts a ON a.id = d.account_id
			LEFT JOIN account_database_stats s ON s.account_id = a.id
			ORDER BY j.key`, string(list))
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var (
				hs       HeartbeatState
				hasAcct  bool
				a        Account
				uuidText sql.NullString
			)
			if err := rows.Scan(&uuidText, &hs.Known, &hs.State, &hs.AccountID, &hs.RoutingGeneration, &hs.ObjectID, &hasAcct,
				&a.Name, &a.Tier, &a.Limits.MaxDatabases, &a.Limits.MaxStorageBytes, &a.Limits.MaxDatabaseBytes,
				&a.Limits.RowsReadPerDay, &a.Limits.RowsWrittenPerDay, &a.Limits.HeartbeatIntervalMs,
				&a.ActiveDatabases, &a.StorageBytes, &a.CreatedAt, &hs.DeletedAt); err != nil {
				return err
			}
			hs.UUID = uuidText.String
			ans.Databases = append(ans.Databases, hs)
			if hasAcct {
				if _, seen := ans.Accounts[hs.AccountID]; !seen {
					a.ID = hs.AccountID
					ans.Accounts[hs.AccountID] = a
				}
			}
		}
		return rows.Err()
	})
	return ans, err
}

// Heartbeat answers carry the catalog's restore count: 0 until a
// catalog_restored command, then one more per command; a restore from a
// backup (the FSM's Restore of a snapshot taken before) brings back the
// count the backup held, and the next catalog_restored counts on from it.
func TestHeartbeatCarriesCatalogRestores(t *testing.T) {
	ctx := context.Background()
	f := newFSM(t)
	d := newDriver(t, f)
	d.account("a1", 1000)
	d.ok(CmdCreateDatabase, createDB(uuidN(1), "a1", "db-1"))
	restores := func() int64 {
		ans, err := f.Heartbeat(ctx, []string{uuidN(1)})
		require.NoError(t, err)
		return ans.CatalogRestores
	}
	require.Zero(t, restores(), "never restored")
	backup := snapshotBytes(t, f)
	r := d.ok(CmdCatalogRestored, CatalogRestored{BackupIndex: 7})
	require.Equal(t, int64(1), decodeValue[CatalogRestoredResult](t, r).Restores)
	require.Equal(t, int64(1), restores())
	d.ok(CmdCatalogRestored, CatalogRestored{})
	require.Equal(t, int64(2), restores())

	require.NoError(t, restoreBytes(f, backup))
	require.Zero(t, restores(), "the backup's count")
	d.ok(CmdCatalogRestored, CatalogRestored{})
	require.Equal(t, int64(1), restores())
}
