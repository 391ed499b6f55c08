package fsm

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/hashicorp/raft"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// logger appends entries to one FSM the way raft would: increasing log
// indexes, the entries of one call in one ApplyBatch (one transaction).
type logger struct {
	t     testing.TB
	f     *FSM
	index uint64
}

func (g *logger) apply(datas ...[]byte) []any {
	g.t.Helper()
	logs := make([]*raft.Log, len(datas))
	for i, d := range datas {
		g.index++
		logs[i] = &raft.Log{Index: g.index, Term: 1, Type: raft.LogCommand, Data: d}
	}
	return g.f.ApplyBatch(logs)
}

// batchEntryScript is a mixed log of commands in groups (each group one
// proposal batch): creates, every refusal a create can meet, duplicates of
// request IDs inside a group and across groups, envelope refusals, a
// level-gated command, deletes and sizes (the stats fast path).
func batchEntryScript(t testing.TB) [][][]byte {
	t.Helper()
	ts := baseTime + 1_000_000_000
	next := func() int64 { ts += 1_000_000; return ts }
	c := func(rid string, typ CommandType, body any) []byte { return encode(t, typ, rid, next(), body) }
	create := func(rid string, n int, acct, name string) []byte {
		return c(rid, CmdCreateDatabase, createDB(uuidN(n), acct, name))
	}
	var groups [][][]byte
	// Group 1: plain creates, then a duplicate of the first's request ID
	// (answered from the dedupe memory), a name taken, the account's limit.
	groups = append(groups, [][]byte{
		create("g1-a", 10, "a1", "n10"),
		create("g1-b", 11, "a1", "n11"),
		create("g1-a", 12, "a1", "n12"), // same rid as g1-a: g1-a's answer
		create("g1-c", 13, "a1", "n10"), // name taken
		create("g1-d", 14, "a2", "m14"),
		create("g1-e", 15, "a2", "m15"),
		create("g1-f", 16, "a2", "m16"), // a2's limit is 2
		create("g1-g", 17, "nope", "x"), // account not found
	})
	// Group 2: envelope refusals and malformed input amid valid commands.
	bad := map[string]any{"v": 1, "type": "create_database", "rid": "g2-bad", "ts": next(), "body": map[string]any{"uuid": "not-a-uuid"}}
	badB, err := json.Marshal(bad)
	require.NoError(t, err)
	future := map[string]any{"v": CommandVersion + 1, "type": "create_database", "rid": "g2-future", "ts": next(), "body": json.RawMessage(`{}`)}
	futureB, err := json.Marshal(future)
	require.NoError(t, err)
	groups = append(groups, [][]byte{
		create("g2-a", 20, "a1", "n20"),
		badB,
		[]byte(`{"v":1,"type":"no_such_command","rid":"g2-unknown","ts":5,"body":{}}`),
		[]byte(`not json at all`),
		futureB,
		c("g2-del", CmdDeleteDatabase, DeleteDatabase{AccountID: "a1", UUID: uuidN(11)}),
		create("g2-b", 21, "a1", "n11"), // the deleted name is free again
		c("g2-del2", CmdDeleteDatabase, DeleteDatabase{AccountID: "a1", UUID: uuidN(99)}), // not found
		c("g2-stats", CmdSetDatabaseStats, SetDatabaseStats{Stats: []DatabaseStat{
			{UUID: uuidN(10), SizeBytes: 4096, Seq: 1}, {UUID: uuidN(20), SizeBytes: 8192, Seq: 1}, {UUID: uuidN(98), SizeBytes: 1, Seq: 1}}}),
	})
	// Group 3: retries of earlier groups' request IDs (a create, a
	// refusal, a delete), one expired by the entry bound in the tests that
	// set a small one, and new work.
	groups = append(groups, [][]byte{
		create("g1-b", 11, "a1", "n11"), // retry of an applied create: its first answer
		create("g1-c", 13, "a1", "n10"), // retry of a refusal: the refusal
		c("g2-del", CmdDeleteDatabase, DeleteDatabase{AccountID: "a1", UUID: uuidN(11)}),
		create("g3-a", 30, "a1", "n30"),
		c("g3-stats", CmdSetDatabaseStats, SetDatabaseStats{Stats: []DatabaseStat{{UUID: uuidN(10), SizeBytes: 1024, Seq: 2}}}),
	})
	// Group 4: one command alone (a batch entry of one).
	groups = append(groups, [][]byte{create("g4-a", 40, "a1", "n40")})
	// Group 5: many creates, more than the small entry bound.
	var g5 [][]byte
	for i := 0; i < 30; i++ {
		g5 = append(g5, create(fmt.Sprintf("g5-%d", i), 50+i, "a1", fmt.Sprintf("n5-%d", i)))
	}
	groups = append(groups, g5)
	// Group 6: retries across the bound (g1's expired where the bound is
	// small, g5's still remembered).
	groups = append(groups, [][]byte{
		create("g1-a", 10, "a1", "n10"),
		create("g5-3", 53, "a1", "n5-3"),
		create("g5-29", 79, "a1", "n5-29"),
	})
	return groups
}

