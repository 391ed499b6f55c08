// C side of package sqlexec: authorizer, preupdate hook, progress handler
// and batched step/column access. See csqlite.go.
#include "shim.h"

static int shoal_progress(void *p) {
	return ((shoal_ctx*)p)->cancel;
}

static int has_prefix_ci(const char *s, const char *p) {
	return s && strncasecmp(s, p, strlen(p)) == 0;
}

static int reserved_name(const char *s) {
	return has_prefix_ci(s, "_cf_") || has_prefix_ci(s, "_shoal_");
}

static const char *allowed_pragmas[] = {
	"table_info", "table_xinfo", "table_list", "index_list", "index_info",
	"index_xinfo", "foreign_key_list", "foreign_key_check", "integrity_check",
	"quick_check", "foreign_keys", "defer_foreign_keys", "optimize",
	// Read-only counter FTS5 queries internally through the same connection.
	"data_version", NULL
};

static int pragma_allowed(const char *name) {
	if (!name) return 0;
	for (int i = 0; allowed_pragmas[i]; i++) {
		if (strcasecmp(name, allowed_pragmas[i]) == 0) return 1;
	}
	return 0;
}

static int deny(shoal_ctx *c, const char *what, const char *name) {
	snprintf(c->reason, sizeof c->reason, "%s%s%s", what, name ? " " : "", name ? name : "");
	return SHOAL_DENY;
}

static int is_schema_table(const char *t) {
	return t && (strcasecmp(t, "sqlite_master") == 0 || strcasecmp(t, "sqlite_schema") == 0 ||
		strcasecmp(t, "sqlite_temp_master") == 0 || strcasecmp(t, "sqlite_temp_schema") == 0);
}

// shoal_auth is the authorizer. It runs at prepare time (and at automatic
// re-prepare after a schema change) and only constrains user SQL (c->user).
static int shoal_auth(void *p, int code, const char *a1, const char *a2, const char *db, const char *trig) {
	shoal_ctx *c = (shoal_ctx*)p;
	if (!c->user) return SHOAL_OK;
	switch (code) {
	case A_TRANSACTION:
	case A_SAVEPOINT:
		c->txn_denied = 1;
		return deny(c, "transaction control statements are not allowed", NULL);
	case A_ATTACH:
		return deny(c, "ATTACH is not allowed", NULL);
	case A_DETACH:
		return deny(c, "DETACH is not allowed", NULL);
	case A_PRAGMA:
		if (!pragma_allowed(a1)) return deny(c, "PRAGMA not allowed:", a1);
		if (strcasecmp(a1, "defer_foreign_keys") == 0) c->defer_fk = 1;
		if (reserved_name(a2)) return deny(c, "reserved table name:", a2);
		return SHOAL_OK;
	case A_READ:
		if (reserved_name(a1)) return deny(c, "reserved table name:", a1);
		if (has_prefix_ci(a1, "pragma_") && !pragma_allowed(a1 + 7)) return deny(c, "PRAGMA not allowed:", a1 + 7);
		return SHOAL_OK;
	case A_INSERT:
	case A_UPDATE:
	case A_DELETE:
		if (code == A_INSERT) c->grows = 1; // rows or, from DDL, schema entries
		if (reserved_name(a1)) return deny(c, "reserved table name:", a1);
		// Schema writes reach here only from DDL (SQLite itself refuses
		// direct writes to sqlite_schema without writable_schema, which is
		// denied); other sqlite_* tables (sequence, stat) are SQLite's own.
		// DROP TABLE and ALTER TABLE … RENAME maintain sqlite_sequence, and
		// ANALYZE sqlite_stat1/4, through nested statements authorized here
		// after the DDL itself (c->ddl is set by then); user DML on them is
		// refused.
		// The one exception: a script (ExecScript with AllowSequenceWrites,
		// i.e. an import) may write sqlite_sequence, as .dump output does
		// to restore AUTOINCREMENT counters. Such statements are never
		// cached, so they cannot run again outside the script.
		if (has_prefix_ci(a1, "sqlite_") && !is_schema_table(a1) && !c->ddl &&
			!(c->allow_seq && strcasecmp(a1, "sqlite_sequence") == 0))
			return deny(c, "writes to internal table not allowed:", a1);
		if (is_schema_table(a1)) c->ddl = 1;
		return SHOAL_OK;
	case A_CREATE_TEMP_INDEX: case A_CREATE_TEMP_TABLE: case A_CREATE_TEMP_TRIGGER: case A_CREATE_TEMP_VIEW:
	case A_DROP_TEMP_INDEX: case A_DROP_TEMP_TABLE: case A_DROP_TEMP_TRIGGER: case A_DROP_TEMP_VIEW:
		return deny(c, "temporary schema objects are not allowed", NULL);
	case A_CREATE_TABLE: case A_CREATE_VIEW: case A_DROP_TABLE: case A_DROP_VIEW:
	case A_CREATE_VTABLE: case A_DROP_VTABLE: case A_REINDEX: case A_ANALYZE:
		c->ddl = 1;
		if (code == A_CREATE_TABLE || code == A_CREATE_VIEW || code == A_CREATE_VTABLE) c->grows = 1;
		if (reserved_name(a1)) return deny(c, "reserved table name:", a1);
		return SHOAL_OK;
	case A_CREATE_INDEX: case A_DROP_INDEX: case A_CREATE_TRIGGER: case A_DROP_TRIGGER:
		c->ddl = 1;
		if (code == A_CREATE_INDEX || code == A_CREATE_TRIGGER) c->grows = 1;
		if (reserved_name(a1)) return deny(c, "reserved name:", a1);
		if (reserved_name(a2)) return deny(c, "reserved table name:", a2);
		return SHOAL_OK;
	case A_ALTER_TABLE:
		c->ddl = 1;
		c->grows = 1;
		if (reserved_name(a2)) return deny(c, "reserved table name:", a2);
		return SHOAL_OK;
	case A_FUNCTION:
		if (a2 && (strcasecmp(a2, "load_extension") == 0 || strcasecmp(a2, "fts3_tokenizer") == 0)) return deny(c, "function not allowed:", a2);
		return SHOAL_OK;
	case A_SELECT:
	case A_RECURSIVE:
		return SHOAL_OK;
	default:
		return deny(c, "operation not allowed", NULL);
	}
}

