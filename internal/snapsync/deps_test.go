package snapsync_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/spore-run/spore/internal/blob/local"
	"github.com/spore-run/spore/internal/chunk"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/snapshot"
	"github.com/spore-run/spore/internal/snapsync"
)

// dirDeps keeps each dependency as a directory holding a file named after
// it, as a node keeps root filesystem trees and runsc builds.
type dirDeps struct {
	root     string
	mu       sync.Mutex
	have     map[snapsync.Dep]bool
	installs []snapsync.Dep
	held     int // Holds not yet released
}

func newDirDeps(t *testing.T, have ...snapsync.Dep) *dirDeps {
	d := &dirDeps{root: t.TempDir(), have: map[snapsync.Dep]bool{}}
	for _, dep := range have {
		dir := filepath.Join(d.root, dep.ManifestID())
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "content"), []byte(dep.ManifestID()), 0o644); err != nil {
			t.Fatal(err)
		}
		d.have[dep] = true
	}
	return d
}

func (d *dirDeps) Has(dep snapsync.Dep) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.have[dep]
}

func (d *dirDeps) Dir(dep snapsync.Dep) (string, map[string]string, error) {
	if !d.Has(dep) {
		return "", nil, errdefs.NotFoundf("%s", dep)
	}
	return filepath.Join(d.root, dep.ManifestID()), map[string]string{"origin": "node a"}, nil
}

