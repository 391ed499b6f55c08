package main

import (
	"context"
	"encoding/json"
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

// POST /admin/fault makes the store answer 503 SlowDown, or late, and
// mode=none restores it; the S3 client sees the error and then succeeds.
func TestFaultModes(t *testing.T) {
	db, err := bolt.Open(filepath.Join(t.TempDir(), "s3.bolt"), 0o600, nil)
	require.NoError(t, err)
	defer db.Close()
	h, err := handler(db, "archive")
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	defer srv.Close()
	st, err := history.NewS3Store(history.S3Config{Endpoint: strings.TrimPrefix(srv.URL, "http://"), Bucket: "archive", Prefix: "shoal/",
		Region: "us-east-1", AccessKey: "k", SecretKey: "secretsecret", PathStyle: true})
	require.NoError(t, err)
	ctx := context.Background()
	admin := func(q string) int {
		resp, err := srv.Client().Post(srv.URL+"/admin/fault?"+q, "", nil)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	require.Equal(t, 200, admin("mode=503"))
	err = st.Put(ctx, "k", strings.NewReader("v"), 1)
	require.Error(t, err, "a 503 store refuses the put")
	assert.Contains(t, err.Error(), "reduce your request rate")
	require.Equal(t, 400, admin("mode=slow"), "slow needs a delay")
	require.Equal(t, 200, admin("mode=slow&delay=1ms"))
	require.NoError(t, st.Put(ctx, "k", strings.NewReader("v"), 1))
	require.Equal(t, 200, admin("mode=none"))
	rc, err := st.Get(ctx, "k")
	require.NoError(t, err)
	b, _ := io.ReadAll(rc)
	rc.Close()
	assert.Equal(t, "v", string(b))
}

// mode=lose deletes or corrupts n archive objects it acknowledged — never
// the newest segment of a generation, nor anything that is not a segment
// or a snapshot — and names them; a corrupted object keeps its size and
// has one byte changed.
func TestLoseMode(t *testing.T) {
	db, err := bolt.Open(filepath.Join(t.TempDir(), "s3.bolt"), 0o600, nil)
	require.NoError(t, err)
	defer db.Close()
	h, err := handler(db, "archive")
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	defer srv.Close()
	st, err := history.NewS3Store(history.S3Config{Endpoint: strings.TrimPrefix(srv.URL, "http://"), Bucket: "archive", Prefix: "shoal/",
		Region: "us-east-1", AccessKey: "k", SecretKey: "secretsecret", PathStyle: true})
	require.NoError(t, err)
	ctx := context.Background()
	body := map[string]string{}
	for _, k := range []string{
		"db1/0000000000000001/snap/0000000000000000-0000000000000001.snap",
		"db1/0000000000000001/seg/0000000000000001-0000000000000002-0000000000000003.seg",
		"db1/0000000000000001/seg/0000000000000003-0000000000000004-0000000000000005.seg", // newest of its generation
		"db2/0000000000000009/snap/0000000000000000-0000000000000009.snap",
		"db2/0000000000000009/seg/0000000000000001-0000000000000001-000000000000000a.seg", // newest of its generation
		"other/file",
	} {
		body[k] = "contents of " + k
		require.NoError(t, st.Put(ctx, k, strings.NewReader(body[k]), int64(len(body[k]))))
	}
	lose := func(q string) []Lost {
		resp, err := srv.Client().Post(srv.URL+"/admin/fault?mode=lose&"+q, "", nil)
		require.NoError(t, err)
		defer resp.Body.Close()
		require.Equal(t, 200, resp.StatusCode)
		var out []Lost
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
		return out
	}
	hit := lose("n=10&how=corrupt&seed=1")
	require.Len(t, hit, 3, "only the eligible objects")
	for _, l := range hit {
		assert.Equal(t, "corrupt", l.How)
		assert.NotContains(t, l.Key, "0000000000000003-0000000000000004")
		assert.NotContains(t, l.Key, "0000000000000001-0000000000000001-")
		rc, err := st.Get(ctx, strings.TrimPrefix(l.Key, "shoal/"))
		require.NoError(t, err)
		b, _ := io.ReadAll(rc)
		rc.Close()
		want := body[strings.TrimPrefix(l.Key, "shoal/")]
		require.Len(t, b, len(want))
		diff := 0
		for i := range b {
			if b[i] != want[i] {
				diff++
			}
		}
		assert.Equal(t, 1, diff, "one byte changed")
	}
	hit = lose("n=1&how=delete&seed=2")
	require.Len(t, hit, 1)
	_, err = st.Get(ctx, strings.TrimPrefix(hit[0].Key, "shoal/"))
	assert.ErrorIs(t, err, history.ErrNotFound)
	resp, err := srv.Client().Post(srv.URL+"/admin/fault?mode=lose&n=1&how=burn&seed=1", "", nil)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, 400, resp.StatusCode)
}
