package fsm

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"sort"
	"sync"
)

// Heartbeat digests: what lets an object host check a million databases
// against the catalog without the catalog looking each one up.
//
// The catalog keeps, per (host, bucket), the XOR of DigestOf(uuid,
// object_id, routing_generation) over the ACTIVE databases placed on that
// host whose DigestBucket(uuid) is that bucket, and their count. It is
// maintained by every command that changes an active row's host, object,
// generation or state (create_database, delete_database,
// relocate_database), staged with the command and kept only if the command
// is not refused, so it is always exactly what the databases table
// implies. It lives in memory (digestMem), not in the catalog file: a
// snapshot carries it in its copy's host_digests table (the table of
// schema version 4, empty on a live replica), Restore loads it back, a
// catalog restored from a snapshot of an older version gets it rebuilt
// from the databases table by the migration (migrateFile), and
// CheckSnapshot recomputes and compares it. A host computes the same values
// over its own active objects (objecthost/digests.go); equal (digest,
// count) means the host and the catalog agree on every database of the
// bucket, so none of them needs a per-database heartbeat. Only a
// per-database answer may ever lead to anything destructive
// (objecthost/DESIGN.md): a digest only says "nothing to learn here".

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
// reads the accounts it asks about. Its cost is a copy of the host's
// in-memory digests (at most DigestBuckets) plus one lookup per account: it
// does not grow with the number of databases. The digests, the restore
// count and the accounts are read at one applied state (readDigestsPinned).
func (f *FSM) HeartbeatDigests(ctx context.Context, q DigestQuery) (DigestAnswer, error) {
	ans := DigestAnswer{Differ: []int{}, Accounts: map[string]Account{}}
	if err := q.Validate(); err != nil {
		return ans, err
	}
	err := f.reader(func(db *sql.DB) error {
		// Deferred BEGIN, on a connection taken before the digests' lock
		// (never wait for a pooled connection while holding it): the
		// restore count's SELECT pins the read snapshot.
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback() //nolint:errcheck // read-only
		have, err := f.readDigestsPinned(func() error {
			var err error
			ans.CatalogRestores, err = readCatalogRestores(ctx, tx.QueryRowContext(ctx, `SELECT value FROM meta WHERE key = '`+catalogRestoresKey+`'`))
			return err
		}, false, hostsAsked(q)...)
		if err != nil {
			return err
		}
		var buckets *[DigestBuckets]digestDelta
		if h := have[q.HostID]; h != nil {
			buckets = &h.b
		}
		for _, b := range q.Buckets {
			var c digestDelta // zero when the catalog has no active database there
			if buckets != nil {
				c = buckets[b.Bucket]
			}
			if c.digest != b.Digest || c.count != b.Count {
				ans.Differ = append(ans.Differ, b.Bucket)
			}
		}
		sort.Ints(ans.Differ)
		return readAccounts(ctx, tx, q.Accounts, ans.Accounts)
	})
	return ans, err
}

