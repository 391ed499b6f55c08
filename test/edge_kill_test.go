package test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/raftmeta"
	"github.com/shoaldb/shoal/test/harness"
)

// TestFaultEdgeKilledWithStagedRoutes: an edge process SIGKILLed while it
// holds the staged routes of databases it has just created (edge/
// routestage.go: staged in memory, written to the bbolt route cache within
// RouteStageLinger, 20 ms) loses those routes, and that must be harmless:
// every create the edge acknowledged (200 with a uuid) answers through the
// restarted edge — at once, on its cold cache, and later — found by name in
// the list and queried by uuid, and none ever answers 404.
//
// Real processes of the shoal binary: three catalog voters, one object host,
// one edge on its own data directory. Creates run through the edge from
// several clients at a steady pace; the edge is killed -9 several times,
// each time a random 0–20 ms after a create was answered (so the kill lands
// between that answer and the staged flush about as often as not), and
// restarted on the same directory at once.
//
// One catalog follower lags: its Raft port is reached through a relay that
// delays every byte by edgeKillLag each way, so it applies each create that
// much after the leader, while its stale-read bound (time since the leader's
// last append) stays fresh. The edge spreads its stale reads over every
// node, so a lost route's catalog fill often asks that follower while it
// does not know the database yet: its "not found" must be confirmed at the
// leader (edge.RaftmetaCatalog.Database), never cached and answered as a 404.
func TestFaultEdgeKilledWithStagedRoutes(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process fault test; skipped with -short")
	}
	const (
		kills   = 5
		clients = 4
	)
	start := time.Now()
	c := newEdgeKillCluster(t)
	acct, bearer := (&harness.E2ECluster{Admin: c.admin, EdgeURL: []string{c.edgeURL}}).SetupAccount(t, "paid")
	base := c.edgeURL + "/client/v4/accounts/" + acct + "/d1/database"

	var acked []edgeKillDB // every create the edge answered 200 with a uuid
	var lostRoutes float64 // cache misses of the queries right after the restarts
	for k := 1; k <= kills; k++ {
		burst := c.createUntilKilled(t, base, bearer, k, clients)
		require.NotEmpty(t, burst.acked, "kill %d: no create was acknowledged before it: %s", k, burst.failures)
		acked = append(acked, burst.acked...)

		c.edge.Start(t)
		restarted := time.Now()
		harness.WaitHTTP200(t, c.edgeURL+"/healthz", 30*time.Second, "the edge never came back after kill %d: %s",
			k, harness.Tail(c.edge.Log.String(), 2000))
		up := time.Since(restarted)
		// Before anything else reaches the restarted edge: the burst's
		// databases, newest first (the routes the kill may have lost).
		recent := append([]edgeKillDB(nil), burst.acked...)
		sort.Slice(recent, func(i, j int) bool { return recent[i].at.After(recent[j].at) })
		bad := edgeKillCheck(recent, base, bearer, false)
		m := harness.ScrapeMetrics(t, c.edgeURL+"/metrics")
		misses := m["shoal_edge_route_cache_misses_total"]
		lostRoutes += misses
		t.Logf("kill %d, %s after the last acknowledged create: %d creates acknowledged in the burst (%d not), "+
			"edge healthy %s after its restart; queried at once: %d cache misses (routes the kill lost), %d negative-cache hits",
			k, burst.killedAfter.Round(time.Microsecond), len(burst.acked), burst.notAcked, up.Round(time.Millisecond),
			int(misses), int(m["shoal_edge_route_cache_negative_hits_total"]))
		assert.Empty(t, bad, "right after restart %d, acknowledged databases did not answer", k)
		bad = edgeKillCheck(recent, base, bearer, true)
		assert.Empty(t, bad, "right after restart %d, acknowledged databases were not listed by name", k)
	}

	// Every acknowledged database, by uuid and by name, through the edge as
	// it is now (restarted kills times).
	bad := edgeKillCheck(acked, base, bearer, false)
	assert.Empty(t, bad, "at the end, acknowledged databases did not answer by uuid")
	bad = edgeKillCheck(acked, base, bearer, true)
	assert.Empty(t, bad, "at the end, acknowledged databases were not listed by name")
	// And the catalog (linearizable) holds every one of them.
	rows, _, err := c.reader.ListDatabases(context.Background(), acct, harness.ListAll(), raftmeta.LinearizableRead())
	require.NoError(t, err)
	inCatalog := map[string]bool{}
	for _, r := range rows {
		inCatalog[r.UUID] = true
	}
	var missing []string
	for _, db := range acked {
		if !inCatalog[db.uuid] {
			missing = append(missing, db.name+" "+db.uuid)
		}
	}
	assert.Empty(t, missing, "acknowledged databases missing from the catalog")
	b, n := c.relay.relayed()
	t.Logf("%d kills: %d creates acknowledged and checked, %d routes lost by the kills (cache misses right after the restarts); "+
		"lagging follower's relay carried %d bytes over %d connections; total %s",
		kills, len(acked), int(lostRoutes), b, n, time.Since(start).Round(time.Millisecond))
}

