package raftmeta

import (
	"context"
	"io"
	"log/slog"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// Close returns when the node's goroutines are gone: after closing a whole
// cluster that served forwarded writes and reads, none of ours, raft's or
// the HTTP server's remain.
func TestCloseLeavesNoGoroutines(t *testing.T) {
	tc := newTestCluster(t, 3, nil)
	ctx := context.Background()
	f := tc.follower()
	_, err := f.Apply(ctx, cmd(t, fsm.CmdCreateAccount, newAccount("acct", 5)))
	require.NoError(t, err)
	_, err = f.ReadBarrier(ctx, LinearizableRead())
	require.NoError(t, err)
	cl, err := NewClient(tc.addrs())
	require.NoError(t, err)
	_, err = cl.Account(ctx, "acct", StaleRead())
	require.NoError(t, err)
	cl.Close()
	for _, n := range tc.nodes {
		require.NoError(t, n.Close())
	}
	var leaked string
	ok := assertEventually(func() bool {
		buf := make([]byte, 1<<20)
		stacks := string(buf[:runtime.Stack(buf, true)])
		leaked = ""
		for _, g := range strings.Split(stacks, "\n\n") {
			if strings.Contains(g, "hashicorp/raft") || strings.Contains(g, "shoal/raftmeta.(*") ||
				strings.Contains(g, "net/http.(*conn).serve") || strings.Contains(g, "net/http.(*persistConn)") {
				leaked += g + "\n\n"
			}
		}
		return leaked == ""
	}, 5*time.Second)
	require.True(t, ok, "goroutines left after Close:\n%s", leaked)
}

func assertEventually(cond func() bool, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if cond() {
			return true
		}
		time.Sleep(20 * time.Millisecond) // poll interval of a wait for the condition above (the event itself)
	}
	return cond()
}

// A node that cannot start (its HTTP address is taken) returns a clear error
// and releases what it had opened: the same directory opens right after.
// (The cleanup used to dereference the already-nil result and panic.)
func TestNewNodeFailureCleansUp(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer busy.Close()
	dir := t.TempDir()
	cfg := Config{ID: "n1", Dir: dir, RaftAddr: "127.0.0.1:0", HTTPAddr: busy.Addr().String(), Bootstrap: true,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), RaftLogOutput: io.Discard}
	_, err = NewNode(cfg)
	require.ErrorContains(t, err, "listen http")

	cfg.HTTPAddr = "127.0.0.1:0"
	n, err := NewNode(cfg)
	require.NoError(t, err, "the log store and catalog were released")
	require.NoError(t, n.Close())
}
