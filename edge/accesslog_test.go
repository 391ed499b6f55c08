package edge

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/internal/logging"
)

// lockedBuf is a bytes.Buffer safe for the server's goroutines.
type lockedBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// lines returns the JSON records logged with msg "request".
func (l *lockedBuf) requests(t *testing.T) []map[string]any {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for _, ln := range strings.Split(strings.TrimSpace(l.b.String()), "\n") {
		if ln == "" {
			continue
		}
		var rec map[string]any
		require.NoError(t, json.Unmarshal([]byte(ln), &rec), "every line is one JSON object: %q", ln)
		if rec["msg"] == "request" {
			out = append(out, rec)
		}
	}
	return out
}

func (l *lockedBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestAccessLogJSON: one JSON line per request with the route template (not
// the path with its ids), status, D1 error code, duration, account and
// request id, and never the SQL or the token; a 5xx's line is at ERROR and
// carries the reason, which appears nowhere else in the log.
func TestAccessLogJSON(t *testing.T) {
	var buf lockedBuf
	logger, err := logging.New(&buf, "json", "info")
	require.NoError(t, err)
	e := newEnv(t, func(o *Options) { o.Logger = logger })
	d := e.create(acctA, tokA, "db1")

	ok := e.call("POST", dbPath(acctA)+"/"+d.UUID+"/query", tokA, map[string]any{"sql": "SELECT 'secret-literal'"})
	require.Equal(t, 200, ok.Status)
	bad := e.call("POST", dbPath(acctA)+"/"+d.UUID+"/query", tokA, map[string]any{"sql": failingSQL})
	require.Equal(t, 400, bad.Status)
	require.Equal(t, 7500, bad.code())
	lost := e.call("GET", "/client/v4/no/such/thing", tokA, nil)
	require.Equal(t, 404, lost.Status)
	e.cat.mu.Lock()
	for range 8 { // more than the create's attempts
		e.cat.failWrite = append(e.cat.failWrite, errors.New("disk on fire"))
	}
	e.cat.mu.Unlock()
	failed := e.call("POST", dbPath(acctA), tokA, map[string]any{"name": "db2"})
	require.GreaterOrEqual(t, failed.Status, 500, "%s", failed.Raw)

	recs := buf.requests(t)
	byID := map[string]map[string]any{}
	for _, r := range recs {
		byID[r["request_id"].(string)] = r
	}
	line := func(a answer) map[string]any {
		t.Helper()
		r := byID[a.Header.Get(HeaderRequestID)]
		require.NotNil(t, r, "no access line for request %s in:\n%s", a.Header.Get(HeaderRequestID), buf.String())
		return r
	}

	q := line(ok)
	assert.Equal(t, "INFO", q["level"])
	assert.Equal(t, "POST", q["method"])
	assert.Equal(t, "/client/v4/accounts/{account_id}/d1/database/{database_id}/query", q["route"])
	assert.Equal(t, "query", q["endpoint"])
	assert.EqualValues(t, 200, q["status"])
	assert.EqualValues(t, 0, q["code"])
	assert.Equal(t, acctA, q["account"])
	assert.Contains(t, q, "duration_ms")
	assert.IsType(t, float64(0), q["duration_ms"])

	b := line(bad)
	assert.EqualValues(t, 400, b["status"])
	assert.EqualValues(t, 7500, b["code"], "the object host's code, read from its answer")

	n := line(lost)
	assert.Equal(t, "no_route", n["route"])
	assert.EqualValues(t, 7000, n["code"])

	f := line(failed)
	assert.Equal(t, "ERROR", f["level"])
	assert.Equal(t, "/client/v4/accounts/{account_id}/d1/database", f["route"])
	assert.Contains(t, f["err"], "disk on fire")
	assert.Equal(t, 1, strings.Count(buf.String(), "disk on fire"), "a 5xx's reason is logged exactly once:\n%s", buf.String())

	all := buf.String()
	for _, secret := range []string{tokA, "secret-literal", "SELECT", d.UUID} {
		assert.NotContains(t, all, secret, "the access log never carries tokens, SQL or raw paths")
	}
}

// TestRequestMetricsByCode: shoal_edge_requests_total is labelled with the
// D1 error code, and requests no route matched are counted under the
// endpoint "no_route".
func TestRequestMetricsByCode(t *testing.T) {
	e := newEnv(t)
	d := e.create(acctA, tokA, "db1")
	for i := 0; i < 2; i++ {
		a := e.call("POST", dbPath(acctA)+"/"+d.UUID+"/query", tokA, map[string]any{"sql": failingSQL})
		require.Equal(t, 7500, a.code())
	}
	require.Equal(t, 200, e.call("POST", dbPath(acctA)+"/"+d.UUID+"/query", tokA, map[string]any{"sql": "SELECT 1"}).Status)
	require.Equal(t, 404, e.call("GET", "/client/v4/nope", "", nil).Status)
	require.Equal(t, 405, e.call("PUT", dbPath(acctA)+"/"+d.UUID+"/query", tokA, nil).Status)

	reqs := e.srv.m.requests
	assert.Equal(t, 2.0, testutil.ToFloat64(reqs.WithLabelValues("query", "400", "7500")))
	assert.Equal(t, 1.0, testutil.ToFloat64(reqs.WithLabelValues("query", "200", "")))
	assert.Equal(t, 1.0, testutil.ToFloat64(reqs.WithLabelValues(endpointNoRoute, "404", "7000")))
	assert.Equal(t, 1.0, testutil.ToFloat64(reqs.WithLabelValues(endpointNoRoute, "405", "7000")))
}
