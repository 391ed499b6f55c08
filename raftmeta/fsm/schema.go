package fsm

// schemaVersion is stored in meta and checked by Restore: a snapshot of an
// older version is migrated (see migrations), one of a newer or unknown
// version is refused rather than half-understood.
const schemaVersion = "4"

// migrations[i] moves a catalog from schema version i+1 to version i+2;
// len(migrations)+1 is schemaVersion. A fresh catalog is schema (version 1)
// followed by every migration, and an older one restored from a snapshot or
// backup runs the ones it lacks (migrateFile). Building both the same way
// keeps their schema objects identical, which the restore checks compare
// text for text: SQLite records ALTER TABLE ADD COLUMN by splicing the
// column into the table's CREATE statement, so a table written out with
// the column from the start would read differently.
//
// Rules for a migration: deterministic (every replica restoring the same
// old snapshot must reach the same catalog), no data-dependent failure
// (a NOT NULL column needs a DEFAULT), and never a change of meaning for
// rows already there.
var migrations = []string{
	// 1 → 2: the sequence of the size in database_stats (event.Size.Seq,
	// increasing per database on its host). SetDatabaseStats ignores a
	// size whose seq is not greater than the stored one; rows of version 1
	// get 0, "no sequence seen yet". And SetDatabaseStats logs the deltas
	// of updated sizes itself, one change row per account per command
	// instead of one per size from an update trigger (half its cost). The
	// insert and delete triggers stay.
	`ALTER TABLE database_stats ADD COLUMN seq INTEGER NOT NULL DEFAULT 0;
	DROP TRIGGER database_stats_update;`,
	// 2 → 3: scoped API tokens (scope 'edit' — what every token of version
	// 2 could do — or 'read'; databases, a JSON array of database UUIDs the
	// token is limited to, '' for all; expires_at, Unix ns, 0 for never) and
	// the audit log of control-plane actions (audit.go). audit_log is a
	// rowid table: ids are max+1, deterministic, in commit order.
	`ALTER TABLE api_tokens ADD COLUMN scope TEXT NOT NULL DEFAULT 'edit';
	ALTER TABLE api_tokens ADD COLUMN databases TEXT NOT NULL DEFAULT '';
	ALTER TABLE api_tokens ADD COLUMN expires_at INTEGER NOT NULL DEFAULT 0;
	CREATE TABLE audit_log (
		id          INTEGER PRIMARY KEY,
		time        INTEGER NOT NULL,
		type        TEXT NOT NULL,
		actor       TEXT NOT NULL,
		source      TEXT NOT NULL,
		account_id  TEXT NOT NULL,
		subject     TEXT NOT NULL,
		detail      TEXT NOT NULL
	);
	CREATE INDEX audit_log_account ON audit_log (account_id, id);`,
	// 3 → 4: heartbeat digests (hbdigest.go): per (host, bucket) the XOR of
	// DigestOf over the active databases placed there, and their count. A
	// derived table: migrateFile rebuilds it from databases in the
	// migration's transaction; commands keep it in step after that.
	`CREATE TABLE host_digests (
		host_id  TEXT NOT NULL,
		bucket   INTEGER NOT NULL,
		digest   INTEGER NOT NULL,
		count    INTEGER NOT NULL,
		PRIMARY KEY (host_id, bucket)
	) WITHOUT ROWID;`,
}

// currentSchema is the SQL that builds a catalog of schemaVersion.
func currentSchema() string { return schemaAt(len(migrations) + 1) }

// schemaAt is the SQL that builds a catalog of schema version v (1 ≤ v ≤
// len(migrations)+1).
func schemaAt(v int) string {
	s := schema
	for _, m := range migrations[:v-1] {
		s += "\n" + m
	}
	return s
}

