package fsm

import (
	"context"
	"database/sql"
	"fmt"
)

// Paged reads of the storage figures, for the storage snapshotter
// (pipeline/snapshot) that copies them into the billing history.
//
// Both reads are keyset pages: a page starts strictly after the key the
// caller passes (the previous page's Next) and follows the table's primary
// key, so a call costs O(log n + page) whatever the page's position, and
// the shared lock that keeps Restore from swapping the file is held for one
// page only. Each page is one SELECT, hence one SQLite read transaction;
// different pages may see different applied indexes. Keys never change
// (a database's UUID, an account's ID), so a full walk returns every row
// that existed for the whole walk exactly once, whatever sizes changed
// meanwhile; a row created or deleted during the walk may or may not be in
// it.

// DefaultStoragePage and MaxStoragePage bound the storage pages.
const (
	DefaultStoragePage = 1_000
	MaxStoragePage     = 10_000
)

// DatabaseStorage is one database's latest recorded size. Only active
// databases have one: deleting a database removes its size, and sizes of
// deleted or unknown databases are never recorded. An active database that
// no size has reached yet has no row (its size is 0).
type DatabaseStorage struct {
	UUID      string `json:"uuid"`
	AccountID string `json:"account_id"`
	SizeBytes int64  `json:"size_bytes"`
	Seq       int64  `json:"seq"`        // the size's measurement sequence (DatabaseStat.Seq)
	UpdatedAt int64  `json:"updated_at"` // Command.Time of the write that recorded it, Unix ns
}

// DatabaseStoragePage is one page of database sizes in UUID order. Next is
// the key to pass as after for the following page; "" when this page is
// the last.
type DatabaseStoragePage struct {
	Databases []DatabaseStorage `json:"databases"`
	Next      string            `json:"next,omitempty"`
}

// AccountStorage is one account's drained storage total (the figure limits
// are enforced on: it lags the sizes by the undrained changes, about a
// second) and its active database count.
type AccountStorage struct {
	AccountID       string `json:"account_id"`
	StorageBytes    int64  `json:"storage_bytes"`
	ActiveDatabases int64  `json:"active_databases"`
	UpdatedAt       int64  `json:"updated_at"` // Command.Time of the last drain that changed the total, Unix ns; 0 if none
}

// AccountStoragePage is one page of accounts in ID order; Next as in
// DatabaseStoragePage.
type AccountStoragePage struct {
	Accounts []AccountStorage `json:"accounts"`
	Next     string           `json:"next,omitempty"`
}

// storageLimit maps a requested page size to the one served.
func storageLimit(limit int) int {
	if limit < 1 {
		return DefaultStoragePage
	}
	return min(limit, MaxStoragePage)
}

// DatabaseStoragePage returns up to limit database sizes with UUIDs greater
// than after ("" starts at the first), in UUID order: a range of
// database_stats' primary key. limit < 1 is DefaultStoragePage; it is
// capped at MaxStoragePage.
func (f *FSM) DatabaseStoragePage(ctx context.Context, after string, limit int) (DatabaseStoragePage, error) {
	limit = storageLimit(limit)
	page := DatabaseStoragePage{Databases: make([]DatabaseStorage, 0, min(limit, 256))}
	err := f.reader(func(db *sql.DB) error {
		// One row more than the page tells whether there is a next page.
		rows, err := db.QueryContext(ctx, `SELECT uuid, account_id, size_bytes, seq, updated_at
			FROM database_stats WHERE uuid > ? ORDER BY uuid LIMIT ?`, after, limit+1)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var d DatabaseStorage
			if err := rows.Scan(&d.UUID, &d.AccountID, &d.SizeBytes, &d.Seq, &d.UpdatedAt); err != nil {
				return err
			}
			page.Databases = append(page.Databases, d)
		}
		return rows.Err()
	})
	if err != nil {
		return DatabaseStoragePage{}, fmt.Errorf("database storage page: %w", err)
	}
	if len(page.Databases) > limit {
		page.Databases = page.Databases[:limit]
		page.Next = page.Databases[limit-1].UUID
	}
	return page, nil
}

// AccountStoragePage returns up to limit accounts with IDs greater than
// after ("" starts at the first), in ID order, each with its drained
// storage total (0 before its first drain) and active database count: a
// range of accounts' primary key, joined by primary key with
// account_database_stats. Every account is listed, also those without
// databases. limit as in DatabaseStoragePage.
func (f *FSM) AccountStoragePage(ctx context.Context, after string, limit int) (AccountStoragePage, error) {
	limit = storageLimit(limit)
	page := AccountStoragePage{Accounts: make([]AccountStorage, 0, min(limit, 256))}
	err := f.reader(func(db *sql.DB) error {
		rows, err := db.QueryContext(ctx, `SELECT a.id, COALESCE(s.storage_bytes, 0), a.active_databases, COALESCE(s.updated_at, 0)
			FROM accounts a LEFT JOIN account_database_stats s ON s.account_id = a.id
			WHERE a.id > ? ORDER BY a.id LIMIT ?`, after, limit+1)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var a AccountStorage
			if err := rows.Scan(&a.AccountID, &a.StorageBytes, &a.ActiveDatabases, &a.UpdatedAt); err != nil {
				return err
			}
			page.Accounts = append(page.Accounts, a)
		}
		return rows.Err()
	})
	if err != nil {
		return AccountStoragePage{}, fmt.Errorf("account storage page: %w", err)
	}
	if len(page.Accounts) > limit {
		page.Accounts = page.Accounts[:limit]
		page.Next = page.Accounts[limit-1].AccountID
	}
	return page, nil
}
