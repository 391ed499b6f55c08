package edge

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"time"

	"github.com/shoaldb/shoal/pipeline/event"
	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// The last-resort route lookup. A query (or another call that only reaches
// the object) whose route is neither in the
// cache (nor fed to it) and whose catalog read fails as unavailable —
// breaker open, timeout, unreachable; never a definite "not found", nor
// this edge's own cap on catalog reads being full (load to shed) — asks the object hosts this edge knows which
// objects of the database they hold (GET /v1/databases/{uuid}/objects,
// objecthost/locate.go). It closes the gap where a database's route
// reached only the cache of the edge that created it (the host's
// publication to the feed failed) and the catalog then became unreachable
// (issue #12, robustness seed 1796272661163131923).
//
// Trust: a host is the authority on its own objects, so its answer is a
// feed record's, not the catalog's: it goes through RouteCache.Put's rule
// (never over a newer route or a tombstone — a route the cache refuses is
// not used), it never becomes a negative entry, and nothing destructive
// follows from it. Only the calls that merely reach the object use it
// (objectRoute below; edge/DESIGN.md, "Which endpoints route through the
// object hosts"). The hosts to ask come from the host book (hostbook.go),
// which survives restarts.
//
// Bounds, like the catalog fallback: one lookup per database and account
// at a time (singleflight), at most HostRouteCap in flight (TryAcquire: no
// queueing), every known host asked in parallel within HostRouteTimeout.

// LocatedObject is an object host's answer about one of its objects.
type LocatedObject = event.LocatedObject

// errLocateUnsupported: the host runs a build without the locate endpoint
// (its router's 404): as good as "unknown", but not an answer that the
// database is absent.
var errLocateUnsupported = errors.New("object host does not answer locate")

// Locate asks the host at addr which objects of database uuid it holds for
// account acct. A host that holds none answers 404: nil, nil.
func (c *HostClient) Locate(ctx context.Context, addr, uuid, acct string) ([]LocatedObject, error) {
	var out event.LocateAnswer
	rt := Route{DatabaseUUID: uuid, AccountID: acct}
	err := c.call(ctx, addr, http.MethodGet, "/v1/databases/"+uuid+"/objects", &rt, nil, &out)
	var he *HostError
	if errors.As(err, &he) && he.Status == http.StatusNotFound {
		if he.Message == "no such route" { // the host's router: an older build
			return nil, errLocateUnsupported
		}
		return nil, nil
	}
	return out.Objects, err
}

// locateTargets returns the addresses to ask: the last host list read from
// the catalog (not read again here), the configured ones
// (Options.KnownHosts) and the host book (hostbook.go: every host the
// catalog listed or a stored route or a query named, kept across
// restarts).
func (s *Server) locateTargets() (addrs []string) {
	seen := map[string]bool{}
	add := func(a string) {
		if a != "" && !seen[a] {
			seen[a] = true
			addrs = append(addrs, a)
		}
	}
	s.hostsMu.Lock()
	list := s.hostsList
	s.hostsMu.Unlock()
	for _, h := range list {
		add(h.Address)
	}
	for _, a := range s.o.KnownHosts {
		add(a)
	}
	for _, a := range s.cache.Hosts() {
		add(a)
	}
	sort.Strings(addrs)
	return addrs
}

// objectRoute resolves database id's route for a request of account acct
// that only needs to reach the object — a query, an export, an import, a
// bookmark read, an insights check (edge/DESIGN.md lists which endpoints
// use it and why the others do not): the route cache, else a bounded
// catalog read, else, when that read fails as unavailable (never on the
// catalog's "not found", nor when this edge's own cap on catalog reads is
// full: that is load to shed), the object hosts (routeFromHosts). The
// route is usable by acct, or the error says why not. Nothing destructive
// may follow from a route found this way (principle 8): the catalog-only
// endpoints use catalogRoute.
func (s *Server) objectRoute(ctx context.Context, id, acct string) (Route, error) {
	rt, err := s.res.lookup(ctx, id)
	if errors.Is(err, ErrUnavailable) && !errors.Is(err, errFallbackFull) {
		rt, err = s.routeFromHosts(ctx, id, acct, err)
	}
	if err == nil {
		err = usable(rt, acct)
	}
	return rt, err
}

// catalogRoute is objectRoute without the hosts: the route cache, else the
// catalog. For calls whose route must not come from the hosts' partial
// view (binding revocations: a 200 must mean in force on the live object;
// restores).
func (s *Server) catalogRoute(ctx context.Context, id, acct string) (Route, error) {
	rt, err := s.res.lookup(ctx, id)
	if err == nil {
		err = usable(rt, acct)
	}
	return rt, err
}

