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
// (an fsm sentinel) rather than a failure to reach it.
func isCatalogRefusal(err error) bool {
	for _, s := range []error{fsm.ErrInvalid, fsm.ErrUnknownCommand, fsm.ErrUnsupportedVersion, fsm.ErrNotFound,
		fsm.ErrAccountNotFound, fsm.ErrNameTaken, fsm.ErrDatabaseLimit, fsm.ErrExists} {
		if errors.Is(err, s) {
			return true
		}
	}
	return false
}