// hostsAsked is the host whose digests q needs: none for a query of
// accounts only.
func hostsAsked(q DigestQuery) []string {
	if len(q.Buckets) == 0 {
		return nil
	}
	return []string{q.HostID}
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

type digestKey struct {
	host   string
	bucket int
}

type digestDelta struct{ digest, count int64 }

type digestChange struct {
	key digestKey
	d   digestDelta
}

// digestAdd records that an active database's contribution goes into its
// host's bucket (sign +1) or out of it (−1). The change is staged with the
// command (digestCmd): applyOne keeps it only if the command is not
// refused, and ApplyBatch adds the batch's sum to the memory (digestMem)
// when it commits. XOR and sums commute, so the digests depend only on the
// commands applied, not on how Raft batched them.
func (f *FSM) digestAdd(hostID, uuid, objectID string, generation int64, sign int64) {
	f.digestCmd = append(f.digestCmd, digestChange{digestKey{hostID, DigestBucket(uuid)},
		digestDelta{DigestOf(uuid, objectID, generation), sign}})
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

// digestMem holds the heartbeat digests in memory, as dedupe holds the
// request IDs: the catalog file's host_digests table is empty on a live
// replica and filled only in snapshot copies (Persist), which is why
// snapshots and backups look exactly as they did when the table was
// written by every batch. Writing it cost every create a random page of
// the table on every replica (the bucket is a hash of the UUID): see
// raftmeta/DESIGN.md, "Heartbeat digests in memory, written only into
// snapshots", for what that cost and what keeping them here saved.
//
// Ownership and consistency. Only the apply goroutine (ApplyBatch,
// Snapshot, Restore, which hashicorp/raft never runs concurrently) changes
// it. ApplyBatch changes it under mu, together with the COMMIT of the batch
// that made the change (mu is taken before the COMMIT and released after
// the memory is updated), and before the applied index moves. A reader
// (HeartbeatDigests, Dump) pins its SQLite read snapshot and reads the
// digests under mu held shared, so what it reads of the memory and of the
// tables is one state: the state after one applied batch, never a mix of
// two, and never older than the applied index a read barrier waited for.
//
// Memory: one array of DigestBuckets (digest, count) pairs per host with at
// least one active database, 64 KiB each, whatever the number of databases
// (1M databases on 100 hosts: 6.4 MB, ~6.4 bytes per database).
//
// Snapshots share the arrays instead of copying them: view bumps gen, and
// the apply goroutine copies an array whose gen is older before it writes
// it (copy on write), so a view's arrays never change while Persist reads
// them from another goroutine.
type digestMem struct {
	mu    sync.RWMutex
	hosts map[string]*hostDigestBuckets
	gen   uint64 // apply goroutine only
}

// hostDigestBuckets is one host's buckets; an empty bucket is {0, 0}.
type hostDigestBuckets struct {
	b        [DigestBuckets]digestDelta
	nonEmpty int    // buckets with count > 0: the host is dropped at 0
	gen      uint64 // digestMem.gen when this array was made
}

func newDigestMem() *digestMem { return &digestMem{hosts: map[string]*hostDigestBuckets{}} }

// add applies a batch's changes. The caller holds mu (see ApplyBatch).
func (m *digestMem) add(batch map[digestKey]digestDelta) {
	for k, d := range batch {
		if d.digest == 0 && d.count == 0 {
			continue // created and deleted in one batch
		}
		h := m.hosts[k.host]
		switch {
		case h == nil:
			h = &hostDigestBuckets{gen: m.gen}
			m.hosts[k.host] = h
		case h.gen != m.gen: // shared with a snapshot view: copy on write
			c := *h
			c.gen = m.gen
			h = &c
			m.hosts[k.host] = h
		}
		old := h.b[k.bucket]
		nb := digestDelta{old.digest ^ d.digest, old.count + d.count}
		if nb.count <= 0 {
			// An emptied bucket is {0, 0}, as an absent table row was.
			// (A count below zero would be a bug; treating the bucket as
			// empty is what the table's prune did with count = 0.)
			nb = digestDelta{}
		}
		switch {
		case old.count == 0 && nb.count != 0:
			h.nonEmpty++
		case old.count != 0 && nb.count == 0:
			h.nonEmpty--
		}
		h.b[k.bucket] = nb
		if h.nonEmpty == 0 {
			delete(m.hosts, k.host)
		}
	}
}

// digestView is the digests at one applied index, for a snapshot: the
// hosts' arrays as they were, never written again (see digestMem).
type digestView struct{ hosts map[string]*hostDigestBuckets }

// view takes a digestView. Apply goroutine only (Snapshot).
func (m *digestMem) view() digestView {
	v := digestView{hosts: make(map[string]*hostDigestBuckets, len(m.hosts))}
	for h, b := range m.hosts {
		v.hosts[h] = b
	}
	m.gen++ // every array now belongs to the view too
	return v
}

// each calls fn for every non-empty bucket in (host, bucket) order, the
// order the table's rows were always written in.
func (v digestView) each(fn func(host string, bucket int, d digestDelta) error) error {
	hosts := make([]string, 0, len(v.hosts))
	for h := range v.hosts {
		hosts = append(hosts, h)
	}
	sort.Strings(hosts)
	for _, h := range hosts {
		arr := v.hosts[h]
		for b := range arr.b {
			if arr.b[b].count == 0 {
				continue
			}
			if err := fn(h, b, arr.b[b]); err != nil {
				return err
			}
		}
	}
	return nil
}

// asMap renders the view the way computeHostDigests does (checks, tests).
func (v digestView) asMap() map[string]map[int]BucketDigest {
	out := map[string]map[int]BucketDigest{}
	v.each(func(host string, bucket int, d digestDelta) error { //nolint:errcheck // fn never fails
		if out[host] == nil {
			out[host] = map[int]BucketDigest{}
		}
		out[host][bucket] = BucketDigest{Bucket: bucket, Digest: d.digest, Count: d.count}
		return nil
	})
	return out
}

// readDigestsPinned runs pin (the first read of a SQLite read transaction,
// which pins its snapshot) and copies the digests of every host (all) or
// of hosts at the same applied state: under mu held shared, so
// no batch can commit between the pin and the view. pin must be tx's first
// read. The view's arrays are copied (readers may run on any goroutine,
// and the apply goroutine writes the live arrays in place). Callers hold
// f.mu shared (f.reader), so Restore cannot swap the memory meanwhile.
func (f *FSM) readDigestsPinned(pin func() error, all bool, hosts ...string) (map[string]*hostDigestBuckets, error) {
	m := f.dig
	m.mu.RLock()
	defer m.mu.RUnlock()
	if err := pin(); err != nil {
		return nil, err
	}
	out := map[string]*hostDigestBuckets{}
	copyHost := func(h string, b *hostDigestBuckets) {
		c := *b
		out[h] = &c
	}
	if all {
		for h, b := range m.hosts {
			copyHost(h, b)
		}
		return out, nil
	}
	for _, h := range hosts {
		if b := m.hosts[h]; b != nil {
			copyHost(h, b)
		}
	}
	return out, nil
}

// writeDigests stores the view's buckets into the host_digests table of db
// (a snapshot's copy of the catalog, whose table is empty: the live one is
// kept empty), in one transaction.
func writeDigests(ctx context.Context, db *sql.DB, v digestView) error {
	if len(v.hosts) == 0 {
		return nil
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("write host digests: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // no-op after commit
	st, err := tx.PrepareContext(ctx, `INSERT INTO host_digests (host_id, bucket, digest, count) VALUES (?, ?, ?, ?)`)
	if err != nil {
		return fmt.Errorf("write host digests: %w", err)
	}
	defer st.Close()
	if err := v.each(func(host string, bucket int, d digestDelta) error {
		_, err := st.ExecContext(ctx, host, bucket, d.digest, d.count)
		return err
	}); err != nil {
		return fmt.Errorf("write host digests: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("write host digests: %w", err)
	}
	return nil
}

// loadDigests reads the host_digests table of the open catalog (a restored
// snapshot; one of a schema version before 4 had it rebuilt from the
// databases table by migrateFile) into a new digestMem and empties the
// table; the caller installs it (digestMem.replace) once nothing else can
// fail. Callers own f exclusively (Restore holds f.mu; trialLoad's f is
// its own).
func (f *FSM) loadDigests(ctx context.Context) (*digestMem, error) {
	m := newDigestMem()
	rows, err := f.wconn.QueryContext(ctx, `SELECT host_id, bucket, digest, count FROM host_digests`)
	if err != nil {
		return nil, fmt.Errorf("load host digests: %w", err)
	}
	for rows.Next() {
		var (
			host   string
			bucket int
			d      digestDelta
		)
		if err := rows.Scan(&host, &bucket, &d.digest, &d.count); err != nil {
			rows.Close()
			return nil, fmt.Errorf("load host digests: %w", err)
		}
		if bucket < 0 || bucket >= DigestBuckets || d.count <= 0 || d.digest < 0 {
			rows.Close()
			return nil, fmt.Errorf("load host digests: host %q bucket %d: digest %d, count %d out of range", host, bucket, d.digest, d.count)
		}
		// Straight into the arrays (the key is unique: no merge needed).
		h := m.hosts[host]
		if h == nil {
			h = &hostDigestBuckets{gen: m.gen}
			m.hosts[host] = h
		}
		h.b[bucket] = d
		h.nonEmpty++
	}
	if err := rows.Close(); err != nil {
		return nil, fmt.Errorf("load host digests: %w", err)
	}
	if _, err := f.wconn.ExecContext(ctx, `DELETE FROM host_digests`); err != nil {
		return nil, fmt.Errorf("load host digests: %w", err)
	}
	return m, nil
}

// replace installs digests loaded by loadDigests. No snapshot view is
// outstanding (Restore holds f.mu exclusively, which every view's
// snapshot holds shared until Release), so the generation restarts with
// the new arrays'.
func (m *digestMem) replace(n *digestMem) {
	m.mu.Lock()
	m.hosts, m.gen = n.hosts, n.gen
	m.mu.Unlock()
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
// its databases table implies (a hand-edited or corrupted backup, or a
// snapshot written from wrong digests in memory): hosts would otherwise
// trust a digest that does not describe the rows.
func checkHostDigests(ctx context.Context, db *sql.DB) error {
	want, err := computeHostDigests(ctx, db)
	if err != nil {
		return invalidSnapshot("reading the databases failed (%s)", sqliteReason(err))
	}
	got, err := tableHostDigests(ctx, db)
	if err != nil {
		return invalidSnapshot("reading the host digests failed (%s)", sqliteReason(err))
	}
	if err := compareHostDigests(want, got); err != nil {
		return invalidSnapshot("%s", err)
	}
	return nil
}

// tableHostDigests reads a catalog file's host_digests table.
func tableHostDigests(ctx context.Context, db *sql.DB) (map[string]map[int]BucketDigest, error) {
	rows, err := db.QueryContext(ctx, `SELECT host_id, bucket, digest, count FROM host_digests`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]map[int]BucketDigest{}
	for rows.Next() {
		var (
			host string
			d    BucketDigest
		)
		if err := rows.Scan(&host, &d.Bucket, &d.Digest, &d.Count); err != nil {
			return nil, err
		}
		if out[host] == nil {
			out[host] = map[int]BucketDigest{}
		}
		out[host][d.Bucket] = d
	}
	return out, rows.Err()
}

// compareHostDigests says where got differs from want (computed from the
// databases table), nil if nowhere. The first difference in (host, bucket)
// order is named, so the message is deterministic.
func compareHostDigests(want, got map[string]map[int]BucketDigest) error {
	hosts := map[string]bool{}
	for h := range want {
		hosts[h] = true
	}
	for h := range got {
		hosts[h] = true
	}
	sorted := make([]string, 0, len(hosts))
	for h := range hosts {
		sorted = append(sorted, h)
	}
	sort.Strings(sorted)
	for _, h := range sorted {
		for b := 0; b < DigestBuckets; b++ {
			w, wok := want[h][b]
			g, gok := got[h][b]
			if wok != gok || w != g {
				return fmt.Errorf("host digests do not match the databases table (host %q, bucket %d: %d databases implied, %d stored)", h, b, w.Count, g.Count)
			}
		}
	}
	return nil
}
