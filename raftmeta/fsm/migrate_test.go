package fsm

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// testdata/catalog-v1.snap is a snapshot stream written by the last build of
// schema version 1 (before database_stats had seq), through Snapshot and
// Persist with remembered request IDs; testdata/catalog-v1.dump is that
// catalog's Dump. The catalog: accounts a1 (databases 1–6, 2 deleted) and
// a2 (database 7); sizes 1 → 1000 then 1500, 2 → 2000 (then deleted),
// 3 → 3000, 4 → 400, 7 → 700; drained once before the second round, so
// three changes are pending (+500, +400, −2000). Applied index 13.
// Regenerate it only with a version-1 build: it stands for the snapshots
// and backups that exist in the field.
const (
	v1Snapshot = "testdata/catalog-v1.snap"
	v1Dump     = "testdata/catalog-v1.dump"
)

func readTestdata(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(name)
	require.NoError(t, err)
	return b
}

// migratedV1Dump is the Dump the version-1 catalog must have once migrated
// to the current version: the same rows, schema_version 4, database_stats
// with seq 0 (2), tokens with scope edit, no databases and no expiry, an
// empty audit log (3), and the heartbeat digests of its active databases
// (4), computed here from the dump's databases section.
func migratedV1Dump(t testing.TB) string {
	t.Helper()
	lines := strings.Split(string(readTestdata(t, v1Dump)), "\n")
	var section string
	for i, l := range lines {
		switch {
		case l == `"schema_version"|"1"`:
			lines[i] = `"schema_version"|"4"`
		case strings.HasPrefix(l, "## database_stats "):
			section = "stats"
			lines[i] = strings.TrimSuffix(l, ")") + ", seq)"
		case strings.HasPrefix(l, "## api_tokens "):
			section = "tokens"
			lines[i] = strings.TrimSuffix(l, ")") + ", scope, databases, expires_at)"
		case strings.HasPrefix(l, "## "):
			section = ""
		case section == "stats" && l != "":
			lines[i] = l + "|0"
		case section == "tokens" && l != "":
			lines[i] = l + `|"edit"|""|0`
		}
	}
	out := strings.TrimSuffix(strings.Join(lines, "\n"), "\n")
	out += "\n## audit_log (id, time, type, actor, source, account_id, subject, detail)\n"
	return out + "## host_digests (host_id, bucket, digest, count)\n" + v1DumpDigests(t, lines)
}

// v1DumpDigests renders the host_digests rows the databases section of a
// dump implies (independently of the FSM's SQL), in (host, bucket) order.
func v1DumpDigests(t testing.TB, lines []string) string {
	t.Helper()
	type key struct {
		host   string
		bucket int
	}
	acc := map[key][2]int64{}
	in := false
	for _, l := range lines {
		if strings.HasPrefix(l, "## ") {
			in = strings.HasPrefix(l, "## databases ")
			if in {
				require.Equal(t, "## databases (id, uuid, account_id, name, object_id, host_id, region, jurisdiction, read_replication, state, created_at, deleted_at, routing_generation)", l)
			}
			continue
		}
		if !in || l == "" {
			continue
		}
		f := strings.Split(l, "|")
		require.Len(t, f, 13, l)
		uq := func(s string) string { v, err := strconv.Unquote(s); require.NoError(t, err); return v }
		if uq(f[9]) != StateActive {
			continue
		}
		gen, err := strconv.ParseInt(f[12], 10, 64)
		require.NoError(t, err)
		k := key{uq(f[5]), DigestBucket(uq(f[1]))}
		v := acc[k]
		v[0] ^= DigestOf(uq(f[1]), uq(f[4]), gen)
		v[1]++
		acc[k] = v
	}
	require.NotEmpty(t, acc, "the v1 catalog has active databases")
	keys := make([]key, 0, len(acc))
	for k := range acc {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].host != keys[j].host {
			return keys[i].host < keys[j].host
		}
		return keys[i].bucket < keys[j].bucket
	})
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%q|%d|%d|%d\n", k.host, k.bucket, acc[k][0], acc[k][1])
	}
	return b.String()
}

func TestSchemaVersionIsMigrationCount(t *testing.T) {
	assert.Equal(t, strconv.Itoa(len(migrations)+1), schemaVersion)
	f := newFSM(t)
	var v string
	require.NoError(t, f.rdb.QueryRow(`SELECT value FROM meta WHERE key = 'schema_version'`).Scan(&v))
	assert.Equal(t, schemaVersion, v)
}

