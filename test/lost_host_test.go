package test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/edge"
	"github.com/shoaldb/shoal/internal/pki"
	"github.com/shoaldb/shoal/objecthost"
	"github.com/shoaldb/shoal/raftmeta"
	"github.com/shoaldb/shoal/test/harness"
)

// lostHostCluster is a catalog node, object hosts archiving into one
// directory archive (outside their data directories: it stands for the
// off-host store) and an edge, as processes on loopback, with no route
// feed: an edge learns a relocation from the catalog when the lost host
// refuses its connection. Every internal call is mutual TLS with the
// cluster's certificates (a CA and one certificate per process, and an
// operator's for the test and the CLI).
type lostHostCluster struct {
	bin, dir, archive, catAddr, edgeURL, admin, durability string
	edgeDebug                                              string // the edge's --debug-addr (profiles)
	hosts                                                  map[string]*harness.Proc
	hostAddr                                               map[string]string
	acct, bearer                                           string
	cat                                                    *raftmeta.Client
	pki                                                    *harness.PKI
	ops                                                    *http.Client // an operator's TLS client
}

func newLostHostCluster(t *testing.T, durability string) *lostHostCluster {
	c := &lostHostCluster{bin: shoalBin.Path(t), dir: t.TempDir(), admin: "lost-host-admin", durability: durability,
		hosts: map[string]*harness.Proc{}, hostAddr: map[string]string{}}
	c.archive = filepath.Join(c.dir, "archive")
	c.pki = harness.NewPKI(t)
	c.ops = c.pki.HTTPClient(t, "ops", pki.RoleOperator)
	c.catAddr = harness.FreeAddr(t)
	cat := harness.StartProc(t, c.bin, "n1", append([]string{"raftmeta", "serve", "--id", "n1", "--dir", filepath.Join(c.dir, "n1"),
		"--raft-addr", harness.FreeAddr(t), "--http-addr", c.catAddr, "--bootstrap", "--log-level", "warn"},
		c.pki.Args(t, "n1", pki.RoleCatalog)...)...)
	harness.WaitHTTP200With(t, c.ops, "https://"+c.catAddr+"/readyz", 30*time.Second, "catalog never ready: %s", cat.Log)
	var err error
	c.cat, err = raftmeta.NewClient([]string{c.catAddr}, raftmeta.WithCacheTTL(0), raftmeta.WithTLS(c.pki.Loader(t, "ops", pki.RoleOperator)))
	require.NoError(t, err)
	t.Cleanup(c.cat.Close)
	edgeAddr := harness.FreeAddr(t)
	c.edgeURL = "http://" + edgeAddr
	c.edgeDebug = harness.FreeAddr(t)
	e := harness.StartProc(t, c.bin, "e1", append([]string{"edge", "serve", "--http-addr", edgeAddr, "--debug-addr", c.edgeDebug, "--dir", filepath.Join(c.dir, "e1"),
		"--region", "weur", "--catalog", c.catAddr, "--admin-token", c.admin,
		"--account-rate", "100000", "--database-rate", "100000", "--log-level", "warn"}, c.pki.Args(t, "e1", pki.RoleEdge)...)...)
	harness.WaitHTTP200(t, c.edgeURL+"/healthz", 30*time.Second, "edge never healthy: %s", e.Log)
	return c
}

// startHost starts object host id and waits until it is registered.
func (c *lostHostCluster) startHost(t *testing.T, id string) {
	addr := harness.FreeAddr(t)
	c.hostAddr[id] = addr
	c.hosts[id] = harness.StartProc(t, c.bin, id, append([]string{"objecthost", "serve", "--id", id, "--dir", filepath.Join(c.dir, id),
		"--http-addr", addr, "--region", "weur", "--catalog", c.catAddr, "--archive-dir", c.archive,
		"--durability", c.durability, "--heartbeat-interval", "1s", "--creation-grace", "10s", "--log-level", "warn"},
		c.pki.Args(t, id, pki.RoleHost)...)...)
	harness.WaitHTTP200With(t, c.ops, "https://"+addr+"/healthz", 30*time.Second, "host %s never healthy: %s", id, c.hosts[id].Log)
	require.Eventually(t, func() bool {
		hs, err := c.cat.Hosts(context.Background(), raftmeta.LinearizableRead())
		if err != nil {
			return false
		}
		for _, h := range hs {
			if h.ID == id {
				return true
			}
		}
		return false
	}, 30*time.Second, 50*time.Millisecond, "host %s never registered", id)
}