// edgeKillLag is how late the lagging follower receives the leader's
// appends (each way): longer than an edge restart, so the databases
// created just before a kill are still unknown to it when the restarted
// edge first asks; far below the catalog's 5 s stale-read bound.
const edgeKillLag = 1500 * time.Millisecond

// edgeKillCluster is the deployment of TestFaultEdgeKilledWithStagedRoutes.
type edgeKillCluster struct {
	edge    *harness.Proc
	edgeURL string
	admin   string
	relay   *delayRelay
	reader  *raftmeta.Client
}

func newEdgeKillCluster(t *testing.T) *edgeKillCluster {
	bin := shoalBin.Path(t)
	dir := t.TempDir()
	// Ten ports from one base (SHOAL_TEST_PORT_RANGE keeps them in the
	// caller's block): 0–5 the catalog's Raft and HTTP, 6 the relay, 7 the
	// host, 8 the edge.
	port := harness.FreePortBase(t, 0, 1, 2, 3, 4, 5, 6, 7, 8)
	addr := func(off int) string { return fmt.Sprintf("127.0.0.1:%d", port+off) }
	c := &edgeKillCluster{admin: "edgekill-admin-token", edgeURL: "http://" + addr(8)}
	var catAddrs []string
	for i, id := range []string{"n1", "n2", "n3"} {
		raftAddr, httpAddr := addr(2*i), addr(2*i+1)
		args := []string{"raftmeta", "serve", "--insecure", "--id", id, "--dir", filepath.Join(dir, id),
			"--raft-addr", raftAddr, "--http-addr", httpAddr, "--log-level", "warn"}
		if id == "n2" {
			// The lagging follower: the leader reaches its Raft port
			// only through the relay, slowed once the cluster formed.
			c.relay = startDelayRelay(t, addr(6), raftAddr)
			args = append(args, "--raft-advertise", addr(6))
		}
		if i == 0 {
			args = append(args, "--bootstrap")
		} else {
			args = append(args, "--join", catAddrs[0])
		}
		harness.StartProc(t, bin, id, args...)
		catAddrs = append(catAddrs, httpAddr)
		harness.WaitReady(t, httpAddr)
	}
	// Two nodes are a quorum now: the third may lag.
	c.relay.delay.Store(int64(edgeKillLag))
	catalog := strings.Join(catAddrs, ",")
	host := harness.StartProc(t, bin, "h1", "objecthost", "serve", "--insecure", "--id", "h1", "--dir", filepath.Join(dir, "h1"),
		"--http-addr", addr(7), "--region", "weur", "--catalog", catalog, "--log-level", "warn")
	// Rate limits far above what the clients send: not what this test is
	// about.
	c.edge = harness.StartProc(t, bin, "e1", "edge", "serve", "--insecure", "--http-addr", addr(8), "--dir", filepath.Join(dir, "e1"),
		"--region", "weur", "--catalog", catalog, "--admin-token", c.admin, "--log-level", "warn",
		"--account-rate", "100000", "--database-rate", "100000")
	harness.WaitHTTP200(t, "http://"+addr(7)+"/healthz", 30*time.Second, "host never healthy: %s", harness.Tail(host.Log.String(), 2000))
	harness.WaitHTTP200(t, c.edgeURL+"/healthz", 30*time.Second, "edge never healthy: %s", harness.Tail(c.edge.Log.String(), 2000))
	var err error
	c.reader, err = raftmeta.NewClient(catAddrs)
	require.NoError(t, err)
	t.Cleanup(c.reader.Close)
	require.Eventually(t, func() bool {
		hs, err := c.reader.Hosts(context.Background(), raftmeta.LinearizableRead())
		return err == nil && len(hs) == 1
	}, 30*time.Second, 100*time.Millisecond, "the object host never registered")
	return c
}

