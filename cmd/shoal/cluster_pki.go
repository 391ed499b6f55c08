package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/shoaldb/shoal/internal/pki"
)

// newClusterCACmd is `shoal cluster ca init` and newClusterCertCmd `shoal
// cluster cert issue`: the cluster CA and node certificates of the
// authenticated internal plane (internal/pki, docs/security.md).
func newClusterCACmd() *cobra.Command {
	cmd := &cobra.Command{Use: "ca", Short: "The cluster's certificate authority (mutual TLS between components)"}
	var dir, name string
	var validity time.Duration
	initCmd := &cobra.Command{
		Use:   "init --dir DIR",
		Short: "Create the cluster CA: DIR/ca.crt (give it to every node) and DIR/ca.key (keep it off the nodes)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if dir == "" {
				return usagef("--dir is required")
			}
			crt, err := pki.InitCA(dir, name, validity)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "CA created: %s (private key %s/ca.key, mode 0600)\n", crt, dir)
			return nil
		},
	}
	initCmd.Flags().StringVar(&dir, "dir", "", "directory for ca.crt and ca.key")
	initCmd.Flags().StringVar(&name, "name", "shoal cluster CA", "the CA's common name")
	initCmd.Flags().DurationVar(&validity, "validity", 10*365*24*time.Hour, "how long the CA is valid")
	cmd.AddCommand(initCmd)
	return cmd
}

func newClusterCertCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "cert", Short: "Node certificates signed by the cluster CA"}
	var (
		caDir, out, node string
		roles, hosts     []string
		validity         time.Duration
		force            bool
	)
	issue := &cobra.Command{
		Use:   "issue --ca-dir DIR --node ID --roles ROLE[,ROLE]",
		Short: "Issue a certificate for node ID with its roles (" + strings.Join(pki.AllRoles, ", ") + ")",
		Long: `Issue a certificate for node ID, signed by the CA in --ca-dir, carrying its
roles: catalog (a catalog voter), host (an object host), edge, pipeline,
limiter, operator (the shoal cluster / shoal admin commands: restore, join,
remove, snapshot, lost hosts). Writes OUT/ID.crt, OUT/ID.key (0600) and the
CA bundle OUT/ca.crt. Reissue with --force to rotate: nodes re-read their
files when they change, without a restart.`,
		Example: "  shoal cluster cert issue --ca-dir ca --node n1 --roles catalog --out n1\n  shoal cluster cert issue --ca-dir ca --node ops --roles operator --out ops",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if caDir == "" || node == "" || len(roles) == 0 {
				return usagef("--ca-dir, --node and --roles are required")
			}
			if out == "" {
				out = node
			}
			f, err := pki.Issue(caDir, out, pki.IssueRequest{Node: node, Roles: roles, Hosts: hosts, Validity: validity}, force)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "certificate for %s (roles %s): %s, key %s, CA bundle %s\n", node, strings.Join(roles, ","), f.Cert, f.Key, f.CA)
			return nil
		},
	}
	f := issue.Flags()
	f.StringVar(&caDir, "ca-dir", "", "the CA's directory (shoal cluster ca init)")
	f.StringVar(&node, "node", "", "node ID")
	f.StringSliceVar(&roles, "roles", nil, "roles: "+strings.Join(pki.AllRoles, ", "))
	f.StringVar(&out, "out", "", "output directory (default: the node ID)")
	f.StringSliceVar(&hosts, "host", nil, "DNS names or IP addresses to add as SANs (for other tools; Shoal checks roles, not addresses)")
	f.DurationVar(&validity, "validity", 365*24*time.Hour, "how long the certificate is valid (at most the CA's)")
	f.BoolVar(&force, "force", false, "overwrite an existing certificate (rotation)")
	cmd.AddCommand(issue)
	return cmd
}
