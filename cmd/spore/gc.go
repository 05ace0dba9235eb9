package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"
)

func newGCCmd(f *cliFlags) *cobra.Command {
	var grace time.Duration
	var dryRun bool
	cmd := &cobra.Command{
		Use:   "gc",
		Short: "Free the blob store's chunks that no snapshot uses",
		Long: "Deletes the chunks in the blob store that no snapshot names and that are older than --grace " +
			"(uploads in flight keep theirs), and reports what it freed.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if grace < time.Second || grace > 30*24*time.Hour {
				return fmt.Errorf("--grace must be from 1s to 720h, got %v", grace)
			}
			c, err := f.client()
			if err != nil {
				return err
			}
			res, err := c.CollectGarbage(cmd.Context(), grace, dryRun)
			if err != nil {
				return err
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), res)
			}
			verb := "freed"
			if dryRun {
				verb = "would free"
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s %d chunks (%s); kept %d (%d written within the grace period); %d snapshots in the store\n",
				verb, res.DeletedChunks, mib(res.FreedBytes), res.KeptChunks, res.YoungChunks, res.Snapshots)
			return nil
		},
	}
	cmd.Flags().DurationVar(&grace, "grace", time.Hour, "keep unused chunks written within this long")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "report what would be freed, delete nothing")
	return cmd
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }
