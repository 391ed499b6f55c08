package fsm

import (
	"encoding/json"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// BenchmarkApplyBatchCreateDatabase measures in-process apply throughput of
// CreateDatabase commands in batches of 64 (raft's default MaxAppendEntries).
//
//	go test ./raftmeta/fsm -run XXX -bench ApplyBatchCreate -benchtime 50000x
func BenchmarkApplyBatchCreateDatabase(b *testing.B) {
	benchApplyCreate(b, 64)
}

// BenchmarkApplyBatchCreateDatabaseSizes measures the same in the batch sizes
// the 3-voter cluster produces (about 5 entries at 16 clients, 20 at 64):
// the per-transaction costs (BEGIN, the dedupe prune, meta, COMMIT with its
// WAL writes) are shared by fewer commands there.
//
//	go test ./raftmeta/fsm -run XXX -bench ApplyBatchCreateDatabaseSizes -benchtime 20000x
func BenchmarkApplyBatchCreateDatabaseSizes(b *testing.B) {
	for _, n := range []int{1, 5, 20} {
		b.Run("batch="+strconv.Itoa(n), func(b *testing.B) { benchApplyCreate(b, n) })
	}
}

func benchApplyCreate(b *testing.B, batch int) {
	f := newFSM(b)
	var index uint64
	mk := func(typ CommandType, body any) *raft.Log {
		index++
		data, _ := json.Marshal(Command{Version: CommandVersion, Type: typ, RequestID: uuidN(int(index * 0x9E3779B1 % (1 << 47))), // random order, like real UUIDs
			Time: baseTime + int64(index)*100_000, Body: mustJSON(body)})
		return &raft.Log{Index: index, Type: raft.LogCommand, Data: data}
	}
	f.ApplyBatch([]*raft.Log{mk(CmdCreateAccount, CreateAccount{ID: "x", Name: "x", Tier: TierPaid, Limits: bigLimits()})})
	logs := make([]*raft.Log, 0, b.N)
	for i := 0; i < b.N; i++ {
		logs = append(logs, mk(CmdCreateDatabase, createDB(uuidN(i*2654435761%(1<<47)), "x", "n"+strconv.Itoa(i))))
	}
	b.ResetTimer()
	cpu0 := processCPU()
	for len(logs) > 0 {
		n := min(batch, len(logs))
		for _, r := range f.ApplyBatch(logs[:n]) {
			if r.(Result).Err != nil {
				b.Fatal(r.(Result).Err)
			}
		}
		logs = logs[n:]
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "commands/s")
	// CPU per command is less sensitive than the rate to other processes
	// sharing the cores.
	b.ReportMetric(float64((processCPU()-cpu0).Microseconds())/float64(b.N), "cpu-µs/command")
}

// processCPU is this process's user+system CPU time so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
