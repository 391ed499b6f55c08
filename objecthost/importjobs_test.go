package objecthost

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/objecthost/history"
	"github.com/shoaldb/shoal/objecthost/sqlexec"
)

// ingest uploads sql as name and starts its import.
func ingest(t *testing.T, srv *httptest.Server, d db, name, sql string) {
	t.Helper()
	code, env := call(t, clientOf(srv), srv, http.MethodPut, "/v1/objects/"+d.obj+"/import/upload/"+name, &d, sql)
	require.Equal(t, http.StatusOK, code, "%+v", env)
	code, env = call(t, clientOf(srv), srv, http.MethodPost, "/v1/objects/"+d.obj+"/import/ingest", &d, map[string]string{"etag": md5hex(sql), "filename": name})
	require.Equal(t, http.StatusOK, code, "%+v", env)
}

// pollOnce is one poll of the import named bookmark.
func pollOnce(t *testing.T, srv *httptest.Server, d db, bookmark string) (int, ImportStatus, envelope) {
	t.Helper()
	code, env := call(t, clientOf(srv), srv, http.MethodPost, "/v1/objects/"+d.obj+"/import/poll", &d, map[string]string{"current_bookmark": bookmark})
	var st ImportStatus
	if code == http.StatusOK {
		require.NoError(t, json.Unmarshal(env.Result, &st))
	}
	return code, st, env
}

// clientOf is srv's client; a server of another process (an
// httptest.Server value naming its URL only) has none.
func clientOf(srv *httptest.Server) *http.Client {
	if c := srv.Client(); c != nil {
		return c
	}
	return http.DefaultClient
}

func count(t *testing.T, th *testHost, d db, table string) (int64, error) {
	t.Helper()
	res, err := th.Query(context.Background(), d.obj, d.id(), q("SELECT count(*) AS n FROM "+table))
	if err != nil {
		return 0, err
	}
	b, err := json.Marshal(res[0].Results)
	require.NoError(t, err)
	var rows []struct{ N int64 }
	require.NoError(t, json.Unmarshal(b, &rows), "%s", b)
	require.Len(t, rows, 1)
	return rows[0].N, nil
}

const smallImport = "CREATE TABLE imp(v INTEGER PRIMARY KEY);\nINSERT INTO imp VALUES (1);\nINSERT INTO imp VALUES (2);\nINSERT INTO imp VALUES (3);\n"

// TestImportStatusSurvivesRestart: a poll after the host restarted answers
// a committed import complete, with its meta (it used to answer 400 "no
// import with that bookmark", and a client could not tell it succeeded);
// a retried ingest of the same file answers it too, without running it
// again; the status expires after jobRetention.
func TestImportStatusSurvivesRestart(t *testing.T) {
	th := newTestHost(t, nil)
	srv := serve(t, th)
	d := newDB("acct")
	th.mustInit(t, d)
	ingest(t, srv, d, "f.sql", smallImport)
	before := waitImport(t, srv, d, "f.sql")
	require.Equal(t, "complete", before.Status, "%+v", before)

	th.reopen(t)
	srv = serve(t, th)
	code, st, env := pollOnce(t, srv, d, "f.sql")
	require.Equal(t, http.StatusOK, code, "%+v", env)
	assert.Equal(t, "complete", st.Status)
	require.NotNil(t, st.Result)
	assert.Equal(t, before.Result.NumQueries, st.Result.NumQueries)
	assert.Equal(t, before.Result.Meta.RowsWritten, st.Result.Meta.RowsWritten)
	assert.Equal(t, before.Messages, st.Messages)

	code, env = call(t, srv.Client(), srv, http.MethodPost, "/v1/objects/"+d.obj+"/import/ingest", &d, map[string]string{"etag": md5hex(smallImport), "filename": "f.sql"})
	require.Equal(t, http.StatusOK, code, "a retried ingest answers the job: %+v", env)
	assert.Contains(t, string(env.Result), `"status":"complete"`)
	n, err := count(t, th, d, "imp")
	require.NoError(t, err)
	assert.Equal(t, int64(3), n, "the import ran once")

	th.clock.Advance(jobRetention + time.Minute)
	th.reopen(t)
	srv = serve(t, th)
	code, _, env = pollOnce(t, srv, d, "f.sql")
	assert.Equal(t, http.StatusBadRequest, code, "expired: %+v", env)
}

// TestImportCommittedBeforeJobFileIsComplete: a host that died after the
// import's COMMIT but before its job file said so (the file still reads
// "active", with the commit block written just before the COMMIT) answers
// complete after the restart — the tag the import's own transaction set in
// the database header decides.
func TestImportCommittedBeforeJobFileIsComplete(t *testing.T) {
	th := newTestHost(t, nil)
	srv := serve(t, th)
	d := newDB("acct")
	th.mustInit(t, d)
	ingest(t, srv, d, "f.sql", smallImport)
	require.Equal(t, "complete", waitImport(t, srv, d, "f.sql").Status)
	require.NoError(t, th.Host.Close())
	// What the disk holds when the crash came between the two writes.
	rewindJobFile(t, th, d, "f.sql")

	th.open(t)
	srv = serve(t, th)
	code, st, env := pollOnce(t, srv, d, "f.sql")
	require.Equal(t, http.StatusOK, code, "%+v", env)
	assert.Equal(t, "complete", st.Status, "%+v", st)
	require.NotNil(t, st.Result)
	assert.Equal(t, int64(4), st.Result.NumQueries)
	n, err := count(t, th, d, "imp")
	require.NoError(t, err)
	assert.Equal(t, int64(3), n)
	// The tag is the host's: user SQL cannot read it.
	_, err = th.Query(context.Background(), d.obj, d.id(), q("PRAGMA application_id"))
	assert.ErrorContains(t, err, "not authorized")
}

