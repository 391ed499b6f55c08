package fsm

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
)

// Heartbeat digests: what lets an object host check a million databases
// against the catalog without the catalog looking each one up.
//
// The catalog keeps, per (host, bucket), the XOR of DigestOf(uuid,
// object_id, routing_generation) over the ACTIVE databases placed on that
// host whose DigestBucket(uuid) is that bucket, and their count (table
// host_digests, schema version 4). It is maintained by every command that
// changes an active row's host, object, generation or state
// (create_database, delete_database, relocate_database), in the same
// savepoint as the row, so it is always exactly the databases table's; a
// catalog restored from a snapshot of an older version gets it rebuilt from
// the databases table by the migration (migrateFile), and CheckSnapshot
// recomputes and compares it. A host computes the same values over its own
// active objects (objecthost/digests.go); equal (digest, count) means the
// host and the catalog agree on every database of the bucket, so none of
// them needs a per-database heartbeat. Only a per-database answer may ever
// lead to anything destructive (objecthost/DESIGN.md): a digest only says
// "nothing to learn here".

// DigestBuckets is the number of buckets per host. A change to one
// database makes its host look up the bucket's databases individually (those
// that come due until it learns the change): ~N/(hosts×4096) of them, ~80
// per change at 1M databases on 3 hosts. A digest request carries at most
// this many buckets (~160 KB of JSON).
const DigestBuckets = 4096

// MaxDigestAccounts is the most accounts one digest request may ask about
// (as many as a per-database heartbeat may name databases).
const MaxDigestAccounts = MaxHeartbeatBatch

// digestMask keeps digests in 63 bits: non-negative SQLite integers, so the
// XOR written as (a | b) - (a & b) in SQL never overflows.
const digestMask = 1<<63 - 1

// mix64 is splitmix64's finaliser: FNV-1a alone spreads its low bits
// poorly for inputs differing in their last bytes.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// DigestBucket is the bucket of a database UUID, in [0, DigestBuckets).
// Hosts and catalog must compute it identically: never change it without
// a new digest call (hosts of the other build would see every bucket
// differ, which is safe but costs today's per-database heartbeats).
func DigestBucket(uuid string) int {
	h := fnvString(fnvOffset, "bucket\x00")
	return int(mix64(fnvString(h, uuid)) % DigestBuckets)
}

// FNV-1a, 64-bit, over strings without converting them to []byte (the
// create path runs this for every database: no allocation).
const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

func fnvString(h uint64, s string) uint64 {
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= fnvPrime
	}
	return h
}

func fnvByte(h uint64, b byte) uint64 { return (h ^ uint64(b)) * fnvPrime }

// DigestOf is one active database's contribution to its bucket's digest:
// a 63-bit hash of its UUID, object and routing generation. The state is
// implicit (only active databases are counted), and so is the host (the
// digest is per host).
func DigestOf(uuid, objectID string, generation int64) int64 {
	h := fnvByte(fnvString(fnvOffset, uuid), 0)
	h = fnvString(h, objectID)
	h = fnvByte(h, 0)
	for i := 56; i >= 0; i -= 8 {
		h = fnvByte(h, byte(uint64(generation)>>i))
	}
	return int64(mix64(h) & digestMask)
}

// BucketDigest is one bucket's digest and count, as a host computed it over
// its own objects (or the catalog over the rows placed on that host).
// Encoded as a 3-element array [bucket, digest, count] to keep a request of
// 4,096 buckets small.
type BucketDigest struct {
	Bucket int
	Digest int64
	Count  int64
}

func (b BucketDigest) MarshalJSON() ([]byte, error) {
	return json.Marshal([3]int64{int64(b.Bucket), b.Digest, b.Count})
}

func (b *BucketDigest) UnmarshalJSON(data []byte) error {
	var a [3]int64
	if err := json.Unmarshal(data, &a); err != nil {
		return err
	}
	b.Bucket, b.Digest, b.Count = int(a[0]), a[1], a[2]
	return nil
}

// DigestQuery is a host's digest heartbeat: its ID, the digests of the
// buckets it wants checked (each at most once), and the accounts whose
// limits and drained totals it wants (each at most once).
type DigestQuery struct {
	HostID   string         `json:"host_id"`
	Buckets  []BucketDigest `json:"buckets"`
	Accounts []string       `json:"accounts,omitempty"`
}

