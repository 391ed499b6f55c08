package edge

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// What wrangler reads from the identity endpoints: /memberships[].account.id
// (the account when CLOUDFLARE_ACCOUNT_ID is unset) and roles;
// /user/tokens/verify failing with code 1000 (an account token);
// /user failing with 9109 (no e-mail); /accounts[] id and name.
func TestIdentityEndpoints(t *testing.T) {
	e := newEnv(t)

	a := e.call("GET", "/client/v4/memberships", tokA, nil)
	require.Equal(t, 200, a.Status, "%s", a.Raw)
	var ms []membershipJSON
	require.NoError(t, json.Unmarshal(a.Result, &ms))
	require.Len(t, ms, 1, "exactly the token's own account")
	assert.Equal(t, acctA, ms[0].Account.ID)
	assert.Equal(t, acctA, ms[0].Account.Name)
	assert.Equal(t, "accepted", ms[0].Status)
	assert.Equal(t, []string{"Administrator"}, ms[0].Roles)
	require.NotNil(t, a.ResultInfo)
	assert.Equal(t, int64(1), a.ResultInfo.TotalCount)
	assert.Equal(t, 1, a.ResultInfo.Page)

	// Page 2 is empty, with the same total: wrangler stops paging.
	a = e.call("GET", "/client/v4/memberships?page=2", tokA, nil)
	require.Equal(t, 200, a.Status)
	assert.JSONEq(t, `[]`, string(a.Result))
	a = e.call("GET", "/client/v4/memberships?page=0", tokA, nil)
	assert.Equal(t, 400, a.Status)
	assert.Equal(t, 7400, a.code())

	a = e.call("GET", "/client/v4/accounts", tokB, nil)
	require.Equal(t, 200, a.Status)
	var accts []cfAccountJSON
	require.NoError(t, json.Unmarshal(a.Result, &accts))
	require.Len(t, accts, 1)
	assert.Equal(t, acctB, accts[0].ID, "B's token sees only B")

	a = e.call("GET", "/client/v4/memberships", adminTok, nil)
	require.Equal(t, 200, a.Status)
	assert.JSONEq(t, `[]`, string(a.Result), "the admin token belongs to no account")

	for _, path := range []string{"/client/v4/memberships", "/client/v4/accounts", "/client/v4/user"} {
		a = e.call("GET", path, "", nil)
		assert.Equal(t, 401, a.Status, path)
		assert.Equal(t, 10000, a.code(), path)
		a = e.call("GET", path, "no-such-token", nil)
		assert.Equal(t, 401, a.Status, path)
	}

	a = e.call("GET", "/client/v4/user", tokA, nil)
	assert.Equal(t, 403, a.Status)
	assert.Equal(t, 9109, a.code())

	// A valid token is an account token: the user endpoint does not know it
	// (code 1000, as Cloudflare answers for account tokens), and says where
	// to verify it; an unknown token gets the same code without the hint.
	a = e.call("GET", "/client/v4/user/tokens/verify", tokA, nil)
	assert.Equal(t, 401, a.Status)
	assert.Equal(t, 1000, a.code())
	require.Len(t, a.Messages, 1)
	assert.Contains(t, string(a.Raw), "/accounts/{account_id}/tokens/verify")
	a = e.call("GET", "/client/v4/user/tokens/verify", "no-such-token", nil)
	assert.Equal(t, 401, a.Status)
	assert.Equal(t, 1000, a.code())
	assert.Empty(t, a.Messages)

	a = e.call("GET", "/client/v4/accounts/"+acctA+"/tokens/verify", tokA, nil)
	require.Equal(t, 200, a.Status, "%s", a.Raw)
	var ts tokenStatusJSON
	require.NoError(t, json.Unmarshal(a.Result, &ts))
	assert.Equal(t, tokenStatusJSON{ID: "t-" + tokA, Status: "active"}, ts)
	a = e.call("GET", "/client/v4/accounts/"+acctB+"/tokens/verify", tokA, nil)
	assert.Equal(t, 403, a.Status, "A's token is not B's")
	assert.Equal(t, 7403, a.code())
}