// TestImportCommitStepWithoutCommitIsInterrupted: a host that died after
// the job file's commit block but before the COMMIT (the database header
// does not carry the job's tag) answers the job interrupted, nothing
// imported — and an import that ran after the restart did not hide the
// first's tag: the dead job was resolved before it.
func TestImportCommitStepWithoutCommitIsInterrupted(t *testing.T) {
	th := newTestHost(t, nil)
	srv := serve(t, th)
	d := newDB("acct")
	th.mustInit(t, d)
	ingest(t, srv, d, "a.sql", smallImport)
	require.Equal(t, "complete", waitImport(t, srv, d, "a.sql").Status)
	require.NoError(t, th.Host.Close())
	// a.sql committed but its host "died" before the final job file; b.sql
	// reached its commit step and died before the COMMIT.
	jobs := filepath.Join(th.dir, "imports", d.obj, "jobs")
	var a jobFile
	b, err := os.ReadFile(filepath.Join(jobs, "a.sql.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &a))
	require.NotNil(t, a.Commit)
	a.FinishedUs, a.Status.Status, a.Status.Result = 0, "active", nil
	dead := a
	dead.Status.AtBookmark, dead.Status.Messages = "b.sql", []string{"Import started"}
	dead.Commit = &jobCommit{Tag: a.Commit.Tag + 1, FinishedUs: a.Commit.FinishedUs, Status: a.Commit.Status}
	for name, jf := range map[string]jobFile{"a.sql": a, "b.sql": dead} {
		b, err = json.Marshal(jf)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(jobs, name+".json"), b, 0o644))
	}

	th.open(t)
	srv = serve(t, th)
	// A new import first: it changes the header's tag.
	ingest(t, srv, d, "c.sql", "CREATE TABLE c(v);\n")
	require.Equal(t, "complete", waitImport(t, srv, d, "c.sql").Status)
	code, st, env := pollOnce(t, srv, d, "b.sql")
	require.Equal(t, http.StatusOK, code, "%+v", env)
	assert.Equal(t, "error", st.Status, "%+v", st)
	assert.Contains(t, st.Error, "nothing was imported")
	code, st, env = pollOnce(t, srv, d, "a.sql")
	require.Equal(t, http.StatusOK, code, "%+v", env)
	assert.Equal(t, "complete", st.Status, "resolved before c.sql changed the tag: %+v", st)
}

// TestImportLeavesNoVisibleTable: an import leaves nothing of the host's
// in the user's schema (sqlite_schema, PRAGMA table_list): the reserved
// table _shoal_imports it used to create was listed there, and schema
// tools (drizzle-kit, which D1 users already configure to skip _cf_KV)
// would try to drop it.
func TestImportLeavesNoVisibleTable(t *testing.T) {
	th := newTestHost(t, nil)
	srv := serve(t, th)
	d := newDB("acct")
	th.mustInit(t, d)
	ingest(t, srv, d, "f.sql", smallImport)
	require.Equal(t, "complete", waitImport(t, srv, d, "f.sql").Status)
	for _, sql := range []string{"SELECT name FROM sqlite_schema", "SELECT name FROM pragma_table_list WHERE schema = 'main'"} {
		res, err := th.Query(context.Background(), d.obj, d.id(), q(sql))
		require.NoError(t, err, sql)
		b, err := json.Marshal(res[0].Results)
		require.NoError(t, err)
		assert.NotContains(t, string(b), "_shoal", sql)
		assert.Contains(t, string(b), `"imp"`, sql)
	}
}

// TestImportFillingTheSizeLimit: an import whose data fills the database
// exactly to its size limit (max_page_count) completes: the host's record
// of the import takes no page (its table and row used to tip such an
// import into "database full").
func TestImportFillingTheSizeLimit(t *testing.T) {
	th := newTestHost(t, func(c *Config) {
		c.Limits = sqlexec.DefaultLimits()
		c.Limits.MaxDatabaseBytes = 64 * 4096
	})
	srv := serve(t, th)
	sql := func(n int) string {
		return fmt.Sprintf("CREATE TABLE big(b BLOB);\nINSERT INTO big VALUES (zeroblob(%d));\n", n)
	}
	// The largest blob user SQL fits in one request on a new database: the
	// same statements leave it at exactly its page limit.
	fits := func(n int) bool {
		d := newDB("acct")
		th.mustInit(t, d)
		_, err := th.Query(context.Background(), d.obj, d.id(), q(strings.ReplaceAll(sql(n), "\n", " ")))
		if err != nil {
			require.ErrorIs(t, err, sqlexec.ErrStorageLimit)
		}
		return err == nil
	}
	lo, hi := 0, 64*4096
	for lo+1 < hi {
		if mid := (lo + hi) / 2; fits(mid) {
			lo = mid
		} else {
			hi = mid
		}
	}
	d := newDB("acct")
	th.mustInit(t, d)
	ingest(t, srv, d, "full.sql", sql(lo))
	st := waitImport(t, srv, d, "full.sql")
	require.Equal(t, "complete", st.Status, "%+v", st)
	assert.Equal(t, int64(64*4096), st.Result.Meta.SizeAfter, "the database is at its limit")
}

