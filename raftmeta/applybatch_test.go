package raftmeta

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// A batch of creates: each command has its own outcome — refusals (name
// taken inside the batch, the account's limit, an unknown account) are
// given to their creates only, the others commit — and a retry of the same
// commands (same request IDs, an unknown outcome retried) applies nothing
// twice. Sent to a follower, so the batch is forwarded to the leader.
func TestApplyBatchMixedRefusalsAndIdempotentRetry(t *testing.T) {
	tc := newTestCluster(t, 3, nil)
	leader := tc.waitLeader()
	ctx := context.Background()
	_, err := leader.Apply(ctx, cmd(t, fsm.CmdCreateAccount, newAccount("acct", 3)))
	require.NoError(t, err)
	cl, err := NewClient([]string{tc.follower().HTTPAddr()}, WithCacheTTL(0))
	require.NoError(t, err)
	defer cl.Close()

	dup := newDB("acct")
	dup2 := newDB("acct")
	dup2.Name = dup.Name // name taken by the create before it in the same batch
	a, b := newDB("acct"), newDB("acct")
	over := newDB("acct") // the account's 4th: over its limit of 3
	ghost := newDB("nobody")
	creates := []fsm.CreateDatabase{dup, dup2, a, ghost, b, over}
	var cmds []fsm.Command
	for _, d := range creates {
		cmds = append(cmds, cmd(t, fsm.CmdCreateDatabase, d))
	}
	res, errs := cl.ApplyBatch(ctx, cmds)
	require.Len(t, errs, len(cmds))
	require.NoError(t, errs[0])
	require.ErrorIs(t, errs[1], fsm.ErrNameTaken)
	require.NoError(t, errs[2])
	require.ErrorIs(t, errs[3], fsm.ErrAccountNotFound)
	require.NoError(t, errs[4])
	require.ErrorIs(t, errs[5], fsm.ErrDatabaseLimit)
	var got fsm.Database
	require.NoError(t, json.Unmarshal(res[2].Value, &got))
	assert.Equal(t, a.UUID, got.UUID)
	// Consecutive entries: the batch went to Raft together.
	assert.Equal(t, res[0].Index+2, res[2].Index)

	// The same commands again (a client retrying after a lost answer):
	// every one is answered from the dedupe memory, nothing applies again.
	res2, errs2 := cl.ApplyBatch(ctx, cmds)
	for i := range cmds {
		assert.Equal(t, errs[i] == nil, errs2[i] == nil, "command %d", i)
		assert.Equal(t, res[i].Index, res2[i].Index, "command %d answered from its first application", i)
	}
	acct, err := cl.Account(ctx, "acct", LinearizableRead())
	require.NoError(t, err)
	assert.EqualValues(t, 3, acct.ActiveDatabases)

	// One of them retried alone through /v1/apply (same request ID): the
	// same answer.
	r, err := cl.Apply(ctx, cmds[2])
	require.NoError(t, err)
	assert.Equal(t, res[2].Index, r.Index)
}

// CreateDatabases is the typed batch: the i-th answer is the i-th create's.
func TestClientCreateDatabases(t *testing.T) {
	tc := newTestCluster(t, 3, nil)
	cl, err := NewClient(tc.addrs(), WithCacheTTL(0))
	require.NoError(t, err)
	defer cl.Close()
	ctx := context.Background()
	_, err = cl.CreateAccount(ctx, newAccount("acct", 100))
	require.NoError(t, err)
	creates := make([]fsm.CreateDatabase, 40)
	for i := range creates {
		creates[i] = newDB("acct")
	}
	creates[7].Name = creates[3].Name
	dbs, errs := cl.CreateDatabases(ctx, creates)
	for i := range creates {
		if i == 7 {
			require.ErrorIs(t, errs[i], fsm.ErrNameTaken)
			continue
		}
		require.NoError(t, errs[i], "create %d", i)
		assert.Equal(t, creates[i].UUID, dbs[i].UUID)
		assert.Equal(t, creates[i].Name, dbs[i].Name)
	}
	want := catalogDump(t, tc.waitLeader())
	for _, n := range tc.nodes {
		require.Eventually(t, func() bool { return catalogDump(t, n) == want }, 10*time.Second, 20*time.Millisecond, n.ID())
	}
}

