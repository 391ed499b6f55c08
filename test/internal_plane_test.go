package test

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/internal/pki"
	"github.com/shoaldb/shoal/raftmeta"
	"github.com/shoaldb/shoal/raftmeta/fsm"
	"github.com/shoaldb/shoal/test/harness"
)

// TestInternalPlaneRefusesStrangers: the issue-14 attacks on the internal
// plane, against real processes over mutual TLS. With no certificate,
// plain HTTP, or a certificate of another CA, the catalog and the object
// host answer nothing; with a valid certificate of the wrong role, each
// internal endpoint refuses (a pipeline node cannot query a tenant's
// database or read token records, a host cannot mint an admin token or
// restore the catalog, an edge cannot take a backup); the right roles work.
func TestInternalPlaneRefusesStrangers(t *testing.T) {
	c := newLostHostCluster(t, "default")
	c.startHost(t, "h1")
	c.setupAccount(t)
	u, err := c.create("plane")
	require.NoError(t, err)
	a, err := c.query(u, "CREATE TABLE secret(v); INSERT INTO secret VALUES ('tenant data')")
	require.NoError(t, err)
	require.Equal(t, 200, a.Status, "%s", a.Raw)
	d, err := c.cat.Database(t.Context(), u, raftmeta.LinearizableRead())
	require.NoError(t, err)
	hostBase, catBase := "https://"+c.hostAddr["h1"], "https://"+c.catAddr
	queryPath := "/v1/objects/" + d.ObjectID + "/query"
	queryBody := []byte(`{"sql":"SELECT v FROM secret"}`)

	do := func(hc *http.Client, method, url string, body []byte) (int, string, error) {
		req, err := http.NewRequest(method, url, bytes.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("X-Shoal-Database", u)
		req.Header.Set("X-Shoal-Account", c.acct)
		resp, err := hc.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		var b bytes.Buffer
		_, _ = b.ReadFrom(resp.Body)
		return resp.StatusCode, b.String(), nil
	}

	// Nothing without a certificate of this cluster.
	plain := &http.Client{Timeout: 5 * time.Second}
	for _, url := range []string{"http://" + c.hostAddr["h1"] + queryPath, "http://" + c.catAddr + "/v1/hosts"} {
		code, body, err := do(plain, "POST", url, queryBody)
		if err == nil {
			assert.NotEqual(t, 200, code)
			assert.NotContains(t, body, "tenant data")
		}
	}
	noCert := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	_, _, err = do(noCert, "POST", hostBase+queryPath, queryBody)
	assert.Error(t, err, "a TLS client without a certificate")
	stranger := harness.NewPKI(t).HTTPClient(t, "x", pki.AllRoles...)
	_, _, err = do(stranger, "POST", hostBase+queryPath, queryBody)
	assert.Error(t, err, "a certificate of another CA, even with every role")
	_, _, err = do(stranger, "GET", catBase+"/v1/hosts", nil)
	assert.Error(t, err)

	// Valid certificates of the wrong role.
	pipeline := c.pki.HTTPClient(t, "p1", pki.RolePipeline)
	hostCert := c.pki.HTTPClient(t, "h9", pki.RoleHost)
	edgeCert := c.pki.HTTPClient(t, "e9", pki.RoleEdge)
	code, body, err := do(pipeline, "POST", hostBase+queryPath, queryBody)
	require.NoError(t, err)
	assert.Equal(t, http.StatusForbidden, code)
	assert.NotContains(t, body, "tenant data")
	code, _, err = do(pipeline, "GET", catBase+"/v1/tokens/"+strings.Repeat("a", 64), nil)
	require.NoError(t, err)
	assert.Equal(t, http.StatusForbidden, code, "token records are the edges'")
	mint, err := fsm.NewCommand(fsm.CmdCreateToken, "rogue-1", time.Now().UnixNano(), fsm.CreateToken{ID: "rogue", Hash: strings.Repeat("b", 64), Name: "r", Admin: true})
	require.NoError(t, err)
	mintBody, _ := json.Marshal(mint)
	code, body, err = do(hostCert, "POST", catBase+"/v1/apply", mintBody)
	require.NoError(t, err)
	assert.Equal(t, http.StatusForbidden, code, "a host minting an admin token: %s", body)
	batchBody, _ := json.Marshal(raftmeta.ApplyBatchRequest{Commands: []fsm.Command{mint}})
	code, body, err = do(hostCert, "POST", catBase+"/v1/apply-batch", batchBody)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `"code":"forbidden"`, "a host minting an admin token in a batch: %s", body)
	assert.NotContains(t, body, `"result"`, "nothing applied: %s", body)
	code, _, err = do(pipeline, "POST", hostBase+"/v1/batch/init", []byte(`{"inits":[]}`))
	require.NoError(t, err)
	assert.Equal(t, http.StatusForbidden, code, "batched inits are the edges'")
	code, _, err = do(hostCert, "POST", catBase+"/v1/cluster/restore", []byte("x"))
	require.NoError(t, err)
	assert.Equal(t, http.StatusForbidden, code)
	code, _, err = do(edgeCert, "GET", catBase+"/v1/cluster/backup", nil)
	require.NoError(t, err)
	assert.Equal(t, http.StatusForbidden, code)
	code, _, err = do(edgeCert, "POST", catBase+"/v1/cluster/join", []byte(`{"id":"rogue","raft_addr":"127.0.0.1:1","voter":true}`))
	require.NoError(t, err)
	assert.Equal(t, http.StatusForbidden, code, "only catalog voters and operators join")

	// The right role.
	code, body, err = do(edgeCert, "POST", hostBase+queryPath, queryBody)
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, "tenant data")
	code, _, err = do(c.ops, "GET", catBase+"/v1/cluster/backup", nil)
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, code)
}

