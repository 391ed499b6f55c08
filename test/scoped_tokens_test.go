package test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/edge"
	"github.com/shoaldb/shoal/raftmeta"
	"github.com/shoaldb/shoal/raftmeta/fsm"
	"github.com/shoaldb/shoal/test/harness"
)

// TestScopedTokensAndAudit: scoped API tokens through a real edge, object
// host and Raft catalog — a D1 Read token limited to one database reads it,
// is refused any write by the object host's check of the compiled
// statement (also a write hidden in a trigger or a CTE), cannot see or
// touch other databases (404, lists filtered), cannot create, delete or
// mint binding tokens; an edit token limited to a database writes only
// there; an expired token is refused; catalog tokens with the admin flag
// are not operators. The admin actions leave audit rows naming the admin
// and its address.
func TestScopedTokensAndAudit(t *testing.T) {
	c := harness.NewE2ECluster(t)
	acct, bearer := c.SetupAccount(t, "paid")
	e := c.EdgeURL[0]
	base := e + "/client/v4/accounts/" + acct + "/d1/database"
	mk := func(name string) string {
		a := harness.Call(t, "POST", base, bearer, map[string]any{"name": name})
		require.Equal(t, 200, a.Status, "%s", a.Raw)
		var d struct{ UUID string }
		require.NoError(t, json.Unmarshal(a.Result, &d))
		q := harness.Call(t, "POST", base+"/"+d.UUID+"/query", bearer, map[string]any{"sql": "CREATE TABLE t(v); CREATE TABLE log(v); CREATE TRIGGER tr AFTER DELETE ON t BEGIN INSERT INTO log VALUES (old.v); END; INSERT INTO t VALUES (1)"})
		require.Equal(t, 200, q.Status, "%s", q.Raw)
		return d.UUID
	}
	dbA, dbB := mk("scoped-a"), mk("scoped-b")
	token := func(body map[string]any) string {
		a := harness.Call(t, "POST", e+"/admin/v1/accounts/"+acct+"/tokens", "Bearer "+c.Admin, body)
		require.Equal(t, 200, a.Status, "%s", a.Raw)
		var tk struct{ Token string }
		require.NoError(t, json.Unmarshal(a.Result, &tk))
		return "Bearer " + tk.Token
	}
	reader := token(map[string]any{"name": "reader", "scope": "read", "databases": []string{"scoped-a"}})
	writerA := token(map[string]any{"name": "writer-a", "databases": []string{dbA}})

	q := func(auth, db, sql string) harness.Answer {
		return harness.Call(t, "POST", base+"/"+db+"/query", auth, map[string]any{"sql": sql})
	}
	// Reads work; every write is refused by the host, however it is spelt.
	require.Eventually(t, func() bool { return q(reader, dbA, "SELECT v FROM t").Status == 200 }, 10*time.Second, 50*time.Millisecond)
	for _, sql := range []string{
		"INSERT INTO t VALUES (2)",
		"DELETE FROM t",              // the trigger's insert too
		"CREATE TABLE x(v)",          // DDL
		"UPDATE t SET v = v WHERE 0", // writes nothing, still a writing statement
		"WITH c(v) AS (SELECT 5) INSERT INTO t SELECT v FROM c",
		"SELECT 1; UPDATE t SET v = 9",
	} {
		a := q(reader, dbA, sql)
		assert.Equal(t, http.StatusForbidden, a.Status, "%s: %s", sql, a.Raw)
		assert.Equal(t, 7403, a.Code(), "%s", sql)
	}
	a := q(bearer, dbA, "SELECT count(*) AS n, (SELECT count(*) FROM log) AS l FROM t")
	assert.Contains(t, string(a.Result), `"n":1,"l":0`, "nothing the read token tried was written")

	// Other databases do not exist for it; lists are filtered.
	assert.Equal(t, 404, q(reader, dbB, "SELECT 1").Status)
	assert.Equal(t, 404, harness.Call(t, "GET", base+"/"+dbB, reader, nil).Status)
	l := harness.Call(t, "GET", base, reader, nil)
	require.Equal(t, 200, l.Status)
	assert.Contains(t, string(l.Result), dbA)
	assert.NotContains(t, string(l.Result), dbB)
	// No control-plane change.
	for _, call := range []struct{ method, url string }{
		{"POST", base}, {"DELETE", base + "/" + dbA}, {"POST", base + "/" + dbA + "/binding"},
	} {
		a := harness.Call(t, call.method, call.url, reader, map[string]any{"name": "nope"})
		assert.Equal(t, http.StatusForbidden, a.Status, "%s %s: %s", call.method, call.url, a.Raw)
	}

	// An edit token limited to A writes there and nowhere else.
	assert.Equal(t, 200, q(writerA, dbA, "INSERT INTO t VALUES (3)").Status)
	assert.Equal(t, 404, q(writerA, dbB, "INSERT INTO t VALUES (3)").Status)
	assert.Equal(t, http.StatusForbidden, harness.Call(t, "POST", base, writerA, map[string]any{"name": "new-one"}).Status)

	// Expiry.
	short := token(map[string]any{"name": "short", "ttl_seconds": 1})
	require.Equal(t, 200, q(short, dbA, "SELECT 1").Status)
	// Until it expires (the edge's clock passes its 1 s TTL): asked until
	// it is refused rather than after a fixed sleep; a token that never
	// expires fails here.
	require.Eventually(t, func() bool { a = q(short, dbA, "SELECT 1"); return a.Status != 200 }, 30*time.Second, 100*time.Millisecond, "the 1 s token never expired")
	assert.Equal(t, 401, a.Status, "%s", a.Raw)
	assert.Contains(t, string(a.Raw), "expired")
	// Bad input.
	bad := harness.Call(t, "POST", e+"/admin/v1/accounts/"+acct+"/tokens", "Bearer "+c.Admin, map[string]any{"scope": "root"})
	assert.Equal(t, 400, bad.Status)
	bad = harness.Call(t, "POST", e+"/admin/v1/accounts/"+acct+"/tokens", "Bearer "+c.Admin, map[string]any{"databases": []string{"no-such-db"}})
	assert.Equal(t, 400, bad.Status)

	// A catalog token with the admin flag is not an operator.
	cl, err := raftmeta.NewClient(c.CatAddrs, raftmeta.WithCacheTTL(0))
	require.NoError(t, err)
	defer cl.Close()
	const flaggedSecret = "flagged-admin-secret-0123456789abcdefghij"
	_, err = cl.CreateToken(context.Background(), fsm.CreateToken{ID: "flagged", AccountID: acct, Hash: edge.HashToken(flaggedSecret), Name: "f", Admin: true})
	require.NoError(t, err)
	for _, auth := range []string{"Bearer " + flaggedSecret, bearer} {
		a := harness.Call(t, "POST", e+"/admin/v1/accounts", auth, map[string]any{"name": "rogue", "tier": "paid"})
		assert.Equal(t, http.StatusForbidden, a.Status, "%s", a.Raw)
	}

	// The audit log: the admin's token mints, from the test's address.
	page, err := cl.AuditPage(context.Background(), fsm.AuditQuery{AccountID: acct}, raftmeta.LinearizableRead())
	require.NoError(t, err)
	var mints, creates int
	for _, en := range page.Entries {
		switch en.Type {
		case string(fsm.CmdCreateToken):
			if en.Actor == "admin" {
				mints++
				assert.True(t, strings.HasPrefix(en.Source, "127.0.0.1"), en.Source)
			}
		case string(fsm.CmdCreateDatabase):
			creates++
			assert.True(t, strings.HasPrefix(en.Actor, "token:"), en.Actor)
		}
	}
	assert.GreaterOrEqual(t, mints, 4)
	assert.Equal(t, 2, creates)
}
