package edge

import (
	"context"
	"errors"
	"fmt"

	"golang.org/x/sync/singleflight"

	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// resolver turns a database UUID into a Route: bbolt cache first, else one
// bounded follower read of the catalog per UUID (singleflight + fallback),
// written through to the cache.
type resolver struct {
	cache   *RouteCache
	catalog Catalog
	fb      *fallback
	group   singleflight.Group
}

func routeOf(d fsm.Database) Route {
	return Route{
		DatabaseUUID: d.UUID, ObjectID: d.ObjectID, HostAddress: d.HostAddress,
		AccountID: d.AccountID, State: d.State, Generation: d.RoutingGeneration,
	}
}

// lookup returns the route of uuid. ErrDatabaseNotFound when the catalog does
// not know it (cached as a negative entry); ErrUnavailable when the catalog
// cannot be asked now. A deleted route is returned as is: callers decide.
func (r *resolver) lookup(ctx context.Context, uuid string) (Route, error) {
	rt, res := r.cache.Get(uuid)
	switch res {
	case cacheHit:
		return rt, nil
	case cacheNegative:
		return Route{}, ErrDatabaseNotFound
	}
	return r.fill(ctx, uuid)
}

// fill reads the route from the catalog (bounded) and writes it through. The
// route read is returned even when the cache holds something newer or a
// tombstone blocks it: the caller uses it for this one request.
func (r *resolver) fill(ctx context.Context, uuid string) (Route, error) {
	v, err, _ := r.group.Do(uuid, func() (any, error) {
		var d fsm.Database
		err := r.fb.do(ctx, func(ctx context.Context) error {
			var err error
			d, err = r.catalog.Database(ctx, uuid)
			return err
		})
		if errors.Is(err, fsm.ErrNotFound) {
			r.cache.PutNegative(uuid)
			return nil, ErrDatabaseNotFound
		}
		if err != nil {
			return nil, err
		}
		rt := routeOf(d)
		if _, err := r.cache.Put(rt); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		return rt, nil
	})
	if err != nil {
		return Route{}, err
	}
	return v.(Route), nil
}

// LookupRoute resolves a database's route exactly as the query path does
// (cache, else a bounded catalog read written through). For operators'
// debugging endpoints and benchmarks.
func (s *Server) LookupRoute(ctx context.Context, uuid string) (Route, error) {
	return s.res.lookup(ctx, uuid)
}