static int values_equal(sqlite3_value *a, sqlite3_value *b) {
	int ta = sqlite3_value_type(a), tb = sqlite3_value_type(b);
	if (ta != tb) return 0;
	switch (ta) {
	case 1: return sqlite3_value_int64(a) == sqlite3_value_int64(b);
	case 2: return sqlite3_value_double(a) == sqlite3_value_double(b);
	case 5: return 1;
	default: {
		int na = sqlite3_value_bytes(a), nb = sqlite3_value_bytes(b);
		if (na != nb) return 0;
		const void *pa = sqlite3_value_blob(a), *pb = sqlite3_value_blob(b);
		return na == 0 || memcmp(pa, pb, na) == 0;
	}
	}
}

// shoal_preupdate records every row change (the writer's rows_written
// source); Go turns records into rows + index entries after each statement.
static void shoal_preupdate(void *p, sqlite3 *db, int op, const char *zDb, const char *zTab, sqlite3_int64 k1, sqlite3_int64 k2) {
	shoal_ctx *c = (shoal_ctx*)p;
	uint64_t m[2] = {0, 0};
	int all = 0;
	if (op == A_UPDATE) {
		if (k1 != k2) {
			all = 1;
		} else {
			int n = sqlite3_preupdate_count(db);
			for (int i = 0; i < n; i++) {
				sqlite3_value *o = 0, *nv = 0;
				if (sqlite3_preupdate_old(db, i, &o) != 0 || sqlite3_preupdate_new(db, i, &nv) != 0 || !o || !nv) { all = 1; break; }
				if (!values_equal(o, nv)) {
					if (i >= 128) { all = 1; break; }
					m[i / 64] |= ((uint64_t)1) << (i % 64);
				}
			}
		}
	}
	if (c->nrec > 0) {
		shoal_wrec *r = &c->recs[c->nrec - 1];
		if (r->op == op && r->allcols == all && r->m[0] == m[0] && r->m[1] == m[1] && strcmp(r->tab, zTab) == 0) {
			r->n++;
			return;
		}
	}
	if (c->nrec == c->cap) {
		int ncap = c->cap ? c->cap * 2 : 8;
		shoal_wrec *nr = realloc(c->recs, ncap * sizeof(shoal_wrec));
		if (!nr) { c->oom = 1; return; }
		c->recs = nr;
		c->cap = ncap;
	}
	char *t = strdup(zTab);
	if (!t) { c->oom = 1; return; }
	shoal_wrec *r = &c->recs[c->nrec++];
	r->tab = t; r->op = op; r->allcols = all; r->m[0] = m[0]; r->m[1] = m[1]; r->n = 1;
}

