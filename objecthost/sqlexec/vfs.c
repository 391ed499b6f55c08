// The "shoal-excl" VFS: SQLite's own "unix-excl" VFS (see shoal_open) with
// a cap on temporary files.
//
// User SQL can make SQLite write temporary files: the sorter spills ORDER
// BY / GROUP BY / CREATE INDEX runs, and UNION, DISTINCT, IN (SELECT …),
// materialized CTEs and recursive CTE queues are temporary b-trees that
// spill once their page cache is full, plus statement journals and
// savepoint subjournals. SQLite has no limit of its own on them (its heap
// limits are process-wide and count memory, not disk), so one legal query
// could fill the temporary directory. This VFS counts the bytes of every
// temporary file while it is open:
//
//   - per connection (shoal_ctx.temp_used against temp_limit): a connection
//     runs one request at a time, so this is the cap of one query;
//   - per process (shoal_temp_total against shoal_temp_max): the cap of the
//     host, whatever the number of queries.
//
// A write that would go over either fails with SQLITE_FULL (the statement
// fails, the request rolls back) and sets temp_full so the error names the
// limit. The owner of a temporary file is the connection whose statement
// was stepping on this thread when the file was opened (shoal_cur, set by
// shoal_step); files opened outside a user statement (COMMIT, internal
// statements) have no owner and count only against the process cap.
// Main database and WAL files pass straight through to unix-excl (the base
// file lives at the start of ours, with its own methods).
#include "shim.h"

typedef struct sqlite3_file sqlite3_file;
typedef struct sqlite3_io_methods sqlite3_io_methods;
typedef struct sqlite3_vfs sqlite3_vfs;

// SQLite's stable VFS ABI (sqlite3.h); shim.h declares no SQLite header.
struct sqlite3_file {
	const sqlite3_io_methods *pMethods;
};

struct sqlite3_io_methods {
	int iVersion;
	int (*xClose)(sqlite3_file*);
	int (*xRead)(sqlite3_file*, void*, int, sqlite3_int64);
	int (*xWrite)(sqlite3_file*, const void*, int, sqlite3_int64);
	int (*xTruncate)(sqlite3_file*, sqlite3_int64);
	int (*xSync)(sqlite3_file*, int);
	int (*xFileSize)(sqlite3_file*, sqlite3_int64*);
	int (*xLock)(sqlite3_file*, int);
	int (*xUnlock)(sqlite3_file*, int);
	int (*xCheckReservedLock)(sqlite3_file*, int*);
	int (*xFileControl)(sqlite3_file*, int, void*);
	int (*xSectorSize)(sqlite3_file*);
	int (*xDeviceCharacteristics)(sqlite3_file*);
	int (*xShmMap)(sqlite3_file*, int, int, int, void volatile**);
	int (*xShmLock)(sqlite3_file*, int, int, int);
	void (*xShmBarrier)(sqlite3_file*);
	int (*xShmUnmap)(sqlite3_file*, int);
	int (*xFetch)(sqlite3_file*, sqlite3_int64, int, void**);
	int (*xUnfetch)(sqlite3_file*, sqlite3_int64, void*);
};

struct sqlite3_vfs {
	int iVersion;
	int szOsFile;
	int mxPathname;
	sqlite3_vfs *pNext;
	const char *zName;
	void *pAppData;
	int (*xOpen)(sqlite3_vfs*, const char*, sqlite3_file*, int, int*);
	int (*xDelete)(sqlite3_vfs*, const char*, int);
	int (*xAccess)(sqlite3_vfs*, const char*, int, int*);
	int (*xFullPathname)(sqlite3_vfs*, const char*, int, char*);
	void *(*xDlOpen)(sqlite3_vfs*, const char*);
	void (*xDlError)(sqlite3_vfs*, int, char*);
	void (*(*xDlSym)(sqlite3_vfs*, void*, const char*))(void);
	void (*xDlClose)(sqlite3_vfs*, void*);
	int (*xRandomness)(sqlite3_vfs*, int, char*);
	int (*xSleep)(sqlite3_vfs*, int);
	int (*xCurrentTime)(sqlite3_vfs*, double*);
	int (*xGetLastError)(sqlite3_vfs*, int, char*);
	int (*xCurrentTimeInt64)(sqlite3_vfs*, sqlite3_int64*);
	void *xSetSystemCall;
	void *xGetSystemCall;
	void *xNextSystemCall;
};

