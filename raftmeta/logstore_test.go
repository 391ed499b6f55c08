package raftmeta

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/raftmeta/fsm"
)

func TestChooseLogStore(t *testing.T) {
	empty := t.TempDir()
	withBolt := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(withBolt, boltFile), nil, 0o644))
	withWAL := t.TempDir()
	require.NoError(t, os.Mkdir(filepath.Join(withWAL, walDir), 0o755))
	both := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(both, boltFile), nil, 0o644))
	require.NoError(t, os.Mkdir(filepath.Join(both, walDir), 0o755))

	for _, c := range []struct {
		dir, want, got string
		mismatch       bool
	}{
		{empty, "", LogStoreWAL, false},
		{empty, LogStoreBolt, LogStoreBolt, false},
		{empty, LogStoreWAL, LogStoreWAL, false},
		{withBolt, "", LogStoreBolt, false}, // an existing store wins over the default
		{withBolt, LogStoreBolt, LogStoreBolt, false},
		{withBolt, LogStoreWAL, "", true},
		{withWAL, "", LogStoreWAL, false},
		{withWAL, LogStoreBolt, "", true},
		{both, "", "", true},
	} {
		got, err := chooseLogStore(c.dir, c.want)
		if c.mismatch {
			require.ErrorIs(t, err, ErrLogStoreMismatch, "dir %s want %q", c.dir, c.want)
			continue
		}
		require.NoError(t, err)
		require.Equal(t, c.got, got, "want %q", c.want)
	}
	_, err := chooseLogStore(empty, "leveldb")
	require.Error(t, err)
}

// A node reopened in the same process on its WAL directory finds its log
// (raft-wal's own Close leaves its meta database locked; walStore closes it).
func TestNodeReopensWALLogInPlace(t *testing.T) {
	for _, kind := range []string{LogStoreWAL, LogStoreBolt} {
		t.Run(kind, func(t *testing.T) {
			tc := newTestCluster(t, 1, func(_ int, c *Config) { c.LogStore = kind })
			leader := tc.waitLeader()
			ctx := context.Background()
			_, err := leader.Apply(ctx, cmd(t, fsm.CmdCreateAccount, newAccount("acct", 10)))
			require.NoError(t, err)
			d := newDB("acct")
			res, err := leader.Apply(ctx, cmd(t, fsm.CmdCreateDatabase, d))
			require.NoError(t, err)

			n := tc.restart(0)
			require.Eventually(t, func() bool { return n.AppliedIndex() >= res.Index }, 10*time.Second, 10*time.Millisecond)
			got, err := n.FSM().Database(ctx, d.UUID)
			require.NoError(t, err)
			require.Equal(t, d.Name, got.Name)
			_, err = os.Stat(filepath.Join(tc.dirs[0], map[string]string{LogStoreWAL: walDir, LogStoreBolt: boltFile}[kind]))
			require.NoError(t, err)
		})
	}
}
