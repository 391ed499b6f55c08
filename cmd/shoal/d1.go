package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/shoaldb/shoal/d1client"
)

// Exit codes of `shoal d1` (documented in docs/cli.md).
const (
	exitOK          = 0
	exitAPI         = 1 // the API refused the request (SQL error, limit, conflict…)
	exitUsage       = 2 // bad flags/arguments, missing configuration
	exitNotFound    = 3 // database (or account) not found
	exitAuth        = 4 // authentication/authorization failed
	exitUnavailable = 5 // service unavailable or rate limited: retry later
)

// d1Env is what every `shoal d1` command shares: configuration flags, the
// standard streams and the exit function (injected so tests can run
// commands in-process).
type d1Env struct {
	apiURL, token, accountID, devDir string
	jsonOut                          bool

	stdin          io.Reader
	stdout, stderr io.Writer
	exit           func(int)
	// isTerminal reports whether a stream is an interactive terminal;
	// progress and prompts appear only on terminals.
	isTerminal func(any) bool
}

func newD1Cmd() *cobra.Command {
	e := &d1Env{stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr, exit: os.Exit, isTerminal: fileIsTerminal}
	return e.command()
}

func fileIsTerminal(s any) bool {
	f, ok := s.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// usageError is a mistake of the caller (exit 2).
type usageError struct{ msg string }

func (u *usageError) Error() string { return u.msg }

func usagef(format string, args ...any) error { return &usageError{fmt.Sprintf(format, args...)} }

func (e *d1Env) command() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "d1",
		Short: "Manage D1 databases through the public API (like wrangler d1)",
		Long: `Manage databases through Shoal's public, D1-compatible HTTP API.

Configuration, first match wins: the flags --api-url, --token, --account-id;
then SHOAL_API_URL, SHOAL_API_TOKEN, SHOAL_ACCOUNT_ID; then wrangler's
CLOUDFLARE_API_BASE_URL (…/client/v4), CLOUDFLARE_API_TOKEN,
CLOUDFLARE_ACCOUNT_ID (only when CLOUDFLARE_API_BASE_URL is set); then the
file written by 'shoal dev' (.shoal/dev.json in the current directory, or
--dev-dir).
DB arguments are a database name or UUID. Exit codes: 0 ok, 1 API error,
2 usage, 3 not found, 4 authentication, 5 unavailable (retry).`,
	}
	pf := cmd.PersistentFlags()
	pf.StringVar(&e.apiURL, "api-url", "", "API base URL (env SHOAL_API_URL)")
	pf.StringVar(&e.token, "token", "", "API token (env SHOAL_API_TOKEN)")
	pf.StringVar(&e.accountID, "account-id", "", "account ID (env SHOAL_ACCOUNT_ID)")
	pf.StringVar(&e.devDir, "dev-dir", ".shoal", "directory holding dev.json written by 'shoal dev'")
	cmd.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		e.fail(usagef("%v (see '%s --help')", err, c.CommandPath()))
		return err
	})
	cmd.AddCommand(e.createCmd(), e.listCmd(), e.infoCmd(), e.deleteCmd(), e.executeCmd(),
		e.exportCmd(), e.importCmd(), e.bindingCmd())
	cmd.AddCommand(e.insightsCmd(), e.timeTravelCmd(), e.forkCmd())
	e.group(cmd)
	for _, sub := range cmd.Commands() {
		if sub.HasSubCommands() {
			e.group(sub)
		}
	}
	return cmd
}

// group makes a command that only holds subcommands refuse an unknown one
// as a usage error (exit 2, as docs/cli.md says; cobra would print the help
// and exit 0); without arguments it prints its help.
func (e *d1Env) group(cmd *cobra.Command) {
	cmd.Args = cobra.ArbitraryArgs
	cmd.RunE = func(c *cobra.Command, args []string) error {
		if len(args) == 0 {
			return c.Help()
		}
		err := usagef("unknown command %q for %q (see '%s --help')", args[0], c.CommandPath(), c.CommandPath())
		e.fail(err)
		return err // only reached when exit is a test double
	}
}

