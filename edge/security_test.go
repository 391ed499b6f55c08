package edge

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/internal/binding"
)

// A flood of random tokens cannot evict a validated token: it keeps working
// through a later catalog outage (within the stale grace).
func TestTokenFloodKeepsValidatedTokens(t *testing.T) {
	e := newEnv(t)
	e.srv.auth.maxNegative = 50
	e.srv.auth.max = 10
	a := e.call("GET", dbPath(acctA), tokA, nil)
	require.Equal(t, 200, a.Status, "%s", a.Raw)
	for i := 0; i < 500; i++ {
		a = e.call("GET", dbPath(acctA), fmt.Sprintf("random-token-%d", i), nil)
		require.Equal(t, 401, a.Status, "%s", a.Raw)
	}
	e.srv.auth.mu.Lock()
	nNeg, nPos := len(e.srv.auth.neg), len(e.srv.auth.m)
	e.srv.auth.mu.Unlock()
	assert.LessOrEqual(t, nNeg, 50, "the negative cache stays bounded")
	assert.Equal(t, 1, nPos, "only the real token is in the validated cache")

	e.clock.Advance(time.Minute) // past the TTL: the next check asks the catalog
	e.cat.setDown(true)
	a = e.call("GET", dbPath(acctA), tokA, nil)
	assert.NotEqual(t, 401, a.Status, "the validated token survives the flood and the outage: %s", a.Raw)
	a = e.call("POST", dbPath(acctA), tokA, map[string]any{"name": "x"})
	assert.Equal(t, 503, a.Status, "(the create itself needs the catalog) %s", a.Raw)
}

// ttl_seconds is compared in seconds: a value that overflows a Duration is
// shortened to the longest TTL like any other long one, not a 500; values
// that are not integers are refused in JSON terms.
func TestMintTTLBounds(t *testing.T) {
	e := newEnv(t)
	d := e.create(acctA, tokA, "db1")
	for _, ttl := range []string{"9223372037", "9223372036854775807", "604801"} {
		a := e.call("POST", dbPath(acctA)+"/"+d.UUID+"/binding", tokA, `{"ttl_seconds":`+ttl+`}`)
		require.Equal(t, 200, a.Status, "%s: %s", ttl, a.Raw)
		var m mintResult
		require.NoError(t, json.Unmarshal(a.Result, &m))
		assert.Equal(t, e.clock.Now().Add(7*24*time.Hour).UTC().Format(time.RFC3339), m.ExpiresAt, ttl)
	}
	for _, body := range []string{`{"ttl_seconds":-1}`, `{"ttl_seconds":1e30}`, `{"ttl_seconds":"60"}`, `{"ttl_seconds":99999999999999999999}`, `[]`, `{"ttl":1}`} {
		a := e.call("POST", dbPath(acctA)+"/"+d.UUID+"/binding", tokA, body)
		assert.Equal(t, 400, a.Status, "%s: %s", body, a.Raw)
		assert.Equal(t, 7400, a.code())
		t.Logf("%s → %s", body, a.Errors[0].Message)
	}
}

// goInternals matches what an error message must never hold: Go type and
// package names, struct field paths, the json package's own prefix.
var goInternals = regexp.MustCompile(`\b(edge|fsm|sqlexec|objecthost|binding|v4|main|json|http)\.[A-Za-z]|\[\][a-z]|\bGo (value|struct)|\bstruct\b|\bint64\b|\bfloat64\b|interface \{`)

