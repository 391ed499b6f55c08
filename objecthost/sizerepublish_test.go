package objecthost

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A host killed -9 loses the size events still in memory (its aggregation
// window, the producer's buffer while the broker is away). After the
// restart, a database that is not written again must still have its size
// published: the pass after start records every live database's size once.
// The fresh sink stands for the events the crash lost.
func TestSizesRepublishedAfterRestart(t *testing.T) {
	ctx := context.Background()
	th := newTestHost(t, nil)
	live, gone := newDB("acct"), newDB("acct")
	for _, d := range []db{live, gone} {
		th.mustInit(t, d)
		_, err := th.Query(ctx, d.obj, d.id(), q("CREATE TABLE t (x INTEGER PRIMARY KEY, y)"))
		require.NoError(t, err)
		_, err = th.Query(ctx, d.obj, d.id(), q("INSERT INTO t (y) VALUES (1), (2), (3)"))
		require.NoError(t, err)
	}
	_, err := th.Delete(ctx, gone.obj, 0)
	require.NoError(t, err)
	sent := th.sink.Sizes()
	require.NotEmpty(t, sent)
	lastSeq := sent[len(sent)-1].Seq

	// Restart with the background loops running (not Manual): no query
	// touches the database afterwards.
	require.NoError(t, th.Host.Close())
	th.sink = &MemSink{}
	th.cfg.Usage, th.cfg.Sizes, th.cfg.Routes = th.sink, th.sink, th.sink
	th.cfg.Manual = false
	th.open(t)

	var got []SizeEvent
	require.Eventually(t, func() bool {
		got = th.sink.Sizes()
		return len(got) > 0
	}, time.Minute, 10*time.Millisecond, "no size published after the restart")
	require.Len(t, got, 1, "only the live database's size, once: %+v", got)
	e := got[0]
	assert.Equal(t, live.uuid, e.DatabaseUUID)
	assert.Equal(t, "acct", e.AccountID)
	assert.Equal(t, fileSize(th.path(live.obj)), e.SizeBytes, "the size of the file the host holds")
	assert.Greater(t, e.Seq, lastSeq, "a fresh sequence: consumers keep the highest")
}
