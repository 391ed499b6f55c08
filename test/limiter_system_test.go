package test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	gosmtp "github.com/emersion/go-smtp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/limiter"
	"github.com/shoaldb/shoal/pipeline/broker"
	"github.com/shoaldb/shoal/raftmeta"
	"github.com/shoaldb/shoal/raftmeta/fsm"
	"github.com/shoaldb/shoal/test/harness"
)

// The limiter system test: the whole daily-row-limit loop as a cluster runs
// it, every piece a real process or server — a catalog node, two object
// hosts and an edge publishing usage to a Kafka-protocol broker over TCP,
// the pipeline role sinking usage into a clickhouse-server, and two
// `shoal limiter serve` processes sharing one group, mailing a go-smtp
// server and POSTing to an httptest webhook receiver.

const (
	sysLimit       = 2_000 // rows written per day: the free tier's (limiter flag) and each free account's own
	sysHookSecret  = "system-hook-secret"
	sysBulkRows    = 100 // rows per INSERT while driving an account over its limit
	sysWaitBound   = 60 * time.Second
	sysProbePeriod = 5 * time.Millisecond
)

// sysMailbox is a go-smtp server recording every message by recipient.
type sysMailbox struct {
	mu   sync.Mutex
	byTo map[string]int
	all  int
	addr string
}

type sysMailSession struct {
	mb *sysMailbox
	to []string
}

func (s *sysMailSession) Reset()                                 { s.to = nil }
func (s *sysMailSession) Logout() error                          { return nil }
func (s *sysMailSession) Mail(string, *gosmtp.MailOptions) error { return nil }
func (s *sysMailSession) Rcpt(to string, _ *gosmtp.RcptOptions) error {
	s.to = append(s.to, to)
	return nil
}
func (s *sysMailSession) Data(r io.Reader) error {
	if _, err := io.ReadAll(r); err != nil {
		return err
	}
	s.mb.mu.Lock()
	defer s.mb.mu.Unlock()
	s.mb.all++
	for _, to := range s.to {
		s.mb.byTo[to]++
	}
	return nil
}

type sysMailBackend struct{ mb *sysMailbox }

func (b sysMailBackend) NewSession(*gosmtp.Conn) (gosmtp.Session, error) {
	return &sysMailSession{mb: b.mb}, nil
}

func startSysMailbox(t *testing.T) *sysMailbox {
	t.Helper()
	mb := &sysMailbox{byTo: map[string]int{}}
	srv := gosmtp.NewServer(sysMailBackend{mb})
	srv.Domain = "localhost"
	srv.ReadTimeout, srv.WriteTimeout = 10*time.Second, 10*time.Second
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	mb.addr = ln.Addr().String()
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return mb
}

func (mb *sysMailbox) count(rcpt string) int {
	mb.mu.Lock()
	defer mb.mu.Unlock()
	return mb.byTo[rcpt]
}

func (mb *sysMailbox) total() int {
	mb.mu.Lock()
	defer mb.mu.Unlock()
	return mb.all
}

// sysHook is a webhook receiver counting every delivery per account
// (retries included: a second POST for one account and day is a double
// notice) and every bad signature.
type sysHook struct {
	mu      sync.Mutex
	byAcct  map[string][]limiter.WebhookPayload
	badSigs int
	srv     *httptest.Server
}

func startSysHook(t *testing.T) *sysHook {
	t.Helper()
	h := &sysHook{byAcct: map[string][]limiter.WebhookPayload{}}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var p limiter.WebhookPayload
		err := json.Unmarshal(body, &p)
		h.mu.Lock()
		defer h.mu.Unlock()
		if r.Header.Get(limiter.SignatureHeader) != limiter.Sign(sysHookSecret, body) || err != nil {
			h.badSigs++
		}
		h.byAcct[p.AccountID] = append(h.byAcct[p.AccountID], p)
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(h.srv.Close)
	return h
}

func (h *sysHook) of(acct string) []limiter.WebhookPayload {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]limiter.WebhookPayload(nil), h.byAcct[acct]...)
}

