package raftmeta

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/shoaldb/shoal/internal/ids"
	"github.com/shoaldb/shoal/internal/pki"
	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// Client reaches the catalog through the nodes' internal HTTP API. Writes
// go to the leader (learned from answers and cached; any node would forward
// them), retried across nodes with backoff and one request ID. Linearizable
// and leader reads go to the leader first; stale reads are spread
// round-robin over the nodes, and a node that answers "too stale" or "not
// ready" is skipped for the next one. Every attempt has its own timeout,
// shorter than callers' budgets, and a node that times out or refuses
// connections is demoted (tried last) for a while, so one hung node never
// takes the catalog down for a client. Stale reads are cached for a short
// TTL. Safe for concurrent use.
type Client struct {
	addrs    []string
	nodes    *nodeOrder
	readTO   time.Duration // per attempt
	writeTO  time.Duration // per attempt
	hedge    time.Duration // stale reads: ask the next node too after this long (0: never)
	hc       *http.Client
	attempts int
	boBase   time.Duration
	boMax    time.Duration
	now      func() time.Time
	newID    func() string
	cache    *staleCache // nil: no cache
	scheme   string      // "https" with WithTLS
	writes   *coalescer  // nil: every Apply is its own request (coalesce.go)

	// bg is the context of work the client does for several callers at
	// once (coalesced sends), ended by Close (which puts a fresh one in
	// its place: a client used after Close still works, as before write
	// coalescing); wg counts its goroutines.
	bgMu     sync.Mutex
	bg       context.Context
	bgCancel context.CancelFunc
	wg       sync.WaitGroup

	mu     sync.Mutex
	leader string
}

type clientConfig struct {
	hc         *http.Client
	ttl        time.Duration
	maxEntries int
	attempts   int
	boBase     time.Duration
	boMax      time.Duration
	now        func() time.Time
	newID      func() string
	timeout    time.Duration
	readTO     time.Duration
	writeTO    time.Duration
	demoteFor  time.Duration
	hedge      time.Duration
	tls        *pki.Loader

	coalesceBatch, coalesceInflight int
	coalesceSet                     bool
	gather                          time.Duration // WithWriteGather
	gatherSet                       bool
	gatherFixed                     bool // WithWriteGatherAdaptive(false)
}

// ClientOption configures a Client.
type ClientOption func(*clientConfig)

// WithCacheTTL sets the stale-read cache's TTL (default 2 s; 0 disables it).
func WithCacheTTL(d time.Duration) ClientOption { return func(c *clientConfig) { c.ttl = d } }

// WithCacheEntries bounds the stale-read cache (default 100,000 entries).
func WithCacheEntries(n int) ClientOption { return func(c *clientConfig) { c.maxEntries = n } }

// WithRetries sets the attempt budget per call and the backoff between
// attempts (defaults: 10 attempts, 25 ms doubling to 800 ms, ~4 s in all —
// enough to ride out a leader election).
func WithRetries(attempts int, base, max time.Duration) ClientOption {
	return func(c *clientConfig) { c.attempts, c.boBase, c.boMax = attempts, base, max }
}

// WithHTTPClient replaces the HTTP client.
func WithHTTPClient(hc *http.Client) ClientOption { return func(c *clientConfig) { c.hc = hc } }

// WithTLS authenticates to the catalog nodes with the cluster's
// certificates (mutual TLS; the nodes must hold the catalog role). Ignored
// with WithHTTPClient, whose transport must then carry the configuration.
func WithTLS(l *pki.Loader) ClientOption { return func(c *clientConfig) { c.tls = l } }

// WithRequestTimeout bounds each HTTP request (default 15 s): the ceiling
// over the per-attempt timeouts.
func WithRequestTimeout(d time.Duration) ClientOption { return func(c *clientConfig) { c.timeout = d } }

// WithAttemptTimeouts bounds one attempt against one node: reads (default
// 750 ms) and writes (default 2 s). An attempt that times out moves on to the
// next node and demotes the one that did not answer. Keep them below the
// callers' budgets (the edge gives a catalog read 2 s), so a hung node costs
// one attempt, not the request.
func WithAttemptTimeouts(read, write time.Duration) ClientOption {
	return func(c *clientConfig) { c.readTO, c.writeTO = read, write }
}

