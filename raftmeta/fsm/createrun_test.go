package fsm

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCreateRunMatchesOneByOne: a long run of creates — with refusals
// against rows written earlier in the same transaction (a UUID and a name
// used earlier in the run, the account's limit), a retried request ID,
// audit sources, and commands that must see those rows (a delete, an
// update) — applied in one transaction, as one batch entry, and one
// command per transaction leaves the same catalog (rowids and audit ids
// included) and answers every command the same. It guards any change that
// batches a run of creates' writes (branch fsmcost measured one that queued
// them into multi-row inserts of 32, 8 and 1 rows: 45 + 12 creates cover
// every chunk size).
func TestCreateRunMatchesOneByOne(t *testing.T) {
	var script [][]byte
	ts := baseTime + int64(1e12)
	add := func(typ CommandType, rid string, body any) {
		ts += 1_000
		c, err := NewCommand(typ, rid, ts, body)
		require.NoError(t, err)
		c.Audit = &Audit{Actor: "cert:edge", Source: fmt.Sprintf("10.0.0.%d:1", len(script)%3)}
		script = append(script, mustJSON(c))
	}
	for i := range 45 { // 32 + 8 + 5 queued rows
		add(CmdCreateDatabase, fmt.Sprintf("c%d", i), createDB(uuidN(100+i), "a1", fmt.Sprintf("n%d", i)))
	}
	add(CmdCreateDatabase, "dup-uuid", createDB(uuidN(110), "a1", "other"))          // UUID queued above: exists
	add(CmdCreateDatabase, "dup-name", createDB(uuidN(300), "a1", "n7"))             // name queued above: taken
	add(CmdCreateDatabase, "c3", createDB(uuidN(301), "a1", "retry"))                // retried request ID
	add(CmdCreateDatabase, "a2-1", createDB(uuidN(302), "a2", "x"))                  // a2: limit 2
	add(CmdCreateDatabase, "a2-2", createDB(uuidN(303), "a2", "y"))                  //
	add(CmdCreateDatabase, "a2-3", createDB(uuidN(304), "a2", "z"))                  // over the limit
	add(CmdDeleteDatabase, "del", DeleteDatabase{AccountID: "a1", UUID: uuidN(120)}) // sees the queued row
	add(CmdCreateDatabase, "reuse", createDB(uuidN(305), "a1", "n20"))               // its name is free again
	m := ReadReplicationAuto
	add(CmdUpdateDatabase, "upd", UpdateDatabase{AccountID: "a1", UUID: uuidN(140), ReadReplication: &m})
	for i := range 12 { // 8 + 4 after the update
		add(CmdCreateDatabase, fmt.Sprintf("d%d", i), createDB(uuidN(400+i), "a1", fmt.Sprintf("m%d", i)))
	}

	one, l1 := batchEntryCatalog(t)
	var want []string
	for _, c := range script {
		r := l1.apply(c)
		want = append(want, withoutIndex(t, r[0].(Result)))
	}
	// The refusals the script is for (a change of errors.go's codes needs
	// only this list changed).
	for i, code := range map[int]string{45: "exists", 46: "name_taken", 50: "database_limit"} {
		assert.Contains(t, want[i], code, "command %d", i)
	}
	assert.Equal(t, want[3], want[47], "the retried request ID answers the original")

	tx, lt := batchEntryCatalog(t)
	for i, r := range lt.apply(script...) {
		assert.Equal(t, want[i], withoutIndex(t, r.(Result)), "command %d in one transaction", i)
	}
	be, lb := batchEntryCatalog(t)
	out := lb.apply(AppendBatchEntry(nil, script))
	require.Len(t, out, 1)
	rb, ok := out[0].(BatchResults)
	require.True(t, ok, "%v", out[0])
	for i, r := range rb {
		assert.Equal(t, want[i], withoutIndex(t, r), "command %d in one batch entry", i)
	}

	assert.Equal(t, dump(t, one), dump(t, tx))
	assert.Equal(t, dumpWithoutIndexes(t, one), dumpWithoutIndexes(t, be))
	assert.Equal(t, remembered(t, one), remembered(t, be))
	assert.Contains(t, dump(t, one), `|"create_database"|"cert:edge"|"10.0.0.2:1"|"a1"|"00000000-0000-4000-8000-00000000019b"|`, "the last create's audit row")
	a, err := one.Account(t.Context(), "a1")
	require.NoError(t, err)
	assert.Equal(t, int64(45+1+12-1), a.ActiveDatabases)
}
