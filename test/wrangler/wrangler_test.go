// Package wrangler runs Cloudflare's own D1 clients, unmodified, against
// `shoal dev`: wrangler 3.114.17 and 4.86.0 (the newest 4.x that runs on
// Node 20) and the TypeScript SDK cloudflare@7.3.0, installed by
// install.sh into node_modules/ from the committed package-lock.json. The
// only thing pointed at Shoal is the API base URL
// (CLOUDFLARE_API_BASE_URL), as a user would.
//
// Every step asserts what the user sees (exit code and output) and what
// is really on the server afterwards (through the REST API). Without node
// or the installed packages the test skips, or fails with
// SHOAL_REQUIRE_NODE=1 (CI sets it); without clickhouse-server the
// analytics steps (info's 24 h figures, insights) skip likewise unless
// SHOAL_REQUIRE_CLICKHOUSE=1.
package wrangler

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/shoaldb/shoal/test/harness"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// clients are the wrangler CLIs under test, by the npm alias they are
// installed under (package.json).
var clients = []struct{ name, pkg, version string }{
	{"v3", "wrangler3", "3.114.17"},
	{"v4", "wrangler", "4.86.0"},
}

func here(t *testing.T) string {
	t.Helper()
	wd, err := os.Getwd()
	require.NoError(t, err)
	return wd
}

// shoalBin is built once per test binary (removed by TestMain), or is
// $SHOAL_TEST_BIN.
var shoalBin harness.Binary

func TestMain(m *testing.M) {
	code := m.Run()
	shoalBin.Remove()
	os.Exit(code)
}

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// dev is a running `shoal dev`.
type dev struct {
	url, account, token string
	analytics           bool // ClickHouse started
	out                 *syncBuf
}

func startDev(t *testing.T, bin string) *dev {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "dev")
	addr := harness.FreeAddr(t)
	out := &syncBuf{}
	cmd := exec.Command(bin, "dev", "--dir", dir, "--reset", "--addr", addr, "--base-port", fmt.Sprint(harness.DevBasePort(t)))
	cmd.Stdout, cmd.Stderr = out, out
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	require.Eventually(t, func() bool {
		return strings.Contains(out.String(), "Press Ctrl-C")
	}, 90*time.Second, 100*time.Millisecond, "shoal dev never became ready: %s", out)
	b, err := os.ReadFile(filepath.Join(dir, "dev.json"))
	require.NoError(t, err)
	var cfg struct {
		AccountID string `json:"account_id"`
		Token     string `json:"token"`
	}
	require.NoError(t, json.Unmarshal(b, &cfg))
	return &dev{url: "http://" + addr, account: cfg.AccountID, token: cfg.Token,
		analytics: strings.Contains(out.String(), "Analytics   ClickHouse"), out: out}
}

