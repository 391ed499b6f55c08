package test

import (
	"encoding/base64"
	"encoding/json"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/test/harness"
)

// The hostile-tenant tests (issue 14, docs/security.md) run on real
// components: three Raft catalog nodes, two object hosts and two edges over
// loopback HTTP with real SQLite files (harness.NewE2ECluster), or the
// shoal binary itself where the listener's own set-up is under test.

// d1DB is the part of D1's database object these tests read.
type d1DB struct {
	UUID string `json:"uuid"`
	Name string `json:"name"`
}

func createDB(t *testing.T, edgeURL, acct, bearer, name string) d1DB {
	t.Helper()
	a := harness.Call(t, "POST", edgeURL+"/client/v4/accounts/"+acct+"/d1/database", bearer, map[string]any{"name": name})
	require.Equal(t, 200, a.Status, "%s", a.Raw)
	var d d1DB
	require.NoError(t, json.Unmarshal(a.Result, &d))
	return d
}

// endpoint is one per-database call of the public API with a body that is
// valid for it, so that ownership is the only reason to refuse it.
type endpoint struct {
	name, method, suffix string
	body                 any
}

func perDatabaseEndpoints() []endpoint {
	etag := strings.Repeat("ab", 16)
	return []endpoint{
		{"get", "GET", "", nil},
		{"update", "PATCH", "", map[string]any{"read_replication": map[string]any{"mode": "auto"}}},
		{"update-put", "PUT", "", map[string]any{"read_replication": map[string]any{"mode": "auto"}}},
		{"query", "POST", "/query", map[string]any{"sql": "SELECT v FROM secret"}},
		{"query-write", "POST", "/query", map[string]any{"sql": "DELETE FROM secret"}},
		{"raw", "POST", "/raw", map[string]any{"sql": "SELECT v FROM secret"}},
		{"batch", "POST", "/query", map[string]any{"batch": []any{map[string]any{"sql": "SELECT 1"}}}},
		{"binding-mint", "POST", "/binding", map[string]any{"ttl_seconds": 60}},
		{"binding-revoke-all", "DELETE", "/binding", nil},
		{"binding-revoke-one", "DELETE", "/binding/" + strings.Repeat("0", 32), nil},
		{"export", "POST", "/export", map[string]any{"output_format": "polling"}},
		{"import-init", "POST", "/import", map[string]any{"action": "init", "etag": etag}},
		{"import-ingest", "POST", "/import", map[string]any{"action": "ingest", "etag": etag, "filename": etag + "-000000000000.sql"}},
		{"import-poll", "POST", "/import", map[string]any{"action": "poll", "current_bookmark": etag + "-000000000000.sql"}},
		{"tt-bookmark", "GET", "/time_travel/bookmark", nil},
		{"tt-restore", "POST", "/time_travel/restore?timestamp=" + url.QueryEscape(time.Now().UTC().Format(time.RFC3339)), nil},
		{"insights", "GET", "/insights", nil},
		{"delete", "DELETE", "", nil},
	}
}