// WithHedge sets how long a stale read waits for a node before it also
// asks the next one (the first answer wins, the other is cancelled); 0
// turns hedging off. Default 50 ms: a healthy node answers a stale read in
// about a millisecond, and a stopped or overloaded one then costs a stale
// read 50 ms instead of the attempt timeout (750 ms) — measured as the
// edge's GET p99 while a follower was SIGSTOPped (test/robustness).
func WithHedge(d time.Duration) ClientOption { return func(c *clientConfig) { c.hedge = d } }

// WithDemotion sets how long a node that timed out or refused connections is
// tried last (default 5 s; a fifth of it for "too stale" / "not ready").
func WithDemotion(d time.Duration) ClientOption { return func(c *clientConfig) { c.demoteFor = d } }

// WithClock injects the clock used for cache expiry and command timestamps.
func WithClock(now func() time.Time) ClientOption { return func(c *clientConfig) { c.now = now } }

// WithRequestIDs injects the request-ID generator (default time-ordered UUIDs, see internal/ids).
func WithRequestIDs(f func() string) ClientOption { return func(c *clientConfig) { c.newID = f } }

// NewClient returns a client of the nodes at addrs (host:port of their HTTP
// API). Writes and linearizable reads find the leader; stale reads are
// spread over all of them (see nodeOrder).
func NewClient(addrs []string, opts ...ClientOption) (*Client, error) {
	if len(addrs) == 0 {
		return nil, errors.New("raftmeta client: no node addresses")
	}
	cfg := clientConfig{ttl: 2 * time.Second, maxEntries: 100_000, attempts: 10,
		boBase: 25 * time.Millisecond, boMax: 800 * time.Millisecond, now: time.Now, newID: ids.New, timeout: 15 * time.Second,
		readTO: 750 * time.Millisecond, writeTO: 2 * time.Second, demoteFor: 5 * time.Second, hedge: 50 * time.Millisecond}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.hc == nil {
		cfg.hc = &http.Client{Timeout: cfg.timeout, Transport: cfg.tls.Transport(&http.Transport{
			MaxIdleConnsPerHost: 256, IdleConnTimeout: 90 * time.Second, ResponseHeaderTimeout: cfg.timeout,
		}, pki.RoleCatalog)}
	}
	if cfg.attempts < 1 {
		cfg.attempts = 1
	}
	c := &Client{addrs: append([]string(nil), addrs...), hc: cfg.hc, attempts: cfg.attempts,
		boBase: cfg.boBase, boMax: cfg.boMax, now: cfg.now, newID: cfg.newID, readTO: cfg.readTO, writeTO: cfg.writeTO, hedge: cfg.hedge,
		scheme: cfg.tls.Scheme()}
	c.nodes = newNodeOrder(c.addrs, cfg.now, cfg.demoteFor)
	if cfg.ttl > 0 {
		c.cache = newStaleCache(cfg.ttl, cfg.maxEntries, cfg.now)
	}
	c.bg, c.bgCancel = context.WithCancel(context.Background())
	if !cfg.coalesceSet {
		cfg.coalesceBatch, cfg.coalesceInflight = MaxApplyBatch, defaultCoalesceInflight
	}
	if !cfg.gatherSet {
		cfg.gather = defaultWriteGather
	}
	if cfg.coalesceInflight > 0 {
		c.writes = newCoalescer(c, cfg.coalesceBatch, cfg.coalesceInflight, cfg.gather, !cfg.gatherFixed)
	}
	return c, nil
}

// Close ends the writes the client is still sending for callers (their
// outcome is then unknown, ErrUnavailable), waits for its goroutines and
// releases idle connections. The client stays usable (Close used to only
// release connections, and some callers keep using it). Writes in flight
// when Close is called end with it; a write that starts while Close runs
// is not the client's to wait for (call Close once writers are done).
func (c *Client) Close() {
	c.bgMu.Lock()
	c.bgCancel()
	c.bg, c.bgCancel = context.WithCancel(context.Background())
	c.bgMu.Unlock()
	c.wg.Wait()
	c.hc.CloseIdleConnections()
}