func (c *lostHostCluster) setupAccount(t *testing.T) {
	a := harness.Call(t, http.MethodPost, c.edgeURL+"/admin/v1/accounts", "Bearer "+c.admin, map[string]any{"name": "lost", "tier": "paid"})
	require.Equal(t, http.StatusOK, a.Status, "%s", a.Raw)
	var ac struct{ ID string }
	require.NoError(t, json.Unmarshal(a.Result, &ac))
	tok := harness.Call(t, http.MethodPost, c.edgeURL+"/admin/v1/accounts/"+ac.ID+"/tokens", "Bearer "+c.admin, map[string]any{"name": "t"})
	require.Equal(t, http.StatusOK, tok.Status, "%s", tok.Raw)
	var tk struct{ Token string }
	require.NoError(t, json.Unmarshal(tok.Result, &tk))
	c.acct, c.bearer = ac.ID, "Bearer "+tk.Token
}

func (c *lostHostCluster) create(name string) (string, error) {
	a, err := harness.Try(http.MethodPost, c.edgeURL+"/client/v4/accounts/"+c.acct+"/d1/database", c.bearer, map[string]any{"name": name})
	if err != nil {
		return "", err
	}
	if a.Status != http.StatusOK {
		return "", fmt.Errorf("create %s: %d %s", name, a.Status, a.Raw)
	}
	var d struct{ UUID string }
	return d.UUID, json.Unmarshal(a.Result, &d)
}

func (c *lostHostCluster) query(uuid, sql string) (harness.Answer, error) {
	return harness.Try(http.MethodPost, c.edgeURL+"/client/v4/accounts/"+c.acct+"/d1/database/"+uuid+"/query", c.bearer, map[string]any{"sql": sql})
}

// rows is table t of a database as JSON, or an error.
func (c *lostHostCluster) rows(uuid string) (string, error) {
	a, err := c.query(uuid, "SELECT id, v, r FROM t ORDER BY id")
	if err != nil {
		return "", err
	}
	if a.Status != http.StatusOK {
		return "", fmt.Errorf("%d %s", a.Status, a.Raw)
	}
	var res []struct {
		Results json.RawMessage `json:"results"`
	}
	if err := json.Unmarshal(a.Result, &res); err != nil || len(res) != 1 {
		return "", fmt.Errorf("result %s: %v", a.Result, err)
	}
	return string(res[0].Results), nil
}

// hostLost runs `shoal cluster host lost HOST --yes --json` and decodes its
// report.
func (c *lostHostCluster) hostLost(t *testing.T, host string) edge.RecoverReport {
	cmd := exec.Command(c.bin, append([]string{"cluster", "--addr", c.catAddr, "host", "lost", host, "--yes", "--json"},
		c.pki.Args(t, "ops", pki.RoleOperator)...)...)
	var out, errOut harness.SyncWriter
	cmd.Stdout, cmd.Stderr = &out, &errOut
	require.NoError(t, cmd.Run(), "host lost: %s\n%s", out.String(), errOut.String())
	var rep edge.RecoverReport
	require.NoError(t, json.Unmarshal([]byte(out.String()), &rep), "%s", out.String())
	return rep
}

func (c *lostHostCluster) onHost(t *testing.T, host string) int {
	p, err := c.cat.HostDatabasesPage(context.Background(), host, "", 10000, raftmeta.LinearizableRead())
	require.NoError(t, err)
	return len(p.Databases)
}

