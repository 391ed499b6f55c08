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

	"github.com/shoaldb/shoal/internal/d1body"
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
// results or an *Error, never create files beside the database (no
// ATTACH, VACUUM INTO, or temp databases in the directory), and SQL holding
// a NUL or invalid UTF-8 is always refused as invalid (never run up to the
// NUL).
func FuzzExecute(f *testing.F) {
	f.Add("SELECT ?1, typeof(?1)", []byte(`[1]`))
	f.Add("CREATE TABLE IF NOT EXISTS t(a, b); INSERT INTO t VALUES (?, ?)", []byte(`[1, "x"]`))
	f.Add("INSERT INTO t VALUES (?, ?)", []byte(`["a", [1,2,3]]`))
	f.Add("SELECT * FROM t WHERE a LIKE ?", []byte(`["%%%"]`))
	f.Add("WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM r) SELECT count(*) FROM r", []byte(`[]`))
	f.Add("SELECT ?", []byte(`{"a":1}`))
	f.Add("SELECT ?", []byte{0xff, 0x00})
	f.Add("INSERT INTO t VALUES (1); \x00 DELETE FROM t", []byte(`[]`))
	f.Add("SELECT '\xff'", []byte(`["a\u0000b"]`))
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
		badText := d1body.CheckString(sql) != nil
		for _, raw := range []bool{false, true} {
			res, err := db.Execute(context.Background(), Request{Statements: []Statement{{SQL: sql, Params: params}}, Raw: raw})
			if badText && (err == nil || !errors.Is(err, ErrInvalid)) {
				t.Fatalf("SQL %q with a NUL or invalid UTF-8 was not refused as invalid: %v", sql, err)
			}
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
// one statement, only parameters that bind, and SQL without NUL that is
// valid UTF-8, decoded from text the decoder kept exactly (d1body.CheckText).
func FuzzParseBody(f *testing.F) {
	f.Add([]byte(`{"sql": "SELECT ?", "params": [1, "a", null, true, [1,2], 1.5]}`))
	f.Add([]byte(`{"batch": [{"sql": "SELECT 1"}, {"sql": "SELECT ?", "params": ["x"]}]}`))
	f.Add([]byte(`{"sql": "x", "params": [{"a": 1}]}`))
	f.Add([]byte(`{"batch": []}`))
	f.Add([]byte(`[1,2]`))
	f.Add([]byte(`{"sql": "SELECT 1; \u0000 SELECT 2"}`))
	f.Add([]byte(`{"batch": [{"sql": "SELECT 1"}, {"sql": "SELECT ?\u0000", "params": ["\u0000"]}]}`))
	f.Add([]byte("{\"sql\": \"SELECT '\xff'\"}"))
	f.Add([]byte(`{"sql": "SELECT '\ud800'"}`))
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
		if terr := d1body.CheckText(body); terr != nil {
			t.Fatalf("accepted a body the decoder changes (%v): %q", terr, body)
		}
		for _, s := range req.Statements {
			if terr := d1body.CheckString(s.SQL); terr != nil {
				t.Fatalf("accepted SQL with %v: %q", terr, s.SQL)
			}
			for _, p := range s.Params {
				if _, err := decodeParam(p); err != nil {
					t.Fatalf("accepted a param that does not decode: %s", p)
				}
			}
		}
	})
}
