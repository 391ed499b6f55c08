package objecthost

import (
	"bytes"
	"context"
	"crypto/md5"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/objecthost/sqlexec"
)

func dumpTestSetup(t *testing.T) (*testHost, *httptest.Server, db) {
	th := newTestHost(t, nil)
	srv := httptest.NewServer(th.Handler())
	t.Cleanup(srv.Close)
	d := newDB("acct-1")
	th.mustInit(t, d)
	return th, srv, d
}

func mustExec(t *testing.T, th *testHost, d db, sql string) []sqlexec.StatementResult {
	t.Helper()
	res, err := th.Query(context.Background(), d.obj, d.id(), sqlexec.Request{Statements: []sqlexec.Statement{{SQL: sql}}})
	require.NoError(t, err)
	return res
}

func download(t *testing.T, srv *httptest.Server, d db, query string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, srv.URL+"/v1/objects/"+d.obj+"/export/download"+query, nil)
	require.NoError(t, err)
	req.Header.Set(HeaderDatabase, d.uuid)
	req.Header.Set(HeaderAccount, d.account)
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

func upload(t *testing.T, srv *httptest.Server, d db, name, body string) (int, envelope) {
	t.Helper()
	return call(t, srv.Client(), srv, http.MethodPut, "/v1/objects/"+d.obj+"/import/upload/"+name, &d, body)
}

func md5hex(s string) string { h := md5.Sum([]byte(s)); return hex.EncodeToString(h[:]) }

// waitImport polls until the job leaves "active" (no timing assertion: the
// deadline only bounds a hung test).
func waitImport(t *testing.T, srv *httptest.Server, d db, bookmark string) ImportStatus {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, env := call(t, srv.Client(), srv, http.MethodPost, "/v1/objects/"+d.obj+"/import/poll", &d, map[string]string{"current_bookmark": bookmark})
		require.Equal(t, http.StatusOK, code, "%+v", env)
		var st ImportStatus
		require.NoError(t, json.Unmarshal(env.Result, &st))
		if st.Status != "active" {
			return st
		}
		require.True(t, time.Now().Before(deadline), "import never finished")
		time.Sleep(10 * time.Millisecond) // poll interval of a wait for the condition above (the event itself)
	}
}

func TestExportEndpoints(t *testing.T) {
	th, srv, d := dumpTestSetup(t)
	// Never queried: no file yet, the dump is empty but valid.
	code, body := download(t, srv, d, "")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "PRAGMA defer_foreign_keys=TRUE;\n", body) // dump.Header: an empty database

	mustExec(t, th, d, "CREATE TABLE a(x); CREATE TABLE b(y); INSERT INTO a VALUES (1); INSERT INTO b VALUES ('two')")
	code, env := call(t, srv.Client(), srv, http.MethodPost, "/v1/objects/"+d.obj+"/export", &d, map[string]any{"tables": []string{"a"}})
	require.Equal(t, http.StatusOK, code)
	require.JSONEq(t, `{"tables":["a","b"]}`, string(env.Result))
	code, env = call(t, srv.Client(), srv, http.MethodPost, "/v1/objects/"+d.obj+"/export", &d, map[string]any{"tables": []string{"zzz"}})
	require.Equal(t, http.StatusBadRequest, code)
	require.Contains(t, env.Errors[0].Message, "no such table: zzz")

	code, body = download(t, srv, d, "?table=b")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `INSERT INTO "b"("y") VALUES('two');`)
	require.NotContains(t, body, "CREATE TABLE a")
	code, body = download(t, srv, d, "?no_data=1")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "CREATE TABLE a(x);")
	require.NotContains(t, body, "INSERT")
	code, _ = download(t, srv, d, "?table=zzz")
	require.Equal(t, http.StatusBadRequest, code)

	// Identity is checked like queries: another database is 421.
	other := d
	other.uuid = newDB("x").uuid
	code, _ = download(t, srv, other, "")
	require.Equal(t, http.StatusMisdirectedRequest, code)
	_, err := th.Delete(context.Background(), d.obj, 2)
	require.NoError(t, err)
	code, _ = download(t, srv, d, "")
	require.Equal(t, http.StatusGone, code)
}