// sendContext is the context coalesced sends run under (see bg).
func (c *Client) sendContext() context.Context {
	c.bgMu.Lock()
	defer c.bgMu.Unlock()
	return c.bg
}

// Leader returns the cached leader address ("" when unknown).
func (c *Client) Leader() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.leader
}

func (c *Client) setLeader(addr string) {
	c.mu.Lock()
	c.leader = addr
	c.mu.Unlock()
}

func (c *Client) dropLeader(addr string) {
	c.mu.Lock()
	if c.leader == addr {
		c.leader = ""
	}
	c.mu.Unlock()
}

func (c *Client) pause(ctx context.Context, attempt int) error {
	d := c.boBase << attempt
	if d > c.boMax || d <= 0 {
		d = c.boMax
	}
	return sleepCtx(ctx, d)
}

// do performs one attempt against addr, bounded by timeout (0: only ctx).
// An attempt that timed out, or could not connect, demotes addr.
func (c *Client) do(ctx context.Context, timeout time.Duration, method, addr, path string, body []byte, out any) (*http.Response, error) {
	actx := ctx
	if timeout > 0 {
		var cancel context.CancelFunc
		actx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	resp, err := c.doOnce(actx, method, addr, path, body, out)
	if err != nil && errors.Is(err, errTransport) && ctx.Err() == nil {
		c.nodes.demote(addr, c.nodes.demoteFor)
	}
	return resp, err
}

func (c *Client) doOnce(ctx context.Context, method, addr, path string, body []byte, out any) (*http.Response, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.scheme+"://"+addr+path, rd)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%w: %w: %s: %v", ErrUnavailable, errTransport, addr, err)
	}
	defer resp.Body.Close()
	return resp, decodeAnswer(resp, out)
}

// Apply proposes a command and returns its result. The request ID (filled
// when empty) is kept across retries so the command applies at most once.
// Concurrent calls share requests (coalesce.go, WithWriteBatching); each
// command keeps its own entry, result and refusal.
func (c *Client) Apply(ctx context.Context, cmd fsm.Command) (fsm.Result, error) {
	c.fillCommand(&cmd)
	body, err := json.Marshal(cmd)
	if err != nil {
		return fsm.Result{}, err
	}
	if c.writes != nil {
		return c.writes.do(ctx, body)
	}
	return c.applySingle(ctx, body)
}

// fillCommand gives cmd a request ID, the proposer's time and the command
// version when it has none.
func (c *Client) fillCommand(cmd *fsm.Command) {
	if cmd.RequestID == "" {
		cmd.RequestID = c.newID()
	}
	if cmd.Time == 0 {
		cmd.Time = c.now().UnixNano()
	}
	if cmd.Version == 0 {
		cmd.Version = fsm.CommandVersion
	}
}

// applySingle sends one command (its JSON) through POST /v1/apply, with
// the client's retries.
func (c *Client) applySingle(ctx context.Context, body []byte) (fsm.Result, error) {
	var lastErr error
	var order []string // rotation through the nodes when the leader is unknown
	for attempt := 0; attempt < c.attempts; attempt++ {
		target := c.writeTarget(&order)
		var out ApplyResponse
		resp, err := c.do(ctx, c.writeTO, http.MethodPost, target, "/v1/apply", body, &out)
		c.noteLeader(resp)
		if err == nil {
			return out.Result, nil
		}
		retryNow, nodeErr := c.writeFailed(err, target)
		if !nodeErr {
			return out.Result, err // a catalog refusal or a bad request
		}
		lastErr = err
		if retryNow {
			continue // follow the leader hint at once
		}
		if ctx.Err() != nil {
			break
		}
		if err := c.pause(ctx, attempt); err != nil {
			break
		}
	}
	return fsm.Result{}, writeGaveUp(ctx, lastErr)
}

