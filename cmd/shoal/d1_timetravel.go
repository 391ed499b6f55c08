package main

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/shoaldb/shoal/d1client"
)

// timeTravelCmd is `shoal d1 time-travel info|restore`, like wrangler's.
func (e *d1Env) timeTravelCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "time-travel", Short: "Bookmarks and restores of a database's history (like wrangler d1 time-travel)",
		Long: `Every commit of a database is kept in its object host's archive (7 days on
the free tier, 30 on paid ones). info prints the current bookmark, or with
--timestamp the bookmark of the database as it was then; restore brings the
database back to a bookmark or a time, and prints the bookmark that undoes it.`}
	var ts string
	info := &cobra.Command{Use: "info DB", Short: "Print the current bookmark, or the one at --timestamp",
		Example: "  shoal d1 time-travel info my-db\n  shoal d1 time-travel info my-db --timestamp 2026-12-01T12:00:00Z"}
	info.Args = e.nargs(1, "one database name or UUID")
	info.RunE = e.run(func(ctx context.Context, c *d1client.Client, args []string) error {
		id, err := c.Resolve(ctx, args[0])
		if err != nil {
			return err
		}
		var raw json.RawMessage
		bm, err := c.Bookmark(ctx, id, ts, &raw)
		if err != nil {
			return err
		}
		if e.jsonOut {
			return e.printJSON(raw)
		}
		at := "now"
		if ts != "" {
			at = "at " + ts
		}
		fmt.Fprintf(e.stdout, "Bookmark of %s %s: %s\nRestore to it with: shoal d1 time-travel restore %s --bookmark %s\n", args[0], at, bm, args[0], bm)
		return nil
	})
	info.Flags().StringVar(&ts, "timestamp", "", "a past moment (RFC 3339 or Unix seconds) instead of now")
	info.Flags().BoolVar(&e.jsonOut, "json", false, "print the raw API result")

	var bookmark, rts string
	var yes bool
	restore := &cobra.Command{Use: "restore DB (--bookmark B | --timestamp T)", Short: "Restore a database to a bookmark or a moment (undoable)",
		Example: "  shoal d1 time-travel restore my-db --bookmark 0006619f-01d4ac84-00000001-…\n  shoal d1 time-travel restore my-db --timestamp 2026-12-01T12:00:00Z -y"}
	restore.Args = e.nargs(1, "one database name or UUID")
	restore.RunE = e.run(func(ctx context.Context, c *d1client.Client, args []string) error {
		if (bookmark == "") == (rts == "") {
			return usagef("give exactly one of --bookmark or --timestamp")
		}
		id, err := c.Resolve(ctx, args[0])
		if err != nil {
			return err
		}
		if !yes {
			to := bookmark
			if to == "" {
				to = rts
			}
			ok, err := e.confirm(fmt.Sprintf("Restore database %s (%s) to %s? Its current state stays reachable by the bookmark printed after the restore.", args[0], id, to))
			if err != nil {
				return err
			}
			if !ok {
				fmt.Fprintln(e.stderr, "Not restored.")
				return nil
			}
		}
		var raw json.RawMessage
		r, err := c.RestoreTo(ctx, id, bookmark, rts, &raw)
		if err != nil {
			return err
		}
		if e.jsonOut {
			return e.printJSON(raw)
		}
		fmt.Fprintf(e.stdout, "Restored %s to bookmark %s\nUndo with: shoal d1 time-travel restore %s --bookmark %s\n", args[0], r.Bookmark, args[0], r.PreviousBookmark)
		return nil
	})
	restore.Flags().StringVar(&bookmark, "bookmark", "", "the bookmark to restore to")
	restore.Flags().StringVar(&rts, "timestamp", "", "the moment to restore to (RFC 3339 or Unix seconds)")
	restore.Flags().BoolVarP(&yes, "yes", "y", false, "do not ask for confirmation")
	restore.Flags().BoolVar(&e.jsonOut, "json", false, "print the raw API result")
	cmd.AddCommand(info, restore)
	return cmd
}

// forkCmd is `shoal d1 fork DB NEW [--bookmark B | --timestamp T]`.
func (e *d1Env) forkCmd() *cobra.Command {
	var bookmark, ts, hint string
	cmd := &cobra.Command{Use: "fork DB NEW [--bookmark B | --timestamp T]", Short: "Create database NEW as a copy of DB now, at a bookmark or at a moment (beyond D1)",
		Long: `Create database NEW in the same account with DB's content as of now, a
bookmark (from time-travel info) or a moment (--timestamp, within the
time-travel retention). The copy is read from DB's archive: DB is never
blocked, and NEW has its own history from then on.`,
		Example: "  shoal d1 fork my-db my-db-preview\n  shoal d1 fork my-db before-migration --timestamp 2026-12-01T12:00:00Z"}
	cmd.Args = e.nargs(2, "the source database (name or UUID) and the new database's name")
	cmd.RunE = e.run(func(ctx context.Context, c *d1client.Client, args []string) error {
		if bookmark != "" && ts != "" {
			return usagef("give at most one of --bookmark or --timestamp")
		}
		id, err := c.Resolve(ctx, args[0])
		if err != nil {
			return err
		}
		var raw json.RawMessage
		f, err := c.Fork(ctx, id, args[1], d1client.ForkOptions{Bookmark: bookmark, Timestamp: ts, PrimaryLocationHint: hint}, &raw)
		if err != nil {
			return err
		}
		if e.jsonOut {
			return e.printJSON(raw)
		}
		fmt.Fprintf(e.stdout, "Created %s (%s) from %s at bookmark %s\n", f.Name, f.UUID, args[0], f.ForkedFrom.Bookmark)
		return nil
	})
	cmd.Flags().StringVar(&bookmark, "bookmark", "", "the source's bookmark to fork at")
	cmd.Flags().StringVar(&ts, "timestamp", "", "the moment to fork at (RFC 3339 or Unix seconds)")
	cmd.Flags().StringVar(&hint, "location", "", "location hint for the new database when the source has no jurisdiction (wnam, enam, weur, eeur, apac, oc)")
	cmd.Flags().BoolVar(&e.jsonOut, "json", false, "print the raw API result")
	return cmd
}
