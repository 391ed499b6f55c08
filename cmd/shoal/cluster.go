package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"github.com/shoaldb/shoal/internal/pki"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/shoaldb/shoal/raftmeta"
)

// newClusterCmd groups the catalog's cluster operations. Each talks to one
// node's internal HTTP API (--addr); leader-only operations sent to a
// follower fail with the leader's address rather than being redirected, so
// the operator always knows which node acted.
func newClusterCmd() *cobra.Command {
	var addr string
	var timeout time.Duration
	cmd := &cobra.Command{Use: "cluster", Short: "Operate the catalog's Raft cluster"}
	cmd.PersistentFlags().StringVar(&addr, "addr", envOr("SHOAL_CATALOG_ADDR", "127.0.0.1:7101"), "HTTP address of a catalog node (default $SHOAL_CATALOG_ADDR, else n1 of the example cluster.hcl)")
	cmd.PersistentFlags().DurationVar(&timeout, "timeout", 30*time.Second, "request timeout")
	var tlsf tlsFlags
	tlsf.register(cmd.PersistentFlags(), false) // an operator's certificate (role operator); none: a cluster running insecure
	opTLS := func() *pki.Loader {
		l, err := tlsf.clientTLS()
		if err != nil {
			fmt.Fprintln(os.Stderr, "error:", err)
			os.Exit(2)
		}
		return l
	}
	admin := func() *raftmeta.Admin { return raftmeta.NewAdmin(addr, timeout, opTLS()) }
	explain := func(err error) error {
		var nl *raftmeta.NotLeaderError
		if errors.As(err, &nl) {
			if nl.Leader == "" {
				return fmt.Errorf("the node at %s is not the leader and knows no leader (election in progress or quorum lost)", addr)
			}
			return fmt.Errorf("the node at %s is not the leader; the leader is %s at %s: rerun with --addr %s", addr, nl.LeaderID, nl.Leader, nl.Leader)
		}
		return err
	}

	var servers []string
	bootstrap := &cobra.Command{
		Use:   "bootstrap",
		Short: "Bootstrap a new cluster on a node with no Raft state",
		Long: `Bootstrap a new cluster on the node at --addr, which must have no Raft state.
Without --server the node becomes the single voter; with --server ID=RAFTADDR
(repeatable, suffix ",nonvoter" for a read follower) the listed servers are the
initial membership (list the node itself too).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var reqs []raftmeta.JoinRequest
			for _, s := range servers {
				id, rest, ok := strings.Cut(s, "=")
				if !ok || id == "" || rest == "" {
					return fmt.Errorf("--server %q: want ID=RAFTADDR[,nonvoter]", s)
				}
				raftAddr, suffix, _ := strings.Cut(rest, ",")
				if suffix != "" && suffix != "nonvoter" {
					return fmt.Errorf("--server %q: unknown suffix %q", s, suffix)
				}
				reqs = append(reqs, raftmeta.JoinRequest{ID: id, RaftAddr: raftAddr, Voter: suffix == ""})
			}
			if err := admin().Bootstrap(cmd.Context(), reqs); err != nil {
				return explain(err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "bootstrapped cluster on %s\n", addr)
			return nil
		},
	}
	bootstrap.Flags().StringArrayVar(&servers, "server", nil, "initial member ID=RAFTADDR[,nonvoter] (repeatable)")

	var joinID, joinRaft string
	var joinNonvoter bool
	join := &cobra.Command{
		Use:   "join",
		Short: "Add a node (already serving) to the cluster; --addr must be the leader",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if joinID == "" || joinRaft == "" {
				return errors.New("--id and --raft-addr of the joining node are required")
			}
			if err := admin().Join(cmd.Context(), raftmeta.JoinRequest{ID: joinID, RaftAddr: joinRaft, Voter: !joinNonvoter}); err != nil {
				return explain(err)
			}
			kind := "voter"
			if joinNonvoter {
				kind = "non-voter"
			}
			fmt.Fprintf(cmd.OutOrStdout(), "added %s (%s) as a %s\n", joinID, joinRaft, kind)
			return nil
		},
	}
	join.Flags().StringVar(&joinID, "id", "", "ID of the joining node")
	join.Flags().StringVar(&joinRaft, "raft-addr", "", "Raft address of the joining node")
	join.Flags().BoolVar(&joinNonvoter, "nonvoter", false, "add as a non-voting read follower")

	remove := &cobra.Command{
		Use:   "remove ID",
		Short: "Remove a member; --addr must be the leader",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := admin().Remove(cmd.Context(), args[0]); err != nil {
				return explain(err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "removed %s\n", args[0])
			return nil
		},
	}

	var asJSON bool
	status := &cobra.Command{
		Use:   "status",
		Short: "Show members, suffrage, leader, term, commit/applied index and last contact, and object hosts' alarms",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := admin().Status(cmd.Context())
			if err != nil {
				return explain(err)
			}
			hosts := objectHostStatuses(cmd.Context(), addr, opTLS())
			out := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				return enc.Encode(struct {
					raftmeta.ClusterStatus
					Hosts []hostView `json:"hosts"`
				}{st, hosts})
			}
			printStatus(out, st)
			printHosts(out, hosts)
			return nil
		},
	}
	status.Flags().BoolVar(&asJSON, "json", false, "print JSON")

	snapshot := &cobra.Command{
		Use:   "snapshot",
		Short: "Force a Raft snapshot on the node at --addr",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			idx, err := admin().Snapshot(cmd.Context())
			if err != nil {
				return explain(err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "snapshot at index %d\n", idx)
			return nil
		},
	}

	var outFile string
	backup := &cobra.Command{
		Use:   "backup -o FILE",
		Short: "Write a consistent copy of the catalog to FILE",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if outFile == "" {
				return errors.New("-o FILE is required")
			}
			// Write to a temp file and rename: FILE is complete or absent.
			tmp, err := os.CreateTemp(filepath.Dir(outFile), ".backup-*")
			if err != nil {
				return err
			}
			defer os.Remove(tmp.Name())
			idx, n, err := admin().Backup(cmd.Context(), tmp)
			if err != nil {
				tmp.Close()
				return explain(err)
			}
			if err := errors.Join(tmp.Sync(), tmp.Close()); err != nil {
				return err
			}
			if err := os.Rename(tmp.Name(), outFile); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s: %d bytes, catalog at index %d\n", outFile, n, idx)
			return nil
		},
	}
	backup.Flags().StringVarP(&outFile, "output", "o", "", "backup file to write")

	restore := &cobra.Command{
		Use:   "restore FILE",
		Short: "Replace the cluster's catalog with a backup; --addr must be the leader",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := os.Open(args[0])
			if err != nil {
				return err
			}
			defer f.Close()
			if err := admin().Restore(cmd.Context(), f); err != nil {
				return explain(err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "restored %s\n", args[0])
			return nil
		},
	}

	cmd.AddCommand(bootstrap, join, remove, status, snapshot, backup, restore, newClusterHostCmd(&addr, &timeout, opTLS),
		newClusterCACmd(), newClusterCertCmd(), newClusterAuditCmd(&addr, &timeout, opTLS), newClusterResurrectedCmd(&addr, &timeout, opTLS))
	return cmd
}

func printStatus(out io.Writer, st raftmeta.ClusterStatus) {
	leader := st.Leader
	if leader == "" {
		leader = "(none)"
	}
	// A node predating catalog levels reports none: its cluster is at 1.
	fmt.Fprintf(out, "leader: %s   term: %d   asked: %s (%s)   catalog level: %d\n\n", leader, st.Term, st.Self.ID, st.Self.State, max(st.ClusterLevel, 1))
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tRAFT ADDR\tHTTP ADDR\tSUFFRAGE\tSTATE\tTERM\tCOMMIT\tAPPLIED\tLAST CONTACT\tBUILD LEVEL")
	for _, m := range st.Members {
		state, term, commit, applied, contact, level := "unreachable", "-", "-", "-", "-", "-"
		if m.Reachable {
			state = strings.ToLower(m.State)
			level = fmt.Sprint(max(m.BuildLevel, 1))
			term, commit, applied = fmt.Sprint(m.Term), fmt.Sprint(m.CommitIndex), fmt.Sprint(m.AppliedIndex)
			switch {
			case m.Leader || m.LastContactMs == 0:
				contact = "-"
			case m.LastContactMs < 0:
				contact = "never"
			default:
				contact = (time.Duration(m.LastContactMs) * time.Millisecond).String() + " ago"
			}
		}
		httpAddr := m.HTTPAddr
		if httpAddr == "" {
			httpAddr = "?"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", m.ID, m.RaftAddr, httpAddr, strings.ToLower(m.Suffrage), state, term, commit, applied, contact, level)
	}
	tw.Flush()
}