// writeTarget is where a write goes next: the known leader, else the next
// node of a rotation (order, refilled when used up).
func (c *Client) writeTarget(order *[]string) string {
	if target := c.Leader(); target != "" {
		return target
	}
	if len(*order) == 0 {
		*order = c.nodes.order("", true)
	}
	target := (*order)[0]
	*order = (*order)[1:]
	return target
}

// noteLeader learns the leader a node's answer names: write answers, and
// read answers (a read-only client, such as an object host sending
// heartbeats with PreferFollowers, learns the leader to spare from them).
func (c *Client) noteLeader(resp *http.Response) {
	if resp != nil {
		if l := resp.Header.Get(headerLeader); l != "" {
			c.setLeader(l)
		}
	}
}

// writeFailed handles a write's failure at target. nodeErr: the node could
// not take it (not the leader, unavailable) and the write may be retried;
// otherwise err is the catalog's answer (a refusal, a bad request).
// retryNow: target named another leader, to be tried at once.
func (c *Client) writeFailed(err error, target string) (retryNow, nodeErr bool) {
	var nl *NotLeaderError
	switch {
	case errors.As(err, &nl):
		if nl.Leader != "" && nl.Leader != target {
			c.setLeader(nl.Leader)
			return true, true
		}
		c.dropLeader(target)
	case errors.Is(err, ErrUnavailable):
		c.dropLeader(target)
	default:
		return false, false
	}
	return false, true
}

// writeGaveUp is the error of a write whose attempts ran out (or ctx
// ended): always ErrUnavailable, the outcome unknown.
func writeGaveUp(ctx context.Context, lastErr error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%w: %v (last error: %v)", ErrUnavailable, ctx.Err(), lastErr)
	}
	if errors.Is(lastErr, ErrUnavailable) {
		return lastErr
	}
	return fmt.Errorf("%w: %v", ErrUnavailable, giveUpCause(ctx, lastErr))
}

// apply proposes one command of type t with body and decodes Result.Value
// into an R: what every typed write below is made of (besides its cache
// invalidation). The command's semantics and refusals are fsm's
// (raftmeta/fsm/cmd_<type>.go).
func apply[R any](ctx context.Context, c *Client, t fsm.CommandType, body any) (R, error) {
	var out R
	cmd, err := fsm.NewCommand(t, c.newID(), c.now().UnixNano(), body)
	if err != nil {
		return out, err
	}
	if a, ok := fsm.AuditFrom(ctx); ok {
		cmd.Audit = &a
	}
	res, err := c.Apply(ctx, cmd)
	if err != nil {
		return out, err
	}
	if len(res.Value) > 0 {
		if err := json.Unmarshal(res.Value, &out); err != nil {
			return out, fmt.Errorf("decode %s result: %w", t, err)
		}
	}
	return out, nil
}

// readAnswer is the envelope of read answers.
type readAnswer struct {
	Result json.RawMessage `json:"result"`
	Meta   ReadMeta        `json:"meta"`
}

// read serves one read, through the cache for stale reads.
func (c *Client) read(ctx context.Context, key, method, path string, q url.Values, body []byte, o ReadOptions, out any) error {
	lvl := o.level()
	if q == nil {
		q = url.Values{}
	}
	q.Set("consistency", string(lvl))
	if o.MaxStale > 0 {
		q.Set("max_stale", o.MaxStale.String())
	}
	full := path + "?" + q.Encode()
	if lvl != Stale || c.cache == nil || o.NoCache || key == "" {
		a, err := c.readNodes(ctx, method, full, body, lvl, o.PreferFollowers)
		if err != nil {
			return err
		}
		return json.Unmarshal(a.Result, out)
	}
	if data, ok := c.cache.get(key, o.MaxStale); ok {
		return json.Unmarshal(data, out)
	}
	// Concurrent misses of one key share one request. The shared call is
	// detached from any one caller's cancellation but bounded.
	ch := c.cache.group.DoChan(key, func() (any, error) {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		a, err := c.readNodes(sctx, method, full, body, lvl, o.PreferFollowers)
		if err != nil {
			return nil, err
		}
		c.cache.put(key, a.Result, time.Duration(a.Meta.StalenessMs)*time.Millisecond)
		return []byte(a.Result), nil
	})
	select {
	case <-ctx.Done():
		return fmt.Errorf("%w: %v", ErrUnavailable, ctx.Err())
	case r := <-ch:
		if r.Err != nil {
			return r.Err
		}
		return json.Unmarshal(r.Val.([]byte), out)
	}
}

