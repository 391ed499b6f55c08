package fsm

import (
	"testing"

	"github.com/hashicorp/raft"
)

// FuzzApply feeds arbitrary log data to one FSM (state accumulates across
// inputs, as in a real log). Apply must never panic, must answer every
// entry with a Result, and the catalog invariants must hold afterwards.
func FuzzApply(f *testing.F) {
	seed := randomLogs(f, 42, 200)
	for _, l := range seed {
		if l.Type == raft.LogCommand {
			f.Add(l.Data)
		}
	}
	f.Add([]byte(`{"v":1,"type":"create_database","rid":"x","ts":1,"body":{"uuid":"00000000-0000-4000-8000-000000000001","account_id":"a0","name":"n","object_id":"o","host_id":"h"}}`))
	f.Add([]byte(`{"v":1,"type":"set_database_stats","rid":"y","ts":2,"body":{"stats":[{"uuid":"00000000-0000-4000-8000-000000000001","size_bytes":9223372036854775807}]}}`))
	f.Add([]byte(`{"v":1,"type":"drain_stats","rid":"z","ts":3,"body":{"max":1}}`))
	f.Add([]byte(`{"v":99999999999999999999}`))

	fsm := newFSM(f, deterministicOpts()...)
	// A base catalog for the inputs to collide with.
	for _, l := range seed {
		if l.Type == raft.LogCommand {
			fsm.Apply(l)
		}
	}
	index := uint64(len(seed))
	f.Fuzz(func(t *testing.T, data []byte) {
		index++
		r, ok := fsm.Apply(&raft.Log{Index: index, Type: raft.LogCommand, Data: data}).(Result)
		if !ok {
			t.Fatalf("Apply returned %T", r)
		}
		if r.Err != nil && r.Err.Code == "" {
			t.Fatalf("refusal without a code: %+v", r.Err)
		}
		if index%16 == 0 {
			checkInvariants(t, fsm)
		}
	})
	checkInvariants(f, fsm)
}
