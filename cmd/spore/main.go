// Command spore is Spore's one binary: host setup, the all-in-one server
// (`spore up`) and the CLI verbs over its API.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
)

// version is set at build time (-ldflags "-X main.version=...").
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := newRoot().ExecuteContext(ctx); err != nil {
		var ee exitError
		if errors.As(err, &ee) {
			os.Exit(ee.code) // a command's own exit code
		}
		fmt.Fprintln(os.Stderr, "spore:", err)
		os.Exit(1)
	}
}

// globalFlags are shared by every verb.
type globalFlags struct {
	dataDir  string
	cacheDir string
	team     string
}

func newRoot() *cobra.Command {
	g := &globalFlags{}
	root := &cobra.Command{
		Use:           "spore",
		Short:         "Sandboxes for AI agents with live snapshot, fork, rollback and hibernate",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.PersistentFlags().StringVar(&g.dataDir, "data-dir", envOr("SPORE_DATA_DIR", "/var/lib/spore"), "data directory (env SPORE_DATA_DIR)")
	root.PersistentFlags().StringVar(&g.cacheDir, "cache-dir", envOr("SPORE_CACHE_DIR", "/var/cache/spore"), "download and build cache (env SPORE_CACHE_DIR)")
	root.PersistentFlags().StringVar(&g.team, "team", os.Getenv("SPORE_TEAM"), "with an operator key: the team to act in (env SPORE_TEAM; default: the default team)")
	root.AddCommand(newSetupCmd(g), newUpCmd(g), newAPICmd(), newNodeCmd(g), newVersionCmd())
	root.AddCommand(newFleetCmd(g))
	root.AddCommand(newClientCmds(g)...)
	return root
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		Run:   func(cmd *cobra.Command, _ []string) { fmt.Fprintln(cmd.OutOrStdout(), "spore", version) },
	}
}
