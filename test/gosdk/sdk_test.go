//go:build gosdk

// Package gosdk runs Cloudflare's official Go SDK,
// github.com/cloudflare/cloudflare-go/v4 v4.6.0 (unmodified; only its base
// URL points at Shoal), against a real `shoal dev`, calling every D1 call
// the SDK has and asserting the typed results.
//
// It is its own module (test/gosdk/go.mod) so that the SDK, whose root
// package imports every Cloudflare service, stays out of Shoal's go.mod,
// and behind the build tag gosdk because its first build takes minutes:
// `make compat` runs it, `make test` does not. The shoal binary under test
// is built from the repository root with the caller's environment
// (build.env, as the Makefile exports it), or taken from $SHOAL_TEST_BIN.
package gosdk

import (
	"bytes"
	"context"
	"crypto/md5"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cloudflare/cloudflare-go/v4"
	"github.com/cloudflare/cloudflare-go/v4/d1"
	"github.com/cloudflare/cloudflare-go/v4/option"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var binPath string

func TestMain(m *testing.M) {
	code, err := run(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(code)
}

// run builds the shoal binary (unless $SHOAL_TEST_BIN names one) and runs
// the tests.
func run(m *testing.M) (int, error) {
	if p := os.Getenv("SHOAL_TEST_BIN"); p != "" {
		binPath = p
		return m.Run(), nil
	}
	dir, err := os.MkdirTemp("", "shoal-gosdk-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	binPath = filepath.Join(dir, "shoal")
	cmd := exec.Command("go", "build", "-o", binPath, "./cmd/shoal")
	cmd.Dir = filepath.Join("..", "..")
	cmd.Env = os.Environ()
	if out, err := cmd.CombinedOutput(); err != nil {
		return 0, fmt.Errorf("go build ./cmd/shoal (run it through `make compat`, which exports build.env): %v\n%s", err, out)
	}
	return m.Run(), nil
}

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// devPortBase finds a base port below Linux's ephemeral range with the
// ports `shoal dev` binds (base+0, +100, +200, +300, +310, +311) free when
// probed (test/harness.DevBasePort, which this module cannot import
// without building all of Shoal's dependencies under its own flags).
func devPortBase(t *testing.T) int {
	for range 200 {
		p := 20000 + rand.IntN(12000-400)
		ok := true
		for _, off := range []int{0, 100, 200, 300, 310, 311} {
			ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p+off))
			if err != nil {
				ok = false
				break
			}
			ln.Close()
		}
		if ok {
			return p
		}
	}
	t.Fatal("no free port range for shoal dev")
	return 0
}

func freeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().String()
}

// dev is a running `shoal dev` and its saved account and token.
type dev struct {
	url, account, token string
}

func startDev(t *testing.T) dev {
	dir := t.TempDir()
	addr := freeAddr(t)
	var out, errb syncBuf
	cmd := exec.Command(binPath, "dev", "--dir", dir, "--addr", addr, "--base-port", fmt.Sprint(devPortBase(t)))
	cmd.Stdout, cmd.Stderr = &out, &errb
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
		}
	})
	require.Eventually(t, func() bool { return strings.Contains(out.String(), "Press Ctrl-C") },
		90*time.Second, 100*time.Millisecond, "shoal dev never became ready:\n%s\n%s", &out, &errb)
	b, err := os.ReadFile(filepath.Join(dir, "dev.json"))
	require.NoError(t, err)
	var st struct {
		AccountID string `json:"account_id"`
		Token     string `json:"token"`
	}
	require.NoError(t, json.Unmarshal(b, &st))
	return dev{url: "http://" + addr, account: st.AccountID, token: st.Token}
}