// envelope is the v4 answer.
type envelope struct {
	Result  json.RawMessage `json:"result"`
	Success bool            `json:"success"`
	Errors  []struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"errors"`
}

// api calls the REST API directly: the test's own view of the server.
func (d *dev) api(t *testing.T, method, path string, body any) (int, envelope) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		j, err := json.Marshal(body)
		require.NoError(t, err)
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequest(method, d.url+"/client/v4"+path, rd)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+d.token)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var env envelope
	require.NoError(t, json.Unmarshal(raw, &env), "%s", raw)
	return resp.StatusCode, env
}

func (d *dev) dbPath(id string) string {
	p := "/accounts/" + d.account + "/d1/database"
	if id != "" {
		p += "/" + id
	}
	return p
}

// rows runs one statement through the REST API and returns its rows.
func (d *dev) rows(t *testing.T, db, sql string) []map[string]any {
	t.Helper()
	st, env := d.api(t, "POST", d.dbPath(db)+"/query", map[string]any{"sql": sql})
	require.Equal(t, 200, st, "%s: %+v", sql, env)
	var res []struct {
		Results []map[string]any `json:"results"`
	}
	require.NoError(t, json.Unmarshal(env.Result, &res))
	require.Len(t, res, 1)
	return res[0].Results
}

// run is one CLI invocation's outcome.
type run struct {
	code           int
	stdout, stderr string
	took           time.Duration
}

func (r run) String() string {
	return fmt.Sprintf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
}

// cli runs node programs in a project folder of their own, with a HOME of
// their own (wrangler writes logs and caches there) and only the variables
// a user would set.
type cli struct {
	t    *testing.T
	node string
	dir  string
	env  []string
	mu   *sync.Mutex
	runs *[]time.Duration // every run's wall time, for the timing report
}

func (d *dev) cli(t *testing.T, node string, withAccount bool) *cli {
	dir := t.TempDir()
	home := t.TempDir()
	env := []string{
		"PATH=" + os.Getenv("PATH"), "HOME=" + home, "XDG_CONFIG_HOME=" + filepath.Join(home, ".config"),
		"CLOUDFLARE_API_BASE_URL=" + d.url + "/client/v4", "CLOUDFLARE_API_TOKEN=" + d.token,
		"WRANGLER_SEND_METRICS=false", "CI=true", "NO_COLOR=1", "FORCE_COLOR=0",
	}
	if withAccount {
		env = append(env, "CLOUDFLARE_ACCOUNT_ID="+d.account)
	}
	return &cli{t: t, node: node, dir: dir, env: env, mu: &sync.Mutex{}, runs: &[]time.Duration{}}
}

func (c *cli) script(name string, args ...string) run {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.node, append([]string{name}, args...)...)
	cmd.Dir, cmd.Env = c.dir, c.env
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	start := time.Now()
	err := cmd.Run()
	r := run{stdout: out.String(), stderr: errb.String(), took: time.Since(start)}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	case err != nil:
		require.NoError(c.t, err)
	}
	c.mu.Lock()
	*c.runs = append(*c.runs, r.took)
	c.mu.Unlock()
	return r
}

// jsonOut decodes the JSON value a command printed on stdout (wrangler
// prints its banner elsewhere with --json; anything before the value is
// skipped).
func jsonOut(t *testing.T, r run, v any) {
	t.Helper()
	i := strings.IndexAny(r.stdout, "[{")
	require.GreaterOrEqual(t, i, 0, "no JSON in the output: %s", r)
	require.NoError(t, json.NewDecoder(strings.NewReader(r.stdout[i:])).Decode(v), "%s", r)
}

// timing summarises run times: how many, total, fastest and slowest.
func timing(runs []time.Duration) string {
	if len(runs) == 0 {
		return "no runs"
	}
	var total time.Duration
	lo, hi := runs[0], runs[0]
	for _, d := range runs {
		total += d
		lo, hi = min(lo, d), max(hi, d)
	}
	return fmt.Sprintf("%d runs, %.1f s (%.1f–%.1f s each)", len(runs), total.Seconds(), lo.Seconds(), hi.Seconds())
}

var databaseID = regexp.MustCompile(`"?database_id"?\s*[:=]\s*"([0-9a-f-]{36})"`)

// bookmarkRe and undoRe read the bookmarks wrangler prints: `time-travel
// info`'s current one, and `restore`'s "restore to the previous bookmark".
var (
	bookmarkRe = regexp.MustCompile(`current bookmark is '([0-9a-f-]+)'`)
	undoRe     = regexp.MustCompile(`previous bookmark: ([0-9a-f-]+)`)
)

func TestWranglerAndSDK(t *testing.T) {
	node := harness.RequireNode(t, here(t), "wrangler", "wrangler3", "cloudflare")
	bin := shoalBin.Path(t)
	d := startDev(t, bin)
	start := time.Now()
	for _, w := range clients {
		t.Run(w.name, func(t *testing.T) {
			wrangler := filepath.Join(here(t), "node_modules", w.pkg, "bin", "wrangler.js")
			c := d.cli(t, node, true)
			wranglerFlow(t, d, c, wrangler, w.name, w.version)
			t.Logf("wrangler %s: %s", w.version, timing(*c.runs))
		})
	}
	t.Run("sdk", func(t *testing.T) {
		c := d.cli(t, node, true)
		c.env = append(c.env, "SHOAL_BASE_URL="+d.url+"/client/v4")
		r := c.script(filepath.Join(here(t), "sdk.mjs"), "sdk-db")
		require.Equal(t, 0, r.code, "%s", r)
		var got struct {
			UUID         string `json:"uuid"`
			CopyUUID     string `json:"copy_uuid"`
			QueryRows    int    `json:"query_rows"`
			ImportedRows int    `json:"imported_rows"`
			Deleted      bool   `json:"deleted"`
		}
		jsonOut(t, r, &got)
		assert.Equal(t, 2, got.QueryRows)
		assert.Equal(t, 2, got.ImportedRows)
		assert.True(t, got.Deleted)
		for _, id := range []string{got.UUID, got.CopyUUID} {
			st, env := d.api(t, "GET", d.dbPath(id), nil)
			assert.Equal(t, 404, st, "deleted by the SDK: %+v", env)
		}
		t.Logf("sdk script: %.1fs", r.took.Seconds())
	})
	t.Logf("all clients: %.1fs", time.Since(start).Seconds())
}

// wranglerFlow is every API-backed d1 command of one wrangler version.
func wranglerFlow(t *testing.T, d *dev, c *cli, wrangler, v, version string) {
	w := func(args ...string) run { return c.script(wrangler, args...) }

	r := w("--version")
	require.Equal(t, 0, r.code, "%s", r)
	require.Contains(t, r.stdout, version)

	// whoami: /user/tokens/verify (code 1000: an account token), /user,
	// /accounts, /memberships.
	r = w("whoami")
	require.Equal(t, 0, r.code, "%s", r)
	assert.Contains(t, r.stdout, "You are logged in with an Account API Token, associated with the account dev")
	assert.Contains(t, r.stdout, d.account)

	// create --location
	name := "shop-" + v
	r = w("d1", "create", name, "--location", "weur")
	require.Equal(t, 0, r.code, "%s", r)
	assert.Contains(t, r.stdout, "Successfully created DB '"+name+"' in region WEUR")
	m := databaseID.FindStringSubmatch(r.stdout)
	require.NotNil(t, m, "no database_id printed: %s", r)
	id := m[1]
	st, env := d.api(t, "GET", d.dbPath(id), nil)
	require.Equal(t, 200, st, "%+v", env)
	assert.Contains(t, string(env.Result), `"running_in_region":"WEUR"`)

	// create --jurisdiction: wrangler 4 sends it; dev's one host serves no
	// jurisdiction, so the create is refused as final (no retry), and
	// nothing is created. wrangler 3.114 has no --jurisdiction.
	r = w("d1", "create", "eu-"+v, "--jurisdiction", "eu")
	assert.NotEqual(t, 0, r.code, "%s", r)
	if v == "v3" {
		assert.Contains(t, r.stderr+r.stdout, "Unknown argument: jurisdiction")
	} else {
		assert.Contains(t, r.stderr+r.stdout, `no object host of this deployment serves jurisdiction "eu"`)
		assert.Contains(t, r.stderr+r.stdout, "[code: 7400]")
	}
	st, env = d.api(t, "GET", d.dbPath("")+"?name=eu-"+v, nil)
	require.Equal(t, 200, st)
	assert.JSONEq(t, `[]`, string(env.Result), "nothing was created")

	// list
	r = w("d1", "list", "--json")
	require.Equal(t, 0, r.code, "%s", r)
	var list []struct{ UUID, Name string }
	jsonOut(t, r, &list)
	assert.Contains(t, list, struct{ UUID, Name string }{id, name})

	// execute --command
	r = w("d1", "execute", name, "--remote", "--json", "--command",
		"CREATE TABLE items(id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL, price REAL); INSERT INTO items(name, price) VALUES ('apple', 1.5), ('pear', 2); SELECT name FROM items ORDER BY id")
	require.Equal(t, 0, r.code, "%s", r)
	var res []struct {
		Results []map[string]any `json:"results"`
		Success bool             `json:"success"`
	}
	jsonOut(t, r, &res)
	require.Len(t, res, 3, "%s", r)
	assert.Equal(t, []map[string]any{{"name": "apple"}, {"name": "pear"}}, res[2].Results)

	// execute --file: upload (ETag = MD5), ingest, poll.
	file := filepath.Join(c.dir, "seed.sql")
	require.NoError(t, os.WriteFile(file, []byte("CREATE TABLE tags(item INTEGER REFERENCES items(id), tag TEXT);\nINSERT INTO tags VALUES (1, 'fruit');\nINSERT INTO tags VALUES (2, 'fruit; green');\n"), 0o644))
	r = w("d1", "execute", name, "--remote", "--file", file)
	require.Equal(t, 0, r.code, "%s", r)
	assert.Equal(t, []map[string]any{{"n": 2.0}}, d.rows(t, id, "SELECT count(*) AS n FROM tags"))
	// A failing file: wrangler says which statement, exits non-zero, and
	// nothing of the file is applied.
	bad := filepath.Join(c.dir, "bad.sql")
	require.NoError(t, os.WriteFile(bad, []byte("INSERT INTO tags VALUES (3, 'x');\nINSERT INTO nope VALUES (1);\n"), 0o644))
	r = w("d1", "execute", name, "--remote", "--file", bad)
	assert.NotEqual(t, 0, r.code, "%s", r)
	assert.Contains(t, r.stdout+r.stderr, "statement 2 (line 2) failed: no such table: nope")
	assert.Equal(t, []map[string]any{{"n": 2.0}}, d.rows(t, id, "SELECT count(*) AS n FROM tags"), "all or nothing")

	// export --remote, in D1's format, with each option.
	exp := func(out string, opts ...string) string {
		t.Helper()
		path := filepath.Join(c.dir, out)
		r := w(append([]string{"d1", "export", name, "--remote", "--output", path}, opts...)...)
		require.Equal(t, 0, r.code, "%s", r)
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		s := string(b)
		require.True(t, strings.HasPrefix(s, "PRAGMA defer_foreign_keys=TRUE;\n"), "%s", s)
		assert.NotContains(t, s, "BEGIN TRANSACTION")
		assert.NotContains(t, s, "COMMIT;")
		return s
	}
	full := exp("full.sql")
	assert.Contains(t, full, "CREATE TABLE items")
	assert.Contains(t, full, `INSERT INTO "tags"("item","tag") VALUES(2,'fruit; green');`)
	noData := exp("schema.sql", "--no-data")
	assert.Contains(t, noData, "CREATE TABLE tags")
	assert.NotContains(t, noData, "INSERT INTO")
	noSchema := exp("data.sql", "--no-schema")
	assert.NotContains(t, noSchema, "CREATE TABLE")
	assert.Contains(t, noSchema, `INSERT INTO "items"`)
	one := exp("tags.sql", "--table", "tags")
	assert.Contains(t, one, "CREATE TABLE tags")
	assert.NotContains(t, one, "CREATE TABLE items")
	r = w("d1", "export", name, "--remote", "--output", filepath.Join(c.dir, "none.sql"), "--table", "nope")
	assert.NotEqual(t, 0, r.code, "%s", r)
	assert.Contains(t, r.stdout+r.stderr, "no such table: nope [code: 7400]")
	assert.NoFileExists(t, filepath.Join(c.dir, "none.sql"))

	// The export re-imports into a new database through wrangler.
	r = w("d1", "create", name+"-copy")
	require.Equal(t, 0, r.code, "%s", r)
	m = databaseID.FindStringSubmatch(r.stdout)
	require.NotNil(t, m, "%s", r)
	copyID := m[1]
	r = w("d1", "execute", name+"-copy", "--remote", "--file", filepath.Join(c.dir, "full.sql"))
	require.Equal(t, 0, r.code, "%s", r)
	assert.Equal(t, d.rows(t, id, "SELECT * FROM items ORDER BY id"), d.rows(t, copyID, "SELECT * FROM items ORDER BY id"))
	assert.Equal(t, []map[string]any{{"seq": 2.0}}, d.rows(t, copyID, "SELECT seq FROM sqlite_sequence WHERE name = 'items'"))

	// migrations create / list / apply, with a wrangler.toml binding.
	toml := fmt.Sprintf("name = \"compat\"\ncompatibility_date = \"2025-01-01\"\n\n[[d1_databases]]\nbinding = \"DB\"\ndatabase_name = %q\ndatabase_id = %q\n", name, id)
	require.NoError(t, os.WriteFile(filepath.Join(c.dir, "wrangler.toml"), []byte(toml), 0o644))
	r = w("d1", "migrations", "create", name, "add_orders")
	require.Equal(t, 0, r.code, "%s", r)
	mig := filepath.Join(c.dir, "migrations", "0001_add_orders.sql")
	require.FileExists(t, mig)
	require.NoError(t, os.WriteFile(mig, []byte("CREATE TABLE orders(id INTEGER PRIMARY KEY, item INTEGER REFERENCES items(id));\nINSERT INTO orders(item) VALUES (1);\n"), 0o644))
	r = w("d1", "migrations", "list", name, "--remote")
	require.Equal(t, 0, r.code, "%s", r)
	assert.Contains(t, r.stdout, "0001_add_orders.sql")
	r = w("d1", "migrations", "apply", name, "--remote")
	require.Equal(t, 0, r.code, "%s", r)
	assert.Contains(t, r.stdout, "0001_add_orders.sql")
	assert.Equal(t, []map[string]any{{"n": 1.0}}, d.rows(t, id, "SELECT count(*) AS n FROM orders"))
	assert.Equal(t, []map[string]any{{"name": "0001_add_orders.sql"}}, d.rows(t, id, "SELECT name FROM d1_migrations"))
	r = w("d1", "migrations", "list", name, "--remote")
	require.Equal(t, 0, r.code, "%s", r)
	assert.Contains(t, r.stdout, "No migrations to apply")

	// time-travel info and restore: the bookmark before a destructive
	// change, the change, a restore to it (the row is back), then the
	// undo to the previous bookmark wrangler prints (the change is back).
	r = w("d1", "time-travel", "info", name)
	require.Equal(t, 0, r.code, "%s", r)
	bm := bookmarkRe.FindStringSubmatch(r.stdout)
	require.NotNil(t, bm, "no bookmark in: %s", r)
	before := d.rows(t, id, "SELECT count(*) AS n FROM orders")
	r = w("d1", "execute", name, "--remote", "--command", "DELETE FROM orders")
	require.Equal(t, 0, r.code, "%s", r)
	r = w("d1", "time-travel", "restore", name, "--bookmark", bm[1])
	require.Equal(t, 0, r.code, "%s", r)
	assert.Equal(t, before, d.rows(t, id, "SELECT count(*) AS n FROM orders"), "restored to the bookmark")
	undo := undoRe.FindStringSubmatch(r.stdout)
	require.NotNil(t, undo, "no previous bookmark in: %s", r)
	r = w("d1", "time-travel", "restore", name, "--bookmark", undo[1])
	require.Equal(t, 0, r.code, "%s", r)
	assert.Equal(t, []map[string]any{{"n": 0.0}}, d.rows(t, id, "SELECT count(*) AS n FROM orders"), "the restore undone")
	r = w("d1", "time-travel", "restore", name, "--bookmark", undo[1])
	require.Equal(t, 0, r.code, "%s", r) // restoring again is allowed (within 10 per 10 min)
	r = w("d1", "time-travel", "restore", name, "--bookmark", "00000000-00000000-00000000-nope")
	assert.NotEqual(t, 0, r.code, "a malformed bookmark is refused: %s", r)
	r = w("d1", "execute", name, "--remote", "--command", "INSERT INTO orders(item) VALUES (1)")
	require.Equal(t, 0, r.code, "%s", r)

	// Shoal's export imports into wrangler's local D1 (miniflare), and
	// local D1's export (D1's own dump format) imports into Shoal.
	r = w("d1", "execute", name, "--local", "--file", filepath.Join(c.dir, "full.sql"))
	require.Equal(t, 0, r.code, "%s", r)
	r = w("d1", "execute", name, "--local", "--json", "--command", "SELECT count(*) AS n FROM tags")
	require.Equal(t, 0, r.code, "%s", r)
	assert.Contains(t, r.stdout, `"n": 2`)
	local := filepath.Join(c.dir, "local.sql")
	r = w("d1", "export", name, "--local", "--output", local)
	require.Equal(t, 0, r.code, "%s", r)
	r = w("d1", "create", name+"-from-local")
	require.Equal(t, 0, r.code, "%s", r)
	m = databaseID.FindStringSubmatch(r.stdout)
	require.NotNil(t, m, "%s", r)
	fromLocal := m[1]
	r = w("d1", "execute", name+"-from-local", "--remote", "--file", local)
	require.Equal(t, 0, r.code, "%s", r)
	assert.Equal(t, d.rows(t, copyID, "SELECT * FROM tags ORDER BY item"), d.rows(t, fromLocal, "SELECT * FROM tags ORDER BY item"))

	// info and insights over GraphQL, once the usage is in ClickHouse: a
	// database of its own with known queries, figures compared with the
	// meta the server answered.
	if !d.analytics {
		if os.Getenv("SHOAL_REQUIRE_CLICKHOUSE") == "1" {
			t.Fatalf("SHOAL_REQUIRE_CLICKHOUSE=1 but shoal dev runs without analytics: %s", d.out)
		}
		t.Log("clickhouse-server not installed: info's 24 h figures and insights not checked")
	} else {
		analyticsFlow(t, d, w, v)
	}

	// delete
	for _, n := range []string{name, name + "-copy", name + "-from-local"} {
		r = w("d1", "delete", n, "-y")
		require.Equal(t, 0, r.code, "%s", r)
	}
	st, _ = d.api(t, "GET", d.dbPath(id), nil)
	assert.Equal(t, 404, st)

	// Without CLOUDFLARE_ACCOUNT_ID: the account comes from /memberships.
	c2 := d.cli(t, c.node, false)
	r = c2.script(wrangler, "d1", "list", "--json")
	require.Equal(t, 0, r.code, "%s", r)
	jsonOut(t, r, &list)
	assert.NotContains(t, list, struct{ UUID, Name string }{id, name}, "deleted")
	r = c2.script(wrangler, "d1", "create", "noacct-"+v)
	require.Equal(t, 0, r.code, "%s", r)
	r = c2.script(wrangler, "d1", "delete", "noacct-"+v, "-y")
	require.Equal(t, 0, r.code, "%s", r)
	*c.runs = append(*c.runs, *c2.runs...)
}

// graphqlTotals asks /graphql, as `wrangler d1 info` does, for the last
// 24 h of a database and returns "readQueries/writeQueries".
func (d *dev) graphqlTotals(t *testing.T, id string) string {
	t.Helper()
	now := time.Now().UTC()
	body, err := json.Marshal(map[string]any{
		"query": `query($a: string, $f: filter) { viewer { accounts(filter: {accountTag: $a}) {
			d1AnalyticsAdaptiveGroups(limit: 10000, filter: $f) { sum { readQueries writeQueries } } } } }`,
		"variables": map[string]any{"a": d.account, "f": map[string]any{"AND": []any{map[string]any{
			"datetimeHour_geq": now.Add(-24 * time.Hour).Format(time.RFC3339), "datetimeHour_leq": now.Format(time.RFC3339), "databaseId": id}}}},
	})
	require.NoError(t, err)
	req, err := http.NewRequest("POST", d.url+"/client/v4/graphql", bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+d.token)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var out struct {
		Data struct {
			Viewer struct {
				Accounts []struct {
					Groups []struct {
						Sum struct{ ReadQueries, WriteQueries int64 } `json:"sum"`
					} `json:"d1AnalyticsAdaptiveGroups"`
				} `json:"accounts"`
			} `json:"viewer"`
		} `json:"data"`
		Errors []any `json:"errors"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
	require.Empty(t, out.Errors)
	var rq, wq int64
	for _, a := range out.Data.Viewer.Accounts {
		for _, g := range a.Groups {
			rq, wq = rq+g.Sum.ReadQueries, wq+g.Sum.WriteQueries
		}
	}
	return fmt.Sprintf("%d/%d", rq, wq)
}

// analyticsFlow runs known queries on a fresh database, waits until their
// usage has reached ClickHouse, and checks `d1 info`'s 24 h figures and
// `d1 insights` against the server's own meta.
func analyticsFlow(t *testing.T, d *dev, w func(...string) run, v string) {
	name := "stats-" + v
	r := w("d1", "create", name)
	require.Equal(t, 0, r.code, "%s", r)
	id := databaseID.FindStringSubmatch(r.stdout)[1]
	var reads, written int64
	query := func(sql string) {
		st, env := d.api(t, "POST", d.dbPath(id)+"/query", map[string]any{"sql": sql})
		require.Equal(t, 200, st, "%s: %+v", sql, env)
		var res []struct {
			Meta struct {
				RowsRead    int64 `json:"rows_read"`
				RowsWritten int64 `json:"rows_written"`
			} `json:"meta"`
		}
		require.NoError(t, json.Unmarshal(env.Result, &res))
		for _, s := range res {
			reads += s.Meta.RowsRead
			written += s.Meta.RowsWritten
		}
	}
	query("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)")
	for i := 0; i < 2; i++ {
		query(fmt.Sprintf("INSERT INTO t(v) VALUES ('%d'), ('x%d')", i, i))
	}
	for i := 0; i < 3; i++ {
		query(fmt.Sprintf("SELECT * FROM t WHERE v != '%d'", i))
	}
	const wantReads, wantWrites = 3, 3 // the SELECTs; the CREATE and INSERTs

	// Wait (cheaply, without starting wrangler) until the pipeline has
	// delivered every query's usage to ClickHouse.
	seen := ""
	require.Eventually(t, func() bool {
		seen = d.graphqlTotals(t, id)
		return seen == fmt.Sprintf("%d/%d", wantReads, wantWrites)
	}, 90*time.Second, 250*time.Millisecond, "usage never reached ClickHouse: read/write queries %s", seen)
	r = w("d1", "info", name, "--json")
	require.Equal(t, 0, r.code, "%s", r)
	var info map[string]any
	jsonOut(t, r, &info)
	assert.Equal(t, float64(wantReads), info["read_queries_24h"], "%v", info)
	assert.Equal(t, float64(wantWrites), info["write_queries_24h"], "%v", info)
	assert.Equal(t, float64(reads), info["rows_read_24h"], "%v", info)
	assert.Equal(t, float64(written), info["rows_written_24h"], "%v", info)

	r = w("d1", "insights", name, "--json", "--sort-by", "count", "--limit", "10")
	require.Equal(t, 0, r.code, "%s", r)
	var ins []struct {
		Query            string  `json:"query"`
		NumberOfTimesRun int64   `json:"numberOfTimesRun"`
		TotalRowsRead    int64   `json:"totalRowsRead"`
		TotalRowsWritten int64   `json:"totalRowsWritten"`
		AvgDurationMs    float64 `json:"avgDurationMs"`
	}
	jsonOut(t, r, &ins)
	require.Len(t, ins, 3, "three shapes: %s", r)
	assert.Equal(t, "SELECT * FROM t WHERE v != ?", ins[0].Query, "count DESC: the SELECT ran most")
	assert.Equal(t, int64(3), ins[0].NumberOfTimesRun)
	assert.Equal(t, int64(2), ins[1].NumberOfTimesRun)
	assert.Equal(t, int64(4), ins[1].TotalRowsWritten)
	assert.Positive(t, ins[0].AvgDurationMs)
	// Ascending: wrangler's --sort-direction ASC.
	r = w("d1", "insights", name, "--json", "--sort-by", "count", "--sort-direction", "ASC", "--limit", "1")
	require.Equal(t, 0, r.code, "%s", r)
	jsonOut(t, r, &ins)
	require.Len(t, ins, 1)
	assert.Equal(t, int64(1), ins[0].NumberOfTimesRun, "the CREATE ran once")

	r = w("d1", "delete", name, "-y")
	require.Equal(t, 0, r.code, "%s", r)
}
