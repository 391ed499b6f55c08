package fsm

import (
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// randomLogs builds a log of n entries over a small universe so that
// commands collide: duplicate names, limits, deletes of deleted databases,
// retried request IDs (some inside the dedupe window, some past it),
// proposer clocks that go backwards, malformed entries and non-command
// entries.
func randomLogs(t testing.TB, seed uint64, n int) []*raft.Log {
	return randomLogsOf(t, seed, n, true)
}

// previousBuildLogs are randomLogs without the commands the previous
// build (TestApplyMatchesPreviousBuild's) does not know: one delete in
// three of randomLogs is a delete_database_if, derived from the entry's
// position without drawing from the generator, and randomLogs starts with
// a set_cluster_level to delete_database_if's level 2 (one more entry:
// the other entries' indexes are one higher), so both logs are otherwise
// the same.
func previousBuildLogs(t testing.TB, seed uint64, n int) []*raft.Log {
	return randomLogsOf(t, seed, n, false)
}

func randomLogsOf(t testing.TB, seed uint64, n int, conditionalDeletes bool) []*raft.Log {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	now := baseTime
	var logs []*raft.Log
	var rids []string
	accounts := []string{"a0", "a1", "a2", "a3"}
	acct := func() string { return accounts[rng.IntN(len(accounts))] }
	uid := func() string { return uuidN(rng.IntN(40)) }
	name := func() string { return fmt.Sprintf("n%d", rng.IntN(8)) }
	if conditionalDeletes {
		logs = append(logs, &raft.Log{Index: 1, Type: raft.LogCommand,
			Data: encode(t, CmdSetClusterLevel, "level-2", now, SetClusterLevel{Level: 2})})
	}
	for i := 0; i < n; i++ {
		index := uint64(len(logs) + 1)
		if rng.IntN(40) == 0 {
			logs = append(logs, &raft.Log{Index: index, Type: raft.LogNoop})
			continue
		}
		now += rng.Int64N(int64(20 * time.Millisecond))
		ts := now
		if rng.IntN(10) == 0 {
			ts -= rng.Int64N(int64(200 * time.Millisecond)) // a proposer with a slow clock
		}
		rid := fmt.Sprintf("r%d", i)
		if len(rids) > 0 && rng.IntN(8) == 0 {
			rid = rids[rng.IntN(len(rids))] // a retry, maybe of a different command
		}
		rids = append(rids, rid)
		var typ CommandType
		var body any
		switch k := rng.IntN(100); {
		case k < 6:
			l := bigLimits()
			l.MaxDatabases = rng.Int64N(6)
			typ, body = CmdCreateAccount, CreateAccount{ID: acct(), Name: "x", Tier: TierFree, Limits: l}
		case k < 9:
			l := bigLimits()
			l.MaxDatabases = rng.Int64N(10)
			typ, body = CmdUpdateAccount, UpdateAccount{ID: acct(), Limits: &l}
		case k < 12:
			typ, body = CmdRegisterHost, RegisterHost{ID: "h1", Address: fmt.Sprintf("10.0.0.%d:1", rng.IntN(3)), State: HostStateActive, Capacity: 10}
		case k < 14:
			typ, body = CmdReportHostLoad, ReportHostLoad{ID: "h1", Databases: rng.Int64N(9), Bytes: rng.Int64N(1e6)}
		case k < 17:
			typ, body = CmdCreateToken, CreateToken{ID: fmt.Sprintf("t%d", rng.IntN(5)), AccountID: acct(),
				Hash: fmt.Sprintf("%064x", rng.IntN(6)), Name: "tok"}
		case k < 18:
			typ, body = CmdRevokeToken, RevokeToken{ID: fmt.Sprintf("t%d", rng.IntN(5))}
		case k < 50:
			typ, body = CmdCreateDatabase, createDB(uid(), acct(), name())
		case k < 62:
			a, u := acct(), uid()
			typ, body = CmdDeleteDatabase, DeleteDatabase{AccountID: a, UUID: u}
			if conditionalDeletes && i%3 == 0 {
				// Expecting the create's object or a relocation's, at
				// generation 1 or 2: some match, most conflict.
				obj := "obj-" + u
				if i%2 == 0 {
					obj = fmt.Sprintf("objr%d-%s", (i/2)%3, u)
				}
				typ, body = CmdDeleteDatabaseIf, DeleteDatabaseIf{AccountID: a, UUID: u, ExpectObjectID: obj, ExpectRoutingGeneration: int64(1 + (i/6)%2)}
			}
		case k < 66:
			m := ReadReplicationAuto
			typ, body = CmdUpdateDatabase, UpdateDatabase{AccountID: acct(), UUID: uid(), ReadReplication: &m}
		case k < 82:
			var st []DatabaseStat
			for j := rng.IntN(5); j >= 0; j-- {
				// Small seqs, 0 included, so sizes arrive stale, repeated
				// and unsequenced as well as in order.
				st = append(st, DatabaseStat{UUID: uid(), SizeBytes: rng.Int64N(1000), Seq: rng.Int64N(8)})
			}
			typ, body = CmdSetDatabaseStats, SetDatabaseStats{Stats: st}
		case k < 90:
			typ, body = CmdDrainStats, DrainStats{Max: rng.IntN(4)}
		case k < 91:
			// Relocations: from the create's object or an earlier relocation's,
			// to a host that may not exist.
			u := uid()
			from := "obj-" + u
			if rng.IntN(2) == 0 {
				from = fmt.Sprintf("objr%d-%s", rng.IntN(3), u)
			}
			typ, body = CmdRelocateDatabase, RelocateDatabase{UUID: u, FromObjectID: from,
				ObjectID: fmt.Sprintf("objr%d-%s", rng.IntN(3), u), HostID: fmt.Sprintf("h%d", 1+rng.IntN(2))}
		case k < 92:
			state := HostStateLost
			if rng.IntN(2) == 0 {
				state = HostStateActive
			}
			typ, body = CmdSetHostState, SetHostState{ID: fmt.Sprintf("h%d", 1+rng.IntN(2)), State: state, IdleSince: rng.Int64N(2) * (now - int64(100*time.Millisecond))}
		case k < 93:
			typ, body = CmdNoop, struct{}{}
		case k < 96:
			typ, body = CmdCreateDatabase, createDB("NOT-A-UUID", acct(), name())
		default:
			logs = append(logs, &raft.Log{Index: index, Type: raft.LogCommand, Data: []byte(`{"v":1,"type":"create_database","rid":`)})
			continue
		}
		logs = append(logs, &raft.Log{Index: index, Type: raft.LogCommand, Data: encode(t, typ, rid, ts, body)})
	}
	return logs
}

func applyOneByOne(f *FSM, logs []*raft.Log) []interface{} {
	out := make([]interface{}, len(logs))
	for i, l := range logs {
		if l.Type == raft.LogCommand {
			out[i] = f.Apply(l)
		}
	}
	return out
}

func applyChunked(f *FSM, logs []*raft.Log, rng *rand.Rand) []interface{} {
	var out []interface{}
	for len(logs) > 0 {
		n := 1 + rng.IntN(min(len(logs), 64))
		out = append(out, f.ApplyBatch(logs[:n])...)
		logs = logs[n:]
	}
	return out
}

// deterministicOpts: a short dedupe window and entry bound so that expiry
// happens inside the test log.
func deterministicOpts() []Option {
	return []Option{WithDedupeWindow(300 * time.Millisecond), WithDedupeMaxEntries(150)}
}

func TestDeterminismApplyVersusRandomBatches(t *testing.T) {
	for seed := uint64(1); seed <= 4; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			logs := randomLogs(t, seed, 1500)
			a := newFSM(t, deterministicOpts()...)
			b := newFSM(t, deterministicOpts()...)
			ra := applyOneByOne(a, logs)
			rb := applyChunked(b, logs, rand.New(rand.NewPCG(seed, 7)))
			require.Equal(t, ra, rb, "same results")
			da, db := dump(t, a), dump(t, b)
			require.Equal(t, da, db, "same catalog")
			assert.Equal(t, a.AppliedIndex(), b.AppliedIndex())

			// The log exercised what it is meant to: refusals of several
			// kinds, dedupe hits and expired IDs.
			codes := map[string]int{}
			replayed, stale := 0, 0
			for i, r := range ra {
				res, ok := r.(Result)
				if !ok {
					continue
				}
				if res.Err != nil {
					codes[res.Err.Code]++
				}
				if bytes.Contains(res.Value, []byte(`"stale":`)) {
					stale++
				}
				if res.Index != logs[i].Index {
					replayed++ // answered from the dedupe table
				}
			}
			assert.Positive(t, replayed, "no retry was deduplicated")
			assert.Positive(t, stale, "no stale size was ignored")
			for _, c := range []string{CodeNameTaken, CodeNotFound, CodeInvalid, CodeExists} {
				assert.Positive(t, codes[c], "code %s never produced", c)
			}
			checkInvariants(t, a)
		})
	}
}