// TestFaultLostHostRecovery is the lost-host check: a host holding
// 1,000 databases (300 in make test) (durability = "archived") is killed and its data
// directory wiped; after `shoal cluster host lost`, every database answers
// its queries from another host, through an edge whose routes still name
// the lost host, with exactly the rows acknowledged before the kill
// (nothing acknowledged is lost in archived mode), random() values
// included.
func TestFaultLostHostRecovery(t *testing.T) {
	// 1,000 databases under make fault and make bench (the figure);
	// 300 in make test, whose budget the 1,000 archived-mode creates would
	// take a minute of.
	n := 300
	if os.Getenv("SHOAL_FAULT") == "long" || os.Getenv("SHOAL_BENCH") != "" {
		n = 1000
	}
	c := newLostHostCluster(t, "archived")
	c.startHost(t, "h1")
	c.setupAccount(t)

	uuids := make([]string, n)
	var failed atomic.Int64
	var firstErr atomic.Value
	harness.Concurrently(n, 16, func(i int) {
		u, err := c.create(fmt.Sprintf("db-%04d", i))
		if err == nil {
			var a harness.Answer
			a, err = c.query(u, "CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT, r INTEGER DEFAULT (random())); INSERT INTO t(v) VALUES ('a'), ('b'), ('c')")
			if err == nil && a.Status != http.StatusOK {
				err = fmt.Errorf("%d %s", a.Status, a.Raw)
			}
		}
		if err != nil {
			failed.Add(1)
			firstErr.CompareAndSwap(nil, err)
			return
		}
		uuids[i] = u
	})
	require.Zero(t, failed.Load(), "setup: %v", firstErr.Load())
	want := make([]string, n)
	harness.Concurrently(n, 16, func(i int) {
		r, err := c.rows(uuids[i])
		if err != nil {
			failed.Add(1)
			firstErr.CompareAndSwap(nil, err)
		}
		want[i] = r
	})
	require.Zero(t, failed.Load(), "read back: %v", firstErr.Load())
	require.Equal(t, n, c.onHost(t, "h1"))

	// Two more hosts, then h1 dies with its disk.
	c.startHost(t, "h2")
	c.startHost(t, "h3")
	h1 := c.hosts["h1"]
	h1.Signal(9)
	<-h1.Exited
	require.NoError(t, os.RemoveAll(filepath.Join(c.dir, "h1")))

	start := time.Now()
	rep := c.hostLost(t, "h1")
	took := time.Since(start)
	require.True(t, rep.Complete(), "%+v", rep)
	require.Equal(t, n, rep.Listed)
	require.Equal(t, n, rep.Relocated)
	require.Zero(t, c.onHost(t, "h1"))
	t.Logf("FIGURE lost host: %d databases relocated in %s (command %s; per database p50 %s, p99 %s, max %s)",
		n, rep.Elapsed.Round(time.Millisecond), took.Round(time.Millisecond), rep.P50.Round(time.Millisecond), rep.P99.Round(time.Millisecond), rep.Max.Round(time.Millisecond))

	// Every database answers, from h2 or h3, with exactly its rows.
	var wrong atomic.Int64
	harness.Concurrently(n, 16, func(i int) {
		got, err := c.rows(uuids[i])
		if err != nil || got != want[i] {
			wrong.Add(1)
			firstErr.CompareAndSwap(nil, fmt.Errorf("%s: got %q (%v), want %q", uuids[i], got, err, want[i]))
		}
	})
	require.Zero(t, wrong.Load(), "databases not back as acknowledged: %v", firstErr.Load())
	// And they take writes on their new host.
	a, err := c.query(uuids[0], "INSERT INTO t(v) VALUES ('after')")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, a.Status, "%s", a.Raw)
	assert.Equal(t, n, c.onHost(t, "h2")+c.onHost(t, "h3"), "every database on h2 or h3")

	// A second run finds nothing left to do.
	rep = c.hostLost(t, "h1")
	assert.Zero(t, rep.Listed)
}