// TestProfilesForOperatorsOnly: /debug/pprof/ on the catalog, the object
// host and the edge's --debug-addr, as processes over mutual TLS, gives an
// operator's certificate a profile and refuses everyone else: no answer
// without a certificate of the cluster (plain HTTP, TLS without a client
// certificate), 403 to other roles; the edge's public D1 API has no such
// route at all.
func TestProfilesForOperatorsOnly(t *testing.T) {
	c := newLostHostCluster(t, "default")
	c.startHost(t, "h1")
	bases := map[string]string{"catalog": c.catAddr, "host": c.hostAddr["h1"], "edge --debug-addr": c.edgeDebug}
	get := func(hc *http.Client, url string) (int, []byte, error) {
		resp, err := hc.Get(url)
		if err != nil {
			return 0, nil, err
		}
		defer resp.Body.Close()
		var b bytes.Buffer
		_, err = b.ReadFrom(resp.Body)
		return resp.StatusCode, b.Bytes(), err
	}
	edgeCert := c.pki.HTTPClient(t, "e9", pki.RoleEdge)
	hostCert := c.pki.HTTPClient(t, "h9", pki.RoleHost)
	plain := &http.Client{Timeout: 5 * time.Second}
	noCert := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	for role, addr := range bases {
		code, body, err := get(c.ops, "https://"+addr+"/debug/pprof/profile?seconds=1")
		require.NoError(t, err, role)
		require.Equal(t, http.StatusOK, code, "%s: %s", role, body)
		require.Greater(t, len(body), 2, role)
		assert.Equal(t, []byte{0x1f, 0x8b}, body[:2], "%s: a CPU profile is gzipped protobuf", role)
		code, body, err = get(c.ops, "https://"+addr+"/debug/pprof/goroutine?debug=1")
		require.NoError(t, err, role)
		require.Equal(t, http.StatusOK, code, role)
		assert.Contains(t, string(body), "goroutine profile", role)

		for name, hc := range map[string]*http.Client{"edge": edgeCert, "host": hostCert} {
			code, body, err = get(hc, "https://"+addr+"/debug/pprof/goroutine?debug=1")
			require.NoError(t, err, role)
			assert.Equal(t, http.StatusForbidden, code, "%s, %s certificate: %s", role, name, body)
			assert.NotContains(t, string(body), "goroutine profile")
		}
		code, body, err = get(plain, "http://"+addr+"/debug/pprof/goroutine?debug=1")
		if err == nil {
			assert.NotEqual(t, http.StatusOK, code, role)
			assert.NotContains(t, string(body), "goroutine profile", role)
		}
		_, _, err = get(noCert, "https://"+addr+"/debug/pprof/goroutine?debug=1")
		assert.Error(t, err, "%s: a TLS client without a certificate", role)
	}
	code, body, err := get(plain, c.edgeURL+"/debug/pprof/goroutine?debug=1")
	require.NoError(t, err)
	assert.Equal(t, http.StatusNotFound, code, "the public API serves no profiles")
	assert.NotContains(t, string(body), "goroutine profile")
}
