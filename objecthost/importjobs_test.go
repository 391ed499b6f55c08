package objecthost

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
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
	code, st, env := pollOnce(t, srv, d, "f.sql")
	require.Equal(t, http.StatusOK, code, "%+v", env)
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