func (d *dirDeps) Install(ctx context.Context, dep snapsync.Dep, meta map[string]string, fill func(string) error) error {
	dir := filepath.Join(d.root, dep.ManifestID())
	if err := fill(dir); err != nil {
		return err
	}
	if b, err := os.ReadFile(filepath.Join(dir, "content")); err != nil || string(b) != dep.ManifestID() || meta["origin"] != "node a" {
		return errdefs.Invalidf("installed %s holds %q, metadata %v", dep, b, meta)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.held == 0 {
		return errdefs.Conflictf("installed %s without holding the node's dependencies", dep)
	}
	d.have[dep] = true
	d.installs = append(d.installs, dep)
	return nil
}

func (d *dirDeps) Hold() func() {
	d.mu.Lock()
	d.held++
	d.mu.Unlock()
	return func() {
		d.mu.Lock()
		d.held--
		d.mu.Unlock()
	}
}

// takeOn commits a snapshot over root filesystem build tree, written by
// runtime build build ("" for an image from before builds were kept).
func takeOn(t *testing.T, n node, id, tree, build string) snapshot.Manifest {
	t.Helper()
	stg, err := n.repo.Stage(id)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(stg.ImageDir(), "pages.img"), random(1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	m, err := stg.Commit(snapshot.Manifest{Kind: snapshot.KindSnapshot, RootFS: "base", RootFSID: tree, Runtime: "runsc-test",
		RuntimeBuild: build, Run: snapshot.RunConfig{Args: []string{"/init"}}}, snapshot.CommitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// A snapshot's root filesystem tree and runtime build travel with it: the
// upload publishes them as held manifests the snapshot refers to; a node
// that lacks them (another runtime, another root filesystem build) gets
// them with the snapshot, under its Hold, instead of refusing it. A node
// that could get them nowhere refuses before fetching anything, and an
// image from before builds were kept still needs the node's runtime.
func TestDependenciesTravelWithTheSnapshot(t *testing.T) {
	store, err := local.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte("a runsc build"))
	build := hex.EncodeToString(sum[:])
	tree, rt := snapsync.Dep{Kind: snapsync.DepTree, ID: "rold"}, snapsync.Dep{Kind: snapsync.DepRuntime, ID: build}
	depsA := newDirDeps(t, tree, rt)
	a := newNode(t, store, snapsync.Config{Deps: depsA})
	m := takeOn(t, a, "s1", tree.ID, build)
	if _, err := a.sync.Upload(ctx(t), m.ID); err != nil {
		t.Fatal(err)
	}
	cm, err := chunk.ReadManifest(ctx(t), store, "s1")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cm.Refs, []string{tree.ManifestID(), rt.ManifestID()}) {
		t.Fatalf("the snapshot's manifest refers to %v", cm.Refs)
	}
	for _, d := range []snapsync.Dep{tree, rt} {
		dm, err := chunk.ReadManifest(ctx(t), store, d.ManifestID())
		if err != nil || !dm.Held || dm.Metadata[snapsync.MetaDep] != d.Kind {
			t.Fatalf("%s in the store: %+v, %v", d, dm, err)
		}
	}

	// Another runtime and another root filesystem build: fetched with it.
	depsB := newDirDeps(t)
	b := newNode(t, store, snapsync.Config{Deps: depsB, Runtime: "runsc-other", RootFSBuild: func(string) (string, error) { return "rnew", nil }})
	if _, err := b.sync.Ensure(ctx(t), "s1", nil); err != nil {
		t.Fatalf("fetch a snapshot of versions the node lacks: %v", err)
	}
	if !slices.Equal(depsB.installs, []snapsync.Dep{tree, rt}) || depsB.held != 0 {
		t.Fatalf("installed %v, holds left %d", depsB.installs, depsB.held)
	}
	if _, err := b.repo.Get("s1"); err != nil {
		t.Fatal(err)
	}

	// With the runtime build gone from the store, a node without it
	// refuses before fetching anything.
	if err := chunk.DeleteManifest(ctx(t), store, rt.ManifestID()); err != nil {
		t.Fatal(err)
	}
	depsC := newDirDeps(t)
	c := newNode(t, store, snapsync.Config{Deps: depsC})
	if _, err := c.sync.Ensure(ctx(t), "s1", nil); !errdefs.IsConflict(err) {
		t.Fatalf("a runtime build nowhere: %v, want a conflict", err)
	}
	if len(depsC.installs) != 0 || len(c.repo.List()) != 0 {
		t.Fatalf("a refused fetch installed %v, committed %v", depsC.installs, c.repo.List())
	}

	// An image from before builds were kept names no runtime build: only
	// the node's own runtime restores it.
	old := takeOn(t, a, "s2", tree.ID, "")
	if _, err := a.sync.Upload(ctx(t), old.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := b.sync.Ensure(ctx(t), "s2", nil); !errdefs.IsConflict(err) {
		t.Fatalf("an image of no recorded build on another runtime: %v, want a conflict", err)
	}
}

// A snapshot's copies of exclusive volumes travel with it as
// dependencies: named in its chunk manifest's metadata, published as held
// manifests it refers to, installed on a node that fetches the snapshot
// before the snapshot is committed there.
func TestVolumeCopiesTravelWithTheSnapshot(t *testing.T) {
	store, err := local.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	tree := snapsync.Dep{Kind: snapsync.DepTree, ID: "rold"}
	vol := snapsync.Dep{Kind: snapsync.DepVolume, ID: "c-s1-vaaaa"}
	depsA := newDirDeps(t, tree, vol)
	a := newNode(t, store, snapsync.Config{Deps: depsA})
	stg, err := a.repo.Stage("s1")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(stg.ImageDir(), "pages.img"), random(1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	m, err := stg.Commit(snapshot.Manifest{Kind: snapshot.KindSnapshot, RootFS: "base", RootFSID: tree.ID, Runtime: "runsc-test",
		Run: snapshot.RunConfig{Args: []string{"/init"}, Volumes: []snapshot.VolumeMount{
			{Volume: "vaaaa", Slot: "/run/spore/volumes/0", Path: "/work", Exclusive: true, Copy: vol.ID},
			{Volume: "vbbbb", Slot: "/run/spore/volumes/1", Path: "/shared"}, // shared: no copy
		}}}, snapshot.CommitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := snapsync.DepsOf(m); !slices.Equal(got, []snapsync.Dep{tree, vol}) {
		t.Fatalf("the snapshot's dependencies: %v", got)
	}
	if _, err := a.sync.Upload(ctx(t), m.ID); err != nil {
		t.Fatal(err)
	}
	cm, err := chunk.ReadManifest(ctx(t), store, "s1")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(cm.Refs, vol.ManifestID()) || cm.Metadata[snapsync.MetaVolumes] != vol.ID {
		t.Fatalf("the snapshot's manifest: refs %v, metadata %v", cm.Refs, cm.Metadata)
	}
	if dm, err := chunk.ReadManifest(ctx(t), store, vol.ManifestID()); err != nil || !dm.Held || dm.Metadata[snapsync.MetaDep] != snapsync.DepVolume {
		t.Fatalf("the volume copy in the store: %+v, %v", dm, err)
	}
	depsB := newDirDeps(t, tree)
	b := newNode(t, store, snapsync.Config{Deps: depsB})
	if _, err := b.sync.Ensure(ctx(t), "s1", nil); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(depsB.installs, []snapsync.Dep{vol}) || !depsB.Has(vol) {
		t.Fatalf("installed %v", depsB.installs)
	}
	// Without it in the store, a node that lacks it refuses the snapshot
	// before fetching anything.
	if err := chunk.DeleteManifest(ctx(t), store, vol.ManifestID()); err != nil {
		t.Fatal(err)
	}
	c := newNode(t, store, snapsync.Config{Deps: newDirDeps(t, tree)})
	if _, err := c.sync.Ensure(ctx(t), "s1", nil); !errdefs.IsConflict(err) {
		t.Fatalf("a volume copy nowhere: %v, want a conflict", err)
	}
}
