// pragma_cost.c: the CPU and wall time of each step of a cold open as
// sqlexec does it (open, pragmas, one point SELECT, close), against the
// system SQLite (Debian libsqlite3-dev 3.40.1, "unix-excl" VFS; the host's
// bundled 3.54.1 and its shoal-excl VFS differ: relative figures only).
//   gcc -O2 -o /tmp/pc docs/bench/pragma_cost.c -lsqlite3 && /tmp/pc 0 && /tmp/pc 1
// (argument 1: skip PRAGMA journal_mode=WAL). Files in /tmp/hist-pragma/.
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <string.h>
static double now(clockid_t c){struct timespec t;clock_gettime(c,&t);return t.tv_sec*1e9+t.tv_nsec;}
#define NSTEP 10
static const char *names[NSTEP]={"open(unix-excl)","fkey+persist_wal","journal_mode=WAL","synchronous=NORMAL","journal_size_limit","page_size query","max_page_count","point SELECT","close",""};
int main(int argc,char**argv){
  int skipwal = argc>1 && atoi(argv[1]);
  int ndb=64, iters=6000;
  char path[256];
  for(int i=0;i<ndb;i++){ sqlite3*db; snprintf(path,sizeof path,"/tmp/hist-pragma/db%02d.db",i);
    sqlite3_open(path,&db); sqlite3_exec(db,"PRAGMA journal_mode=WAL;CREATE TABLE IF NOT EXISTS kv(id INTEGER PRIMARY KEY, v TEXT);INSERT OR REPLACE INTO kv VALUES(1,'one')",0,0,0); sqlite3_close(db);}
  double cpu[NSTEP]={0}, wall[NSTEP]={0};
  for(int it=0;it<iters;it++){
    snprintf(path,sizeof path,"/tmp/hist-pragma/db%02d.db",it%ndb);
    sqlite3*db; int one=1; int k=0; double c0,w0;
#define STEP(code) c0=now(CLOCK_THREAD_CPUTIME_ID); w0=now(CLOCK_MONOTONIC); code; cpu[k]+=now(CLOCK_THREAD_CPUTIME_ID)-c0; wall[k]+=now(CLOCK_MONOTONIC)-w0; k++;
    STEP(sqlite3_open_v2(path,&db,SQLITE_OPEN_READWRITE|SQLITE_OPEN_CREATE,"unix-excl"))
    STEP(sqlite3_db_config(db,1002,1,(int*)0); sqlite3_file_control(db,"main",10,&one))
    STEP(if(!skipwal) sqlite3_exec(db,"PRAGMA journal_mode=WAL",0,0,0))
    STEP(sqlite3_exec(db,"PRAGMA synchronous=NORMAL",0,0,0))
    STEP(sqlite3_exec(db,"PRAGMA journal_size_limit=4194304",0,0,0))
    STEP({sqlite3_stmt*s; sqlite3_prepare_v2(db,"PRAGMA page_size",-1,&s,0); sqlite3_step(s); sqlite3_finalize(s);})
    STEP(sqlite3_exec(db,"PRAGMA max_page_count=262144",0,0,0))
    STEP({sqlite3_stmt*s; sqlite3_prepare_v2(db,"SELECT id, v FROM kv WHERE id = 1",-1,&s,0); sqlite3_step(s); sqlite3_finalize(s);})
    STEP(sqlite3_close(db))
  }
  printf("sqlite %s, %d cold opens over %d files, skip journal_mode=%d\n", sqlite3_libversion(), iters, ndb, skipwal);
  double tc=0,tw=0;
  for(int k=0;k<9;k++){printf("%-22s cpu %6.1f µs  wall %6.1f µs\n",names[k],cpu[k]/iters/1000,wall[k]/iters/1000); tc+=cpu[k]; tw+=wall[k];}
  printf("%-22s cpu %6.1f µs  wall %6.1f µs\n","total",tc/iters/1000,tw/iters/1000);
}