// edgeKillDB is one acknowledged create.
type edgeKillDB struct {
	name, uuid string
	at         time.Time // when its 200 arrived
}

// edgeKillBurst is what the clients saw from one run of the edge.
type edgeKillBurst struct {
	acked       []edgeKillDB
	notAcked    int           // creates without a 200 (the kill's)
	killedAfter time.Duration // from the last 200 received before the kill to the kill
	failures    string        // a few unacknowledged answers, for messages
}

// createUntilKilled runs clients creating databases back to back through
// the edge for a random 200–600 ms, then SIGKILLs the edge a random 0–20 ms
// after the next create it answers, and returns once every client stopped
// and the edge has exited.
func (c *edgeKillCluster) createUntilKilled(t *testing.T, base, bearer string, k, clients int) edgeKillBurst {
	var (
		mu    sync.Mutex
		burst edgeKillBurst
		last  time.Time
	)
	var killed atomic.Bool
	defer killed.Store(true) // the clients stop on every way out (a t.Fatal too)
	answered := make(chan struct{}, 1)
	var wg sync.WaitGroup
	for w := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !killed.Load(); i++ {
				name := fmt.Sprintf("k%d-c%d-%d", k, w, i)
				a, err := harness.Try(http.MethodPost, base, bearer, map[string]any{"name": name})
				at := time.Now()
				var d struct {
					UUID string `json:"uuid"`
				}
				mu.Lock()
				if err == nil && a.Status == http.StatusOK && json.Unmarshal(a.Result, &d) == nil && d.UUID != "" {
					burst.acked = append(burst.acked, edgeKillDB{name: name, uuid: d.UUID, at: at})
					mu.Unlock()
					select {
					case answered <- struct{}{}:
					default:
					}
					continue
				}
				burst.notAcked++
				if len(burst.failures) < 600 {
					burst.failures += harness.AnswerText(a, err) + "; "
				}
				mu.Unlock()
			}
		}()
	}
	// Traffic at a steady pace for a while before the fault.
	time.Sleep(time.Duration(200+rand.IntN(400)) * time.Millisecond)
	select {
	case <-answered: // drop an answer that came before the pause ended
	default:
	}
	select {
	case <-answered:
	case <-time.After(30 * time.Second):
		t.Fatalf("kill %d: no create answered for 30 s: %s", k, burst.failures)
	}
	// The kill point: 0–20 ms (one RouteStageLinger) after an answer.
	time.Sleep(time.Duration(rand.IntN(20_001)) * time.Microsecond)
	c.edge.Signal(syscall.SIGKILL)
	killedAt := time.Now()
	killed.Store(true)
	<-c.edge.Exited
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	for _, db := range burst.acked {
		if !db.at.After(killedAt) && db.at.After(last) {
			last = db.at
		}
	}
	burst.killedAfter = killedAt.Sub(last)
	return burst
}

