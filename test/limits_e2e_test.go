package test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/shoaldb/shoal/pipeline"
	"github.com/shoaldb/shoal/pipeline/broker"
	"github.com/shoaldb/shoal/pipeline/event"
	"github.com/shoaldb/shoal/raftmeta"
	"github.com/shoaldb/shoal/raftmeta/fsm"
	"github.com/shoaldb/shoal/test/harness"
)

// limitsCluster is a catalog node, an object host consuming the limits
// topic (--kafka-brokers) and an edge, as processes, around a broker over
// TCP that the test publishes the limiter's records to.
type limitsCluster struct {
	edgeURL, admin, hostURL, catAddr string
	host                             *harness.Proc
	kcl                              *kgo.Client
	seq                              uint64
}

func newLimitsCluster(t *testing.T) *limitsCluster {
	bin := shoalBin.Path(t)
	dir := t.TempDir()
	b, err := broker.Start(broker.Config{DataDir: filepath.Join(dir, "kafka")})
	require.NoError(t, err)
	t.Cleanup(b.Close)
	c := &limitsCluster{admin: "limits-admin-token"}
	c.kcl, err = kgo.NewClient(kgo.SeedBrokers(b.Addr()))
	require.NoError(t, err)
	t.Cleanup(c.kcl.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	require.NoError(t, pipeline.EnsureTopics(ctx, c.kcl)) // as the limiter and the plane do at start

	c.catAddr = harness.FreeAddr(t)
	cat := harness.StartProc(t, bin, "n1", "raftmeta", "serve", "--insecure", "--id", "n1", "--dir", filepath.Join(dir, "n1"),
		"--raft-addr", harness.FreeAddr(t), "--http-addr", c.catAddr, "--bootstrap", "--log-level", "warn")
	harness.WaitHTTP200(t, "http://"+c.catAddr+"/readyz", 30*time.Second, "catalog never ready: %s", cat.Log)
	hostAddr := harness.FreeAddr(t)
	c.hostURL = "http://" + hostAddr
	c.host = harness.StartProc(t, bin, "h1", "objecthost", "serve", "--insecure", "--id", "h1", "--dir", filepath.Join(dir, "h1"),
		"--http-addr", hostAddr, "--region", "weur", "--catalog", c.catAddr, "--kafka-brokers", b.Addr(),
		"--heartbeat-interval", "1s", "--log-level", "warn")
	edgeAddr := harness.FreeAddr(t)
	c.edgeURL = "http://" + edgeAddr
	edge := harness.StartProc(t, bin, "e1", "edge", "serve", "--insecure", "--http-addr", edgeAddr, "--dir", filepath.Join(dir, "e1"),
		"--region", "weur", "--catalog", c.catAddr, "--admin-token", c.admin, "--kafka-brokers", b.Addr(),
		"--account-rate", "100000", "--database-rate", "100000", "--log-level", "warn")
	harness.WaitHTTP200(t, c.hostURL+"/healthz", 30*time.Second, "host never healthy: %s", c.host.Log)
	harness.WaitHTTP200(t, c.edgeURL+"/healthz", 30*time.Second, "edge never healthy: %s", edge.Log)
	return c
}

type limitsDB struct{ acct, token, uuid string }

// account creates an account (limits, when given, replace the tier's) with
// n databases holding a table t.
func (c *limitsCluster) account(t *testing.T, name string, limits *fsm.Limits, n int) []limitsDB {
	t.Helper()
	body := map[string]any{"name": name, "tier": "free"}
	if limits != nil {
		body["limits"] = limits
	}
	a := harness.Call(t, http.MethodPost, c.edgeURL+"/admin/v1/accounts", "Bearer "+c.admin, body)
	require.Equal(t, http.StatusOK, a.Status, "%s", a.Raw)
	var ac struct{ ID string }
	require.NoError(t, json.Unmarshal(a.Result, &ac))
	tok := harness.Call(t, http.MethodPost, c.edgeURL+"/admin/v1/accounts/"+ac.ID+"/tokens", "Bearer "+c.admin, map[string]any{"name": "t"})
	require.Equal(t, http.StatusOK, tok.Status, "%s", tok.Raw)
	var tk struct{ Token string }
	require.NoError(t, json.Unmarshal(tok.Result, &tk))
	var out []limitsDB
	for i := range n {
		cr := harness.Call(t, http.MethodPost, c.edgeURL+"/client/v4/accounts/"+ac.ID+"/d1/database", "Bearer "+tk.Token, map[string]any{"name": fmt.Sprintf("db-%d", i)})
		require.Equal(t, http.StatusOK, cr.Status, "%s", cr.Raw)
		var d struct{ UUID string }
		require.NoError(t, json.Unmarshal(cr.Result, &d))
		db := limitsDB{acct: ac.ID, token: tk.Token, uuid: d.UUID}
		a := c.query(t, db, "CREATE TABLE t(id INTEGER PRIMARY KEY, v); INSERT INTO t(v) VALUES (1), (2)")
		require.Equal(t, http.StatusOK, a.Status, "%s", a.Raw)
		out = append(out, db)
	}
	return out
}

func (c *limitsCluster) query(t *testing.T, db limitsDB, sql string) harness.Answer {
	t.Helper()
	return harness.Call(t, http.MethodPost, c.edgeURL+"/client/v4/accounts/"+db.acct+"/d1/database/"+db.uuid+"/query",
		"Bearer "+db.token, map[string]any{"sql": sql})
}

// publish writes the limiter's record for an account (nil: a tombstone).
func (c *limitsCluster) publish(t *testing.T, acct string, until time.Time) {
	t.Helper()
	rec := &kgo.Record{Topic: event.TopicLimits, Key: []byte(acct)}
	if !until.IsZero() {
		c.seq++
		v, err := event.Encode(event.Limit{V: event.Version, EventID: event.ID{Producer: "test-limiter", Seq: c.seq},
			AccountID: acct, Reason: "rows_written_per_day", UntilMs: until.UnixMilli(), Time: time.Now().UnixMilli()})
		require.NoError(t, err)
		rec.Value = v
	}
	require.NoError(t, c.kcl.ProduceSync(context.Background(), rec).FirstErr())
}

func rowLimited(a harness.Answer) bool {
	return a.Status == http.StatusTooManyRequests && len(a.Errors) > 0 && a.Errors[0].Code == 7505
}

// waitFor polls the query until done holds, up to 30 s; it returns how long
// that took after start.
func (c *limitsCluster) waitFor(t *testing.T, db limitsDB, sql string, start time.Time, what string, done func(harness.Answer) bool) time.Duration {
	t.Helper()
	var last harness.Answer
	for time.Since(start) < 30*time.Second {
		if last = c.query(t, db, sql); done(last) {
			return time.Since(start)
		}
		time.Sleep(2 * time.Millisecond) // poll interval of a wait for the condition above (the event itself)
	}
	t.Fatalf("%s: not within 30 s; last answer %d %s", what, last.Status, last.Raw)
	return 0
}

func durQuantiles(ds []time.Duration) string {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	q := func(p float64) time.Duration { return s[min(len(s)-1, int(p*float64(len(s))))] }
	return fmt.Sprintf("p50 %v p99 %v max %v (n=%d)", q(0.5).Round(100*time.Microsecond), q(0.99).Round(100*time.Microsecond), s[len(s)-1].Round(100*time.Microsecond), len(s))
}

// TestRowLimitFlagRefusesThroughEdge: a limit record on the limits topic
// makes the object host (a process consuming the topic) refuse the
// account's queries through the edge with D1's daily-limit error naming the
// limit and when it lifts; other accounts are unaffected; a kill -9 and
// restart of the host keeps refusing; a tombstone unblocks. Latencies are
// measured and logged (not asserted).
func TestRowLimitFlagRefusesThroughEdge(t *testing.T) {
	c := newLimitsCluster(t)
	limited := c.account(t, "limited", nil, 1)[0]
	other := c.account(t, "other", nil, 1)[0]
	now := time.Now().UTC()
	endOfDay := time.Date(now.Year(), now.Month(), now.Day()+1, 0, 0, 0, 0, time.UTC)

	var block, unblock []time.Duration
	for range 30 {
		start := time.Now()
		c.publish(t, limited.acct, endOfDay)
		block = append(block, c.waitFor(t, limited, "SELECT count(*) FROM t", start, "refused after the limit record", rowLimited))
		start = time.Now()
		c.publish(t, limited.acct, time.Time{})
		unblock = append(unblock, c.waitFor(t, limited, "SELECT count(*) FROM t", start, "unblocked after the tombstone",
			func(a harness.Answer) bool { return a.Status == http.StatusOK }))
	}
	t.Logf("limit record → refused through the edge: %s", durQuantiles(block))
	t.Logf("tombstone → unblocked through the edge: %s", durQuantiles(unblock))

	c.publish(t, limited.acct, endOfDay)
	c.waitFor(t, limited, "SELECT 1", time.Now(), "refused", rowLimited)
	a := c.query(t, limited, "INSERT INTO t(v) VALUES (3)")
	require.True(t, rowLimited(a), "%d %s", a.Status, a.Raw)
	msg := a.Errors[0].Message
	assert.Contains(t, msg, "rows written per day limit")
	assert.Contains(t, msg, "lifts at "+endOfDay.Format(time.RFC3339))
	assert.False(t, a.Success)
	ok := c.query(t, other, "INSERT INTO t(v) VALUES (3)")
	assert.Equal(t, http.StatusOK, ok.Status, "another account is unaffected: %s", ok.Raw)

	// kill -9 and restart while limited: the restarted host re-reads the
	// topic before it serves, so its first answers already refuse.
	c.host.Restart(t, 0)
	harness.WaitHTTP200(t, c.hostURL+"/healthz", 30*time.Second, "host never healthy after restart: %s", c.host.Log)
	var first harness.Answer
	for range 100 { // the edge may need a retry while its connection to the old process dies
		first = c.query(t, limited, "SELECT count(*) FROM t")
		if first.Status != http.StatusServiceUnavailable && first.Status != http.StatusBadGateway && first.Status != http.StatusInternalServerError {
			break
		}
		time.Sleep(20 * time.Millisecond) // retry interval while the host restarts
	}
	assert.True(t, rowLimited(first), "after a restart the account is still refused: %d %s", first.Status, first.Raw)
	ok = c.query(t, other, "SELECT count(*) FROM t")
	assert.Equal(t, http.StatusOK, ok.Status, "%s", ok.Raw)

	start := time.Now()
	c.publish(t, limited.acct, time.Time{})
	took := c.waitFor(t, limited, "INSERT INTO t(v) VALUES (4)", start, "unblocked after restart",
		func(a harness.Answer) bool { return a.Status == http.StatusOK })
	t.Logf("after the restart, tombstone → unblocked: %v", took)
}

// TestStorageLimitBlocksGrowthOnEveryDatabase: an account over its storage
// limit (the catalog's drained total, read by heartbeats) cannot INSERT or
// CREATE TABLE on any of its databases but can SELECT and DELETE, and
// writes resume by the next heartbeat once the total is back under.
// Sizes are driven through the catalog's SetDatabaseStats (what the storage
// consumer does with the hosts' measurements): no pipeline role runs here.
func TestStorageLimitBlocksGrowthOnEveryDatabase(t *testing.T) {
	c := newLimitsCluster(t)
	limits := fsm.Limits{MaxDatabases: 10, MaxStorageBytes: 100_000, MaxDatabaseBytes: 500 << 20,
		RowsReadPerDay: 5_000_000, RowsWrittenPerDay: 100_000}
	dbs := c.account(t, "full", &limits, 3)
	other := c.account(t, "roomy", &limits, 1)[0]
	cat, err := raftmeta.NewClient([]string{c.catAddr})
	require.NoError(t, err)
	defer cat.Close()
	setSizes := func(size int64, seq int64) {
		var stats []fsm.DatabaseStat
		for _, d := range dbs {
			stats = append(stats, fsm.DatabaseStat{UUID: d.uuid, SizeBytes: size, Seq: seq})
		}
		_, err := cat.SetDatabaseStats(context.Background(), stats)
		require.NoError(t, err)
	}
	storageRefused := func(a harness.Answer) bool {
		return a.Status == http.StatusBadRequest && len(a.Errors) > 0 && a.Errors[0].Code == 7504 &&
			strings.Contains(a.Errors[0].Message, "the account is over its storage limit")
	}

	start := time.Now()
	setSizes(50_000, time.Now().UnixNano()) // 150,000 bytes > 100,000
	took := c.waitFor(t, dbs[0], "INSERT INTO t(v) VALUES (10)", start, "INSERT refused over the storage limit", storageRefused)
	t.Logf("account total over the limit → INSERT refused: %v", took)
	for _, d := range dbs {
		c.waitFor(t, d, "INSERT INTO t(v) VALUES (10)", time.Now(), "INSERT refused on every database", storageRefused)
		a := c.query(t, d, "CREATE TABLE u(x)")
		assert.True(t, storageRefused(a), "CREATE TABLE refused: %d %s", a.Status, a.Raw)
		a = c.query(t, d, "SELECT count(*) AS n FROM t")
		assert.Equal(t, http.StatusOK, a.Status, "SELECT works: %s", a.Raw)
		a = c.query(t, d, "DELETE FROM t WHERE v = 1")
		assert.Equal(t, http.StatusOK, a.Status, "DELETE works: %s", a.Raw)
	}
	a := c.query(t, other, "INSERT INTO t(v) VALUES (10)")
	assert.Equal(t, http.StatusOK, a.Status, "another account is unaffected: %s", a.Raw)

	// After deleting, the measured sizes drop below the limit.
	start = time.Now()
	setSizes(10_000, time.Now().UnixNano())
	took = c.waitFor(t, dbs[0], "INSERT INTO t(v) VALUES (11)", start, "writes resume under the limit",
		func(a harness.Answer) bool { return a.Status == http.StatusOK })
	t.Logf("account total back under → INSERT accepted: %v", took)
	for _, d := range dbs {
		c.waitFor(t, d, "CREATE TABLE IF NOT EXISTS u(x)", time.Now(), "CREATE TABLE resumes on every database",
			func(a harness.Answer) bool { return a.Status == http.StatusOK })
	}
}