// Malformed bodies on every endpoint that reads one answer in JSON terms:
// no message names a Go type (the issue's `expected []edge.Statement`).
func TestErrorMessagesHoldNoGoTypes(t *testing.T) {
	e := newEnv(t)
	d := e.create(acctA, tokA, "db1")
	base := dbPath(acctA)
	paths := []struct{ method, path string }{
		{"POST", base}, {"POST", base + "/" + d.UUID + "/query"}, {"POST", base + "/" + d.UUID + "/raw"},
		{"PATCH", base + "/" + d.UUID}, {"POST", base + "/" + d.UUID + "/binding"},
		{"POST", base + "/" + d.UUID + "/export"}, {"POST", base + "/" + d.UUID + "/import"},
		{"POST", "/admin/v1/accounts"},
	}
	bodies := []string{
		`[]`, `"x"`, `1`, `null`, `{"sql": 1}`, `{"sql": ["a"]}`, `{"batch": {}}`, `{"batch": [1]}`, `{"batch": [{"sql": {}}]}`,
		`{"params": "x", "sql": "SELECT 1"}`, `{"name": 1}`, `{"name": []}`, `{"read_replication": "auto"}`,
		`{"read_replication": {"mode": 1}}`, `{"ttl_seconds": "x"}`, `{"action": 1}`, `{"output_format": []}`,
		`{"dump_options": {"tables": "t"}}`, `{"tier": 1}`, `{"limits": []}`, `{"query": 1}`, `{`, `{"a":1}x`, `{"sql":"SELECT 1","sql":2}`,
	}
	for _, p := range paths {
		auth := tokA
		if strings.HasPrefix(p.path, "/admin") {
			auth = adminTok
		}
		for _, b := range bodies {
			a := e.call(p.method, p.path, auth, b)
			for _, er := range a.Errors {
				assert.False(t, goInternals.MatchString(er.Message), "%s %s %s → %q", p.method, p.path, b, er.Message)
			}
			if a.Status >= 500 {
				t.Errorf("%s %s %s → %d %s", p.method, p.path, b, a.Status, a.Raw)
			}
		}
	}
	a := e.call("POST", base+"/"+d.UUID+"/query", tokA, `{"batch": {"sql": "SELECT 1"}}`)
	assert.Equal(t, "Invalid property: batch => expected an array, got object", a.Errors[0].Message)
}

// Import init names no other account's database: it is "not found" as on
// every other endpoint, and no upload URL is handed out.
func TestImportInitIsNoExistenceOracle(t *testing.T) {
	e := newEnv(t)
	theirs := e.create(acctB, tokB, "secret-db")
	body := map[string]any{"action": "init", "etag": strings.Repeat("a", 32)}
	a := e.call("POST", dbPath(acctA)+"/"+theirs.UUID+"/import", tokA, body)
	assert.Equal(t, 404, a.Status, "%s", a.Raw)
	assert.NotContains(t, string(a.Raw), "upload")
	missing := e.call("POST", dbPath(acctA)+"/00000000-0000-4000-8000-000000000000/import", tokA, body)
	assert.Equal(t, missing.Status, a.Status)
	assert.Equal(t, missing.Errors, a.Errors, "another account's database and a missing one answer alike")
	a = e.call("POST", dbPath(acctB)+"/"+theirs.UUID+"/import", tokB, body)
	assert.Equal(t, 200, a.Status, "%s", a.Raw)
}