// TestImportKilledMidIngest: a real host process (this test binary, run
// as TestImportHostProcess) is killed with SIGKILL while its import runs;
// the host reopened on the same files answers the poll failed, saying
// nothing was imported, and the database has none of the import's rows.
func TestImportKilledMidIngest(t *testing.T) {
	dir := t.TempDir()
	d := newDB("acct")
	var b strings.Builder
	b.WriteString("CREATE TABLE imp(v INTEGER);\n")
	for i := 0; i < 400_000; i++ {
		fmt.Fprintf(&b, "INSERT INTO imp VALUES (%d);\n", i)
	}
	sql := b.String()

	// The child listens on a port of its choosing and writes its address
	// to addrFile (no fixed port: runs side by side must not collide).
	addrFile := filepath.Join(t.TempDir(), "addr")
	cmd := exec.Command(os.Args[0], "-test.run=^TestImportHostProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), "SHOAL_IMPORT_HOST_DIR="+dir, "SHOAL_IMPORT_HOST_ADDR_FILE="+addrFile,
		"SHOAL_IMPORT_HOST_DB="+d.obj+","+d.uuid+","+d.account)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	require.NoError(t, cmd.Start())
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	var addr string
	require.Eventually(t, func() bool {
		b, err := os.ReadFile(addrFile)
		addr = strings.TrimSpace(string(b))
		return err == nil && strings.HasSuffix(string(b), "\n")
	}, 60*time.Second, 20*time.Millisecond, "the host process never listened")
	srv := &httptest.Server{URL: "http://" + addr, Config: &http.Server{}}
	ingest(t, srv, d, "big.sql", sql)
	// Kill once the import has run statements (its transaction is open).
	require.Eventually(t, func() bool {
		code, st, _ := pollOnce(t, srv, d, "big.sql")
		require.Equal(t, http.StatusOK, code)
		require.Equal(t, "active", st.Status, "the import finished before the kill: make it bigger")
		return st.Progress.Statements > 0
	}, 60*time.Second, 5*time.Millisecond)
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	_ = cmd.Wait()

	th := &testHost{dir: dir, clock: newFakeClock(), cat: newFakeCatalog(), sink: &MemSink{}}
	th.cfg = Config{ID: "host-1", Dir: dir, Address: "127.0.0.1:1", Region: "WEUR",
		Catalog: th.cat, Usage: th.sink, Sizes: th.sink, Routes: th.sink, Now: th.clock.Now, Manual: true}
	th.open(t)
	hsrv := serve(t, th)
	code, st, env := pollOnce(t, hsrv, d, "big.sql")
	require.Equal(t, http.StatusOK, code, "%+v", env)
	assert.Equal(t, "error", st.Status, "%+v", st)
	assert.Contains(t, st.Error, "nothing was imported")
	_, err := count(t, th, d, "imp")
	assert.ErrorContains(t, err, "no such table: imp", "no partial rows")
	_, err = os.Stat(filepath.Join(dir, "imports", d.obj, "big.sql"))
	assert.ErrorIs(t, err, os.ErrNotExist, "the failed job's upload is removed")
}

// TestImportHostProcess is the host process of TestImportKilledMidIngest
// (skipped unless that test starts it).
func TestImportHostProcess(t *testing.T) {
	dir := os.Getenv("SHOAL_IMPORT_HOST_DIR")
	if dir == "" {
		t.Skip("the host process of TestImportKilledMidIngest")
	}
	ids := strings.Split(os.Getenv("SHOAL_IMPORT_HOST_DB"), ",")
	th := &testHost{dir: dir, clock: newFakeClock(), cat: newFakeCatalog(), sink: &MemSink{}}
	th.cfg = Config{ID: "host-1", Dir: dir, Address: "127.0.0.1:1", Region: "WEUR",
		Catalog: th.cat, Usage: th.sink, Sizes: th.sink, Routes: th.sink, Now: th.clock.Now, Manual: true}
	th.open(t)
	th.mustInit(t, db{obj: ids[0], uuid: ids[1], account: ids[2]})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	// Written whole (a trailing newline marks the end) once listening.
	tmp := os.Getenv("SHOAL_IMPORT_HOST_ADDR_FILE") + ".tmp"
	require.NoError(t, os.WriteFile(tmp, []byte(ln.Addr().String()+"\n"), 0o600))
	require.NoError(t, os.Rename(tmp, os.Getenv("SHOAL_IMPORT_HOST_ADDR_FILE")))
	srv := &http.Server{Handler: th.Handler()}
	t.Log(srv.Serve(ln)) // until the parent kills this process
}

// TestImportArchivedUnconfirmedIsComplete: with durability "archived" and
// the archive store refusing, an import that committed on the host is
// complete (its statements applied: "error" made clients retry into "table
// exists"), with the pending archiving in its messages; when the store is
// back the archive catches up with it.
func TestImportArchivedUnconfirmedIsComplete(t *testing.T) {
	dir, err := history.NewDirStore(t.TempDir())
	require.NoError(t, err)
	store := &refusingStore{Store: dir}
	th := newTestHost(t, func(c *Config) {
		c.History = &HistoryConfig{Store: store, Archived: true, Shipper: history.ShipperOptions{MaxLag: 100 * time.Millisecond, PutTimeout: time.Second}}
	})
	srv := serve(t, th)
	d := newDB("acct")
	th.mustInit(t, d)
	require.Eventually(t, func() bool {
		_, err := th.Query(context.Background(), d.obj, d.id(), q("CREATE TABLE IF NOT EXISTS t(v INTEGER)"))
		return err == nil
	}, 30*time.Second, 50*time.Millisecond, "a first write acknowledged")

	store.refuse.Store(true)
	ingest(t, srv, d, "f.sql", smallImport)
	st := waitImport(t, srv, d, "f.sql")
	assert.Equal(t, "complete", st.Status, "%+v", st)
	assert.Empty(t, st.Error)
	assert.Contains(t, strings.Join(st.Messages, "\n"), "archive store has not confirmed")
	require.NotNil(t, st.Result)
	assert.Equal(t, int64(4), st.Result.NumQueries)

	store.refuse.Store(false)
	require.Eventually(t, func() bool {
		_, err := th.Query(context.Background(), d.obj, d.id(), q("INSERT INTO t VALUES (1)"))
		return err == nil
	}, 30*time.Second, 50*time.Millisecond, "writes acknowledged again once the store is back")
	n, err := count(t, th, d, "imp")
	require.NoError(t, err)
	assert.Equal(t, int64(3), n, "the import applied on the host")
	b := th.archivedUpTo(t, d) // the archive holds every commit, the import's too
	fork := newDB("acct")
	req := fork.init()
	req.RestoreFrom = &RestoreSource{DatabaseUUID: d.uuid, Bookmark: b}
	_, err = th.Init(context.Background(), fork.obj, req)
	require.NoError(t, err)
	n, err = count(t, th, fork, "imp")
	require.NoError(t, err)
	assert.Equal(t, int64(3), n, "the archived state holds the import")
}