// schema is the catalog at version 1 (migrations change it; as of version
// 2, database_stats has a seq column). Every read path has an index that
// makes it O(log n) or O(log n + page):
//   - databases by uuid (primary key), by (account, name) among active rows
//     (partial unique index: also enforces name uniqueness per account among
//     ACTIVE databases only, so a deleted name can be reused), and listing by
//     (account, created_at, uuid) among active rows;
//   - accounts carry active_databases, maintained in the same transaction as
//     every create/delete, so limits and list totals are O(1);
//   - account_database_stats holds each account's drained storage total.
//
// Every change of database_stats appends its size difference to
// account_database_stats_changes in the same transaction, so the storage
// pipeline can never forget a delta: the insert and delete triggers for
// first sizes and deleted databases, SetDatabaseStats itself for updates
// (as of version 2: one row per account per command). Any new writer of
// database_stats.size_bytes must log its deltas the same way.
const schema = `
CREATE TABLE meta (
	key   TEXT PRIMARY KEY,
	value TEXT NOT NULL
) WITHOUT ROWID;

CREATE TABLE accounts (
	id                     TEXT PRIMARY KEY,
	name                   TEXT NOT NULL,
	tier                   TEXT NOT NULL,
	max_databases          INTEGER NOT NULL,
	max_storage_bytes      INTEGER NOT NULL,
	max_database_bytes     INTEGER NOT NULL,
	rows_read_per_day      INTEGER NOT NULL,
	rows_written_per_day   INTEGER NOT NULL,
	heartbeat_interval_ms  INTEGER NOT NULL,
	active_databases       INTEGER NOT NULL DEFAULT 0,
	created_at             INTEGER NOT NULL,
	updated_at             INTEGER NOT NULL
) WITHOUT ROWID;

CREATE TABLE api_tokens (
	id          TEXT PRIMARY KEY,
	account_id  TEXT NOT NULL,
	hash        TEXT NOT NULL UNIQUE,
	name        TEXT NOT NULL,
	admin       INTEGER NOT NULL,
	revoked     INTEGER NOT NULL DEFAULT 0,
	created_at  INTEGER NOT NULL,
	revoked_at  INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;

CREATE TABLE hosts (
	id            TEXT PRIMARY KEY,
	address       TEXT NOT NULL,
	region        TEXT NOT NULL,
	jurisdiction  TEXT NOT NULL,
	capacity      INTEGER NOT NULL,
	state         TEXT NOT NULL,
	databases     INTEGER NOT NULL DEFAULT 0,
	bytes         INTEGER NOT NULL DEFAULT 0,
	updated_at    INTEGER NOT NULL
) WITHOUT ROWID;

-- A rowid table (uuid is a UNIQUE key): rows are ~250 bytes and UUIDs are
-- random, so a WITHOUT ROWID table would split pages of whole rows at random
-- places on every insert; here inserts append and only the narrow uuid index
-- takes the random insert. rowid is max+1, deterministic on every replica.
CREATE TABLE databases (
	id                  INTEGER PRIMARY KEY,
	uuid                TEXT NOT NULL UNIQUE,
	account_id          TEXT NOT NULL,
	name                TEXT NOT NULL,
	object_id           TEXT NOT NULL,
	host_id             TEXT NOT NULL,
	region              TEXT NOT NULL,
	jurisdiction        TEXT NOT NULL,
	read_replication    TEXT NOT NULL,
	state               TEXT NOT NULL CHECK (state IN ('active', 'deleted')),
	created_at          INTEGER NOT NULL,
	deleted_at          INTEGER NOT NULL DEFAULT 0,
	routing_generation  INTEGER NOT NULL DEFAULT 1
);
CREATE UNIQUE INDEX databases_active_name ON databases (account_id, name) WHERE state = 'active';
CREATE INDEX databases_active_list ON databases (account_id, created_at, uuid) WHERE state = 'active';

-- seq: added by migration 1 → 2.
CREATE TABLE database_stats (
	uuid        TEXT PRIMARY KEY,
	account_id  TEXT NOT NULL,
	size_bytes  INTEGER NOT NULL,
	updated_at  INTEGER NOT NULL
) WITHOUT ROWID;

-- Append-only between drains. id is the rowid; DrainStats always deletes a
-- prefix (id <= cutoff), so the remaining ids are contiguous and the pending
-- count is max(id) - min(id) + 1, O(log n).
CREATE TABLE account_database_stats_changes (
	id          INTEGER PRIMARY KEY,
	account_id  TEXT NOT NULL,
	delta       INTEGER NOT NULL
);

CREATE TABLE account_database_stats (
	account_id     TEXT PRIMARY KEY,
	storage_bytes  INTEGER NOT NULL,
	updated_at     INTEGER NOT NULL
) WITHOUT ROWID;

CREATE TRIGGER database_stats_insert AFTER INSERT ON database_stats
WHEN NEW.size_bytes != 0
BEGIN
	INSERT INTO account_database_stats_changes (account_id, delta) VALUES (NEW.account_id, NEW.size_bytes);
END;

CREATE TRIGGER database_stats_update AFTER UPDATE OF size_bytes ON database_stats
WHEN NEW.size_bytes != OLD.size_bytes
BEGIN
	INSERT INTO account_database_stats_changes (account_id, delta) VALUES (NEW.account_id, NEW.size_bytes - OLD.size_bytes);
END;

CREATE TRIGGER database_stats_delete AFTER DELETE ON database_stats
WHEN OLD.size_bytes != 0
BEGIN
	INSERT INTO account_database_stats_changes (account_id, delta) VALUES (OLD.account_id, -OLD.size_bytes);
END;

-- Recently applied request IDs and their original results (JSON of Result).
-- The live catalog keeps them in memory (dedupe.go) and this table empty;
-- snapshots write them here, and Restore loads them back and empties it.
-- log_index is the rowid (one command per entry), so rows append and the
-- entry-count prune is a rowid range delete.
CREATE TABLE requests (
	log_index   INTEGER PRIMARY KEY,
	request_id  TEXT NOT NULL UNIQUE,
	ts          INTEGER NOT NULL,
	result      BLOB NOT NULL
);
CREATE INDEX requests_ts ON requests (ts);
`

// dumpTables lists every table with the ORDER BY that makes Dump
// deterministic.
func dumpTables() []struct{ name, order string } {
	return []struct{ name, order string }{
		{"meta", "key"},
		{"accounts", "id"},
		{"api_tokens", "id"},
		{"hosts", "id"},
		{"databases", "uuid"},
		{"database_stats", "uuid"},
		{"account_database_stats_changes", "id"},
		{"account_database_stats", "account_id"},
		{"requests", "request_id"},
		{"audit_log", "id"},
		{"host_digests", "host_id, bucket"},
	}
}

// pendingChangesQuery counts undrained changes in O(log n) from the ids'
// contiguity (two separate subqueries, so each uses the min/max
// optimisation).
const pendingChangesQuery = `SELECT COALESCE((SELECT MAX(id) FROM account_database_stats_changes) -
	(SELECT MIN(id) FROM account_database_stats_changes) + 1, 0)`
