package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/shoaldb/shoal/internal/pki"
	"github.com/shoaldb/shoal/objecthost"
	"github.com/shoaldb/shoal/raftmeta"
	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// resurrectedRow is one database a host reports as resurrected (deleted on
// the host, active again in a catalog restored from an older backup), with
// the catalog's fresh answer about it.
type resurrectedRow struct {
	Host string `json:"host"`
	objecthost.ResurrectedDatabase
	// Catalog: "active" (the catalog names this very object active: a
	// zombie), "deleted" (deleted again since), "unknown", or
	// "other_object" (the catalog names another object: left alone).
	Catalog string `json:"catalog"`
	// Deleted: --delete deleted it in the catalog in this run.
	Deleted bool   `json:"deleted,omitempty"`
	Error   string `json:"error,omitempty"`
}

// newClusterResurrectedCmd is `shoal cluster resurrected`: the databases
// the object hosts report as resurrected by a catalog restore
// (objecthost/resurrected.go), checked against the catalog on a
// linearizable read, and with --delete deleted again in the catalog.
func newClusterResurrectedCmd(addr *string, timeout *time.Duration, opTLS func() *pki.Loader) *cobra.Command {
	var del, yes, asJSON bool
	cmd := &cobra.Command{
		Use:   "resurrected",
		Short: "List databases a catalog restore brought back although they were deleted (every query answers 404); --delete deletes them again",
		Long: `List the databases that object hosts report as resurrected: deleted on the host
(their delete acknowledged), but active again in the catalog because it was
restored from an older backup (shoal cluster restore). They are listed and
counted against their account's database limit, while every query to them
answers 404: the host keeps their objects deleted and never revives one on
the catalog's word. Each host raises the resurrected_databases alarm for
them (shoal cluster status).

Every database is checked on a linearizable read of the catalog: only one
the catalog still names active with the very object the host deleted is a
zombie. With --delete (after a confirmation, or --yes), each zombie is read
again linearizably and, if still the same, deleted in the catalog by a
compare-and-delete: the catalog deletes it only while it still names the
host's object at the routing generation just read, so a database relocated
(lost-host recovery) in between is refused, reported with an error, and the
command goes on with the others and exits non-zero. That catalog write is
the checkpoint: a run stopped half-way leaves the rest listed, and running
the command again resumes. The conditional delete (delete_database_if)
needs catalog level 2: every catalog node must run a build that knows it,
and the leader then raises the cluster's level by itself (see
` + "`shoal cluster status`" + `); below it the command refuses before any write.
Databases the catalog names with another object (relocated elsewhere) are
shown and never deleted. The hosts' alarms clear at their next check (one
heartbeat interval).`,
		Example: "  shoal cluster resurrected\n  shoal cluster resurrected --delete\n  shoal cluster resurrected --delete --yes --json   # scripts",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			tlsL := opTLS()
			cl, err := raftmeta.NewClient([]string{*addr}, raftmeta.WithCacheTTL(0), raftmeta.WithRetries(5, 100*time.Millisecond, 2*time.Second), raftmeta.WithTLS(tlsL))
			if err != nil {
				return err
			}
			defer cl.Close()
			ctx := cmd.Context()
			hctx, cancel := context.WithTimeout(ctx, *timeout)
			hosts, err := cl.Hosts(hctx, raftmeta.StaleRead())
			cancel()
			if err != nil {
				return fmt.Errorf("read the catalog's hosts at %s: %w", *addr, err)
			}
			stderr := cmd.ErrOrStderr()
			rows, unreachable := fetchResurrected(ctx, hosts, tlsL)
			for _, u := range unreachable {
				fmt.Fprintf(stderr, "warning: %s\n", u)
			}
			for i := range rows {
				rows[i].Catalog, rows[i].Error, _ = resurrectedVerdict(ctx, cl, *timeout, rows[i])
			}
			zombies := 0
			for _, r := range rows {
				if r.Catalog == "active" {
					zombies++
				}
			}
			if del && zombies > 0 {
				// Before any write: the cluster's catalog level must allow
				// the conditional delete. The catalog refuses it anyway,
				// but a leader of a build from before levels (which knows
				// the command) would apply it while the others refuse it.
				sctx, cancel := context.WithTimeout(ctx, *timeout)
				st, err := raftmeta.NewAdmin(*addr, *timeout, tlsL).Status(sctx)
				cancel()
				if err != nil {
					return fmt.Errorf("read the catalog's level at %s: %w", *addr, err)
				}
				if err := deleteAllowedAt(st); err != nil {
					return fmt.Errorf("nothing deleted: %w", err)
				}
				if !yes {
					ok, err := confirmPrompt(cmd.InOrStdin(), stderr, fileIsTerminal, fmt.Sprintf(
						"Delete %d databases again in the catalog? Their deletes were acknowledged before the catalog was restored; every query to them answers 404.", zombies))
					if err != nil {
						return err
					}
					if !ok {
						return usagef("nothing deleted")
					}
				}
				deleteZombies(ctx, cl, *timeout, rows)
			}
			out := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				if err := enc.Encode(struct {
					Databases   []resurrectedRow `json:"databases"`
					Unreachable []string         `json:"unreachable,omitempty"`
				}{rows, unreachable}); err != nil {
					return err
				}
			} else {
				printResurrected(out, rows, del)
			}
			return resurrectedFailures(rows)
		},
	}
	cmd.Flags().BoolVar(&del, "delete", false, "delete again, in the catalog, every database still active with the host's deleted object")
	cmd.Flags().BoolVarP(&yes, "yes", "y", false, "do not ask for confirmation (required with --delete when stdin is not a terminal)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// fetchResurrected asks every host for GET /v1/resurrected (2 s each, in
// parallel); it answers the rows and a message per unreachable host.
func fetchResurrected(ctx context.Context, hosts []fsm.Host, tlsL *pki.Loader) ([]resurrectedRow, []string) {
	hc := &http.Client{Timeout: 2 * time.Second, Transport: tlsL.Transport(&http.Transport{}, pki.RoleHost)}
	var (
		mu          sync.Mutex
		rows        []resurrectedRow
		unreachable []string
		wg          sync.WaitGroup
	)
	for _, h := range hosts {
		wg.Add(1)
		go func(h fsm.Host) {
			defer wg.Done()
			dbs, err := fetchHostResurrected(ctx, hc, tlsL.Scheme()+"://"+h.Address)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				unreachable = append(unreachable, fmt.Sprintf("host %s (%s): %v: its resurrected databases are not listed", h.ID, h.Address, err))
				return
			}
			for _, d := range dbs {
				rows = append(rows, resurrectedRow{Host: h.ID, ResurrectedDatabase: d})
			}
		}(h)
	}
	wg.Wait()
	sort.Slice(rows, func(i, j int) bool {
		if !rows[i].DeletedAt.Equal(rows[j].DeletedAt) {
			return rows[i].DeletedAt.Before(rows[j].DeletedAt)
		}
		return rows[i].DatabaseUUID < rows[j].DatabaseUUID
	})
	sort.Strings(unreachable)
	return rows, unreachable
}