// TestRestoreVersion1Snapshot: a snapshot (or backup) of schema version 1
// passes CheckSnapshot, restores with database_stats migrated (seq 0 for
// every row), keeps its remembered request IDs and pending changes, and the
// restored catalog applies sequenced sizes and snapshots as version 2.
func TestRestoreVersion1Snapshot(t *testing.T) {
	ctx := context.Background()
	snap := readTestdata(t, v1Snapshot)
	require.Contains(t, string(readTestdata(t, v1Dump)), `"schema_version"|"1"`)

	dir := t.TempDir()
	info, err := CheckSnapshot(ctx, bytes.NewReader(snap), dir)
	require.NoError(t, err)
	assert.Equal(t, uint64(13), info.AppliedIndex)

	f := newFSM(t)
	d := newDriver(t, f)
	d.account("other", 10) // replaced by the restore
	require.NoError(t, restoreBytes(f, snap))
	assert.Equal(t, migratedV1Dump(t), dump(t, f))
	assert.Equal(t, uint64(13), f.AppliedIndex())
	checkInvariants(t, f)
	entries, err := dirEntries(f.dir)
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"catalog.db", "catalog.db-shm", "catalog.db-wal"}, entries, "temp files cleaned up")
	var mode string
	require.NoError(t, f.rdb.QueryRow(`PRAGMA journal_mode`).Scan(&mode))
	assert.Equal(t, "wal", mode, "the migrated catalog runs in WAL mode again")

	// The remembered request IDs came along: a retry of the v1 log's
	// entry 13 (rid-13, the delete) is answered, not applied again.
	d.index = f.AppliedIndex()
	d.now = baseTime + 13_000_000
	d.seq = 100 // fresh request IDs from here on (rid-1..rid-13 are remembered)
	r := d.doRID(CmdDeleteDatabase, "rid-13", DeleteDatabase{AccountID: "a1", UUID: uuidN(2)})
	require.Nil(t, r.Err)
	assert.Equal(t, uint64(13), r.Index, "answered from the dedupe memory")

	// The pending v1 changes drain; then sizes carry seqs.
	d.ok(CmdDrainStats, DrainStats{})
	assert.Equal(t, int64(6000+500+400-2000), storage(t, f, "a1"))
	res := decodeValue[StatsResult](t, d.ok(CmdSetDatabaseStats, SetDatabaseStats{Stats: []DatabaseStat{
		{UUID: uuidN(1), SizeBytes: 100, Seq: 5}, {UUID: uuidN(1), SizeBytes: 7777, Seq: 4}, {UUID: uuidN(3), SizeBytes: 1}}}))
	// uuid 1: seq 5 kept, seq 4 stale. uuid 3: its v1 row has seq 0, so an
	// unsequenced stat is still last-writer-wins there.
	assert.Equal(t, StatsResult{Applied: 2, Stale: 1}, res)
	d.ok(CmdDrainStats, DrainStats{})
	assert.Equal(t, int64(100+1+400), storage(t, f, "a1"))
	checkInvariants(t, f)

	// A snapshot of the migrated catalog is version 2 and restores into a
	// fresh FSM identically.
	snap2 := snapshotBytes(t, f)
	_, err = CheckSnapshot(ctx, bytes.NewReader(snap2), t.TempDir())
	require.NoError(t, err)
	g := newFSM(t)
	require.NoError(t, restoreBytes(g, snap2))
	assert.Equal(t, dump(t, f), dump(t, g))
	assert.Contains(t, dump(t, g), `"schema_version"|"4"`)
}

// TestMigrateRefusesAMismatchedOldCatalog: a file claiming version 1 whose
// schema is not version 1's is refused before any migration runs, and the
// live catalog is untouched.
func TestMigrateRefusesAMismatchedOldCatalog(t *testing.T) {
	ctx := context.Background()
	snap := readTestdata(t, v1Snapshot)
	edit := func(sqlText string) []byte {
		path := filepath.Join(t.TempDir(), "c.db")
		require.NoError(t, os.WriteFile(path, payloadOf(snap), 0o600))
		db, err := sql.Open("sqlite3", "file:"+path+"?_journal_mode=DELETE")
		require.NoError(t, err)
		_, err = db.Exec(sqlText)
		require.NoError(t, err)
		require.NoError(t, db.Close())
		raw, err := os.ReadFile(path)
		require.NoError(t, err)
		return reframe(t, raw)
	}
	cases := map[string]struct {
		data []byte
		want string
	}{
		"already has seq": {edit(`ALTER TABLE database_stats ADD COLUMN seq INTEGER NOT NULL DEFAULT 0`),
			`not a catalog of schema version "1" (defined differently: table database_stats)`},
		"index dropped": {edit(`DROP INDEX databases_active_list`),
			`not a catalog of schema version "1" (missing: index databases_active_list)`},
		"no stats table": {edit(`DROP TABLE database_stats`),
			`not a catalog of schema version "1" (missing: table database_stats, trigger database_stats_delete`},
		"version 5": {edit(`UPDATE meta SET value = '5' WHERE key = 'schema_version'`),
			`catalog schema version "5" unsupported (this build restores version "4", and migrates versions 1 to 3)`},
	}
	f := newFSM(t)
	d := newDriver(t, f)
	d.account("keep", 10)
	before := dump(t, f)
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := CheckSnapshot(ctx, bytes.NewReader(c.data), t.TempDir())
			require.ErrorIs(t, err, ErrInvalidSnapshot)
			assert.Contains(t, err.Error(), c.want)
			err = restoreBytes(f, c.data)
			require.ErrorIs(t, err, ErrInvalidSnapshot)
			assert.Contains(t, err.Error(), c.want)
			assert.Equal(t, before, dump(t, f))
		})
	}
	entries, err := dirEntries(f.dir)
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"catalog.db", "catalog.db-shm", "catalog.db-wal"}, entries, "temp files cleaned up")
}
