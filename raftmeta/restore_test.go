package raftmeta

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/binary"
	"encoding/json"
	"hash/crc32"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// frameSnapshot frames a payload as fsm's snapshot stream: "SHOALFS1",
// big-endian length, payload, big-endian CRC-32C. Written out here rather
// than borrowed from fsm so the test pins the format a backup file has.
// raiseLength returns a copy of a backup whose header claims 64 KiB more
// payload than it holds (a flipped bit in the length field).
func raiseLength(b []byte) []byte {
	b = bytes.Clone(b)
	binary.BigEndian.PutUint64(b[8:16], binary.BigEndian.Uint64(b[8:16])+1<<16)
	return b
}

func frameSnapshot(payload []byte) []byte {
	out := append([]byte("SHOALFS1"), binary.BigEndian.AppendUint64(nil, uint64(len(payload)))...)
	out = append(out, payload...)
	return binary.BigEndian.AppendUint32(out, crc32.Checksum(payload, crc32.MakeTable(crc32.Castagnoli)))
}

// alterPayload writes a backup's SQLite file to disk, runs sqlText on it
// (or hands it to edit), and returns the result framed again with a correct
// checksum: well-framed files that are not catalogs of this version.
func alterPayload(t *testing.T, backup []byte, sqlText string, edit func(path string)) []byte {
	t.Helper()
	path := filepath.Join(t.TempDir(), "payload.db")
	require.NoError(t, os.WriteFile(path, backup[16:len(backup)-4], 0o600))
	if sqlText != "" {
		db, err := sql.Open("sqlite3", "file:"+path+"?_journal_mode=DELETE")
		require.NoError(t, err)
		_, err = db.Exec(sqlText)
		require.NoError(t, err)
		require.NoError(t, db.Close())
	}
	if edit != nil {
		edit(path)
	}
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	return frameSnapshot(raw)
}

// corruptIndexPage overwrites the b-tree page header of an index's root
// page, leaving the schema and the tables readable: only integrity_check
// finds it.
func corruptIndexPage(t *testing.T, index string) func(string) {
	return func(path string) {
		db, err := sql.Open("sqlite3", "file:"+path+"?mode=ro")
		require.NoError(t, err)
		var pageSize, root int64
		require.NoError(t, db.QueryRow(`PRAGMA page_size`).Scan(&pageSize))
		require.NoError(t, db.QueryRow(`SELECT rootpage FROM sqlite_schema WHERE name = ?`, index).Scan(&root))
		require.NoError(t, db.Close())
		require.Greater(t, root, int64(1))
		fh, err := os.OpenFile(path, os.O_RDWR, 0)
		require.NoError(t, err)
		_, err = fh.WriteAt(bytes.Repeat([]byte{0xee}, 12), (root-1)*pageSize)
		require.NoError(t, err)
		require.NoError(t, fh.Close())
	}
}

func foreignSQLite(t *testing.T) []byte {
	t.Helper()
	path := filepath.Join(t.TempDir(), "foreign.db")
	db, err := sql.Open("sqlite3", "file:"+path+"?_journal_mode=DELETE")
	require.NoError(t, err)
	_, err = db.Exec(`CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT); INSERT INTO notes (body) VALUES ('hello')`)
	require.NoError(t, err)
	require.NoError(t, db.Close())
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	return raw
}

