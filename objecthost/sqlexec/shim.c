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
	"index_xinfo", "foreign_key_list", "foreign_key_check",
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

// Functions D1 refuses ("not authorized to use function: X"): they reveal
// build details or are outside workerd's allowlist. Measured against
// miniflare 4.20260426.0 (test/compat); everything else this build has and
// D1 has is allowed.
static const char *denied_functions[] = {
	"sqlite_version", "sqlite_source_id", "sqlite_compileoption_get", "sqlite_compileoption_used",
	"sqlite_log", "sqlite_offset", "ceiling", "power", "log10", "subtype", "json_error_position",
	"json_pretty", "fts5", "fts5_get_locale", "fts5_locale", "fts5_source_id", "load_extension", NULL
};

// Functions this build has and D1's does not: refused with SQLite's own
// "no such function: X", as D1 answers.
static const char *absent_functions[] = {
	"fts3_tokenizer", "matchinfo", "offsets", "optimize", "rtreecheck", "rtreedepth", "rtreenode",
	"unistr", "unistr_quote", "if", "json_array_insert", "jsonb_array_insert", "fts5_insttoken",
	"auth_enabled", "auth_user_add", "auth_user_change", "auth_user_delete", "authenticate", NULL
};

static int in_list(const char **list, const char *name) {
	if (!name) return 0;
	for (int i = 0; list[i]; i++) {
		if (strcasecmp(name, list[i]) == 0) return 1;
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
		// D1 offers one virtual-table module, FTS5 (rtree, fts3/4 are refused).
		if (code == A_CREATE_VTABLE && !(a2 && strcasecmp(a2, "fts5") == 0)) return deny(c, "virtual table module not allowed:", a2);
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
		if (in_list(absent_functions, a2)) {
			snprintf(c->absent_fn, sizeof c->absent_fn, "%s", a2);
			return deny(c, "function not allowed:", a2);
		}
		if (in_list(denied_functions, a2)) return deny(c, "function not allowed:", a2);
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

int shoal_setup(sqlite3 *db, shoal_ctx *c, int writer, int d1counts) {
	int rc;
	// Per-instruction execution counts (shoal_d1_counts, scan statistics).
	rc = sqlite3_db_config(db, 1018, 1, (int*)0); if (rc) return rc; // SQLITE_DBCONFIG_STMT_SCANSTATUS
	// Defensive mode: no writable_schema, no writes to shadow tables of
	// virtual tables (FTS5 _data/_idx…), no sqlite_dbpage writes.
	rc = sqlite3_db_config(db, 1010, 1, (int*)0); if (rc) return rc;
	// Untrusted schema: functions with side effects may not run from
	// triggers, views or generated columns.
	rc = sqlite3_db_config(db, 1017, 0, (int*)0); if (rc) return rc;
	rc = sqlite3_db_config(db, 1005, 0, (int*)0); if (rc) return rc;
	sqlite3_progress_handler(db, 1000, shoal_progress, c);
	rc = sqlite3_set_authorizer(db, shoal_auth, c); if (rc) return rc;
	// The preupdate hook is only the fallback source of rows_written: while
	// one is registered SQLite never takes its truncate shortcut for DELETE
	// without WHERE, which D1 does (and counts as reading no rows).
	if (writer && !d1counts) sqlite3_preupdate_hook(db, shoal_preupdate, c);
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
//
// It goes through "shoal-excl" (vfs.c), which is unix-excl with temporary
// files counted and capped.
int shoal_open(const char *path, int flags, sqlite3 **db) {
	return sqlite3_open_v2(path, db, flags, "shoal-excl");
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

void shoal_stmt_done(sqlite3 *db, sqlite3_stmt *s, int d1counts, long long total_before, shoal_stats *out) {
	out->total_changes = sqlite3_total_changes64(db);
	out->changes = sqlite3_changes64(db);
	out->last_rowid = sqlite3_last_insert_rowid(db);
	if (d1counts) {
		shoal_d1_counts(s, out->total_changes - total_before, &out->rows_read, &out->rows_written);
	} else {
		out->rows_read = shoal_rows_read(s);
		out->rows_written = -1;
	}
}

// shoal_counts_check_mem runs shoal_counts_check on a connection of its own.
int shoal_counts_check_mem(void) {
	sqlite3 *db = 0;
	if (sqlite3_open_v2(":memory:", &db, 0x02 | 0x04, 0) != 0) { sqlite3_close_v2(db); return 0; }
	int ok = shoal_counts_check(db);
	sqlite3_close_v2(db);
	return ok;
}

// shoal_deferred_fks returns the number of unresolved (deferred) foreign key
// violations of the open transaction.
int shoal_deferred_fks(sqlite3 *db) {
	int cur = 0, hi = 0;
	sqlite3_db_status(db, 10, &cur, &hi, 0);
	return cur;
}

// ---- D1's rows_read / rows_written ----------------------------------------
//
// D1 counts rows with libSQL's statement counters, a patch to SQLite's
// bytecode engine (workerd's patches/sqlite/0001-row-counts): a row is read
// each time a cursor is positioned (Rewind, Last, Sort, SorterSort,
// SeekGE/GT/LE/LT, SeekRowid, NotExists), each time Next/Prev/SorterNext
// moves to a row, each VNext, and a Count adds the rows it counted; a row
// is written by each Insert and IdxInsert on a non-ephemeral cursor, each
// Delete that counts as a change, each VUpdate, and a Clear that counts
// its rows (DELETE without WHERE). Stock SQLite built with
// SQLITE_ENABLE_STMT_SCANSTATUS counts how often every instruction ran
// (VdbeOp.nExec), and sqlite3_stmt_status's counters 0, FULLSCAN_STEP and
// AUTOINDEX together count every Next/Prev/SorterNext that moved to a row,
// so the same numbers follow from the program and its execution counts.
// SQLite keeps both the program and nExec private: the mirrors below are
// the layout of SQLite 3.54.1's VdbeOp, Vdbe (up to nOp) and SubProgram,
// checked at startup against EXPLAIN (shoal_counts_check); where the check
// fails the counts fall back to scan statistics and the preupdate hook.

typedef struct {
	unsigned char opcode;
	signed char p4type;
	unsigned short p5;
	int p1, p2, p3;
	union { int i; void *p; } p4;
	unsigned long long nExec;
	unsigned long long nCycle;
} shoal_vop;

typedef struct {
	shoal_vop *aOp;
	int nOp;
} shoal_vsubprog;

typedef struct {
	void *db;
	void *ppVPrev, *pVNext;
	void *pParse;
	short nVar;
	int nMem;
	int nCursor;
	unsigned int cacheCtr;
	int pc;
	int rc;
	long long nChange;
	int iStatement;
	long long iCurrentTime;
	long long nFkConstraint;
	long long nStmtDefCons;
	long long nStmtDefImmCons;
	void *aMem, *apArg, *apCsr, *aVar;
	shoal_vop *aOp;
	int nOp;
} shoal_vdbe;

// Opcode numbers of SQLite 3.54.1 (its opcodes.h); shoal_counts_check
// verifies each against EXPLAIN's names.
enum {
	V_Init = 8, V_VUpdate = 7, V_SeekLT = 21, V_SeekLE = 22, V_SeekGE = 23, V_SeekGT = 24,
	V_SeekRowid = 29, V_NotExists = 30, V_Last = 31, V_SorterSort = 33, V_Sort = 34, V_Rewind = 35,
	V_VNext = 64, V_OpenDup = 116, V_OpenAutoindex = 117, V_OpenEphemeral = 119, V_SorterOpen = 120,
	V_OpenPseudo = 122, V_Insert = 129, V_Delete = 131, V_IdxInsert = 139, V_Clear = 146, V_Program = 49,
	V_SeekEnd = 138,
};
#define V_P4_SUBPROGRAM (-4)
#define V_OPFLAG_NCHANGE 0x01
#define V_OPFLAG_ISNOOP 0x40

static const struct { int op; const char *name; } shoal_known_ops[] = {
	{V_Init, "Init"}, {V_VUpdate, "VUpdate"}, {V_SeekLT, "SeekLT"}, {V_SeekLE, "SeekLE"}, {V_SeekGE, "SeekGE"},
	{V_SeekGT, "SeekGT"}, {V_SeekRowid, "SeekRowid"}, {V_NotExists, "NotExists"}, {V_Last, "Last"},
	{V_SorterSort, "SorterSort"}, {V_Sort, "Sort"}, {V_Rewind, "Rewind"}, {V_VNext, "VNext"},
	{V_OpenDup, "OpenDup"}, {V_OpenAutoindex, "OpenAutoindex"}, {V_OpenEphemeral, "OpenEphemeral"},
	{V_SorterOpen, "SorterOpen"}, {V_OpenPseudo, "OpenPseudo"}, {V_Insert, "Insert"}, {V_Delete, "Delete"},
	{V_IdxInsert, "IdxInsert"}, {V_Clear, "Clear"}, {V_Program, "Program"}, {V_SeekEnd, "SeekEnd"}, {0, NULL}
};

extern int sqlite3_libversion_number(void);
extern int sqlite3_stmt_status(sqlite3_stmt*, int, int);

#define SHOAL_MAX_SUBPROGS 32

void shoal_counts_zero(sqlite3_stmt *s);

typedef struct {
	long long read, written;
	long long limit;       // instructions the run executed: no count can be larger
	int readonly;          // the statement writes nothing: skip the write analysis
	int clears;            // Clear instructions that counted their rows
	void *seen[SHOAL_MAX_SUBPROGS];
	int nseen;
} shoal_count_acc;

static int is_write_op(int op) {
	return op == V_Insert || op == V_IdxInsert || op == V_VUpdate || op == V_Delete || op == V_Clear;
}

static void count_ops(shoal_vop *ops, int n, shoal_count_acc *acc, int reset) {
	// SQLite leaves nExec uninitialised in instructions added by
	// sqlite3VdbeAddOpList (AUTOINCREMENT's, ALTER's and others' code): they
	// are zeroed when a statement is prepared (shoal_counts_zero), and a
	// count larger than the run's executed instructions can only be such
	// garbage (a statement SQLite re-prepared inside sqlite3_step after a
	// schema change) and is ignored.
	// Ephemeral cursors (temporary b-trees, sorters, pseudo tables) are not
	// counted when written, as in libSQL. Cursor numbers are small.
	unsigned char eph[256 / 8]; // read by the write cases only
	if (!acc->readonly) memset(eph, 0, sizeof eph);
	for (int i = 0; !acc->readonly && i < n; i++) {
		int op = ops[i].opcode, p1 = ops[i].p1;
		if ((op == V_OpenEphemeral || op == V_OpenAutoindex || op == V_SorterOpen || op == V_OpenPseudo || op == V_OpenDup) && p1 >= 0 && p1 < 256)
			eph[p1 / 8] |= 1 << (p1 % 8);
	}
	for (int i = 0; i < n; i++) {
		shoal_vop *o = &ops[i];
		long long x = (long long)o->nExec;
		if (x == 0) continue; // not run (a trigger program not run has no counts either)
		if (o->opcode == V_Program && o->p4type == V_P4_SUBPROGRAM && o->p4.p) {
			shoal_vsubprog *sp = (shoal_vsubprog*)o->p4.p;
			int seen = 0;
			for (int k = 0; k < acc->nseen; k++) if (acc->seen[k] == sp) seen = 1;
			if (!seen && acc->nseen < SHOAL_MAX_SUBPROGS) {
				acc->seen[acc->nseen++] = sp;
				count_ops(sp->aOp, sp->nOp, acc, reset);
			}
		}
		if (x > acc->limit) x = 0;
		if (acc->readonly && is_write_op(o->opcode)) {
			// A read-only statement writes only temporary b-trees, which are
			// not counted; its write instructions are not analysed.
			if (reset) { o->nExec = 0; o->nCycle = 0; }
			continue;
		}
		int p1 = o->p1;
		int ephemeral = p1 >= 0 && p1 < 256 && (eph[p1 / 8] & (1 << (p1 % 8)));
		switch (o->opcode) {
		case V_Rewind: case V_Last: case V_Sort: case V_SorterSort:
		case V_SeekLT: case V_SeekLE: case V_SeekGE: case V_SeekGT:
		case V_SeekRowid: case V_NotExists: case V_VNext:
			acc->read += x;
			break;
		case V_SeekEnd:
			// Index builds append with SeekEnd, which shares Last's code and
			// counts only when it has to move the cursor: its first two runs
			// (an empty index, then the first entry), and again after each
			// page split, which execution counts do not show: a large
			// CREATE INDEX reads a few rows fewer here than on D1.
			acc->read += x < 2 ? x : 2;
			break;
		case V_Insert:
			if (!ephemeral && !(o->p5 & V_OPFLAG_ISNOOP)) acc->written += x;
			break;
		case V_IdxInsert: case V_VUpdate:
			if (!ephemeral) acc->written += x;
			break;
		case V_Delete:
			if (!ephemeral && (o->p2 & V_OPFLAG_NCHANGE)) acc->written += x; // Delete's flags are its P2
			break;
		case V_Clear:
			if (o->p3) acc->clears += (int)x;
			break;
		}
		if (reset) { o->nExec = 0; o->nCycle = 0; }
	}
}

// shoal_d1_counts reads (and resets) one statement's D1 counters after it
// ran. changes is the rows it changed (total_changes around it): what a
// Clear (DELETE without WHERE) counted.
void shoal_d1_counts(sqlite3_stmt *s, long long changes, long long *read, long long *written) {
	shoal_vdbe *v = (shoal_vdbe*)s;
	shoal_count_acc acc;
	acc.read = acc.written = 0;
	acc.clears = acc.nseen = 0;
	acc.readonly = sqlite3_stmt_readonly(s);
	acc.limit = sqlite3_stmt_status(s, 4, 1); // SQLITE_STMTSTATUS_VM_STEP of this run
	count_ops(v->aOp, v->nOp, &acc, 1);
	// Next, Prev and SorterNext that moved to a row: stmt_status counters
	// 0 (p5 = 0), 1 (SQLITE_STMTSTATUS_FULLSCAN_STEP) and 3 (AUTOINDEX).
	acc.read += sqlite3_stmt_status(s, 0, 1) + sqlite3_stmt_status(s, 1, 1) + sqlite3_stmt_status(s, 3, 1);
	if (acc.clears > 0) acc.written += changes;
	if (sqlite3_stmt_status(s, 5, 1) > 0) {
		// SQLite re-prepared the statement inside sqlite3_step (Go
		// prepares it again itself when it knows the schema changed, so
		// this is rare): counts of this run may include uninitialised
		// instructions (bounded above); the next run starts clean.
		shoal_counts_zero(s);
	}
	*read = acc.read;
	*written = acc.written;
}

static void zero_ops(shoal_vop *ops, int n, void **seen, int *nseen) {
	for (int i = 0; i < n; i++) {
		ops[i].nExec = 0;
		ops[i].nCycle = 0;
		if (ops[i].opcode == V_Program && ops[i].p4type == V_P4_SUBPROGRAM && ops[i].p4.p) {
			shoal_vsubprog *sp = (shoal_vsubprog*)ops[i].p4.p;
			int dup = 0;
			for (int k = 0; k < *nseen; k++) if (seen[k] == sp) dup = 1;
			if (!dup && *nseen < SHOAL_MAX_SUBPROGS) {
				seen[(*nseen)++] = sp;
				zero_ops(sp->aOp, sp->nOp, seen, nseen);
			}
		}
	}
}

// shoal_counts_zero zeroes a freshly prepared statement's execution
// counts (see count_ops) and counters.
void shoal_counts_zero(sqlite3_stmt *s) {
	shoal_vdbe *v = (shoal_vdbe*)s;
	void *seen[SHOAL_MAX_SUBPROGS];
	int nseen = 0;
	zero_ops(v->aOp, v->nOp, seen, &nseen);
	for (int op = 0; op < 9; op++) sqlite3_stmt_status(s, op, 1);
}

// shoal_counts_check reports whether the private layout above matches the
// linked SQLite: the version, and for a few programs the opcode of every
// instruction against EXPLAIN's name for it. 1 = usable. It creates a
// table: db is a scratch connection (shoal_counts_check_mem).
int shoal_counts_check(sqlite3 *db) {
	if (sqlite3_libversion_number() != 3054001) return 0;
	static const char *progs[] = {
		"SELECT name FROM sqlite_schema WHERE rowid > 0 ORDER BY name",
		"SELECT * FROM sqlite_schema WHERE rowid = 1",
		"SELECT DISTINCT type FROM sqlite_schema",
		"CREATE INDEX shoal_check_i ON shoal_check(a)",
		"INSERT INTO shoal_check VALUES (1, 2)",
		"DELETE FROM shoal_check WHERE a = 1",
		"DELETE FROM shoal_check",
		NULL
	};
	if (sqlite3_exec(db, "CREATE TABLE shoal_check(a, b)", 0, 0, 0) != 0) return 0;
	for (int p = 0; progs[p]; p++) {
		sqlite3_stmt *s = 0, *e = 0;
		if (sqlite3_prepare_v3(db, progs[p], -1, 0, &s, 0) != 0 || !s) return 0;
		char *q = sqlite3_mprintf("EXPLAIN %s", progs[p]);
		int rc = sqlite3_prepare_v3(db, q, -1, 0, &e, 0);
		sqlite3_free(q);
		if (rc != 0 || !e) { sqlite3_finalize(s); return 0; }
		shoal_vdbe *v = (shoal_vdbe*)s;
		int ok = v->aOp != 0 && v->nOp > 1 && v->aOp[0].opcode == V_Init, i = 0;
		while (ok && sqlite3_step(e) == SHOAL_ROW) {
			const char *name = (const char*)sqlite3_column_text(e, 1);
			if (i >= v->nOp || !name) { ok = 0; break; }
			for (int k = 0; shoal_known_ops[k].name; k++) {
				int byNum = v->aOp[i].opcode == shoal_known_ops[k].op;
				int byName = strcmp(name, shoal_known_ops[k].name) == 0;
				if (byNum != byName) ok = 0;
			}
			i++;
		}
		if (i != v->nOp) ok = 0;
		sqlite3_finalize(e);
		sqlite3_finalize(s);
		if (!ok) return 0;
	}
	return 1;
}

// shoal_used_pages steps two cached one-row statements (PRAGMA page_count,
// PRAGMA freelist_count) in one cgo call and returns their difference, the
// pages in use; -1 (and *rc) on an error.
long long shoal_used_pages(sqlite3_stmt *pages, sqlite3_stmt *free, int *rc) {
	long long v[2] = {0, 0};
	sqlite3_stmt *s[2] = {pages, free};
	*rc = 0;
	for (int i = 0; i < 2; i++) {
		int r = sqlite3_step(s[i]);
		if (r == SHOAL_ROW) {
			v[i] = sqlite3_column_int64(s[i], 0);
			r = sqlite3_step(s[i]);
		}
		sqlite3_reset(s[i]);
		if (r != SHOAL_DONE) { *rc = r; return -1; }
	}
	return v[0] - v[1];
}
