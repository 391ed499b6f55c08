package edge

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/gorilla/mux"

	"github.com/shoaldb/shoal/internal/ids"
	v4 "github.com/shoaldb/shoal/internal/v4"
	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// initialGeneration is the routing generation an object is initialised with:
// the catalog assigns 1 to a new database row.
const initialGeneration = 1

// databaseJSON is D1's database object.
type databaseJSON struct {
	UUID            string          `json:"uuid"`
	Name            string          `json:"name"`
	CreatedAt       string          `json:"created_at"`
	Version         string          `json:"version"`
	NumTables       int64           `json:"num_tables"`
	FileSize        int64           `json:"file_size"`
	Jurisdiction    *string         `json:"jurisdiction"`
	RunningInRegion string          `json:"running_in_region,omitempty"`
	CreatedInRegion string          `json:"created_in_region,omitempty"` // create's answer only, as D1
	ReadReplication readReplication `json:"read_replication"`
}

type readReplication struct {
	Mode string `json:"mode"`
}

// listItemJSON is one entry of D1's database list.
type listItemJSON struct {
	UUID         string  `json:"uuid"`
	Name         string  `json:"name"`
	CreatedAt    string  `json:"created_at"`
	Version      string  `json:"version"`
	Jurisdiction *string `json:"jurisdiction"`
}

func d1Time(unixNano int64) string {
	return time.Unix(0, unixNano).UTC().Format("2006-01-02T15:04:05.000Z")
}

func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func toJSON(d fsm.Database, numTables, fileSize int64) databaseJSON {
	mode := d.ReadReplication
	if mode == "" {
		mode = "disabled"
	}
	return databaseJSON{
		UUID: d.UUID, Name: d.Name, CreatedAt: d1Time(d.CreatedAt), Version: "production",
		NumTables: numTables, FileSize: fileSize, Jurisdiction: nullable(d.Jurisdiction),
		RunningInRegion: strings.ToUpper(d.Region), ReadReplication: readReplication{Mode: mode},
	}
}

// catalogRead runs a catalog read under the fallback guard (cap + breaker).
func catalogRead[T any](ctx context.Context, s *Server, fn func(ctx context.Context) (T, error)) (T, error) {
	var out T
	err := s.fb.do(ctx, func(ctx context.Context) error {
		var err error
		out, err = fn(ctx)
		return err
	})
	return out, err
}

// catalogWrite bounds a catalog write in time and classifies its failure.
func (s *Server) catalogWrite(ctx context.Context, fn func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, 3*s.o.CatalogTimeout)
	defer cancel()
	err := fn(ctx)
	if err != nil && !isCatalogRefusal(err) {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return err
}

// ownDatabase reads a database from the catalog and checks it is active and
// belongs to acct; otherwise ErrDatabaseNotFound (existence never leaks).
func (s *Server) ownDatabase(ctx context.Context, acct, id string) (fsm.Database, error) {
	d, err := catalogRead(ctx, s, func(ctx context.Context) (fsm.Database, error) { return s.catalog.Database(ctx, id) })
	if err != nil {
		return fsm.Database{}, err
	}
	if d.AccountID != acct || d.State != fsm.StateActive {
		return fsm.Database{}, ErrDatabaseNotFound
	}
	return d, nil
}

func (s *Server) pathDatabase(r *http.Request) (acct, id string, err error) {
	id, err = canonicalUUID(pathVar(r, "database_id"))
	return pathVar(r, "account_id"), id, err
}

// databaseRequest starts every per-database endpoint: the path's account
// and canonical database UUID, then the account's and database's rate limits.
func (s *Server) databaseRequest(r *http.Request) (acct, id string, err error) {
	acct, id, err = s.pathDatabase(r)
	if err == nil {
		err = s.checkRate(acct, id)
	}
	return acct, id, err
}

// staleAccountRow is accountRow for reads that only need the account's
// tier (time travel's retention): while the catalog is unavailable it
// answers the row this edge last read, if read within TokenStaleGrace —
// the grace for which the edge already trusts the token that names the
// account. Limits that gate a write (creates) use accountRow, which never
// answers a stale row past AccountCacheTTL.
func (s *Server) staleAccountRow(ctx context.Context, id string) (fsm.Account, error) {
	a, err := s.accountRow(ctx, id)
	if err == nil || !errors.Is(err, ErrUnavailable) {
		return a, err
	}
	s.acctMu.Lock()
	c, ok := s.accts[id]
	s.acctMu.Unlock()
	if ok && s.o.Now().Sub(c.fetched) < s.o.TokenStaleGrace {
		return c.acct, nil
	}
	return a, err
}