// A node of an older build has no /v1/apply-batch (404): the client sends
// the commands one by one through /v1/apply instead, with the same
// request IDs and outcomes.
func TestApplyBatchFallsBackOnOlderNodes(t *testing.T) {
	tc := newTestCluster(t, 3, nil)
	leader := tc.waitLeader()
	ctx := context.Background()
	_, err := leader.Apply(ctx, cmd(t, fsm.CmdCreateAccount, newAccount("acct", 100)))
	require.NoError(t, err)
	target, err := url.Parse("http://" + leader.HTTPAddr())
	require.NoError(t, err)
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.ModifyResponse = func(r *http.Response) error { // keep the client on the old node
		r.Header.Del(headerLeader)
		return nil
	}
	var singles atomic.Int64
	old := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/apply-batch": // what an older build's router answers
			writeJSON(w, 404, map[string]wireError{"error": {Code: fsm.CodeNotFound, Message: "no such endpoint: " + r.URL.Path}})
		case "/v1/apply":
			singles.Add(1)
			proxy.ServeHTTP(w, r)
		default:
			proxy.ServeHTTP(w, r)
		}
	}))
	defer old.Close()
	cl, err := NewClient([]string{strings.TrimPrefix(old.URL, "http://")}, WithCacheTTL(0))
	require.NoError(t, err)
	defer cl.Close()
	a, b := newDB("acct"), newDB("acct")
	b.Name = a.Name
	_, errs := cl.CreateDatabases(ctx, []fsm.CreateDatabase{a, b, newDB("acct")})
	// One by one they run concurrently: which of the two creates of one
	// name wins is not the batch's order any more, but exactly one does.
	if errs[0] == nil {
		require.ErrorIs(t, errs[1], fsm.ErrNameTaken)
	} else {
		require.ErrorIs(t, errs[0], fsm.ErrNameTaken)
		require.NoError(t, errs[1])
	}
	require.NoError(t, errs[2])
	assert.EqualValues(t, 3, singles.Load())
}

// Bad batches are refused whole with a clear error and apply nothing:
// malformed JSON, no commands, more than MaxApplyBatch, an unknown field.
func TestApplyBatchRefusesBadRequests(t *testing.T) {
	tc := newTestCluster(t, 1, nil)
	leader := tc.waitLeader()
	post := func(body string) (int, string) {
		t.Helper()
		resp, err := http.Post("http://"+leader.HTTPAddr()+"/v1/apply-batch", "application/json", strings.NewReader(body))
		require.NoError(t, err)
		defer resp.Body.Close()
		var out struct {
			Error wireError `json:"error"`
		}
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
		return resp.StatusCode, out.Error.Message
	}
	acct, err := json.Marshal(cmd(t, fsm.CmdCreateAccount, newAccount("acct", 1000)))
	require.NoError(t, err)
	many := strings.TrimSuffix(strings.Repeat(string(acct)+",", MaxApplyBatch+1), ",")
	for name, body := range map[string]string{
		"malformed":     `{"commands":[`,
		"empty":         `{"commands":[]}`,
		"too many":      `{"commands":[` + many + `]}`,
		"unknown field": `{"commands":[],"extra":1}`,
	} {
		status, msg := post(body)
		assert.Equal(t, http.StatusBadRequest, status, "%s: %s", name, msg)
		assert.NotEmpty(t, msg, name)
	}
	_, err = leader.cat.Account(context.Background(), "acct")
	assert.ErrorIs(t, err, fsm.ErrAccountNotFound, "nothing applied")
}
