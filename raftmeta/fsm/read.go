package fsm

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// ErrClosed is returned by reads after Close; ErrUnavailable when a failed
// Restore left no catalog open (raft will restore again or the node stops).
var (
	ErrClosed      = errors.New("fsm closed")
	ErrUnavailable = errors.New("fsm catalog unavailable")
)

// ListQuery selects one page of an account's active databases.
type ListQuery struct {
	Name    string // optional: only names containing this substring
	Page    int    // 1-based; <1 means 1
	PerPage int    // <1 means DefaultPerPage; capped at MaxPerPage
}

// reader runs fn against the read pool while holding mu shared, so Restore
// cannot swap the file underneath.
func (f *FSM) reader(fn func(db *sql.DB) error) error {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if f.closed {
		return ErrClosed
	}
	if f.rdb == nil { // a Restore failed after closing the old catalog
		return ErrUnavailable
	}
	return fn(f.rdb)
}

// Database returns a database by UUID, deleted ones included (State tells).
func (f *FSM) Database(ctx context.Context, uuid string) (Database, error) {
	var d Database
	err := f.reader(func(db *sql.DB) error {
		var err error
		d, err = scanDatabase(db.QueryRowContext(ctx, `SELECT `+databaseCols+` FROM `+databaseFrom+` WHERE d.uuid = ?`, uuid))
		return err
	})
	if errors.Is(err, sql.ErrNoRows) {
		return d, fmt.Errorf("%w: database %q", ErrNotFound, uuid)
	}
	return d, err
}

// DatabaseByName returns the account's ACTIVE database with that name.
func (f *FSM) DatabaseByName(ctx context.Context, accountID, name string) (Database, error) {
	var d Database
	err := f.reader(func(db *sql.DB) error {
		var err error
		d, err = scanDatabase(db.QueryRowContext(ctx, `SELECT `+databaseCols+` FROM `+databaseFrom+`
			WHERE d.account_id = ? AND d.name = ? AND d.state = 'active'`, accountID, name))
		return err
	})
	if errors.Is(err, sql.ErrNoRows) {
		return d, fmt.Errorf("%w: database %q", ErrNotFound, name)
	}
	return d, err
}

