package fsm

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/hashicorp/raft"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// baseTime is an arbitrary proposer clock (Unix nanoseconds).
const baseTime int64 = 1_780_000_000_000_000_000

func newFSM(t testing.TB, opts ...Option) *FSM {
	t.Helper()
	f, err := New(t.TempDir(), opts...)
	require.NoError(t, err)
	t.Cleanup(func() { f.Close() })
	return f
}

func encode(t testing.TB, typ CommandType, rid string, ts int64, body any) []byte {
	t.Helper()
	c, err := NewCommand(typ, rid, ts, body)
	require.NoError(t, err)
	b, err := json.Marshal(c)
	require.NoError(t, err)
	return b
}

// driver proposes commands to one FSM the way raft would: increasing log
// indexes, one entry per Apply.
type driver struct {
	t     testing.TB
	f     *FSM
	index uint64
	now   int64
	seq   int
}

func newDriver(t testing.TB, f *FSM) *driver {
	return &driver{t: t, f: f, now: baseTime}
}

func (d *driver) raw(data []byte) Result {
	d.t.Helper()
	d.index++
	r, ok := d.f.Apply(&raft.Log{Index: d.index, Term: 1, Type: raft.LogCommand, Data: data}).(Result)
	require.True(d.t, ok, "Apply must return fsm.Result")
	return r
}

// do applies a command with a fresh request ID, advancing the clock by 1 ms.
func (d *driver) do(typ CommandType, body any) Result {
	d.t.Helper()
	d.seq++
	return d.doRID(typ, fmt.Sprintf("rid-%d", d.seq), body)
}

func (d *driver) doRID(typ CommandType, rid string, body any) Result {
	d.t.Helper()
	d.now += 1_000_000
	return d.raw(encode(d.t, typ, rid, d.now, body))
}

func (d *driver) ok(typ CommandType, body any) Result {
	d.t.Helper()
	r := d.do(typ, body)
	require.Nil(d.t, r.Err, "%s refused: %v", typ, r.Err)
	return r
}

func bigLimits() Limits {
	return Limits{MaxDatabases: 1 << 40, MaxStorageBytes: 1 << 40, MaxDatabaseBytes: 1 << 30,
		RowsReadPerDay: 1 << 40, RowsWrittenPerDay: 1 << 40}
}

func (d *driver) account(id string, maxDBs int64) {
	d.t.Helper()
	l := bigLimits()
	l.MaxDatabases = maxDBs
	d.ok(CmdCreateAccount, CreateAccount{ID: id, Name: "acct " + id, Tier: TierFree, Limits: l})
}

func uuidN(n int) string { return fmt.Sprintf("00000000-0000-4000-8000-%012x", n) }

func createDB(uuid, account, name string) CreateDatabase {
	return CreateDatabase{UUID: uuid, AccountID: account, Name: name, ObjectID: "obj-" + uuid,
		HostID: "h1", Region: "weur", Jurisdiction: "", ReadReplication: ReadReplicationDisabled}
}

func decodeValue[T any](t testing.TB, r Result) T {
	t.Helper()
	var v T
	require.NoError(t, json.Unmarshal(r.Value, &v))
	return v
}

func dump(t testing.TB, f *FSM) string {
	t.Helper()
	s, err := f.Dump(context.Background())
	require.NoError(t, err)
	return s
}

// dumpCatalog drops the meta and requests tables: the applied index and
// clock advance with every entry, and refusals are remembered for dedupe;
// what a refusal must not change is the catalog proper.
func dumpCatalog(t testing.TB, f *FSM) string {
	t.Helper()
	return catalogPart(t, dump(t, f))
}

func catalogPart(t testing.TB, s string) string {
	t.Helper()
	i := strings.Index(s, "## accounts")
	j := strings.Index(s, "## requests")
	require.True(t, i >= 0 && j > i)
	return s[i:j]
}

// snapshotBytes runs Snapshot + Persist through raft's in-memory snapshot
// store and returns the stream.
func snapshotBytes(t testing.TB, f *FSM) []byte {
	t.Helper()
	snap, err := f.Snapshot()
	require.NoError(t, err)
	defer snap.Release()
	return persistBytes(t, snap)
}