// DigestAnswer answers a DigestQuery: the buckets whose (digest, count)
// differ from the catalog's for that host, in increasing order, and the
// accounts asked about that exist (as in HeartbeatAnswer; an unknown account
// is simply absent). CatalogRestores is the catalog's restore count, as in
// HeartbeatAnswer: a host whose buckets all match sends no per-database
// heartbeat, and must still learn of a restore to republish its sizes.
type DigestAnswer struct {
	Differ          []int              `json:"differ"`
	Accounts        map[string]Account `json:"accounts"`
	CatalogRestores int64              `json:"catalog_restores,omitempty"`
}

// Validate checks a query's shape (the HTTP API answers invalid for it).
func (q *DigestQuery) Validate() error {
	if err := checkID("host id", q.HostID); err != nil {
		return err
	}
	if len(q.Buckets) > DigestBuckets {
		return fmt.Errorf("%w: %d buckets in one digest heartbeat, at most %d", ErrInvalid, len(q.Buckets), DigestBuckets)
	}
	if len(q.Accounts) > MaxDigestAccounts {
		return fmt.Errorf("%w: %d accounts in one digest heartbeat, at most %d", ErrInvalid, len(q.Accounts), MaxDigestAccounts)
	}
	seen := make(map[int]bool, len(q.Buckets))
	for _, b := range q.Buckets {
		if b.Bucket < 0 || b.Bucket >= DigestBuckets {
			return fmt.Errorf("%w: bucket %d out of [0, %d)", ErrInvalid, b.Bucket, DigestBuckets)
		}
		if seen[b.Bucket] {
			return fmt.Errorf("%w: bucket %d twice", ErrInvalid, b.Bucket)
		}
		seen[b.Bucket] = true
		if b.Digest < 0 || b.Count < 0 {
			return fmt.Errorf("%w: bucket %d: negative digest or count", ErrInvalid, b.Bucket)
		}
	}
	for _, a := range q.Accounts {
		if err := checkID("account id", a); err != nil {
			return err
		}
	}
	return nil
}

// HeartbeatDigests compares a host's bucket digests with the catalog's and
// reads the accounts it asks about, in one read transaction. Its cost is
// one range scan of the host's digest rows (at most DigestBuckets) plus one
// lookup per account: it does not grow with the number of databases.
func (f *FSM) HeartbeatDigests(ctx context.Context, q DigestQuery) (DigestAnswer, error) {
	ans := DigestAnswer{Differ: []int{}, Accounts: map[string]Account{}}
	if err := q.Validate(); err != nil {
		return ans, err
	}
	err := f.reader(func(db *sql.DB) error {
		tx, err := db.BeginTx(ctx, nil) // deferred: the first SELECT pins the read snapshot
		if err != nil {
			return err
		}
		defer tx.Rollback() //nolint:errcheck // read-only
		var have map[int]BucketDigest
		if len(q.Buckets) > 0 {
			have, err = hostDigests(ctx, tx, q.HostID)
			if err != nil {
				return err
			}
		}
		for _, b := range q.Buckets {
			c := have[b.Bucket] // zero when the catalog has no active database there
			if c.Digest != b.Digest || c.Count != b.Count {
				ans.Differ = append(ans.Differ, b.Bucket)
			}
		}
		sort.Ints(ans.Differ)
		// One row per call: the restore count.
		if ans.CatalogRestores, err = readCatalogRestores(ctx, tx.QueryRowContext(ctx, `SELECT value FROM meta WHERE key = '`+catalogRestoresKey+`'`)); err != nil {
			return err
		}
		return readAccounts(ctx, tx, q.Accounts, ans.Accounts)
	})
	return ans, err
}