// account returns the account row for limit checks: a follower read cached
// per account (many creates in one account share one read).
func (s *Server) accountRow(ctx context.Context, id string) (fsm.Account, error) {
	now := s.o.Now()
	s.acctMu.Lock()
	c, ok := s.accts[id]
	s.acctMu.Unlock()
	if ok && now.Sub(c.fetched) < s.o.AccountCacheTTL {
		return c.acct, nil
	}
	v, err, _ := s.acctGroup.Do(id, func() (any, error) {
		return catalogRead(ctx, s, func(ctx context.Context) (fsm.Account, error) { return s.catalog.Account(ctx, id) })
	})
	if err != nil {
		return fsm.Account{}, err
	}
	a := v.(fsm.Account)
	s.acctMu.Lock()
	if len(s.accts) > 100_000 {
		s.accts = make(map[string]cachedAccount)
	}
	s.accts[id] = cachedAccount{acct: a, fetched: now}
	s.acctMu.Unlock()
	return a, nil
}

// activeHosts returns the host list, cached for HostsCacheTTL and served stale
// when the catalog cannot be read.
func (s *Server) activeHosts(ctx context.Context) ([]fsm.Host, error) {
	now := s.o.Now()
	s.hostsMu.Lock()
	list, fetched := s.hostsList, s.hostsFetched
	s.hostsMu.Unlock()
	if list != nil && now.Sub(fetched) < s.o.HostsCacheTTL {
		return list, nil
	}
	fresh, err := catalogRead(ctx, s, func(ctx context.Context) ([]fsm.Host, error) { return s.catalog.Hosts(ctx) })
	if err != nil {
		if list != nil {
			return list, nil
		}
		return nil, err
	}
	return s.setHostList(fresh, now), nil
}

// setHostList installs a host list read from the catalog at now: the
// active hosts for placement, the jurisdictions of all, and the host book
// (bookHosts). It returns the active hosts.
func (s *Server) setHostList(fresh []fsm.Host, now time.Time) []fsm.Host {
	var active []fsm.Host
	jurs := map[string]bool{}
	for _, h := range fresh {
		if h.State == "" || h.State == "active" {
			active = append(active, h)
		}
		jurs[h.Jurisdiction] = true
	}
	s.hostsMu.Lock()
	s.hostsList, s.hostsFetched, s.hostsJurs = active, now, jurs
	s.hostsPending = make(map[string]int64)
	s.hostsMu.Unlock()
	s.bookHosts(fresh)
	return active
}

// bookHosts makes every registered address of a host list read from the
// catalog (any state: a draining or down host may still hold objects) the
// host book (hostbook.go). Only placement reads the list (activeHosts,
// every HostsCacheTTL while creates come): a background read would put a
// catalog read on edges that only serve queries, and the book learns
// their hosts from the routes they store (miss fills, the route feed).
func (s *Server) bookHosts(fresh []fsm.Host) {
	addrs := make([]string, 0, len(fresh))
	for _, h := range fresh {
		addrs = append(addrs, h.Address)
	}
	if len(addrs) == 0 {
		return // an empty list (a catalog just bootstrapped) erases nothing
	}
	if err := s.cache.ReplaceHosts(addrs); err != nil {
		s.log.Warn("host book write failed", "err", err)
	}
}

// pickHost places a new database: hosts of the jurisdiction if one is given,
// else of the location hint's region, else of this edge's region, falling
// back to any active host (not for a jurisdiction: that is a legal
// constraint). Among candidates, the least loaded by databases per capacity,
// counting the creates this edge placed since the last host list refresh so
// a burst of creates spreads out — except that a candidate with inits in
// flight or queuing for a batch is preferred while it is within
// placementSlack databases of the least loaded (placeAmongQueued). Hosts in
// exclude failed earlier attempts of the same create and are avoided while
// others remain.
func (s *Server) pickHost(ctx context.Context, jurisdiction, hint string, exclude map[string]bool) (fsm.Host, error) {
	hosts, err := s.activeHosts(ctx)
	if err != nil {
		return fsm.Host{}, err
	}
	region := s.o.Region
	if hint != "" {
		region = hint
	}
	s.hostsMu.Lock()
	h, err := placeAmongQueued(hosts, jurisdiction, region, exclude, s.hostsPending, s.queuedInits)
	s.hostsMu.Unlock()
	if err != nil {
		var nj *noJurisdictionError
		if errors.As(err, &nj) {
			return fsm.Host{}, s.noHostInJurisdiction(jurisdiction, hosts)
		}
		return fsm.Host{}, err
	}
	return h, nil
}

