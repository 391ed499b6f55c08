package dump

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"net/url"
	"strings"
	"sync/atomic"

	sqlite3 "github.com/mattn/go-sqlite3"
)

// connector opens mattn connections with a connect hook, without registering
// a global driver name.
type connector struct {
	d   *sqlite3.SQLiteDriver
	dsn string
}

func (c connector) Connect(context.Context) (driver.Conn, error) { return c.d.Open(c.dsn) }
func (c connector) Driver() driver.Driver                        { return c.d }

// guard is the authorizer state of one import connection: while open is
// false, user statements are held to the rules of user SQL; the importer
// flips it only around its own BEGIN/COMMIT/PRAGMA statements.
type guard struct {
	internal atomic.Bool
	denied   atomic.Pointer[string] // why the last statement was refused
}

// openDB opens path with one connection. guarded connections get the
// import authorizer (g must be non-nil then).
func openDB(path string, g *guard, readOnlyQueries bool) *sql.DB {
	q := url.Values{}
	q.Set("_busy_timeout", "30000")
	d := &sqlite3.SQLiteDriver{ConnectHook: func(c *sqlite3.SQLiteConn) error {
		c.SetLimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
		if g != nil {
			c.RegisterAuthorizer(g.authorize)
		}
		if readOnlyQueries {
			if _, err := c.Exec("PRAGMA query_only=1", nil); err != nil {
				return err
			}
		}
		return nil
	}}
	db := sql.OpenDB(connector{d: d, dsn: "file:" + path + "?" + q.Encode()})
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	return db
}

// reservedName reports names users may never touch: D1's _cf_* and ours.
func reservedName(name string) bool {
	n := strings.ToLower(name)
	return strings.HasPrefix(n, "_cf_") || strings.HasPrefix(n, "_shoal_")
}

// internalName reports SQLite's own tables (never dumped).
func internalName(name string) bool {
	return strings.HasPrefix(strings.ToLower(name), "sqlite_")
}

// allowedPragmas are the PRAGMAs an import may run: harmless read-only
// introspection plus the foreign-key switches dumps carry. data_version
// is run by FTS5 itself.
var allowedPragmas = map[string]bool{
	"table_info": true, "table_xinfo": true, "table_list": true, "index_list": true,
	"index_info": true, "index_xinfo": true, "foreign_key_list": true,
	"foreign_key_check": true, "data_version": true, "defer_foreign_keys": true, "optimize": true,
}

// authorize mirrors sqlexec's rules for user SQL (shim.c): no ATTACH/DETACH,
// no transaction control, PRAGMAs from an allowlist only, no temporary
// schema objects, no access to reserved _cf_*/_shoal_* names.
func (g *guard) authorize(action int, a1, a2, a3 string) int {
	if g.internal.Load() {
		return sqlite3.SQLITE_OK
	}
	deny := func(why string) int {
		g.denied.Store(&why)
		return sqlite3.SQLITE_DENY
	}
	switch action {
	case sqlite3.SQLITE_ATTACH, sqlite3.SQLITE_DETACH:
		return deny("ATTACH/DETACH is not allowed")
	case sqlite3.SQLITE_TRANSACTION, sqlite3.SQLITE_SAVEPOINT:
		return deny("transaction control is not allowed inside an import")
	case sqlite3.SQLITE_PRAGMA:
		if !allowedPragmas[strings.ToLower(a1)] {
			return deny("PRAGMA " + a1 + " is not allowed")
		}
	case sqlite3.SQLITE_CREATE_TEMP_INDEX, sqlite3.SQLITE_CREATE_TEMP_TABLE,
		sqlite3.SQLITE_CREATE_TEMP_TRIGGER, sqlite3.SQLITE_CREATE_TEMP_VIEW:
		return deny("temporary schema objects are not allowed")
	case sqlite3.SQLITE_FUNCTION:
		return sqlite3.SQLITE_OK
	}
	if reservedName(a1) || reservedName(a2) {
		return deny("access to reserved names (_cf_*, _shoal_*) is not allowed")
	}
	return sqlite3.SQLITE_OK
}