// TestCrossAccountMatrix: account A's token on every per-database endpoint,
// with the account in the path both ways. (1) A's own account in the path
// and B's database: answered exactly as a database that does not exist
// (no existence oracle), and B's database is unchanged. (2) B's account in
// the path: 403/7403, whatever the database. Account-level endpoints (list,
// create, token verify) refuse B's account in the path too, and binding
// tokens and signed URLs of A's database reach nothing of B's.
func TestCrossAccountMatrix(t *testing.T) {
	c := harness.NewE2ECluster(t)
	acctA, bearerA := c.SetupAccount(t, "paid")
	acctB, bearerB := c.SetupAccount(t, "paid")
	pathOf := func(acct string) string { return c.EdgeURL[0] + "/client/v4/accounts/" + acct + "/d1/database" }

	dbA := createDB(t, c.EdgeURL[0], acctA, bearerA, "mine")
	dbB := createDB(t, c.EdgeURL[0], acctB, bearerB, "theirs")
	a := harness.Call(t, "POST", pathOf(acctB)+"/"+dbB.UUID+"/query", bearerB, map[string]any{"batch": []any{
		map[string]any{"sql": "CREATE TABLE secret (v TEXT)"},
		map[string]any{"sql": "INSERT INTO secret VALUES ('b-secret')"},
	}})
	require.Equal(t, 200, a.Status, "%s", a.Raw)
	missing := "01900000-0000-7000-8000-000000000000"

	for _, ep := range perDatabaseEndpoints() {
		for e := range c.EdgeURL {
			base := func(acct string) string {
				return c.EdgeURL[e] + "/client/v4/accounts/" + acct + "/d1/database"
			}
			// (1) own account in the path, B's database.
			got := harness.Call(t, ep.method, base(acctA)+"/"+dbB.UUID+ep.suffix, bearerA, ep.body)
			want := harness.Call(t, ep.method, base(acctA)+"/"+missing+ep.suffix, bearerA, ep.body)
			assert.Equal(t, want.Status, got.Status, "%s edge %d: B's database vs a missing one: %s", ep.name, e, got.Raw)
			assert.Equal(t, want.Errors, got.Errors, "%s edge %d", ep.name, e)
			assert.False(t, got.Success, "%s edge %d: %s", ep.name, e, got.Raw)
			assert.NotContains(t, string(got.Raw), "b-secret")
			assert.NotContains(t, string(got.Raw), "upload_url")
			// (2) B's account in the path: forbidden, for B's database,
			// A's database and a missing one alike.
			for _, id := range []string{dbB.UUID, dbA.UUID, missing} {
				got = harness.Call(t, ep.method, base(acctB)+"/"+id+ep.suffix, bearerA, ep.body)
				assert.Equal(t, 403, got.Status, "%s edge %d %s: %s", ep.name, e, id, got.Raw)
				assert.Equal(t, 7403, got.Code(), "%s", ep.name)
			}
		}
	}
	// Account-level endpoints with B's account in the path.
	for _, ep := range []struct {
		method, url string
		body        any
	}{
		{"GET", pathOf(acctB), nil},
		{"POST", pathOf(acctB), map[string]any{"name": "planted"}},
		{"GET", c.EdgeURL[0] + "/client/v4/accounts/" + acctB + "/tokens/verify", nil},
	} {
		got := harness.Call(t, ep.method, ep.url, bearerA, ep.body)
		assert.Equal(t, 403, got.Status, "%s %s: %s", ep.method, ep.url, got.Raw)
	}

	// B's database is untouched by all of that: still there, same data,
	// read replication still disabled, no database planted in B.
	a = harness.Call(t, "POST", pathOf(acctB)+"/"+dbB.UUID+"/query", bearerB, map[string]any{"sql": "SELECT v FROM secret"})
	require.Equal(t, 200, a.Status, "%s", a.Raw)
	assert.Contains(t, string(a.Result), "b-secret")
	a = harness.Call(t, "GET", pathOf(acctB)+"/"+dbB.UUID, bearerB, nil)
	require.Equal(t, 200, a.Status, "%s", a.Raw)
	assert.Contains(t, string(a.Result), `"mode":"disabled"`)
	a = harness.Call(t, "GET", pathOf(acctB), bearerB, nil)
	require.Equal(t, 200, a.Status)
	assert.NotContains(t, string(a.Raw), "planted")
	assert.Contains(t, string(a.Raw), dbB.UUID)
	a = harness.Call(t, "GET", pathOf(acctA), bearerA, nil)
	assert.NotContains(t, string(a.Raw), dbB.UUID, "A's list never shows B's database")

	// A binding token of A's database reaches only A's database.
	a = harness.Call(t, "POST", pathOf(acctA)+"/"+dbA.UUID+"/binding", bearerA, nil)
	require.Equal(t, 200, a.Status, "%s", a.Raw)
	var mint struct{ Token string }
	require.NoError(t, json.Unmarshal(a.Result, &mint))
	q := map[string]any{"sql": "SELECT v FROM secret"}
	for e := range c.EdgeURL {
		base := func(acct string) string { return c.EdgeURL[e] + "/client/v4/accounts/" + acct + "/d1/database" }
		got := harness.Call(t, "POST", base(acctA)+"/"+dbB.UUID+"/query", "Binding "+mint.Token, q)
		assert.Equal(t, 404, got.Status, "%s", got.Raw)
		got = harness.Call(t, "POST", base(acctB)+"/"+dbB.UUID+"/query", "Binding "+mint.Token, q)
		assert.Equal(t, 403, got.Status, "%s", got.Raw)
		assert.NotContains(t, string(got.Raw), "b-secret")
	}

	// A signed export URL of A's database cannot be turned into B's.
	a = harness.Call(t, "POST", pathOf(acctA)+"/"+dbA.UUID+"/export", bearerA, map[string]any{"output_format": "polling"})
	require.Equal(t, 200, a.Status, "%s", a.Raw)
	var exp struct {
		Status string `json:"status"`
		Result struct {
			SignedURL string `json:"signed_url"`
		} `json:"result"`
		AtBookmark string `json:"at_bookmark"`
	}
	require.NoError(t, json.Unmarshal(a.Result, &exp))
	for i := 0; i < 100 && exp.Status != "complete"; i++ {
		time.Sleep(50 * time.Millisecond) // poll interval: the polling export, as a user polls
		a = harness.Call(t, "POST", pathOf(acctA)+"/"+dbA.UUID+"/export", bearerA, map[string]any{"output_format": "polling", "current_bookmark": exp.AtBookmark})
		require.Equal(t, 200, a.Status, "%s", a.Raw)
		require.NoError(t, json.Unmarshal(a.Result, &exp))
	}
	require.Equal(t, "complete", exp.Status, "%s", a.Raw)
	u, err := url.Parse(exp.Result.SignedURL)
	require.NoError(t, err)
	tok := u.Path[strings.LastIndexByte(u.Path, '/')+1:]
	claims, sig, ok := strings.Cut(tok, ".")
	require.True(t, ok)
	raw, err := base64.RawURLEncoding.DecodeString(claims)
	require.NoError(t, err)
	var cl map[string]any
	require.NoError(t, json.Unmarshal(raw, &cl))
	cl["a"], cl["d"] = acctB, dbB.UUID
	raw, err = json.Marshal(cl)
	require.NoError(t, err)
	forged := base64.RawURLEncoding.EncodeToString(raw) + "." + sig
	resp, err := harness.Client().Get(c.EdgeURL[0] + "/client/v4/shoal/dump/" + tok)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode, "the URL as signed works")
	resp, err = harness.Client().Get(c.EdgeURL[0] + "/client/v4/shoal/dump/" + forged)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Contains(t, []int{401, 403, 404}, resp.StatusCode, "a download URL rewritten for B's database is refused")
	t.Logf("matrix: %d endpoints × 2 edges × (1 own-path + 3 other-path) checked", len(perDatabaseEndpoints()))
}