extern sqlite3_vfs *sqlite3_vfs_find(const char*);
extern int sqlite3_vfs_register(sqlite3_vfs*, int);
extern int sqlite3_config(int, ...);

#define CONFIG_PAGECACHE 7
#define CONFIG_MEMSTATUS 9

#define OPEN_TEMP_DB 0x00000200
#define OPEN_TRANSIENT_DB 0x00000400
#define OPEN_TEMP_JOURNAL 0x00001000
#define OPEN_SUBJOURNAL 0x00002000
#define OPEN_TEMP (OPEN_TEMP_DB | OPEN_TRANSIENT_DB | OPEN_TEMP_JOURNAL | OPEN_SUBJOURNAL)
#define FCNTL_SIZE_HINT 5
#define FCNTL_CHUNK_SIZE 6
#define RC_FULL 13

static __thread shoal_ctx *shoal_cur;       // the connection stepping on this thread
static sqlite3_vfs *shoal_base;             // unix-excl
static sqlite3_vfs shoal_vfs;               // ours
static long long shoal_temp_total;          // bytes of all open temporary files (atomic)
static long long shoal_temp_max;            // process cap (atomic; 0: none)

typedef struct {
	sqlite3_file hdr;      // pMethods = &shoal_temp_io
	shoal_ctx *owner;      // NULL: counted against the process cap only
	long long size;        // bytes counted for this file (its high-water end)
	sqlite3_file *real;    // the unix-excl file, right after this struct
} shoal_tfile;

static sqlite3_file *real_of(sqlite3_file *f) { return ((shoal_tfile*)f)->real; }

// charge counts grow more bytes for t, or refuses them (SQLITE_FULL).
static int charge(shoal_tfile *t, long long grow) {
	shoal_ctx *c = t->owner;
	if (c && c->temp_limit > 0 && c->temp_used + grow > c->temp_limit) {
		c->temp_full = 1;
		return RC_FULL;
	}
	long long max = __atomic_load_n(&shoal_temp_max, __ATOMIC_RELAXED);
	long long total = __atomic_add_fetch(&shoal_temp_total, grow, __ATOMIC_RELAXED);
	if (max > 0 && total > max) {
		__atomic_sub_fetch(&shoal_temp_total, grow, __ATOMIC_RELAXED);
		if (c) c->temp_full = 2;
		return RC_FULL;
	}
	if (c) c->temp_used += grow;
	t->size += grow;
	return SHOAL_OK;
}

static void uncharge(shoal_tfile *t, long long n) {
	if (n <= 0) return;
	if (t->owner) t->owner->temp_used -= n;
	__atomic_sub_fetch(&shoal_temp_total, n, __ATOMIC_RELAXED);
	t->size -= n;
}

