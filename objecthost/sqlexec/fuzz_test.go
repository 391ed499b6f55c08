package sqlexec

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func hostileSeeds(f *testing.F) []string {
	file, err := os.Open("testdata/hostile.sql")
	if err != nil {
		f.Fatal(err)
	}
	defer file.Close()
	var out []string
	sc := bufio.NewScanner(file)
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" && !strings.HasPrefix(l, "--") {
			out = append(out, l)
		}
	}
	return out
}

// FuzzExecute: arbitrary SQL and parameter bytes never panic, always give
// results or an *Error, and never create files beside the database (no
// ATTACH, VACUUM INTO, or temp databases in the directory).
func FuzzExecute(f *testing.F) {
	f.Add("SELECT ?1, typeof(?1)", []byte(`[1]`))
	f.Add("CREATE TABLE IF NOT EXISTS t(a, b); INSERT INTO t VALUES (?, ?)", []byte(`[1, "x"]`))
	f.Add("INSERT INTO t VALUES (?, ?)", []byte(`["a", [1,2,3]]`))
	f.Add("SELECT * FROM t WHERE a LIKE ?", []byte(`["%%%"]`))
	f.Add("WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM r) SELECT count(*) FROM r", []byte(`[]`))
	f.Add("SELECT ?", []byte(`{"a":1}`))
	f.Add("SELECT ?", []byte{0xff, 0x00})
	for _, s := range hostileSeeds(f) {
		f.Add(s, []byte(`[]`))
	}

	dir := f.TempDir()
	path := filepath.Join(dir, "fuzz.db")
	lim := DefaultLimits()
	lim.QueryTimeout = 100 * time.Millisecond
	lim.MaxDatabaseBytes = 8 << 20
	db, err := Open(path, Options{Limits: lim, ReadConns: 1})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { db.Close() })
	allowed := map[string]bool{"fuzz.db": true, "fuzz.db-wal": true, "fuzz.db-shm": true}

	f.Fuzz(func(t *testing.T, sql string, paramBytes []byte) {
		var params []json.RawMessage
		if json.Unmarshal(paramBytes, &params) != nil {
			params = []json.RawMessage{paramBytes}
		}
		for _, raw := range []bool{false, true} {
			res, err := db.Execute(context.Background(), Request{Statements: []Statement{{SQL: sql, Params: params}}, Raw: raw})
			if err != nil {
				var e *Error
				if !errors.As(err, &e) {
					t.Fatalf("error is not *Error: %v", err)
				}
				if e.Message == "" || e.Code == 0 {
					t.Fatalf("empty error: %#v", e)
				}
				if strings.Contains(e.Message, dir) {
					t.Fatalf("error leaks the path: %s", e.Message)
				}
				continue
			}
			if _, err := json.Marshal(res); err != nil {
				t.Fatalf("result does not marshal: %v", err)
			}
		}
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if !allowed[e.Name()] {
				t.Fatalf("file %q appeared beside the database", e.Name())
			}
		}
	})
}

// FuzzParseBody: arbitrary bodies never panic; accepted bodies hold at least
// one statement and only parameters that bind.
func FuzzParseBody(f *testing.F) {
	f.Add([]byte(`{"sql": "SELECT ?", "params": [1, "a", null, true, [1,2], 1.5]}`))
	f.Add([]byte(`{"batch": [{"sql": "SELECT 1"}, {"sql": "SELECT ?", "params": ["x"]}]}`))
	f.Add([]byte(`{"sql": "x", "params": [{"a": 1}]}`))
	f.Add([]byte(`{"batch": []}`))
	f.Add([]byte(`[1,2]`))
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := ParseBody(body)
		if err != nil {
			var e *Error
			if !errors.As(err, &e) || e.Code == 0 {
				t.Fatalf("error is not a coded *Error: %v", err)
			}
			return
		}
		if len(req.Statements) == 0 {
			t.Fatal("accepted a body without statements")
		}
		for _, s := range req.Statements {
			for _, p := range s.Params {
				if _, err := decodeParam(p); err != nil {
					t.Fatalf("accepted a param that does not decode: %s", p)
				}
			}
		}
	})
}