// placementSlack is how many databases more than the least loaded
// candidate a host may hold and still be preferred because inits queue for
// it (placeAmongQueued). Each time the busy host reaches it, the next
// create starts alone on another host and the old host's forming batch is
// cut short: at 64 that happened every 3–4 init batches at 64 clients
// (init batches of 17); at 512, with the init batchers' group hold,
// init batches of 23–24 and the hosts' CPU per create 0.85–0.90× of
// main's in the same rounds (docs/benchmarks.md, "Grouping the next
// batch"). 512 databases is 0.5% of a host's default capacity.
const placementSlack = 512

// placeAmong is the placement rule shared by creates and relocations
// (relocate.go): among active hosts, those of the jurisdiction if one is
// given (a legal constraint: no fallback), else those of region, falling
// back to any; hosts in exclude are avoided while others remain; then the
// least loaded by databases per capacity, counting pending (placements made
// since the host list was read, incremented for the chosen host).
func placeAmong(hosts []fsm.Host, jurisdiction, region string, exclude map[string]bool, pending map[string]int64) (fsm.Host, error) {
	return placeAmongQueued(hosts, jurisdiction, region, exclude, pending, nil)
}

// placeAmongQueued is placeAmong for creates: queued(address) is how busy
// that host's init batcher is (queuedInits; nil: never). Among the
// candidates within placementSlack databases of the least loaded, the
// busiest is chosen, so concurrent creates meet in one host's batch — one
// request and one index commit (fsync) on the host for all of them —
// instead of spreading one or two over every host
// (measured: ~1.7 inits per batch at 16 concurrent creates on 3 hosts; the
// host's index commit was half its CPU per create). With no queue anywhere
// (an idle edge, batching off) the least loaded is chosen, as before; the
// slack bounds the skew, so the spread over hosts is unchanged beyond
// placementSlack databases. The eligibility rules (jurisdiction, region,
// exclude) come first and are never traded for a batch.
func placeAmongQueued(hosts []fsm.Host, jurisdiction, region string, exclude map[string]bool, pending map[string]int64,
	queued func(addr string) int) (fsm.Host, error) {
	filter := func(keep func(fsm.Host) bool) []fsm.Host {
		var out []fsm.Host
		for _, h := range hosts {
			if keep(h) {
				out = append(out, h)
			}
		}
		return out
	}
	var cands []fsm.Host
	if jurisdiction != "" {
		cands = filter(func(h fsm.Host) bool { return h.Jurisdiction == jurisdiction })
		if len(cands) == 0 {
			return fsm.Host{}, &noJurisdictionError{jurisdiction: jurisdiction}
		}
	} else {
		cands = filter(func(h fsm.Host) bool { return h.Region == region })
		if len(cands) == 0 {
			cands = hosts
		}
	}
	if len(cands) == 0 {
		return fsm.Host{}, fmt.Errorf("%w: no active object host", ErrUnavailable)
	}
	if len(exclude) > 0 {
		var rest []fsm.Host
		for _, h := range cands {
			if !exclude[h.ID] {
				rest = append(rest, h)
			}
		}
		if len(rest) > 0 {
			cands = rest
		}
	}
	capacityOf := func(h fsm.Host) float64 {
		if h.Capacity <= 0 {
			return 100_000
		}
		return float64(h.Capacity)
	}
	best, bestLoad := -1, 0.0
	loads := make([]float64, len(cands))
	for i, h := range cands {
		loads[i] = float64(h.Databases+pending[h.ID]) / capacityOf(h)
		if best < 0 || loads[i] < bestLoad {
			best, bestLoad = i, loads[i]
		}
	}
	if queued != nil && len(cands) > 1 {
		most := 0
		for i, h := range cands {
			if loads[i] > bestLoad+placementSlack/capacityOf(h) {
				continue
			}
			if q := queued(h.Address); q > most {
				best, most = i, q
			}
		}
	}
	pending[cands[best].ID]++
	return cands[best], nil
}

