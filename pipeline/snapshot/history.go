package snapshot

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/shoaldb/shoal/pipeline/chsink"
)

// Table is the ClickHouse table of the storage history.
const Table = "storage_snapshots"

// Row kinds (the kind column).
const (
	KindDatabase = "database" // one database's size in a pass
	KindAccount  = "account"  // one account's total and database count in a pass
	KindPass     = "pass"     // a pass's completion marker, written after all its rows
)

// The table. One row per database and per account per pass, plus the
// pass's completion marker, written last. Every row carries its pass's
// pass_id, and the sorting key (which is also ReplacingMergeTree's
// deduplication key) is
//
//	(kind, account_id, snapshot_time, pass_id, database_uuid)
//
// i.e. the bucket's identity (snapshot_time, kind, account_id,
// database_uuid) plus the pass that wrote it. A batch inserted twice by one
// pass (a retried insert whose first attempt landed) is the same keys:
// merges keep one copy and every read deduplicates by the key until they
// have. Two passes of one bucket (two snapshotters, or a pass that died
// midway and was started over) keep their rows apart, and every read takes
// one whole pass per bucket: the completed one (a marker exists) with the
// greatest pass_id. So a bucket reads as exactly one pass's figures, never
// a mixture of a complete pass and a half-written one; the rows of an
// abandoned pass stay stored (ignored) until their partition is dropped.
//
// The key starts with (kind, account_id) because the billing questions
// are per account (StorageAt, AccountHistory): one narrow key range each.
// Reads of every account in one bucket (AccountsAt) scan the month's
// account rows instead.
//
// ClickHouse 18.16: no DateTime64, TTL or CODEC; retention is ALTER TABLE
// … DROP PARTITION 'YYYYMM'. {db} is replaced by the database name.
var schemaDDL = []string{
	`CREATE DATABASE IF NOT EXISTS {db}`,
	`CREATE TABLE IF NOT EXISTS {db}.storage_snapshots (
    snapshot_time DateTime,
    day           Date,
    kind          String,
    account_id    String,
    database_uuid String,
    pass_id       UInt64,
    size_bytes    Int64,
    databases     Int64,
    accounts      Int64,
    seq           Int64,
    updated_at_ns Int64
) ENGINE = ReplacingMergeTree()
PARTITION BY toYYYYMM(day)
ORDER BY (kind, account_id, snapshot_time, pass_id, database_uuid)`,
}

// Column meanings (the table has no comments: 18.16 has no COMMENT):
//   - snapshot_time: the interval bucket's start, UTC; day: its date (the
//     partition is its month);
//   - account_id: empty on pass rows; database_uuid: empty on account and
//     pass rows;
//   - size_bytes: database: its size; account: its drained total; pass:
//     the sum of its database rows;
//   - databases: account: active databases; pass: database rows written;
//   - accounts: pass: account rows written (0 otherwise);
//   - seq: database: its size's measurement sequence (0 otherwise);
//   - updated_at_ns: database and account: when the catalog recorded the
//     figure (command time, Unix ns; 0 for a never-drained account);
//     pass: when its catalog read ended.
const columns = "snapshot_time, day, kind, account_id, database_uuid, pass_id, size_bytes, databases, accounts, seq, updated_at_ns"

var validDatabase = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// SchemaDDL returns the statements EnsureSchema runs for a database name.
func SchemaDDL(database string) []string {
	out := make([]string, len(schemaDDL))
	for i, s := range schemaDDL {
		out[i] = strings.ReplaceAll(s, "{db}", database)
	}
	return out
}

// ErrNoSnapshot: no pass completed at or before the time asked about.
var ErrNoSnapshot = errors.New("no completed storage snapshot")

// History reads and writes the storage history in one ClickHouse
// database. It is safe for concurrent use and does not own the connection.
type History struct {
	conn driver.Conn
	db   string
}