// TestImportPollAfterRelocationAndFork: an import's status is its host's
// (its job file): a relocation (the same database UUID restored on another
// object) and a fork (another database) do not answer it (400), though the
// data the import wrote travels with the database through the archive.
func TestImportPollAfterRelocationAndFork(t *testing.T) {
	dir, err := history.NewDirStore(t.TempDir())
	require.NoError(t, err)
	th := historyHost(t, dir)
	srv := serve(t, th)
	src := newDB("acct")
	th.mustInit(t, src)
	ingest(t, srv, src, "f.sql", smallImport)
	require.Equal(t, "complete", waitImport(t, srv, src, "f.sql").Status)
	th.archivedUpTo(t, src)

	moved := db{obj: newObjectID(), uuid: src.uuid, account: src.account}
	req := moved.init()
	req.RestoreFrom = &RestoreSource{DatabaseUUID: src.uuid}
	_, err = th.Init(context.Background(), moved.obj, req)
	require.NoError(t, err)
	n, err := count(t, th, moved, "imp")
	require.NoError(t, err)
	require.Equal(t, int64(3), n)
	code, _, env := pollOnce(t, srv, moved, "f.sql")
	assert.Equal(t, http.StatusBadRequest, code, "the job was another object's: %+v", env)

	fork := newDB("acct")
	req = fork.init()
	req.RestoreFrom = &RestoreSource{DatabaseUUID: src.uuid}
	_, err = th.Init(context.Background(), fork.obj, req)
	require.NoError(t, err)
	n, err = count(t, th, fork, "imp")
	require.NoError(t, err)
	require.Equal(t, int64(3), n)
	code, _, env = pollOnce(t, srv, fork, "f.sql")
	assert.Equal(t, http.StatusBadRequest, code, "a fork did not run the import: %+v", env)
}

// TestImportJobFilesExpire: a job file is removed by the next upload to its
// object once its job ended over a day ago (counted from the end the file
// records, not the file's age), and a swept (deleted) object's uploads and
// job files go with its database file.
func TestImportJobFilesExpire(t *testing.T) {
	th := newTestHost(t, nil)
	srv := serve(t, th)
	d := newDB("acct")
	th.mustInit(t, d)
	ingest(t, srv, d, "old.sql", smallImport)
	require.Equal(t, "complete", waitImport(t, srv, d, "old.sql").Status)
	jobs := filepath.Join(th.dir, "imports", d.obj, "jobs")
	old := filepath.Join(jobs, "old.sql.json")
	// The job's last step: its file says when it ended (a poll may answer
	// "complete" just before).
	require.Eventually(t, func() bool {
		jf := readJob(old)
		return jf != nil && jf.FinishedUs != 0
	}, 30*time.Second, 5*time.Millisecond)
	th.clock.Advance(jobRetention - time.Minute)
	code, env := upload(t, srv, d, "new.sql", "SELECT 1;\n")
	require.Equal(t, http.StatusOK, code, "%+v", env)
	assert.FileExists(t, old, "ended less than a day ago")
	th.clock.Advance(2 * time.Minute)
	code, env = upload(t, srv, d, "new.sql", "SELECT 1;\n")
	require.Equal(t, http.StatusOK, code, "%+v", env)
	assert.NoFileExists(t, old)

	ctx := context.Background()
	_, err := th.Delete(ctx, d.obj, 0)
	require.NoError(t, err)
	th.clock.Advance(25 * time.Hour)
	_, err = th.Sweep(ctx)
	require.NoError(t, err)
	assert.NoDirExists(t, filepath.Join(th.dir, "imports", d.obj))
}

// TestImportActiveJobOfThisProcessIsNotInterrupted: an "active" job file
// written by this very process is a job that is running (a poll can race
// its ingest: the client lost the ingest's answer and polls the file name),
// so a poll never resolves it as interrupted — which would also delete the
// upload under the running job.
func TestImportActiveJobOfThisProcessIsNotInterrupted(t *testing.T) {
	th := newTestHost(t, nil)
	srv := serve(t, th)
	d := newDB("acct")
	th.mustInit(t, d)
	code, env := upload(t, srv, d, "x.sql", smallImport)
	require.Equal(t, http.StatusOK, code, "%+v", env)
	// The state between the ingest's job file and its map entry.
	j := &importJob{filename: "x.sql", status: ImportStatus{Type: "import", Status: "active", AtBookmark: "x.sql", Messages: []string{"Import started"}}}
	require.NoError(t, th.Host.dump.saveJob(d.obj, d.uuid, j))
	code, st, env := pollOnce(t, srv, d, "x.sql")
	assert.NotEqual(t, "error", st.Status, "%d %+v", code, env)
	assert.FileExists(t, filepath.Join(th.dir, "imports", d.obj, "x.sql"), "the upload stays")
	code, env = call(t, srv.Client(), srv, http.MethodPost, "/v1/objects/"+d.obj+"/import/ingest", &d, map[string]string{"etag": md5hex(smallImport), "filename": "x.sql"})
	require.Equal(t, http.StatusOK, code, "the ingest runs the job: %+v", env)
	assert.Equal(t, "complete", waitImport(t, srv, d, "x.sql").Status)
}