// queuedInits is how busy the init batcher of the host at addr is: the
// inits waiting for its next batch, plus one per batch in flight (0: idle,
// batching off, or stalled: see initStall). A create placed on a busy host joins its next batch.
func (s *Server) queuedInits(addr string) int {
	s.cb.mu.Lock()
	b := s.cb.inits[addr]
	s.cb.mu.Unlock()
	if b == nil {
		return 0
	}
	return b.load(initStall)
}

// initStall is how long a host's init batcher may have a batch in flight
// without any batch coming back before the host stops counting as busy for
// placement (queuedInits): an init batch is answered after one index commit
// (~10 ms under load), so a host silent for this long is hung or drowning,
// and new creates go by the least-loaded rule instead of joining its batch.
const initStall = 200 * time.Millisecond

func newObjectID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func (s *Server) failpoint(step string) error {
	if s.o.Failpoint == nil {
		return nil
	}
	return s.o.Failpoint(step)
}

// createDatabase is the create flow of the design brief:
//
//  1. limit check from a cached follower read of the account;
//  2. a fresh database UUID and a fresh object ID for every attempt;
//  3. placement: jurisdiction > location hint > this edge's region;
//  4. init on the object (the object persists its own metadata);
//  5. the catalog write through Raft — THE CREATION CHECKPOINT: once it
//     commits, the database exists even if this edge dies before answering;
//  6. if 4 or 5 fails retryably, back to 2 with NEW ids (a UUID is never
//     paired with a second object); the orphaned object of a failed attempt
//     is never confirmed and deletes itself when its heartbeat finds no
//     catalog row;
//  7. after answering, confirm to the object in the background (best effort;
//     heartbeats repair a lost confirm).
//
// Nothing is held open in the catalog across the object call.
//
// src, when set, makes the new database's content an archived state (a
// fork, fork.go): the object host restores it during (4), before the
// checkpoint, so an acknowledged fork is durable like any create.
func (s *Server) createDatabase(ctx context.Context, acct string, body CreateBody, src *RestoreSource) (fsm.Database, error) {
	// tk counts this create as on its way to the catalog batcher, which
	// may wait for it (createbatch.go, "Gathering the catalog batch"):
	// the first attempt only; a fork's init goes alone.
	var tk *createTicket
	if src == nil {
		tk = s.cb.startCreate()
	}
	defer func() { tk.leave() }()
	// (1) Limit check. Stale by design; the catalog write enforces the limit
	// authoritatively in the same transaction that counts the database.
	t0 := time.Now()
	a, err := s.accountRow(ctx, acct)
	s.m.stepAccount.Observe(time.Since(t0).Seconds())
	if err != nil {
		return fsm.Database{}, err
	}
	if a.Limits.MaxDatabases > 0 && a.ActiveDatabases >= a.Limits.MaxDatabases {
		return fsm.Database{}, &databaseLimitError{max: a.Limits.MaxDatabases, tier: a.Tier}
	}
	jur, hint, mode := "", "", "disabled"
	if body.ReadReplication != nil {
		mode = *body.ReadReplication.Mode // validated by parseCreateBody
	}
	if body.Jurisdiction != nil {
		jur = strings.ToLower(*body.Jurisdiction)
	}
	if body.PrimaryLocationHint != nil {
		hint = strings.ToLower(*body.PrimaryLocationHint)
	}
	exclude := map[string]bool{}
	var unknown []string // UUIDs whose catalog write may have committed
	var lastErr error
	for attempt := 0; attempt < s.o.CreateAttempts; attempt++ {
		if attempt > 0 {
			tk.leave()
			tk = nil
			select {
			case <-ctx.Done():
				return fsm.Database{}, fmt.Errorf("%w: %w", ErrUnavailable, ctx.Err())
			case <-time.After(s.o.CreateBackoff << (attempt - 1)):
			}
		}
		// (2) Fresh ids for this attempt.
		id, objectID := ids.New(), newObjectID()
		// (3) Placement.
		t0 = time.Now()
		host, err := s.pickHost(ctx, jur, hint, exclude)
		s.m.stepPlace.Observe(time.Since(t0).Seconds())
		if err != nil {
			// No candidate host: the (cached) host list will not change
			// within this request's backoff, so waiting buys nothing.
			s.m.createTries.WithLabelValues("no_host").Inc()
			var nj *noJurisdictionError
			if errors.As(err, &nj) {
				s.log.Warn("create refused: no object host serves the jurisdiction", "request_id", requestIDFrom(ctx),
					"account", acct, "jurisdiction", nj.jurisdiction, "served", nj.served)
			}
			return fsm.Database{}, err
		}
		// (4) Init on the object.
		t0 = time.Now()
		err = s.initObject(ctx, host.Address, objectID, InitRequest{
			DatabaseUUID: id, AccountID: acct, Name: *body.Name, Region: host.Region, Jurisdiction: jur,
			RoutingGeneration: initialGeneration, Options: InitOptions{HeartbeatIntervalMs: a.Limits.HeartbeatIntervalMs},
			RestoreFrom: src,
		}, tk)
		s.m.stepInit.Observe(time.Since(t0).Seconds())
		if err == nil {
			err = s.failpoint("create:after-init")
		}
		if err != nil { // tk leaves at the retry (loop top) or the return (defer)
			lastErr = err
			s.m.createTries.WithLabelValues("init_failed").Inc()
			var he *HostError
			if src != nil && errors.As(err, &he) && he.Status == http.StatusBadRequest {
				// A fork's source state refused (a bookmark not archived or
				// past retention): the client's, passed through.
				return fsm.Database{}, err
			}
			if !retryable(err) {
				// The host refused our own request: an internal fault, not
				// the client's (deliberately not wrapped: answers 500).
				return fsm.Database{}, fmt.Errorf("object init refused: %v", err)
			}
			exclude[host.ID] = true
			continue
		}
		// (5) THE CREATION CHECKPOINT: the catalog write through Raft.
		// Concurrent creates share one catalog request (createbatch.go),
		// each still its own command with its own request ID and outcome.
		t0 = time.Now()
		d, err := s.createCatalogWrite(ctx, fsm.CreateDatabase{
			UUID: id, AccountID: acct, Name: *body.Name, ObjectID: objectID, HostID: host.ID,
			Region: host.Region, Jurisdiction: jur, ReadReplication: mode,
		}, tk) // tk is gone from here: the write was queued, or the path without a batcher left it
		s.m.stepCatalog.Observe(time.Since(t0).Seconds())
		if err == nil {
			s.m.createTries.WithLabelValues("created").Inc()
			if d.HostAddress == "" {
				d.HostAddress = host.Address
			}
			// Failpoint: the edge dies right after the checkpoint (no
			// answer, no cache fill, no confirm). The database must exist.
			if fp := s.failpoint("create:after-catalog-write"); fp != nil {
				return fsm.Database{}, fp
			}
			t0 = time.Now()
			s.afterCreate(d)
			s.m.stepAfter.Observe(time.Since(t0).Seconds())
			return d, nil
		}
		if errors.Is(err, fsm.ErrExists) {
			// The host fenced this UUID as an orphan (fsm.CmdFenceOrphans:
			// the init outlived its creation grace before this write
			// landed) and is deleting the object: retry from (2) with new
			// IDs, as after a failed init.
			s.m.createTries.WithLabelValues("fenced").Inc()
			lastErr = err
			continue
		}
		if errors.Is(err, fsm.ErrNameTaken) && len(unknown) > 0 {
			// An earlier attempt whose answer was lost may have committed.
			if d, ok := s.resolveLostCreate(ctx, acct, *body.Name, unknown); ok {
				s.m.createTries.WithLabelValues("created").Inc()
				s.afterCreate(d)
				return d, nil
			}
		}
		if isCatalogRefusal(err) {
			s.m.createTries.WithLabelValues("refused").Inc()
			return fsm.Database{}, err // final: name taken, limit reached, …
		}
		s.m.createTries.WithLabelValues("catalog_failed").Inc()
		unknown = append(unknown, id)
		lastErr = err
	}
	if errors.Is(lastErr, ErrUnavailable) {
		return fsm.Database{}, lastErr
	}
	return fsm.Database{}, fmt.Errorf("%w: create failed after %d attempts: %w", ErrUnavailable, s.o.CreateAttempts, lastErr)
}

