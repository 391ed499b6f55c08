package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/olekukonko/tablewriter"
	"github.com/spf13/cobra"

	"github.com/shoaldb/shoal/d1client"
)

func (e *d1Env) table(header []string, rows [][]string) error {
	t := tablewriter.NewWriter(e.stdout)
	h := make([]any, len(header))
	for i, s := range header {
		h[i] = s
	}
	t.Header(h...)
	for _, r := range rows {
		if err := t.Append(r); err != nil {
			return err
		}
	}
	return t.Render()
}

func jur(j *string) string {
	if j == nil {
		return ""
	}
	return *j
}

func (e *d1Env) createCmd() *cobra.Command {
	var location, jurisdiction string
	cmd := &cobra.Command{
		Use:   "create NAME",
		Short: "Create a database",
		Example: `  shoal d1 create my-db
  shoal d1 create eu-db --jurisdiction eu
  shoal d1 create my-db --location weur --json`,
	}
	cmd.Args = e.nargs(1, "one database NAME")
	cmd.RunE = e.run(func(ctx context.Context, c *d1client.Client, args []string) error {
		var raw json.RawMessage
		d, err := c.Create(ctx, args[0], d1client.CreateOptions{PrimaryLocationHint: location, Jurisdiction: jurisdiction}, &raw)
		if err != nil {
			return err
		}
		if e.jsonOut {
			return e.printJSON(raw)
		}
		fmt.Fprintf(e.stdout, "Created database %q\n", d.Name)
		return e.table([]string{"uuid", "name", "created_at", "region", "jurisdiction"},
			[][]string{{d.UUID, d.Name, d.CreatedAt, d.RunningInRegion, jur(d.Jurisdiction)}})
	})
	cmd.Flags().StringVar(&location, "location", "", "primary location hint (wnam, enam, weur, eeur, apac, oc)")
	cmd.Flags().StringVar(&jurisdiction, "jurisdiction", "", "jurisdiction (eu, fedramp)")
	cmd.Flags().BoolVar(&e.jsonOut, "json", false, "print the raw API result")
	return cmd
}

func (e *d1Env) listCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "list", Short: "List databases", Example: "  shoal d1 list\n  shoal d1 list --json"}
	cmd.Args = e.nargs(0, "no arguments")
	cmd.RunE = e.run(func(ctx context.Context, c *d1client.Client, _ []string) error {
		var raw json.RawMessage
		dbs, err := c.List(ctx, "", &raw)
		if err != nil {
			return err
		}
		if e.jsonOut {
			b, err := json.Marshal(dbs)
			if err != nil {
				return err
			}
			return e.printJSON(b)
		}
		rows := make([][]string, 0, len(dbs))
		for _, d := range dbs {
			rows = append(rows, []string{d.UUID, d.Name, d.CreatedAt, jur(d.Jurisdiction)})
		}
		return e.table([]string{"uuid", "name", "created_at", "jurisdiction"}, rows)
	})
	cmd.Flags().BoolVar(&e.jsonOut, "json", false, "print the raw API result (all pages)")
	return cmd
}

func (e *d1Env) infoCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "info DB", Short: "Show a database's details", Example: "  shoal d1 info my-db\n  shoal d1 info 0b9f…-uuid --json"}
	cmd.Args = e.nargs(1, "one database name or UUID")
	cmd.RunE = e.run(func(ctx context.Context, c *d1client.Client, args []string) error {
		id, err := c.Resolve(ctx, args[0])
		if err != nil {
			return err
		}
		var raw json.RawMessage
		d, err := c.Get(ctx, id, &raw)
		if err != nil {
			return err
		}
		if e.jsonOut {
			return e.printJSON(raw)
		}
		return e.table([]string{"field", "value"}, [][]string{
			{"name", d.Name}, {"uuid", d.UUID}, {"created_at", d.CreatedAt}, {"version", d.Version},
			{"num_tables", fmt.Sprint(d.NumTables)}, {"file_size", humanBytes(d.FileSize)},
			{"region", d.RunningInRegion}, {"jurisdiction", jur(d.Jurisdiction)},
		})
	})
	cmd.Flags().BoolVar(&e.jsonOut, "json", false, "print the raw API result")
	return cmd
}

func humanBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.2f GB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.2f MB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f kB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

func (e *d1Env) deleteCmd() *cobra.Command {
	var yes bool
	cmd := &cobra.Command{Use: "delete DB", Short: "Delete a database (asks for confirmation)",
		Example: "  shoal d1 delete my-db\n  shoal d1 delete my-db --yes   # scripts: required when stdin is not a terminal"}
	cmd.Args = e.nargs(1, "one database name or UUID")
	cmd.RunE = e.run(func(ctx context.Context, c *d1client.Client, args []string) error {
		id, err := c.Resolve(ctx, args[0])
		if err != nil {
			return err
		}
		// Check it exists before asking: "not found" beats a pointless prompt.
		if _, err := c.Get(ctx, id, nil); err != nil {
			return err
		}
		if !yes {
			ok, err := e.confirm(fmt.Sprintf("Delete database %s (%s)? This cannot be undone.", args[0], id))
			if err != nil {
				return err
			}
			if !ok {
				fmt.Fprintln(e.stderr, "Not deleted.")
				return nil
			}
		}
		if err := c.Delete(ctx, id); err != nil {
			return err
		}
		fmt.Fprintf(e.stdout, "Deleted database %s (%s)\n", args[0], id)
		return nil
	})
	cmd.Flags().BoolVarP(&yes, "yes", "y", false, "do not ask for confirmation")
	return cmd
}

func (e *d1Env) executeCmd() *cobra.Command {
	var command, file string
	cmd := &cobra.Command{Use: "execute DB (--command SQL | --file FILE)", Short: "Run SQL on a database",
		Long: `Run SQL on a database. --command sends the SQL to /raw (or /query with
--json) as one request: several ';'-separated statements run as one
transaction and every result set is printed as a table. --file streams the
file through the import API (any size up to 5 GB, one transaction), like
wrangler d1 execute --file --remote.`,
		Example: `  shoal d1 execute my-db --command "SELECT * FROM users LIMIT 10"
  shoal d1 execute my-db --command "INSERT INTO t VALUES (1)" --json
  shoal d1 execute my-db --file schema.sql`}
	cmd.Args = e.nargs(1, "one database name or UUID")
	cmd.RunE = e.run(func(ctx context.Context, c *d1client.Client, args []string) error {
		if (command == "") == (file == "") {
			return usagef("give exactly one of --command or --file")
		}
		id, err := c.Resolve(ctx, args[0])
		if err != nil {
			return err
		}
		if file != "" {
			return e.importFile(ctx, c, args[0], id, file)
		}
		var raw json.RawMessage
		if e.jsonOut {
			if _, err := c.Query(ctx, id, command, &raw); err != nil {
				return err
			}
			return e.printJSON(raw)
		}
		res, err := c.Raw(ctx, id, command, &raw)
		if err != nil {
			return err
		}
		for i, r := range res {
			if len(res) > 1 {
				fmt.Fprintf(e.stdout, "-- statement %d\n", i+1)
			}
			if len(r.Results.Columns) > 0 {
				rows := make([][]string, 0, len(r.Results.Rows))
				for _, row := range r.Results.Rows {
					cells := make([]string, len(row))
					for j, v := range row {
						cells[j] = cell(v)
					}
					rows = append(rows, cells)
				}
				if err := e.table(r.Results.Columns, rows); err != nil {
					return err
				}
			}
			fmt.Fprintf(e.stdout, "%s\n", metaLine(r.Meta))
		}
		return nil
	})
	cmd.Flags().StringVar(&command, "command", "", "SQL to run")
	cmd.Flags().StringVar(&file, "file", "", "SQL file to run (through the import API)")
	cmd.Flags().BoolVar(&e.jsonOut, "json", false, "print the raw API result")
	return cmd
}

