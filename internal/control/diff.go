package control

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/spore-run/spore/internal/nodeapi"
	"github.com/spore-run/spore/internal/snapdiff"
)

// SnapshotDiff is what changed in the filesystem from one snapshot to
// another.
type SnapshotDiff struct {
	From, To                string // snapshot IDs
	Added, Removed, Changed int    // counts of every change, listed or not
	// Changes are the first MaxDiffChanges changes by path.
	Changes []snapdiff.Change
	// Truncated: there were more changes than listed.
	Truncated bool
	// TextDiffsOmitted counts small files whose content was not read for
	// a text diff (past MaxTextDiffs).
	TextDiffsOmitted int
}

// Limits of a snapshot diff.
const (
	MaxDiffChanges = 10_000
	// MaxTextDiffs is how many small files get a text diff (one read of
	// each side).
	MaxTextDiffs = nodeapi.MaxReadFiles
)

// DiffSnapshots compares the filesystems of two snapshots (or templates)
// of a team, from and to (IDs the caller resolved): each is started in a
// sandbox of the team's (killed after) and read through its node; what
// changed is listed by path, with a unified diff for small text files
// changed, added or removed. The sandboxes run the snapshots' processes
// from their instant, so a file a process keeps writing reads as it is a
// moment after. Volumes (mount points) are not compared.
func (s *Service) DiffSnapshots(ctx context.Context, team, from, to string) (SnapshotDiff, error) {
	start := time.Now()
	var (
		trees [2][]nodeapi.FileEntry
		nodes [2]nodeapi.Node
		sbs   [2]string
		errs  [2]error
		wg    sync.WaitGroup
	)
	defer func() {
		for _, id := range sbs {
			if id != "" {
				s.dropScratch(ctx, id)
			}
		}
	}()
	for i, ref := range []string{from, to} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sb, err := s.scratch(ctx, team, ref, "diff")
			if err != nil {
				errs[i] = err
				return
			}
			sbs[i] = sb.ID
			if nodes[i], err = s.nodeOf(sb.Sandbox); err != nil {
				errs[i] = err
				return
			}
			trees[i], errs[i] = nodes[i].FileTree(ctx, sb.ID)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return SnapshotDiff{}, fmt.Errorf("diff %s %s: %w", from, to, err)
		}
	}
	changes := snapdiff.Compare(trees[0], trees[1])
	d := SnapshotDiff{From: from, To: to}
	for _, c := range changes {
		switch c.Kind {
		case snapdiff.Added:
			d.Added++
		case snapdiff.Removed:
			d.Removed++
		default:
			d.Changed++
		}
	}
	if len(changes) > MaxDiffChanges {
		changes, d.Truncated = changes[:MaxDiffChanges], true
	}
	if err := s.textDiffs(ctx, changes, nodes, sbs, &d.TextDiffsOmitted); err != nil {
		return SnapshotDiff{}, fmt.Errorf("diff %s %s: %w", from, to, err)
	}
	d.Changes = changes
	s.log.Info("snapshots compared", "team", team, "from", from, "to", to, "added", d.Added, "removed", d.Removed,
		"changed", d.Changed, "entries_from", len(trees[0]), "entries_to", len(trees[1]), "took", time.Since(start))
	return d, nil
}

// textDiffs reads the small files of changes on both sides (the first
// MaxTextDiffs of them; omitted counts the rest) and sets their diffs.
func (s *Service) textDiffs(ctx context.Context, changes []snapdiff.Change, nodes [2]nodeapi.Node, sbs [2]string, omitted *int) error {
	var picked []int
	var paths [2][]string
	for i, c := range changes {
		if !c.Readable() {
			continue
		}
		if len(picked) == MaxTextDiffs {
			*omitted++
			continue
		}
		picked = append(picked, i)
		if c.From != nil {
			paths[0] = append(paths[0], c.Path)
		}
		if c.To != nil {
			paths[1] = append(paths[1], c.Path)
		}
	}
	var content [2]map[string][]byte
	var errs [2]error
	var wg sync.WaitGroup
	for side := range 2 {
		content[side] = map[string][]byte{}
		if len(paths[side]) == 0 {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			files, err := nodes[side].ReadFiles(ctx, sbs[side], paths[side])
			for _, f := range files {
				if !f.Missing && f.Data != nil {
					content[side][f.Path] = f.Data
				}
			}
			errs[side] = err
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	for _, i := range picked {
		c := &changes[i]
		a, aok := content[0][c.Path]
		b, bok := content[1][c.Path]
		// A side that could not be read (changed since it was listed, or
		// grown past the limit) gets no diff rather than a wrong one.
		if (c.From != nil && !aok) || (c.To != nil && !bok) {
			continue
		}
		c.SetContent(a, b)
	}
	return nil
}