// hostDigests reads every digest row of one host.
func hostDigests(ctx context.Context, tx *sql.Tx, hostID string) (map[int]BucketDigest, error) {
	rows, err := tx.QueryContext(ctx, `SELECT bucket, digest, count FROM host_digests WHERE host_id = ?`, hostID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[int]BucketDigest{}
	for rows.Next() {
		var b BucketDigest
		if err := rows.Scan(&b.Bucket, &b.Digest, &b.Count); err != nil {
			return nil, err
		}
		out[b.Bucket] = b
	}
	return out, rows.Err()
}

// readAccounts fills out with the accounts of ids that exist (limits and
// drained storage total), one indexed lookup each.
func readAccounts(ctx context.Context, tx *sql.Tx, ids []string, out map[string]Account) error {
	if len(ids) == 0 {
		return nil
	}
	alist, err := json.Marshal(ids)
	if err != nil {
		return err
	}
	arows, err := tx.QueryContext(ctx, `SELECT a.id, a.name, a.tier, a.max_databases, a.max_storage_bytes,
		a.max_database_bytes, a.rows_read_per_day, a.rows_written_per_day, a.heartbeat_interval_ms,
		a.active_databases, COALESCE(s.storage_bytes, 0), a.created_at
		FROM json_each(?) j JOIN accounts a ON a.id = j.value
		LEFT JOIN account_database_stats s ON s.account_id = a.id`, string(alist))
	if err != nil {
		return err
	}
	defer arows.Close()
	for arows.Next() {
		var a Account
		if err := arows.Scan(&a.ID, &a.Name, &a.Tier, &a.Limits.MaxDatabases, &a.Limits.MaxStorageBytes,
			&a.Limits.MaxDatabaseBytes, &a.Limits.RowsReadPerDay, &a.Limits.RowsWrittenPerDay,
			&a.Limits.HeartbeatIntervalMs, &a.ActiveDatabases, &a.StorageBytes, &a.CreatedAt); err != nil {
			return err
		}
		out[a.ID] = a
	}
	return arows.Err()
}

// digestStmts write a batch's digest changes on the write connection.
type digestStmts struct {
	add, prune *sql.Stmt
}

func prepareDigestStmts(p *preparer) digestStmts {
	return digestStmts{
		// One upsert per (host, bucket) the batch changed. XOR written as
		// (a | b) - (a & b): SQLite has no XOR operator, and with 63-bit
		// operands neither side overflows. (It replaced one statement per
		// batch over a JSON array of the changes: json_each and four ->>
		// extractions per row cost more than the driver calls they saved,
		// 14% of the FSM's profile at 7 creates per batch.)
		add: p.prep(`INSERT INTO host_digests (host_id, bucket, digest, count) VALUES (?1, ?2, ?3, ?4)
			ON CONFLICT (host_id, bucket) DO UPDATE SET
			digest = (digest | excluded.digest) - (digest & excluded.digest), count = count + excluded.count`),
		// An emptied bucket has no row, as in a rebuilt table.
		prune: p.prep(`DELETE FROM host_digests WHERE host_id = ?1 AND bucket = ?2 AND count = 0`),
	}
}

type digestKey struct {
	host   string
	bucket int
}

type digestDelta struct{ digest, count int64 }

// digestAdd records that an active database's contribution goes into its
// host's bucket (sign +1) or out of it (−1). The change is staged with the
// command (digestCmd): applyOne keeps it only if the command is not
// refused, and finishTx writes the batch's sum: one upsert per (host,
// bucket) the batch touched, however many of its commands touched it. XOR
// and sums commute, so the rows written depend only on the commands applied,
// not on how Raft batched them.
func (f *FSM) digestAdd(hostID, uuid, objectID string, generation int64, sign int64) {
	f.digestCmd = append(f.digestCmd, digestChange{digestKey{hostID, DigestBucket(uuid)},
		digestDelta{DigestOf(uuid, objectID, generation), sign}})
}

type digestChange struct {
	key digestKey
	d   digestDelta
}

// keepDigests merges the command's staged changes into the batch's.
func (f *FSM) keepDigests() {
	if len(f.digestCmd) == 0 {
		return
	}
	if f.digestBatch == nil {
		f.digestBatch = map[digestKey]digestDelta{}
	}
	for _, c := range f.digestCmd {
		d := f.digestBatch[c.key]
		d.digest ^= c.d.digest
		d.count += c.d.count
		f.digestBatch[c.key] = d
	}
	f.digestCmd = f.digestCmd[:0]
}

// flushDigests writes the batch's digest changes (inside its transaction,
// before the commit that is its checkpoint), in (host, bucket) order so
// every replica writes its rows in the same order.
func (f *FSM) flushDigests(ctx context.Context) error {
	if len(f.digestBatch) == 0 {
		return nil
	}
	keys := f.digestKeys[:0]
	for k, d := range f.digestBatch {
		if d.digest == 0 && d.count == 0 {
			continue // created and deleted in one batch
		}
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b digestKey) int {
		if c := cmp.Compare(a.host, b.host); c != 0 {
			return c
		}
		return cmp.Compare(a.bucket, b.bucket)
	})
	st := f.stmts.digest
	for _, k := range keys {
		d := f.digestBatch[k]
		if _, err := exec(ctx, st.add, k.host, k.bucket, d.digest, d.count); err != nil {
			return err
		}
		if d.count < 0 {
			if _, err := exec(ctx, st.prune, k.host, k.bucket); err != nil {
				return err
			}
		}
	}
	clear(f.digestBatch)
	f.digestKeys = keys[:0]
	return nil
}