func TestSnapshotRestoreIdenticalDump(t *testing.T) {
	for _, mode := range []SnapshotMode{SnapshotBackup, SnapshotSerialize} {
		t.Run(fmt.Sprint(mode), func(t *testing.T) {
			logs := randomLogs(t, 11, 1200)
			a := newFSM(t, append(deterministicOpts(), WithSnapshotMode(mode))...)
			applyOneByOne(a, logs[:800])
			snap := snapshotBytes(t, a)

			b := newFSM(t, deterministicOpts()...)
			applyOneByOne(b, randomLogs(t, 99, 50)) // b had other state: Restore replaces it
			require.NoError(t, restoreBytes(b, snap))
			require.Equal(t, dump(t, a), dump(t, b))
			require.Equal(t, uint64(800), b.AppliedIndex())

			// Both continue identically after the restore.
			ra := applyOneByOne(a, logs[800:])
			rb := applyChunked(b, logs[800:], rand.New(rand.NewPCG(3, 3)))
			require.Equal(t, ra, rb)
			require.Equal(t, dump(t, a), dump(t, b))
		})
	}
}

// TestSnapshotIsPointInTime: entries applied between Snapshot and Persist
// are not in the snapshot (Persist runs concurrently with Apply in raft).
func TestSnapshotIsPointInTime(t *testing.T) {
	for _, mode := range []SnapshotMode{SnapshotBackup, SnapshotSerialize} {
		t.Run(fmt.Sprint(mode), func(t *testing.T) {
			logs := randomLogs(t, 5, 600)
			a := newFSM(t, append(deterministicOpts(), WithSnapshotMode(mode))...)
			applyOneByOne(a, logs[:300])
			want := dump(t, a)
			snap, err := a.Snapshot()
			require.NoError(t, err)

			done := make(chan []byte)
			go func() {
				defer close(done)
				// Persist while the apply goroutine keeps applying.
				done <- persistBytes(t, snap)
			}()
			applyOneByOne(a, logs[300:])
			data := <-done
			snap.Release()

			b := newFSM(t, deterministicOpts()...)
			require.NoError(t, restoreBytes(b, data))
			assert.Equal(t, want, dump(t, b))
			assert.NotEqual(t, want, dump(t, a))
		})
	}
}