// resolveLostCreate finds whether the database named name is one of our own
// earlier attempts (a committed write whose answer was lost).
func (s *Server) resolveLostCreate(ctx context.Context, acct, name string, ids []string) (fsm.Database, bool) {
	for try := 0; try < 3; try++ {
		d, err := catalogRead(ctx, s, func(ctx context.Context) (fsm.Database, error) {
			return s.catalog.DatabaseByName(ctx, acct, name)
		})
		if err == nil {
			for _, id := range ids {
				if d.UUID == id {
					return d, true
				}
			}
			return fsm.Database{}, false
		}
		// A follower may lag the leader that refused the name: retry briefly.
		time.Sleep(20 * time.Millisecond << try)
	}
	return fsm.Database{}, false
}

// afterCreate puts the new route in the cache (the first query needs no
// catalog read) and schedules step (7), the confirm. The route is staged
// (routestage.go): readable at once, written to the file within
// RouteStageLinger with the routes of the other creates of that time.
func (s *Server) afterCreate(d fsm.Database) {
	rt := routeOf(d)
	if err := s.cache.Stage(rt); err != nil {
		s.log.Warn("route cache write failed", "err", err)
	}
	s.postConfirm(rt)
}

func (s *Server) handleCreate(w http.ResponseWriter, r *http.Request, _ principal) {
	acct := mux.Vars(r)["account_id"]
	if err := s.checkRate(acct, ""); err != nil {
		s.writeErr(w, r, err)
		return
	}
	b, err := readBody(r.Body, s.o.Limits.MaxBodyBytes)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	body, err := parseCreateBody(b, s.o.Limits)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	// The flow runs to completion even if the client goes away: abandoning
	// it between init and the checkpoint only makes orphans (and an
	// abandoned checkpoint write has an unknown outcome anyway).
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 30*time.Second)
	defer cancel()
	d, err := s.createDatabase(ctx, acct, body, nil)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	s.writes.wrote(acct)
	out := toJSON(d, 0, 0)
	out.CreatedInRegion = out.RunningInRegion
	v4.WriteResult(w, out)
}