// TestImportRunningPastRetentionKeepsItsJobFile: a job that has not ended
// keeps its job file however long it runs (the next upload to the object
// used to remove a job file a day after the job STARTED), so a host that
// dies after a day of import still answers "interrupted" rather than "no
// such import".
func TestImportRunningPastRetentionKeepsItsJobFile(t *testing.T) {
	th := newTestHost(t, nil)
	srv := serve(t, th)
	d := newDB("acct")
	th.mustInit(t, d)
	// A running job, as the ingest leaves it: its file and its entry.
	j := &importJob{filename: "long.sql", status: ImportStatus{Type: "import", Status: "active", AtBookmark: "long.sql", Messages: []string{"Import started"}}}
	require.NoError(t, th.Host.dump.saveJob(d.obj, d.uuid, j))
	th.Host.dump.mu.Lock()
	th.Host.dump.jobs[d.obj] = j
	th.Host.dump.mu.Unlock()
	path := filepath.Join(th.dir, "imports", d.obj, "jobs", "long.sql.json")
	start := th.clock.Now() // the file was written when the job started (host clock)
	require.NoError(t, os.Chtimes(path, start, start))

	th.clock.Advance(jobRetention + time.Hour)
	code, env := upload(t, srv, d, "other.sql", "SELECT 1;\n")
	require.Equal(t, http.StatusOK, code, "%+v", env)
	assert.FileExists(t, path, "a running job's file is kept")

	// The host dies; the job never finished.
	require.NoError(t, th.Host.Close())
	th.open(t)
	srv = serve(t, th)
	code, st, env := pollOnce(t, srv, d, "long.sql")
	require.Equal(t, http.StatusOK, code, "%+v", env)
	assert.Equal(t, "error", st.Status, "%+v", st)
	assert.Contains(t, st.Error, "nothing was imported")
}

// TestImportRecoveredFinalBookmark: the final_bookmark of an import whose
// host died between its COMMIT and its job file's final write is the
// bookmark the import produced (found in the archive after later writes),
// the one its host would have answered — not the upload's name.
func TestImportRecoveredFinalBookmark(t *testing.T) {
	dir, err := history.NewDirStore(t.TempDir())
	require.NoError(t, err)
	th := historyHost(t, dir)
	srv := serve(t, th)
	d := newDB("acct")
	th.mustInit(t, d)
	th.exec(t, d, "CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT, r INTEGER)")
	sql := "INSERT INTO t VALUES (1, 'imported', 7);\n"
	ingest(t, srv, d, "f.sql", sql)
	before := waitImport(t, srv, d, "f.sql")
	require.Equal(t, "complete", before.Status, "%+v", before)
	_, err = history.ParseBookmark(d.uuid, history.Bookmark(before.Result.FinalBookmark))
	require.NoError(t, err)
	th.clock.Advance(time.Second)
	th.exec(t, d, "INSERT INTO t VALUES (2, 'later', 8)") // the import's commit is no longer the latest
	th.archivedUpTo(t, d)
	require.NoError(t, th.Host.Close())
	rewindJobFile(t, th, d, "f.sql")

	th.open(t)
	srv = serve(t, th)
	// The lookup runs outside the host's import lock: polls answer
	// "active" until it ends.
	st := waitImport(t, srv, d, "f.sql")
	require.Equal(t, "complete", st.Status, "%+v", st)
	require.NotNil(t, st.Result)
	assert.Equal(t, before.Result.FinalBookmark, st.Result.FinalBookmark)
	_, err = th.Restore(context.Background(), d.obj, st.Result.FinalBookmark, "", 0)
	require.NoError(t, err)
	assert.Equal(t, `[{"id":1,"v":"imported","r":7}]`, th.rowsOf(t, d), "the state right after the import")
}

// rewindJobFile makes the job file of upload name what the disk holds
// after a crash between the import's COMMIT and the file's last write:
// the job still active, no end, no result.
func rewindJobFile(t *testing.T, th *testHost, d db, name string) {
	t.Helper()
	path := filepath.Join(th.dir, "imports", d.obj, "jobs", name+".json")
	var jf jobFile
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &jf))
	jf.FinishedUs, jf.Status.Status, jf.Status.Result = 0, "active", nil
	b, err = json.Marshal(jf)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, b, 0o644))
}

// crashedImport is a host with history whose database d holds an import
// (f.sql) that committed while its host "died" before the job file's last
// write, with a later write after it (so its final_bookmark is the
// archive's, not the live capturer's), reopened with the archive part of
// the bookmark lookup blocked until release: every lookup counts in
// lookups and sends on entered as it starts.
type crashedImport struct {
	th       *testHost
	srv      *httptest.Server
	d, other db
	before   ImportStatus // f.sql's answer before the crash
	pre      string       // a bookmark before the import
	lookups  atomic.Int32
	entered  chan struct{}
	release  func()
}

func newCrashedImport(t *testing.T) *crashedImport {
	t.Helper()
	store, err := history.NewDirStore(t.TempDir())
	require.NoError(t, err)
	c := &crashedImport{th: historyHost(t, store), d: newDB("acct"), other: newDB("acct"), entered: make(chan struct{}, 16)}
	th := c.th
	srv := serve(t, th)
	th.mustInit(t, c.d)
	th.mustInit(t, c.other)
	th.exec(t, c.d, "CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT, r INTEGER)")
	c.pre = th.archivedUpTo(t, c.d)
	th.clock.Advance(time.Second)
	ingest(t, srv, c.d, "f.sql", "INSERT INTO t VALUES (1, 'imported', 7);\n")
	c.before = waitImport(t, srv, c.d, "f.sql")
	require.Equal(t, "complete", c.before.Status, "%+v", c.before)
	th.clock.Advance(time.Second)
	th.exec(t, c.d, "INSERT INTO t VALUES (2, 'later', 8)") // the import's commit is no longer the latest
	th.archivedUpTo(t, c.d)
	require.NoError(t, th.Host.Close())
	rewindJobFile(t, th, c.d, "f.sql")

	th.open(t)
	c.srv = serve(t, th)
	gate := make(chan struct{})
	var once sync.Once
	c.release = func() { once.Do(func() { close(gate) }) }
	th.Host.dump.hooks.archiveLookup = func() {
		c.lookups.Add(1)
		select {
		case c.entered <- struct{}{}:
		default: // nobody counts on more signals than the buffer holds
		}
		<-gate
	}
	t.Cleanup(c.release) // before the server's and the host's Close (cleanups run last-in first)
	return c
}