func TestImportEndpoints(t *testing.T) {
	th, srv, d := dumpTestSetup(t)
	mustExec(t, th, d, "CREATE TABLE keep(x); INSERT INTO keep VALUES (1)")
	sql := "PRAGMA foreign_keys=OFF;\nBEGIN TRANSACTION;\nCREATE TABLE t(x INTEGER, y TEXT);\nINSERT INTO t VALUES (1, 'a;b');\nINSERT INTO t VALUES (2, NULL);\nCOMMIT;\n"

	code, env := upload(t, srv, d, "f1.sql", sql)
	require.Equal(t, http.StatusOK, code, "%+v", env)
	var up UploadResult
	require.NoError(t, json.Unmarshal(env.Result, &up))
	require.Equal(t, md5hex(sql), up.Etag)
	require.Equal(t, int64(len(sql)), up.Size)

	code, env = call(t, srv.Client(), srv, http.MethodPost, "/v1/objects/"+d.obj+"/import/ingest", &d, map[string]string{"etag": md5hex("other"), "filename": "f1.sql"})
	require.Equal(t, http.StatusBadRequest, code)
	require.Contains(t, env.Errors[0].Message, "etag mismatch")
	code, _ = call(t, srv.Client(), srv, http.MethodPost, "/v1/objects/"+d.obj+"/import/ingest", &d, map[string]string{"etag": up.Etag, "filename": "nope.sql"})
	require.Equal(t, http.StatusBadRequest, code)
	code, _ = upload(t, srv, d, "..%2Fescape", sql)
	require.NotEqual(t, http.StatusOK, code)

	code, env = call(t, srv.Client(), srv, http.MethodPost, "/v1/objects/"+d.obj+"/import/ingest", &d, map[string]string{"etag": up.Etag, "filename": "f1.sql"})
	require.Equal(t, http.StatusOK, code, "%+v", env)
	st := waitImport(t, srv, d, "f1.sql")
	require.Equal(t, "complete", st.Status, "%+v", st)
	require.Equal(t, int64(3), st.Result.NumQueries)
	// 2 rows + the CREATE TABLE's 2 writes of its sqlite_schema row (D1 counts schema writes).
	require.Equal(t, int64(2+2), st.Result.Meta.RowsWritten)

	res := mustExec(t, th, d, "SELECT count(*) AS n FROM t")
	n, _ := res[0].Results.(sqlexec.Rows)[0].Get("n")
	require.EqualValues(t, 2, n)
	// Usage was recorded for the rows the import wrote.
	var written int64
	for _, e := range th.sink.Usage() {
		written += e.RowsWritten
	}
	require.GreaterOrEqual(t, written, int64(2))

	// A failing statement in the middle: nothing of the file applies.
	bad := "INSERT INTO t VALUES (3, 'x');\nINSERT INTO missing VALUES (1);\nINSERT INTO t VALUES (4, 'y');\n"
	code, _ = upload(t, srv, d, "f2.sql", bad)
	require.Equal(t, http.StatusOK, code)
	code, _ = call(t, srv.Client(), srv, http.MethodPost, "/v1/objects/"+d.obj+"/import/ingest", &d, map[string]string{"etag": md5hex(bad), "filename": "f2.sql"})
	require.Equal(t, http.StatusOK, code)
	st = waitImport(t, srv, d, "f2.sql")
	require.Equal(t, "error", st.Status)
	require.Contains(t, st.Error, "statement 2 (line 2)")
	require.Contains(t, st.Error, "no such table: missing")
	res = mustExec(t, th, d, "SELECT count(*) AS n FROM t")
	n, _ = res[0].Results.(sqlexec.Rows)[0].Get("n")
	require.EqualValues(t, 2, n)

	// Writes through the normal path still work after an import.
	mustExec(t, th, d, "INSERT INTO t VALUES (5, 'after')")
	code, body := download(t, srv, d, "?table=t")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, 3, strings.Count(body, `INSERT INTO "t"`))
	require.False(t, bytes.Contains([]byte(body), []byte("missing")))
}

