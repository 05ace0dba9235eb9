package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/spore-run/spore/internal/fleetauth"
)

func newFleetCACmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "ca",
		Short: "Make the fleet's certificate authority (replicas and nodes authenticate each other with its certificates)",
	}
	var dir string
	initCmd := &cobra.Command{
		Use:   "init",
		Short: "Make a fleet CA and a join token in --dir (ca.crt, ca.key, join-token)",
		Long: `Make a fleet CA: --dir/ca.crt (every replica and node: --fleet-ca), --dir/ca.key
(replicas only, mode 0600: --fleet-ca-key) and --dir/join-token (replicas and
new nodes: --join-token-file; a node enrolls with it once, then renews with its
certificate). An existing CA is never replaced.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := fleetauth.InitCA(dir); err != nil {
				return err
			}
			c, k, j := fleetauth.CAFiles(dir)
			fmt.Fprintf(cmd.OutOrStdout(), "fleet CA: %s (key %s), join token: %s\n", c, k, j)
			return nil
		},
	}
	initCmd.Flags().StringVar(&dir, "dir", "", "directory for the CA's files")
	initCmd.MarkFlagRequired("dir")
	cmd.AddCommand(initCmd)
	return cmd
}

func newFleetCertCmd() *cobra.Command {
	var caDir, nodeID, out string
	var hosts []string
	cmd := &cobra.Command{
		Use:   "cert",
		Short: "Issue a node its fleet certificate from the CA (instead of its enrollment with the join token)",
		Long: `Issue node --node a certificate from the CA in --ca-dir, naming --host (the
addresses replicas reach it at), into --out as a node keeps it: node.crt,
node.key (0600), ca.crt. Give --out as the node's <data-dir>/fleet. The node
renews it itself before it expires (30 days).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := fleetauth.IssueNodeFiles(caDir, nodeID, hosts, out); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "node %s: certificate in %s\n", nodeID, out)
			return nil
		},
	}
	cmd.Flags().StringVar(&caDir, "ca-dir", "", "the CA's directory (ca.crt, ca.key)")
	cmd.Flags().StringVar(&nodeID, "node", "", "the node's ID (its --node-id)")
	cmd.Flags().StringSliceVar(&hosts, "host", nil, "an address or name replicas reach the node at (repeatable)")
	cmd.Flags().StringVar(&out, "out", "", "where to write node.crt, node.key and ca.crt")
	for _, f := range []string{"ca-dir", "node", "out"} {
		cmd.MarkFlagRequired(f)
	}
	return cmd
}
