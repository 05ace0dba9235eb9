package rootfs

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/spore-run/spore/internal/atomicfs"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
)

// Kept trees. A checkpoint image restores only over the very tree it was
// taken over, so a build of a root filesystem that its name no longer
// holds (a rebuild gave the name a new tree, with a new build ID) is kept
// while a snapshot, template or sandbox needs it, under its build ID:
//
//	<dir>/.kept/<id>/      the tree
//	<dir>/.kept/<id>.json  its stamp (Name says which name it was)
//
// runsc does not need the same path on restore (it checks the spec's root
// path out of the restore spec's validation; the tree's files are found
// by their paths inside it), which TestRestoreOverKeptTree proves with
// real runsc: a tree moved here restores its snapshots.
//
// Every change is one rename, under a lock (<dir>/.kept.lock), with the
// stamp as the commit point of an addition (a tree without its stamp is
// a crashed one, removed by the next change) and the first step of a
// removal: a crash leaves a kept tree whole or gone, never half there
// under a stamp.

const keptDir = ".kept"

// KeptPath is where the tree of build id is kept in dir.
func KeptPath(dir, id string) string { return filepath.Join(dir, keptDir, id) }

func keptStamp(dir, id string) string { return filepath.Join(dir, keptDir, id+".json") }

func lockKept(ctx context.Context, dir string) (func(), error) {
	if err := os.MkdirAll(filepath.Join(dir, keptDir), 0o755); err != nil {
		return nil, fmt.Errorf("%w: kept root filesystems: %v", errdefs.ErrInternal, err)
	}
	return atomicfs.Lock(ctx, filepath.Join(dir, ".kept.lock"))
}

// Resolve returns the path of the tree of root filesystem name's build id
// on this node: the named one while it is that build, else the kept one.
// ErrNotFound when the node holds neither.
func Resolve(dir, name, id string) (string, error) {
	if err := ids.ValidateName("root filesystem", name); err != nil {
		return "", err
	}
	if err := ids.Validate("root filesystem build", id); err != nil {
		return "", err
	}
	if st, err := Lookup(dir, name); err == nil && st.ID == id {
		return Path(dir, name), nil
	}
	if _, err := lookupKept(dir, id); err != nil {
		return "", fmt.Errorf("root filesystem %s build %s: not on this node: %w", name, id, errdefs.ErrNotFound)
	}
	return KeptPath(dir, id), nil
}

// lookupKept returns the stamp of kept tree id when it is whole.
func lookupKept(dir, id string) (Stamp, error) {
	var st Stamp
	if err := atomicfs.ReadJSON(keptStamp(dir, id), &st); err != nil || st.ID != id {
		return Stamp{}, fmt.Errorf("kept root filesystem %s: %w", id, errdefs.ErrNotFound)
	}
	if fi, err := os.Stat(KeptPath(dir, id)); err != nil || !fi.IsDir() {
		return Stamp{}, fmt.Errorf("kept root filesystem %s: tree missing: %w", id, errdefs.ErrNotFound)
	}
	return st, nil
}

// Has reports whether the node holds build id of a root filesystem, named
// or kept, and returns its stamp.
func Has(dir, id string) (Stamp, bool) {
	if ids.Validate("root filesystem build", id) != nil {
		return Stamp{}, false
	}
	if st, err := lookupKept(dir, id); err == nil {
		return st, true
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		name, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || strings.HasPrefix(name, ".") {
			continue
		}
		if st, err := Lookup(dir, name); err == nil && st.ID == id {
			st.Name = name
			return st, true
		}
	}
	return Stamp{}, false
}

// TreeOf returns the path of build id's tree, named or kept, and its stamp
// (for publishing it); ErrNotFound when the node holds none.
func TreeOf(dir, id string) (string, Stamp, error) {
	st, ok := Has(dir, id)
	if !ok {
		return "", Stamp{}, fmt.Errorf("root filesystem build %s: not on this node: %w", id, errdefs.ErrNotFound)
	}
	if p, err := Resolve(dir, st.Name, id); err == nil {
		return p, st, nil
	}
	return KeptPath(dir, id), st, nil
}

