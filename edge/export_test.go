package edge

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

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
		HostAddress: "127.0.0.1:1", ExpiresAt: c.Expires})
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
