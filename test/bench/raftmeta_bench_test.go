package bench

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/internal/benchenv"
	"github.com/shoaldb/shoal/internal/ids"
	"github.com/shoaldb/shoal/raftmeta"
	"github.com/shoaldb/shoal/raftmeta/fsm"
	"github.com/shoaldb/shoal/test/harness"
)

// TestRaftmetaBenchProcesses measures catalog creates on the deployment
// shape: three `shoal raftmeta serve` processes (Raft over loopback TCP,
// fsync on), driven from this process by N independent raftmeta.Clients.
// Run with:
//
//	SHOAL_BENCH=1 go test ./test/bench -run TestRaftmetaBenchProcesses -v -count=1
//
// SHOAL_BENCH_LOG_STORE=bolt|wal picks the log store (default: the
// binary's default), SHOAL_BENCH_WORKERS=1,16,64 the client counts,
// SHOAL_BENCH_SECONDS the length of each run.
func TestRaftmetaBenchProcesses(t *testing.T) {
	if os.Getenv("SHOAL_BENCH") == "" {
		t.Skip("set SHOAL_BENCH=1")
	}
	dur, err := benchenv.Duration(5 * time.Second)
	require.NoError(t, err)
	levels, err := benchenv.Workers(1, 16, 64)
	require.NoError(t, err)
	procs, httpAddrs := startRaftmetaProcs(t)
	ctx := context.Background()
	admin, err := raftmeta.NewClient(httpAddrs)
	require.NoError(t, err)
	defer admin.Close()
	createBenchAccount(t, admin)

	var seq atomic.Int64
	for _, n := range levels {
		clients := make([]*raftmeta.Client, n)
		for i := range clients {
			clients[i], err = raftmeta.NewClient(httpAddrs, raftmeta.WithCacheTTL(0))
			require.NoError(t, err)
			defer clients[i].Close()
		}
		cpu0, self0 := procsCPU(t, procs), selfCPU()
		lat, rate := runClients(t, n, dur, func(w int, _ *rand.Rand) error {
			_, err := clients[w].CreateDatabase(ctx, fsm.CreateDatabase{UUID: ids.New(), AccountID: "bench",
				Name: fmt.Sprintf("db-%d", seq.Add(1)), ObjectID: ids.New(), HostID: "h1", Region: "weur",
				ReadReplication: fsm.ReadReplicationDisabled})
			return err
		})
		ops := float64(lat.Len())
		cpu, self := procsCPU(t, procs)-cpu0, selfCPU()-self0
		t.Logf("create-database, 3 processes, %2d clients: %6.0f/s  p50 %6.2f ms  p99 %6.2f ms  (catalog CPU %3.0f µs/create, load generator %3.0f µs/create)",
			n, rate, harness.Millis(lat.Pct(0.50)), harness.Millis(lat.Pct(0.99)), float64(cpu.Microseconds())/ops, float64(self.Microseconds())/ops)
	}
}

// startRaftmetaProcs starts three `shoal raftmeta serve` processes (Raft
// over loopback TCP, fsync on; SHOAL_BENCH_LOG_STORE picks the log store)
// and waits until they serve.
func startRaftmetaProcs(t *testing.T) ([]*exec.Cmd, []string) {
	bin := shoalBin.Path(t)
	dir := t.TempDir()
	var procs []*exec.Cmd
	var httpAddrs []string
	start := func(id string, extra ...string) string {
		httpAddr := harness.FreeAddr(t)
		args := []string{"raftmeta", "serve", "--insecure", "--id", id, "--dir", filepath.Join(dir, id),
			"--raft-addr", harness.FreeAddr(t), "--http-addr", httpAddr}
		if ls := os.Getenv("SHOAL_BENCH_LOG_STORE"); ls != "" {
			args = append(args, "--log-store", ls)
		}
		cmd := exec.Command(bin, append(args, extra...)...)
		log := &bytes.Buffer{}
		cmd.Stdout, cmd.Stderr = log, log
		require.NoError(t, cmd.Start())
		procs = append(procs, cmd)
		httpAddrs = append(httpAddrs, httpAddr)
		t.Cleanup(func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			_ = cmd.Wait()
			if t.Failed() {
				t.Logf("--- %s log:\n%s", id, log.String())
			}
		})
		return httpAddr
	}
	n1 := start("n1", "--bootstrap")
	harness.WaitReady(t, n1)
	harness.WaitReady(t, start("n2", "--join", n1))
	harness.WaitReady(t, start("n3", "--join", n1))

	return procs, httpAddrs
}

// createBenchAccount creates the paid account "bench", with limits no
// benchmark reaches, through cl.
func createBenchAccount(t *testing.T, cl *raftmeta.Client) {
	_, err := cl.CreateAccount(context.Background(), fsm.CreateAccount{ID: "bench", Name: "bench", Tier: fsm.TierPaid,
		Limits: fsm.Limits{MaxDatabases: 1 << 40, MaxStorageBytes: 1 << 40, MaxDatabaseBytes: 1 << 30}})
	require.NoError(t, err)
}

// procsCPU sums user+system CPU of the processes from /proc (clock ticks of
// 10 ms).
func procsCPU(t *testing.T, procs []*exec.Cmd) time.Duration {
	var total time.Duration
	for _, p := range procs {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.Process.Pid))
		require.NoError(t, err)
		// Fields after the command name, which is in parentheses.
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:]))
		ut, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		total += time.Duration(ut+st) * 10 * time.Millisecond
	}
	return total
}

func selfCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