// batchEntryCatalog is a catalog at level 3 with accounts a1 (limit 100)
// and a2 (limit 2) and host h1.
func batchEntryCatalog(t *testing.T, opts ...Option) (*FSM, *logger) {
	t.Helper()
	f := newFSM(t, opts...)
	d := newDriver(t, f)
	d.account("a1", 100)
	d.account("a2", 2)
	d.ok(CmdRegisterHost, RegisterHost{ID: "h1", Address: "10.0.0.1:1", State: HostStateActive})
	d.ok(CmdSetClusterLevel, SetClusterLevel{Level: LevelBatchEntry})
	return f, &logger{t: t, f: f, index: d.index}
}

// withoutIndex is a Result's JSON with its Index zeroed.
func withoutIndex(t testing.TB, r Result) string {
	t.Helper()
	r.Index = 0
	b, err := json.Marshal(r)
	require.NoError(t, err)
	return string(b)
}

// remembered lists the dedupe memory: ID, position, time and the result
// without its index.
func remembered(t testing.TB, f *FSM) []string {
	t.Helper()
	v := f.dd.view()
	defer v.release()
	var out []string
	require.NoError(t, v.each(func(id string, pos uint64, ts int64, result []byte) error {
		if f.dd.get(id) == nil || f.dd.get(id).index != pos {
			return nil // replaced by a later entry of the same ID
		}
		var r Result
		require.NoError(t, json.Unmarshal(result, &r))
		out = append(out, fmt.Sprintf("%s@%d ts=%d %s", id, pos, ts, withoutIndex(t, r)))
		return nil
	}))
	return out
}

// dumpWithoutIndexes is Dump without the meta rows that count entries
// (applied_index, batch_offset): everything else must be equal.
func dumpWithoutIndexes(t testing.TB, f *FSM) string {
	t.Helper()
	var keep []string
	for _, line := range strings.Split(dump(t, f), "\n") {
		if strings.HasPrefix(line, `"applied_index"|`) || strings.HasPrefix(line, `"batch_offset"|`) {
			continue
		}
		keep = append(keep, line)
	}
	return strings.Join(keep, "\n")
}

// TestBatchEntryMatchesEntries: the same commands applied as one batch
// entry per group and as one entry each (a group per transaction, as raft
// batches them) leave the same catalog, the same dedupe memory (IDs,
// positions, times, results) and answer every command the same — refusals,
// envelope errors and duplicate request IDs included — except that every
// Result of a batch entry carries the batch entry's index. With a small
// entry bound the dedupe memory forgets the same commands in both (it
// counts commands, not entries).
func TestBatchEntryMatchesEntries(t *testing.T) {
	for _, bound := range []uint64{DefaultDedupeMaxEntries, 12} {
		t.Run(fmt.Sprintf("dedupe_max_entries=%d", bound), func(t *testing.T) {
			a, la := batchEntryCatalog(t, WithDedupeMaxEntries(bound))
			b, lb := batchEntryCatalog(t, WithDedupeMaxEntries(bound))
			for gi, g := range batchEntryScript(t) {
				outA := la.apply(g...)
				outB := lb.apply(AppendBatchEntry(nil, g))
				require.Len(t, outB, 1)
				rb, ok := outB[0].(BatchResults)
				require.True(t, ok, "group %d: batch entry answered %T %v", gi, outB[0], outB[0])
				require.Len(t, rb, len(g))
				for i := range g {
					ra, ok := outA[i].(Result)
					require.True(t, ok)
					assert.Equal(t, withoutIndex(t, ra), withoutIndex(t, rb[i]), "group %d command %d: %s", gi, i, g[i])
					if ra.Index == la.index-uint64(len(g))+uint64(i)+1 { // answered by itself, not from dedupe
						assert.Equal(t, lb.index, rb[i].Index, "group %d command %d: the batch entry's index", gi, i)
					}
				}
				assert.Equal(t, dumpWithoutIndexes(t, a), dumpWithoutIndexes(t, b), "group %d", gi)
				assert.Equal(t, remembered(t, a), remembered(t, b), "group %d", gi)
				assert.Equal(t, a.dd.len(), b.dd.len(), "group %d", gi)
			}
			assert.Equal(t, uint64(6), b.BatchEntries())
			assert.Zero(t, a.BatchEntries())
			if bound == 12 { // the bound forgot g1-a: applied again, name taken
				assert.LessOrEqual(t, b.dd.len(), 12)
			}
		})
	}
}

