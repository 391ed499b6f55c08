package test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/objecthost/dump"
	"github.com/shoaldb/shoal/test/harness"
)

// d1cliBasePort finds a base port p with p, p+100 and p+200 free (shoal dev
// uses base+i for Raft, base+100+i for the catalog, base+200 for the host).
func d1cliBasePort(t *testing.T) int { return harness.DevBasePort(t) }

type devProc struct {
	dir    string
	apiURL string
	stdout *harness.SyncWriter
	pid    int
}

// startDev runs `shoal dev` in the background on non-default ports and
// waits until it is healthy and has written dev.json.
func startDev(t *testing.T, bin string) *devProc {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "dev")
	addr := harness.FreeAddr(t)
	out, errb := &harness.SyncWriter{}, &harness.SyncWriter{}
	cmd := exec.Command(bin, "dev", "--dir", dir, "--reset", "--addr", addr, "--base-port", fmt.Sprint(d1cliBasePort(t)))
	cmd.Stdout, cmd.Stderr = out, errb
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
	p := &devProc{dir: dir, apiURL: "http://" + addr, stdout: out, pid: cmd.Process.Pid}
	require.Eventually(t, func() bool {
		if _, err := os.Stat(filepath.Join(dir, "dev.json")); err != nil {
			return false
		}
		resp, err := http.Get(p.apiURL + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK && strings.Contains(p.output(), "Press Ctrl-C")
	}, 60*time.Second, 100*time.Millisecond, "shoal dev never became ready: %s", errb)
	return p
}

func (p *devProc) output() string { return p.stdout.String() }

func devPID(t *testing.T, p *devProc) int { t.Helper(); return p.pid }

type cliResult struct {
	stdout, stderr string
	code           int
}

func runCLI(t *testing.T, bin string, env []string, stdin string, args ...string) cliResult {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	cmd.Stdin = strings.NewReader(stdin)
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else {
		require.NoError(t, err)
	}
	return cliResult{out.String(), errb.String(), code}
}

