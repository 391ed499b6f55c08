package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const testDB = "11111111-2222-4333-8444-555555555555"

// fakeD1 serves the export protocol (one "active" answer, then complete)
// and a 1 MB download.
func fakeD1(t *testing.T) *httptest.Server {
	var srv *httptest.Server
	polls := 0
	srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		env := func(status int, result any, errs []any) {
			w.WriteHeader(status)
			_ = json.NewEncoder(w).Encode(map[string]any{"success": status < 300, "result": result, "errors": errs})
		}
		switch {
		case r.URL.Path == "/dl":
			w.Header().Set("Content-Length", "1048576")
			_, _ = io.WriteString(w, strings.Repeat("-- x\n", 1<<20/5)+"-")
		case strings.HasSuffix(r.URL.Path, "/"+testDB+"/export"):
			polls++
			if polls == 1 {
				env(200, map[string]any{"status": "active", "at_bookmark": "b"}, nil)
				return
			}
			env(200, map[string]any{"status": "complete", "at_bookmark": "b", "result": map[string]any{"filename": "f.sql", "signed_url": srv.URL + "/dl"}}, nil)
		default:
			env(404, nil, []any{map[string]any{"code": 7404, "message": "The database could not be found"}})
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

func runD1(t *testing.T, terminal bool, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errb bytes.Buffer
	code = -1
	e := &d1Env{stdin: strings.NewReader(""), stdout: &out, stderr: &errb,
		exit: func(c int) { code = c }, isTerminal: func(any) bool { return terminal }}
	cmd := e.command()
	cmd.SilenceErrors, cmd.SilenceUsage = true, true
	cmd.SetArgs(args)
	cmd.SetOut(io.Discard)
	cmd.SetErr(io.Discard)
	if err := cmd.Execute(); err == nil {
		code = 0
	}
	return out.String(), errb.String(), code
}

// Progress goes to stderr only when stdout and stderr are terminals.
func TestD1ProgressOnlyOnTerminals(t *testing.T) {
	srv := fakeD1(t)
	t.Setenv("SHOAL_API_URL", "")
	t.Setenv("SHOAL_API_TOKEN", "")
	t.Setenv("SHOAL_ACCOUNT_ID", "")
	base := []string{"export", testDB, "--api-url", srv.URL, "--token", "t", "--account-id", "a"}

	outFile := filepath.Join(t.TempDir(), "a.sql")
	stdout, stderr, code := runD1(t, false, append(base, "--output", outFile)...)
	require.Equal(t, 0, code, stderr)
	require.Empty(t, stderr, "no progress when not on a terminal")
	require.Contains(t, stdout, "Exported")
	fi, err := os.Stat(outFile)
	require.NoError(t, err)
	require.Equal(t, int64(1<<20), fi.Size())

	srv2 := fakeD1(t) // a fresh fake: its first export answer is "active" again
	base2 := []string{"export", testDB, "--api-url", srv2.URL, "--token", "t", "--account-id", "a"}
	_, stderr, code = runD1(t, true, append(base2, "--output", filepath.Join(t.TempDir(), "b.sql"))...)
	require.Equal(t, 0, code)
	require.Contains(t, stderr, "preparing export", "the spinner is shown while polling on a terminal")
	require.Contains(t, stderr, "exporting", "the transfer is shown on a terminal")
}

func TestD1ExitCodes(t *testing.T) {
	srv := fakeD1(t)
	cfg := []string{"--api-url", srv.URL, "--token", "t", "--account-id", "a"}
	_, stderr, code := runD1(t, false, append([]string{"info", "22222222-2222-4333-8444-555555555555"}, cfg...)...)
	require.Equal(t, exitNotFound, code)
	require.Equal(t, "error: The database could not be found [7404]\n", stderr)
	_, _, code = runD1(t, false, append([]string{"info"}, cfg...)...)
	require.Equal(t, exitUsage, code)
	_, _, code = runD1(t, false, append([]string{"export", testDB, "--no-data", "--no-schema", "--output", "x"}, cfg...)...)
	require.Equal(t, exitUsage, code)
	_, stderr, code = runD1(t, false, append([]string{"delete", testDB}, cfg...)...)
	require.Equal(t, exitNotFound, code, stderr) // checked before the confirmation
}

func TestStmtCounter(t *testing.T) {
	var out bytes.Buffer
	c := &stmtCounter{w: &out, p: &progress{}}
	for _, chunk := range []string{"PRAGMA x;", "\nINSERT 'a;\nb';", "\n", "CREATE TRIGGER t BEGIN SELECT 1; END;\n"} {
		_, err := c.Write([]byte(chunk))
		require.NoError(t, err)
	}
	require.Equal(t, int64(4), c.n) // ';\n' inside a string counts too: it is a progress estimate
	require.Equal(t, "PRAGMA x;\nINSERT 'a;\nb';\nCREATE TRIGGER t BEGIN SELECT 1; END;\n", out.String())
}

// wrangler's CLOUDFLARE_* variables configure `shoal d1` when
// CLOUDFLARE_API_BASE_URL points somewhere, after Shoal's own variables;
// without the base URL they are ignored (a Cloudflare token is never sent
// to the dev.json's server).
func TestD1ReadsWranglerVariables(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "dev.json"), []byte(`{"api_url":"http://dev.invalid","account_id":"dev-acct","token":"dev-tok"}`), 0o600))
	for _, k := range []string{"SHOAL_API_URL", "SHOAL_API_TOKEN", "SHOAL_ACCOUNT_ID"} {
		t.Setenv(k, "")
	}
	t.Setenv("CLOUDFLARE_API_TOKEN", "cf-tok")
	t.Setenv("CLOUDFLARE_ACCOUNT_ID", "cf-acct")
	t.Setenv("CLOUDFLARE_API_BASE_URL", "")
	e := &d1Env{devDir: dir}
	c, err := e.client()
	require.NoError(t, err)
	require.Equal(t, [3]string{"http://dev.invalid", "dev-tok", "dev-acct"}, [3]string{c.BaseURL, c.Token, c.AccountID}, "no base URL: dev.json")

	t.Setenv("CLOUDFLARE_API_BASE_URL", "http://127.0.0.1:8787/client/v4/")
	c, err = e.client()
	require.NoError(t, err)
	require.Equal(t, [3]string{"http://127.0.0.1:8787", "cf-tok", "cf-acct"}, [3]string{c.BaseURL, c.Token, c.AccountID})

	t.Setenv("SHOAL_API_TOKEN", "shoal-tok")
	c, err = e.client()
	require.NoError(t, err)
	require.Equal(t, "shoal-tok", c.Token, "Shoal's own variable first")
	e.token = "flag-tok"
	c, err = e.client()
	require.NoError(t, err)
	require.Equal(t, "flag-tok", c.Token, "the flag first")
}

// An unknown subcommand is a usage error (exit 2), not the help with exit 0.
func TestD1UnknownSubcommand(t *testing.T) {
	for _, c := range []struct {
		args    []string
		unknown string
	}{{[]string{"nosuch"}, "nosuch"}, {[]string{"binding", "nosuch"}, "nosuch"}, {[]string{"lsit", "x"}, "lsit"}} {
		_, stderr, code := runD1(t, false, c.args...)
		require.Equal(t, exitUsage, code, "%v: %s", c.args, stderr)
		require.Contains(t, stderr, `unknown command "`+c.unknown+`"`, "%v", c.args)
	}
	_, _, code := runD1(t, false)
	require.Equal(t, 0, code, "no arguments: the help")
}