// TestBindingTokensEndToEnd: binding tokens through both edges to the real
// object hosts: opaque, scoped, expiring, revocable per token, per database
// and with their API token, refused when tampered or reused elsewhere.
func TestBindingTokensEndToEnd(t *testing.T) {
	c := harness.NewE2ECluster(t)
	acct, bearer := c.SetupAccount(t, "paid")
	path := c.EdgeURL[0] + "/client/v4/accounts/" + acct + "/d1/database"
	d := createDB(t, c.EdgeURL[0], acct, bearer, "bound")
	other := createDB(t, c.EdgeURL[0], acct, bearer, "other")
	type minted struct {
		Token   string `json:"token"`
		TokenID string `json:"token_id"`
	}
	mint := func(db d1DB, auth string, ttl int) minted {
		t.Helper()
		a := harness.Call(t, "POST", path+"/"+db.UUID+"/binding", auth, map[string]any{"ttl_seconds": ttl})
		require.Equal(t, 200, a.Status, "%s", a.Raw)
		var m minted
		require.NoError(t, json.Unmarshal(a.Result, &m))
		return m
	}
	q := map[string]any{"sql": "SELECT 7 AS seven"}
	bound := func(e int, m minted) harness.Answer {
		return harness.Call(t, "POST", c.EdgeURL[e]+"/client/v4/bound/query", "Binding "+m.Token, q)
	}
	m1, m2 := mint(d, bearer, 600), mint(d, bearer, 600)
	for _, h := range c.HostAddr {
		assert.NotContains(t, m1.Token, h, "the token does not show the host's address")
	}
	for e := range c.EdgeURL {
		a := bound(e, m1)
		require.Equal(t, 200, a.Status, "%s", a.Raw)
		assert.Contains(t, string(a.Result), `"seven":7`)
	}
	// Reused on another database's path: not found.
	a := harness.Call(t, "POST", path+"/"+other.UUID+"/query", "Binding "+m1.Token, q)
	assert.Equal(t, 404, a.Status, "%s", a.Raw)
	// Tampered anywhere: refused.
	for _, i := range []int{5, len(m1.Token) / 2, len(m1.Token) - 3} {
		b := []byte(m1.Token)
		if b[i] == 'A' {
			b[i] = 'B'
		} else {
			b[i] = 'A'
		}
		a = harness.Call(t, "POST", c.EdgeURL[0]+"/client/v4/bound/query", "Binding "+string(b), q)
		assert.Equal(t, 401, a.Status, "byte %d: %s", i, a.Raw)
	}
	// Expired.
	short := mint(d, bearer, 1)
	require.Eventually(t, func() bool { return bound(0, short).Status == 401 }, 10*time.Second, 100*time.Millisecond)
	assert.Contains(t, bound(1, short).Errors[0].Message, "expired")

	// Revoked, one token: in force on both edges as soon as the API answered.
	a = harness.Call(t, "DELETE", path+"/"+d.UUID+"/binding/"+m1.TokenID, bearer, nil)
	require.Equal(t, 200, a.Status, "%s", a.Raw)
	for e := range c.EdgeURL {
		a = bound(e, m1)
		assert.Equal(t, 401, a.Status, "edge %d: %s", e, a.Raw)
		assert.Equal(t, 200, bound(e, m2).Status, "edge %d: the other token still works", e)
	}
	// Revoked, every token of the database.
	a = harness.Call(t, "DELETE", path+"/"+d.UUID+"/binding", bearer, nil)
	require.Equal(t, 200, a.Status, "%s", a.Raw)
	for e := range c.EdgeURL {
		assert.Equal(t, 401, bound(e, m2).Status)
	}
	m3 := mint(d, bearer, 600)
	assert.Equal(t, 200, bound(1, m3).Status)

	// Revoked with the API token that minted it: a second token of the
	// account mints, then the operator revokes that API token.
	a = harness.Call(t, "POST", c.EdgeURL[0]+"/admin/v1/accounts/"+acct+"/tokens", "Bearer "+c.Admin, map[string]any{"name": "ci"})
	require.Equal(t, 200, a.Status, "%s", a.Raw)
	var tok struct{ ID, Token string }
	require.NoError(t, json.Unmarshal(a.Result, &tok))
	var m4 minted
	require.Eventually(t, func() bool {
		a = harness.Call(t, "POST", path+"/"+d.UUID+"/binding", "Bearer "+tok.Token, nil)
		return a.Status == 200 && json.Unmarshal(a.Result, &m4) == nil
	}, 10*time.Second, 50*time.Millisecond, "%s", a.Raw)
	for e := range c.EdgeURL {
		require.Equal(t, 200, bound(e, m4).Status)
	}
	a = harness.Call(t, "DELETE", c.EdgeURL[0]+"/admin/v1/tokens/"+tok.ID, "Bearer "+c.Admin, nil)
	require.Equal(t, 200, a.Status, "%s", a.Raw)
	start := time.Now()
	for e := range c.EdgeURL {
		require.Eventually(t, func() bool { return bound(e, m4).Status == 401 }, 10*time.Second, 50*time.Millisecond,
			"edge %d keeps serving a binding token of a revoked API token", e)
	}
	t.Logf("binding tokens of a revoked API token refused on both edges after %s (token TTL 1 s here)", time.Since(start).Round(time.Millisecond))
	assert.Equal(t, 200, bound(0, m3).Status, "tokens of the account's other API token are unaffected")

	// Deleted database: the token reaches nothing.
	a = harness.Call(t, "DELETE", path+"/"+d.UUID, bearer, nil)
	require.Equal(t, 200, a.Status)
	require.Eventually(t, func() bool { return bound(1, m3).Status != 200 }, 10*time.Second, 50*time.Millisecond)
	a = bound(1, m3)
	assert.Contains(t, []int{401, 404, 410}, a.Status, "%s", a.Raw)
}