type limiterSystem struct {
	edgeURL, admin string
	cat            *raftmeta.Client
	catAddr        string
	hosts          []string // host IDs
	limiters       []*harness.Proc
	limiterURLs    []string
	mail           *sysMailbox
	hook           *sysHook
}

func newLimiterSystem(t *testing.T) *limiterSystem {
	bin := shoalBin.Path(t)
	dir := t.TempDir()
	ch := harness.StartClickHouse(t, filepath.Join(dir, "clickhouse"), 0, 0)
	t.Cleanup(func() { _ = ch.Close() })
	b, err := broker.Start(broker.Config{DataDir: filepath.Join(dir, "kafka")})
	require.NoError(t, err)
	t.Cleanup(b.Close)
	s := &limiterSystem{admin: "limiter-system-admin", hosts: []string{"h1", "h2"}, mail: startSysMailbox(t), hook: startSysHook(t)}
	dsn := "clickhouse://default:@" + ch.Addr() + "/shoal"

	s.catAddr = harness.FreeAddr(t)
	cat := harness.StartProc(t, bin, "n1", "raftmeta", "serve", "--insecure", "--id", "n1", "--dir", filepath.Join(dir, "n1"),
		"--raft-addr", harness.FreeAddr(t), "--http-addr", s.catAddr, "--bootstrap", "--log-level", "warn")
	harness.WaitHTTP200(t, "http://"+s.catAddr+"/readyz", 30*time.Second, "catalog never ready: %s", cat.Log)
	s.cat, err = raftmeta.NewClient([]string{s.catAddr})
	require.NoError(t, err)
	t.Cleanup(s.cat.Close)

	pipeAddr := harness.FreeAddr(t)
	pipe := harness.StartProc(t, bin, "pipeline", "pipeline", "serve", "--insecure", "--http-addr", pipeAddr, "--dir", filepath.Join(dir, "pipeline"),
		"--catalog", s.catAddr, "--kafka-brokers", b.Addr(), "--clickhouse-dsn", dsn, "--log-level", "warn")
	harness.WaitHTTP200(t, "http://"+pipeAddr+"/healthz", 60*time.Second, "pipeline never healthy: %s", pipe.Log)
	for _, id := range s.hosts {
		addr := harness.FreeAddr(t)
		h := harness.StartProc(t, bin, id, "objecthost", "serve", "--insecure", "--id", id, "--dir", filepath.Join(dir, id),
			"--http-addr", addr, "--region", "weur", "--catalog", s.catAddr, "--kafka-brokers", b.Addr(),
			"--heartbeat-interval", "1s", "--log-level", "warn")
		harness.WaitHTTP200(t, "http://"+addr+"/healthz", 30*time.Second, "%s never healthy: %s", id, h.Log)
	}
	require.Eventually(t, func() bool {
		hs, err := s.cat.Hosts(context.Background(), raftmeta.LeaderRead())
		return err == nil && len(hs) == len(s.hosts)
	}, 30*time.Second, 50*time.Millisecond, "both hosts registered")
	edgeAddr := harness.FreeAddr(t)
	s.edgeURL = "http://" + edgeAddr
	edge := harness.StartProc(t, bin, "e1", "edge", "serve", "--insecure", "--http-addr", edgeAddr, "--dir", filepath.Join(dir, "e1"),
		"--region", "weur", "--catalog", s.catAddr, "--admin-token", s.admin, "--kafka-brokers", b.Addr(),
		"--account-rate", "100000", "--database-rate", "100000", "--log-level", "warn")
	harness.WaitHTTP200(t, s.edgeURL+"/healthz", 30*time.Second, "edge never healthy: %s", edge.Log)

	secret := filepath.Join(dir, "hook-secret")
	require.NoError(t, os.WriteFile(secret, []byte(sysHookSecret+"\n"), 0o600))
	for i := range 2 {
		addr := harness.FreeAddr(t)
		l := harness.StartProc(t, bin, fmt.Sprintf("limiter%d", i+1), "limiter", "serve", "--insecure", "--http-addr", addr,
			"--catalog", s.catAddr, "--kafka-brokers", b.Addr(), "--clickhouse-dsn", dsn,
			"--interval", "1s", "--rows-written-per-day", strconv.Itoa(sysLimit),
			"--smtp-addr", s.mail.addr, "--smtp-from", "limits@shoal.test", "--smtp-to", "owner+{account_id}@example.com",
			"--webhook-url", s.hook.srv.URL, "--webhook-secret-file", secret, "--log-level", "warn")
		harness.WaitHTTP200(t, "http://"+addr+"/healthz", 60*time.Second, "limiter %d never healthy: %s", i+1, l.Log)
		s.limiters, s.limiterURLs = append(s.limiters, l), append(s.limiterURLs, "http://"+addr)
	}
	require.Eventually(t, func() bool { return s.activeLimiter() >= 0 }, sysWaitBound, 100*time.Millisecond, "no limiter became active")
	return s
}