static int t_close(sqlite3_file *f) {
	shoal_tfile *t = (shoal_tfile*)f;
	uncharge(t, t->size);
	int rc = t->real->pMethods ? t->real->pMethods->xClose(t->real) : SHOAL_OK;
	f->pMethods = 0;
	return rc;
}
static int t_read(sqlite3_file *f, void *p, int n, sqlite3_int64 off) {
	return real_of(f)->pMethods->xRead(real_of(f), p, n, off);
}
static int t_write(sqlite3_file *f, const void *p, int n, sqlite3_int64 off) {
	shoal_tfile *t = (shoal_tfile*)f;
	long long end = off + n;
	if (end > t->size) {
		int rc = charge(t, end - t->size);
		if (rc != SHOAL_OK) return rc;
	}
	return t->real->pMethods->xWrite(t->real, p, n, off);
}
static int t_truncate(sqlite3_file *f, sqlite3_int64 size) {
	shoal_tfile *t = (shoal_tfile*)f;
	int rc = t->real->pMethods->xTruncate(t->real, size);
	if (rc == SHOAL_OK && size < t->size) uncharge(t, t->size - size);
	return rc;
}
static int t_sync(sqlite3_file *f, int flags) { return real_of(f)->pMethods->xSync(real_of(f), flags); }
static int t_size(sqlite3_file *f, sqlite3_int64 *out) { return real_of(f)->pMethods->xFileSize(real_of(f), out); }
static int t_lock(sqlite3_file *f, int l) { return real_of(f)->pMethods->xLock(real_of(f), l); }
static int t_unlock(sqlite3_file *f, int l) { return real_of(f)->pMethods->xUnlock(real_of(f), l); }
static int t_reserved(sqlite3_file *f, int *out) { return real_of(f)->pMethods->xCheckReservedLock(real_of(f), out); }
static int t_fcntl(sqlite3_file *f, int op, void *arg) {
	// Size hints and chunk sizes would let the file grow on disk without
	// a write we count: they are only hints, so they are dropped.
	if (op == FCNTL_SIZE_HINT || op == FCNTL_CHUNK_SIZE) return SHOAL_OK;
	return real_of(f)->pMethods->xFileControl(real_of(f), op, arg);
}
static int t_sector(sqlite3_file *f) { return real_of(f)->pMethods->xSectorSize(real_of(f)); }
static int t_devchar(sqlite3_file *f) { return real_of(f)->pMethods->xDeviceCharacteristics(real_of(f)); }
// Version 1 methods only: no shared memory and no memory-mapped I/O on
// temporary files (the sorter then writes through xWrite, where it is
// counted).
static const sqlite3_io_methods shoal_temp_io = {
	1, t_close, t_read, t_write, t_truncate, t_sync, t_size, t_lock, t_unlock,
	t_reserved, t_fcntl, t_sector, t_devchar, 0, 0, 0, 0, 0, 0,
};

static int shoal_xopen(sqlite3_vfs *v, const char *name, sqlite3_file *f, int flags, int *out) {
	(void)v;
	if (!(flags & OPEN_TEMP)) return shoal_base->xOpen(shoal_base, name, f, flags, out);
	shoal_tfile *t = (shoal_tfile*)f;
	memset(t, 0, sizeof *t);
	t->real = (sqlite3_file*)(t + 1);
	t->owner = shoal_cur;
	int rc = shoal_base->xOpen(shoal_base, name, t->real, flags, out);
	// Whatever the outcome, SQLite calls xClose if pMethods is set: ours
	// closes the real file if it has methods.
	f->pMethods = (rc == SHOAL_OK || t->real->pMethods) ? &shoal_temp_io : 0;
	return rc;
}

// clean_absolute reports whether path is absolute with no empty, "." or
// ".." component and no trailing slash: a name SQLite's own
// xFullPathname would only copy, after an lstat(2) of every prefix.
static int clean_absolute(const char *p) {
	if (p[0] != '/') return 0;
	for (const char *s = p; *s; s++) {
		if (s[0] != '/') continue;
		if (s[1] == '/' || s[1] == 0) return 0;
		if (s[1] == '.' && (s[2] == '/' || s[2] == 0 || (s[2] == '.' && (s[3] == '/' || s[3] == 0)))) return 0;
	}
	return 1;
}

// shoal_xfullpathname: a clean absolute name is its own full name. Unix's
// xFullPathname resolves symbolic links by lstat(2)-ing every prefix of
// the path (8–10 system calls per open for dbs/ab/cd/<id>.db under a data
// directory), on every cold open of a database. The object host builds
// its paths with filepath.Join under its own data directory; the
// database file and its -wal are still opened with O_NOFOLLOW
// (SQLITE_OPEN_NOFOLLOW), so a symbolic link planted as either is still
// refused. What changes: a symbolic link among the directories above the
// file (a data directory on another disk, say) is followed instead of
// failing the open with SQLITE_CANTOPEN_SYMLINK. Anything else (relative,
// "..", "//") goes to unix's own.
static int shoal_xfullpathname(sqlite3_vfs *v, const char *name, int n, char *out) {
	(void)v;
	if (clean_absolute(name)) {
		size_t len = strlen(name);
		if ((long long)len + 1 > (long long)n) return 1; // SQLITE_ERROR, as unix's own
		memcpy(out, name, len + 1);
		return SHOAL_OK;
	}
	return shoal_base->xFullPathname(shoal_base, name, n, out);
}

