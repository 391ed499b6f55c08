package fsm

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// reframe frames payload with a correct length and checksum, so what is
// tested is what the SQLite file says, not the frame.
func reframe(t testing.TB, payload []byte) []byte {
	t.Helper()
	var b bytes.Buffer
	require.NoError(t, writeFramed(&b, int64(len(payload)), bytes.NewReader(payload)))
	return b.Bytes()
}

func payloadOf(snap []byte) []byte { return snap[frameHeaderBytes : len(snap)-4] }

func catalogWith(t testing.TB, d *driver) {
	d.account("a1", 100)
	for i := 1; i <= 20; i++ {
		d.ok(CmdCreateDatabase, createDB(uuidN(i), "a1", fmt.Sprintf("db%d", i)))
	}
	d.ok(CmdDeleteDatabase, DeleteDatabase{UUID: uuidN(3), AccountID: "a1"})
}

func TestCheckSnapshotAcceptsEverySnapshotMode(t *testing.T) {
	ctx := context.Background()
	for _, mode := range []SnapshotMode{SnapshotBackup, SnapshotSerialize} {
		for _, requests := range []bool{false, true} {
			t.Run(fmt.Sprintf("mode %d requests %v", mode, requests), func(t *testing.T) {
				opts := []Option{WithSnapshotMode(mode)}
				if !requests {
					opts = append(opts, WithDedupeMaxEntries(0))
				}
				// Every command type, refusals included: every column of
				// every table holds what Apply writes into it.
				a := newFSM(t, append(deterministicOpts(), opts...)...)
				applyOneByOne(a, randomLogs(t, 11, 1200))
				snap := snapshotBytes(t, a)
				dir := t.TempDir()
				info, err := CheckSnapshot(ctx, bytes.NewReader(snap), dir)
				require.NoError(t, err)
				assert.Equal(t, a.AppliedIndex(), info.AppliedIndex)
				assert.EqualValues(t, len(snap), info.Bytes)
				assert.EqualValues(t, len(snap)-16-4, info.PayloadBytes)
				left, err := os.ReadDir(dir)
				require.NoError(t, err)
				assert.Empty(t, left, "CheckSnapshot cleans up")

				// What CheckSnapshot accepts, Restore restores.
				b := newFSM(t)
				require.NoError(t, restoreBytes(b, snap))
				assert.Equal(t, dump(t, a), dump(t, b))
			})
		}
	}
}