// TestLostHostDefaultDurabilityAndReturn: in the default durability a
// host killed -9 under writes loses at most its shipping lag (every write
// acknowledged more than 2 s before the kill is back; the writes of the
// last 2 s that are missing are counted); no row appears that was never
// written; and when the lost host comes back on its old disk, it learns it
// was declared lost and retires every superseded object (never two live
// objects for one database) while the edge keeps serving the new ones.
func TestLostHostDefaultDurabilityAndReturn(t *testing.T) {
	const n = 40
	c := newLostHostCluster(t, "default")
	c.startHost(t, "h1")
	c.setupAccount(t)
	uuids := make([]string, n)
	for i := range uuids {
		u, err := c.create(fmt.Sprintf("w-%02d", i))
		require.NoError(t, err)
		a, err := c.query(u, "CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT, r INTEGER DEFAULT (random()))")
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, a.Status, "%s", a.Raw)
		uuids[i] = u
	}
	c.startHost(t, "h2")

	type write struct {
		db   int
		v    string
		ack  time.Time // zero: not acknowledged
		sent time.Time
	}
	var (
		mu     sync.Mutex
		writes []write
		stop   atomic.Bool
		wg     sync.WaitGroup
	)
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for i := 0; !stop.Load(); i++ {
				wr := write{db: rng.IntN(n), v: fmt.Sprintf("w%d-%d", w, i), sent: time.Now()}
				a, err := c.query(uuids[wr.db], "INSERT INTO t(v) VALUES ('"+wr.v+"')")
				if err == nil && a.Status == http.StatusOK {
					wr.ack = time.Now()
				}
				mu.Lock()
				writes = append(writes, wr)
				mu.Unlock()
				if err != nil || a.Status != http.StatusOK {
					time.Sleep(20 * time.Millisecond) // a writer's backoff after a failure (load generator)
				}
			}
		}(w)
	}
	time.Sleep(3 * time.Second) // load before the kill (real processes)
	h1 := c.hosts["h1"]
	h1.Signal(9)
	killedAt := time.Now()
	<-h1.Exited
	time.Sleep(300 * time.Millisecond) // writes after the kill reach the dead host (real processes)
	stop.Store(true)
	wg.Wait()

	rep := c.hostLost(t, "h1")
	require.True(t, rep.Complete(), "%+v", rep)
	require.Equal(t, n, rep.Relocated)

	// What came back.
	present := map[string]bool{}
	for _, u := range uuids {
		a := c.eventually(t, u, "SELECT v FROM t")
		var res []struct {
			Results []struct{ V string } `json:"results"`
		}
		require.NoError(t, json.Unmarshal(a.Result, &res))
		for _, r := range res[0].Results {
			present[r.V] = true
		}
	}
	sent := map[string]bool{}
	var acked, lostLate int
	var lostOld []string
	for _, w := range writes {
		sent[w.v] = true
		if w.ack.IsZero() {
			continue
		}
		acked++
		if present[w.v] {
			continue
		}
		if w.ack.Before(killedAt.Add(-2 * time.Second)) {
			lostOld = append(lostOld, w.v)
		} else {
			lostLate++
		}
	}
	for v := range present {
		assert.True(t, sent[v], "phantom row %q", v)
	}
	require.Greater(t, acked, 100, "the load wrote too little to judge")
	assert.Empty(t, lostOld, "writes acknowledged more than 2 s before the kill were lost")
	t.Logf("FIGURE default durability: %d writes acknowledged, %d of those acknowledged in the last 2 s before the kill -9 lost", acked, lostLate)

	// The lost host returns on its old disk.
	h1.Start(t)
	hostURL := "https://" + c.hostAddr["h1"]
	harness.WaitHTTP200With(t, c.ops, hostURL+"/healthz", 30*time.Second, "h1 never healthy again: %s", h1.Log)
	var st objecthost.HostStatus
	require.Eventually(t, func() bool {
		var env struct {
			Result objecthost.HostStatus `json:"result"`
		}
		if err := harness.GetJSONWith(c.ops, hostURL+"/v1/status", &env); err != nil {
			return false
		}
		st = env.Result
		return st.DeclaredLost && st.Active == 0
	}, 60*time.Second, 200*time.Millisecond, "h1 never retired its superseded objects: %+v\n%s", st, harness.Tail(h1.Log.String(), 3000))
	kinds := []string{}
	for _, a := range st.Alarms {
		kinds = append(kinds, a.Kind)
	}
	sort.Strings(kinds)
	assert.Contains(t, kinds, "declared_lost")
	assert.Contains(t, kinds, "superseded")
	assert.Equal(t, n, st.Deleted)
	// The databases still answer, from h2, with what came back.
	for _, u := range uuids[:5] {
		c.eventually(t, u, "SELECT count(*) AS n FROM t")
	}
}

// eventually runs sql until it answers 200, for up to 10 s: the first
// queries after a relocation may get 503 "retry" (an edge re-reads a route
// whose host refused connections at most every 2 s), as a D1 client
// retries them.
func (c *lostHostCluster) eventually(t *testing.T, uuid, sql string) harness.Answer {
	t.Helper()
	var a harness.Answer
	var err error
	// The sleep is the retry interval of a D1 client (see above).
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if a, err = c.query(uuid, sql); err == nil && a.Status == http.StatusOK {
			return a
		}
	}
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, a.Status, "%s", a.Raw)
	return a
}
