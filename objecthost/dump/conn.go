package dump

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"net/url"
	"strings"

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

// openDB opens path with one mattn connection. Export opens it readOnly:
// mode=ro plus query_only, so the export connection can never write
// whatever it runs (it only runs our own SELECTs). Imports do not use it:
// they run on sqlexec's writer (ImportDB). Tests use it read-write to
// build fixtures.
func openDB(path string, readOnly bool) *sql.DB {
	q := url.Values{}
	q.Set("_busy_timeout", "30000")
	if readOnly {
		q.Set("mode", "ro")
	}
	d := &sqlite3.SQLiteDriver{ConnectHook: func(c *sqlite3.SQLiteConn) error {
		c.SetLimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
		if readOnly {
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
// Export never dumps them.
func reservedName(name string) bool {
	n := strings.ToLower(name)
	return strings.HasPrefix(n, "_cf_") || strings.HasPrefix(n, "_shoal_")
}

// internalName reports SQLite's own tables (never dumped).
func internalName(name string) bool {
	return strings.HasPrefix(strings.ToLower(name), "sqlite_")
}
