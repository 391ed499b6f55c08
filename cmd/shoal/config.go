package main

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/shoaldb/shoal/edge"
	"github.com/shoaldb/shoal/internal/config"
	"github.com/shoaldb/shoal/raftmeta/fsm"
)

func newConfigCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "config", Short: "Inspect cluster.hcl"}
	cmd.AddCommand(&cobra.Command{
		Use:   "validate [FILE]",
		Short: "Check a cluster definition (default ./cluster.hcl); errors name file, line and field",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			path := "cluster.hcl"
			if len(args) == 1 {
				path = args[0]
			}
			c, err := config.Load(path)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: ok (%d nodes, catalog voters: %d)\n", path, len(c.Nodes), countVoters(c))
			return nil
		},
	})
	return cmd
}

func countVoters(c *config.Cluster) int {
	n := 0
	for _, node := range c.Nodes {
		if node.Has(config.RoleRaftmeta) && node.IsVoter() {
			n++
		}
	}
	return n
}

// loadNode reads the cluster file for a role's `serve --config FILE --node ID`
// and returns the cluster and that node, which must take role.
func loadNode(path, id, role string) (*config.Cluster, *config.Node, error) {
	if id == "" {
		return nil, nil, errors.New("--config needs --node ID")
	}
	c, err := config.Load(path)
	if err != nil {
		return nil, nil, err
	}
	n, err := c.Node(id)
	if err != nil {
		return nil, nil, err
	}
	if !n.Has(role) {
		return nil, nil, fmt.Errorf("%s: node %q has no %s role", path, id, role)
	}
	return c, n, nil
}

// clusterTiers is every tier's limits: D1's defaults (edge.DefaultTiers)
// with the non-zero fields of cluster.hcl's tier blocks over them. The
// edge enforces them at create; the limiter takes the free tier's daily
// row thresholds from them.
func clusterTiers(c *config.Cluster) map[string]fsm.Limits {
	tiers := edge.DefaultTiers()
	for name, l := range tiers {
		t, ok := c.Tier(name)
		if !ok {
			continue
		}
		over := func(dst *int64, v int64) {
			if v > 0 {
				*dst = v
			}
		}
		over(&l.MaxDatabases, t.MaxDatabases)
		over(&l.MaxStorageBytes, t.MaxStorageBytes)
		over(&l.MaxDatabaseBytes, t.MaxDatabaseBytes)
		over(&l.RowsReadPerDay, t.RowsReadPerDay)
		over(&l.RowsWrittenPerDay, t.RowsWrittenPerDay)
		tiers[name] = l
	}
	return tiers
}
