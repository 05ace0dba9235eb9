package gvisor

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/runtime"
)

// fakeBinary writes a "runsc" with content and a version file beside it.
func fakeBinary(t *testing.T, dir, content, version string) string {
	t.Helper()
	p := filepath.Join(dir, "runsc")
	if err := os.WriteFile(p, []byte(content), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p+".version", []byte(version+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func sum(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

// An install of a new runsc over the old one keeps the old build: it was
// added to the builds by content first, and stays there whatever happens
// to the installed path. Each build keeps its version (its Name), and a
// build's directory only ever holds a binary of that content.
func TestKeptBuilds(t *testing.T) {
	ctx := context.Background()
	bin, builds := t.TempDir(), filepath.Join(t.TempDir(), "builds")
	path := fakeBinary(t, bin, "#!/bin/sh\necho old\n", "v1")
	old, err := KeepBuild(ctx, builds, path)
	if err != nil || old != sum("#!/bin/sh\necho old\n") {
		t.Fatalf("KeepBuild = %s, %v", old, err)
	}
	if again, err := KeepBuild(ctx, builds, path); err != nil || again != old {
		t.Fatalf("KeepBuild again = %s, %v", again, err)
	}
	// The upgrade: a new binary replaces the old one at its path.
	tmp := filepath.Join(bin, "runsc.tmp")
	os.WriteFile(tmp, []byte("#!/bin/sh\necho new\n"), 0o755)
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(path+".version", []byte("v2\n"), 0o644)
	cur, err := KeepBuild(ctx, builds, path)
	if err != nil || cur == old {
		t.Fatalf("KeepBuild of the new binary = %s, %v", cur, err)
	}
	d := &Driver{cfg: Config{BuildsDir: builds, StateDir: t.TempDir()}, build: cur, log: slog.New(slog.DiscardHandler)}
	d.bin = filepath.Join(BuildDir(builds, cur), buildBinary)
	kept, err := d.KeptBuilds()
	if err != nil || !slices.Contains(kept, old) || !slices.Contains(kept, cur) || len(kept) != 2 {
		t.Fatalf("KeptBuilds = %v, %v", kept, err)
	}
	if b, _ := os.ReadFile(filepath.Join(BuildDir(builds, old), buildBinary)); string(b) != "#!/bin/sh\necho old\n" {
		t.Fatalf("the old build's binary holds %q", b)
	}
	if name, err := d.HasBuild(old); err != nil || name != "gvisor/v1" {
		t.Fatalf("HasBuild(old) = %q, %v", name, err)
	}
	if _, err := d.HasBuild(sum("other")); !errdefs.IsNotFound(err) {
		t.Fatalf("HasBuild of a build never kept: %v", err)
	}
	if _, err := d.HasBuild("../x"); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("HasBuild(../x): %v", err)
	}

	// An instance records its build; its calls run that build's binary.
	spec := runtime.Spec{ID: "i1", Build: old}
	if b, err := d.buildFor(spec); err != nil || b != old {
		t.Fatalf("buildFor = %s, %v", b, err)
	}
	os.MkdirAll(d.instDir("i1"), 0o700)
	os.WriteFile(filepath.Join(d.instDir("i1"), buildFile), []byte(old+"\n"), 0o600)
	if got := d.binFor("i1"); got != filepath.Join(BuildDir(builds, old), buildBinary) {
		t.Fatalf("binFor(i1) = %s", got)
	}
	if got := d.binFor("i-unrecorded"); got != d.bin {
		t.Fatalf("an instance without a recorded build runs %s, not the current build", got)
	}
	if _, err := d.buildFor(runtime.Spec{ID: "i2", Build: sum("other")}); !errdefs.IsNotFound(err) {
		t.Fatalf("a spec naming a build not kept: %v", err)
	}

	// Removal: never the current build, nor one an instance runs with.
	if err := d.RemoveBuild(ctx, cur); !errdefs.IsConflict(err) {
		t.Fatalf("RemoveBuild(current) = %v", err)
	}
	if err := d.RemoveBuild(ctx, old); !errdefs.IsConflict(err) {
		t.Fatalf("RemoveBuild of a build an instance runs with = %v", err)
	}
	os.RemoveAll(d.instDir("i1"))
	if err := d.RemoveBuild(ctx, old); err != nil {
		t.Fatal(err)
	}
	if _, err := d.HasBuild(old); !errdefs.IsNotFound(err) {
		t.Fatalf("a removed build: %v", err)
	}
	if ents, _ := os.ReadDir(builds); len(ents) != 2 { // the current build and the lock
		t.Fatalf("left in the builds: %v", ents)
	}
}

// A copy fetched from elsewhere is installed only if its binary hashes to
// the build it claims; nothing of a refused one is left.
func TestInstallBuildChecksContent(t *testing.T) {
	ctx := context.Background()
	builds := filepath.Join(t.TempDir(), "builds")
	d := &Driver{cfg: Config{BuildsDir: builds, StateDir: t.TempDir()}, log: slog.New(slog.DiscardHandler)}
	want := sum("the real one")
	fill := func(content string, version bool) func(string) error {
		return func(dir string) error {
			if err := os.Mkdir(dir, 0o700); err != nil {
				return err
			}
			if err := os.WriteFile(filepath.Join(dir, buildBinary), []byte(content), 0o600); err != nil {
				return err
			}
			if version {
				return os.WriteFile(filepath.Join(dir, buildVersion), []byte("v9\n"), 0o644)
			}
			return nil
		}
	}
	if err := d.InstallBuild(ctx, want, fill("tampered", true)); !errdefs.IsDataLoss(err) {
		t.Fatalf("a copy of other content: %v", err)
	}
	if err := d.InstallBuild(ctx, want, fill("the real one", false)); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("a copy without its version: %v", err)
	}
	if err := d.InstallBuild(ctx, "nothex", fill("the real one", true)); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("a malformed build: %v", err)
	}
	if kept, _ := d.KeptBuilds(); len(kept) != 0 {
		t.Fatalf("refused copies were kept: %v", kept)
	}
	if err := d.InstallBuild(ctx, want, fill("the real one", true)); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(BuildDir(builds, want), buildBinary))
	if err != nil || fi.Mode().Perm() != 0o755 {
		t.Fatalf("installed binary: %v %v", fi, err)
	}
	if name, err := d.HasBuild(want); err != nil || name != "gvisor/v9" {
		t.Fatalf("HasBuild = %q, %v", name, err)
	}
	if ents, _ := filepath.Glob(filepath.Join(builds, ".tmp-*")); len(ents) != 0 {
		t.Fatalf("staging left: %v", ents)
	}
}
