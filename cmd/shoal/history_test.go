package main

import (
	"bytes"
	"context"
	"io"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"testing"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/internal/config"
)

// cluster.hcl's archive block: an S3 bucket (a real S3-protocol server over
// HTTP, gofakes3) with the secret from a file, a directory, and the refusal
// of an archive inside the data directory.
func TestArchiveHistoryFromConfig(t *testing.T) {
	backend := s3mem.New()
	require.NoError(t, backend.CreateBucket("shoal-archive"))
	srv := httptest.NewServer(gofakes3.New(backend).Server())
	defer srv.Close()
	u, err := url.Parse(srv.URL)
	require.NoError(t, err)
	secret := filepath.Join(t.TempDir(), "secret")
	require.NoError(t, os.WriteFile(secret, []byte("s3cret\n"), 0o600))
	off := false
	h, err := archiveHistory(&config.Archive{Endpoint: u.Host, Bucket: "shoal-archive", Prefix: "prod/", Region: "us-east-1",
		AccessKey: "id", SecretKeyFile: secret, TLS: &off, PathStyle: true, Durability: "archived", MaxLag: "500ms"}, t.TempDir())
	require.NoError(t, err)
	assert.True(t, h.Archived)
	assert.Equal(t, "500ms", h.Shipper.MaxLag.String())
	ctx := context.Background()
	require.NoError(t, h.Store.Put(ctx, "db/x", bytes.NewReader([]byte("hello")), 5))
	obj, err := backend.GetObject("shoal-archive", "prod/db/x", nil)
	require.NoError(t, err, "the object is in the bucket under the prefix")
	b, err := io.ReadAll(obj.Contents)
	require.NoError(t, err)
	assert.Equal(t, "hello", string(b))

	data := t.TempDir()
	h, err = archiveHistory(&config.Archive{Dir: filepath.Join(t.TempDir(), "archive")}, data)
	require.NoError(t, err)
	assert.False(t, h.Archived)
	_, err = archiveHistory(&config.Archive{Dir: filepath.Join(data, "archive")}, data)
	assert.ErrorContains(t, err, "inside the data directory")
}
