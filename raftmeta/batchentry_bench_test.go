package raftmeta

import (
	"bytes"
	"strconv"
	"testing"
	"time"

	"github.com/hashicorp/go-msgpack/v2/codec"
	"github.com/hashicorp/raft"
	wal "github.com/hashicorp/raft-wal"

	"github.com/shoaldb/shoal/internal/ids"
	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// BenchmarkRaftPerEntry measures, in one goroutine, the per-entry Raft work
// a batch of create_database commands costs the three replicas besides
// the FSM and the fsyncs — what one batch entry instead of N entries
// saves: the leader's proposal (marshalCommand, which both modes pay, and
// the entry's framing), the log store's encoding of each entry on every
// replica (raft-wal's BinaryCodec), the AppendEntries request's msgpack
// encoding on the leader for each follower and its decoding on each
// follower (NetworkTransport's codec settings). ns/op and cpu-ns/command
// (the process's user+system CPU, what a loaded machine distorts least)
// are per command.
//
//	go test ./raftmeta -run XXX -bench RaftPerEntry -benchtime 20000x
func BenchmarkRaftPerEntry(b *testing.B) {
	audit := &fsm.Audit{Actor: "cert:bench-edge", Source: "127.0.0.1:54321"}
	for _, n := range []int{8, 32} {
		for _, mode := range []string{"entries", "batch"} {
			b.Run("batch="+strconv.Itoa(n)+"/"+mode, func(b *testing.B) {
				cmds := make([]fsm.Command, n)
				for i := range cmds {
					c, err := fsm.NewCommand(fsm.CmdCreateDatabase, ids.New(), time.Now().UnixNano(), fsm.CreateDatabase{UUID: ids.New(),
						AccountID: "acct-raw", Name: "raw-" + strconv.Itoa(i), ObjectID: ids.New(), HostID: "raw", Region: "weur",
						ReadReplication: fsm.ReadReplicationDisabled})
					if err != nil {
						b.Fatal(err)
					}
					c.Audit = audit
					cmds[i] = c
				}
				var wire, store bytes.Buffer
				mh := func() *codec.MsgpackHandle {
					return &codec.MsgpackHandle{BasicHandle: codec.BasicHandle{TimeNotBuiltin: true}}
				}
				enc := codec.NewEncoder(&wire, mh())
				var bc wal.BinaryCodec
				b.ResetTimer()
				cpu0 := processCPU()
				for it := 0; it < b.N; it += n {
					// Leader: propose.
					datas := make([][]byte, n)
					for i := range cmds {
						d, err := marshalCommand(cmds[i])
						if err != nil {
							b.Fatal(err)
						}
						datas[i] = d
					}
					var logs []*raft.Log
					now := time.Now()
					if mode == "batch" {
						logs = []*raft.Log{{Index: uint64(it) + 1, Term: 1, Type: raft.LogCommand, Data: fsm.AppendBatchEntry(nil, datas), AppendedAt: now}}
					} else {
						logs = make([]*raft.Log, n)
						for i := range datas {
							logs[i] = &raft.Log{Index: uint64(it + i + 1), Term: 1, Type: raft.LogCommand, Data: datas[i], AppendedAt: now}
						}
					}
					req := raft.AppendEntriesRequest{RPCHeader: raft.RPCHeader{ProtocolVersion: 3, ID: []byte("c1"), Addr: []byte("127.0.0.1:1")},
						Term: 1, PrevLogEntry: uint64(it), PrevLogTerm: 1, Entries: logs, LeaderCommitIndex: uint64(it)}
					for replica := 0; replica < 3; replica++ {
						store.Reset()
						for _, l := range logs {
							if err := bc.Encode(l, &store); err != nil {
								b.Fatal(err)
							}
						}
					}
					for follower := 0; follower < 2; follower++ {
						wire.Reset()
						if err := enc.Encode(&req); err != nil {
							b.Fatal(err)
						}
						var got raft.AppendEntriesRequest
						if err := codec.NewDecoder(bytes.NewReader(wire.Bytes()), mh()).Decode(&got); err != nil {
							b.Fatal(err)
						}
						if len(got.Entries) != len(logs) {
							b.Fatal("decoded entries")
						}
					}
				}
				b.ReportMetric(float64((processCPU()-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/command")
			})
		}
	}
}
