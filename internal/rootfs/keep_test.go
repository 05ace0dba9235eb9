package rootfs

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"

	"github.com/spore-run/spore/internal/errdefs"
)

// build writes a tiny tree holding marker in file "m" and returns it.
func build(t *testing.T, dir, marker string) string {
	t.Helper()
	tree, err := os.MkdirTemp(dir, ".build-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tree, "m"), []byte(marker), 0o644); err != nil {
		t.Fatal(err)
	}
	return tree
}

func marker(t *testing.T, tree string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(tree, "m"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func install(t *testing.T, dir, name, id, mark string) {
	t.Helper()
	if err := Install(context.Background(), dir, name, build(t, dir, mark), Stamp{ID: id, Suite: "bookworm"}); err != nil {
		t.Fatal(err)
	}
}

// A rebuild gives the name a new build and keeps the one it replaced: both
// resolve, each to its own tree, and the kept one only until Prune finds
// nothing needs it. Named trees are never pruned.
func TestInstallKeepsReplacedBuildUntilPruned(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	install(t, dir, "base", "r1", "one")
	install(t, dir, "base", "r2", "two")
	install(t, dir, "base", "r3", "three")
	for id, want := range map[string]string{"r1": "one", "r2": "two", "r3": "three"} {
		p, err := Resolve(dir, "base", id)
		if err != nil {
			t.Fatalf("Resolve %s: %v", id, err)
		}
		if got := marker(t, p); got != want {
			t.Fatalf("build %s resolves to a tree holding %q, want %q", id, got, want)
		}
	}
	if p, _ := Resolve(dir, "base", "r3"); p != Path(dir, "base") {
		t.Fatalf("the current build resolves to %s, not the named tree", p)
	}
	if st, err := Lookup(dir, "base"); err != nil || st.ID != "r3" || st.Name != "" {
		t.Fatalf("Lookup = %+v, %v", st, err)
	}
	kept, err := Kept(dir)
	if err != nil || len(kept) != 2 || kept[0].ID != "r1" || kept[0].Name != "base" {
		t.Fatalf("Kept = %+v, %v", kept, err)
	}
	removed, err := Prune(ctx, dir, func(id string) bool { return id == "r1" })
	if err != nil || !slices.Equal(removed, []string{"r2"}) {
		t.Fatalf("Prune = %v, %v", removed, err)
	}
	if _, err := Resolve(dir, "base", "r2"); !errdefs.IsNotFound(err) {
		t.Fatalf("a pruned build resolves: %v", err)
	}
	if _, err := Resolve(dir, "base", "r1"); err != nil {
		t.Fatalf("a build Prune was told to keep: %v", err)
	}
	if removed, err := Prune(ctx, dir, func(string) bool { return false }); err != nil || !slices.Equal(removed, []string{"r1"}) {
		t.Fatalf("Prune of everything = %v, %v", removed, err)
	}
	if p, err := Resolve(dir, "base", "r3"); err != nil || marker(t, p) != "three" {
		t.Fatalf("the named tree after pruning everything: %v", err)
	}
	ents, _ := os.ReadDir(filepath.Join(dir, keptDir))
	if len(ents) != 0 {
		t.Fatalf("left in the kept directory: %v", ents)
	}
}

// A build fetched for a snapshot is added whole or not at all, once; and
// installing it later as the name's build takes that copy where it is
// (a sandbox running over it keeps its tree).
func TestAddKeptAndPromote(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	install(t, dir, "base", "r1", "one")
	boom := errors.New("fetch failed")
	if err := AddKept(ctx, dir, Stamp{ID: "r9", Name: "base"}, func(tree string) error {
		os.MkdirAll(tree, 0o700)
		os.WriteFile(filepath.Join(tree, "m"), []byte("half"), 0o644)
		return boom
	}); !errors.Is(err, boom) {
		t.Fatalf("AddKept with a failing fill: %v", err)
	}
	if _, ok := Has(dir, "r9"); ok {
		t.Fatal("a failed fetch left a build")
	}
	fills := 0
	fill := func(tree string) error {
		fills++
		if err := os.MkdirAll(tree, 0o700); err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(tree, "m"), []byte("nine"), 0o644)
	}
	for range 2 {
		if err := AddKept(ctx, dir, Stamp{ID: "r9", Name: "base"}, fill); err != nil {
			t.Fatal(err)
		}
	}
	if fills != 1 {
		t.Fatalf("fetched %d times", fills)
	}
	p, err := Resolve(dir, "base", "r9")
	if err != nil || marker(t, p) != "nine" {
		t.Fatalf("Resolve r9: %s %v", p, err)
	}
	if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o755 {
		t.Fatalf("a fetched tree's top directory: %v %v", fi.Mode(), err)
	}
	ino := inode(t, p)
	if err := AddKept(ctx, dir, Stamp{ID: "r1"}, fill); err != nil || fills != 1 {
		t.Fatalf("AddKept of the named build fetched it: %v", err)
	}
	// Installing r9 as base uses the kept copy (the tree given is dropped).
	install(t, dir, "base", "r9", "ignored")
	p, err = Resolve(dir, "base", "r9")
	if err != nil || p != Path(dir, "base") || marker(t, p) != "nine" || inode(t, p) != ino {
		t.Fatalf("promoted r9: %s %v", p, err)
	}
	if p, err := Resolve(dir, "base", "r1"); err != nil || marker(t, p) != "one" {
		t.Fatalf("the build r9 replaced: %v", err)
	}
	if kept, _ := Kept(dir); len(kept) != 1 || kept[0].ID != "r1" {
		t.Fatalf("kept after promote: %+v", kept)
	}
	if err := Install(ctx, dir, "base", build(t, dir, "x"), Stamp{ID: "r9"}); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("installing the current build again: %v", err)
	}
}

