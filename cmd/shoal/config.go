package main

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/shoaldb/shoal/internal/config"
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