// readNodes tries nodes for a read: the leader first for linearizable and
// leader reads (saves a hop), the healthy nodes round-robin for stale reads
// (see nodeOrder), falling back to the rest, in bounded rounds with backoff.
// A node answering "too stale" or "not ready" is tried last for a while.
// With followersFirst, a stale read tries the known leader after every
// healthy follower (ReadOptions.PreferFollowers).
func (c *Client) readNodes(ctx context.Context, method, full string, body []byte, lvl Consistency, followersFirst bool) (readAnswer, error) {
	var lastErr error
	tooStale := false
	rounds := (c.attempts + len(c.addrs) - 1) / len(c.addrs)
	if rounds < 2 {
		rounds = 2
	}
	for round := 0; round < rounds; round++ {
		if round > 0 {
			if err := c.pause(ctx, round-1); err != nil {
				break
			}
		}
		var order []string
		avoid := ""
		if lvl == Stale {
			if followersFirst {
				avoid = c.Leader()
			}
			order = c.nodes.orderAvoiding(avoid)
			if c.hedge > 0 && len(order) > 1 {
				a, final, stale, err := c.hedgedRound(ctx, method, full, body, order, avoid)
				if final {
					return a, err
				}
				lastErr, tooStale = err, tooStale || stale
				if ctx.Err() != nil {
					break
				}
				continue
			}
		} else {
			order = c.nodes.order(c.Leader(), false)
		}
		tried := map[string]bool{}
		for i := 0; i < len(order); i++ {
			addr := order[i]
			if tried[addr] {
				continue
			}
			tried[addr] = true
			var a readAnswer
			resp, err := c.do(ctx, c.readTO, method, addr, full, body, &a)
			if err == nil {
				c.nodes.restore(addr)
				c.noteLeader(resp)
				return a, nil
			}
			lastErr = err
			var nl *NotLeaderError
			switch {
			case errors.As(err, &nl):
				if nl.Leader != "" {
					c.setLeader(nl.Leader)
					if !tried[nl.Leader] {
						order = append(order[:i+1:i+1], append([]string{nl.Leader}, order[i+1:]...)...)
					}
				}
			case errors.Is(err, ErrTooStale), errors.Is(err, ErrNotReady):
				tooStale = true
				c.nodes.demote(addr, c.nodes.demoteBrief)
			case errors.Is(err, ErrUnavailable):
				c.dropLeader(addr)
			default:
				return a, err // not found, invalid: the answer
			}
			if ctx.Err() != nil {
				break
			}
		}
		if ctx.Err() != nil {
			break
		}
	}
	if tooStale && lvl == Stale {
		return readAnswer{}, fmt.Errorf("%w: no node within the staleness bound and caught up (last error: %v)", ErrTooStale, lastErr)
	}
	if errors.Is(lastErr, ErrUnavailable) {
		return readAnswer{}, lastErr
	}
	return readAnswer{}, fmt.Errorf("%w: %v", ErrUnavailable, giveUpCause(ctx, lastErr))
}