// postRestore sends body to a node's restore endpoint as any HTTP client
// would and returns the status and the JSON error (if any).
func postRestore(t *testing.T, addr string, body []byte) (int, wireError) {
	t.Helper()
	resp, err := http.Post("http://"+addr+"/v1/cluster/restore", "application/octet-stream", bytes.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	var out struct {
		Error wireError `json:"error"`
	}
	if resp.StatusCode != 200 {
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
	}
	return resp.StatusCode, out.Error
}

// assertCleanStore checks that every snapshot in n's store is a valid
// catalog snapshot and that no restore temp file is left in its data dir.
func assertCleanStore(t *testing.T, n *Node) {
	t.Helper()
	metas, err := n.snaps.List()
	require.NoError(t, err)
	for _, m := range metas {
		_, rc, err := n.snaps.Open(m.ID)
		require.NoError(t, err, "%s: snapshot %s", n.ID(), m.ID)
		_, err = fsm.CheckSnapshot(context.Background(), rc, t.TempDir())
		rc.Close()
		assert.NoError(t, err, "%s: snapshot %s", n.ID(), m.ID)
	}
	for _, pattern := range []string{"restore-*", "snapshot-check-*", "fsm/restore-*", "fsm/*.pre-restore*"} {
		left, err := filepath.Glob(filepath.Join(n.cfg.Dir, pattern))
		require.NoError(t, err)
		assert.Empty(t, left, "%s: temp files left", n.ID())
	}
}

func TestRestoreRefusesBadBackupsAndChangesNothing(t *testing.T) {
	tc := newTestCluster(t, 3, nil)
	ctx := context.Background()
	cl, err := NewClient(tc.addrs())
	require.NoError(t, err)
	defer cl.Close()
	_, err = cl.CreateAccount(ctx, newAccount("acct", 1000))
	require.NoError(t, err)
	for i := 0; i < 5; i++ {
		_, err := cl.CreateDatabase(ctx, newDB("acct"))
		require.NoError(t, err)
	}
	leader := tc.waitLeader()
	var buf bytes.Buffer
	_, _, err = NewAdmin(leader.HTTPAddr(), 10*time.Second).Backup(ctx, &buf)
	require.NoError(t, err)
	good := buf.Bytes()
	size := len(good)
	require.Greater(t, size, 4096)

	garbage := make([]byte, 64<<10)
	rng := rand.New(rand.NewPCG(9, 9))
	for i := range garbage {
		garbage[i] = byte(rng.Uint32())
	}
	flip := func(at int) []byte {
		b := bytes.Clone(good)
		b[at] ^= 0x40
		return b
	}
	cases := []struct {
		name string
		body []byte
		want string // in the message
	}{
		{"empty body", nil, "invalid backup: the file is empty"},
		{"garbage", garbage, "not a catalog snapshot or backup"},
		{"short text", []byte("restore me"), "not a catalog snapshot or backup"},
		{"truncated in the header", good[:11], "truncated at byte 11 of the 16-byte header"},
		{"truncated after the header", good[:16], "truncated at byte 16 of " + itoa(size)},
		{"truncated in the middle", good[:size/2], "truncated at byte " + itoa(size/2) + " of " + itoa(size)},
		{"truncated by the last byte", good[:size-1], "truncated at byte " + itoa(size-1) + " of " + itoa(size)},
		{"trailing data", append(bytes.Clone(good), "extra"...), "5 unexpected bytes after the end of the snapshot at byte " + itoa(size)},
		{"flipped payload byte", flip(size / 2), "checksum mismatch"},
		{"flipped checksum byte", flip(size - 2), "checksum mismatch"},
		{"length raised", raiseLength(good), "truncated at byte " + itoa(size)},
		{"framed, not SQLite", frameSnapshot(garbage), "the payload is not a SQLite database"},
		{"framed SQLite, not a catalog", frameSnapshot(foreignSQLite(t)), "not a catalog: the SQLite file has no meta table"},
		{"catalog of a newer schema version", alterPayload(t, good, `UPDATE meta SET value = '5' WHERE key = 'schema_version'`, nil),
			`catalog schema version "5" unsupported (this build restores version "4"`},
		{"catalog without a table", alterPayload(t, good, `DROP TABLE hosts`, nil), "missing: table hosts"},
		{"catalog with another column", alterPayload(t, good, `ALTER TABLE accounts ADD COLUMN note TEXT`, nil),
			"defined differently: table accounts"},
		{"catalog with an extra trigger", alterPayload(t, good,
			`CREATE TRIGGER sneaky AFTER INSERT ON databases BEGIN DELETE FROM accounts; END`, nil), "unexpected: trigger sneaky"},
		{"catalog without meta rows", alterPayload(t, good, `DELETE FROM meta WHERE key = 'applied_index'`, nil), "catalog meta unreadable"},
		{"catalog with a corrupted index page", alterPayload(t, good, "", corruptIndexPage(t, "databases_active_list")),
			"SQLite integrity check failed"},
	}

	want := catalogDump(t, leader)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			leader := tc.waitLeader()
			status, we := postRestore(t, leader.HTTPAddr(), c.body)
			assert.Equal(t, http.StatusBadRequest, status)
			assert.Equal(t, CodeInvalidBackup, we.Code)
			assert.Contains(t, we.Message, c.want)
			assert.NotContains(t, we.Message, leader.cfg.Dir, "no file paths in answers")

			// Nothing changed, the leader still leads and serves.
			assert.True(t, leader.IsLeader())
			assert.Equal(t, want, catalogDump(t, leader))
			assertCleanStore(t, leader)
		})
	}

	// The Admin client (shoal cluster restore) reports the same reason as
	// a recognisable error.
	err = NewAdmin(leader.HTTPAddr(), 10*time.Second).Restore(ctx, bytes.NewReader(good[:size-1]))
	require.ErrorIs(t, err, ErrInvalidBackup)
	assert.Equal(t, "invalid backup: truncated at byte "+itoa(size-1)+" of "+itoa(size)+" (in the checksum)", err.Error())

	// Reads and writes still work, on every node, and every node holds the
	// same catalog.
	leader = tc.waitLeader()
	d := newDB("acct")
	_, err = cl.CreateDatabase(ctx, d)
	require.NoError(t, err)
	for _, n := range tc.nodes {
		got, err := NewClient([]string{n.HTTPAddr()})
		require.NoError(t, err)
		db, err := got.Database(ctx, d.UUID, LinearizableRead())
		got.Close()
		require.NoError(t, err, n.ID())
		assert.Equal(t, d.Name, db.Name)
	}
	want = catalogDump(t, leader)
	for _, n := range tc.nodes {
		require.Eventually(t, func() bool { return catalogDump(t, n) == want }, 10*time.Second, 20*time.Millisecond, n.ID())
	}

	// Every node restarts normally (nothing bad in any snapshot store) and
	// comes back with the catalog.
	for i := range tc.nodes {
		n := tc.restart(i)
		tc.waitLeader()
		require.Eventually(t, func() bool { return catalogDump(t, n) == want }, 20*time.Second, 20*time.Millisecond, n.ID())
		assertCleanStore(t, n)
	}
	_, err = cl.CreateDatabase(ctx, newDB("acct"))
	require.NoError(t, err)
}