func TestRestoreGarbageKeepsCatalog(t *testing.T) {
	ctx := context.Background()
	a := newFSM(t)
	d := newDriver(t, a)
	d.account("a1", 10)
	d.ok(CmdCreateDatabase, createDB(uuidN(1), "a1", "one"))
	good := snapshotBytes(t, a)

	b := newFSM(t)
	db := newDriver(t, b)
	db.account("b1", 10)
	db.ok(CmdCreateDatabase, createDB(uuidN(7), "b1", "seven"))
	before := dump(t, b)

	flipped := append([]byte(nil), good...)
	flipped[len(flipped)/2] ^= 0xff
	// Correctly framed (length and checksum fine) but not a catalog: caught
	// by opening it, not by the frame.
	var notSQLite, otherDB bytes.Buffer
	payload := bytes.Repeat([]byte("not a database "), 300)
	require.NoError(t, writeFramed(&notSQLite, int64(len(payload)), bytes.NewReader(payload)))
	foreign := filepath.Join(t.TempDir(), "other.db")
	odb, err := sql.Open("sqlite3", foreign)
	require.NoError(t, err)
	_, err = odb.Exec(`CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT); INSERT INTO meta VALUES ('schema_version', '999')`)
	require.NoError(t, err)
	require.NoError(t, odb.Close())
	raw, err := os.ReadFile(foreign)
	require.NoError(t, err)
	require.NoError(t, writeFramed(&otherDB, int64(len(raw)), bytes.NewReader(raw)))
	cases := map[string][]byte{
		"empty":             nil,
		"garbage":           []byte("this is not a snapshot at all, just some bytes"),
		"truncated":         good[:len(good)/2],
		"corrupted":         flipped,
		"no checksum":       good[:len(good)-4],
		"framed non-sqlite": notSQLite.Bytes(),
		"other schema":      otherDB.Bytes(),
	}
	for name, data := range cases {
		t.Run(name, func(t *testing.T) {
			err := restoreBytes(b, data)
			require.Error(t, err)
			assert.Equal(t, before, dump(t, b))
			_, err = b.Database(ctx, uuidN(7))
			assert.NoError(t, err)
		})
	}
	// The old catalog still applies, then a good snapshot replaces it.
	db.ok(CmdCreateDatabase, createDB(uuidN(8), "b1", "eight"))
	require.NoError(t, restoreBytes(b, good))
	assert.Equal(t, dump(t, a), dump(t, b))
	_, err = b.Database(ctx, uuidN(7))
	assert.ErrorIs(t, err, ErrNotFound)
	entries, err := dirEntries(b.dir)
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"catalog.db", "catalog.db-shm", "catalog.db-wal"}, entries, "temp files cleaned up")
}