func inode(t *testing.T, p string) uint64 {
	t.Helper()
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Ino
}

// The states a crash can leave Install and a retire in resolve to whole
// builds only, and the next Install and Prune clean them up.
func TestKeptTreesAfterCrashes(t *testing.T) {
	ctx := context.Background()
	t.Run("retire cut after the tree moved", func(t *testing.T) {
		dir := t.TempDir()
		install(t, dir, "base", "r1", "one")
		// The kept stamp written and the tree moved; the name's stamp not
		// yet removed.
		os.MkdirAll(filepath.Join(dir, keptDir), 0o755)
		b, _ := os.ReadFile(stampPath(dir, "base"))
		os.WriteFile(keptStamp(dir, "r1"), b, 0o644)
		if err := os.Rename(Path(dir, "base"), KeptPath(dir, "r1")); err != nil {
			t.Fatal(err)
		}
		if _, err := Lookup(dir, "base"); !errdefs.IsNotFound(err) {
			t.Fatalf("Lookup of a name whose tree moved: %v", err)
		}
		if p, err := Resolve(dir, "base", "r1"); err != nil || marker(t, p) != "one" {
			t.Fatalf("Resolve: %v", err)
		}
		install(t, dir, "base", "r2", "two")
		if p, err := Resolve(dir, "base", "r1"); err != nil || marker(t, p) != "one" {
			t.Fatalf("Resolve r1 after the next install: %v", err)
		}
	})
	t.Run("install cut before the stamp", func(t *testing.T) {
		dir := t.TempDir()
		install(t, dir, "base", "r1", "one")
		unlock, _ := lockKept(ctx, dir)
		if err := retireLocked(dir, "base"); err != nil {
			t.Fatal(err)
		}
		unlock()
		if err := os.Rename(build(t, dir, "new"), Path(dir, "base")); err != nil {
			t.Fatal(err)
		}
		// The new tree is there without a stamp: no build is named base.
		if _, err := Lookup(dir, "base"); !errdefs.IsNotFound(err) {
			t.Fatalf("a stampless tree is a build: %v", err)
		}
		install(t, dir, "base", "r2", "two")
		if p, err := Resolve(dir, "base", "r2"); err != nil || marker(t, p) != "two" {
			t.Fatalf("Resolve r2: %v", err)
		}
		if p, err := Resolve(dir, "base", "r1"); err != nil || marker(t, p) != "one" {
			t.Fatalf("Resolve r1: %v", err)
		}
	})
	t.Run("leftovers", func(t *testing.T) {
		dir := t.TempDir()
		install(t, dir, "base", "r1", "one")
		kdir := filepath.Join(dir, keptDir)
		os.MkdirAll(filepath.Join(kdir, "r5"), 0o755)                              // a tree without its stamp
		os.WriteFile(filepath.Join(kdir, "r6.json"), []byte(`{"id":"r6"}`), 0o644) // a stamp without its tree
		os.MkdirAll(filepath.Join(kdir, ".fetch-r7"), 0o755)                       // a fetch cut short
		if _, ok := Has(dir, "r5"); ok {
			t.Fatal("a stampless kept tree counts")
		}
		if _, ok := Has(dir, "r6"); ok {
			t.Fatal("a treeless kept stamp counts")
		}
		if _, err := Prune(ctx, dir, func(string) bool { return true }); err != nil {
			t.Fatal(err)
		}
		if ents, _ := os.ReadDir(kdir); len(ents) != 0 {
			t.Fatalf("left: %v", ents)
		}
	})
}

func TestResolveRefusesBadInput(t *testing.T) {
	dir := t.TempDir()
	for _, c := range [][2]string{{"../x", "r1"}, {"base", "../r1"}, {"base", ""}, {"base", "R1"}} {
		if _, err := Resolve(dir, c[0], c[1]); !errdefs.IsInvalidArgument(err) {
			t.Errorf("Resolve(%q, %q) = %v", c[0], c[1], err)
		}
	}
	if err := Install(context.Background(), dir, "base", t.TempDir(), Stamp{ID: "../r"}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("Install with a bad build ID: %v", err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("refused calls wrote: %v", ents)
	}
}