// sysMetric reads one unlabelled sample from a /metrics page.
func sysMetric(url, name string) (float64, bool) {
	resp, err := harness.Client().Get(url + "/metrics")
	if err != nil {
		return 0, false
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, false
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			return f, err == nil
		}
	}
	return 0, false
}

// activeLimiter is the index of the one limiter reporting is_active (-1:
// none or both).
func (s *limiterSystem) activeLimiter() int {
	found := -1
	for i, u := range s.limiterURLs {
		if v, ok := sysMetric(u, "shoal_limiter_is_active"); ok && v == 1 {
			if found >= 0 {
				return -1
			}
			found = i
		}
	}
	return found
}

type sysAccount struct {
	id, token, name string
	dbs             map[string][]string // host ID → database UUIDs
}

func (a sysAccount) rcpt() string { return "owner+" + a.id + "@example.com" }

// account creates an account through the admin API with databases on
// both hosts, each holding a table t.
func (s *limiterSystem) account(t *testing.T, name, tier string) sysAccount {
	t.Helper()
	body := map[string]any{"name": name, "tier": tier}
	if tier == fsm.TierFree {
		body["limits"] = fsm.Limits{MaxDatabases: 10, MaxStorageBytes: 5 << 30, MaxDatabaseBytes: 500 << 20,
			RowsReadPerDay: 5_000_000, RowsWrittenPerDay: sysLimit}
	}
	a := harness.Call(t, http.MethodPost, s.edgeURL+"/admin/v1/accounts", "Bearer "+s.admin, body)
	require.Equal(t, http.StatusOK, a.Status, "%s", a.Raw)
	var ac struct{ ID string }
	require.NoError(t, json.Unmarshal(a.Result, &ac))
	tok := harness.Call(t, http.MethodPost, s.edgeURL+"/admin/v1/accounts/"+ac.ID+"/tokens", "Bearer "+s.admin, map[string]any{"name": "t"})
	require.Equal(t, http.StatusOK, tok.Status, "%s", tok.Raw)
	var tk struct{ Token string }
	require.NoError(t, json.Unmarshal(tok.Result, &tk))
	acct := sysAccount{id: ac.ID, token: tk.Token, name: name, dbs: map[string][]string{}}
	for i := 0; i < 10 && (len(acct.dbs[s.hosts[0]]) < 2 || len(acct.dbs[s.hosts[1]]) < 2); i++ {
		cr := harness.Call(t, http.MethodPost, s.edgeURL+"/client/v4/accounts/"+ac.ID+"/d1/database", "Bearer "+tk.Token, map[string]any{"name": fmt.Sprintf("db-%d", i)})
		require.Equal(t, http.StatusOK, cr.Status, "%s", cr.Raw)
		var d struct{ UUID string }
		require.NoError(t, json.Unmarshal(cr.Result, &d))
		rec, err := s.cat.Database(context.Background(), d.UUID, raftmeta.LeaderRead())
		require.NoError(t, err)
		q := s.query(acct, d.UUID, "CREATE TABLE t(id INTEGER PRIMARY KEY, v)")
		require.Equal(t, http.StatusOK, q.Status, "%s", q.Raw)
		acct.dbs[rec.HostID] = append(acct.dbs[rec.HostID], d.UUID)
	}
	for _, h := range s.hosts {
		require.NotEmpty(t, acct.dbs[h], "account %s has no database on %s (placement: %v)", name, h, acct.dbs)
	}
	return acct
}