// reply is an HTTP answer obtained off the test goroutine.
type reply struct {
	code int
	env  envelope
	err  error
}

// status decodes an import status answer.
func (r reply) status(t *testing.T) ImportStatus {
	t.Helper()
	require.NoError(t, r.err)
	require.Equal(t, http.StatusOK, r.code, "%+v", r.env)
	var st ImportStatus
	require.NoError(t, json.Unmarshal(r.env.Result, &st))
	return st
}

// goCall does one request in a goroutine (it may block: the caller bounds
// the wait with awaitReply).
func goCall(srv *httptest.Server, method, path string, d db, body any) <-chan reply {
	ch := make(chan reply, 1)
	go func() {
		var rd io.Reader
		if s, ok := body.(string); ok {
			rd = strings.NewReader(s)
		} else {
			b, _ := json.Marshal(body)
			rd = bytes.NewReader(b)
		}
		req, err := http.NewRequest(method, srv.URL+path, rd)
		if err != nil {
			ch <- reply{err: err}
			return
		}
		req.Header.Set(HeaderDatabase, d.uuid)
		req.Header.Set(HeaderAccount, d.account)
		resp, err := srv.Client().Do(req)
		if err != nil {
			ch <- reply{err: err}
			return
		}
		defer resp.Body.Close()
		var env envelope
		err = json.NewDecoder(resp.Body).Decode(&env)
		ch <- reply{code: resp.StatusCode, env: env, err: err}
	}()
	return ch
}

func goPoll(srv *httptest.Server, d db, bookmark string) <-chan reply {
	return goCall(srv, http.MethodPost, "/v1/objects/"+d.obj+"/import/poll", d, map[string]string{"current_bookmark": bookmark})
}

// hangGuard only turns a call stuck behind the blocked lookup into a
// failure instead of a hung test: no timing assertion (the calls it
// bounds take milliseconds when they do not wait).
const hangGuard = 60 * time.Second

func awaitReply(t *testing.T, ch <-chan reply, what string) reply {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(hangGuard):
		t.Fatalf("%s never answered: it waits for the blocked bookmark lookup", what)
		return reply{}
	}
}

func awaitSignal(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(hangGuard):
		t.Fatalf("%s never happened", what)
	}
}

// TestImportRecoveryLookupDoesNotBlockOtherDatabases: while a recovered
// import's bookmark lookup waits for the archive, another database of the
// same host uploads, ingests and polls its own import to the end (the
// lookup used to run under the host's one import lock, freezing every
// import and poll on the host for up to 5 s).
func TestImportRecoveryLookupDoesNotBlockOtherDatabases(t *testing.T) {
	c := newCrashedImport(t)
	polled := goPoll(c.srv, c.d, "f.sql") // starts the lookup
	awaitSignal(t, c.entered, "the bookmark lookup")

	o := c.other
	sql := "CREATE TABLE o(v);\nINSERT INTO o VALUES (1);\n"
	r := awaitReply(t, goCall(c.srv, http.MethodPut, "/v1/objects/"+o.obj+"/import/upload/o.sql", o, sql), "another database's upload")
	require.Equal(t, http.StatusOK, r.code, "%+v %v", r.env, r.err)
	r = awaitReply(t, goCall(c.srv, http.MethodPost, "/v1/objects/"+o.obj+"/import/ingest", o, map[string]string{"etag": md5hex(sql), "filename": "o.sql"}), "another database's ingest")
	require.Equal(t, http.StatusOK, r.code, "%+v %v", r.env, r.err)
	for {
		st := awaitReply(t, goPoll(c.srv, o, "o.sql"), "another database's poll").status(t)
		if st.Status != "active" {
			assert.Equal(t, "complete", st.Status, "%+v", st)
			break
		}
		time.Sleep(10 * time.Millisecond) // poll interval: the hang guard bounds the wait
	}
	assert.Equal(t, int32(1), c.lookups.Load())
	st := awaitReply(t, polled, "the recovered job's poll").status(t)
	assert.Equal(t, "active", st.Status, "the lookup is still blocked: %+v", st)
}

// TestImportRecoveringJobAnswersActiveThenComplete: a recovered import whose
// bookmark is being looked up answers "active" (saying its status is being
// recovered) to its polls and to a retried ingest, none of which starts a
// second lookup; once
// the lookup ends the job answers complete with the import's own
// final_bookmark, and its job file says so.
func TestImportRecoveringJobAnswersActiveThenComplete(t *testing.T) {
	c := newCrashedImport(t)
	first := goPoll(c.srv, c.d, "f.sql")
	awaitSignal(t, c.entered, "the bookmark lookup")
	second := goPoll(c.srv, c.d, "f.sql")
	var active ImportStatus
	for i, ch := range []<-chan reply{first, second} {
		active = awaitReply(t, ch, "a poll").status(t)
		assert.Equal(t, "active", active.Status, "poll %d: %+v", i, active)
		assert.Contains(t, active.Messages, recoveringMsg, "poll %d", i)
	}
	d := c.d
	st := awaitReply(t, goCall(c.srv, http.MethodPost, "/v1/objects/"+d.obj+"/import/ingest", d, map[string]string{"etag": "x", "filename": "f.sql"}), "a retried ingest").status(t)
	assert.Equal(t, "active", st.Status, "%+v", st)
	r := awaitReply(t, goCall(c.srv, http.MethodPut, "/v1/objects/"+d.obj+"/import/upload/g.sql", d, "SELECT 1;\n"), "an upload (it resolves dead jobs)")
	require.Equal(t, http.StatusOK, r.code, "%+v %v", r.env, r.err)
	assert.Equal(t, int32(1), c.lookups.Load(), "one lookup")
	assert.Equal(t, "active", readJob(filepath.Join(c.th.dir, "imports", d.obj, "jobs", "f.sql.json")).Status.Status)

	c.release()
	st = waitImport(t, c.srv, d, "f.sql")
	require.Equal(t, "complete", st.Status, "%+v", st)
	require.NotNil(t, st.Result)
	assert.Equal(t, c.before.Result.FinalBookmark, st.Result.FinalBookmark)
	// The edge answers each poll with the messages not seen yet, by count:
	// what the active answers said is the start of the final list.
	require.GreaterOrEqual(t, len(st.Messages), len(active.Messages))
	assert.Equal(t, active.Messages, st.Messages[:len(active.Messages)], "%q", st.Messages)
	jf := readJob(filepath.Join(c.th.dir, "imports", d.obj, "jobs", "f.sql.json"))
	require.NotNil(t, jf)
	assert.Equal(t, "complete", jf.Status.Status)
	require.NotNil(t, jf.Status.Result)
	assert.Equal(t, c.before.Result.FinalBookmark, jf.Status.Result.FinalBookmark)
	assert.Equal(t, int32(1), c.lookups.Load(), "one lookup")
}