// edgeKillCheck asks the edge about each database once (no retries: an
// acknowledged database answers at once, whatever the edge's cache holds):
// byName lists the account's databases named like it (one, its uuid);
// otherwise it queries SELECT 1 by uuid. It returns what went wrong, one
// line per database (the first five, then how many more).
func edgeKillCheck(dbs []edgeKillDB, base, bearer string, byName bool) []string {
	var mu sync.Mutex
	var bad []string
	harness.Concurrently(len(dbs), 8, func(i int) {
		db := dbs[i]
		var why string
		if byName {
			a, err := harness.Try(http.MethodGet, base+"?name="+url.QueryEscape(db.name), bearer, nil)
			var items []struct {
				UUID string `json:"uuid"`
				Name string `json:"name"`
			}
			switch {
			case err != nil || a.Status != http.StatusOK || json.Unmarshal(a.Result, &items) != nil:
				why = "list by name: " + harness.AnswerText(a, err)
			default:
				// The name filter matches substrings: k1-c0-1 lists
				// k1-c0-10 too. Exactly one is named db.name.
				var named []string
				for _, it := range items {
					if it.Name == db.name {
						named = append(named, it.UUID)
					}
				}
				if len(named) != 1 || named[0] != db.uuid {
					why = fmt.Sprintf("list by name: want its uuid, got %v", named)
				}
			}
		} else {
			a, err := harness.Try(http.MethodPost, base+"/"+db.uuid+"/query", bearer, map[string]any{"sql": "SELECT 1 AS one"})
			var res []struct {
				Success bool             `json:"success"`
				Results []map[string]any `json:"results"`
			}
			if err != nil || a.Status != http.StatusOK || json.Unmarshal(a.Result, &res) != nil ||
				len(res) != 1 || !res[0].Success || len(res[0].Results) != 1 || res[0].Results[0]["one"] != float64(1) {
				why = "SELECT 1: " + harness.AnswerText(a, err)
			}
		}
		if why != "" {
			mu.Lock()
			bad = append(bad, fmt.Sprintf("%s (%s, acknowledged %s): %s", db.name, db.uuid, db.at.Format("15:04:05.000"), why))
			mu.Unlock()
		}
	})
	sort.Strings(bad)
	if len(bad) > 5 {
		bad = append(bad[:5], fmt.Sprintf("… %d more", len(bad)-5))
	}
	return bad
}

// delayRelay forwards every TCP connection made to its address to target,
// each chunk it reads delivered delay later, in order, in both directions:
// a link that is slow without being cut (no netem needed).
type delayRelay struct {
	ln     net.Listener
	target string
	delay  atomic.Int64 // a time.Duration; 0 until set
	bytes  atomic.Int64
	conns  atomic.Int64
	mu     sync.Mutex
	open   map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// startDelayRelay listens on addr until the test ends, without delay until
// one is set.
func startDelayRelay(t *testing.T, addr, target string) *delayRelay {
	ln, err := net.Listen("tcp", addr)
	require.NoError(t, err, "relay listener")
	r := &delayRelay{ln: ln, target: target, open: map[net.Conn]struct{}{}}
	r.wg.Add(1)
	go r.accept()
	t.Cleanup(r.close)
	return r
}

func (r *delayRelay) relayed() (bytes, conns int64) { return r.bytes.Load(), r.conns.Load() }

func (r *delayRelay) track(c net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		_ = c.Close()
		return false
	}
	r.open[c] = struct{}{}
	return true
}

func (r *delayRelay) close() {
	r.mu.Lock()
	r.closed = true
	for c := range r.open {
		_ = c.Close()
	}
	r.mu.Unlock()
	_ = r.ln.Close()
	r.wg.Wait()
}

func (r *delayRelay) accept() {
	defer r.wg.Done()
	for {
		in, err := r.ln.Accept()
		if err != nil {
			return
		}
		if !r.track(in) {
			return
		}
		r.conns.Add(1)
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			out, err := net.DialTimeout("tcp", r.target, 5*time.Second)
			if err != nil || !r.track(out) {
				_ = in.Close()
				return
			}
			var pipes sync.WaitGroup
			pipes.Add(2)
			go func() { defer pipes.Done(); r.pipe(out, in) }()
			go func() { defer pipes.Done(); r.pipe(in, out) }()
			pipes.Wait()
			_ = in.Close()
			_ = out.Close()
		}()
	}
}

// pipe copies src to dst, each chunk delay after it was read. When either
// side ends, both connections are closed (the peer reconnects).
func (r *delayRelay) pipe(dst, src net.Conn) {
	type chunk struct {
		at   time.Time
		data []byte
	}
	q := make(chan chunk, 4096)
	go func() {
		defer close(q)
		for {
			b := make([]byte, 32<<10)
			n, err := src.Read(b)
			if n > 0 {
				q <- chunk{time.Now(), b[:n]}
			}
			if err != nil {
				return
			}
		}
	}()
	for ch := range q {
		if d := time.Until(ch.at.Add(time.Duration(r.delay.Load()))); d > 0 {
			time.Sleep(d) // the link's latency: this chunk is due then
		}
		if _, err := dst.Write(ch.data); err != nil {
			break
		}
		r.bytes.Add(int64(len(ch.data)))
	}
	_ = dst.Close()
	_ = src.Close()
	for range q { // let the reader end (src is closed)
	}
}
