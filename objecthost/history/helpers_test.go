package history

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"
	_ "github.com/mattn/go-sqlite3"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/objecthost/sqlexec"
)

// env is one database under capture, shipping into a store.
type env struct {
	t       testing.TB
	dir     string
	key     string
	path    string
	store   Store
	archive *Archive
	db      *sqlexec.DB
	cap     *Capturer
	ship    *Shipper
	copts   CaptureOptions
	sopts   ShipperOptions
	cancel  context.CancelFunc
	done    chan struct{}
	// archived selects durability = "archived" (CaptureOptions.WaitArchived).
	archived bool
}

func newEnv(t testing.TB, store Store, copts CaptureOptions, sopts ShipperOptions) *env {
	return newEnvMode(t, store, copts, sopts, false)
}

func newEnvMode(t testing.TB, store Store, copts CaptureOptions, sopts ShipperOptions, archived bool) *env {
	dir := t.TempDir()
	key := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return '_'
	}, "db-"+t.Name())
	e := &env{t: t, dir: dir, key: key, store: store, archive: NewArchive(store), archived: archived}
	if len(e.key) > 100 {
		e.key = e.key[:100]
	}
	e.path = filepath.Join(dir, "data", "x.db")
	require.NoError(t, mkdirAll(filepath.Dir(e.path)))
	copts.StagingDir = filepath.Join(dir, "staging")
	if sopts.Logger == nil {
		sopts.Logger = slog.New(slog.DiscardHandler) // failed shipments are expected in outage tests
	}
	e.copts, e.sopts = copts, sopts
	e.open()
	t.Cleanup(e.close)
	return e
}

// open opens the database, attaches a capturer and starts a shipper.
func (e *env) open() {
	t := e.t
	e.ship = NewShipper(e.store, e.sopts)
	copts := e.copts
	copts.OnAppend = e.ship.Notify
	if e.archived {
		copts.WaitArchived = e.ship.WaitArchived
	}
	c, err := NewCapturer(e.key, e.path, copts)
	require.NoError(t, err)
	db, err := sqlexec.Open(e.path, sqlexec.Options{ReadConns: 2})
	require.NoError(t, err)
	require.NoError(t, c.Attach(context.Background(), db))
	e.db, e.cap = db, c
	e.ship.Add(c)
	if e.archived {
		c.ArmArchived()
	}
	ctx, cancel := context.WithCancel(context.Background())
	e.cancel, e.done = cancel, make(chan struct{})
	go func() { defer close(e.done); e.ship.Run(ctx) }()
}

// close flushes, ships everything and closes (idempotent).
func (e *env) close() {
	if e.db == nil {
		return
	}
	require.NoError(e.t, e.cap.Flush())
	require.NoError(e.t, e.db.Close())
	require.NoError(e.t, e.ship.Sync(context.Background(), e.cap))
	e.cancel()
	<-e.done
	e.ship.Remove(e.cap)
	require.NoError(e.t, e.cap.Close())
	e.db = nil
}

// sync ships every commit made so far: capture runs a few commits behind
// the writer, so it first waits until they are captured (Exact), then
// seals and ships (without the wait, a sync could ship a batch's commits
// only in part, and TestArchiveObjectLostBehindTheHostsBack's "host ships
// on" then shipped nothing: flaky under -race and load).
func (e *env) sync() {
	_, err := e.cap.Exact()
	require.NoError(e.t, err)
	require.NoError(e.t, e.ship.Sync(context.Background(), e.cap))
}

func (e *env) exec(sqlText string, params ...any) []sqlexec.StatementResult {
	e.t.Helper()
	res, err := execOn(e.db, sqlText, params...)
	require.NoError(e.t, err, sqlText)
	return res
}

func execOn(db *sqlexec.DB, sqlText string, params ...any) ([]sqlexec.StatementResult, error) {
	st := sqlexec.Statement{SQL: sqlText}
	for _, p := range params {
		b, err := json.Marshal(p)
		if err != nil {
			return nil, err
		}
		st.Params = append(st.Params, b)
	}
	return db.Execute(context.Background(), sqlexec.Request{Statements: []sqlexec.Statement{st}, Raw: true})
}

// dumpFile is the logical content of a closed database file, read with a
// plain SQLite connection: the schema (every sqlite_schema row) and every
// table's rows in rowid order, values typed. It also runs
// PRAGMA integrity_check.
func dumpFile(t testing.TB, path string) string {
	t.Helper()
	conn, err := sql.Open("sqlite3", "file:"+path+"?mode=ro")
	require.NoError(t, err)
	defer conn.Close()
	var ic string
	require.NoError(t, conn.QueryRow("PRAGMA integrity_check").Scan(&ic))
	require.Equal(t, "ok", ic, "integrity_check of %s", path)
	return dumpConn(t, conn)
}

func dumpConn(t testing.TB, conn *sql.DB) string {
	t.Helper()
	var b strings.Builder
	rows, err := conn.Query("SELECT type, name, tbl_name, coalesce(sql,'') FROM sqlite_schema ORDER BY type, name")
	require.NoError(t, err)
	var tables []string
	for rows.Next() {
		var typ, name, tbl, s string
		require.NoError(t, rows.Scan(&typ, &name, &tbl, &s))
		fmt.Fprintf(&b, "schema %s %s %s %s\n", typ, name, tbl, s)
		if typ == "table" && !strings.HasPrefix(name, "sqlite_") {
			tables = append(tables, name)
		}
	}
	require.NoError(t, rows.Err())
	rows.Close()
	sort.Strings(tables)
	for _, tb := range tables {
		fmt.Fprintf(&b, "table %s\n", tb)
		r, err := conn.Query(fmt.Sprintf(`SELECT * FROM "%s" ORDER BY rowid`, tb))
		require.NoError(t, err)
		cols, _ := r.Columns()
		for r.Next() {
			vals := make([]any, len(cols))
			ptrs := make([]any, len(cols))
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			require.NoError(t, r.Scan(ptrs...))
			for _, v := range vals {
				switch x := v.(type) {
				case []byte:
					fmt.Fprintf(&b, "blob:%x|", x)
				default:
					fmt.Fprintf(&b, "%T:%v|", x, x)
				}
			}
			b.WriteString("\n")
		}
		require.NoError(t, r.Err())
		r.Close()
	}
	return b.String()
}

// s3Server is gofakes3 served over real HTTP on loopback, with a switch
// that makes it answer 503 (the store is "down").
type s3Server struct {
	srv  *httptest.Server
	down atomic.Bool
	reqs atomic.Int64
}

func newS3(t testing.TB) (*s3Server, *S3Store) {
	backend := s3mem.New()
	faker := gofakes3.New(backend)
	s := &s3Server{}
	h := faker.Server()
	s.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.reqs.Add(1)
		if s.down.Load() {
			http.Error(w, "unavailable", http.StatusServiceUnavailable)
			return
		}
		h.ServeHTTP(w, r)
	}))
	// gofakes3 writes some error headers twice; net/http logs each one.
	s.srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	s.srv.Start()
	t.Cleanup(s.srv.Close)
	require.NoError(t, backend.CreateBucket("archive"))
	st, err := NewS3Store(S3Config{
		Endpoint: strings.TrimPrefix(s.srv.URL, "http://"), Bucket: "archive", Prefix: "shoal/",
		Region: "us-east-1", AccessKey: "test", SecretKey: "testtesttest", PathStyle: true,
	})
	require.NoError(t, err)
	return s, st
}

func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond) // poll interval of a wait for the condition above (the event itself)
	}
}
