// Declarations shared by the cgo files of package sqlexec and shim.c.
#ifndef SHOAL_SHIM_H
#define SHOAL_SHIM_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <stdint.h>

typedef struct sqlite3 sqlite3;
typedef struct sqlite3_stmt sqlite3_stmt;
typedef struct sqlite3_value sqlite3_value;
typedef long long sqlite3_int64;
typedef void (*sqlite3_destructor_type)(void*);

extern int sqlite3_open_v2(const char*, sqlite3**, int, const char*);
extern sqlite3_int64 sqlite3_memory_used(void);
int shoal_global_config_rc(void);
extern int sqlite3_close_v2(sqlite3*);
extern int sqlite3_prepare_v3(sqlite3*, const char*, int, unsigned int, sqlite3_stmt**, const char**);
extern int sqlite3_step(sqlite3_stmt*);
extern int sqlite3_reset(sqlite3_stmt*);
extern int sqlite3_finalize(sqlite3_stmt*);
extern int sqlite3_clear_bindings(sqlite3_stmt*);
extern int sqlite3_bind_parameter_count(sqlite3_stmt*);
extern int sqlite3_bind_null(sqlite3_stmt*, int);
extern int sqlite3_bind_int64(sqlite3_stmt*, int, sqlite3_int64);
extern int sqlite3_bind_double(sqlite3_stmt*, int, double);
extern int sqlite3_bind_text(sqlite3_stmt*, int, const char*, int, sqlite3_destructor_type);
extern int sqlite3_bind_blob(sqlite3_stmt*, int, const void*, int, sqlite3_destructor_type);
extern int sqlite3_column_count(sqlite3_stmt*);
extern const char *sqlite3_column_name(sqlite3_stmt*, int);
extern int sqlite3_column_type(sqlite3_stmt*, int);
extern sqlite3_int64 sqlite3_column_int64(sqlite3_stmt*, int);
extern double sqlite3_column_double(sqlite3_stmt*, int);
extern const unsigned char *sqlite3_column_text(sqlite3_stmt*, int);
extern const void *sqlite3_column_blob(sqlite3_stmt*, int);
extern int sqlite3_column_bytes(sqlite3_stmt*, int);
extern int sqlite3_stmt_readonly(sqlite3_stmt*);
extern int sqlite3_stmt_isexplain(sqlite3_stmt*);
extern int sqlite3_stmt_scanstatus_v2(sqlite3_stmt*, int, int, int, void*);
extern void sqlite3_stmt_scanstatus_reset(sqlite3_stmt*);
extern int sqlite3_errcode(sqlite3*);
extern int sqlite3_error_offset(sqlite3*);
extern int sqlite3_extended_errcode(sqlite3*);
extern const char *sqlite3_errmsg(sqlite3*);
extern char *sqlite3_mprintf(const char*, ...);
extern void sqlite3_free(void*);
extern int sqlite3_limit(sqlite3*, int, int);
extern void sqlite3_interrupt(sqlite3*);
extern void sqlite3_progress_handler(sqlite3*, int, int(*)(void*), void*);
extern int sqlite3_busy_timeout(sqlite3*, int);
extern int sqlite3_db_config(sqlite3*, int, ...);
extern int sqlite3_db_status(sqlite3*, int, int*, int*, int);
extern int sqlite3_file_control(sqlite3*, const char*, int, void*);
extern int sqlite3_exec(sqlite3*, const char*, int(*)(void*,int,char**,char**), void*, char**);
extern sqlite3_int64 sqlite3_changes64(sqlite3*);
extern sqlite3_int64 sqlite3_total_changes64(sqlite3*);
extern sqlite3_int64 sqlite3_last_insert_rowid(sqlite3*);
extern int sqlite3_get_autocommit(sqlite3*);
extern int sqlite3_set_authorizer(sqlite3*, int(*)(void*,int,const char*,const char*,const char*,const char*), void*);
extern void *sqlite3_preupdate_hook(sqlite3*, void(*)(void*,sqlite3*,int,const char*,const char*,sqlite3_int64,sqlite3_int64), void*);
extern int sqlite3_preupdate_old(sqlite3*, int, sqlite3_value**);
extern int sqlite3_preupdate_new(sqlite3*, int, sqlite3_value**);
extern int sqlite3_preupdate_count(sqlite3*);
extern int sqlite3_value_type(sqlite3_value*);
extern sqlite3_int64 sqlite3_value_int64(sqlite3_value*);
extern double sqlite3_value_double(sqlite3_value*);
extern const void *sqlite3_value_blob(sqlite3_value*);
extern int sqlite3_value_bytes(sqlite3_value*);

#define SHOAL_OK 0
#define SHOAL_DENY 1
#define SHOAL_ROW 100
#define SHOAL_DONE 101
#define SHOAL_TRANSIENT ((sqlite3_destructor_type)-1)