static int shoal_config_rc = -1; // -1: not run; else the first non-zero rc, or 0

// shoal_global_config sets SQLite's process-wide options that make a
// connection cheaper to open and close — the cold path of a host that
// opens and closes databases all day. It must run before SQLite
// initializes (sqlite3_vfs_find below is the first call that does, in a
// host process); once SQLite is initialized sqlite3_config refuses
// (SQLITE_MISUSE) and the defaults stay, which is correct, only slower.
//
//   - No memory statistics (SQLITE_CONFIG_MEMSTATUS 0): with them every
//     sqlite3_malloc and sqlite3_free takes a process-wide mutex to count
//     bytes, and opening a connection (the built-in FTS3/FTS5/R*Tree
//     modules and functions registered on each, the schema parsed) and
//     closing it are ~200 libc mallocs (measured: sqlexec's
//     BenchmarkColdQuery, perf uprobe on malloc), beside the lookaside
//     ones. Nothing here reads the
//     counters: sqlite3_memory_used is never called, and the soft/hard heap
//     limits that need them are refused to users (the authorizer).
//   - No initial bulk page-cache allocation per connection
//     (SQLITE_CONFIG_PAGECACHE with no buffer and N = 0; SQLite's default
//     is a 20-page block, ~85 KB, allocated and threaded into a free list
//     at the first page read): a cold point read touches 2–4 pages, which
//     are now allocated one by one. The cache's size limit (cache_size)
//     and so when temporary b-trees spill are unchanged.
static void shoal_global_config(void) {
	int rc = sqlite3_config(CONFIG_MEMSTATUS, 0);
	int rc2 = sqlite3_config(CONFIG_PAGECACHE, (void*)0, 0, 0);
	shoal_config_rc = rc ? rc : rc2;
}

int shoal_global_config_rc(void) { return shoal_config_rc; }

// shoal_vfs_register registers "shoal-excl" (once; Go calls it under a
// sync.Once before the first open). It returns 0 on success.
int shoal_vfs_register(void) {
	shoal_global_config();
	shoal_base = sqlite3_vfs_find("unix-excl");
	if (!shoal_base) return 1;
	memcpy(&shoal_vfs, shoal_base, sizeof shoal_vfs);
	shoal_vfs.zName = "shoal-excl";
	shoal_vfs.pNext = 0;
	shoal_vfs.szOsFile = (int)sizeof(shoal_tfile) + shoal_base->szOsFile;
	shoal_vfs.xOpen = shoal_xopen;
	shoal_vfs.xFullPathname = shoal_xfullpathname;
	// Version 3 has system-call overrides whose pointers are the base's
	// own; keep the copy at version 2 so nobody calls them through us.
	if (shoal_vfs.iVersion > 2) shoal_vfs.iVersion = 2;
	return sqlite3_vfs_register(&shoal_vfs, 0);
}

void shoal_set_temp_max(long long max) { __atomic_store_n(&shoal_temp_max, max, __ATOMIC_RELAXED); }
long long shoal_temp_bytes(void) { return __atomic_load_n(&shoal_temp_total, __ATOMIC_RELAXED); }

// shoal_step steps a user statement with its connection marked as the
// owner of any temporary file opened meanwhile, and on SQLITE_ROW reads
// the row's ncol cells (one cgo call per row instead of two).
int shoal_step(shoal_ctx *c, sqlite3_stmt *s, int ncol, shoal_cell *cells) {
	shoal_cur = c;
	int rc = sqlite3_step(s);
	shoal_cur = 0;
	if (rc == SHOAL_ROW && ncol > 0) shoal_fill(s, ncol, cells);
	return rc;
}