func persistBytes(t testing.TB, snap raft.FSMSnapshot) []byte {
	t.Helper()
	store := raft.NewInmemSnapshotStore()
	sink, err := store.Create(raft.SnapshotVersionMax, 1, 1, raft.Configuration{}, 1, nil)
	require.NoError(t, err)
	require.NoError(t, snap.Persist(sink))
	_, rc, err := store.Open(sink.ID())
	require.NoError(t, err)
	defer rc.Close()
	b, err := io.ReadAll(rc)
	require.NoError(t, err)
	return b
}

func restoreBytes(f *FSM, b []byte) error {
	return f.Restore(io.NopCloser(bytes.NewReader(b)))
}

func dirEntries(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names, err
}

// checkInvariants verifies what every catalog must satisfy whatever log it
// applied: maintained counts equal real counts, active names are unique per
// account, change log ids are contiguous, stats exist only for active
// databases of the right account.
func checkInvariants(t testing.TB, f *FSM) {
	t.Helper()
	q := func(query string) int64 {
		var n int64
		require.NoError(t, f.rdb.QueryRow(query).Scan(&n), query)
		return n
	}
	assert.Zero(t, q(`SELECT count(*) FROM accounts a WHERE active_databases !=
		(SELECT count(*) FROM databases d WHERE d.account_id = a.id AND d.state = 'active')`), "active counts")
	assert.Zero(t, q(`SELECT count(*) FROM (SELECT 1 FROM databases WHERE state = 'active'
		GROUP BY account_id, name HAVING count(*) > 1)`), "unique active names")
	assert.Zero(t, q(`SELECT count(*) FROM databases d WHERE NOT EXISTS (SELECT 1 FROM accounts a WHERE a.id = d.account_id)`), "database without account")
	assert.Zero(t, q(`SELECT count(*) FROM accounts WHERE active_databases < 0`), "negative counts")
	assert.Zero(t, q(`SELECT count(*) FROM database_stats s LEFT JOIN databases d ON d.uuid = s.uuid
		WHERE d.uuid IS NULL OR d.state != 'active' OR d.account_id != s.account_id OR s.size_bytes < 0 OR s.seq < 0`), "stats rows")
	assert.Zero(t, q(`SELECT COALESCE(MAX(id) - MIN(id) + 1 - count(*), 0) FROM account_database_stats_changes`), "contiguous change ids")
	assert.Zero(t, q(`SELECT count(*) FROM databases WHERE (state = 'deleted') != (deleted_at != 0)`), "deleted_at")
	// Drained totals plus pending deltas equal the sum of current sizes.
	assert.Zero(t, q(`SELECT count(*) FROM accounts a WHERE
		COALESCE((SELECT storage_bytes FROM account_database_stats s WHERE s.account_id = a.id), 0) +
		COALESCE((SELECT SUM(delta) FROM account_database_stats_changes c WHERE c.account_id = a.id), 0) !=
		COALESCE((SELECT SUM(size_bytes) FROM database_stats s WHERE s.account_id = a.id), 0)`), "storage arithmetic")
	// The digests in memory are exactly what the databases table implies,
	// and the live table is empty (digestMem).
	assert.NoError(t, checkMemoryDigests(context.Background(), f), "host digests")
	assert.Zero(t, q(`SELECT count(*) FROM host_digests`), "live host_digests table")
}

// checkMemoryDigests compares the digests in memory with what the databases
// table implies, both read at one applied state.
func checkMemoryDigests(ctx context.Context, f *FSM) error {
	return f.reader(func(db *sql.DB) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback() //nolint:errcheck // read-only
		var want map[string]map[int]BucketDigest
		got, err := f.readDigestsPinned(func() error {
			var err error
			want, err = computeHostDigests(ctx, tx)
			return err
		}, true)
		if err != nil {
			return err
		}
		return compareHostDigests(want, digestView{hosts: got}.asMap())
	})
}
