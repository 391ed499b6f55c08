package sqlexec

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func openTest(t testing.TB, opts Options) (*DB, string) {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, "db.sqlite")
	db, err := Open(path, opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	return db, path
}

func stmt(sql string, params ...any) Statement {
	s := Statement{SQL: sql}
	for _, p := range params {
		var raw json.RawMessage
		switch v := p.(type) {
		case json.RawMessage:
			raw = v
		default:
			b, err := json.Marshal(v)
			if err != nil {
				panic(err)
			}
			raw = b
		}
		s.Params = append(s.Params, raw)
	}
	return s
}

func run(t testing.TB, db *DB, stmts ...Statement) []StatementResult {
	t.Helper()
	res, err := db.Execute(context.Background(), Request{Statements: stmts})
	require.NoError(t, err)
	return res
}

func runErr(t testing.TB, db *DB, stmts ...Statement) *Error {
	t.Helper()
	res, err := db.Execute(context.Background(), Request{Statements: stmts})
	require.Error(t, err, "expected an error, got %d results", len(res))
	require.Nil(t, res)
	var e *Error
	require.True(t, errors.As(err, &e), "error %v is not *Error", err)
	return e
}

// rows returns the row objects of one result as maps.
func rowsOf(t testing.TB, r StatementResult) []map[string]any {
	t.Helper()
	b, err := json.Marshal(r.Results)
	require.NoError(t, err)
	var out []map[string]any
	dec := json.NewDecoder(bytesReader(b))
	dec.UseNumber()
	require.NoError(t, dec.Decode(&out))
	return out
}

func scalar(t testing.TB, db *DB, sqlText string) any {
	t.Helper()
	res := run(t, db, stmt(sqlText))
	require.Len(t, res, 1)
	rows := res[0].Results.(Rows)
	require.Len(t, rows, 1)
	return rows[0].Values()[0]
}

// hostConn opens the file with plain database/sql (mattn), standing in for
// the object host's own code, which may keep reserved tables in the file.
func hostConn(t testing.TB, path string) *sql.DB {
	t.Helper()
	h, err := sql.Open("sqlite3", path+"?_busy_timeout=5000")
	require.NoError(t, err)
	t.Cleanup(func() { _ = h.Close() })
	return h
}

func osMkdirTemp() (string, error) { return os.MkdirTemp("", "sqlexec-example") }

func runtimeGOMAXPROCS() int { return runtime.GOMAXPROCS(0) }

var benchEpoch = time.Now()

// nanotime is monotonic nanoseconds since the package's tests started.
func nanotime() int64 { return int64(time.Since(benchEpoch)) }