func TestCheckSnapshotAndRestoreRefuseWithReasons(t *testing.T) {
	ctx := context.Background()
	a := newFSM(t)
	catalogWith(t, newDriver(t, a))
	good := snapshotBytes(t, a)
	n := len(good)

	edit := func(sqlText string) []byte {
		path := filepath.Join(t.TempDir(), "c.db")
		require.NoError(t, os.WriteFile(path, payloadOf(good), 0o600))
		db, err := sql.Open("sqlite3", "file:"+path+"?_journal_mode=DELETE")
		require.NoError(t, err)
		_, err = db.Exec(sqlText)
		require.NoError(t, err)
		require.NoError(t, db.Close())
		raw, err := os.ReadFile(path)
		require.NoError(t, err)
		return reframe(t, raw)
	}
	hugeLen := bytes.Clone(good)
	binary.BigEndian.PutUint64(hugeLen[8:16], 1<<50)
	cases := []struct {
		name, want string
		data       []byte
		integrity  bool // only CheckSnapshot finds it
	}{
		{"empty", "empty (no snapshot header)", nil, false},
		{"wrong magic", `does not start with "SHOALFS1"`, []byte("SHOALFS2 and more bytes here"), false},
		{"header only", fmt.Sprintf("truncated at byte 16 of %d", n), good[:16], false},
		{"huge length", "over the 1099511627776-byte limit", hugeLen, false},
		{"half", fmt.Sprintf("truncated at byte %d of %d", n/2, n), good[:n/2], false},
		{"no checksum", fmt.Sprintf("truncated at byte %d of %d (in the checksum)", n-4, n), good[:n-4], false},
		{"trailing", fmt.Sprintf("1 unexpected bytes after the end of the snapshot at byte %d", n), append(bytes.Clone(good), 0), false},
		{"view", "unexpected: view v", edit(`CREATE VIEW v AS SELECT 1`), false},
		{"index dropped", "missing: index databases_active_list", edit(`DROP INDEX databases_active_list`), false},
		{"version", `catalog schema version "0" unsupported`, edit(`UPDATE meta SET value = '0' WHERE key = 'schema_version'`), false},
		{"bad applied index", "parse applied index", edit(`UPDATE meta SET value = 'x' WHERE key = 'applied_index'`), false},
		{"host digest edited", `host digests do not match the databases table (host "h1"`, edit(`UPDATE host_digests SET digest = digest + 1 WHERE (host_id, bucket) = (SELECT host_id, bucket FROM host_digests LIMIT 1)`), true},
		{"host digest missing", "host digests do not match the databases table (", edit(`DELETE FROM host_digests WHERE bucket = (SELECT MIN(bucket) FROM host_digests)`), true},
		{"not null broken", "SQLite integrity check failed", edit(`PRAGMA ignore_check_constraints = ON; PRAGMA writable_schema = ON;
			UPDATE sqlite_schema SET sql = replace(sql, 'name                   TEXT NOT NULL', 'name                   TEXT') WHERE name = 'accounts';
			PRAGMA writable_schema = RESET;
			UPDATE accounts SET name = NULL;
			PRAGMA writable_schema = ON;
			UPDATE sqlite_schema SET sql = replace(sql, 'name                   TEXT,', 'name                   TEXT NOT NULL,') WHERE name = 'accounts';
			PRAGMA writable_schema = RESET;`), true},
	}
	b := newFSM(t)
	db := newDriver(t, b)
	db.account("b1", 10)
	db.ok(CmdCreateDatabase, createDB(uuidN(70), "b1", "seventy"))
	before := dump(t, b)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := CheckSnapshot(ctx, bytes.NewReader(c.data), t.TempDir())
			require.ErrorIs(t, err, ErrInvalidSnapshot)
			assert.Contains(t, err.Error(), c.want)

			err = restoreBytes(b, c.data)
			if c.integrity {
				// Restore leaves the full integrity check to the upload path.
				return
			}
			require.ErrorIs(t, err, ErrInvalidSnapshot)
			assert.Contains(t, err.Error(), c.want)
			assert.Equal(t, before, dump(t, b))
		})
	}
}

// TestRestoreNeverPanicsOnCorruptedPayloads flips and truncates bytes of a
// good payload and frames the result correctly, so every mutation reaches
// SQLite. Restore must refuse (leaving the old catalog serving) or accept,
// never panic; CheckSnapshot likewise.
func TestRestoreNeverPanicsOnCorruptedPayloads(t *testing.T) {
	ctx := context.Background()
	a := newFSM(t)
	catalogWith(t, newDriver(t, a))
	payload := payloadOf(snapshotBytes(t, a))

	b := newFSM(t)
	d := newDriver(t, b)
	rng := rand.New(rand.NewPCG(1, 2))
	refused := 0
	for i := 0; i < 150; i++ {
		p := bytes.Clone(payload)
		switch i % 3 {
		case 0:
			for k := 0; k < 1+rng.IntN(8); k++ {
				p[rng.IntN(len(p))] ^= byte(1 + rng.IntN(255))
			}
		case 1:
			p = p[:rng.IntN(len(p))]
		case 2:
			at := rng.IntN(len(p) - 64)
			copy(p[at:at+64], bytes.Repeat([]byte{0xff}, 64))
		}
		data := reframe(t, p)
		_, cerr := CheckSnapshot(ctx, bytes.NewReader(data), t.TempDir())
		before := dump(t, b)
		err := restoreBytes(b, data)
		switch {
		case err != nil:
			refused++
			require.ErrorIs(t, err, ErrInvalidSnapshot, "mutation %d", i)
			require.Error(t, cerr, "CheckSnapshot accepted what Restore refused (mutation %d)", i)
			require.Equal(t, before, dump(t, b), "mutation %d", i)
		case cerr != nil:
			// Only the integrity check caught it (Restore leaves that to
			// the upload path): back to a good catalog before applying,
			// since Apply fails stop on a corrupted file by design.
			require.NoError(t, restoreBytes(b, reframe(t, payload)))
		}
		// The catalog serving now applies and snapshots.
		d.index = b.AppliedIndex()
		d.ok(CmdCreateAccount, CreateAccount{ID: fmt.Sprintf("n%d", i), Name: "n", Tier: TierFree, Limits: bigLimits()})
		_ = snapshotBytes(t, b)
	}
	assert.Positive(t, refused)
}

