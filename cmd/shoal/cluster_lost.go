package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"

	"github.com/shoaldb/shoal/edge"
	"github.com/shoaldb/shoal/internal/pki"
	"github.com/shoaldb/shoal/raftmeta"
	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// newClusterHostCmd is `shoal cluster host`: an operator's decisions about
// object hosts — declaring one lost (its databases are restored on other
// hosts from the archive: edge/relocate.go) and readmitting it.
func newClusterHostCmd(addr *string, timeout *time.Duration, opTLS func() *pki.Loader) *cobra.Command {
	cmd := &cobra.Command{Use: "host", Short: "Declare an object host lost (its databases come back on other hosts from the archive), or readmit it"}
	client := func() (*raftmeta.Client, error) {
		return raftmeta.NewClient([]string{*addr}, raftmeta.WithCacheTTL(0), raftmeta.WithRetries(5, 100*time.Millisecond, 2*time.Second), raftmeta.WithTLS(opTLS()))
	}
	var (
		yes, emptyOK, asJSON bool
		concurrency          int
	)
	lost := &cobra.Command{
		Use:   "lost HOST",
		Short: "Declare HOST lost and restore each of its databases on another host from the archive",
		Long: `Declare the object host HOST lost, then restore every database the catalog
places on it on another active host, from its off-host archive, at its last
archived commit: a new object, a bumped routing generation, written through
the catalog's compare-and-set. Clients see each database come back by
itself. Commits HOST had not archived yet are lost (about the shipping lag,
shoal_history_lag_seconds; none with durability = "archived"). Make sure
HOST is stopped: if it still serves, what it acknowledges from now on is
lost too. If HOST returns, it retires its superseded objects (their files
are kept for the deleted-retention period).

Safe to run again: it resumes with the databases still placed on HOST.
A database with no archived history at all is reported and left (on a
host that ran without an archive it would become empty); --empty-ok
recreates those empty.`,
		Example: "  shoal cluster host lost h2\n  shoal cluster host lost h2 --yes --json   # scripts",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := client()
			if err != nil {
				return err
			}
			defer cl.Close()
			hostID := args[0]
			ctx := cmd.Context()
			hctx, cancel := context.WithTimeout(ctx, *timeout)
			hosts, err := cl.Hosts(hctx, raftmeta.LinearizableRead())
			cancel()
			if err != nil {
				return fmt.Errorf("read the catalog's hosts at %s: %w", *addr, err)
			}
			var h *fsm.Host
			for i := range hosts {
				if hosts[i].ID == hostID {
					h = &hosts[i]
				}
			}
			if h == nil {
				ids := make([]string, 0, len(hosts))
				for _, x := range hosts {
					ids = append(ids, x.ID)
				}
				sort.Strings(ids)
				return usagef("no object host %q in the catalog (hosts: %v)", hostID, ids)
			}
			stderr := cmd.ErrOrStderr()
			if h.State != fsm.HostStateLost && !yes {
				ok, err := confirmPrompt(cmd.InOrStdin(), stderr, fileIsTerminal, fmt.Sprintf(
					"Declare object host %s (%s, %d databases, last report %s ago) lost?\n"+
						"Its databases are restored on other hosts from the archive; commits it had not archived are lost.\n"+
						"Make sure it is stopped: what it acknowledges from now on is lost too.",
					h.ID, h.Address, h.Databases, time.Since(time.Unix(0, h.UpdatedAt)).Round(time.Second)))
				if err != nil {
					return err
				}
				if !ok {
					return usagef("not declared lost")
				}
			}
			log := slog.New(slog.NewTextHandler(io.Discard, nil))
			if os.Getenv("SHOAL_LOG_RELOCATIONS") != "" {
				log = slog.New(slog.NewTextHandler(stderr, nil))
			}
			var bar *progressbar.ProgressBar
			lastLine := time.Now()
			opts := edge.RecoverOptions{Concurrency: concurrency, EmptyIfNone: emptyOK, Logger: log,
				Progress: func(p edge.RecoverProgress) {
					switch {
					case fileIsTerminal(stderr) && !asJSON:
						if bar == nil {
							bar = progressbar.NewOptions(-1, progressbar.OptionSetWriter(stderr),
								progressbar.OptionSetDescription("relocating"), progressbar.OptionShowCount(),
								progressbar.OptionThrottle(100*time.Millisecond), progressbar.OptionClearOnFinish())
						}
						_ = bar.Add(1)
					case time.Since(lastLine) >= 5*time.Second:
						lastLine = time.Now()
						fmt.Fprintf(stderr, "relocated %d of %d listed so far\n", p.Done, p.Listed)
					}
				}}
			hc := edge.NewHostClient(0, opTLS())
			defer hc.Close()
			rc := edge.NewRecoverer(edge.RaftmetaRecovery{C: cl}, hc, opts)
			if h.State != fsm.HostStateLost {
				dctx, cancel := context.WithTimeout(ctx, *timeout)
				_, err := rc.DeclareLost(dctx, hostID, time.Time{})
				cancel()
				if err != nil {
					return fmt.Errorf("declare %s lost: %w", hostID, err)
				}
				fmt.Fprintf(stderr, "host %s declared lost; relocating its databases\n", hostID)
			} else {
				fmt.Fprintf(stderr, "host %s is already declared lost; resuming the relocation of its databases\n", hostID)
			}
			rep, err := rc.Recover(ctx, hostID)
			if bar != nil {
				_ = bar.Finish()
			}
			out := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				if eerr := enc.Encode(rep); eerr != nil {
					return eerr
				}
			} else {
				printRecoverReport(out, rep)
			}
			if err != nil {
				return err
			}
			if !rep.Complete() {
				return fmt.Errorf("%d databases are still placed on %s (%d without archived history, %d deleted on the host, %d failed): rerun to retry%s%s",
					len(rep.NoArchive)+len(rep.DeletedOnHost)+len(rep.Failed), hostID, len(rep.NoArchive), len(rep.DeletedOnHost), len(rep.Failed),
					emptyHint(len(rep.NoArchive)), deletedOnHostHint(len(rep.DeletedOnHost)))
			}
			return nil
		},
	}
	lost.Flags().BoolVarP(&yes, "yes", "y", false, "do not ask for confirmation (required when stdin is not a terminal)")
	lost.Flags().BoolVar(&emptyOK, "empty-ok", false, "recreate databases with no archived history as empty databases")
	lost.Flags().IntVar(&concurrency, "concurrency", 8, "databases restored at once")
	lost.Flags().BoolVar(&asJSON, "json", false, "print the report as JSON")

	readmit := &cobra.Command{
		Use:   "readmit HOST",
		Short: "Make a host declared lost active again (databases already relocated stay where they are)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := client()
			if err != nil {
				return err
			}
			defer cl.Close()
			ctx, cancel := context.WithTimeout(cmd.Context(), *timeout)
			defer cancel()
			h, err := edge.NewRecoverer(edge.RaftmetaRecovery{C: cl}, nil, edge.RecoverOptions{}).Readmit(ctx, args[0])
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "host %s is %s\n", h.ID, h.State)
			return nil
		},
	}
	cmd.AddCommand(lost, readmit)
	return cmd
}