// computeHostDigests computes every host's digests from the databases
// table (the rebuild and the check).
func computeHostDigests(ctx context.Context, q interface {
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
}) (map[string]map[int]BucketDigest, error) {
	rows, err := q.QueryContext(ctx, `SELECT host_id, uuid, object_id, routing_generation FROM databases WHERE state = 'active'`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]map[int]BucketDigest{}
	for rows.Next() {
		var (
			host, uuid, obj string
			gen             int64
		)
		if err := rows.Scan(&host, &uuid, &obj, &gen); err != nil {
			return nil, err
		}
		m := out[host]
		if m == nil {
			m = map[int]BucketDigest{}
			out[host] = m
		}
		b := DigestBucket(uuid)
		d := m[b]
		d.Bucket = b
		d.Digest ^= DigestOf(uuid, obj, gen)
		d.Count++
		m[b] = d
	}
	return out, rows.Err()
}

// rebuildHostDigests replaces host_digests by what the databases table
// implies: the migration to schema version 4 runs it on an older catalog,
// in the migration's transaction. Rows go in (host, bucket) order, so every
// replica writes the same file.
func rebuildHostDigests(ctx context.Context, tx *sql.Tx) error {
	all, err := computeHostDigests(ctx, tx)
	if err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM host_digests`); err != nil {
		return err
	}
	st, err := tx.PrepareContext(ctx, `INSERT INTO host_digests (host_id, bucket, digest, count) VALUES (?, ?, ?, ?)`)
	if err != nil {
		return err
	}
	defer st.Close()
	hosts := make([]string, 0, len(all))
	for h := range all {
		hosts = append(hosts, h)
	}
	sort.Strings(hosts)
	for _, h := range hosts {
		bs := make([]int, 0, len(all[h]))
		for b := range all[h] {
			bs = append(bs, b)
		}
		sort.Ints(bs)
		for _, b := range bs {
			d := all[h][b]
			if _, err := st.ExecContext(ctx, h, b, d.Digest, d.Count); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkHostDigests refuses a catalog whose host_digests is not exactly what
// its databases table implies (a hand-edited or corrupted backup): hosts
// would otherwise trust a digest that does not describe the rows.
func checkHostDigests(ctx context.Context, db *sql.DB) error {
	want, err := computeHostDigests(ctx, db)
	if err != nil {
		return invalidSnapshot("reading the databases failed (%s)", sqliteReason(err))
	}
	rows, err := db.QueryContext(ctx, `SELECT host_id, bucket, digest, count FROM host_digests`)
	if err != nil {
		return invalidSnapshot("reading the host digests failed (%s)", sqliteReason(err))
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var (
			host string
			d    BucketDigest
		)
		if err := rows.Scan(&host, &d.Bucket, &d.Digest, &d.Count); err != nil {
			return invalidSnapshot("reading the host digests failed (%s)", sqliteReason(err))
		}
		if w, ok := want[host][d.Bucket]; !ok || w != d {
			return invalidSnapshot("host digests do not match the databases table (host %q, bucket %d)", host, d.Bucket)
		}
		n++
	}
	if err := rows.Err(); err != nil {
		return invalidSnapshot("reading the host digests failed (%s)", sqliteReason(err))
	}
	total := 0
	for _, m := range want {
		total += len(m)
	}
	if n != total {
		return invalidSnapshot("host digests do not match the databases table (%d buckets stored, %d implied)", n, total)
	}
	return nil
}