func (s *Server) handleList(w http.ResponseWriter, r *http.Request, p principal) {
	acct := mux.Vars(r)["account_id"]
	if err := s.checkRate(acct, ""); err != nil {
		s.writeErr(w, r, err)
		return
	}
	q := r.URL.Query()
	page, perPage := 1, 100
	if v := q.Get("page"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			s.writeErr(w, r, invalid("Invalid property: page => must be an integer >= 1"))
			return
		}
		page = n
	}
	if v := q.Get("per_page"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			s.writeErr(w, r, invalid("Invalid property: per_page => must be an integer >= 1"))
			return
		}
		perPage = min(max(n, 10), 10_000) // D1's documented bounds
	}
	name := q.Get("name")
	if err := checkNameFilter(name); err != nil {
		s.writeErr(w, r, err)
		return
	}
	if len(p.databases) > 0 {
		s.listLimited(w, r, p, acct, name, page, perPage)
		return
	}
	type listed struct {
		dbs   []fsm.Database
		total int64
	}
	lctx := r.Context()
	if s.writes.recent(acct) {
		lctx = withLeaderReads(lctx) // read-your-writes through this edge
	}
	res, err := catalogRead(lctx, s, func(ctx context.Context) (listed, error) {
		dbs, total, err := s.catalog.ListDatabases(ctx, acct, fsm.ListQuery{Name: name, Page: page, PerPage: perPage})
		return listed{dbs, total}, err
	})
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	items := make([]listItemJSON, 0, len(res.dbs))
	for _, d := range res.dbs {
		if d.AccountID != acct || d.State != fsm.StateActive {
			continue // defence in depth: never show another account's rows
		}
		items = append(items, listItemJSON{UUID: d.UUID, Name: d.Name, CreatedAt: d1Time(d.CreatedAt),
			Version: "production", Jurisdiction: nullable(d.Jurisdiction)})
	}
	v4.WriteList(w, items, v4.ResultInfo{Page: page, PerPage: perPage, Count: len(items), TotalCount: res.total})
}

