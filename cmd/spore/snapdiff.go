package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/spore-run/spore/internal/api"
)

func newSnapshotDiffCmd(f *cliFlags) *cobra.Command {
	var names bool
	cmd := &cobra.Command{
		Use:   "diff <from-snapshot> <to-snapshot>",
		Short: "Show the files added, removed and changed between two snapshots",
		Long: "Show the files added, removed and changed from one snapshot (or template) to another, with a\n" +
			"unified diff of each small text file. Both are started in sandboxes for the comparison\n" +
			"(killed after); volumes are not compared.",
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			d, err := c.DiffSnapshots(cmd.Context(), args[0], args[1])
			if err != nil {
				return err
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), d)
			}
			printDiff(cmd.OutOrStdout(), d, !names)
			return nil
		},
	}
	cmd.Flags().BoolVar(&names, "names", false, "list the changed paths only, without text diffs")
	return cmd
}

// printDiff writes one line per change (git's status letters: A, D, M),
// then the text diffs, then the counts.
func printDiff(w io.Writer, d api.SnapshotDiff, texts bool) {
	for _, c := range d.Changes {
		fmt.Fprintf(w, "%s %s%s\n", statusLetter(c.Change), c.Path, changeDetail(c))
	}
	if texts {
		for _, c := range d.Changes {
			if c.Diff != "" {
				fmt.Fprintf(w, "\n%s", c.Diff)
				if !strings.HasSuffix(c.Diff, "\n") {
					fmt.Fprintln(w)
				}
			}
		}
		if len(d.Changes) > 0 {
			fmt.Fprintln(w)
		}
	}
	fmt.Fprintf(w, "%d added, %d removed, %d changed", d.Added, d.Removed, d.Changed)
	if d.Truncated {
		fmt.Fprintf(w, " (the first %d listed)", len(d.Changes))
	}
	if d.TextDiffsOmitted > 0 {
		fmt.Fprintf(w, "; %d small files without a text diff", d.TextDiffsOmitted)
	}
	fmt.Fprintln(w)
}

// changeDetail says what changed in a file's metadata: " (dir)",
// " (mode 0644 -> 0600, 3 -> 9 bytes)".
func changeDetail(c api.FileChange) string {
	var parts []string
	switch {
	case c.From == nil && c.To != nil:
		parts = append(parts, statWords(c.To))
	case c.To == nil && c.From != nil:
		parts = append(parts, statWords(c.From))
	case c.From != nil && c.To != nil:
		a, b := c.From, c.To
		if a.Type != b.Type {
			parts = append(parts, a.Type+" -> "+b.Type)
		}
		if a.Mode != b.Mode {
			parts = append(parts, "mode "+a.Mode+" -> "+b.Mode)
		}
		if a.UID != b.UID || a.GID != b.GID {
			parts = append(parts, fmt.Sprintf("owner %d:%d -> %d:%d", a.UID, a.GID, b.UID, b.GID))
		}
		if a.Size != b.Size && a.Type == "file" && b.Type == "file" {
			parts = append(parts, fmt.Sprintf("%d -> %d bytes", a.Size, b.Size))
		}
		if a.Link != b.Link {
			parts = append(parts, "-> "+b.Link)
		}
	}
	if c.Binary {
		parts = append(parts, "binary")
	}
	if len(parts) == 0 {
		return ""
	}
	return " (" + strings.Join(parts, ", ") + ")"
}

func statWords(s *api.FileStat) string {
	switch s.Type {
	case "file":
		return fmt.Sprintf("%d bytes", s.Size)
	case "symlink":
		return "-> " + s.Link
	}
	return s.Type
}

func statusLetter(change string) string {
	switch change {
	case "added":
		return "A"
	case "removed":
		return "D"
	}
	return "M"
}