func cell(v any) string {
	switch x := v.(type) {
	case nil:
		return "NULL"
	case string:
		return x
	case json.Number:
		return x.String()
	default:
		b, _ := json.Marshal(x)
		return string(b)
	}
}

func metaLine(m map[string]any) string {
	num := func(k string) string {
		if v, ok := m[k]; ok {
			return fmt.Sprint(v)
		}
		return "0"
	}
	return fmt.Sprintf("(%s rows read, %s rows written, %s changes, %s ms)", num("rows_read"), num("rows_written"), num("changes"), num("duration"))
}

func (e *d1Env) exportCmd() *cobra.Command {
	var output string
	var noData, noSchema bool
	var tables []string
	cmd := &cobra.Command{Use: "export DB --output FILE", Short: "Export a database as an SQL dump",
		Example: `  shoal d1 export my-db --output my-db.sql
  shoal d1 export my-db --output schema.sql --no-data
  shoal d1 export my-db --output users.sql --table users --table orders`}
	cmd.Args = e.nargs(1, "one database name or UUID")
	cmd.RunE = e.run(func(ctx context.Context, c *d1client.Client, args []string) error {
		if output == "" {
			return usagef("--output FILE is required")
		}
		if noData && noSchema {
			return usagef("--no-data and --no-schema exclude everything")
		}
		id, err := c.Resolve(ctx, args[0])
		if err != nil {
			return err
		}
		// Write to a temporary file renamed at the end: an interrupted
		// export never leaves a truncated FILE that looks complete.
		tmp, err := os.CreateTemp(filepath.Dir(output), filepath.Base(output)+".*.part")
		if err != nil {
			return err
		}
		defer os.Remove(tmp.Name())
		p := e.newProgress("exporting", "preparing export")
		n, err := c.Export(ctx, id, d1client.DumpOptions{NoData: noData, NoSchema: noSchema, Tables: tables}, &stmtCounter{w: tmp, p: p}, p.hooks())
		p.done()
		if cerr := tmp.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
		if err := os.Rename(tmp.Name(), output); err != nil {
			return err
		}
		fmt.Fprintf(e.stdout, "Exported %s (%s) to %s\n", args[0], humanBytes(n), output)
		return nil
	})
	cmd.Flags().StringVarP(&output, "output", "o", "", "file to write the dump to (required)")
	cmd.Flags().BoolVar(&noData, "no-data", false, "schema only")
	cmd.Flags().BoolVar(&noSchema, "no-schema", false, "data only")
	cmd.Flags().StringArrayVar(&tables, "table", nil, "export only this table (repeatable)")
	return cmd
}

func (e *d1Env) importCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "import DB FILE", Short: "Import an SQL file (up to 5 GB) in one transaction",
		Long: `Import an SQL file through D1's import API: the file's MD5 is the etag, it is
uploaded (streamed) to a signed URL, then ingested in ONE transaction on the
server: either every statement applies or none does. Output of 'sqlite3
.dump' and of 'shoal d1 export' is accepted (their BEGIN/COMMIT lines are
skipped).`,
		Example: "  shoal d1 import my-db my-db.sql"}
	cmd.Args = e.nargs(2, "a database name or UUID and a FILE")
	cmd.RunE = e.run(func(ctx context.Context, c *d1client.Client, args []string) error {
		id, err := c.Resolve(ctx, args[0])
		if err != nil {
			return err
		}
		return e.importFile(ctx, c, args[0], id, args[1])
	})
	return cmd
}