// Binding tokens: opaque, revocable one by one, all at once, and with the
// API token that minted them; reused elsewhere or tampered, refused.
func TestBindingTokenRevocation(t *testing.T) {
	e := newEnv(t)
	d := e.create(acctA, tokA, "db1")
	mint := func(auth string) mintResult {
		t.Helper()
		a := e.call("POST", dbPath(acctA)+"/"+d.UUID+"/binding", auth, nil)
		require.Equal(t, 200, a.Status, "%s", a.Raw)
		var m mintResult
		require.NoError(t, json.Unmarshal(a.Result, &m))
		require.True(t, binding.ValidTokenID(m.TokenID))
		return m
	}
	q := map[string]any{"sql": "SELECT 1"}
	bound := func(m mintResult) answer { return e.call("POST", "/client/v4/bound/query", "Binding "+m.Token, q) }

	m1, m2 := mint(tokA), mint(tokA)
	// Opaque: the claims are not readable from the token.
	raw, err := base64.RawURLEncoding.DecodeString(strings.TrimPrefix(m1.Token, "v2."))
	require.NoError(t, err)
	host := e.hostOf(e.catalogDB(d.UUID).ObjectID).addr()
	for _, s := range []string{host, e.catalogDB(d.UUID).ObjectID, acctA, m1.TokenID} {
		assert.NotContains(t, string(raw), s)
		assert.NotContains(t, m1.Token, s)
	}
	require.Equal(t, 200, bound(m1).Status)

	// One token.
	a := e.call("DELETE", dbPath(acctA)+"/"+d.UUID+"/binding/"+m1.TokenID, tokA, nil)
	require.Equal(t, 200, a.Status, "%s", a.Raw)
	a = bound(m1)
	assert.Equal(t, 401, a.Status, "%s", a.Raw)
	assert.Equal(t, 10000, a.code())
	assert.Equal(t, 200, bound(m2).Status, "the other token still works")
	a = e.call("DELETE", dbPath(acctA)+"/"+d.UUID+"/binding/not-an-id", tokA, nil)
	assert.Equal(t, 400, a.Status)
	a = e.call("DELETE", dbPath(acctB)+"/"+d.UUID+"/binding/"+m2.TokenID, tokB, nil)
	assert.Equal(t, 404, a.Status, "another account cannot revoke (or learn of) it")
	assert.Equal(t, 200, bound(m2).Status)

	// All of the database's tokens.
	a = e.call("DELETE", dbPath(acctA)+"/"+d.UUID+"/binding", tokA, nil)
	require.Equal(t, 200, a.Status, "%s", a.Raw)
	assert.Equal(t, 401, bound(m2).Status)
	m3 := mint(tokA)
	assert.Equal(t, 200, bound(m3).Status, "tokens minted after the revocation work")

	// The API token that minted them: within the token TTL.
	e.cat.addToken("token-a2-secret", acctA, false)
	m4 := mint("token-a2-secret")
	require.Equal(t, 200, bound(m4).Status)
	e.cat.mu.Lock()
	tok := e.cat.tokens[HashToken("token-a2-secret")]
	tok.Revoked = true
	e.cat.tokens[HashToken("token-a2-secret")] = tok
	e.cat.mu.Unlock()
	assert.Equal(t, 200, bound(m4).Status, "within the TTL the cached check stands")
	e.clock.Advance(11 * time.Second)
	a = bound(m4)
	assert.Equal(t, 401, a.Status, "%s", a.Raw)
	assert.Contains(t, a.Errors[0].Message, "the API token that minted it was revoked")
	assert.Equal(t, 200, bound(m3).Status, "tokens of other API tokens are unaffected")

	// Tampered: any change is refused, with no detail.
	for i := len("v2.") + 2; i < len(m3.Token); i += 7 {
		b := []byte(m3.Token)
		b[i] ^= 1
		if b[i] == '.' || b[i] > 'z' {
			continue
		}
		a = e.call("POST", "/client/v4/bound/query", "Binding "+string(b), q)
		assert.Equal(t, 401, a.Status, "byte %d", i)
	}
	// A v1 token (readable claims, HMAC) is refused.
	v1 := "v1." + base64.RawURLEncoding.EncodeToString([]byte(`{"d":"`+d.UUID+`"}`)) + ".sig"
	assert.Equal(t, 401, e.call("POST", "/client/v4/bound/query", "Binding "+v1, q).Status)
}

