package main

import (
	"bytes"
	"io"
	"path/filepath"
	"testing"

	"github.com/johannesboyne/gofakes3/backend/s3bolt"
	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"
)

// An object read before the file grows is still read right after it: the
// bytes GetObject hands out are the object's own, not bbolt's memory map
// (which a growing file replaces; s3bolt's own GetObject faulted there).
func TestGetObjectSurvivesGrowth(t *testing.T) {
	db, err := bolt.Open(filepath.Join(t.TempDir(), "s3.bolt"), 0o600, nil)
	require.NoError(t, err)
	defer db.Close()
	b := &seekingBackend{Backend: s3bolt.New(db), db: db}
	require.NoError(t, b.CreateBucket("archive"))
	want := bytes.Repeat([]byte("segment "), 4096)
	_, err = b.PutObject("archive", "a", map[string]string{}, bytes.NewReader(want), int64(len(want)), nil)
	require.NoError(t, err)
	o, err := b.GetObject("archive", "a", nil)
	require.NoError(t, err)
	big := bytes.Repeat([]byte{7}, 1<<20)
	for i := range 64 { // grows the file past several remaps
		_, err := b.PutObject("archive", string(rune('b'+i%20))+string(rune('0'+i)), map[string]string{}, bytes.NewReader(big), int64(len(big)), nil)
		require.NoError(t, err)
	}
	got, err := io.ReadAll(o.Contents)
	require.NoError(t, err)
	require.Equal(t, want, got)
}