func (e *d1Env) importFile(ctx context.Context, c *d1client.Client, name, id, path string) error {
	if _, err := os.Stat(path); err != nil {
		return usagef("%v", err)
	}
	p := e.newProgress("uploading", "importing")
	st, err := c.Import(ctx, id, path, p.hooks(), p.importStatus)
	p.done()
	if err != nil {
		return err
	}
	for _, m := range st.Messages {
		// The import applied, with a caveat (durability "archived": the
		// archive store has not confirmed it yet).
		if strings.HasPrefix(m, "Warning:") {
			fmt.Fprintln(e.stderr, m)
		}
	}
	if e.jsonOut {
		b, err := json.Marshal(st)
		if err != nil {
			return err
		}
		return e.printJSON(b)
	}
	var nq int64
	if st.Result != nil {
		nq = st.Result.NumQueries
	}
	fmt.Fprintf(e.stdout, "Imported %s into %s: %d statements executed\n", path, name, nq)
	return nil
}

func (e *d1Env) bindingCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "binding", Short: "Binding tokens (direct data-plane credentials for one database)"}
	var ttl int64
	create := &cobra.Command{Use: "create DB", Short: "Mint a binding token for a database",
		Example: "  shoal d1 binding create my-db\n  shoal d1 binding create my-db --ttl 600 --json"}
	create.Args = e.nargs(1, "one database name or UUID")
	create.RunE = e.run(func(ctx context.Context, c *d1client.Client, args []string) error {
		id, err := c.Resolve(ctx, args[0])
		if err != nil {
			return err
		}
		var raw json.RawMessage
		b, err := c.CreateBinding(ctx, id, ttl, &raw)
		if err != nil {
			return err
		}
		if e.jsonOut {
			return e.printJSON(raw)
		}
		return e.table([]string{"database_uuid", "expires_at", "token_id", "token"}, [][]string{{b.DatabaseUUID, b.ExpiresAt, b.TokenID, b.Token}})
	})
	create.Flags().Int64Var(&ttl, "ttl", 0, "lifetime in seconds (default: the edge's, 1 h)")
	create.Flags().BoolVar(&e.jsonOut, "json", false, "print the raw API result")

	var all bool
	revoke := &cobra.Command{Use: "revoke DB [TOKEN_ID] [--all]", Short: "Revoke one binding token (by the token_id create printed), or --all of them",
		Example: "  shoal d1 binding revoke my-db 0f3c…   # one token\n  shoal d1 binding revoke my-db --all    # every token minted so far"}
	revoke.Args = func(cmd *cobra.Command, args []string) error {
		var err error
		switch {
		case len(args) == 2 && !all, len(args) == 1 && all:
			return nil
		case len(args) == 2 && all:
			err = usagef("%s: give a TOKEN_ID or --all, not both", cmd.CommandPath())
		default:
			err = usagef("%s expects DB and a TOKEN_ID, or DB --all (see '%s --help')", cmd.CommandPath(), cmd.CommandPath())
		}
		e.fail(err)
		return err
	}
	revoke.RunE = e.run(func(ctx context.Context, c *d1client.Client, args []string) error {
		id, err := c.Resolve(ctx, args[0])
		if err != nil {
			return err
		}
		tokenID := ""
		if !all {
			tokenID = args[1]
		}
		var raw json.RawMessage
		r, err := c.RevokeBinding(ctx, id, tokenID, &raw)
		if err != nil {
			return err
		}
		if e.jsonOut {
			return e.printJSON(raw)
		}
		if r.All {
			fmt.Fprintf(e.stdout, "Revoked every binding token of %s minted so far\n", args[0])
		} else {
			fmt.Fprintf(e.stdout, "Revoked binding token %s of %s\n", r.TokenID, args[0])
		}
		return nil
	})
	revoke.Flags().BoolVar(&all, "all", false, "revoke every binding token of the database minted so far")
	revoke.Flags().BoolVar(&e.jsonOut, "json", false, "print the raw API result")
	cmd.AddCommand(create, revoke)
	return cmd
}