func fetchHostResurrected(ctx context.Context, hc *http.Client, base string) ([]objecthost.ResurrectedDatabase, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/resurrected", nil)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var env struct {
		Result struct {
			Databases []objecthost.ResurrectedDatabase `json:"databases"`
		} `json:"result"`
		Success bool `json:"success"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(&env); err != nil || !env.Success {
		return nil, fmt.Errorf("status %s: not an object host answer (a host older than this command?)", resp.Status)
	}
	return env.Result.Databases, nil
}

// resurrectedCatalog is what the command needs of raftmeta's Client: a
// linearizable read of one database and the compare-and-delete.
type resurrectedCatalog interface {
	Database(ctx context.Context, dbUUID string, o raftmeta.ReadOptions) (fsm.Database, error)
	DeleteDatabaseIf(ctx context.Context, d fsm.DeleteDatabaseIf) (fsm.Database, error)
}

var _ resurrectedCatalog = (*raftmeta.Client)(nil)

// deleteZombies deletes again, in the catalog, every row whose verdict is
// "active" (a zombie), each one a compare-and-delete (fsm.CmdDeleteDatabaseIf)
// of the host's object at the routing generation of a fresh linearizable
// read. The catalog write is the checkpoint, one per database: a run
// stopped anywhere leaves the databases not yet deleted listed, and running
// the command again resumes. A database relocated (lost-host recovery) or
// otherwise changed between the read and the write is refused by the
// catalog (conflict) and left alone: its row gets an error and the
// catalog's new answer, and the loop goes on with the next.
func deleteZombies(ctx context.Context, cl resurrectedCatalog, timeout time.Duration, rows []resurrectedRow) {
	for i := range rows {
		if rows[i].Catalog != "active" {
			continue
		}
		// A fresh answer right before the write: the database must still
		// be active with the host's object; its generation is the one the
		// delete is conditioned on.
		v, e, gen := resurrectedVerdict(ctx, cl, timeout, rows[i])
		if v != "active" {
			rows[i].Catalog, rows[i].Error = v, e
			continue
		}
		// The audit log's row for the delete names the command.
		wctx, cancel := context.WithTimeout(fsm.WithAudit(ctx, fsm.Audit{Actor: "operator", Source: "shoal cluster resurrected --delete"}), timeout)
		_, err := cl.DeleteDatabaseIf(wctx, fsm.DeleteDatabaseIf{AccountID: rows[i].AccountID, UUID: rows[i].DatabaseUUID,
			ExpectObjectID: rows[i].ObjectID, ExpectRoutingGeneration: gen})
		cancel()
		switch {
		case err == nil, errors.Is(err, fsm.ErrNotFound):
			// Not found: deleted meanwhile (or this very delete, retried
			// after a lost answer).
			rows[i].Deleted, rows[i].Catalog = true, "deleted"
		case errors.Is(err, fsm.ErrConflict):
			v, _, _ := resurrectedVerdict(ctx, cl, timeout, rows[i])
			rows[i].Catalog = v
			rows[i].Error = "not deleted: the catalog changed since it was read (" + err.Error() + ")"
		case errors.Is(err, fsm.ErrClusterLevelTooLow):
			rows[i].Error = "not deleted: " + err.Error()
		case errors.Is(err, fsm.ErrUnknownCommand):
			rows[i].Error = "not deleted: the catalog leader's build does not know delete_database_if; upgrade every catalog node first"
		default:
			rows[i].Error = err.Error()
		}
	}
}

// deleteAllowedAt refuses --delete while the cluster's catalog level (as
// the asked node applied it; none from a node predating levels: 1) is
// below delete_database_if's.
func deleteAllowedAt(st raftmeta.ClusterStatus) error {
	return fsm.CheckLevel(fsm.CmdDeleteDatabaseIf, max(st.ClusterLevel, 1))
}

// resurrectedFailures is the command's exit: an error (exit status 1, the
// rows printed all the same) when some row could not be checked or deleted.
func resurrectedFailures(rows []resurrectedRow) error {
	failed := 0
	for _, r := range rows {
		if r.Error != "" {
			failed++
		}
	}
	if failed > 0 {
		return fmt.Errorf("%d databases could not be checked or deleted (see ERROR); run the command again", failed)
	}
	return nil
}

// resurrectedVerdict reads r's database on a linearizable read: "active"
// (this very object: a zombie), "deleted", "unknown" or "other_object";
// with an error message ("error"), and the routing generation read.
func resurrectedVerdict(ctx context.Context, cl resurrectedCatalog, timeout time.Duration, r resurrectedRow) (string, string, int64) {
	rctx, cancel := context.WithTimeout(ctx, timeout)
	d, err := cl.Database(rctx, r.DatabaseUUID, raftmeta.LinearizableRead())
	cancel()
	switch {
	case errors.Is(err, fsm.ErrNotFound):
		return "unknown", "", 0
	case err != nil:
		return "error", err.Error(), 0
	case d.State == fsm.StateDeleted:
		return "deleted", "", d.RoutingGeneration
	case d.ObjectID != r.ObjectID:
		return "other_object", "", d.RoutingGeneration
	}
	return "active", "", d.RoutingGeneration
}

func printResurrected(out io.Writer, rows []resurrectedRow, del bool) {
	if len(rows) == 0 {
		fmt.Fprintln(out, "no host reports a resurrected database")
		return
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "DATABASE\tACCOUNT\tNAME\tHOST\tOBJECT\tDELETED AT\tCATALOG\tERROR")
	active, deleted := 0, 0
	for _, r := range rows {
		state := r.Catalog
		if r.Deleted {
			state = "deleted now"
			deleted++
		}
		if r.Catalog == "active" {
			active++
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.DatabaseUUID, r.AccountID, r.Name, r.Host, r.ObjectID,
			r.DeletedAt.UTC().Format(time.RFC3339), state, r.Error)
	}
	tw.Flush()
	switch {
	case del:
		fmt.Fprintf(out, "%d deleted again in the catalog; %d still active\n", deleted, active)
	case active > 0:
		fmt.Fprintf(out, "%d active in the catalog although deleted (every query answers 404): shoal cluster resurrected --delete\n", active)
	}
}