// TestRefusalsLeaveNoTrace: a refused command changes nothing, whichever
// command it is and wherever it falls in a batch. The same random log is
// applied twice in random batchings, the second time with every refused
// entry replaced by a no-op carrying its request ID and time (a malformed
// one by a Raft no-op), so the dedupe memory and the proposers' clock move
// alike; the two catalogs must be identical. Commands that skip the
// SAVEPOINT (command.refusesBeforeWrites: create_database) rely on this:
// their refusals must come before their first write.
func TestRefusalsLeaveNoTrace(t *testing.T) {
	ctx := context.Background()
	for seed := uint64(1); seed <= 6; seed++ {
		logs := randomLogs(t, seed, 1500)
		rng := rand.New(rand.NewPCG(seed, 7))
		f1 := newFSM(t)
		out := applyChunked(f1, logs, rng)
		replaced := make([]*raft.Log, len(logs))
		refused := 0
		for i, l := range logs {
			replaced[i] = l
			r, ok := out[i].(Result)
			if !ok || r.Err == nil {
				continue
			}
			refused++
			var c Command
			if json.Unmarshal(l.Data, &c) != nil || c.RequestID == "" || c.Time <= 0 {
				replaced[i] = &raft.Log{Index: l.Index, Type: raft.LogNoop}
				continue
			}
			replaced[i] = &raft.Log{Index: l.Index, Type: raft.LogCommand, Data: encode(t, CmdNoop, c.RequestID, c.Time, struct{}{})}
		}
		require.Greater(t, refused, 100, "seed %d: the log must refuse commands", seed)
		f2 := newFSM(t)
		applyChunked(f2, replaced, rng)
		d1, err := f1.Dump(ctx)
		require.NoError(t, err)
		d2, err := f2.Dump(ctx)
		require.NoError(t, err)
		if d1 != d2 {
			t.Fatalf("seed %d: refused commands left a trace:\n%s", seed, firstDiff(d1, d2))
		}
	}
}