// giveUpCause is what a request that gave up reports: its last node's
// error, else the context's (it ended before any node was tried), never
// "<nil>".
func giveUpCause(ctx context.Context, lastErr error) error {
	if lastErr != nil {
		return lastErr
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return errors.New("no node answered")
}

// hedgedRound is one round of a stale read over order with hedging: the
// next node is asked as well when no answer came within c.hedge, or at once
// when an attempt failed. The first success or definitive answer (final:
// not found, invalid, …) wins and cancels the others; a cancelled attempt
// demotes nobody. Without a winner it returns the last error and whether a
// node answered "too stale" or "not ready" (demoted briefly, as in the
// sequential round). A node still unanswered past the hedge delay when
// another wins is demoted as a timed-out one would be. Node avoid (the
// leader, for PreferFollowers; last in order) is never asked as a hedge,
// only once every node before it has failed.
func (c *Client) hedgedRound(ctx context.Context, method, full string, body []byte, order []string, avoid string) (a readAnswer, final, tooStale bool, err error) {
	type result struct {
		addr string
		resp *http.Response
		a    readAnswer
		err  error
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	results := make(chan result, len(order)) // never blocks a loser
	next, inflight := 0, 0
	started := make(map[string]time.Time, len(order)) // in flight, by node
	launch := func() {
		addr := order[next]
		next++
		inflight++
		started[addr] = time.Now()
		go func() {
			var a readAnswer
			resp, err := c.do(rctx, c.readTO, method, addr, full, body, &a)
			results <- result{addr, resp, a, err}
		}()
	}
	launch()
	timer := time.NewTimer(c.hedge)
	defer timer.Stop()
	var lastErr error
	for inflight > 0 {
		select {
		case <-timer.C:
			if next < len(order) && (avoid == "" || order[next] != avoid) {
				launch()
				timer.Reset(c.hedge)
			}
		case r := <-results:
			inflight--
			delete(started, r.addr)
			if r.err == nil {
				c.nodes.restore(r.addr)
				c.noteLeader(r.resp)
				// A node outrun by a hedge is slow or hung: demote it like
				// one that timed out, so the next reads skip it.
				for addr, at := range started {
					if time.Since(at) >= c.hedge {
						c.nodes.demote(addr, c.nodes.demoteFor)
					}
				}
				return r.a, true, tooStale, nil
			}
			lastErr = r.err
			switch {
			case errors.Is(r.err, ErrTooStale), errors.Is(r.err, ErrNotReady):
				tooStale = true
				c.nodes.demote(r.addr, c.nodes.demoteBrief)
			case errors.Is(r.err, ErrUnavailable):
			default:
				return r.a, true, tooStale, r.err // not found, invalid: the answer
			}
			if next < len(order) {
				launch()
				timer.Reset(c.hedge)
			}
		case <-ctx.Done():
			return readAnswer{}, false, tooStale, lastErr
		}
	}
	return readAnswer{}, false, tooStale, lastErr
}

// Cache keys: one entry per question, shared by every caller asking it.
func keyAccount(id string) string        { return "account:" + id }
func keyDatabase(u string) string        { return "db:" + u }
func keyByName(acct, name string) string { return "dbname:" + acct + "/" + name }
func keyListPrefix(acct string) string   { return "list:" + acct + "?" }

// invalidateAccount drops the cached answers a write to acct may change.
func (c *Client) invalidate(acct, dbUUID, name string) {
	if c.cache == nil {
		return
	}
	keys := []string{}
	if acct != "" {
		keys = append(keys, keyAccount(acct), keyListPrefix(acct)+"*")
		if name != "" {
			keys = append(keys, keyByName(acct, name))
		} else {
			keys = append(keys, "dbname:"+acct+"/*")
		}
	}
	if dbUUID != "" {
		keys = append(keys, keyDatabase(dbUUID))
	}
	c.cache.invalidate(keys...)
}

// Writes.

func (c *Client) CreateAccount(ctx context.Context, a fsm.CreateAccount) (fsm.Account, error) {
	out, err := apply[fsm.Account](ctx, c, fsm.CmdCreateAccount, a)
	c.invalidate(a.ID, "", "")
	return out, err
}

func (c *Client) UpdateAccount(ctx context.Context, a fsm.UpdateAccount) (fsm.Account, error) {
	out, err := apply[fsm.Account](ctx, c, fsm.CmdUpdateAccount, a)
	c.invalidate(a.ID, "", "")
	return out, err
}

func (c *Client) CreateToken(ctx context.Context, t fsm.CreateToken) (fsm.Token, error) {
	out, err := apply[fsm.Token](ctx, c, fsm.CmdCreateToken, t)
	if c.cache != nil {
		c.cache.invalidate("token:" + t.Hash)
	}
	return out, err
}

func (c *Client) RevokeToken(ctx context.Context, id string) (fsm.Token, error) {
	out, err := apply[fsm.Token](ctx, c, fsm.CmdRevokeToken, fsm.RevokeToken{ID: id})
	if c.cache != nil {
		c.cache.invalidate("token:*") // the hash is not known here
	}
	return out, err
}

func (c *Client) RegisterHost(ctx context.Context, h fsm.RegisterHost) (fsm.Host, error) {
	out, err := apply[fsm.Host](ctx, c, fsm.CmdRegisterHost, h)
	if c.cache != nil {
		c.cache.invalidate("hosts")
	}
	return out, err
}

func (c *Client) ReportHostLoad(ctx context.Context, h fsm.ReportHostLoad) (fsm.Host, error) {
	out, err := apply[fsm.Host](ctx, c, fsm.CmdReportHostLoad, h)
	if c.cache != nil {
		c.cache.invalidate("hosts")
	}
	return out, err
}

// FenceOrphans fences the UUIDs a host is about to delete as orphans
// (fsm.CmdFenceOrphans): only the answer's Fenced ones may be deleted.
func (c *Client) FenceOrphans(ctx context.Context, f fsm.FenceOrphans) (fsm.FenceAnswer, error) {
	return apply[fsm.FenceAnswer](ctx, c, fsm.CmdFenceOrphans, f)
}

func (c *Client) CreateDatabase(ctx context.Context, d fsm.CreateDatabase) (fsm.Database, error) {
	out, err := apply[fsm.Database](ctx, c, fsm.CmdCreateDatabase, d)
	c.invalidate(d.AccountID, d.UUID, d.Name)
	return out, err
}

func (c *Client) DeleteDatabase(ctx context.Context, accountID, dbUUID string) (fsm.Database, error) {
	out, err := apply[fsm.Database](ctx, c, fsm.CmdDeleteDatabase, fsm.DeleteDatabase{AccountID: accountID, UUID: dbUUID})
	c.invalidate(accountID, dbUUID, out.Name)
	return out, err
}

// DeleteDatabaseIf deletes a database only while the catalog names the
// expected object and routing generation (fsm.CmdDeleteDatabaseIf);
// otherwise it answers fsm.ErrConflict and nothing changed. A node of a
// build older than the command answers fsm.ErrUnknownCommand and deletes
// nothing.
func (c *Client) DeleteDatabaseIf(ctx context.Context, d fsm.DeleteDatabaseIf) (fsm.Database, error) {
	out, err := apply[fsm.Database](ctx, c, fsm.CmdDeleteDatabaseIf, d)
	c.invalidate(d.AccountID, d.UUID, out.Name)
	return out, err
}

func (c *Client) UpdateDatabase(ctx context.Context, d fsm.UpdateDatabase) (fsm.Database, error) {
	out, err := apply[fsm.Database](ctx, c, fsm.CmdUpdateDatabase, d)
	c.invalidate(d.AccountID, d.UUID, out.Name)
	return out, err
}

// SetDatabaseStats records sizes (at most fsm.MaxStatsPerCommand per call,
// which fits the API's 1 MiB body): a size is kept only if its Seq is
// greater than the stored one, so retrying a call, or sending a size again
// or late, is harmless (counted as StatsResult.Stale). The account totals
// they feed change only at the next drain, so no cache entry is dropped.
func (c *Client) SetDatabaseStats(ctx context.Context, stats []fsm.DatabaseStat) (fsm.StatsResult, error) {
	if len(stats) > fsm.MaxStatsPerCommand {
		return fsm.StatsResult{}, &fsm.Error{Code: fsm.CodeInvalid,
			Message: fmt.Sprintf("invalid command: %d stats in one command, at most %d", len(stats), fsm.MaxStatsPerCommand)}
	}
	return apply[fsm.StatsResult](ctx, c, fsm.CmdSetDatabaseStats, fsm.SetDatabaseStats{Stats: stats})
}

// Reads.

func (c *Client) Database(ctx context.Context, dbUUID string, o ReadOptions) (fsm.Database, error) {
	var out fsm.Database
	err := c.read(ctx, keyDatabase(dbUUID), http.MethodGet, "/v1/databases/"+url.PathEscape(dbUUID), nil, nil, o, &out)
	return out, err
}

func (c *Client) DatabaseByName(ctx context.Context, accountID, name string, o ReadOptions) (fsm.Database, error) {
	var out fsm.Database
	err := c.read(ctx, keyByName(accountID, name), http.MethodGet,
		"/v1/accounts/"+url.PathEscape(accountID)+"/databases/by-name/"+url.PathEscape(name), nil, nil, o, &out)
	return out, err
}

func (c *Client) ListDatabases(ctx context.Context, accountID string, lq fsm.ListQuery, o ReadOptions) ([]fsm.Database, int64, error) {
	q := url.Values{}
	if lq.Name != "" {
		q.Set("name", lq.Name)
	}
	if lq.Page != 0 {
		q.Set("page", strconv.Itoa(lq.Page))
	}
	if lq.PerPage != 0 {
		q.Set("per_page", strconv.Itoa(lq.PerPage))
	}
	key := keyListPrefix(accountID) + q.Encode()
	var out DatabaseList
	err := c.read(ctx, key, http.MethodGet, "/v1/accounts/"+url.PathEscape(accountID)+"/databases", q, nil, o, &out)
	return out.Databases, out.Total, err
}

func (c *Client) Account(ctx context.Context, id string, o ReadOptions) (fsm.Account, error) {
	var out fsm.Account
	err := c.read(ctx, keyAccount(id), http.MethodGet, "/v1/accounts/"+url.PathEscape(id), nil, nil, o, &out)
	return out, err
}

func (c *Client) TokenByHash(ctx context.Context, hash string, o ReadOptions) (fsm.Token, error) {
	var out fsm.Token
	err := c.read(ctx, "token:"+hash, http.MethodGet, "/v1/tokens/"+url.PathEscape(hash), nil, nil, o, &out)
	return out, err
}

func (c *Client) Hosts(ctx context.Context, o ReadOptions) ([]fsm.Host, error) {
	var out []fsm.Host
	err := c.read(ctx, "hosts", http.MethodGet, "/v1/hosts", nil, nil, o, &out)
	return out, err
}

// HeartbeatDigests asks which of a host's bucket digests differ from the
// catalog's, and for the accounts it names (fsm.DigestQuery). Never cached.
// A node of a build without the call answers a not_found *fsm.Error
// (IsDigestsUnsupported).
func (c *Client) HeartbeatDigests(ctx context.Context, q fsm.DigestQuery, o ReadOptions) (fsm.DigestAnswer, error) {
	body, err := json.Marshal(q)
	if err != nil {
		return fsm.DigestAnswer{}, err
	}
	var out fsm.DigestAnswer
	err = c.read(ctx, "", http.MethodPost, "/v1/heartbeat/digests", nil, body, o, &out)
	return out, err
}

// IsDigestsUnsupported reports the answer of a catalog node whose build has
// no /v1/heartbeat/digests (the route's 404): the caller sends per-database
// heartbeats instead. The route itself never answers not_found.
func IsDigestsUnsupported(err error) bool {
	var fe *fsm.Error
	return errors.As(err, &fe) && fe.Code == fsm.CodeNotFound
}

// Heartbeat answers a host's batch. It is never cached: batches differ per
// host and per round, so an entry would not be shared.
func (c *Client) Heartbeat(ctx context.Context, uuids []string, o ReadOptions) (fsm.HeartbeatAnswer, error) {
	body, err := json.Marshal(HeartbeatRequest{UUIDs: uuids})
	if err != nil {
		return fsm.HeartbeatAnswer{}, err
	}
	var out fsm.HeartbeatAnswer
	err = c.read(ctx, "", http.MethodPost, "/v1/heartbeat", nil, body, o, &out)
	return out, err
}
