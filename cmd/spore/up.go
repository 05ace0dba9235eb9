package main

import (
	"log/slog"
	"os"

	"github.com/spf13/cobra"

	"github.com/spore-run/spore/internal/node"
)

func newUpCmd(g *globalFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "up",
		Short: "Start the all-in-one server on this host",
		Long: `Start Spore on this host: open the node (re-attaching to sandboxes that
kept running and recovering interrupted operations), build the default
templates (base, code-interpreter-v1) when missing or stale, and serve until
interrupted.

The REST API and proxy join this command with the control plane; today it
runs the node and its recovery.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			log := slog.New(slog.NewTextHandler(os.Stderr, nil))
			n, err := node.Open(ctx, node.Config{DataDir: g.dataDir, Logger: log})
			if err != nil {
				return err
			}
			defer n.Close()
			if err := n.EnsureTemplates(ctx); err != nil {
				return err
			}
			log.Info("spore up", "data_dir", g.dataDir, "sandboxes", len(n.Engine.List(ctx)), "snapshots", len(n.Engine.Snapshots().List()))
			<-ctx.Done()
			log.Info("stopping; sandboxes keep running and are re-attached at the next start")
			return nil
		},
	}
}
