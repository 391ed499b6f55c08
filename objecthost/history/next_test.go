package history

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestArchiveNext: Next finds the commit right after a position (in a
// sealed segment, with its commit time, so its bookmark is the one the
// writer's capturer gave), and says ErrNotFound past the archived tip.
func TestArchiveNext(t *testing.T) {
	store, err := NewDirStore(t.TempDir())
	require.NoError(t, err)
	e := newEnv(t, store, CaptureOptions{}, ShipperOptions{})
	e.exec("CREATE TABLE t(v)")
	var pos []Position
	for i := 0; i < 5; i++ {
		e.exec("INSERT INTO t VALUES (?)", i)
		p, err := e.cap.Exact()
		require.NoError(t, err)
		pos = append(pos, p)
	}
	e.sync()
	ctx := context.Background()
	for i := 0; i+1 < len(pos); i++ {
		n, err := e.archive.Next(ctx, e.key, pos[i])
		require.NoError(t, err)
		assert.Equal(t, pos[i+1], n)
		assert.Equal(t, MakeBookmark(e.key, pos[i+1]), MakeBookmark(e.key, n))
	}
	_, err = e.archive.Next(ctx, e.key, pos[len(pos)-1])
	assert.ErrorIs(t, err, ErrNotFound)
	_, err = e.archive.Next(ctx, e.key, Position{Gen: "00000000000000ff", Txid: 1})
	assert.ErrorIs(t, err, ErrNotFound, "another generation")
}
