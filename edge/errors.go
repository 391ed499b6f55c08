package edge

import (
	"errors"

	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// Sentinel errors of the edge. Handlers map them to D1-style codes.
var (
	// ErrUnavailable means a dependency (catalog, breaker open, fallback
	// capacity full, no object host) could not serve the request now; the
	// client should retry (503, 7503, Retry-After).
	ErrUnavailable = errors.New("service temporarily unavailable")
	// ErrDatabaseNotFound means the database does not exist, is deleted, or
	// belongs to another account (indistinguishable on purpose).
	ErrDatabaseNotFound = errors.New("database not found")
	// ErrStaleRoute means an object host refused a request because the route
	// the edge used is no longer true (421/410/404 from the host).
	ErrStaleRoute = errors.New("stale route")
)

// isCatalogRefusal reports whether err is a definitive answer of the catalog
// (a refusal, see fsm.IsRefusal) rather than a failure to reach it: a
// refusal is final (never retried, never counted by the breaker), anything
// else is ErrUnavailable. fsm keeps the one list of refusals, so a new one
// is final here without a change.
func isCatalogRefusal(err error) bool { return fsm.IsRefusal(err) }