// Install makes tree, a directory on dir's file system, root filesystem
// name with stamp st (st.ID its new build identity), keeping the build it
// replaces (see the kept trees above). A crash at any point leaves the
// name with its old build, with none (Lookup: not found, the next build
// installs again), or with the new one, never a tree under another
// build's stamp.
func Install(ctx context.Context, dir, name, tree string, st Stamp) error {
	if err := ids.ValidateName("root filesystem", name); err != nil {
		return err
	}
	if err := ids.Validate("root filesystem build", st.ID); err != nil {
		return err
	}
	unlock, err := lockKept(ctx, dir)
	if err != nil {
		return err
	}
	defer unlock()
	if cur, err := Lookup(dir, name); err == nil && cur.ID == st.ID {
		return fmt.Errorf("root filesystem %s is build %s already: %w", name, st.ID, errdefs.ErrAlreadyExists)
	}
	if _, err := lookupKept(dir, st.ID); err == nil {
		// Kept here already (fetched for a snapshot): that copy becomes
		// the name's, where it is (sandboxes running over it go on).
		os.RemoveAll(tree)
		return promoteLocked(dir, name, st.ID)
	}
	if err := retireLocked(dir, name); err != nil {
		return err
	}
	final := Path(dir, name)
	// A tree without a stamp (an install cut short) is nobody's build.
	if err := os.RemoveAll(final); err != nil {
		return fmt.Errorf("%w: root filesystem %s: %v", errdefs.ErrInternal, name, err)
	}
	if err := os.Rename(tree, final); err != nil {
		return fmt.Errorf("%w: root filesystem %s: %v", errdefs.ErrInternal, name, err)
	}
	st.Name = ""
	if err := atomicfs.WriteJSON(stampPath(dir, name), st); err != nil { // the commit point
		return fmt.Errorf("%w: root filesystem %s: %v", errdefs.ErrInternal, name, err)
	}
	return nil
}

// retireLocked moves root filesystem name's current tree to the kept
// trees: its stamp there first, then the tree, then the name's stamp goes
// (between the two, Lookup finds the tree missing and Resolve the kept
// one). A name without a whole build has nothing to keep. Callers hold
// the kept lock.
func retireLocked(dir, name string) error {
	st, err := Lookup(dir, name)
	if err != nil {
		return nil
	}
	if _, err := lookupKept(dir, st.ID); err == nil {
		// Kept already (a retire cut short after its rename).
		return removeStamp(dir, name)
	}
	st.Name = name
	if err := atomicfs.WriteJSON(keptStamp(dir, st.ID), st); err != nil {
		return fmt.Errorf("%w: keep root filesystem %s build %s: %v", errdefs.ErrInternal, name, st.ID, err)
	}
	_ = os.RemoveAll(KeptPath(dir, st.ID)) // a stampless leftover of a crash
	if err := os.Rename(Path(dir, name), KeptPath(dir, st.ID)); err != nil {
		return fmt.Errorf("%w: keep root filesystem %s build %s: %v", errdefs.ErrInternal, name, st.ID, err)
	}
	if err := removeStamp(dir, name); err != nil {
		return err
	}
	return atomicfs.SyncDir(filepath.Join(dir, keptDir))
}

// Promote makes kept build id the tree of root filesystem name, keeping
// the build it replaces.
func Promote(ctx context.Context, dir, name, id string) error {
	if err := ids.ValidateName("root filesystem", name); err != nil {
		return err
	}
	unlock, err := lockKept(ctx, dir)
	if err != nil {
		return err
	}
	defer unlock()
	if cur, err := Lookup(dir, name); err == nil && cur.ID == id {
		return nil
	}
	return promoteLocked(dir, name, id)
}

// promoteLocked moves kept tree id to name: the name's stamp first (its
// tree is missing until the rename, so Resolve finds the kept one), then
// the tree, then the kept stamp goes (Prune drops it if a crash left it).
func promoteLocked(dir, name, id string) error {
	st, err := lookupKept(dir, id)
	if err != nil {
		return err
	}
	if err := retireLocked(dir, name); err != nil {
		return err
	}
	if err := os.RemoveAll(Path(dir, name)); err != nil { // a stampless leftover
		return fmt.Errorf("%w: root filesystem %s: %v", errdefs.ErrInternal, name, err)
	}
	st.Name = ""
	if err := atomicfs.WriteJSON(stampPath(dir, name), st); err != nil {
		return fmt.Errorf("%w: root filesystem %s: %v", errdefs.ErrInternal, name, err)
	}
	if err := os.Rename(KeptPath(dir, id), Path(dir, name)); err != nil {
		return fmt.Errorf("%w: root filesystem %s: %v", errdefs.ErrInternal, name, err)
	}
	if err := os.Remove(keptStamp(dir, id)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w: %v", errdefs.ErrInternal, err)
	}
	return atomicfs.SyncDir(dir)
}