// NewHistory returns the history in database (default
// chsink.DefaultDatabase, the sink's) over conn (native protocol).
func NewHistory(conn driver.Conn, database string) (*History, error) {
	if conn == nil {
		return nil, errors.New("snapshot: no ClickHouse connection")
	}
	if database == "" {
		database = chsink.DefaultDatabase
	}
	if !validDatabase.MatchString(database) {
		return nil, fmt.Errorf("snapshot: invalid database name %q", database)
	}
	return &History{conn: conn, db: database}, nil
}

// Database is the ClickHouse database of the table.
func (h *History) Database() string { return h.db }

// EnsureSchema creates the database and table if they do not exist;
// idempotent, safe from several snapshotters at once, never alters.
func (h *History) EnsureSchema(ctx context.Context) error {
	for _, stmt := range SchemaDDL(h.db) {
		if err := h.conn.Exec(ctx, stmt); err != nil {
			return fmt.Errorf("snapshot: ensure schema: %w", err)
		}
	}
	return nil
}

// send inserts whole columns (in the order of columns).
func (h *History) send(ctx context.Context, values []any) (err error) {
	b, err := h.conn.PrepareBatch(ctx, "INSERT INTO "+h.db+"."+Table+" ("+columns+")")
	if err != nil {
		return fmt.Errorf("snapshot: insert: %w", err)
	}
	defer func() {
		if err != nil {
			_ = b.Abort()
		}
	}()
	for i, v := range values {
		if err := b.Column(i).Append(v); err != nil {
			return fmt.Errorf("snapshot: insert column %d: %w", i, err)
		}
	}
	if err := b.Send(); err != nil {
		return fmt.Errorf("snapshot: insert: %w", err)
	}
	return nil
}

// Completed is a completed pass: its bucket and the pass that every read
// of that bucket uses.
type Completed struct {
	SnapshotTime time.Time // bucket start, UTC
	PassID       uint64
}

// LastCompleted returns the newest bucket with a completed pass (ok false
// when there is none).
func (h *History) LastCompleted(ctx context.Context) (Completed, bool, error) {
	return h.completedAt(ctx, time.Unix(1<<32-1, 0))
}

// completedAt is the newest completed bucket at or before t.
func (h *History) completedAt(ctx context.Context, t time.Time) (Completed, bool, error) {
	rows, err := h.conn.Query(ctx, `SELECT snapshot_time, max(pass_id) FROM `+h.db+`.`+Table+`
WHERE kind = 'pass' AND account_id = '' AND snapshot_time <= toDateTime(?)
GROUP BY snapshot_time ORDER BY snapshot_time DESC LIMIT 1`, unix(t))
	if err != nil {
		return Completed{}, false, fmt.Errorf("snapshot: completed pass: %w", err)
	}
	defer rows.Close()
	var c Completed
	if !rows.Next() {
		return Completed{}, false, rows.Err()
	}
	if err := rows.Scan(&c.SnapshotTime, &c.PassID); err != nil {
		return Completed{}, false, fmt.Errorf("snapshot: completed pass: %w", err)
	}
	c.SnapshotTime = c.SnapshotTime.UTC()
	return c, true, rows.Err()
}

// unix is t as Unix seconds for toDateTime(?), clamped to DateTime's range.
func unix(t time.Time) int64 { return min(max(t.Unix(), 0), 1<<32-1) }

// AccountStorage is one account's figures in one snapshot.
type AccountStorage struct {
	SnapshotTime time.Time // the bucket, UTC
	AccountID    string
	SizeBytes    int64 // the catalog's drained total
	Databases    int64 // active databases
}