// Host.Close during an import stops the job (it is counted in the host's
// WaitGroup) and rolls it back: after a restart nothing of it is there.
func TestImportStoppedByClose(t *testing.T) {
	th, srv, d := dumpTestSetup(t)
	var b strings.Builder
	b.WriteString("CREATE TABLE t(x);\n")
	for i := 0; i < 200_000; i++ {
		b.WriteString("INSERT INTO t VALUES (1);\n")
	}
	sql := b.String()
	code, _ := upload(t, srv, d, "big.sql", sql)
	require.Equal(t, http.StatusOK, code)
	code, _ = call(t, srv.Client(), srv, http.MethodPost, "/v1/objects/"+d.obj+"/import/ingest", &d, map[string]string{"etag": md5hex(sql), "filename": "big.sql"})
	require.Equal(t, http.StatusOK, code)
	require.NoError(t, th.Host.Close()) // waits for the job
	th.open(t)
	_, err := th.Query(context.Background(), d.obj, d.id(), sqlexec.Request{Statements: []sqlexec.Statement{{SQL: "SELECT count(*) FROM t"}}})
	require.ErrorContains(t, err, "no such table: t")
}

// Account limits that block user writes block imports too.
func TestImportRefusedOverStorageLimit(t *testing.T) {
	th, srv, d := dumpTestSetup(t)
	sql := "CREATE TABLE t(x);\n"
	code, _ := upload(t, srv, d, "s.sql", sql)
	require.Equal(t, http.StatusOK, code)
	th.accMu.Lock()
	th.accounts[d.account] = &accountState{blockGrowth: true}
	th.accMu.Unlock()
	code, env := call(t, srv.Client(), srv, http.MethodPost, "/v1/objects/"+d.obj+"/import/ingest", &d, map[string]string{"etag": md5hex(sql), "filename": "s.sql"})
	require.Equal(t, http.StatusBadRequest, code)
	require.Equal(t, 7504, errCode(env))
}

// While an import runs, a user write to the same database waits for it
// and succeeds after its commit (it needs the table the import creates) —
// not a busy-timeout failure — and reads are answered meanwhile.
func TestImportConcurrentQuery(t *testing.T) {
	th, srv, d := dumpTestSetup(t)
	mustExec(t, th, d, "CREATE TABLE keep(x); INSERT INTO keep VALUES (1)")
	var b strings.Builder
	b.WriteString("CREATE TABLE t(x);\n")
	for i := 0; i < 50_000; i++ { // long enough to overlap; short enough for -race under load (the waiting write has a 30 s limit)
		b.WriteString("INSERT INTO t VALUES (1);\n")
	}
	sql := b.String()
	code, _ := upload(t, srv, d, "big.sql", sql)
	require.Equal(t, http.StatusOK, code)
	code, _ = call(t, srv.Client(), srv, http.MethodPost, "/v1/objects/"+d.obj+"/import/ingest", &d, map[string]string{"etag": md5hex(sql), "filename": "big.sql"})
	require.Equal(t, http.StatusOK, code)
	// Wait until the import is under way (it holds the writer from its
	// first statement on).
	for {
		_, env := call(t, srv.Client(), srv, http.MethodPost, "/v1/objects/"+d.obj+"/import/poll", &d, map[string]string{})
		var st ImportStatus
		require.NoError(t, json.Unmarshal(env.Result, &st))
		require.Equal(t, "active", st.Status, "the import ended before it was seen running: %+v", st)
		if st.Progress.Statements > 0 {
			break
		}
		time.Sleep(time.Millisecond) // poll interval of a wait for the condition above (the event itself)
	}
	res := mustExec(t, th, d, "SELECT count(*) AS n FROM keep")
	n, _ := res[0].Results.(sqlexec.Rows)[0].Get("n")
	require.EqualValues(t, 1, n, "reads are served during the import")
	// Table t exists only once the import commits: this write succeeds
	// only by waiting for it.
	mustExec(t, th, d, "INSERT INTO t VALUES (-1)")
	st := waitImport(t, srv, d, "big.sql")
	require.Equal(t, "complete", st.Status, "%+v", st)
	// 50,000 rows + the CREATE TABLE's 2 writes of its sqlite_schema row (D1 counts schema writes).
	require.Equal(t, int64(50_000+2), st.Result.Meta.RowsWritten)
	res = mustExec(t, th, d, "SELECT count(*) AS n FROM t")
	n, _ = res[0].Results.(sqlexec.Rows)[0].Get("n")
	require.EqualValues(t, 50_001, n)
}