func removeStamp(dir, name string) error {
	if err := os.Remove(stampPath(dir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w: root filesystem %s: %v", errdefs.ErrInternal, name, err)
	}
	return atomicfs.SyncDir(dir)
}

// AddKept adds build st.ID, fetched from elsewhere, to the kept trees of
// dir: fill writes the tree into the directory it is given (on dir's file
// system). One held already, named or kept, is left as it is.
func AddKept(ctx context.Context, dir string, st Stamp, fill func(tree string) error) error {
	if err := ids.Validate("root filesystem build", st.ID); err != nil {
		return err
	}
	if st.Name != "" {
		if err := ids.ValidateName("root filesystem", st.Name); err != nil {
			return err
		}
	}
	if _, ok := Has(dir, st.ID); ok {
		return nil
	}
	unlock, err := lockKept(ctx, dir)
	if err != nil {
		return err
	}
	defer unlock()
	if _, ok := Has(dir, st.ID); ok {
		return nil
	}
	staging := filepath.Join(dir, keptDir, ".fetch-"+st.ID)
	if err := os.RemoveAll(staging); err != nil {
		return fmt.Errorf("%w: %v", errdefs.ErrInternal, err)
	}
	defer os.RemoveAll(staging)
	if err := fill(staging); err != nil {
		return fmt.Errorf("root filesystem build %s: %w", st.ID, err)
	}
	// A sandbox's users reach into the tree: its top directory as a
	// debootstrap tree has it, whatever made the copy.
	if err := os.Chmod(staging, 0o755); err != nil {
		return fmt.Errorf("%w: %v", errdefs.ErrInternal, err)
	}
	_ = os.RemoveAll(KeptPath(dir, st.ID))
	if err := os.Rename(staging, KeptPath(dir, st.ID)); err != nil {
		return fmt.Errorf("%w: root filesystem build %s: %v", errdefs.ErrInternal, st.ID, err)
	}
	if err := atomicfs.WriteJSON(keptStamp(dir, st.ID), st); err != nil { // the commit point
		return fmt.Errorf("%w: root filesystem build %s: %v", errdefs.ErrInternal, st.ID, err)
	}
	return nil
}

// Kept lists the kept trees of dir (their stamps), by build ID.
func Kept(dir string) ([]Stamp, error) {
	ents, err := os.ReadDir(filepath.Join(dir, keptDir))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("kept root filesystems: %w", err)
	}
	var out []Stamp
	for _, e := range ents {
		id, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || ids.Validate("root filesystem build", id) != nil {
			continue
		}
		if st, err := lookupKept(dir, id); err == nil {
			out = append(out, st)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// Prune removes the kept trees whose build keep rejects, and what crashed
// changes left in the kept directory; it returns the builds it removed.
// Named trees are never touched. The caller must make sure nothing starts
// using a build it rejects meanwhile (the node holds its fetches off).
func Prune(ctx context.Context, dir string, keep func(id string) bool) ([]string, error) {
	unlock, err := lockKept(ctx, dir)
	if err != nil {
		return nil, err
	}
	defer unlock()
	kdir := filepath.Join(dir, keptDir)
	ents, err := os.ReadDir(kdir)
	if err != nil {
		return nil, fmt.Errorf("kept root filesystems: %w", err)
	}
	stamped := map[string]bool{}
	for _, e := range ents {
		if id, ok := strings.CutSuffix(e.Name(), ".json"); ok {
			stamped[id] = true
		}
	}
	var removed []string
	for _, e := range ents {
		name := e.Name()
		if id, ok := strings.CutSuffix(name, ".json"); ok {
			if _, err := lookupKept(dir, id); err == nil && keep(id) {
				continue
			}
			// The stamp first: the build is gone from then on.
			if err := os.Remove(filepath.Join(kdir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return removed, fmt.Errorf("%w: %v", errdefs.ErrInternal, err)
			}
			if err := atomicfs.SyncDir(kdir); err != nil {
				return removed, err
			}
			if err := os.RemoveAll(filepath.Join(kdir, id)); err != nil {
				return removed, fmt.Errorf("%w: %v", errdefs.ErrInternal, err)
			}
			removed = append(removed, id)
			continue
		}
		if e.IsDir() && !stamped[name] {
			// A fetch or a retire cut short before its stamp.
			if err := os.RemoveAll(filepath.Join(kdir, name)); err != nil {
				return removed, fmt.Errorf("%w: %v", errdefs.ErrInternal, err)
			}
		}
	}
	sort.Strings(removed)
	return removed, nil
}