func (s *limiterSystem) query(a sysAccount, uuid, sql string) harness.Answer {
	ans, err := harness.Try(http.MethodPost, s.edgeURL+"/client/v4/accounts/"+a.id+"/d1/database/"+uuid+"/query",
		"Bearer "+a.token, map[string]any{"sql": sql})
	if err != nil {
		ans.Status, ans.Raw = -1, []byte(err.Error())
	}
	return ans
}

func rowsWritten(a harness.Answer) int64 {
	var res []struct {
		Meta struct {
			RowsWritten int64 `json:"rows_written"`
		} `json:"meta"`
	}
	if json.Unmarshal(a.Result, &res) != nil {
		return 0
	}
	var n int64
	for _, r := range res {
		n += r.Meta.RowsWritten
	}
	return n
}

var sysBulkInsert = fmt.Sprintf("INSERT INTO t(v) WITH RECURSIVE s(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM s WHERE x < %d) SELECT x FROM s", sysBulkRows)

// cross writes bulk INSERTs over the account's databases, round robin,
// until the acknowledged rows written exceed the limit; it returns when the
// crossing write was acknowledged.
func (s *limiterSystem) cross(t *testing.T, a sysAccount) time.Time {
	t.Helper()
	var all []string
	for _, h := range s.hosts {
		all = append(all, a.dbs[h]...)
	}
	var total int64
	for i := 0; ; i++ {
		ans := s.query(a, all[i%len(all)], sysBulkInsert)
		require.Equal(t, http.StatusOK, ans.Status, "write %d before the crossing refused: %s", i, ans.Raw)
		total += rowsWritten(ans)
		if total > sysLimit {
			return time.Now()
		}
	}
}

// perHost polls a query on one database per host from its own goroutine
// until done holds; it returns, per host, the time after start and the
// answer that satisfied done.
func (s *limiterSystem) perHost(t *testing.T, a sysAccount, sql string, start time.Time, what string, done func(harness.Answer) bool) (map[string]time.Duration, map[string]harness.Answer) {
	t.Helper()
	var mu sync.Mutex
	took, answers := map[string]time.Duration{}, map[string]harness.Answer{}
	var wg sync.WaitGroup
	for _, h := range s.hosts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			db := a.dbs[h][0]
			var last harness.Answer
			for time.Since(start) < sysWaitBound {
				if last = s.query(a, db, sql); done(last) {
					mu.Lock()
					took[h], answers[h] = time.Since(start), last
					mu.Unlock()
					return
				}
				time.Sleep(sysProbePeriod) // poll interval of a probe against real processes
			}
			t.Errorf("%s: %s on %s not within %s; last answer %d %s", what, a.name, h, sysWaitBound, last.Status, last.Raw)
		}()
	}
	wg.Wait()
	return took, answers
}

// everyDB asserts want on every database of the account.
func (s *limiterSystem) everyDB(t *testing.T, a sysAccount, sql, what string, want func(harness.Answer) bool) {
	t.Helper()
	for _, h := range s.hosts {
		for _, db := range a.dbs[h] {
			ans := s.query(a, db, sql)
			assert.True(t, want(ans), "%s: %s on %s (%s): %d %s", what, a.name, h, db, ans.Status, ans.Raw)
		}
	}
}

func (s *limiterSystem) upgrade(t *testing.T, a sysAccount) time.Time {
	t.Helper()
	ans := harness.Call(t, http.MethodPatch, s.edgeURL+"/admin/v1/accounts/"+a.id, "Bearer "+s.admin, map[string]any{"tier": fsm.TierPaid})
	require.Equal(t, http.StatusOK, ans.Status, "%s", ans.Raw)
	return time.Now()
}

