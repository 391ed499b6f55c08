package fsm

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"testing"

	"github.com/hashicorp/raft"
	"github.com/stretchr/testify/require"
)

// heartbeatCatalog is one catalog of SHOAL_BENCH_HB_DBS databases (default
// 200,000) over 1,000 accounts, built once per test process for the
// heartbeat benchmarks.
var heartbeatCatalog struct {
	once  sync.Once
	f     *FSM
	uuids []string
}

func heartbeatFixture(b testing.TB) (*FSM, []string) {
	heartbeatCatalog.once.Do(func() {
		n := 200_000
		if s := os.Getenv("SHOAL_BENCH_HB_DBS"); s != "" {
			n, _ = strconv.Atoi(s)
		}
		dir, err := os.MkdirTemp("", "hb-bench-")
		require.NoError(b, err)
		f, err := New(dir)
		require.NoError(b, err)
		var index uint64
		mk := func(typ CommandType, body any) *raft.Log {
			index++
			data, _ := json.Marshal(Command{Version: CommandVersion, Type: typ, RequestID: fmt.Sprintf("r-%d", index),
				Time: baseTime + int64(index)*100_000, Body: mustJSON(body)})
			return &raft.Log{Index: index, Type: raft.LogCommand, Data: data}
		}
		var logs []*raft.Log
		for a := range 1000 {
			logs = append(logs, mk(CmdCreateAccount, CreateAccount{ID: fmt.Sprintf("acct-%04d", a), Name: "a", Tier: TierPaid, Limits: bigLimits()}))
		}
		f.ApplyBatch(logs)
		uuids := make([]string, n)
		for i := 0; i < n; i += 1024 {
			logs = logs[:0]
			for j := i; j < min(n, i+1024); j++ {
				uuids[j] = fmt.Sprintf("%08x-0000-7000-8000-%012x", j, j*2654435761%(1<<47))
				logs = append(logs, mk(CmdCreateDatabase, createDB(uuids[j], fmt.Sprintf("acct-%04d", j%1000), "db"+strconv.Itoa(j))))
			}
			for _, r := range f.ApplyBatch(logs) {
				require.Nil(b, r.(Result).Err)
			}
		}
		heartbeatCatalog.f, heartbeatCatalog.uuids = f, uuids
	})
	return heartbeatCatalog.f, heartbeatCatalog.uuids
}

// BenchmarkHeartbeat measures the catalog's cost of a host's heartbeat call
// of 5,000 UUIDs drawn at random from the whole catalog (as a host's due
// databases are): FSM.Heartbeat, and the answer's JSON as the HTTP API
// writes it. b.N counts database-heartbeats.
//
//	SHOAL_BENCH_HB_DBS=1000000 go test ./raftmeta/fsm -run XXX -bench Heartbeat -benchtime 200000x
func BenchmarkHeartbeat(b *testing.B) {
	f, uuids := heartbeatFixture(b)
	for _, v := range []struct {
		name string
		hb   func(context.Context, []string) (HeartbeatAnswer, error)
	}{
		{"joined", func(ctx context.Context, u []string) (HeartbeatAnswer, error) { return heartbeatV1(ctx, f, u) }},
		{"now", f.Heartbeat},
	} {
		b.Run(v.name, func(b *testing.B) { benchHeartbeat(b, uuids, v.hb) })
	}
}

func benchHeartbeat(b *testing.B, uuids []string, hb func(context.Context, []string) (HeartbeatAnswer, error)) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(1, 2))
	const chunk = 5000
	batch := make([]string, chunk)
	b.ResetTimer()
	cpu0 := processCPU()
	for done := 0; done < b.N; done += chunk {
		for i := range batch {
			batch[i] = uuids[rng.IntN(len(uuids))]
		}
		ans, err := hb(ctx, batch)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := json.Marshal(map[string]any{"result": ans}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64((processCPU()-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/db")
}