// firstDiff shows the first differing line of two dumps.
func firstDiff(a, b string) string {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := 0; i < min(len(al), len(bl)); i++ {
		if al[i] != bl[i] {
			return fmt.Sprintf("line %d:\n  with refusals:    %s\n  without them:     %s", i+1, al[i], bl[i])
		}
	}
	return fmt.Sprintf("lengths %d and %d lines", len(al), len(bl))
}

// TestApplyMatchesPreviousBuild: replicas of two builds must stay
// identical in a mixed-version group (a rolling upgrade), so a change to
// how entries are applied — the SQL, the batching, the fast decoders and
// encoders — must leave the catalog and every result exactly as the build
// before it left them. The hashes are of the Dump and of the JSON of every
// Result after previousBuildLogs(seed, 3000) applied in random batches, recorded
// with the build at ddfea9f (before the savepoint-less create, the one-
// statement apply state and the per-key digest upserts). Since the
// heartbeat digests moved into memory (digestMem), the live host_digests
// table is empty and Dump renders its section from the memory, in the
// table's format: the hashes are unchanged, so the digests a replica of
// this build holds are byte-for-byte the rows a replica of ddfea9f held
// (what snapshots carry), and every other table and every result is as
// before. What is no longer identical is the live catalog file itself
// (its host_digests table), which no replica ever compares or ships. A change of
// meaning (a new command, a new refusal) changes them on purpose: record
// them again from the build the change is deployed over, and say so in
// its rollout notes. A change of randomLogs changes them too: record them
// with the previous build and the new randomLogs.
func TestApplyMatchesPreviousBuild(t *testing.T) {
	want := map[uint64][2]string{ // seed: Dump, results
		1: {"62368591d5cf011dd8d33b375d639ead5adbd5d2effeee7d29551f229467b8e5", "ea7015b96ab3df235d09c11ef641c19131112d19960fda0f1b66dc868804e650"},
		2: {"ad7c6fe590a6f626afccb9a919491db6362bb03e4fdea96e34406ce6d7964c7f", "f5ebf8a1907da250d7fd91e107332dad7226f5e43189d045b364ae7bf9ed34b7"},
		3: {"faef03a77aee8d1058f30ada7411f3903c7f1a89dbadd321fec765f4c67e15f2", "1291c6375cd07662f931ea81aa151d9ecf73951ea71bc90f4cd9c447442d1915"},
		4: {"33e06650203056324789630a009c524a3c09d368274c1522f5e40035c8b6529b", "27019bb807ef72cec2444622f2805bc0f849f2394d88d6328538255b1e5ef754"},
	}
	for seed := uint64(1); seed <= 4; seed++ {
		f := newFSM(t)
		res := applyChunked(f, previousBuildLogs(t, seed, 3000), rand.New(rand.NewPCG(seed, 99)))
		d, err := f.Dump(context.Background())
		require.NoError(t, err)
		rb, err := json.Marshal(res)
		require.NoError(t, err)
		dh, rh := sha256.Sum256([]byte(d)), sha256.Sum256(rb)
		assert.Equal(t, want[seed][0], hex.EncodeToString(dh[:]), "seed %d: the catalog differs from the previous build's", seed)
		assert.Equal(t, want[seed][1], hex.EncodeToString(rh[:]), "seed %d: the results differ from the previous build's", seed)
	}
}