// TestImportRestoreWaitsForRecoveringJob: a time-travel restore of a
// database whose recovered import is looking up its bookmark waits for the
// lookup and the job file's rewrite before changing the header (until then
// the header is the only record of the import's COMMIT); after the
// restore (to before the import) and a restart, the import still answers
// complete with its own final_bookmark.
func TestImportRestoreWaitsForRecoveringJob(t *testing.T) {
	c := newCrashedImport(t)
	waiting := make(chan struct{}, 1)
	c.th.Host.dump.hooks.awaitResolution = func() { waiting <- struct{}{} }
	st := awaitReply(t, goPoll(c.srv, c.d, "f.sql"), "the recovered job's poll").status(t)
	require.Equal(t, "active", st.Status, "%+v", st)
	awaitSignal(t, c.entered, "the bookmark lookup")

	restored := make(chan error, 1)
	go func() {
		_, err := c.th.Restore(context.Background(), c.d.obj, c.pre, "", 0)
		restored <- err
	}()
	select {
	case <-waiting:
	case err := <-restored:
		t.Fatalf("the restore ran while the import's resolution was open (err %v)", err)
	case <-time.After(hangGuard):
		t.Fatal("the restore neither waited nor ran")
	}
	c.release()
	select {
	case err := <-restored:
		require.NoError(t, err)
	case <-time.After(hangGuard):
		t.Fatal("the restore never ended")
	}
	assert.Equal(t, `[]`, c.th.rowsOf(t, c.d), "restored to before the import")
	assert.Equal(t, int32(1), c.lookups.Load(), "the restore did not start a second lookup")

	c.th.reopen(t)
	srv := serve(t, c.th)
	code, st, env := pollOnce(t, srv, c.d, "f.sql")
	require.Equal(t, http.StatusOK, code, "%+v", env)
	assert.Equal(t, "complete", st.Status, "%+v", st)
	require.NotNil(t, st.Result)
	assert.Equal(t, c.before.Result.FinalBookmark, st.Result.FinalBookmark)
}

// TestImportIngestWaitsForTheResolution: the upload of a new file to a
// database whose dead import nobody polled starts that import's resolution
// (resolveDead) without waiting for it; the ingest then waits for the
// bookmark lookup (no 409: no import is running) before its own import
// changes the header; the dead import answers complete, not hidden by the
// new import's tag.
func TestImportIngestWaitsForTheResolution(t *testing.T) {
	c := newCrashedImport(t)
	waiting := make(chan struct{}, 1)
	c.th.Host.dump.hooks.awaitResolution = func() { waiting <- struct{}{} }
	d := c.d
	sql := "INSERT INTO t VALUES (3, 'next', 9);\n"
	r := awaitReply(t, goCall(c.srv, http.MethodPut, "/v1/objects/"+d.obj+"/import/upload/n.sql", d, sql), "the upload")
	require.Equal(t, http.StatusOK, r.code, "%+v %v", r.env, r.err)
	awaitSignal(t, c.entered, "the bookmark lookup the upload started")
	ingested := goCall(c.srv, http.MethodPost, "/v1/objects/"+d.obj+"/import/ingest", d, map[string]string{"etag": md5hex(sql), "filename": "n.sql"})
	select {
	case <-waiting:
	case r := <-ingested:
		t.Fatalf("the ingest did not wait for the open resolution: %d %+v", r.code, r.env)
	case <-time.After(hangGuard):
		t.Fatal("the ingest neither waited nor answered")
	}
	c.release()
	r = awaitReply(t, ingested, "the ingest")
	require.Equal(t, http.StatusOK, r.code, "%+v %v", r.env, r.err)
	require.Equal(t, "complete", waitImport(t, c.srv, d, "n.sql").Status)
	st := waitImport(t, c.srv, d, "f.sql")
	assert.Equal(t, "complete", st.Status, "%+v", st)
	require.NotNil(t, st.Result)
	assert.Equal(t, c.before.Result.FinalBookmark, st.Result.FinalBookmark)
	assert.Equal(t, int32(1), c.lookups.Load())
}