// StorageAt returns the account's storage in the newest completed snapshot
// at or before t: what it was storing at t, to the snapshot interval. An
// account absent from that snapshot (it did not exist yet) has zero
// figures. ErrNoSnapshot if no pass completed at or before t.
func (h *History) StorageAt(ctx context.Context, account string, t time.Time) (AccountStorage, error) {
	c, ok, err := h.completedAt(ctx, t)
	if err != nil {
		return AccountStorage{}, err
	}
	if !ok {
		return AccountStorage{}, fmt.Errorf("%w at or before %s", ErrNoSnapshot, t.UTC().Format(time.RFC3339))
	}
	out := AccountStorage{SnapshotTime: c.SnapshotTime, AccountID: account}
	// The account's rows of one pass are one key (database_uuid ''), so
	// GROUP BY that key counts a duplicated row once.
	rows, err := h.conn.Query(ctx, `SELECT any(size_bytes), any(databases) FROM `+h.db+`.`+Table+`
WHERE kind = 'account' AND account_id = ? AND snapshot_time = toDateTime(?) AND pass_id = ?
GROUP BY snapshot_time, pass_id`, account, unix(c.SnapshotTime), c.PassID)
	if err != nil {
		return AccountStorage{}, fmt.Errorf("snapshot: storage of %s: %w", account, err)
	}
	defer rows.Close()
	if rows.Next() {
		if err := rows.Scan(&out.SizeBytes, &out.Databases); err != nil {
			return AccountStorage{}, fmt.Errorf("snapshot: storage of %s: %w", account, err)
		}
	}
	return out, rows.Err()
}

// AccountHistory returns the account's figures in every completed snapshot
// with from ≤ snapshot_time ≤ to, oldest first, zero where the account was
// absent. Buckets without a completed pass (the snapshotter or the catalog
// down for a whole interval) are missing: billing carries the previous
// figure over them.
func (h *History) AccountHistory(ctx context.Context, account string, from, to time.Time) ([]AccountStorage, error) {
	// The passes of the range (one marker row each), joined with the
	// account's rows of exactly those passes; the inner GROUP BY is the
	// dedupe (each (snapshot_time, pass_id) is one key for one account).
	rows, err := h.conn.Query(ctx, `SELECT snapshot_time, size_bytes, databases FROM (
    SELECT snapshot_time, max(pass_id) AS pass_id FROM `+h.db+`.`+Table+`
    WHERE kind = 'pass' AND account_id = '' AND snapshot_time >= toDateTime(?) AND snapshot_time <= toDateTime(?)
    GROUP BY snapshot_time
) ANY LEFT JOIN (
    SELECT snapshot_time, pass_id, any(size_bytes) AS size_bytes, any(databases) AS databases FROM `+h.db+`.`+Table+`
    WHERE kind = 'account' AND account_id = ? AND snapshot_time >= toDateTime(?) AND snapshot_time <= toDateTime(?)
    GROUP BY snapshot_time, pass_id
) USING (snapshot_time, pass_id)
ORDER BY snapshot_time`, unix(from), unix(to), account, unix(from), unix(to))
	if err != nil {
		return nil, fmt.Errorf("snapshot: history of %s: %w", account, err)
	}
	defer rows.Close()
	var out []AccountStorage
	for rows.Next() {
		a := AccountStorage{AccountID: account}
		if err := rows.Scan(&a.SnapshotTime, &a.SizeBytes, &a.Databases); err != nil {
			return nil, fmt.Errorf("snapshot: history of %s: %w", account, err)
		}
		a.SnapshotTime = a.SnapshotTime.UTC()
		out = append(out, a)
	}
	return out, rows.Err()
}

// AccountsAt returns every account's figures in the newest completed
// snapshot at or before t, ordered by account (a billing run's input). It
// scans the partition's account rows (the key is per account first).
func (h *History) AccountsAt(ctx context.Context, t time.Time) ([]AccountStorage, error) {
	c, ok, err := h.completedAt(ctx, t)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("%w at or before %s", ErrNoSnapshot, t.UTC().Format(time.RFC3339))
	}
	rows, err := h.conn.Query(ctx, `SELECT account_id, any(size_bytes), any(databases) FROM `+h.db+`.`+Table+`
WHERE kind = 'account' AND snapshot_time = toDateTime(?) AND pass_id = ? AND day = toDate(toDateTime(?))
GROUP BY account_id ORDER BY account_id`, unix(c.SnapshotTime), c.PassID, unix(c.SnapshotTime))
	if err != nil {
		return nil, fmt.Errorf("snapshot: accounts at %s: %w", c.SnapshotTime.Format(time.RFC3339), err)
	}
	defer rows.Close()
	var out []AccountStorage
	for rows.Next() {
		a := AccountStorage{SnapshotTime: c.SnapshotTime}
		if err := rows.Scan(&a.AccountID, &a.SizeBytes, &a.Databases); err != nil {
			return nil, fmt.Errorf("snapshot: accounts at: %w", err)
		}
		out = append(out, a)
	}
	return out, rows.Err()
}

