package history

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func mkdirAll(p string) error { return os.MkdirAll(p, 0o755) }

func TestCaptureAndRestoreLatest(t *testing.T) {
	store, err := NewDirStore(t.TempDir())
	require.NoError(t, err)
	e := newEnv(t, store, CaptureOptions{CheckpointFrames: 8}, ShipperOptions{})
	e.exec("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT, r INTEGER DEFAULT (random()), at TEXT DEFAULT (datetime('now')))")
	for i := 0; i < 200; i++ {
		e.exec("INSERT INTO t(v) VALUES (?)", string(make([]byte, 300)))
	}
	cur := e.cap.Current()
	assert.EqualValues(t, 201, cur.Txid)
	e.close()
	want := dumpFile(t, e.path)

	got := filepath.Join(t.TempDir(), "r.db")
	latest, err := e.archive.Latest(context.Background(), e.key)
	require.NoError(t, err)
	assert.Equal(t, cur, latest)
	_, err = e.archive.Restore(context.Background(), e.key, latest, got)
	require.NoError(t, err)
	assert.Equal(t, want, dumpFile(t, got))
	vs, err := e.archive.Verify(context.Background(), e.key)
	require.NoError(t, err)
	assert.Equal(t, 1, vs.Generations)
	assert.Equal(t, 201, vs.Records)
}