// betterLocated orders candidate routes: the higher routing generation;
// at the same generation deleted over active (as the cache's rule), then
// confirmed over unconfirmed.
func betterLocated(a, b Route, aConfirmed, bConfirmed bool) bool {
	switch {
	case a.Generation != b.Generation:
		return a.Generation > b.Generation
	case a.State != b.State:
		return a.State != fsm.StateActive
	default:
		return aConfirmed && !bConfirmed
	}
}

// routeFromHosts is the last-resort lookup (above) of database id for a
// query of account acct, after the catalog read failed with cause. It
// returns a usable route, ErrDatabaseNotFound, or ErrUnavailable.
func (s *Server) routeFromHosts(ctx context.Context, id, acct string, cause error) (Route, error) {
	v, err, _ := s.locateGroup.Do(id+"\x00"+acct, func() (any, error) {
		return s.locateOnHosts(ctx, id, acct, cause)
	})
	if err != nil {
		return Route{}, err
	}
	return v.(Route), nil
}

func (s *Server) locateOnHosts(ctx context.Context, id, acct string, cause error) (Route, error) {
	if !s.locateSem.TryAcquire(1) {
		s.m.hostRoutes.WithLabelValues("refused").Inc()
		return Route{}, fmt.Errorf("%w: host route lookups at capacity (catalog: %w)", ErrUnavailable, cause)
	}
	defer s.locateSem.Release(1)
	addrs := s.locateTargets()
	// Detached from the caller (the result is shared), bounded by the
	// per-host timeout: every goroutine below ends by then.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.o.HostRouteTimeout)
	defer cancel()
	type answer struct {
		addr string
		objs []LocatedObject
		err  error
	}
	answers := make(chan answer, len(addrs))
	for _, a := range addrs {
		go func() {
			objs, err := s.hosts.Locate(ctx, a, id, acct)
			answers <- answer{a, objs, err}
		}()
	}
	var (
		best                 Route
		bestConfirmed, found bool
		failed               int
		firstErr             error
	)
	for range addrs {
		an := <-answers
		if an.err != nil {
			failed++
			if firstErr == nil {
				firstErr = fmt.Errorf("%s: %w", an.addr, an.err)
			}
			continue
		}
		for _, o := range an.objs {
			if o.AccountID != acct || (o.State != fsm.StateActive && o.State != fsm.StateDeleted) {
				continue // another account's object is no answer (a host filters them itself)
			}
			rt := Route{DatabaseUUID: id, ObjectID: o.ObjectID, HostAddress: an.addr, AccountID: o.AccountID,
				State: o.State, Generation: o.RoutingGeneration}
			if !found || betterLocated(rt, best, o.Confirmed, bestConfirmed) {
				best, bestConfirmed, found = rt, o.Confirmed, true
			}
		}
	}
	log := func(result string, err error) {
		s.m.hostRoutes.WithLabelValues(result).Inc()
		args := []any{"database", id, "account", acct, "result", result, "reason", cause.Error(),
			"hosts_asked", len(addrs), "hosts_failed", failed}
		if err != nil {
			args = append(args, "err", err.Error())
		}
		s.log.Warn("route looked up on object hosts: catalog unavailable", args...)
	}
	switch {
	case found && best.State == fsm.StateActive:
		stored, err := s.cache.Put(best)
		if err != nil || !stored {
			// The cache holds a newer route or a tombstone for this
			// generation (a host refused it moments ago): the feed's rule.
			log("superseded", err)
			return Route{}, fmt.Errorf("%w: catalog unavailable and the hosts' route is superseded", ErrUnavailable)
		}
		log("found", nil)
		return best, nil
	case found && failed == 0:
		// The newest object is deleted, and every known host answered (one
		// that did not could hold a newer, active object): not found, and
		// not cached (a deleted entry would outlive this lookup; the feed
		// or the catalog will say so for good).
		log("not_found", nil)
		return Route{}, ErrDatabaseNotFound
	case failed == 0:
		// Every known host answered that it holds no such object of this
		// account. Still 503, never a definite 404: a host registered
		// since the catalog's last host list is not asked, and an existing
		// database must not be answered "not found" on a partial view
		// (a client may act on a 404). Another account's database answers
		// the same.
		log("not_found", nil)
		return Route{}, fmt.Errorf("%w: catalog unavailable and no known object host holds the database", ErrUnavailable)
	default:
		log("no_answer", firstErr)
		return Route{}, fmt.Errorf("%w: catalog unavailable and no known object host answered for the database", ErrUnavailable)
	}
}

// hostRouteDefaults sets the lookup's bounds.
func hostRouteDefaults(o *Options) {
	if o.HostRouteCap <= 0 {
		o.HostRouteCap = 16
	}
	if o.HostRouteTimeout <= 0 {
		o.HostRouteTimeout = 500 * time.Millisecond
	}
}
