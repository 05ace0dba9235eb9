package main

import (
	"github.com/spf13/cobra"

	"github.com/spore-run/spore/internal/setup"
)

func newSetupCmd(g *globalFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "setup",
		Short: "Install the runtime: Debian packages, the pinned gVisor runsc, the base root filesystem",
		Long: `Install everything a host needs to run sandboxes. Idempotent: present and
current pieces are kept; downloads and builds are cached in --cache-dir.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return setup.Run(cmd.Context(), setup.Config{DataDir: g.dataDir, CacheDir: g.cacheDir, Out: cmd.ErrOrStderr()})
		},
	}
}