func TestD1CLI(t *testing.T) {
	bin := shoalBin.Path(t)
	dev := startDev(t, bin)
	// Configuration comes from dev.json via --dev-dir; the environment must
	// not leak a real user's settings into the test.
	clean := []string{"SHOAL_API_URL=", "SHOAL_API_TOKEN=", "SHOAL_ACCOUNT_ID="}
	d1 := func(stdin string, args ...string) cliResult {
		t.Helper()
		return runCLI(t, bin, clean, stdin, append([]string{"d1", "--dev-dir", dev.dir}, args...)...)
	}
	ok := func(r cliResult) cliResult {
		t.Helper()
		require.Equal(t, 0, r.code, "stdout: %s\nstderr: %s", r.stdout, r.stderr)
		require.Empty(t, r.stderr, "no progress or noise on a non-terminal")
		return r
	}

	r := ok(d1("", "create", "cli-db"))
	require.Contains(t, r.stdout, "cli-db")
	var created map[string]any
	r = ok(d1("", "create", "cli-db2", "--json"))
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &created))
	uuid2 := created["uuid"].(string)
	require.Len(t, uuid2, 36)

	r = d1("", "create", "cli-db")
	require.Equal(t, 1, r.code)
	require.Regexp(t, `^error: .+ \[7502\]\n$`, r.stderr)

	r = ok(d1("", "list"))
	require.Contains(t, r.stdout, "cli-db")
	require.Contains(t, r.stdout, uuid2)

	r = ok(d1("", "execute", "cli-db", "--command",
		"CREATE TABLE t(id INTEGER PRIMARY KEY, big INTEGER, r REAL, s TEXT, b BLOB); "+
			"INSERT INTO t VALUES (1, 9223372036854775807, 0.1, 'héllo; ''q''', X'00FF'), (2, -9223372036854775808, NULL, NULL, NULL); "+
			"CREATE INDEX t_s ON t(s); CREATE VIRTUAL TABLE docs USING fts5(body); INSERT INTO docs VALUES ('full text search')"))
	r = ok(d1("", "execute", "cli-db", "--command", "SELECT id, big, s FROM t ORDER BY id"))
	require.Contains(t, r.stdout, "9223372036854775807", "big integers are printed exactly")
	require.Contains(t, r.stdout, "-9223372036854775808")
	require.Contains(t, r.stdout, "héllo; 'q'")
	r = ok(d1("", "execute", "cli-db", "--command", "SELECT count(*) AS n FROM t", "--json"))
	var qres []map[string]any
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &qres))
	require.Equal(t, true, qres[0]["success"])

	r = d1("", "execute", "cli-db", "--command", "SELECT * FROM nope")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "no such table: nope")
	require.Contains(t, r.stderr, "[7500]")

	r = ok(d1("", "info", "cli-db"))
	require.Contains(t, r.stdout, "num_tables")
	r = ok(d1("", "info", uuid2, "--json"))
	require.Contains(t, r.stdout, `"name": "cli-db2"`)

	// Export → import into the second database → identical export.
	dump1 := filepath.Join(t.TempDir(), "dump1.sql")
	r = ok(d1("", "export", "cli-db", "--output", dump1))
	require.Contains(t, r.stdout, "Exported cli-db")
	b, err := os.ReadFile(dump1)
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(string(b), dump.Header+"\n"))
	require.Contains(t, string(b), "CREATE VIRTUAL TABLE docs USING fts5(body);")
	require.NotContains(t, string(b), "docs_data")

	r = ok(d1("", "import", "cli-db2", dump1))
	require.Contains(t, r.stdout, "statements executed")
	dump2 := filepath.Join(t.TempDir(), "dump2.sql")
	ok(d1("", "export", uuid2, "--output", dump2))
	b2, err := os.ReadFile(dump2)
	require.NoError(t, err)
	require.Equal(t, string(b), string(b2))
	r = ok(d1("", "execute", "cli-db2", "--command", "SELECT body FROM docs WHERE docs MATCH 'text'"))
	require.Contains(t, r.stdout, "full text search")

	// Partial exports.
	schema := filepath.Join(t.TempDir(), "schema.sql")
	ok(d1("", "export", "cli-db", "--output", schema, "--no-data"))
	sb, _ := os.ReadFile(schema)
	require.Contains(t, string(sb), "CREATE TABLE t(")
	require.NotContains(t, string(sb), `INSERT INTO "t"`)
	r = d1("", "export", "cli-db", "--output", schema, "--table", "missing")
	require.Equal(t, 1, r.code, r.stderr)
	require.Contains(t, r.stderr, "no such table: missing")

	// A bad statement in the middle of an import changes nothing.
	bad := filepath.Join(t.TempDir(), "bad.sql")
	require.NoError(t, os.WriteFile(bad, []byte("INSERT INTO t(id) VALUES (100);\nINSERT INTO nowhere VALUES (1);\n"), 0o644))
	r = d1("", "import", "cli-db2", bad)
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "statement 2 (line 2)")
	r = ok(d1("", "execute", "cli-db2", "--command", "SELECT count(*) AS n FROM t"))
	require.Regexp(t, `│\s*2\s*│`, r.stdout)

	// execute --file goes through the import API too.
	f := filepath.Join(t.TempDir(), "more.sql")
	require.NoError(t, os.WriteFile(f, []byte("INSERT INTO t(id) VALUES (3);\nINSERT INTO t(id) VALUES (4);\n"), 0o644))
	ok(d1("", "execute", "cli-db2", "--file", f))
	r = ok(d1("", "execute", "cli-db2", "--command", "SELECT count(*) AS n FROM t"))
	require.Regexp(t, `│\s*4\s*│`, r.stdout)

	r = ok(d1("", "binding", "create", "cli-db", "--json"))
	require.Contains(t, r.stdout, `"token": "v2.`)

	// binding revoke: one token by its token_id, then every token; a
	// revoked token is refused by the bound query path at once.
	bound := func(tok string) int {
		a := harness.Call(t, "POST", dev.apiURL+"/client/v4/bound/query", "Binding "+tok, map[string]any{"sql": "SELECT 1"})
		return a.Status
	}
	var minted [2]struct {
		Token   string `json:"token"`
		TokenID string `json:"token_id"`
	}
	for i := range minted {
		r = ok(d1("", "binding", "create", "cli-db", "--json"))
		require.NoError(t, json.Unmarshal([]byte(r.stdout), &minted[i]))
		require.Len(t, minted[i].TokenID, 32)
		require.Equal(t, http.StatusOK, bound(minted[i].Token))
	}
	r = ok(d1("", "binding", "revoke", "cli-db", minted[0].TokenID))
	require.Equal(t, "Revoked binding token "+minted[0].TokenID+" of cli-db\n", r.stdout)
	require.Equal(t, http.StatusUnauthorized, bound(minted[0].Token))
	require.Equal(t, http.StatusOK, bound(minted[1].Token), "only the one token is revoked")
	r = ok(d1("", "binding", "revoke", "cli-db", "--all", "--json"))
	require.Contains(t, r.stdout, `"all": true`)
	require.Equal(t, http.StatusUnauthorized, bound(minted[1].Token))
	for _, args := range [][]string{{"cli-db"}, {"cli-db", minted[0].TokenID, "--all"}} {
		r = d1("", append([]string{"binding", "revoke"}, args...)...)
		require.Equal(t, 2, r.code, "usage error: %v: %s", args, r.stderr)
	}
	r = d1("", "binding", "revoke", "cli-db", "not-a-token-id")
	require.Equal(t, 1, r.code, r.stderr)
	require.Contains(t, r.stderr, "[7400]")

	// time-travel: the bookmark before a delete, a restore to it brings the
	// rows back, the printed undo bookmark returns to the empty table.
	r = ok(d1("", "time-travel", "info", "cli-db2"))
	bm := regexp.MustCompile(`--bookmark (\S+)`).FindStringSubmatch(r.stdout)
	require.NotNil(t, bm, r.stdout)
	ok(d1("", "execute", "cli-db2", "--command", "DELETE FROM t"))
	r = ok(d1("", "time-travel", "restore", "cli-db2", "--bookmark", bm[1], "--yes"))
	undo := regexp.MustCompile(`Undo with: .* --bookmark (\S+)`).FindStringSubmatch(r.stdout)
	require.NotNil(t, undo, r.stdout)
	r = ok(d1("", "execute", "cli-db2", "--command", "SELECT count(*) AS n FROM t"))
	require.Regexp(t, `│\s*4\s*│`, r.stdout)
	ok(d1("", "time-travel", "restore", "cli-db2", "--bookmark", undo[1], "--yes"))
	r = ok(d1("", "execute", "cli-db2", "--command", "SELECT count(*) AS n FROM t"))
	require.Regexp(t, `│\s*0\s*│`, r.stdout)
	r = d1("", "time-travel", "restore", "cli-db2")
	require.Equal(t, 2, r.code, "neither --bookmark nor --timestamp: %s", r.stderr)
	r = d1("", "time-travel", "restore", "cli-db2", "--bookmark", "nope", "--yes")
	require.Equal(t, 1, r.code, r.stderr)
	require.Contains(t, r.stderr, "invalid bookmark")

	// fork: at the bookmark taken before the delete (4 rows), and now (the
	// empty table); the forks are databases of their own.
	r = ok(d1("", "fork", "cli-db2", "cli-fork-old", "--bookmark", bm[1]))
	require.Contains(t, r.stdout, "Created cli-fork-old")
	r = ok(d1("", "execute", "cli-fork-old", "--command", "SELECT count(*) AS n FROM t"))
	require.Regexp(t, `│\s*4\s*│`, r.stdout)
	ok(d1("", "fork", "cli-db2", "cli-fork-now"))
	r = ok(d1("", "execute", "cli-fork-now", "--command", "SELECT count(*) AS n FROM t"))
	require.Regexp(t, `│\s*0\s*│`, r.stdout)
	ok(d1("", "execute", "cli-fork-old", "--command", "DELETE FROM t WHERE id = 1"))
	r = ok(d1("", "execute", "cli-db2", "--command", "SELECT count(*) AS n FROM t"))
	require.Regexp(t, `│\s*0\s*│`, r.stdout, "a fork's writes never reach its source")
	r = d1("", "fork", "cli-db2", "cli-fork-old")
	require.Equal(t, 1, r.code, r.stderr)
	require.Contains(t, r.stderr, "already exists")
	r = d1("", "fork", "cli-db2", "cli-fork-bad", "--bookmark", "0123-abcd")
	require.Equal(t, 1, r.code, r.stderr)
	require.Contains(t, r.stderr, "bookmark")
	ok(d1("", "delete", "cli-fork-old", "--yes"))
	ok(d1("", "delete", "cli-fork-now", "--yes"))

	// Exit codes.
	r = d1("", "info", "no-such-db")
	require.Equal(t, 3, r.code)
	require.Equal(t, "error: database \"no-such-db\" not found [7404]\n", r.stderr)
	r = d1("", "info")
	require.Equal(t, 2, r.code)
	r = d1("", "execute", "cli-db")
	require.Equal(t, 2, r.code)
	r = d1("", "list", "--bogus-flag")
	require.Equal(t, 2, r.code)
	r = d1("", "--token", "wrong-token", "list")
	require.Equal(t, 4, r.code)
	require.Contains(t, r.stderr, "[10000]")
	r = d1("", "--api-url", "http://"+harness.FreeAddr(t), "list")
	require.Equal(t, 5, r.code)
	r = runCLI(t, bin, clean, "", "d1", "--dev-dir", filepath.Join(t.TempDir(), "none"), "list")
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, "missing API URL")

	// Environment configuration works without dev.json.
	var st struct {
		APIURL    string `json:"api_url"`
		AccountID string `json:"account_id"`
		Token     string `json:"token"`
	}
	raw, err := os.ReadFile(filepath.Join(dev.dir, "dev.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(raw, &st))
	r = runCLI(t, bin, []string{"SHOAL_API_URL=" + st.APIURL, "SHOAL_API_TOKEN=" + st.Token, "SHOAL_ACCOUNT_ID=" + st.AccountID},
		"", "d1", "--dev-dir", filepath.Join(t.TempDir(), "none"), "list")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "cli-db2")

	// delete: refuses without --yes when stdin is not a terminal.
	r = d1("y\n", "delete", "cli-db2")
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, "--yes")
	ok(d1("", "info", "cli-db2"))
	r = ok(d1("", "delete", "cli-db2", "--yes"))
	require.Contains(t, r.stdout, "Deleted database cli-db2")
	r = d1("", "info", uuid2)
	require.Equal(t, 3, r.code)
}