void shoal_clear_recs(shoal_ctx *c) {
	for (int i = 0; i < c->nrec; i++) free(c->recs[i].tab);
	c->nrec = 0;
	c->oom = 0;
}

void shoal_free_ctx(shoal_ctx *c) {
	shoal_clear_recs(c);
	free(c->recs);
	free(c);
}

shoal_ctx *shoal_new_ctx(void) {
	return (shoal_ctx*)calloc(1, sizeof(shoal_ctx));
}

int shoal_setup(sqlite3 *db, shoal_ctx *c, int writer) {
	int rc;
	// Defensive mode: no writable_schema, no writes to shadow tables of
	// virtual tables (FTS5 _data/_idx…), no sqlite_dbpage writes.
	rc = sqlite3_db_config(db, 1010, 1, (int*)0); if (rc) return rc;
	// Untrusted schema: functions with side effects may not run from
	// triggers, views or generated columns.
	rc = sqlite3_db_config(db, 1017, 0, (int*)0); if (rc) return rc;
	rc = sqlite3_db_config(db, 1005, 0, (int*)0); if (rc) return rc;
	sqlite3_progress_handler(db, 1000, shoal_progress, c);
	rc = sqlite3_set_authorizer(db, shoal_auth, c); if (rc) return rc;
	if (writer) sqlite3_preupdate_hook(db, shoal_preupdate, c);
	return 0;
}

// shoal_simple_count reports whether the statement sql[0:n] is a top-level
// "simple count" (SELECT count(*) FROM t, no WHERE, GROUP BY or join),
// which SQLite answers with OP_Count on the b-tree instead of a loop, so
// scan statistics see no rows read. Its one result value is then the
// number of rows counted, which is what D1 reports as rows read. Found by
// reading the program's opcodes with EXPLAIN (once per cached statement):
// one Count, one one-column ResultRow, and no subroutine, coroutine or
// subquery machinery (a count inside a subquery or compound is not
// recognised; it still reads 0).
int shoal_simple_count(sqlite3 *db, const char *sql, int n) {
	char *q = sqlite3_mprintf("EXPLAIN %.*s", n, sql);
	if (!q) return 0;
	sqlite3_stmt *s = 0;
	int rc = sqlite3_prepare_v3(db, q, -1, 0, &s, 0);
	sqlite3_free(q);
	if (rc || !s) return 0;
	int counts = 0, results = 0, other = 0;
	while (sqlite3_step(s) == SHOAL_ROW) {
		const char *op = (const char*)sqlite3_column_text(s, 1);
		if (!op) continue;
		if (strcmp(op, "Count") == 0) counts++;
		else if (strcmp(op, "ResultRow") == 0) {
			results++;
			if (sqlite3_column_int64(s, 3) != 1) other++;
		} else if (strcmp(op, "Once") == 0 || strcmp(op, "BeginSubrtn") == 0 || strcmp(op, "Gosub") == 0 ||
			strcmp(op, "Yield") == 0 || strcmp(op, "InitCoroutine") == 0 || strcmp(op, "OpenEphemeral") == 0 ||
			strcmp(op, "Next") == 0 || strcmp(op, "Prev") == 0 || strcmp(op, "VNext") == 0 || strcmp(op, "Program") == 0) {
			other++;
		}
	}
	sqlite3_finalize(s);
	return counts == 1 && results == 1 && other == 0;
}

// shoal_open opens a connection through the "unix-excl" VFS: it takes one
// exclusive OS lock on the file for the process and then coordinates the
// process's connections in memory, with the WAL index in heap memory
// instead of a -shm file (no file to create, extend and mmap on every cold
// open, no fcntl per lock). The object host is the only process that opens
// its databases; another process trying to gets SQLITE_BUSY.
int shoal_open(const char *path, int flags, sqlite3 **db) {
	return sqlite3_open_v2(path, db, flags, "unix-excl");
}

// shoal_query_int runs a one-row integer query without caching it.
long long shoal_query_int(sqlite3 *db, const char *sql, int *rc) {
	sqlite3_stmt *s = 0;
	long long v = 0;
	*rc = sqlite3_prepare_v3(db, sql, -1, 0, &s, 0);
	if (*rc) return 0;
	*rc = sqlite3_step(s);
	if (*rc == SHOAL_ROW) {
		v = sqlite3_column_int64(s, 0);
		*rc = 0;
	} else if (*rc == SHOAL_DONE) {
		*rc = 0;
	}
	sqlite3_finalize(s);
	return v;
}