// fail prints one line and exits with the error's class.
func (e *d1Env) fail(err error) {
	code := exitAPI
	var ue *usageError
	var ae *d1client.APIError
	switch {
	case errors.As(err, &ue):
		code = exitUsage
		fmt.Fprintln(e.stderr, "error:", ue.msg)
	case errors.As(err, &ae):
		switch {
		case errors.Is(err, d1client.ErrNotFound):
			code = exitNotFound
		case errors.Is(err, d1client.ErrAuth):
			code = exitAuth
		case errors.Is(err, d1client.ErrUnavailable):
			code = exitUnavailable
		}
		fmt.Fprintf(e.stderr, "error: %s [%d]\n", oneLine(ae.Message), ae.Code)
	case errors.Is(err, context.Canceled):
		code = exitUnavailable
		fmt.Fprintln(e.stderr, "error: interrupted")
	default:
		fmt.Fprintln(e.stderr, "error:", oneLine(err.Error()))
	}
	e.exit(code)
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// run wraps a command body: it resolves the client, runs fn with a context
// cancelled by Ctrl-C, and turns errors into one line and an exit code.
func (e *d1Env) run(fn func(ctx context.Context, c *d1client.Client, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		c, err := e.client()
		if err == nil {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			err = fn(ctx, c, args)
		}
		if err != nil {
			e.fail(err)
			return err // only reached when exit is a test double
		}
		return nil
	}
}

// nargs validates positional arguments with exit code 2.
func (e *d1Env) nargs(n int, what string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != n {
			err := usagef("%s expects %s (see '%s --help')", cmd.CommandPath(), what, cmd.CommandPath())
			e.fail(err)
			return err
		}
		return nil
	}
}

type devConfig struct {
	APIURL    string `json:"api_url"`
	AccountID string `json:"account_id"`
	Token     string `json:"token"`
}

// client builds the API client from flags, then environment, then dev.json.
func (e *d1Env) client() (*d1client.Client, error) {
	var dc devConfig
	if b, err := os.ReadFile(filepath.Join(e.devDir, "dev.json")); err == nil {
		if err := json.Unmarshal(b, &dc); err != nil {
			return nil, usagef("%s: %v", filepath.Join(e.devDir, "dev.json"), err)
		}
	}
	// First non-empty wins. wrangler's variables come after Shoal's own,
	// so one shell can point both tools at the same deployment. They count
	// only together with CLOUDFLARE_API_BASE_URL: without it they are a
	// Cloudflare account's, which must not be sent to the dev.json's
	// server. CLOUDFLARE_API_BASE_URL names the v4 root (…/client/v4); the
	// client wants the host.
	first := func(vs ...string) string {
		for _, v := range vs {
			if v != "" {
				return v
			}
		}
		return ""
	}
	var cfBase, cfToken, cfAccount string
	if b := os.Getenv("CLOUDFLARE_API_BASE_URL"); b != "" {
		cfBase = strings.TrimSuffix(strings.TrimRight(b, "/"), "/client/v4")
		cfToken, cfAccount = os.Getenv("CLOUDFLARE_API_TOKEN"), os.Getenv("CLOUDFLARE_ACCOUNT_ID")
	}
	c := &d1client.Client{
		BaseURL:   first(e.apiURL, os.Getenv("SHOAL_API_URL"), cfBase, dc.APIURL),
		Token:     first(e.token, os.Getenv("SHOAL_API_TOKEN"), cfToken, dc.Token),
		AccountID: first(e.accountID, os.Getenv("SHOAL_ACCOUNT_ID"), cfAccount, dc.AccountID),
	}
	var missing []string
	if c.BaseURL == "" {
		missing = append(missing, "API URL (--api-url or SHOAL_API_URL)")
	}
	if c.Token == "" {
		missing = append(missing, "token (--token or SHOAL_API_TOKEN)")
	}
	if c.AccountID == "" {
		missing = append(missing, "account ID (--account-id or SHOAL_ACCOUNT_ID)")
	}
	if len(missing) > 0 {
		return nil, usagef("missing %s; or run 'shoal dev' in this directory", strings.Join(missing, ", "))
	}
	return c, nil
}

// printJSON prints an API result as indented JSON.
func (e *d1Env) printJSON(raw json.RawMessage) error {
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return err
	}
	enc := json.NewEncoder(e.stdout)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false) // SQL text keeps its < > &
	return enc.Encode(v)
}

// interactive reports whether progress output is allowed: only when both
// stdout and stderr are terminals.
func (e *d1Env) interactive() bool { return e.isTerminal(e.stdout) && e.isTerminal(e.stderr) }

func (e *d1Env) confirm(prompt string) (bool, error) {
	return confirmPrompt(e.stdin, e.stderr, e.isTerminal, prompt)
}

// confirmPrompt asks prompt on stderr and reads y/yes from stdin, which
// must be a terminal (scripts pass --yes instead).
func confirmPrompt(stdin io.Reader, stderr io.Writer, isTerminal func(any) bool, prompt string) (bool, error) {
	if !isTerminal(stdin) {
		return false, usagef("refusing to continue without --yes: stdin is not a terminal")
	}
	fmt.Fprintf(stderr, "%s [y/N] ", prompt)
	line, err := bufio.NewReader(stdin).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return false, err
	}
	a := strings.ToLower(strings.TrimSpace(line))
	return a == "y" || a == "yes", nil
}