// Authorizer action codes (sqlite3.h).
#define A_CREATE_INDEX 1
#define A_CREATE_TABLE 2
#define A_CREATE_TEMP_INDEX 3
#define A_CREATE_TEMP_TABLE 4
#define A_CREATE_TEMP_TRIGGER 5
#define A_CREATE_TEMP_VIEW 6
#define A_CREATE_TRIGGER 7
#define A_CREATE_VIEW 8
#define A_DELETE 9
#define A_DROP_INDEX 10
#define A_DROP_TABLE 11
#define A_DROP_TEMP_INDEX 12
#define A_DROP_TEMP_TABLE 13
#define A_DROP_TEMP_TRIGGER 14
#define A_DROP_TEMP_VIEW 15
#define A_DROP_TRIGGER 16
#define A_DROP_VIEW 17
#define A_INSERT 18
#define A_PRAGMA 19
#define A_READ 20
#define A_SELECT 21
#define A_TRANSACTION 22
#define A_UPDATE 23
#define A_ATTACH 24
#define A_DETACH 25
#define A_ALTER_TABLE 26
#define A_REINDEX 27
#define A_ANALYZE 28
#define A_CREATE_VTABLE 29
#define A_DROP_VTABLE 30
#define A_FUNCTION 31
#define A_SAVEPOINT 32
#define A_RECURSIVE 33

// One run of row changes to one table with one change shape, coalesced.
typedef struct {
	char *tab;
	int op;
	int allcols;           // rowid changed or more columns than the mask holds
	uint64_t m[2];         // changed columns of an UPDATE
	long long n;
} shoal_wrec;

// Per-connection state shared with the C callbacks. Go owns it (C.malloc)
// and frees it after sqlite3_close_v2.
typedef struct {
	volatile int cancel;   // set by Go when the request's context is done
	int user;              // 1 while user SQL is prepared or runs: authorizer enforces
	int txn_denied;        // the authorizer refused BEGIN/COMMIT/SAVEPOINT…
	int ddl;               // the authorizer saw schema-changing DDL
	int grows;             // the authorizer saw an INSERT or a CREATE/ALTER (refused while the account's storage is full)
	int defer_fk;          // the authorizer saw PRAGMA defer_foreign_keys
	int allow_seq;         // a script restoring AUTOINCREMENT counters: DML on sqlite_sequence allowed
	char reason[160];      // why the authorizer denied (kept for logs and tests; D1's message has no detail)
	char absent_fn[64];    // a function D1 does not have: its error is "no such function"
	shoal_wrec *recs;
	int nrec, cap;
	int oom;
	// Temporary files (vfs.c): bytes of this connection's open temporary
	// files, its cap (0: none), and why a write was refused (1: this cap,
	// 2: the process's); Go clears temp_full per request.
	long long temp_used;
	long long temp_limit;
	int temp_full;
} shoal_ctx;

// One result cell, filled by shoal_step for all columns in one cgo call.
typedef struct {
	int type;
	int n;
	sqlite3_int64 i;
	double f;
	const void *p;
} shoal_cell;

// Counters read after each statement, in one cgo call.
typedef struct {
	long long rows_read;
	long long rows_written; // -1: not counted here (the preupdate hook's records are)
	long long total_changes;
	long long changes;
	long long last_rowid;
} shoal_stats;

// Implemented in shim.c.
void shoal_stmt_done(sqlite3 *db, sqlite3_stmt *s, int d1counts, long long total_before, shoal_stats *out);
int shoal_counts_check_mem(void);
long long shoal_used_pages(sqlite3_stmt *pages, sqlite3_stmt *free, int *rc);
int shoal_deferred_fks(sqlite3 *db);
int shoal_setup(sqlite3 *db, shoal_ctx *c, int writer, int d1counts);
void shoal_d1_counts(sqlite3_stmt *s, long long changes, long long *read, long long *written);
int shoal_counts_check(sqlite3 *db);
void shoal_counts_zero(sqlite3_stmt *s);
int shoal_open(const char *path, int flags, sqlite3 **db);
int shoal_configure(sqlite3 *db, int writer, long long max_bytes, long long *page_size);
long long shoal_query_int(sqlite3 *db, const char *sql, int *rc);
int shoal_simple_count(sqlite3 *db, const char *sql, int n);
int shoal_prepare(sqlite3 *db, const char *z, int n, sqlite3_stmt **out, int *consumed, int persistent);
long long shoal_rows_read(sqlite3_stmt *s);
void shoal_fill(sqlite3_stmt *s, int ncol, shoal_cell *cells);
int shoal_bind_text(sqlite3_stmt *s, int i, const char *p, int n);
int shoal_bind_blob(sqlite3_stmt *s, int i, const void *p, int n);
void shoal_clear_recs(shoal_ctx *c);
void shoal_free_ctx(shoal_ctx *c);
shoal_ctx *shoal_new_ctx(void);

// Implemented in vfs.c.
int shoal_vfs_register(void);
void shoal_set_temp_max(long long max);
long long shoal_temp_bytes(void);
int shoal_step(shoal_ctx *c, sqlite3_stmt *s, int ncol, shoal_cell *cells);

#endif