// ListDatabases returns one page of the account's active databases ordered
// by (created_at, uuid), and the total count. Without a name filter the page
// is O(log n + offset + page) through the partial list index and the total is
// the account's maintained active count, O(1). With a filter both scan the
// account's active databases. Page and total come from one read transaction.
// An unknown account is ErrAccountNotFound.
func (f *FSM) ListDatabases(ctx context.Context, accountID string, q ListQuery) ([]Database, int64, error) {
	if q.Page < 1 {
		q.Page = 1
	}
	if q.PerPage < 1 {
		q.PerPage = DefaultPerPage
	}
	if q.PerPage > MaxPerPage {
		q.PerPage = MaxPerPage
	}
	if q.Page > maxPage {
		q.Page = maxPage
	}
	offset := int64(q.Page-1) * int64(q.PerPage)
	var (
		out   []Database
		total int64
	)
	err := f.reader(func(db *sql.DB) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback() //nolint:errcheck // read-only
		if err := tx.QueryRowContext(ctx, `SELECT active_databases FROM accounts WHERE id = ?`, accountID).Scan(&total); err != nil {
			if errors.Is(err, sql.ErrNoRows) {
				return fmt.Errorf("%w: %q", ErrAccountNotFound, accountID)
			}
			return err
		}
		where := `d.account_id = ?1 AND d.state = 'active'`
		args := []any{accountID}
		if q.Name != "" {
			where += ` AND instr(d.name, ?2) > 0`
			args = append(args, q.Name)
			if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM databases d WHERE `+where, args...).Scan(&total); err != nil {
				return err
			}
		}
		// The page's ids come from the list index alone (it covers
		// account_id, created_at, uuid and the rowid), so the rows skipped by
		// OFFSET cost an index step each, not a row fetch.
		rows, err := tx.QueryContext(ctx, `SELECT `+databaseCols+` FROM `+databaseFrom+` WHERE d.id IN (
			SELECT d.id FROM databases d WHERE `+where+
			fmt.Sprintf(` ORDER BY d.created_at, d.uuid LIMIT %d OFFSET %d)`, q.PerPage, offset)+
			` ORDER BY d.created_at, d.uuid`, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			d, err := scanDatabase(rows)
			if err != nil {
				return err
			}
			out = append(out, d)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, 0, err
	}
	return out, total, nil
}

// Account returns an account with its active database count and drained
// storage total, O(1) (two primary-key lookups).
func (f *FSM) Account(ctx context.Context, id string) (Account, error) {
	var a Account
	err := f.reader(func(db *sql.DB) error {
		var err error
		a, err = scanAccount(db.QueryRowContext(ctx, `SELECT `+accountCols+` FROM `+accountFrom+` WHERE a.id = ?`, id))
		return err
	})
	if errors.Is(err, sql.ErrNoRows) {
		return a, fmt.Errorf("%w: %q", ErrAccountNotFound, id)
	}
	return a, err
}

// TokenByHash returns the token with that hash, revoked ones included
// (Revoked tells).
func (f *FSM) TokenByHash(ctx context.Context, hash string) (Token, error) {
	var t Token
	err := f.reader(func(db *sql.DB) error {
		var err error
		t, err = scanToken(db.QueryRowContext(ctx, `SELECT `+tokenCols+` FROM api_tokens WHERE hash = ?`, hash))
		return err
	})
	if errors.Is(err, sql.ErrNoRows) {
		return t, fmt.Errorf("%w: token", ErrNotFound)
	}
	return t, err
}

// Hosts returns every host ordered by ID.
func (f *FSM) Hosts(ctx context.Context) ([]Host, error) {
	var out []Host
	err := f.reader(func(db *sql.DB) error {
		rows, err := db.QueryContext(ctx, `SELECT `+hostCols+` FROM hosts ORDER BY id`)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			h, err := scanHost(rows)
			if err != nil {
				return err
			}
			out = append(out, h)
		}
		return rows.Err()
	})
	return out, err
}

// Heartbeat answers a batch of database UUIDs: one state per UUID in input
// order and, once each, the accounts of the known ones (limits and drained
// storage total). Two queries in one read transaction, so both describe the
// same catalog state: the databases (an index lookup per UUID), then each
// distinct account once. Joining the account and its storage total to
// every database row instead, and sorting the rows, cost 2–4 µs more per
// database-heartbeat (BenchmarkHeartbeat): heartbeats of every database
// every 30 s are the catalog's largest steady load (docs/benchmarks.md,
// "Catalog at 1M databases").
func (f *FSM) Heartbeat(ctx context.Context, uuids []string) (HeartbeatAnswer, error) {
	ans := HeartbeatAnswer{Databases: make([]HeartbeatState, 0, len(uuids)), Accounts: map[string]Account{}}
	if len(uuids) > MaxHeartbeatBatch {
		return ans, fmt.Errorf("%w: %d uuids in one heartbeat, at most %d", ErrInvalid, len(uuids), MaxHeartbeatBatch)
	}
	if len(uuids) == 0 {
		return ans, nil
	}
	list, err := json.Marshal(uuids)
	if err != nil {
		return ans, err
	}
	states := make([]HeartbeatState, len(uuids))
	err = f.reader(func(db *sql.DB) error {
		tx, err := db.BeginTx(ctx, nil) // deferred: the first SELECT pins the read snapshot
		if err != nil {
			return err
		}
		defer tx.Rollback() //nolint:errcheck // read-only
		// No ORDER BY: the row's key places it (sorting made SQLite build
		// every row before returning the first).
		rows, err := tx.QueryContext(ctx, `SELECT j.key, j.value, d.id IS NOT NULL, COALESCE(d.state, ''),
			COALESCE(d.account_id, ''), COALESCE(d.routing_generation, 0), COALESCE(d.object_id, ''), COALESCE(d.deleted_at, 0)
			FROM json_each(?) j LEFT JOIN databases d ON d.uuid = j.value`, string(list))
		if err != nil {
			return err
		}
		defer rows.Close()
		var accts []string
		seen := map[string]bool{}
		n := 0
		for rows.Next() {
			var (
				key      int
				hs       HeartbeatState
				uuidText sql.NullString
			)
			if err := rows.Scan(&key, &uuidText, &hs.Known, &hs.State, &hs.AccountID, &hs.RoutingGeneration, &hs.ObjectID, &hs.DeletedAt); err != nil {
				return err
			}
			if key < 0 || key >= len(states) {
				return fmt.Errorf("heartbeat: row key %d out of %d", key, len(states))
			}
			hs.UUID = uuidText.String
			states[key] = hs
			n++
			if hs.Known && !seen[hs.AccountID] {
				seen[hs.AccountID] = true
				accts = append(accts, hs.AccountID)
			}
		}
		if err := rows.Err(); err != nil {
			return err
		}
		if n != len(states) {
			return fmt.Errorf("heartbeat: %d rows for %d uuids", n, len(states))
		}
		// One row per call, not per database: the restore count.
		if ans.CatalogRestores, err = readCatalogRestores(ctx, tx.QueryRowContext(ctx, `SELECT value FROM meta WHERE key = '`+catalogRestoresKey+`'`)); err != nil {
			return err
		}
		if len(accts) == 0 {
			return nil
		}
		return readAccounts(ctx, tx, accts, ans.Accounts)
	})
	if err != nil {
		return ans, err
	}
	ans.Databases = states
	return ans, nil
}

// PendingStatsChanges is the number of change-log rows not yet drained,
// O(log n): drains delete a prefix, so the remaining ids are contiguous.
func (f *FSM) PendingStatsChanges(ctx context.Context) (int64, error) {
	var n int64
	err := f.reader(func(db *sql.DB) error {
		return db.QueryRowContext(ctx, pendingChangesQuery).Scan(&n)
	})
	return n, err
}

// Dump renders every table, rows in primary-key order, one line per row, in
// one read transaction. Two replicas that applied the same log have the same
// Dump; it is meant for tests and debugging, not for large catalogs. The
// host_digests section is rendered from the digests in memory (the live
// table is empty, see digestMem), read at the transaction's state, in the
// table's format: the Dump is what a snapshot's file holds, and what the
// builds that wrote the table dumped.
func (f *FSM) Dump(ctx context.Context) (string, error) {
	var b strings.Builder
	err := f.reader(func(db *sql.DB) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback() //nolint:errcheck // read-only
		digests, err := f.readDigestsPinned(func() error {
			var n int
			return tx.QueryRowContext(ctx, `SELECT count(*) FROM meta`).Scan(&n)
		}, true)
		if err != nil {
			return err
		}
		for _, t := range dumpTables() {
			if t.name == "host_digests" {
				dumpDigests(&b, digestView{hosts: digests})
				continue
			}
			if err := dumpTable(ctx, tx, &b, t.name, t.order); err != nil {
				return fmt.Errorf("dump %s: %w", t.name, err)
			}
		}
		return nil
	})
	return b.String(), err
}

func dumpTable(ctx context.Context, tx *sql.Tx, b *strings.Builder, table, order string) error {
	rows, err := tx.QueryContext(ctx, `SELECT * FROM `+table+` ORDER BY `+order)
	if err != nil {
		return err
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return err
	}
	fmt.Fprintf(b, "## %s (%s)\n", table, strings.Join(cols, ", "))
	vals := make([]any, len(cols))
	ptrs := make([]any, len(cols))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	for rows.Next() {
		if err := rows.Scan(ptrs...); err != nil {
			return err
		}
		for i, v := range vals {
			if i > 0 {
				b.WriteByte('|')
			}
			switch v := v.(type) {
			case nil:
				b.WriteString("NULL")
			case []byte:
				fmt.Fprintf(b, "%q", v)
			case string:
				fmt.Fprintf(b, "%q", v)
			default:
				fmt.Fprintf(b, "%v", v)
			}
		}
		b.WriteByte('\n')
	}
	return rows.Err()
}

// dumpDigests renders digests as dumpTable renders the host_digests table.
func dumpDigests(b *strings.Builder, v digestView) {
	b.WriteString("## host_digests (host_id, bucket, digest, count)\n")
	v.each(func(host string, bucket int, d digestDelta) error { //nolint:errcheck // fn never fails
		fmt.Fprintf(b, "%q|%d|%d|%d\n", host, bucket, d.digest, d.count)
		return nil
	})
}
