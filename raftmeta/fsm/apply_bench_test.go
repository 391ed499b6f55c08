package fsm

import (
	"encoding/json"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/shoaldb/shoal/internal/ids"
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

// BenchmarkApplySetDatabaseStats measures in-process apply cost of
// SetDatabaseStats commands of 5,000 sizes (the storage consumer's batch)
// over 20,000 databases, every size a change (so every stat also logs a
// delta), one command per ApplyBatch as raft delivers such large entries.
// b.N counts sizes.
//
//	go test ./raftmeta/fsm -run XXX -bench ApplySetDatabaseStats -benchtime 200000x
func BenchmarkApplySetDatabaseStats(b *testing.B) {
	const dbs, per = 20_000, 5_000
	f := newFSM(b)
	var index uint64
	mk := func(typ CommandType, body any) *raft.Log {
		index++
		data, _ := json.Marshal(Command{Version: CommandVersion, Type: typ, RequestID: "r" + strconv.FormatUint(index, 10),
			Time: baseTime + int64(index)*100_000, Body: mustJSON(body)})
		return &raft.Log{Index: index, Type: raft.LogCommand, Data: data}
	}
	l := bigLimits()
	f.ApplyBatch([]*raft.Log{mk(CmdCreateAccount, CreateAccount{ID: "x", Name: "x", Tier: TierPaid, Limits: l})})
	var batch []*raft.Log
	for i := 0; i < dbs; i++ {
		batch = append(batch, mk(CmdCreateDatabase, createDB(uuidN(i), "x", "n"+strconv.Itoa(i))))
		if len(batch) == 512 || i == dbs-1 {
			f.ApplyBatch(batch)
			batch = batch[:0]
		}
	}
	var logs []*raft.Log
	seq := int64(0)
	for n := 0; n < b.N; n += per {
		st := make([]DatabaseStat, 0, per)
		for j := 0; j < per; j++ {
			seq++
			st = append(st, DatabaseStat{UUID: uuidN(int(seq) % dbs), SizeBytes: seq * 4096 % (1 << 30), Seq: seq})
		}
		logs = append(logs, mk(CmdSetDatabaseStats, SetDatabaseStats{Stats: st}))
	}
	b.ResetTimer()
	cpu0 := processCPU()
	for i, lg := range logs {
		if r := f.ApplyBatch([]*raft.Log{lg})[0].(Result); r.Err != nil {
			b.Fatal(r.Err)
		}
		if i%10 == 9 { // the leader's drain, every second or so at these rates
			f.ApplyBatch([]*raft.Log{mk(CmdDrainStats, DrainStats{})})
		}
	}
	sizes := float64(len(logs) * per)
	b.ReportMetric(sizes/b.Elapsed().Seconds(), "sizes/s")
	b.ReportMetric(float64((processCPU()-cpu0).Microseconds())/sizes, "cpu-µs/size")
}

// BenchmarkApplyCreateDeployShape applies create_database entries shaped
// like TestDeployBench's raw writes (test/bench): time-ordered (version 7)
// UUIDs and request IDs, as internal/ids mints them, names "raw-N" in one
// account, one host, an audit record on every command, in the batch sizes
// that run's leader reported per FSM transaction (about 7 at 16 clients,
// 25 at 64), over a catalog already holding 50,000 of them.
//
//	go test ./raftmeta/fsm -run XXX -bench ApplyCreateDeployShape -benchtime 20000x
func BenchmarkApplyCreateDeployShape(b *testing.B) {
	for _, n := range []int{1, 7, 25} {
		b.Run("batch="+strconv.Itoa(n), func(b *testing.B) { benchApplyCreateDeploy(b, n, false) })
	}
}

// BenchmarkApplyCreateBatchEntry is BenchmarkApplyCreateDeployShape as the
// deploy bench's raw writes reach the FSM since batch entries (catalog
// level 3): one batch entry of 8 or 32 commands (16 / 64 clients) per FSM
// transaction.
//
//	go test ./raftmeta/fsm -run XXX -bench ApplyCreateBatchEntry -benchtime 20000x
func BenchmarkApplyCreateBatchEntry(b *testing.B) {
	for _, n := range []int{8, 32} {
		b.Run("commands="+strconv.Itoa(n), func(b *testing.B) { benchApplyCreateDeploy(b, n, true) })
	}
}

func benchApplyCreateDeploy(b *testing.B, batch int, entries bool) {
	prefill := 50_000
	if n, err := strconv.Atoi(os.Getenv("SHOAL_BENCH_PREFILL")); err == nil { // e.g. smaller under valgrind
		prefill = n
	}
	f := newFSM(b)
	var index uint64
	audit := &Audit{Actor: "cert:bench-edge", Source: "127.0.0.1:54321"}
	mk := func(typ CommandType, body any) *raft.Log {
		index++
		data, _ := json.Marshal(Command{Version: CommandVersion, Type: typ, RequestID: ids.New(),
			Time: baseTime + int64(index)*100_000, Audit: audit, Body: mustJSON(body)})
		return &raft.Log{Index: index, Type: raft.LogCommand, Data: data}
	}
	create := func(i int) *raft.Log {
		return mk(CmdCreateDatabase, CreateDatabase{UUID: ids.New(), AccountID: "acct-raw", Name: "raw-" + strconv.Itoa(i),
			ObjectID: ids.New(), HostID: "raw", Region: "weur", ReadReplication: ReadReplicationDisabled})
	}
	f.ApplyBatch([]*raft.Log{mk(CmdCreateAccount, CreateAccount{ID: "acct-raw", Name: "raw", Tier: TierPaid, Limits: bigLimits()})})
	if entries {
		if r := f.ApplyBatch([]*raft.Log{mk(CmdSetClusterLevel, SetClusterLevel{Level: LevelBatchEntry})})[0].(Result); r.Err != nil {
			b.Fatal(r.Err)
		}
	}
	var pre []*raft.Log
	for i := 0; i < prefill; i++ {
		pre = append(pre, create(i))
		if len(pre) == 256 || i == prefill-1 {
			f.ApplyBatch(pre)
			pre = pre[:0]
		}
	}
	logs := make([]*raft.Log, 0, b.N)
	for i := 0; i < b.N; i++ {
		logs = append(logs, create(prefill+i))
	}
	if entries { // each group of batch commands becomes one batch entry
		var grouped []*raft.Log
		for len(logs) > 0 {
			n := min(batch, len(logs))
			cmds := make([][]byte, n)
			for j, l := range logs[:n] {
				cmds[j] = l.Data
			}
			index++
			grouped = append(grouped, &raft.Log{Index: index, Type: raft.LogCommand, Data: AppendBatchEntry(nil, cmds)})
			logs = logs[n:]
		}
		logs, batch = grouped, 1
	}
	b.ResetTimer()
	cpu0 := processCPU()
	for len(logs) > 0 {
		n := min(batch, len(logs))
		for _, r := range f.ApplyBatch(logs[:n]) {
			rs, ok := r.(BatchResults)
			if !ok {
				rs = BatchResults{r.(Result)}
			}
			for _, r := range rs {
				if r.Err != nil {
					b.Fatal(r.Err)
				}
			}
		}
		logs = logs[n:]
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "commands/s")
	b.ReportMetric(float64((processCPU()-cpu0).Microseconds())/float64(b.N), "cpu-µs/command")
}
