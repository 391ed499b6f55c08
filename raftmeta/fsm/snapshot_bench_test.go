package fsm

import (
	"encoding/json"
	"io"
	"os"
	"strconv"
	"testing"

	"github.com/hashicorp/raft"

	"github.com/shoaldb/shoal/internal/ids"
)

// discardSink is a raft.SnapshotSink that keeps nothing: what Persist costs
// without the snapshot store's own writes.
type discardSink struct{ n int64 }

func (s *discardSink) Write(p []byte) (int, error) { s.n += int64(len(p)); return len(p), nil }
func (s *discardSink) Close() error                { return nil }
func (s *discardSink) ID() string                  { return "discard" }
func (s *discardSink) Cancel() error               { return nil }

// BenchmarkSnapshotPersist measures Snapshot + Persist (the default backup
// mode) of a catalog shaped like the deploy bench's after a few rounds:
// SHOAL_BENCH_PREFILL create_database commands (default 100,000) in one
// account, applied as batch entries of 32, so the request-ID memory is full
// (DefaultDedupeMaxEntries, 200,000, when the prefill exceeds it). Every
// Raft snapshot pays this on every voter, once per SnapshotThreshold (8,192)
// log entries. One op is one snapshot.
//
//	go test ./raftmeta/fsm -run XXX -bench SnapshotPersist -benchtime 5x
func BenchmarkSnapshotPersist(b *testing.B) {
	prefill := 100_000
	if n, err := strconv.Atoi(os.Getenv("SHOAL_BENCH_PREFILL")); err == nil {
		prefill = n
	}
	f := newFSM(b)
	var index uint64
	audit := &Audit{Actor: "cert:bench-edge", Source: "127.0.0.1:54321"}
	enc := func(typ CommandType, body any) []byte {
		data, _ := json.Marshal(Command{Version: CommandVersion, Type: typ, RequestID: ids.New(),
			Time: baseTime + int64(index)*100_000, Audit: audit, Body: mustJSON(body)})
		return data
	}
	one := func(data []byte) {
		index++
		switch r := f.ApplyBatch([]*raft.Log{{Index: index, Type: raft.LogCommand, Data: data}})[0].(type) {
		case Result:
			if r.Err != nil {
				b.Fatal(r.Err)
			}
		case BatchResults:
			for _, x := range r {
				if x.Err != nil {
					b.Fatal(x.Err)
				}
			}
		}
	}
	one(enc(CmdCreateAccount, CreateAccount{ID: "acct-raw", Name: "raw", Tier: TierPaid, Limits: bigLimits()}))
	one(enc(CmdSetClusterLevel, SetClusterLevel{Level: LevelBatchEntry}))
	var cmds [][]byte
	for i := 0; i < prefill; i++ {
		cmds = append(cmds, enc(CmdCreateDatabase, CreateDatabase{UUID: ids.New(), AccountID: "acct-raw", Name: "raw-" + strconv.Itoa(i),
			ObjectID: ids.New(), HostID: "raw", Region: "weur", ReadReplication: ReadReplicationDisabled}))
		if len(cmds) == 32 || i == prefill-1 {
			one(AppendBatchEntry(nil, cmds))
			cmds = cmds[:0]
		}
	}
	b.ResetTimer()
	cpu0 := processCPU()
	var size int64
	for range b.N {
		snap, err := f.Snapshot()
		if err != nil {
			b.Fatal(err)
		}
		sink := &discardSink{}
		err = snap.Persist(sink)
		snap.Release()
		if err != nil {
			b.Fatal(err)
		}
		size = sink.n
	}
	b.ReportMetric(float64((processCPU()-cpu0).Milliseconds())/float64(b.N), "cpu-ms/snapshot")
	b.ReportMetric(float64(size)/1e6, "MB")
}

var _ raft.SnapshotSink = (*discardSink)(nil)
var _ io.Writer = (*discardSink)(nil)