// TestGoSDK calls every D1 call of cloudflare-go/v4 v4.6.0 against `shoal
// dev`: create, list, get, update (PUT), edit (PATCH), query, raw, export,
// import, delete, and time travel (bookmark, restore). v4.6.0 has no typed
// time-travel calls: those go through the client's generic Get/Post, which
// still exercises the SDK's base URL, auth and envelope errors.
func TestGoSDK(t *testing.T) {
	d := startDev(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	client := cloudflare.NewClient(option.WithAPIToken(d.token), option.WithBaseURL(d.url+"/client/v4/"), option.WithMaxRetries(0))
	acct := cloudflare.F(d.account)
	dbs := client.D1.Database

	// create
	db, err := dbs.New(ctx, d1.DatabaseNewParams{AccountID: acct, Name: cloudflare.F("sdk-go"),
		PrimaryLocationHint: cloudflare.F(d1.DatabaseNewParamsPrimaryLocationHintWeur)})
	require.NoError(t, err)
	require.Len(t, db.UUID, 36)
	assert.Equal(t, "sdk-go", db.Name)
	assert.Equal(t, "production", db.Version)
	assert.WithinDuration(t, time.Now(), db.CreatedAt, time.Hour)
	assert.Equal(t, d1.D1ReadReplicationModeDisabled, db.ReadReplication.Mode)

	// list: the auto-pager walks V4PagePaginationArray pages
	pager := dbs.ListAutoPaging(ctx, d1.DatabaseListParams{AccountID: acct, PerPage: cloudflare.F(1.0)})
	var listed []d1.DatabaseListResponse
	for pager.Next() {
		listed = append(listed, pager.Current())
	}
	require.NoError(t, pager.Err())
	require.Len(t, listed, 1)
	assert.Equal(t, db.UUID, listed[0].UUID)
	assert.Equal(t, "sdk-go", listed[0].Name)
	assert.Equal(t, db.CreatedAt.UTC(), listed[0].CreatedAt.UTC())

	// get
	got, err := dbs.Get(ctx, db.UUID, d1.DatabaseGetParams{AccountID: acct})
	require.NoError(t, err)
	assert.Equal(t, db.UUID, got.UUID)
	assert.Equal(t, "sdk-go", got.Name)
	assert.Equal(t, 0.0, got.NumTables)
	assert.Equal(t, d1.D1ReadReplicationModeDisabled, got.ReadReplication.Mode)

	// update (PUT) and edit (PATCH) the read replication mode
	upd, err := dbs.Update(ctx, db.UUID, d1.DatabaseUpdateParams{AccountID: acct,
		ReadReplication: cloudflare.F(d1.DatabaseUpdateParamsReadReplication{Mode: cloudflare.F(d1.DatabaseUpdateParamsReadReplicationModeAuto)})})
	require.NoError(t, err)
	assert.Equal(t, d1.D1ReadReplicationModeAuto, upd.ReadReplication.Mode)
	ed, err := dbs.Edit(ctx, db.UUID, d1.DatabaseEditParams{AccountID: acct,
		ReadReplication: cloudflare.F(d1.DatabaseEditParamsReadReplication{Mode: cloudflare.F(d1.DatabaseEditParamsReadReplicationModeDisabled)})})
	require.NoError(t, err)
	assert.Equal(t, d1.D1ReadReplicationModeDisabled, ed.ReadReplication.Mode)
	assert.Equal(t, "sdk-go", ed.Name)

	// query: one typed result per statement
	q, err := dbs.Query(ctx, db.UUID, d1.DatabaseQueryParams{AccountID: acct,
		Sql: cloudflare.F("CREATE TABLE items(id INTEGER PRIMARY KEY, name TEXT, price REAL); SELECT count(*) AS n FROM items")})
	require.NoError(t, err)
	require.Len(t, q.Result, 2)
	for _, r := range q.Result {
		assert.True(t, r.Success)
	}
	ins, err := dbs.Query(ctx, db.UUID, d1.DatabaseQueryParams{AccountID: acct,
		Sql: cloudflare.F("INSERT INTO items(name, price) VALUES (?, ?), (?, ?)"), Params: cloudflare.F([]string{"apple", "1.5", "pear", "2"})})
	require.NoError(t, err)
	require.Len(t, ins.Result, 1)
	assert.Equal(t, 2.0, ins.Result[0].Meta.Changes)
	assert.True(t, ins.Result[0].Meta.ChangedDB)
	assert.Equal(t, 2.0, ins.Result[0].Meta.LastRowID)
	assert.GreaterOrEqual(t, ins.Result[0].Meta.RowsWritten, 2.0)
	sel, err := dbs.Query(ctx, db.UUID, d1.DatabaseQueryParams{AccountID: acct, Sql: cloudflare.F("SELECT id, name, price FROM items ORDER BY id")})
	require.NoError(t, err)
	require.Len(t, sel.Result, 1)
	meta := sel.Result[0].Meta
	assert.Equal(t, d1.QueryResultMetaServedByRegionWeur, meta.ServedByRegion)
	assert.True(t, meta.ServedByRegion.IsKnown())
	assert.True(t, meta.ServedByPrimary)
	assert.Equal(t, 2.0, meta.RowsRead)
	assert.Greater(t, meta.SizeAfter, 0.0)
	assert.GreaterOrEqual(t, meta.Duration, 0.0)
	assert.Equal(t, []any{
		map[string]any{"id": 1.0, "name": "apple", "price": 1.5},
		map[string]any{"id": 2.0, "name": "pear", "price": 2.0},
	}, sel.Result[0].Results)

	// raw: columns and rows
	raw, err := dbs.Raw(ctx, db.UUID, d1.DatabaseRawParams{AccountID: acct, Sql: cloudflare.F("SELECT id, name FROM items WHERE price > ?"), Params: cloudflare.F([]string{"1.6"})})
	require.NoError(t, err)
	require.Len(t, raw.Result, 1)
	assert.True(t, raw.Result[0].Success)
	assert.Equal(t, []string{"id", "name"}, raw.Result[0].Results.Columns)
	assert.Equal(t, [][]any{{2.0, "pear"}}, raw.Result[0].Results.Rows)
	assert.Equal(t, 2.0, raw.Result[0].Meta.RowsRead, "a full scan of the two rows, as D1 counts")

	// an error: *cloudflare.Error with the D1 code
	_, err = dbs.Query(ctx, db.UUID, d1.DatabaseQueryParams{AccountID: acct, Sql: cloudflare.F("SELECT * FROM no_such_table")})
	var apiErr *cloudflare.Error
	require.ErrorAs(t, err, &apiErr)
	assert.Equal(t, http.StatusBadRequest, apiErr.StatusCode)
	require.NotEmpty(t, apiErr.Errors)
	assert.EqualValues(t, 7500, apiErr.Errors[0].Code)
	assert.Contains(t, apiErr.Errors[0].Message, "no such table")

	// time travel: the bookmark now, a write, a restore to the bookmark
	ttPath := fmt.Sprintf("accounts/%s/d1/database/%s/time_travel/", d.account, db.UUID)
	var bm struct {
		Result struct {
			Bookmark string `json:"bookmark"`
		} `json:"result"`
		Success bool `json:"success"`
	}
	require.NoError(t, client.Get(ctx, ttPath+"bookmark", nil, &bm))
	require.True(t, bm.Success)
	require.NotEmpty(t, bm.Result.Bookmark)
	_, err = dbs.Query(ctx, db.UUID, d1.DatabaseQueryParams{AccountID: acct, Sql: cloudflare.F("DELETE FROM items")})
	require.NoError(t, err)
	var rs struct {
		Result struct {
			Bookmark         string `json:"bookmark"`
			PreviousBookmark string `json:"previous_bookmark"`
			Message          string `json:"message"`
		} `json:"result"`
		Success bool `json:"success"`
	}
	require.NoError(t, client.Post(ctx, ttPath+"restore", nil, &rs, option.WithQuery("bookmark", bm.Result.Bookmark)))
	require.True(t, rs.Success)
	assert.NotEmpty(t, rs.Result.PreviousBookmark)
	assert.NotEmpty(t, rs.Result.Message)
	back, err := dbs.Query(ctx, db.UUID, d1.DatabaseQueryParams{AccountID: acct, Sql: cloudflare.F("SELECT count(*) AS n FROM items")})
	require.NoError(t, err)
	assert.Equal(t, []any{map[string]any{"n": 2.0}}, back.Result[0].Results, "the restore brought the deleted rows back")
	err = client.Post(ctx, ttPath+"restore", nil, &rs, option.WithQuery("bookmark", "not-a-bookmark"))
	require.ErrorAs(t, err, &apiErr)
	assert.Equal(t, http.StatusBadRequest, apiErr.StatusCode)

	// export: poll until complete, then download the signed URL
	exp, err := dbs.Export(ctx, db.UUID, d1.DatabaseExportParams{AccountID: acct, OutputFormat: cloudflare.F(d1.DatabaseExportParamsOutputFormatPolling)})
	require.NoError(t, err)
	for i := 0; exp.Status != d1.DatabaseExportResponseStatusComplete && i < 200; i++ {
		require.NotEqual(t, d1.DatabaseExportResponseStatusError, exp.Status, "export: %s", exp.Error)
		time.Sleep(100 * time.Millisecond) // poll interval: the SDK's polling export, as a user polls
		exp, err = dbs.Export(ctx, db.UUID, d1.DatabaseExportParams{AccountID: acct, OutputFormat: cloudflare.F(d1.DatabaseExportParamsOutputFormatPolling),
			CurrentBookmark: cloudflare.F(exp.AtBookmark)})
		require.NoError(t, err)
	}
	require.Equal(t, d1.DatabaseExportResponseStatusComplete, exp.Status)
	assert.True(t, exp.Success)
	assert.Equal(t, d1.DatabaseExportResponseTypeExport, exp.Type)
	require.NotEmpty(t, exp.Result.SignedURL)
	assert.NotEmpty(t, exp.Result.Filename)
	dump := download(t, exp.Result.SignedURL)
	assert.True(t, strings.HasPrefix(dump, "PRAGMA defer_foreign_keys=TRUE;\n"), "D1's export header: %.80q", dump)
	assert.Contains(t, dump, `INSERT INTO "items"`)

	// export with dump options: schema only, one table
	schemaOnly, err := dbs.Export(ctx, db.UUID, d1.DatabaseExportParams{AccountID: acct, OutputFormat: cloudflare.F(d1.DatabaseExportParamsOutputFormatPolling),
		DumpOptions: cloudflare.F(d1.DatabaseExportParamsDumpOptions{NoData: cloudflare.F(true), Tables: cloudflare.F([]string{"items"})})})
	require.NoError(t, err)
	for i := 0; schemaOnly.Status != d1.DatabaseExportResponseStatusComplete && i < 200; i++ {
		time.Sleep(100 * time.Millisecond) // poll interval: the SDK's polling export, as a user polls
		schemaOnly, err = dbs.Export(ctx, db.UUID, d1.DatabaseExportParams{AccountID: acct, OutputFormat: cloudflare.F(d1.DatabaseExportParamsOutputFormatPolling),
			CurrentBookmark: cloudflare.F(schemaOnly.AtBookmark), DumpOptions: cloudflare.F(d1.DatabaseExportParamsDumpOptions{NoData: cloudflare.F(true), Tables: cloudflare.F([]string{"items"})})})
		require.NoError(t, err)
	}
	schema := download(t, schemaOnly.Result.SignedURL)
	assert.Contains(t, schema, "CREATE TABLE items")
	assert.NotContains(t, schema, "INSERT INTO")

	// import the dump into a second database: init, PUT, ingest, poll
	cp, err := dbs.New(ctx, d1.DatabaseNewParams{AccountID: acct, Name: cloudflare.F("sdk-go-copy")})
	require.NoError(t, err)
	sum := md5.Sum([]byte(dump))
	etag := hex.EncodeToString(sum[:])
	init, err := dbs.Import(ctx, cp.UUID, d1.DatabaseImportParams{AccountID: acct,
		Body: d1.DatabaseImportParamsBodyInit{Action: cloudflare.F(d1.DatabaseImportParamsBodyInitActionInit), Etag: cloudflare.F(etag)}})
	require.NoError(t, err)
	require.NotEmpty(t, init.UploadURL)
	require.NotEmpty(t, init.Filename)
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, init.UploadURL, strings.NewReader(dump))
	require.NoError(t, err)
	put, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	put.Body.Close()
	require.Equal(t, http.StatusOK, put.StatusCode)
	assert.Equal(t, etag, strings.Trim(put.Header.Get("ETag"), `"`))
	imp, err := dbs.Import(ctx, cp.UUID, d1.DatabaseImportParams{AccountID: acct,
		Body: d1.DatabaseImportParamsBodyIngest{Action: cloudflare.F(d1.DatabaseImportParamsBodyIngestActionIngest), Etag: cloudflare.F(etag), Filename: cloudflare.F(init.Filename)}})
	require.NoError(t, err)
	for i := 0; imp.Status != d1.DatabaseImportResponseStatusComplete && i < 200; i++ {
		require.NotEqual(t, d1.DatabaseImportResponseStatusError, imp.Status, "import: %s", imp.Error)
		time.Sleep(100 * time.Millisecond) // poll interval: the SDK's polling import, as a user polls
		imp, err = dbs.Import(ctx, cp.UUID, d1.DatabaseImportParams{AccountID: acct,
			Body: d1.DatabaseImportParamsBodyPoll{Action: cloudflare.F(d1.DatabaseImportParamsBodyPollActionPoll), CurrentBookmark: cloudflare.F(imp.AtBookmark)}})
		require.NoError(t, err)
	}
	require.Equal(t, d1.DatabaseImportResponseStatusComplete, imp.Status)
	assert.True(t, imp.Success)
	assert.Equal(t, d1.DatabaseImportResponseTypeImport, imp.Type)
	assert.GreaterOrEqual(t, imp.Result.NumQueries, 3.0)
	assert.NotEmpty(t, imp.Result.FinalBookmark)
	cq, err := dbs.Query(ctx, cp.UUID, d1.DatabaseQueryParams{AccountID: acct, Sql: cloudflare.F("SELECT count(*) AS n, sum(price) AS s FROM items")})
	require.NoError(t, err)
	assert.Equal(t, []any{map[string]any{"n": 2.0, "s": 3.5}}, cq.Result[0].Results, "the imported rows")

	// delete both; a get afterwards is a 404 *cloudflare.Error
	_, err = dbs.Delete(ctx, cp.UUID, d1.DatabaseDeleteParams{AccountID: acct})
	require.NoError(t, err)
	del, err := dbs.Delete(ctx, db.UUID, d1.DatabaseDeleteParams{AccountID: acct})
	require.NoError(t, err)
	assert.Nil(t, *del)
	_, err = dbs.Get(ctx, db.UUID, d1.DatabaseGetParams{AccountID: acct})
	require.True(t, errors.As(err, &apiErr), "%v", err)
	assert.Equal(t, http.StatusNotFound, apiErr.StatusCode)
	assert.EqualValues(t, 7404, apiErr.Errors[0].Code)
}

func download(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(b)
}
