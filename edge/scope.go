package edge

import (
	"net"
	"net/http"
	"slices"

	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// Scoped API tokens, like Cloudflare's D1 Read / D1 Edit, optionally
// limited to named databases and with an expiry (fsm.Token; `shoal admin
// token create --scope read --database NAME --ttl 30d`):
//
//   - a read token may list, get, export, take bookmarks, read insights and
//     query; its queries run with the object host's read-only check: a
//     statement SQLite reports as writing (sqlite3_stmt_readonly, i.e. the
//     compiled program, not the SQL text) is refused with 403/7403 before it
//     runs. It may not create, delete, update, import, restore, fork or mint
//     binding tokens (whose bearer would not inherit the restriction);
//   - a token limited to databases sees only those: others answer 404 as if
//     they did not exist, lists are filtered, and it cannot create or fork
//     databases (the new one would not be in its list);
//   - an expired token is refused (401) as a revoked one.
//
// The configured admin token is the only credential of /admin/v1.

// writeRoutes are the account routes that change something.
var writeRoutes = map[string]bool{
	"create": true, "update": true, "delete": true, "binding": true, "import": true,
	"time_travel_restore": true, "fork": true, "binding_revoke": true, "binding_revoke_all": true,
}

// createRoutes make a new database (not allowed to a database-limited token).
var createRoutes = map[string]bool{"create": true, "fork": true}

// scopeCheck refuses what p's scope does not allow on route name (for a
// database route, on database id; "" elsewhere).
func scopeCheck(p principal, name, id string) error {
	if p.readOnly && writeRoutes[name] {
		return errReadOnlyToken
	}
	if len(p.databases) > 0 {
		if createRoutes[name] {
			return errDatabaseLimitedToken
		}
		if id != "" && !slices.Contains(p.databases, id) {
			return ErrDatabaseNotFound
		}
	}
	return nil
}

// visible reports whether p may see database uuid.
func (p principal) visible(uuid string) bool {
	return len(p.databases) == 0 || slices.Contains(p.databases, uuid)
}

var (
	errReadOnlyToken        = &validationError{status: http.StatusForbidden, code: 7403, msg: "This API token is read-only (D1 Read): it cannot change databases"}
	errDatabaseLimitedToken = &validationError{status: http.StatusForbidden, code: 7403, msg: "This API token is limited to named databases: it cannot create databases"}
)

// auditOf is who a request acts for, for the catalog's audit log.
func auditOf(p principal, r *http.Request) fsm.Audit {
	actor := "token:" + p.tokenID
	if p.operator {
		actor = "admin"
	}
	src := r.RemoteAddr
	if host, _, err := net.SplitHostPort(src); err == nil {
		src = host
	}
	return fsm.Audit{Actor: actor, Source: src}
}