// TestBatchEntryMixedWithEntries: batch entries and plain entries in one
// transaction and across a snapshot: a replica restored from a snapshot
// taken between them goes on exactly as the one that applied everything
// (batch_offset travels in the snapshot), and the dump shows the offset.
func TestBatchEntryMixedWithEntries(t *testing.T) {
	a, la := batchEntryCatalog(t)
	b, lb := batchEntryCatalog(t)
	groups := batchEntryScript(t)
	// a: group 0 as a batch entry and group 1 as entries in one transaction.
	la.apply(append([][]byte{AppendBatchEntry(nil, groups[0])}, groups[1]...)...)
	lb.apply(groups[0]...)
	lb.apply(groups[1]...)
	assert.Equal(t, dumpCatalog(t, a), dumpCatalog(t, b))
	assert.Equal(t, remembered(t, a), remembered(t, b))
	assert.Contains(t, dump(t, a), fmt.Sprintf("\"batch_offset\"|\"%d\"", len(groups[0])-1))
	assert.NotContains(t, dump(t, b), "batch_offset", "a log without batch entries writes no offset")

	c := newFSM(t)
	require.NoError(t, restoreBytes(c, snapshotBytes(t, a)))
	assert.Equal(t, dump(t, a), dump(t, c))
	lc := &logger{t: t, f: c, index: la.index}
	for _, g := range groups[2:] {
		ra := la.apply(AppendBatchEntry(nil, g))
		rc := lc.apply(AppendBatchEntry(nil, g))
		assert.Equal(t, ra, rc)
	}
	assert.Equal(t, dump(t, a), dump(t, c))
	assert.Equal(t, remembered(t, a), remembered(t, c))
}

// TestBatchEntryBelowLevel: below catalog level 3 a batch entry is refused
// as a whole (cluster_level_too_low), and leaves the catalog exactly as a
// build without batch entries leaves it — that build cannot parse the
// entry and refuses it as a malformed command, applying nothing. A
// malformed batch entry is refused whole too.
func TestBatchEntryBelowLevel(t *testing.T) {
	setup := func() (*FSM, *logger) {
		f := newFSM(t)
		d := newDriver(t, f)
		d.account("a1", 100)
		d.ok(CmdRegisterHost, RegisterHost{ID: "h1", Address: "10.0.0.1:1", State: HostStateActive})
		return f, &logger{t: t, f: f, index: d.index}
	}
	g := batchEntryScript(t)[0]
	a, la := setup()
	b, lb := setup()
	out := la.apply(AppendBatchEntry(nil, g))
	r, ok := out[0].(Result)
	require.True(t, ok, "%T", out[0])
	require.NotNil(t, r.Err)
	assert.Equal(t, CodeClusterLevelTooLow, r.Err.Code)
	assert.Contains(t, r.Err.Message, "a batch entry needs catalog level 3, the cluster is at level 1")
	// What a build of level 2 does with the same bytes.
	ro := lb.apply([]byte("\x00 bytes a build without batch entries cannot parse"))[0].(Result)
	require.NotNil(t, ro.Err)
	assert.Equal(t, CodeInvalid, ro.Err.Code)
	assert.Equal(t, dump(t, b), dump(t, a))
	assert.Equal(t, uint64(1), a.BatchEntries(), "refused whole, but seen")

	// At level 3, a truncated batch entry or one of no commands.
	c, lc := batchEntryCatalog(t)
	before := dump(t, c)
	whole := AppendBatchEntry(nil, g)
	for _, data := range [][]byte{whole[:len(whole)-3], AppendBatchEntry(nil, nil), append(append([]byte{}, whole...), 'x')} {
		r, ok := lc.apply(data)[0].(Result)
		require.True(t, ok)
		require.NotNil(t, r.Err)
		assert.Equal(t, CodeInvalid, r.Err.Code, r.Err.Message)
	}
	after := dump(t, c)
	assert.Equal(t, strings.Replace(before, fmt.Sprintf(`"applied_index"|"%d"`, lc.index-3), fmt.Sprintf(`"applied_index"|"%d"`, lc.index), 1), after)
}

// TestBatchEntryEncoding: the framing round-trips and keeps each command's
// bytes as they are (the fast decoders see what an entry of its own holds).
func TestBatchEntryEncoding(t *testing.T) {
	cmds := [][]byte{[]byte(`{"a":1}`), []byte(strings.Repeat("x", 300)), []byte(`{}`)}
	e := AppendBatchEntry(nil, cmds)
	assert.True(t, IsBatchEntry(e))
	assert.False(t, IsBatchEntry(cmds[0]))
	assert.Equal(t, 3, BatchEntryCommands(e))
	got, err := splitBatchEntry(e)
	require.NoError(t, err)
	assert.Equal(t, cmds, got)
	assert.Zero(t, BatchEntryCommands([]byte(`{"v":1}`)))
}
