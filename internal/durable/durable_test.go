package durable

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A write replaces the file whole and leaves no temporary file; a write
// that fails leaves the old content and no temporary file either.
func TestWriteFileReplacesWholeOrNotAtAll(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	require.NoError(t, WriteBytes(path, []byte("one")))
	require.NoError(t, WriteBytes(path, []byte("two")))
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, "two", string(b))

	boom := errors.New("boom")
	err = WriteFile(path, func(f *os.File) error {
		_, _ = f.WriteString("partial")
		return boom
	})
	assert.ErrorIs(t, err, boom)
	b, err = os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, "two", string(b), "a failed write changes nothing")

	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, ents, 1, "no temporary file left: %v", ents)

	assert.Error(t, WriteBytes(filepath.Join(dir, "missing", "f"), nil), "the directory must exist")
	assert.NoError(t, SyncDir(dir))
}
