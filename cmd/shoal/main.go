// Command shoal is the one binary of the Shoal platform: every role (catalog
// node, edge, object host, pipelines, limiter), the cluster commands and a
// wrangler-like client are subcommands.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "shoal",
		Short:         "Shoal: millions of small SQLite databases, D1-compatible",
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       buildVersion(),
	}
	root.AddCommand(
		newConfigCmd(),
		newRaftmetaCmd(),
		newClusterCmd(),
		newEdgeCmd(),
		newAdminCmd(),
		newObjecthostCmd(),
		newPipelineCmd(),
		newLimiterCmd(),
		newDevCmd(),
		newD1Cmd(),
	)
	return root
}

func main() {
	if err := newRootCmd().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}
