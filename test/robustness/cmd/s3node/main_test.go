package main

import (
	"context"
	"fmt"
	"io"
	"net/http/httptest"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"

	"github.com/shoaldb/shoal/objecthost/history"
)

// The seeking listing returns exactly the keys under a prefix, in order,
// across pages (more keys than one page of 1,000), as s3bolt's own does;
// and objects survive reopening the file (what a kill -9 and restart of
// the node relies on).
func TestSeekingListAndPersistence(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s3.bolt")
	open := func() (*history.S3Store, func()) {
		db, err := bolt.Open(path, 0o600, nil)
		require.NoError(t, err)
		h, err := handler(db, "archive")
		require.NoError(t, err)
		srv := httptest.NewServer(h)
		st, err := history.NewS3Store(history.S3Config{Endpoint: strings.TrimPrefix(srv.URL, "http://"), Bucket: "archive", Prefix: "shoal/",
			Region: "us-east-1", AccessKey: "k", SecretKey: "secretsecret", PathStyle: true})
		require.NoError(t, err)
		return st, func() { srv.Close(); db.Close() }
	}
	st, closeStore := open()
	ctx := context.Background()
	put := func(key string) {
		require.NoError(t, st.Put(ctx, key, strings.NewReader("v:"+key), int64(len("v:"+key))))
	}
	var want []string
	for i := range 1100 {
		k := fmt.Sprintf("a/%05d", i)
		put(k)
		want = append(want, k)
	}
	for _, k := range []string{"ab/1", "b/1", "a", "0/x"} {
		put(k)
	}
	sort.Strings(want)
	got, err := st.List(ctx, "a/")
	require.NoError(t, err)
	assert.Equal(t, want, got)
	got, err = st.List(ctx, "b/")
	require.NoError(t, err)
	assert.Equal(t, []string{"b/1"}, got)
	got, err = st.List(ctx, "zz/")
	require.NoError(t, err)
	assert.Empty(t, got)
	closeStore()

	st, closeStore = open()
	defer closeStore()
	r, err := st.Get(ctx, "a/01099")
	require.NoError(t, err)
	b, err := io.ReadAll(r)
	r.Close()
	require.NoError(t, err)
	assert.Equal(t, "v:a/01099", string(b))
	got, err = st.List(ctx, "a/")
	require.NoError(t, err)
	assert.Len(t, got, 1100)
}