func TestRestoreValidBackupReplacesCatalog(t *testing.T) {
	tc := newTestCluster(t, 3, nil)
	ctx := context.Background()
	cl, err := NewClient(tc.addrs())
	require.NoError(t, err)
	defer cl.Close()
	_, err = cl.CreateAccount(ctx, newAccount("acct", 1000))
	require.NoError(t, err)
	var kept []fsm.CreateDatabase
	for i := 0; i < 5; i++ {
		d := newDB("acct")
		_, err := cl.CreateDatabase(ctx, d)
		require.NoError(t, err)
		kept = append(kept, d)
	}
	var buf bytes.Buffer
	_, _, err = NewAdmin(tc.follower().HTTPAddr(), 10*time.Second).Backup(ctx, &buf)
	require.NoError(t, err)
	leader := tc.waitLeader()
	_, err = leader.ReadBarrier(ctx, LinearizableRead())
	require.NoError(t, err)
	want := catalogDump(t, leader)

	late := newDB("acct")
	_, err = cl.CreateDatabase(ctx, late)
	require.NoError(t, err)

	// A restore through plain HTTP, as curl would send it.
	status, we := postRestore(t, leader.HTTPAddr(), buf.Bytes())
	require.Equal(t, 200, status, "%+v", we)
	for _, n := range tc.nodes {
		require.Eventually(t, func() bool { return catalogDump(t, n) == want }, 10*time.Second, 20*time.Millisecond, n.ID())
	}
	_, err = cl.Database(ctx, late.UUID, LinearizableRead())
	require.ErrorIs(t, err, fsm.ErrNotFound)
	for _, d := range kept {
		_, err := cl.Database(ctx, d.UUID, LinearizableRead())
		require.NoError(t, err)
	}
	_, err = cl.CreateDatabase(ctx, newDB("acct"))
	require.NoError(t, err)
	want = catalogDump(t, tc.waitLeader())

	// The restored snapshot is a good one to start from.
	for i := range tc.nodes {
		n := tc.restart(i)
		tc.waitLeader()
		require.Eventually(t, func() bool { return catalogDump(t, n) == want }, 20*time.Second, 20*time.Millisecond, n.ID())
		assertCleanStore(t, n)
	}
}