// DatabaseStorage is one database's figures in one snapshot.
type DatabaseStorage struct {
	SnapshotTime time.Time
	AccountID    string
	UUID         string
	SizeBytes    int64
	Seq          int64
}

// DatabasesAt returns the account's databases with a size in the newest
// completed snapshot at or before t, ordered by UUID (an invoice's
// detail).
func (h *History) DatabasesAt(ctx context.Context, account string, t time.Time) ([]DatabaseStorage, error) {
	c, ok, err := h.completedAt(ctx, t)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("%w at or before %s", ErrNoSnapshot, t.UTC().Format(time.RFC3339))
	}
	rows, err := h.conn.Query(ctx, `SELECT database_uuid, any(size_bytes), any(seq) FROM `+h.db+`.`+Table+`
WHERE kind = 'database' AND account_id = ? AND snapshot_time = toDateTime(?) AND pass_id = ?
GROUP BY database_uuid ORDER BY database_uuid`, account, unix(c.SnapshotTime), c.PassID)
	if err != nil {
		return nil, fmt.Errorf("snapshot: databases of %s: %w", account, err)
	}
	defer rows.Close()
	var out []DatabaseStorage
	for rows.Next() {
		d := DatabaseStorage{SnapshotTime: c.SnapshotTime, AccountID: account}
		if err := rows.Scan(&d.UUID, &d.SizeBytes, &d.Seq); err != nil {
			return nil, fmt.Errorf("snapshot: databases of %s: %w", account, err)
		}
		out = append(out, d)
	}
	return out, rows.Err()
}

// Counts are a bucket's stored rows against its distinct keys, for
// reconciliation and tests.
type Counts struct {
	Passes    uint64 // marker rows of the bucket (completed passes, duplicates included)
	Stored    uint64 // rows of any pass, duplicates included
	Distinct  uint64 // distinct keys of the selected pass (what reads count)
	Databases uint64 // distinct database rows of the selected pass
	Accounts  uint64 // distinct account rows of the selected pass
	SizeBytes int64  // sum of the selected pass's database sizes, deduplicated
}

// CountsAt reports the stored and distinct rows of the newest completed
// bucket at or before t.
func (h *History) CountsAt(ctx context.Context, t time.Time) (Counts, error) {
	c, ok, err := h.completedAt(ctx, t)
	if err != nil {
		return Counts{}, err
	}
	if !ok {
		return Counts{}, fmt.Errorf("%w at or before %s", ErrNoSnapshot, t.UTC().Format(time.RFC3339))
	}
	var n Counts
	ts := unix(c.SnapshotTime)
	err = h.conn.QueryRow(ctx, `SELECT countIf(kind = 'pass'), count() FROM `+h.db+`.`+Table+`
WHERE snapshot_time = toDateTime(?) AND day = toDate(toDateTime(?))`, ts, ts).Scan(&n.Passes, &n.Stored)
	if err != nil {
		return Counts{}, fmt.Errorf("snapshot: counts: %w", err)
	}
	err = h.conn.QueryRow(ctx, `SELECT count(), countIf(kind = 'database'), countIf(kind = 'account'), sumIf(s, kind = 'database') FROM (
    SELECT kind, account_id, database_uuid, any(size_bytes) AS s FROM `+h.db+`.`+Table+`
    WHERE snapshot_time = toDateTime(?) AND day = toDate(toDateTime(?)) AND pass_id = ? AND kind != 'pass'
    GROUP BY kind, account_id, database_uuid)`, ts, ts, c.PassID).Scan(&n.Distinct, &n.Databases, &n.Accounts, &n.SizeBytes)
	if err != nil {
		return Counts{}, fmt.Errorf("snapshot: counts: %w", err)
	}
	return n, nil
}