// vmHWM reads a process's peak resident set size (kB) from /proc.
func vmHWM(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	require.NoError(t, err)
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "VmHWM:") {
			var kb int64
			_, err := fmt.Sscanf(strings.TrimSpace(strings.TrimPrefix(l, "VmHWM:")), "%d kB", &kb)
			require.NoError(t, err)
			return kb
		}
	}
	t.Fatal("no VmHWM")
	return 0
}

// TestD1ExportImportBench round-trips ~100 MB through the whole stack
// (`shoal dev` + `shoal d1 import/export`) and records throughput and peak
// RSS; in-process dump.Import/Export on the same data are the baseline.
// SHOAL_BENCH=1 enables it (it takes more than 20 s on the 2-core VM).
func TestD1ExportImportBench(t *testing.T) {
	if os.Getenv("SHOAL_BENCH") != "1" {
		t.Skip("set SHOAL_BENCH=1")
	}
	bin := shoalBin.Path(t)
	dev := startDev(t, bin)
	pid := devPID(t, dev)
	clean := []string{"SHOAL_API_URL=", "SHOAL_API_TOKEN=", "SHOAL_ACCOUNT_ID="}
	d1 := func(args ...string) (cliResult, time.Duration, int64) {
		t.Helper()
		cmd := exec.Command(bin, append([]string{"d1", "--dev-dir", dev.dir}, args...)...)
		cmd.Env = append(os.Environ(), clean...)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		start := time.Now()
		require.NoError(t, cmd.Run(), "%s %s", out.String(), errb.String())
		el := time.Since(start)
		ru := cmd.ProcessState.SysUsage().(*syscall.Rusage)
		return cliResult{out.String(), errb.String(), 0}, el, ru.Maxrss
	}

	// ~100 MB of SQL: 150,000 rows of ~680 bytes (text, blob, numbers).
	src := filepath.Join(t.TempDir(), "big.sql")
	f, err := os.Create(src)
	require.NoError(t, err)
	w := bufio.NewWriterSize(f, 1<<20)
	fmt.Fprintln(w, "CREATE TABLE big(id INTEGER PRIMARY KEY, n INTEGER, r REAL, s TEXT, b BLOB);")
	rng := rand.New(rand.NewSource(1))
	buf := make([]byte, 300)
	for i := 0; i < 150_000; i++ {
		rng.Read(buf)
		fmt.Fprintf(w, "INSERT INTO big VALUES(%d,%d,%v,'%x',X'%x');\n", i, rng.Int63(), rng.Float64(), buf[:200], buf[200:])
	}
	fmt.Fprintln(w, "CREATE INDEX big_n ON big(n);")
	require.NoError(t, w.Flush())
	require.NoError(t, f.Close())
	fi, err := os.Stat(src)
	require.NoError(t, err)
	mb := float64(fi.Size()) / 1e6

	d1("create", "bench")
	hwm0 := vmHWM(t, pid)
	_, impDur, impRSS := d1("import", "bench", src)
	hwmImport := vmHWM(t, pid)
	out := filepath.Join(t.TempDir(), "out.sql")
	_, expDur, expRSS := d1("export", "bench", "--output", out)
	hwmExport := vmHWM(t, pid)
	ofi, err := os.Stat(out)
	require.NoError(t, err)
	outMB := float64(ofi.Size()) / 1e6

	// Baseline: the same work in-process, no HTTP.
	base := filepath.Join(t.TempDir(), "base.db")
	in, err := os.Open(src)
	require.NoError(t, err)
	start := time.Now()
	_, err = dump.Import(context.Background(), base, in, dump.ImportOptions{})
	require.NoError(t, err)
	baseImp := time.Since(start)
	in.Close()
	start = time.Now()
	n, err := countingExport(base)
	require.NoError(t, err)
	baseExp := time.Since(start)

	t.Logf("input %.1f MB, dump %.1f MB (in-process dump %.1f MB)", mb, outMB, float64(n)/1e6)
	t.Logf("import: %.1f s, %.1f MB/s end to end; in-process %.1f MB/s; ratio %.2f", impDur.Seconds(), mb/impDur.Seconds(), mb/baseImp.Seconds(), baseImp.Seconds()/impDur.Seconds())
	t.Logf("export: %.1f s, %.1f MB/s end to end; in-process %.1f MB/s; ratio %.2f", expDur.Seconds(), outMB/expDur.Seconds(), float64(n)/1e6/baseExp.Seconds(), baseExp.Seconds()/expDur.Seconds())
	t.Logf("shoal dev peak RSS: %d MB before, %d MB after import, %d MB after export", hwm0>>10, hwmImport>>10, hwmExport>>10)
	t.Logf("client peak RSS: import %d MB, export %d MB", impRSS>>10, expRSS>>10)
	// Bounded memory: neither side grows with the 100 MB file.
	require.Less(t, hwmExport-hwm0, int64(100<<10), "server peak RSS grew by %d MB", (hwmExport-hwm0)>>10)
	require.Less(t, impRSS, int64(100<<10))
	require.Less(t, expRSS, int64(100<<10))
}

func countingExport(path string) (int64, error) {
	cw := &byteCounter{}
	err := dump.Export(context.Background(), path, cw, dump.Options{}, nil)
	return cw.n, err
}

type byteCounter struct{ n int64 }

func (c *byteCounter) Write(p []byte) (int, error) { c.n += int64(len(p)); return len(p), nil }
