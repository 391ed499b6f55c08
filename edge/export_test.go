package edge

import (
	"crypto/md5"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/internal/binding"
)

func TestSignedURLTokens(t *testing.T) {
	e := newEnv(t)
	c := urlClaims{Kind: "export", Account: acctA, Database: "00000000-0000-4000-8000-000000000001", Filename: "x.sql",
		Tables: []string{"t"}, Expires: e.clock.Now().Add(time.Hour).Unix()}
	tok, err := e.srv.signURL(c)
	require.NoError(t, err)
	got, err := e.srv.verifyURL(tok, "export")
	require.NoError(t, err)
	require.Equal(t, c, got)

	_, err = e.srv.verifyURL(tok, "import")
	require.ErrorIs(t, err, errBadURLToken, "an export URL is not an upload URL")

	_, sig, _ := strings.Cut(tok, ".")
	c2 := c
	c2.Database = "00000000-0000-4000-8000-000000000002"
	forged, _ := json.Marshal(c2)
	_, err = e.srv.verifyURL(b64(forged)+"."+sig, "export")
	require.ErrorIs(t, err, errBadURLToken, "claims cannot be changed under a signature")

	// A binding token signed with the same keyring is not a URL token, and a
	// URL token is not a binding token.
	bt, err := e.keys.Sign(binding.Claims{DatabaseUUID: c.Database, ObjectID: strings.Repeat("a", 32), AccountID: acctA,
		HostAddress: "127.0.0.1:1", ExpiresAt: c.Expires, TokenID: binding.NewTokenID(), Parent: strings.Repeat("ab", 32)})
	require.NoError(t, err)
	_, err = e.srv.verifyURL(bt, "export")
	require.ErrorIs(t, err, errBadURLToken)
	_, err = e.keys.Verify(tok, e.clock.Now())
	require.Error(t, err)

	e.clock.Advance(time.Hour)
	_, err = e.srv.verifyURL(tok, "export")
	require.ErrorIs(t, err, errBadURLToken, "expired")

	// Another keyring derives another key.
	other := newEnv(t, func(o *Options) {
		k, _ := binding.NewKeyring([]byte("another-binding-key-0123456789abcdef"))
		o.BindingKeys = k
	})
	tok2, err := other.srv.signURL(urlClaims{Kind: "export", Expires: e.clock.Now().Add(time.Hour).Unix()})
	require.NoError(t, err)
	_, err = e.srv.verifyURL(tok2, "export")
	require.ErrorIs(t, err, errBadURLToken)
}

func b64(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }

func TestExportImportValidation(t *testing.T) {
	e := newEnv(t)
	d := e.create(acctA, tokA, "dumpme")
	base := dbPath(acctA) + "/" + d.UUID

	a := e.call(http.MethodPost, base+"/export", tokA, map[string]any{})
	require.Equal(t, http.StatusBadRequest, a.Status)
	require.Equal(t, 7400, a.code())
	a = e.call(http.MethodPost, base+"/export", tokA, map[string]any{"output_format": "polling", "dump_options": map[string]any{"no_data": true, "no_schema": true}})
	require.Equal(t, http.StatusBadRequest, a.Status)
	a = e.call(http.MethodPost, base+"/export", tokB, map[string]any{"output_format": "polling"})
	require.Equal(t, http.StatusForbidden, a.Status, "another account's token")

	a = e.call(http.MethodPost, base+"/import", tokA, map[string]any{"action": "init", "etag": "nothex"})
	require.Equal(t, http.StatusBadRequest, a.Status)
	a = e.call(http.MethodPost, base+"/import", tokA, map[string]any{"action": "frobnicate"})
	require.Equal(t, http.StatusBadRequest, a.Status)
	a = e.call(http.MethodPost, base+"/import", tokA, map[string]any{"action": "init", "etag": strings.Repeat("ab", 16)})
	require.Equal(t, http.StatusOK, a.Status, string(a.Raw))
	var ini ImportInit
	require.NoError(t, json.Unmarshal(a.Result, &ini))
	require.True(t, strings.HasPrefix(ini.UploadURL, e.ts.URL+"/client/v4/shoal/upload/"), ini.UploadURL)
	require.True(t, strings.HasPrefix(ini.Filename, strings.Repeat("ab", 16)+"-"))
	c, err := e.srv.verifyURL(strings.TrimPrefix(ini.UploadURL, e.ts.URL+"/client/v4/shoal/upload/"), "import")
	require.NoError(t, err)
	require.Equal(t, d.UUID, c.Database)
	require.Equal(t, acctA, c.Account)
	require.Equal(t, ini.Filename, c.Filename)

	// An upload URL does not download, a forged token is refused.
	a = e.call(http.MethodGet, "/client/v4/shoal/dump/"+strings.TrimPrefix(ini.UploadURL, e.ts.URL+"/client/v4/shoal/upload/"), "", nil)
	require.Equal(t, http.StatusUnauthorized, a.Status)
	a = e.call(http.MethodGet, "/client/v4/shoal/dump/garbage.token", "", nil)
	require.Equal(t, http.StatusUnauthorized, a.Status)
	a = e.call(http.MethodPut, "/client/v4/shoal/upload/garbage.token", "", "SELECT 1;")
	require.Equal(t, http.StatusUnauthorized, a.Status)
}