// shoal_configure applies a new connection's pragmas in one cgo call, with
// no statement kept prepared: a cold open used to spend most of its time
// preparing and caching these. Foreign keys go through db_config (no
// statement at all). The writer sets WAL mode (persistent in the file, so
// readers opened later share it), synchronous=NORMAL, and the size cap as
// max_page_count = max_bytes / page_size; readers are query_only. The
// page size is returned for size_after (0 for readers: they use the
// writer's measurement).
int shoal_configure(sqlite3 *db, int writer, long long max_bytes, long long *page_size) {
	*page_size = 0;
	int rc = sqlite3_db_config(db, 1002, 1, (int*)0); // SQLITE_DBCONFIG_ENABLE_FKEY
	if (rc) return rc;
	// Persistent WAL: the last close checkpoints and truncates the -wal file
	// to 0 bytes (journal_size_limit >= 0) instead of deleting it, so the
	// next open does not create it again. Creating a file is the dominant
	// cost of a cold open on ext4 (inode allocation), and a host opens and
	// closes databases all day.
	int one = 1;
	sqlite3_file_control(db, "main", 10, &one); // SQLITE_FCNTL_PERSIST_WAL
	if (!writer) return sqlite3_exec(db, "PRAGMA query_only=1;PRAGMA journal_size_limit=4194304", 0, 0, 0);
	rc = sqlite3_exec(db, "PRAGMA journal_mode=WAL;PRAGMA synchronous=NORMAL;PRAGMA journal_size_limit=4194304", 0, 0, 0);
	if (rc) return rc;
	long long ps = shoal_query_int(db, "PRAGMA page_size", &rc);
	if (rc) return rc;
	if (ps <= 0) ps = 4096;
	long long pages = max_bytes / ps;
	if (pages < 1) pages = 1;
	char sql[64];
	snprintf(sql, sizeof sql, "PRAGMA max_page_count=%lld", pages);
	rc = sqlite3_exec(db, sql, 0, 0, 0);
	*page_size = ps;
	return rc;
}

int shoal_prepare(sqlite3 *db, const char *z, int n, sqlite3_stmt **out, int *consumed, int persistent) {
	const char *tail = 0;
	int rc = sqlite3_prepare_v3(db, z, n, persistent ? 1 : 0, out, &tail);
	*consumed = tail ? (int)(tail - z) : n;
	return rc;
}

long long shoal_rows_read(sqlite3_stmt *s) {
	long long total = 0;
	for (int i = 0; ; i++) {
		sqlite3_int64 n = 0;
		if (sqlite3_stmt_scanstatus_v2(s, i, 1, 0, &n) != 0) break;
		total += n;
	}
	sqlite3_stmt_scanstatus_reset(s);
	return total;
}



void shoal_fill(sqlite3_stmt *s, int ncol, shoal_cell *cells) {
	for (int k = 0; k < ncol; k++) {
		shoal_cell *c = &cells[k];
		c->type = sqlite3_column_type(s, k);
		switch (c->type) {
		case 1: c->i = sqlite3_column_int64(s, k); break;
		case 2: c->f = sqlite3_column_double(s, k); break;
		case 3: c->p = sqlite3_column_text(s, k); c->n = sqlite3_column_bytes(s, k); break;
		case 4: c->p = sqlite3_column_blob(s, k); c->n = sqlite3_column_bytes(s, k); break;
		default: break;
		}
	}
}

int shoal_bind_text(sqlite3_stmt *s, int i, const char *p, int n) {
	if (n == 0) p = "";  // a NULL pointer would bind NULL, not ''
	return sqlite3_bind_text(s, i, p, n, SHOAL_TRANSIENT);
}

int shoal_bind_blob(sqlite3_stmt *s, int i, const void *p, int n) {
	if (n == 0) p = "";  // a NULL pointer would bind NULL, not x''
	return sqlite3_bind_blob(s, i, p, n, SHOAL_TRANSIENT);
}

void shoal_stmt_done(sqlite3 *db, sqlite3_stmt *s, shoal_stats *out) {
	out->rows_read = shoal_rows_read(s);
	out->total_changes = sqlite3_total_changes64(db);
	out->changes = sqlite3_changes64(db);
	out->last_rowid = sqlite3_last_insert_rowid(db);
}

// shoal_deferred_fks returns the number of unresolved (deferred) foreign key
// violations of the open transaction.
int shoal_deferred_fks(sqlite3 *db) {
	int cur = 0, hi = 0;
	sqlite3_db_status(db, 10, &cur, &hi, 0);
	return cur;
}