// TestImportUnrewrittenRecoveredJobBlocksHeaderChanges: when the job file
// of a recovered committed import cannot be rewritten, the header is the
// only record of its COMMIT, so a restore and a new import of that
// database are refused (503, retryable) instead of hiding it; once the
// file can be written, the restore resolves the job (final on disk) and
// runs.
func TestImportUnrewrittenRecoveredJobBlocksHeaderChanges(t *testing.T) {
	c := newCrashedImport(t)
	c.release() // the lookup is not blocked here
	var failWrites atomic.Bool
	failWrites.Store(true)
	c.th.Host.dump.hooks.saveJob = func(name string) error {
		if name == "f.sql" && failWrites.Load() {
			return errors.New("disk refused the job file")
		}
		return nil
	}
	d := c.d
	st := waitImport(t, c.srv, d, "f.sql")
	require.Equal(t, "complete", st.Status, "%+v", st)
	assert.Equal(t, c.before.Result.FinalBookmark, st.Result.FinalBookmark)
	path := filepath.Join(c.th.dir, "imports", d.obj, "jobs", "f.sql.json")
	require.Equal(t, "active", readJob(path).Status.Status, "not rewritten")

	restored := make(chan error, 1)
	go func() {
		_, err := c.th.Restore(context.Background(), d.obj, c.pre, "", 0)
		restored <- err
	}()
	select {
	case err := <-restored:
		require.ErrorIs(t, err, errJobNotRewritten)
	case <-time.After(hangGuard):
		t.Fatal("the restore never answered (it resolves the job again and again)")
	}
	sql := "SELECT 1;\n"
	code, env := upload(t, c.srv, d, "n.sql", sql)
	require.Equal(t, http.StatusOK, code, "%+v", env)
	code, env = call(t, c.srv.Client(), c.srv, http.MethodPost, "/v1/objects/"+d.obj+"/import/ingest", &d, map[string]string{"etag": md5hex(sql), "filename": "n.sql"})
	assert.Equal(t, http.StatusServiceUnavailable, code, "%+v", env)
	assert.Equal(t, `[{"id":1,"v":"imported","r":7},{"id":2,"v":"later","r":8}]`, c.th.rowsOf(t, d), "nothing changed")

	failWrites.Store(false)
	_, err := c.th.Restore(context.Background(), d.obj, c.pre, "", 0)
	require.NoError(t, err)
	jf := readJob(path)
	require.NotNil(t, jf)
	assert.Equal(t, "complete", jf.Status.Status)
	require.NotNil(t, jf.Status.Result)
	assert.Equal(t, c.before.Result.FinalBookmark, jf.Status.Result.FinalBookmark)
}

// TestImportUnsavedFinalJobFileBlocksHeaderChanges: a live import commits,
// then its final job-file write fails. The import answers complete (it is
// applied: an "error" would make the client retry into "table exists"),
// but its file still says "active" with its commit block, so the header's
// tag is the only record of the COMMIT: a restore and another import of
// the database are refused (503, retryable) instead of changing the header
// — after which a restart would resolve the job "interrupted: nothing was
// imported". A restart meanwhile answers complete (the tag is there). Once
// the disk takes the write again, the restore rewrites the file final and
// runs, and a restart answers complete although the header changed.
func TestImportUnsavedFinalJobFileBlocksHeaderChanges(t *testing.T) {
	store, err := history.NewDirStore(t.TempDir())
	require.NoError(t, err)
	th := historyHost(t, store)
	srv := serve(t, th)
	d := newDB("acct")
	th.mustInit(t, d)
	th.exec(t, d, "CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT, r INTEGER)")
	pre := th.archivedUpTo(t, d)
	th.clock.Advance(time.Second)

	// The job file's writes: 1 the ingest's, 2 the commit block's, 3 the
	// final one. The disk refuses the third and later ones while failing.
	var writes atomic.Int32
	var failing atomic.Bool
	failing.Store(true)
	th.Host.dump.hooks.saveJob = func(name string) error {
		if name == "f.sql" && writes.Add(1) >= 3 && failing.Load() {
			return errors.New("disk refused the job file")
		}
		return nil
	}
	ingest(t, srv, d, "f.sql", "INSERT INTO t VALUES (1, 'imported', 7);\n")
	st := waitImport(t, srv, d, "f.sql")
	require.Equal(t, "complete", st.Status, "%+v", st)
	path := filepath.Join(th.dir, "imports", d.obj, "jobs", "f.sql.json")
	jf := readJob(path)
	require.NotNil(t, jf)
	require.Equal(t, "active", jf.Status.Status, "the final write failed")
	require.NotNil(t, jf.Commit)

	_, err = th.Restore(context.Background(), d.obj, pre, "", 0)
	require.ErrorIs(t, err, errJobNotRewritten, "a restore would hide the import's tag")
	sql := "INSERT INTO t VALUES (2, 'next', 8);\n"
	code, env := upload(t, srv, d, "n.sql", sql)
	require.Equal(t, http.StatusOK, code, "%+v", env)
	code, env = call(t, srv.Client(), srv, http.MethodPost, "/v1/objects/"+d.obj+"/import/ingest", &d, map[string]string{"etag": md5hex(sql), "filename": "n.sql"})
	assert.Equal(t, http.StatusServiceUnavailable, code, "%+v", env)
	assert.Equal(t, `[{"id":1,"v":"imported","r":7}]`, th.rowsOf(t, d), "nothing changed the database")
	code, st2, env := pollOnce(t, srv, d, "f.sql")
	require.Equal(t, http.StatusOK, code, "%+v", env)
	assert.Equal(t, "complete", st2.Status, "the import stays complete meanwhile")

	// A restart now (the file still active): the header decides, complete.
	th.reopen(t)
	th.Host.dump.hooks.saveJob = func(string) error {
		if failing.Load() {
			return errors.New("disk refused the job file")
		}
		return nil
	}
	srv = serve(t, th)
	code, st2, env = pollOnce(t, srv, d, "f.sql")
	require.Equal(t, http.StatusOK, code, "%+v", env)
	assert.Equal(t, "complete", st2.Status, "after a restart: %+v", st2)
	_, err = th.Restore(context.Background(), d.obj, pre, "", 0)
	require.ErrorIs(t, err, errJobNotRewritten, "still refused after the restart")

	failing.Store(false)
	_, err = th.Restore(context.Background(), d.obj, pre, "", 0)
	require.NoError(t, err)
	assert.Equal(t, `[]`, th.rowsOf(t, d), "restored to before the import")
	jf = readJob(path)
	require.NotNil(t, jf)
	assert.Equal(t, "complete", jf.Status.Status, "the restore wrote the job file final first")

	th.reopen(t)
	srv = serve(t, th)
	code, st2, env = pollOnce(t, srv, d, "f.sql")
	require.Equal(t, http.StatusOK, code, "%+v", env)
	assert.Equal(t, "complete", st2.Status, "the header changed, the job file answers: %+v", st2)
}