func TestExportImportNeedKeyring(t *testing.T) {
	e := newEnv(t, func(o *Options) { o.BindingKeys = nil })
	d := e.create(acctA, tokA, "nokeys")
	a := e.call(http.MethodPost, dbPath(acctA)+"/"+d.UUID+"/export", tokA, map[string]any{"output_format": "polling"})
	require.Equal(t, http.StatusNotImplemented, a.Status)
	a = e.call(http.MethodPost, dbPath(acctA)+"/"+d.UUID+"/import", tokA, map[string]any{"action": "init", "etag": strings.Repeat("ab", 16)})
	require.Equal(t, http.StatusNotImplemented, a.Status)
}

// TestImportFlowAsWranglerSeesIt follows wrangler's d1 execute --file: the
// upload's ETag must be the quoted MD5 of the file, every status carries
// success: true, each poll returns only the messages not yet seen, and a
// failed job reports errors[] (strings, which wrangler joins).
func TestImportFlowAsWranglerSeesIt(t *testing.T) {
	e := newEnv(t)
	d := e.create(acctA, tokA, "importme")
	base := dbPath(acctA) + "/" + d.UUID
	file := "CREATE TABLE t(x);\nINSERT INTO t VALUES (1);\n"
	sum := md5.Sum([]byte(file))
	etag := hex.EncodeToString(sum[:])

	run := func(filename string) []ImportStatus {
		a := e.call(http.MethodPost, base+"/import", tokA, map[string]any{"action": "init", "etag": etag})
		require.Equal(t, http.StatusOK, a.Status, string(a.Raw))
		var ini ImportInit
		require.NoError(t, json.Unmarshal(a.Result, &ini))
		if filename == "" {
			filename = ini.Filename
		}
		req, err := http.NewRequest(http.MethodPut, ini.UploadURL, strings.NewReader(file))
		require.NoError(t, err)
		resp, err := e.ts.Client().Do(req)
		require.NoError(t, err)
		_ = resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		assert.Equal(t, `"`+etag+`"`, resp.Header.Get("ETag"), "wrangler compares the ETag with the file's MD5")

		var out []ImportStatus
		a = e.call(http.MethodPost, base+"/import", tokA, map[string]any{"action": "ingest", "etag": etag, "filename": filename})
		for i := 0; i < 10; i++ {
			require.Equal(t, http.StatusOK, a.Status, string(a.Raw))
			var st ImportStatus
			require.NoError(t, json.Unmarshal(a.Result, &st))
			out = append(out, st)
			if st.Status != "active" {
				return out
			}
			a = e.call(http.MethodPost, base+"/import", tokA, map[string]any{"action": "poll", "current_bookmark": st.AtBookmark})
		}
		t.Fatal("import never finished")
		return nil
	}

	sts := run("")
	require.Len(t, sts, 3)
	var msgs []string
	for _, st := range sts {
		assert.True(t, st.Success, "%+v", st)
		assert.Equal(t, "import", st.Type)
		assert.NotNil(t, st.Errors)
		assert.Empty(t, st.Errors)
		msgs = append(msgs, st.Messages...)
	}
	assert.Equal(t, []string{"Import started", "Imported 1 statements (9 bytes)"}, msgs, "each message is reported once")
	assert.Equal(t, "complete", sts[2].Status)
	assert.Empty(t, sts[2].Messages)
	assert.NotEmpty(t, sts[2].Result)

	// A bare job name (an older client's bookmark) still polls, from the start.
	job, _ := splitImportBookmark(sts[2].AtBookmark)
	a := e.call(http.MethodPost, base+"/import", tokA, map[string]any{"action": "poll", "current_bookmark": job})
	require.Equal(t, http.StatusOK, a.Status, string(a.Raw))
	var st ImportStatus
	require.NoError(t, json.Unmarshal(a.Result, &st))
	assert.Len(t, st.Messages, 2)

	// A failed job: errors[] holds the reason; error stays for old clients.
	sts = run("bad-" + etag + ".sql")
	last := sts[len(sts)-1]
	assert.Equal(t, "error", last.Status)
	assert.True(t, last.Success)
	assert.Equal(t, []string{`near "SELEC": syntax error`}, last.Errors)
	assert.Equal(t, `near "SELEC": syntax error`, last.Error)
	assert.Equal(t, []string{`near "SELEC": syntax error`}, last.Messages)
}

func TestExportStatusHasSuccess(t *testing.T) {
	e := newEnv(t)
	d := e.create(acctA, tokA, "exportme")
	a := e.call(http.MethodPost, dbPath(acctA)+"/"+d.UUID+"/export", tokA, map[string]any{"output_format": "polling"})
	require.Equal(t, http.StatusOK, a.Status, string(a.Raw))
	var st map[string]any
	require.NoError(t, json.Unmarshal(a.Result, &st))
	assert.Equal(t, true, st["success"], "wrangler and cloudflare-go read success")
	assert.Equal(t, "complete", st["status"])
}

func TestSplitImportBookmark(t *testing.T) {
	for in, want := range map[string]struct {
		job  string
		seen int
	}{
		"abc-1.sql:3": {"abc-1.sql", 3}, "abc-1.sql": {"abc-1.sql", 0}, "a:b": {"a:b", 0}, "a:-1": {"a:-1", 0}, "": {"", 0},
	} {
		job, seen := splitImportBookmark(in)
		assert.Equal(t, want.job, job, in)
		assert.Equal(t, want.seen, seen, in)
	}
}