// The binding path needs the catalog for nothing: with it down and a parent
// token this edge never validated, the token is still served (the revocation
// of its API token is learned when the catalog answers again).
func TestBindingServedWithCatalogDownAndParentUnknown(t *testing.T) {
	e := newEnv(t)
	d := e.create(acctA, tokA, "db1")
	a := e.call("POST", dbPath(acctA)+"/"+d.UUID+"/binding", tokA, nil)
	require.Equal(t, 200, a.Status)
	var m mintResult
	require.NoError(t, json.Unmarshal(a.Result, &m))
	// A fresh edge with the same keyring, the catalog down.
	e2 := newEnv(t, func(o *Options) { o.BindingKeys = e.keys })
	e2.cat.setDown(true)
	a = e2.call("POST", "/client/v4/bound/query", "Binding "+m.Token, map[string]any{"sql": "SELECT 1"})
	assert.Equal(t, 200, a.Status, "%s", a.Raw)
}

// Through a cold edge whose catalog hangs (a cut-off network: silence, not
// refusals), binding-token reads do not each wait out the parent token's
// revocation check: once one check found the catalog unreachable, the
// others answer at once and the check runs in the background (the
// robustness suite measured ~2 s per read before: every read waited for the
// catalog's timeout until the fallback's breaker opened). The revocation is
// still learned from the catalog's first answer. A regression hangs in the
// second phase until go test's -timeout.
func TestBindingParentCheckDoesNotWaitOnAnUnreachableCatalog(t *testing.T) {
	e := newEnv(t)
	d := e.create(acctA, tokA, "db1")
	a := e.call("POST", dbPath(acctA)+"/"+d.UUID+"/binding", tokA, nil)
	require.Equal(t, 200, a.Status)
	var m mintResult
	require.NoError(t, json.Unmarshal(a.Result, &m))
	q := map[string]any{"sql": "SELECT 1"}
	// The catalog timeout is out of the way: a lookup ends when the gate
	// says so.
	e2 := newEnv(t, func(o *Options) { o.BindingKeys, o.CatalogTimeout = e.keys, time.Hour })
	gate := make(chan struct{})
	e2.cat.setTokenGate(gate)
	released := false
	defer func() {
		if !released {
			close(gate) // no lookup left hanging after the test
		}
	}()

	// The first check waits for the catalog, which then fails.
	first := make(chan answer, 1)
	go func() { first <- e2.call("POST", "/client/v4/bound/query", "Binding "+m.Token, q) }()
	gate <- struct{}{}
	got := <-first
	require.Equal(t, 200, got.Status, "%s", got.Raw)

	// The catalog still hangs: these answer without waiting for it.
	for range 5 {
		a := e2.call("POST", "/client/v4/bound/query", "Binding "+m.Token, q)
		require.Equal(t, 200, a.Status, "%s", a.Raw)
	}

	// The catalog answers again, and says the parent was revoked: the
	// background lookup in flight (or the next one) learns it, and bound
	// reads are refused from then on.
	e2.cat.revokeToken(tokA)
	close(gate)
	released = true
	for {
		a := e2.call("POST", "/client/v4/bound/query", "Binding "+m.Token, q)
		if a.Status == 401 {
			break
		}
		require.Equal(t, 200, a.Status, "%s", a.Raw)
	}
}

// A binding token minted with the admin token dies when the admin token is
// replaced (its parent is the admin token's hash, which no longer matches
// and is no API token either).
func TestBindingTokenOfReplacedAdminToken(t *testing.T) {
	e := newEnv(t)
	d := e.create(acctA, tokA, "db1")
	a := e.call("POST", dbPath(acctA)+"/"+d.UUID+"/binding", adminTok, nil)
	require.Equal(t, 200, a.Status, "%s", a.Raw)
	var m mintResult
	require.NoError(t, json.Unmarshal(a.Result, &m))
	q := map[string]any{"sql": "SELECT 1"}
	require.Equal(t, 200, e.call("POST", "/client/v4/bound/query", "Binding "+m.Token, q).Status)
	rotated := newEnv(t, func(o *Options) { o.BindingKeys, o.AdminToken = e.keys, "a-new-admin-secret" })
	a = rotated.call("POST", "/client/v4/bound/query", "Binding "+m.Token, q)
	assert.Equal(t, 401, a.Status, "%s", a.Raw)
}
