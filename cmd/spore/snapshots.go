package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/spore-run/spore/internal/progress"
)

func newSnapshotCmd(f *cliFlags) *cobra.Command {
	cmd := &cobra.Command{Use: "snapshot", Short: "Create, list and remove snapshots"}
	var name string
	create := &cobra.Command{
		Use:   "create <sandbox>",
		Short: "Take a live snapshot (the sandbox keeps running)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			sn, err := c.Snapshot(cmd.Context(), args[0], name, false)
			if err != nil {
				return err
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), sn)
			}
			fmt.Fprintln(cmd.OutOrStdout(), sn.SnapshotID)
			return nil
		},
	}
	create.Flags().StringVar(&name, "name", "", "a name to start sandboxes from")
	var sandboxID string
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List snapshots",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			list, err := c.Snapshots(cmd.Context(), sandboxID)
			if err != nil {
				return err
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), list)
			}
			var rows [][]string
			for _, s := range list {
				rows = append(rows, []string{s.SnapshotID, strings.Join(s.Names, ","), s.OriginSandboxID, ago(s.CreatedAt), strconv.FormatInt(s.SizeBytes>>20, 10),
					s.Storage, strconv.FormatInt(s.StoredBytes>>20, 10)})
			}
			table(cmd.OutOrStdout(), "SNAPSHOT\tNAMES\tFROM SANDBOX\tCREATED\tSIZE MB\tSTORAGE\tSTORED MB", rows)
			return nil
		},
	}
	ls.Flags().StringVar(&sandboxID, "sandbox-id", "", "only snapshots of this sandbox")
	rm := simple(f, "rm <snapshot>...", "Delete snapshots", func(cmd *cobra.Command, id string) error {
		c, err := f.client()
		if err != nil {
			return err
		}
		return c.DeleteTemplate(cmd.Context(), id)
	})
	cmd.AddCommand(create, ls, rm, newExportCmd(f), newSnapshotDiffCmd(f))
	return cmd
}

// withProgress shows an indeterminate bar while a long call runs.
func withProgress(w io.Writer, title string, fn func() error) error {
	bar := progress.New(w, 1, title)
	bar.Step(title)
	done := make(chan error, 1)
	go func() { done <- fn() }()
	start := time.Now()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			if err == nil {
				bar.StepDone(fmt.Sprintf("done in %v", time.Since(start).Round(time.Millisecond)))
			}
			return err
		case <-tick.C:
			bar.Detail(fmt.Sprintf("%v", time.Since(start).Round(100*time.Millisecond)))
		}
	}
}

func newForkCmd(f *cliFlags) *cobra.Command {
	var n int
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "fork <sandbox>",
		Short: "Fork a running sandbox into N independent copies",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if n < 1 || n > 100 {
				return fmt.Errorf("-n %d: fork 1 to 100 copies", n)
			}
			c, err := f.client()
			if err != nil {
				return err
			}
			var children []childResult
			call := func() error {
				res, err := c.Fork(cmd.Context(), args[0], n, timeout)
				for _, r := range res {
					cr := childResult{}
					if r.Sandbox != nil {
						cr.ID = r.Sandbox.SandboxID
					}
					if r.Error != nil {
						cr.Err = r.Error.Message
					}
					children = append(children, cr)
				}
				return err
			}
			if n >= 10 && !f.json {
				err = withProgress(cmd.ErrOrStderr(), fmt.Sprintf("forking %s into %d", args[0], n), call)
			} else {
				err = call()
			}
			if err != nil {
				return err
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), children)
			}
			failed := 0
			for _, ch := range children {
				if ch.Err != "" {
					failed++
					fmt.Fprintln(cmd.ErrOrStderr(), "error:", ch.Err)
					continue
				}
				fmt.Fprintln(cmd.OutOrStdout(), ch.ID)
			}
			if failed > 0 {
				return fmt.Errorf("%d of %d forks failed", failed, n)
			}
			return nil
		},
	}
	cmd.Flags().IntVarP(&n, "count", "n", 1, "number of copies (1-100)")
	cmd.Flags().DurationVar(&timeout, "timeout", 5*time.Minute, "each copy's timeout")
	return cmd
}

type childResult struct {
	ID  string `json:"sandboxID,omitempty"`
	Err string `json:"error,omitempty"`
}

func newRollbackCmd(f *cliFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "rollback <sandbox> <snapshot>",
		Short: "Roll a sandbox back to a snapshot in place (same ID)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			r, err := c.Rollback(cmd.Context(), args[0], args[1])
			if err != nil {
				return err
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), r)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s rolled back to %s\n", r.SandboxID, r.SnapshotID)
			return nil
		},
	}
}
