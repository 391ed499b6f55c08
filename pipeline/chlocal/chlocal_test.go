package chlocal

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// requireBinary skips when clickhouse-server is not installed, unless
// SHOAL_REQUIRE_CLICKHOUSE=1 (CI installs it, so there a skip would hide
// a broken install).
func requireBinary(t *testing.T) {
	t.Helper()
	if _, err := findBinary(""); err != nil {
		if os.Getenv("SHOAL_REQUIRE_CLICKHOUSE") == "1" {
			t.Fatalf("clickhouse-server required: %v", err)
		}
		t.Skipf("clickhouse-server not installed (scripts/deps.sh installs it): %v", err)
	}
}

func alive(pid int) bool { return syscall.Kill(pid, 0) == nil }

func TestStartQueryRestartClose(t *testing.T) {
	requireBinary(t)
	ctx := context.Background()
	dir := t.TempDir()

	s, err := Start(ctx, Config{DataDir: dir})
	require.NoError(t, err)
	pid := s.Pid()
	require.True(t, alive(pid))
	assert.True(t, strings.HasPrefix(s.Addr(), "127.0.0.1:"))

	conn, err := clickhouse.Open(s.Options())
	require.NoError(t, err)
	require.NoError(t, conn.Exec(ctx, "CREATE TABLE default.t (n UInt64) ENGINE = MergeTree ORDER BY n"))
	b, err := conn.PrepareBatch(ctx, "INSERT INTO default.t (n)")
	require.NoError(t, err)
	for i := uint64(1); i <= 100; i++ {
		require.NoError(t, b.Append(i))
	}
	require.NoError(t, b.Send())
	var tz string
	require.NoError(t, conn.QueryRow(ctx, "SELECT timezone()").Scan(&tz))
	assert.Contains(t, tz, "UTC")
	require.NoError(t, conn.Close())

	require.NoError(t, s.Close())
	require.NoError(t, s.Close(), "Close is idempotent")
	select {
	case <-s.Exited():
	default:
		t.Fatal("Exited not closed after Close")
	}
	assert.False(t, alive(pid), "server process %d still alive after Close", pid)

	// Same data dir, same ports: the table and its rows survive.
	s2, err := Start(ctx, Config{DataDir: dir, TCPPort: s.TCPPort(), HTTPPort: s.HTTPPort()})
	require.NoError(t, err)
	defer s2.Close()
	assert.Equal(t, s.Addr(), s2.Addr())
	conn, err = clickhouse.Open(s2.Options())
	require.NoError(t, err)
	defer conn.Close()
	var n, sum uint64
	require.NoError(t, conn.QueryRow(ctx, "SELECT count(), sum(n) FROM default.t").Scan(&n, &sum))
	assert.Equal(t, uint64(100), n)
	assert.Equal(t, uint64(5050), sum)
}

func TestNotInstalled(t *testing.T) {
	_, err := Start(context.Background(), Config{DataDir: t.TempDir(), Binary: "no-such-clickhouse-server-binary"})
	require.Error(t, err)
	assert.True(t, errors.Is(err, ErrNotInstalled), "%v", err)
	assert.NotContains(t, err.Error(), "\n", "one line for shoal dev")
}

func TestPortTakenExplicit(t *testing.T) {
	requireBinary(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	// The start timeout is an hour: only noticing the server's exit can end
	// Start (a regression hangs here until go test's -timeout). No clock is
	// read: a real process, so synctest cannot run this.
	_, err = Start(context.Background(), Config{DataDir: t.TempDir(), TCPPort: port, HTTPPort: port + 1, StartTimeout: time.Hour})
	require.Error(t, err)
	assert.True(t, errors.Is(err, ErrExited), "exit noticed before the start timeout: %v", err)
	assert.Contains(t, err.Error(), "Address already in use")
	assert.NotContains(t, err.Error(), "\n", "one line for shoal dev")
}

func TestSecondServerOnSameDirRefused(t *testing.T) {
	requireBinary(t)
	dir := t.TempDir()
	s, err := Start(context.Background(), Config{DataDir: dir})
	require.NoError(t, err)
	defer s.Close()
	_, err = Start(context.Background(), Config{DataDir: dir, StartTimeout: 20 * time.Second})
	require.Error(t, err, "two servers must never share a data dir")
	assert.True(t, errors.Is(err, ErrDataDirInUse), "%v", err)
	// The live server's config was not rewritten and it still answers.
	conn, err := clickhouse.Open(s.Options())
	require.NoError(t, err)
	defer conn.Close()
	require.NoError(t, conn.Ping(context.Background()))
}

func TestKill(t *testing.T) {
	requireBinary(t)
	s, err := Start(context.Background(), Config{DataDir: t.TempDir()})
	require.NoError(t, err)
	pid := s.Pid()
	require.NoError(t, s.Kill())
	assert.False(t, alive(pid))
	require.NoError(t, s.Close())
}

// TestParentDeathKillsServer runs a helper process that starts a server,
// prints its pid and is then SIGKILLed: Pdeathsig must take the server
// down with it.
func TestParentDeathKillsServer(t *testing.T) {
	requireBinary(t)
	if os.Getenv("CHLOCAL_HELPER_DIR") != "" {
		t.Skip("helper")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.v")
	cmd.Env = append(os.Environ(), "CHLOCAL_HELPER_DIR="+t.TempDir())
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()

	pid := 0
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "SERVER_PID="); ok {
			pid, err = strconv.Atoi(v)
			require.NoError(t, err)
			break
		}
	}
	require.NotZero(t, pid, "helper did not report a server pid")
	require.True(t, alive(pid))
	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait()
	assert.Eventually(t, func() bool { return !alive(pid) }, 10*time.Second, 50*time.Millisecond,
		"server %d outlived its parent", pid)
}

func TestHelperProcess(t *testing.T) {
	dir := os.Getenv("CHLOCAL_HELPER_DIR")
	if dir == "" {
		t.Skip("only runs as TestParentDeathKillsServer's helper")
	}
	s, err := Start(context.Background(), Config{DataDir: dir})
	if err != nil {
		fmt.Println("START_ERROR=" + err.Error())
		os.Exit(1)
	}
	fmt.Printf("SERVER_PID=%d\n", s.Pid())
	time.Sleep(time.Minute) // killed by the parent test
	_ = s.Close()
}