// TestRestoreBadSnapshotLeftByEarlierVersionIsSetAside: before restores
// were checked, a bad upload became the newest snapshot in the leader's
// store (then raft panicked). Raft skips it at start when an older one
// restores; setAsideFailedSnapshots then moves it out so it is not sent to
// followers or served as a backup.
func TestRestoreBadSnapshotLeftByEarlierVersionIsSetAside(t *testing.T) {
	tc := newTestCluster(t, 1, nil)
	ctx := context.Background()
	n := tc.nodes[0]
	_, err := n.Apply(ctx, cmd(t, fsm.CmdCreateAccount, newAccount("acct", 100)))
	require.NoError(t, err)
	_, err = n.Apply(ctx, cmd(t, fsm.CmdCreateDatabase, newDB("acct")))
	require.NoError(t, err)
	_, err = n.Snapshot()
	require.NoError(t, err)
	_, err = n.Apply(ctx, cmd(t, fsm.CmdCreateDatabase, newDB("acct"))) // in the log only
	require.NoError(t, err)
	want := catalogDump(t, n)
	lastIndex := n.raft.LastIndex()
	term := n.raft.CurrentTerm()
	require.NoError(t, n.Close())

	tried, bad := plantBadSnapshot(t, tc.dirs[0], lastIndex, term)
	require.Len(t, tried, 2)
	metas := tried[1:]
	require.Equal(t, bad, tried[0].ID, "the bad snapshot is the newest")

	// Raft falls back to the older snapshot and replays the log.
	n = tc.restart(0)
	require.Eventually(t, n.IsLeader, 10*time.Second, 20*time.Millisecond)
	require.Eventually(t, func() bool { return catalogDump(t, n) == want }, 10*time.Second, 20*time.Millisecond)

	// A backup taken now comes from the snapshot raft restored, not the
	// newest in the store.
	meta, err := n.lastSnapshotMeta()
	require.NoError(t, err)
	assert.Equal(t, metas[0].ID, meta.ID)

	n.setAsideFailedSnapshots(tried)
	left, err := n.snaps.List()
	require.NoError(t, err)
	require.Len(t, left, 1)
	assert.Equal(t, metas[0].ID, left[0].ID)
	_, err = os.Stat(filepath.Join(tc.dirs[0], "snapshots-invalid", bad, "state.bin"))
	assert.NoError(t, err, "kept for inspection")
	assertCleanStore(t, n)
	n.setAsideFailedSnapshots(tried) // idempotent

	var buf bytes.Buffer
	_, err = n.Backup(ctx, &buf)
	require.NoError(t, err)
	_, err = fsm.CheckSnapshot(ctx, &buf, t.TempDir())
	require.NoError(t, err)

	// And it starts again normally.
	n = tc.restart(0)
	require.Eventually(t, n.IsLeader, 10*time.Second, 20*time.Millisecond)
	require.Eventually(t, func() bool { return catalogDump(t, n) == want }, 10*time.Second, 20*time.Millisecond)
	_, err = n.Apply(ctx, cmd(t, fsm.CmdCreateDatabase, newDB("acct")))
	require.NoError(t, err)
}

// plantBadSnapshot writes into the snapshot store at dir what raft's user
// restore wrote before its panic when an earlier version handed it a bad
// upload: the bytes as a snapshot one index past the log, with the current
// configuration. It returns the store's listing after and the bad ID.
func plantBadSnapshot(t *testing.T, dir string, lastIndex, term uint64) ([]*raft.SnapshotMeta, string) {
	t.Helper()
	store, err := raft.NewFileSnapshotStore(dir, 2, io.Discard)
	require.NoError(t, err)
	metas, err := store.List()
	require.NoError(t, err)
	var conf raft.Configuration
	var confIndex uint64
	if len(metas) > 0 {
		conf, confIndex = metas[0].Configuration, metas[0].ConfigurationIndex
	} else {
		// No snapshot yet: the configuration is the bootstrap entry's.
		conf = raft.Configuration{Servers: []raft.Server{{Suffrage: raft.Voter, ID: "n0", Address: "127.0.0.1:1"}}}
		confIndex = 1
	}
	_, trans := raft.NewInmemTransport("")
	sink, err := store.Create(raft.SnapshotVersionMax, lastIndex+1, term, conf, confIndex, trans)
	require.NoError(t, err)
	_, err = sink.Write([]byte("SHOALFS1 and then not much"))
	require.NoError(t, err)
	require.NoError(t, sink.Close())
	after, err := store.List()
	require.NoError(t, err)
	return after, sink.ID()
}

// TestRestoreNodeWhoseOnlySnapshotIsBad checks what docs/operations.md
// tells an operator: such a node does not start, and starts with its whole
// catalog once the bad snapshot's directory is moved out (it never
// compacted its log).
func TestRestoreNodeWhoseOnlySnapshotIsBad(t *testing.T) {
	tc := newTestCluster(t, 1, nil)
	ctx := context.Background()
	n := tc.nodes[0]
	_, err := n.Apply(ctx, cmd(t, fsm.CmdCreateAccount, newAccount("acct", 100)))
	require.NoError(t, err)
	_, err = n.Apply(ctx, cmd(t, fsm.CmdCreateDatabase, newDB("acct")))
	require.NoError(t, err)
	want := catalogDump(t, n)
	lastIndex, term := n.raft.LastIndex(), n.raft.CurrentTerm()
	cfg := tc.cfgs[0]
	cfg.RaftAddr, cfg.HTTPAddr = n.RaftAddr(), n.HTTPAddr()
	cfg.Bootstrap = false
	require.NoError(t, n.Close())
	tried, bad := plantBadSnapshot(t, cfg.Dir, lastIndex, term)
	require.Len(t, tried, 1)

	_, err = NewNode(cfg)
	require.ErrorContains(t, err, "failed to load any existing snapshots")

	require.NoError(t, os.Rename(filepath.Join(cfg.Dir, "snapshots", bad), filepath.Join(t.TempDir(), bad)))
	n = tc.restart(0)
	require.Eventually(t, n.IsLeader, 10*time.Second, 20*time.Millisecond)
	require.Eventually(t, func() bool { return catalogDump(t, n) == want }, 10*time.Second, 20*time.Millisecond)
}

func itoa(i int) string { return strconv.Itoa(i) }