// waitNotices waits until the account has one mail and one webhook.
func (s *limiterSystem) waitNotices(t *testing.T, a sysAccount) {
	t.Helper()
	require.Eventually(t, func() bool { return s.mail.count(a.rcpt()) >= 1 && len(s.hook.of(a.id)) >= 1 },
		sysWaitBound, 50*time.Millisecond, "notices of %s: %d mails, %d webhooks", a.name, s.mail.count(a.rcpt()), len(s.hook.of(a.id)))
}

func okAnswer(a harness.Answer) bool { return a.Status == http.StatusOK }

// TestLimiterSystem: free accounts with databases on both object hosts
// write rows through the edge until the limiter (a process, reading the
// usage the pipeline role sank into ClickHouse) flags them; every database
// on both hosts then refuses them with D1's 429/7505 naming the limit and
// when it lifts; each gets exactly one mail and one signed webhook for the
// day, also across a kill -9 of the active limiter, the other taking over
// and a further period of passes; a paid account writing over the limit
// the whole time is never refused; an upgrade through the admin API
// unblocks every host. Crossing → refusal and upgrade → unblocked are
// measured per host and logged, not asserted.
func TestLimiterSystem(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process cluster with clickhouse-server")
	}
	rounds := 6
	if v, err := strconv.Atoi(os.Getenv("SHOAL_LIMITER_ROUNDS")); err == nil && v > 0 {
		rounds = v
	}
	s := newLimiterSystem(t)

	// A paid account writes over the free limit, many times over, from
	// start to finish; it must never be refused.
	paid := s.account(t, "paid", fsm.TierPaid)
	stopPaid := make(chan struct{})
	var paidMu sync.Mutex
	var paidRows int64
	var paidFail []string
	var paidWG sync.WaitGroup
	paidWG.Add(1)
	go func() {
		defer paidWG.Done()
		var all []string
		for _, h := range s.hosts {
			all = append(all, paid.dbs[h]...)
		}
		for i := 0; ; i++ {
			select {
			case <-stopPaid:
				return
			default:
			}
			ans := s.query(paid, all[i%len(all)], sysBulkInsert)
			paidMu.Lock()
			if ans.Status == http.StatusOK {
				paidRows += rowsWritten(ans)
			} else if len(paidFail) < 10 {
				paidFail = append(paidFail, fmt.Sprintf("%d %s", ans.Status, ans.Raw))
			}
			paidMu.Unlock()
			time.Sleep(20 * time.Millisecond) // pacing: a load generator against real processes
		}
	}()

	var crossRefused, upgradeOK []time.Duration
	measure := func(a sysAccount) {
		crossed := s.cross(t, a)
		took, answers := s.perHost(t, a, "INSERT INTO t(v) VALUES (0)", crossed, "refused after crossing", rowLimited)
		now := time.Now().UTC()
		lifts := time.Date(now.Year(), now.Month(), now.Day()+1, 0, 0, 0, 0, time.UTC).Format(time.RFC3339)
		for h, d := range took {
			crossRefused = append(crossRefused, d)
			msg := answers[h].Errors[0].Message
			assert.Contains(t, msg, "rows written per day limit", "on %s", h)
			assert.Contains(t, msg, "lifts at "+lifts, "on %s", h)
		}
		t.Logf("%s: crossing acknowledged → first refusal: %v", a.name, took)
		s.everyDB(t, a, "INSERT INTO t(v) VALUES (0)", "refused on every database", rowLimited)
		s.everyDB(t, a, "SELECT count(*) FROM t", "reads refused too", rowLimited)
	}
	unblock := func(a sysAccount) {
		at := s.upgrade(t, a)
		took, _ := s.perHost(t, a, "INSERT INTO t(v) VALUES (1)", at, "unblocked after the upgrade", okAnswer)
		for _, d := range took {
			upgradeOK = append(upgradeOK, d)
		}
		t.Logf("%s: upgrade acknowledged → first success: %v", a.name, took)
		s.everyDB(t, a, "INSERT INTO t(v) VALUES (1)", "accepted on every database after the upgrade", okAnswer)
	}

	// Round 1, then the failover with its account still limited.
	first := s.account(t, "free-1", fsm.TierFree)
	measure(first)
	s.waitNotices(t, first)

	active := s.activeLimiter()
	require.GreaterOrEqual(t, active, 0)
	other := 1 - active
	passesBefore, _ := sysMetric(s.limiterURLs[other], "shoal_limiter_passes_total")
	killedAt := time.Now()
	s.limiters[active].Signal(syscall.SIGKILL)
	<-s.limiters[active].Exited
	require.Eventually(t, func() bool {
		v, ok := sysMetric(s.limiterURLs[other], "shoal_limiter_is_active")
		return ok && v == 1
	}, sysWaitBound, 100*time.Millisecond, "the other limiter never took over")
	t.Logf("kill -9 of the active limiter → the other active: %v", time.Since(killedAt).Round(time.Millisecond))
	// A further period: at least 5 passes by the new active limiter, with
	// the killed one restarted (a new holder) as the standby.
	s.limiters[active].Start(t)
	require.Eventually(t, func() bool {
		v, _ := sysMetric(s.limiterURLs[other], "shoal_limiter_passes_total")
		return v >= passesBefore+5
	}, sysWaitBound, 100*time.Millisecond, "the new active limiter ran no passes")
	s.everyDB(t, first, "SELECT count(*) FROM t", "still refused after the failover", rowLimited)

	// Further rounds under the new active limiter: crossing, refusal,
	// notices, upgrade.
	var frees []sysAccount
	for r := 2; r <= rounds; r++ {
		a := s.account(t, fmt.Sprintf("free-%d", r), fsm.TierFree)
		measure(a)
		s.waitNotices(t, a)
		unblock(a)
		frees = append(frees, a)
	}
	unblock(first)
	frees = append(frees, first)

	// Passes after the last upgrade must not re-flag anyone nor notify again.
	passes, _ := sysMetric(s.limiterURLs[other], "shoal_limiter_passes_total")
	require.Eventually(t, func() bool {
		v, _ := sysMetric(s.limiterURLs[other], "shoal_limiter_passes_total")
		return v >= passes+3
	}, sysWaitBound, 100*time.Millisecond, "no passes after the upgrades")
	for _, a := range frees {
		s.everyDB(t, a, "INSERT INTO t(v) VALUES (2)", "still unblocked passes after the upgrade", okAnswer)
		assert.Equal(t, 1, s.mail.count(a.rcpt()), "exactly one mail for %s", a.name)
		hooks := s.hook.of(a.id)
		if assert.Len(t, hooks, 1, "exactly one webhook for %s", a.name) {
			assert.Equal(t, "rows_written_per_day", hooks[0].Limit)
			assert.Equal(t, int64(sysLimit), hooks[0].Threshold)
			assert.Greater(t, hooks[0].Value, int64(sysLimit))
		}
	}
	close(stopPaid)
	paidWG.Wait()
	paidMu.Lock()
	assert.Empty(t, paidFail, "the paid account is never refused")
	assert.Greater(t, paidRows, int64(3*sysLimit), "the paid account wrote well over the free limit")
	t.Logf("paid account: %d rows written, never refused", paidRows)
	paidMu.Unlock()
	s.everyDB(t, paid, "INSERT INTO t(v) VALUES (3)", "paid account accepted on every database", okAnswer)
	assert.Equal(t, 0, s.mail.count(paid.rcpt()), "no mail for the paid account")
	assert.Empty(t, s.hook.of(paid.id), "no webhook for the paid account")
	assert.Equal(t, len(frees), s.mail.total(), "no other mail")
	s.hook.mu.Lock()
	assert.Zero(t, s.hook.badSigs, "every webhook signed")
	s.hook.mu.Unlock()

	t.Logf("crossing acknowledged → first refusal, per host (%d hosts × %d accounts): %s", len(s.hosts), rounds, durQuantiles(crossRefused))
	t.Logf("upgrade acknowledged → first success, per host: %s", durQuantiles(upgradeOK))
}
