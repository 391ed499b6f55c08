package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/shoaldb/shoal/d1client"
	"github.com/spf13/cobra"
)

// newAdminCmd is `shoal admin`: account and token management against an
// edge's /admin/v1 API, authenticated with the operator's admin token.
func newAdminCmd() *cobra.Command {
	var edgeURL, token string
	cmd := &cobra.Command{Use: "admin", Short: "Manage accounts, tiers and API tokens (talks to an edge)"}
	pf := cmd.PersistentFlags()
	pf.StringVar(&edgeURL, "edge", envOr("SHOAL_EDGE", "http://127.0.0.1:8787"), "edge base URL (default $SHOAL_EDGE)")
	pf.StringVar(&token, "admin-token", "", "admin token (default $SHOAL_ADMIN_TOKEN)")
	cmd.PersistentPreRun = func(*cobra.Command, []string) {
		if token == "" {
			token = os.Getenv("SHOAL_ADMIN_TOKEN") // not a flag default: --help must not print it
		}
	}
	call := func(cmd *cobra.Command, method, path string, body any) error {
		if token == "" {
			return errors.New("--admin-token (or $SHOAL_ADMIN_TOKEN) is required")
		}
		var res any
		if err := adminCall(cmd.Context(), edgeURL, token, method, path, body, &res); err != nil {
			return err
		}
		out, _ := json.MarshalIndent(res, "", "  ")
		fmt.Fprintln(cmd.OutOrStdout(), string(out))
		return nil
	}

	acct := &cobra.Command{Use: "account", Short: "Accounts and their tier/limits"}
	var name, tier, id string
	var maxDBs int64
	create := &cobra.Command{
		Use: "create", Short: "Create an account (prints its id)", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return call(cmd, http.MethodPost, "/admin/v1/accounts", map[string]any{"id": id, "name": name, "tier": tier})
		},
	}
	create.Flags().StringVar(&name, "name", "", "display name")
	create.Flags().StringVar(&tier, "tier", "free", "tier: free or paid")
	create.Flags().StringVar(&id, "id", "", "account id (default: 32 random hex chars)")
	get := &cobra.Command{
		Use: "get ACCOUNT_ID", Short: "Show an account", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return call(cmd, http.MethodGet, "/admin/v1/accounts/"+args[0], nil)
		},
	}
	update := &cobra.Command{
		Use: "update ACCOUNT_ID", Short: "Change an account's tier (resets limits to the tier's) or its database limit", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			body := map[string]any{}
			if cmd.Flags().Changed("tier") {
				body["tier"] = tier
			}
			if cmd.Flags().Changed("max-databases") {
				// Read-modify-write: the API replaces the limits as a whole.
				var cur any
				if err := adminCall(cmd.Context(), edgeURL, token, http.MethodGet, "/admin/v1/accounts/"+args[0], nil, &cur); err != nil {
					return err
				}
				limits, _ := cur.(map[string]any)["limits"].(map[string]any)
				if limits == nil {
					limits = map[string]any{}
				}
				limits["max_databases"] = maxDBs
				body["limits"] = limits
			}
			if len(body) == 0 {
				return errors.New("nothing to update: give --tier and/or --max-databases")
			}
			return call(cmd, http.MethodPatch, "/admin/v1/accounts/"+args[0], body)
		},
	}
	update.Flags().StringVar(&tier, "tier", "", "new tier: free or paid")
	update.Flags().Int64Var(&maxDBs, "max-databases", 0, "new database limit")
	acct.AddCommand(create, get, update)

	tok := &cobra.Command{Use: "token", Short: "API tokens (bearer secrets, one account each)"}
	var (
		tokName, scope, ttl string
		databases           []string
	)
	mint := &cobra.Command{
		Use: "create ACCOUNT_ID [--scope read|edit] [--database NAME ...] [--ttl 30d]", Short: "Mint a token; the secret is shown once",
		Long: `Mint an API token of ACCOUNT_ID. --scope read makes a D1 Read token (queries
that write are refused by the object host, and no control-plane change is
allowed); --database (repeatable, a name or UUID) limits it to those
databases; --ttl makes it expire (Go durations, or days: 30d).`,
		Example: "  shoal admin token create 244fd4… --name ci-reader --scope read --database app-db --ttl 30d",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			body := map[string]any{"name": tokName}
			if scope != "" {
				body["scope"] = scope
			}
			if len(databases) > 0 {
				body["databases"] = databases
			}
			if ttl != "" {
				d, err := parseDays(ttl)
				if err != nil || d <= 0 {
					return usagef("--ttl %q: a positive duration such as 12h or 30d", ttl)
				}
				body["ttl_seconds"] = int64(d / time.Second)
			}
			return call(cmd, http.MethodPost, "/admin/v1/accounts/"+args[0]+"/tokens", body)
		},
	}
	mint.Flags().StringVar(&tokName, "name", "", "token name")
	mint.Flags().StringVar(&scope, "scope", "", "edit (default: read and write) or read (D1 Read)")
	mint.Flags().StringSliceVar(&databases, "database", nil, "limit the token to this database (name or UUID; repeatable)")
	mint.Flags().StringVar(&ttl, "ttl", "", "expire the token after this long (e.g. 12h, 30d); default never")
	revoke := &cobra.Command{
		Use: "revoke TOKEN_ID", Short: "Revoke a token (effective on every edge within its token TTL, 10 s by default)", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return call(cmd, http.MethodDelete, "/admin/v1/tokens/"+args[0], nil)
		},
	}
	tok.AddCommand(mint, revoke)

	purge := &cobra.Command{
		Use: "purge-routes", Short: "Drop the edge's local route cache (it refills from the catalog, bounded)", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return call(cmd, http.MethodPost, "/admin/v1/routes/purge", nil)
		},
	}
	cmd.AddCommand(acct, tok, purge)
	return cmd
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// adminCall sends one admin request and returns the envelope's result, or an
// error carrying the envelope's first error.
// adminCall calls the edge's admin API through d1client's v4 envelope
// handling and decodes the result into out; a refusal becomes an error
// naming the call, the HTTP status, the message and the code. Used by
// `shoal admin` and by `shoal dev` for its default account.
func adminCall(ctx context.Context, base, token, method, path string, body, out any) error {
	c := &d1client.Client{BaseURL: base, Token: token, HTTP: &http.Client{Timeout: 30 * time.Second}}
	err := c.Call(ctx, method, path, body, out)
	var ae *d1client.APIError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &ae):
		return fmt.Errorf("%s %s: HTTP %d: %s [code: %d]", method, path, ae.Status, ae.Message, ae.Code)
	default:
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
}

// parseDays is time.ParseDuration that also takes whole days ("30d").
func parseDays(s string) (time.Duration, error) {
	if n, ok := strings.CutSuffix(s, "d"); ok {
		days, err := strconv.Atoi(n)
		if err != nil {
			return 0, err
		}
		return time.Duration(days) * 24 * time.Hour, nil
	}
	return time.ParseDuration(s)
}
