package raftmeta

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/raftmeta/fsm"
)

func TestHTTPBadInputIsRefusedAndCatalogUnchanged(t *testing.T) {
	tc := newTestCluster(t, 3, nil)
	leader := tc.waitLeader()
	f := tc.follower()
	ctx := t.Context()
	_, err := leader.Apply(ctx, cmd(t, fsm.CmdCreateAccount, newAccount("acct", 10)))
	require.NoError(t, err)
	_, err = leader.ReadBarrier(ctx, LinearizableRead())
	require.NoError(t, err)
	before := catalogDump(t, leader)

	longName := strings.Repeat("a", 65)
	okDB := newDB("acct")
	mk := func(c fsm.Command) string { b, _ := json.Marshal(c); return string(b) }
	withName := okDB
	withName.Name = longName
	badUUID := okDB
	badUUID.UUID = "6F9619FF-8B86-D011-B42D-00C04FC964FF"
	future := cmd(t, fsm.CmdCreateDatabase, okDB)
	future.Version = 99

	cases := []struct {
		name, method, path, body string
		status                   int
		code                     string
	}{
		{"malformed json", "POST", "/v1/apply", `{"v":1,"type":`, 400, fsm.CodeInvalid},
		{"trailing data", "POST", "/v1/apply", mk(cmd(t, fsm.CmdCreateDatabase, okDB)) + `{}`, 400, fsm.CodeInvalid},
		{"unknown field", "POST", "/v1/apply", `{"v":1,"type":"noop","rid":"x","ts":1,"body":{},"evil":1}`, 400, fsm.CodeInvalid},
		{"unknown version", "POST", "/v1/apply", mk(future), 400, fsm.CodeUnsupportedVersion},
		{"unknown command", "POST", "/v1/apply", mk(cmd(t, "drop_everything", struct{}{})), 400, fsm.CodeUnknownCommand},
		{"oversized name", "POST", "/v1/apply", mk(cmd(t, fsm.CmdCreateDatabase, withName)), 400, fsm.CodeInvalid},
		{"non-canonical uuid in command", "POST", "/v1/apply", mk(cmd(t, fsm.CmdCreateDatabase, badUUID)), 400, fsm.CodeInvalid},
		{"oversized body", "POST", "/v1/apply", `{"v":1,"type":"noop","rid":"` + strings.Repeat("x", maxBodyBytes) + `"}`, 413, CodeTooLarge},
		{"invalid uuid in path", "GET", "/v1/databases/not-a-uuid", "", 400, fsm.CodeInvalid},
		{"uppercase uuid in path", "GET", "/v1/databases/6F9619FF-8B86-D011-B42D-00C04FC964FF", "", 400, fsm.CodeInvalid},
		{"unknown consistency", "GET", "/v1/databases/" + okDB.UUID + "?consistency=eventual", "", 400, fsm.CodeInvalid},
		{"bad max_stale", "GET", "/v1/databases/" + okDB.UUID + "?consistency=stale&max_stale=soon", "", 400, fsm.CodeInvalid},
		{"oversized account id", "GET", "/v1/accounts/" + strings.Repeat("x", 65), "", 400, fsm.CodeInvalid},
		{"negative page", "GET", "/v1/accounts/acct/databases?page=-1", "", 400, fsm.CodeInvalid},
		{"heartbeat bad uuid", "POST", "/v1/heartbeat", `{"uuids":["nope"]}`, 400, fsm.CodeInvalid},
		{"heartbeat malformed", "POST", "/v1/heartbeat", `{"uuids":`, 400, fsm.CodeInvalid},
		{"join malformed", "POST", "/v1/cluster/join", `[]`, 400, fsm.CodeInvalid},
		{"unknown endpoint", "GET", "/v1/nope", "", 404, fsm.CodeNotFound},
		{"missing database", "GET", "/v1/databases/00000000-0000-4000-8000-000000000000", "", 404, fsm.CodeNotFound},
	}
	for _, node := range []*Node{leader, f} {
		for _, c := range cases {
			t.Run(node.ID()+"/"+c.name, func(t *testing.T) {
				var body io.Reader
				if c.body != "" {
					body = strings.NewReader(c.body)
				}
				req, err := http.NewRequest(c.method, "http://"+node.HTTPAddr()+c.path, body)
				require.NoError(t, err)
				resp, err := http.DefaultClient.Do(req)
				require.NoError(t, err)
				defer resp.Body.Close()
				var w struct {
					Error wireError `json:"error"`
				}
				raw, _ := io.ReadAll(resp.Body)
				require.NoError(t, json.Unmarshal(raw, &w), "body %s", raw)
				assert.Equal(t, c.status, resp.StatusCode, "body %s", raw)
				assert.Equal(t, c.code, w.Error.Code, "body %s", raw)
				assert.NotEmpty(t, w.Error.Message)
			})
		}
	}
	_, err = leader.ReadBarrier(ctx, LinearizableRead())
	require.NoError(t, err)
	assert.Equal(t, before, catalogDump(t, leader), "refused input changed the catalog")

	// A follower answers a forwarded leader-only request with the leader's name.
	req, _ := http.NewRequest("POST", "http://"+f.HTTPAddr()+"/v1/apply", bytes.NewReader([]byte(mk(cmd(t, fsm.CmdNoop, struct{}{})))))
	req.Header.Set(headerForwarded, "test")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	var w struct {
		Error wireError `json:"error"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&w))
	resp.Body.Close()
	assert.Equal(t, CodeNotLeader, w.Error.Code)
	assert.Equal(t, leader.HTTPAddr(), w.Error.Leader)
}

func TestHTTPHealthReadyMetrics(t *testing.T) {
	tc := newTestCluster(t, 3, nil)
	for _, n := range tc.nodes {
		require.Eventually(t, func() bool { ok, _ := n.Ready(); return ok }, 10e9, 20e6)
		for _, p := range []string{"/healthz", "/readyz"} {
			resp, err := http.Get("http://" + n.HTTPAddr() + p)
			require.NoError(t, err)
			resp.Body.Close()
			assert.Equal(t, 200, resp.StatusCode, p)
		}
		resp, err := http.Get("http://" + n.HTTPAddr() + "/metrics")
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for _, m := range []string{"shoal_raftmeta_term", "shoal_raftmeta_commit_index", "shoal_raftmeta_applied_index",
			"shoal_raftmeta_state", "shoal_raftmeta_last_contact_seconds"} {
			assert.Contains(t, string(b), m)
		}
	}
	leader := tc.waitLeader()
	resp, err := http.Get("http://" + leader.HTTPAddr() + "/metrics")
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Contains(t, string(b), "shoal_raftmeta_apply_duration_seconds_bucket")
	assert.Contains(t, string(b), "shoal_raftmeta_fsm_batch_entries_bucket")
	assert.Contains(t, string(b), "shoal_raftmeta_is_leader 1")
}