// listLimited lists for a token limited to databases: those of its list
// that exist (read one by one: at most 100), filtered by name, oldest
// first as the catalog lists, then paged.
func (s *Server) listLimited(w http.ResponseWriter, r *http.Request, p principal, acct, name string, page, perPage int) {
	var dbs []fsm.Database
	for _, id := range p.databases {
		d, err := s.ownDatabase(r.Context(), acct, id)
		switch {
		case errors.Is(err, ErrDatabaseNotFound), errors.Is(err, fsm.ErrNotFound):
			continue
		case err != nil:
			s.writeErr(w, r, err)
			return
		}
		if name == "" || d.Name == name {
			dbs = append(dbs, d)
		}
	}
	sort.Slice(dbs, func(i, j int) bool {
		if dbs[i].CreatedAt != dbs[j].CreatedAt {
			return dbs[i].CreatedAt < dbs[j].CreatedAt
		}
		return dbs[i].UUID < dbs[j].UUID
	})
	total := len(dbs)
	from := min((page-1)*perPage, total)
	dbs = dbs[from:min(from+perPage, total)]
	items := make([]listItemJSON, 0, len(dbs))
	for _, d := range dbs {
		items = append(items, listItemJSON{UUID: d.UUID, Name: d.Name, CreatedAt: d1Time(d.CreatedAt),
			Version: "production", Jurisdiction: nullable(d.Jurisdiction)})
	}
	v4.WriteList(w, items, v4.ResultInfo{Page: page, PerPage: perPage, Count: len(items), TotalCount: int64(total)})
}

func (s *Server) handleGet(w http.ResponseWriter, r *http.Request, _ principal) {
	acct, id, err := s.databaseRequest(r)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	d, err := s.ownDatabase(r.Context(), acct, id)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	v4.WriteResult(w, s.liveJSON(r.Context(), d))
}

// liveJSON is the database object with the object's live size and table
// count, or the catalog's last reported size if the host does not answer
// within a second.
func (s *Server) liveJSON(ctx context.Context, d fsm.Database) databaseJSON {
	numTables, size := int64(0), d.SizeBytes
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if d.HostAddress == "" {
		if rt, _ := s.cache.Get(d.UUID); rt.HostAddress != "" {
			d.HostAddress = rt.HostAddress
		}
	}
	if info, err := s.hosts.Info(ctx, routeOf(d)); err == nil {
		numTables, size = info.NumTables, info.FileSize
	}
	return toJSON(d, numTables, size)
}

func (s *Server) handleUpdate(w http.ResponseWriter, r *http.Request, _ principal) {
	acct, id, err := s.databaseRequest(r)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	b, err := readBody(r.Body, s.o.Limits.MaxBodyBytes)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	mode, err := parseUpdateBody(b)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	cur, err := s.ownDatabase(r.Context(), acct, id)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	if mode == "" { // `{}`: nothing to change
		v4.WriteResult(w, s.liveJSON(r.Context(), cur))
		return
	}
	var d fsm.Database
	err = s.catalogWrite(r.Context(), func(ctx context.Context) error {
		var err error
		d, err = s.catalog.UpdateDatabase(ctx, fsm.UpdateDatabase{AccountID: acct, UUID: id, ReadReplication: &mode})
		return err
	})
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	v4.WriteResult(w, s.liveJSON(r.Context(), d))
}

// handleDelete: the catalog write is the checkpoint; the object learns at
// once (best effort, background) and from its heartbeat otherwise.
func (s *Server) handleDelete(w http.ResponseWriter, r *http.Request, _ principal) {
	acct, id, err := s.databaseRequest(r)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	d, err := s.ownDatabase(r.Context(), acct, id)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	// THE DELETE CHECKPOINT.
	var del fsm.Database
	err = s.catalogWrite(r.Context(), func(ctx context.Context) error {
		var err error
		del, err = s.catalog.DeleteDatabase(ctx, fsm.DeleteDatabase{AccountID: acct, UUID: id})
		return err
	})
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	s.writes.wrote(acct)
	rt := routeOf(d)
	rt.State = fsm.StateDeleted
	if del.RoutingGeneration > rt.Generation {
		rt.Generation = del.RoutingGeneration
	}
	if err := s.cacheDeletedRoute(rt); err != nil {
		s.log.Warn("route cache write failed", "err", err)
	}
	s.goBackground("delete-notify", func(ctx context.Context) error { return s.hosts.Delete(ctx, rt) })
	v4.WriteResult(w, nil)
}

// databaseLimitError is the create refusal of an account at its database
// count limit, with the figures for the message (errors.Is
// fsm.ErrDatabaseLimit).
type databaseLimitError struct {
	max  int64
	tier string
}

func (e *databaseLimitError) Error() string { return fsm.ErrDatabaseLimit.Error() }
func (e *databaseLimitError) Unwrap() error { return fsm.ErrDatabaseLimit }
func (e *databaseLimitError) message() string {
	return fmt.Sprintf("The account has reached its limit of %d databases (%s tier): delete a database or upgrade the account to create more", e.max, e.tier)
}