// FuzzRestore: no input makes Restore panic or lose the old catalog.
func FuzzRestore(f *testing.F) {
	a := newFSM(f)
	catalogWith(f, newDriver(f, a))
	good := snapshotBytes(f, a)
	f.Add(good)
	f.Add(good[:len(good)/3])
	f.Add(reframe(f, payloadOf(good)[:4096]))
	f.Add([]byte("SHOALFS1"))
	f.Fuzz(func(t *testing.T, data []byte) {
		// Not t.TempDir: fuzz test names hold '#', which ends the path of
		// the file: URIs the catalog opens.
		dir, err := os.MkdirTemp("", "fuzzrestore-")
		require.NoError(t, err)
		defer os.RemoveAll(dir)
		b, err := New(dir)
		require.NoError(t, err)
		defer b.Close()
		d := newDriver(t, b)
		d.account("keep", 10)
		before := dump(t, b)
		if err := restoreBytes(b, data); err != nil {
			require.Equal(t, before, dump(t, b))
		}
		// Also with a correct frame around the bytes.
		if err := restoreBytes(b, reframe(t, data)); err != nil {
			require.ErrorIs(t, err, ErrInvalidSnapshot)
		}
	})
}

// TestRestorePutsOldCatalogBackWhenNewOneDoesNotLoad: a file that passes
// Restore's checks but fails once swapped in (here a remembered request
// with a text timestamp, which only CheckSnapshot's type check sees) is
// refused, and the old catalog, WAL included, serves again.
func TestRestorePutsOldCatalogBackWhenNewOneDoesNotLoad(t *testing.T) {
	ctx := context.Background()
	a := newFSM(t)
	catalogWith(t, newDriver(t, a))
	path := filepath.Join(t.TempDir(), "c.db")
	require.NoError(t, os.WriteFile(path, payloadOf(snapshotBytes(t, a)), 0o600))
	db, err := sql.Open("sqlite3", "file:"+path+"?_journal_mode=DELETE")
	require.NoError(t, err)
	res, err := db.Exec(`UPDATE requests SET ts = 'noon' WHERE log_index = (SELECT min(log_index) FROM requests)`)
	require.NoError(t, err)
	changed, _ := res.RowsAffected()
	require.EqualValues(t, 1, changed)
	require.NoError(t, db.Close())
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	bad := reframe(t, raw)

	_, err = CheckSnapshot(ctx, bytes.NewReader(bad), t.TempDir())
	require.ErrorIs(t, err, ErrInvalidSnapshot)
	assert.Contains(t, err.Error(), "table requests has 1 row(s) with a value of the wrong type")

	b := newFSM(t)
	d := newDriver(t, b)
	d.account("b1", 10)
	d.ok(CmdCreateDatabase, createDB(uuidN(70), "b1", "seventy"))
	before := dump(t, b)
	err = restoreBytes(b, bad)
	require.ErrorIs(t, err, ErrInvalidSnapshot)
	assert.Contains(t, err.Error(), "the catalog does not load")
	assert.Equal(t, before, dump(t, b))
	d.ok(CmdCreateDatabase, createDB(uuidN(71), "b1", "seventy-one"))
	_, err = b.Database(ctx, uuidN(71))
	require.NoError(t, err)
	entries, err := dirEntries(b.dir)
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"catalog.db", "catalog.db-shm", "catalog.db-wal"}, entries, "temp files cleaned up")
}