func emptyHint(noArchive int) string {
	if noArchive == 0 {
		return ""
	}
	return "; --empty-ok recreates databases without archived history as empty ones"
}

func deletedOnHostHint(n int) string {
	if n == 0 {
		return ""
	}
	return "; databases deleted on the host are listed again by a catalog restored from an older backup and are not restored from the archive: see docs/operations.md, \"Backup and restore\""
}

func printRecoverReport(w io.Writer, r edge.RecoverReport) {
	fmt.Fprintf(w, "host %s: %d databases listed, %d relocated", r.Host, r.Listed, r.Relocated)
	if r.Already > 0 {
		fmt.Fprintf(w, ", %d already moved", r.Already)
	}
	if r.Deleted > 0 {
		fmt.Fprintf(w, ", %d deleted meanwhile", r.Deleted)
	}
	fmt.Fprintf(w, " in %s", r.Elapsed.Round(time.Millisecond))
	if r.Relocated > 0 {
		fmt.Fprintf(w, " (per database: p50 %s, p99 %s, max %s)", r.P50.Round(time.Millisecond), r.P99.Round(time.Millisecond), r.Max.Round(time.Millisecond))
	}
	fmt.Fprintln(w)
	show := func(title string, ids []string, why func(string) string) {
		if len(ids) == 0 {
			return
		}
		fmt.Fprintf(w, "%s (%d):\n", title, len(ids))
		for i, id := range ids {
			if i == 10 {
				fmt.Fprintf(w, "  … and %d more (--json lists all)\n", len(ids)-10)
				break
			}
			fmt.Fprintf(w, "  %s%s\n", id, why(id))
		}
	}
	show("without archived history, left on the host", r.NoArchive, func(string) string { return "" })
	failed := make([]string, 0, len(r.Failed))
	for id := range r.Failed {
		failed = append(failed, id)
	}
	sort.Strings(failed)
	show("failed", failed, func(id string) string { return ": " + r.Failed[id] })
	zombies := make([]string, 0, len(r.DeletedOnHost))
	for id := range r.DeletedOnHost {
		zombies = append(zombies, id)
	}
	sort.Strings(zombies)
	show("deleted on the host (the archive holds its delete marker), not revived, left on the host in the catalog", zombies,
		func(id string) string { return ": " + r.DeletedOnHost[id] })
}

// newClusterAuditCmd is `shoal cluster audit`: the catalog's audit log of
// control-plane actions, newest first.
func newClusterAuditCmd(addr *string, timeout *time.Duration, opTLS func() *pki.Loader) *cobra.Command {
	var (
		account, since string
		limit          int
		asJSON         bool
	)
	cmd := &cobra.Command{
		Use:   "audit [--account ID] [--since 24h] [--limit 100] [--json]",
		Short: "Show the audit log of control-plane actions (who, what, when, from where), newest first",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cl, err := raftmeta.NewClient([]string{*addr}, raftmeta.WithCacheTTL(0), raftmeta.WithRetries(3, 100*time.Millisecond, time.Second), raftmeta.WithTLS(opTLS()))
			if err != nil {
				return err
			}
			defer cl.Close()
			q := fsm.AuditQuery{AccountID: account, Limit: limit}
			if since != "" {
				d, err := parseDays(since)
				if err != nil || d <= 0 {
					return usagef("--since %q: a positive duration such as 24h or 7d", since)
				}
				q.Since = time.Now().Add(-d).UnixNano()
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), *timeout)
			defer cancel()
			page, err := cl.AuditPage(ctx, q, raftmeta.LinearizableRead())
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				return enc.Encode(page)
			}
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "TIME\tACTION\tACTOR\tFROM\tACCOUNT\tSUBJECT\tDETAIL")
			for _, e := range page.Entries {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", time.Unix(0, e.Time).UTC().Format(time.RFC3339), e.Type, e.Actor,
					e.Source, e.AccountID, e.Subject, e.Detail)
			}
			return tw.Flush()
		},
	}
	cmd.Flags().StringVar(&account, "account", "", "only this account's actions")
	cmd.Flags().StringVar(&since, "since", "", "only actions this recent (e.g. 24h, 7d)")
	cmd.Flags().IntVar(&limit, "limit", 100, "at most this many rows (1..1000)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}
