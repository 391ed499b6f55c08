package fsm

import (
	"context"
	"database/sql"
	"fmt"
)

// HostDatabasesPage is one page of the active databases a host holds, in
// UUID order. Next is the UUID to pass as after for the following page; ""
// when this page is the last.
type HostDatabasesPage struct {
	Databases []Database `json:"databases"`
	Next      string     `json:"next,omitempty"`
}

// HostDatabasesPage returns up to limit active databases placed on host
// hostID with UUIDs greater than after ("" starts at the first), in UUID
// order. limit as in DatabaseStoragePage.
//
// It walks the UUID index and filters by host (no host index: the read is
// an operator's, for lost-host recovery, and a walk of every page costs one
// pass over the table in all, where an index would cost every create an
// extra index write). A page therefore costs O(rows skipped + limit); with
// many hosts, a page of 1,000 scans about 1,000 × hosts rows.
func (f *FSM) HostDatabasesPage(ctx context.Context, hostID, after string, limit int) (HostDatabasesPage, error) {
	limit = storageLimit(limit)
	page := HostDatabasesPage{Databases: make([]Database, 0, min(limit, 256))}
	err := f.reader(func(db *sql.DB) error {
		rows, err := db.QueryContext(ctx, `SELECT `+databaseCols+` FROM `+databaseFrom+`
			WHERE d.uuid > ?1 AND d.host_id = ?2 AND d.state = 'active' ORDER BY d.uuid LIMIT ?3`, after, hostID, limit+1)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			d, err := scanDatabase(rows)
			if err != nil {
				return err
			}
			page.Databases = append(page.Databases, d)
		}
		return rows.Err()
	})
	if err != nil {
		return HostDatabasesPage{}, fmt.Errorf("host databases page: %w", err)
	}
	if len(page.Databases) > limit {
		page.Databases = page.Databases[:limit]
		page.Next = page.Databases[limit-1].UUID
	}
	return page, nil
}
