package gvisor_test

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/runtime"
	"github.com/spore-run/spore/internal/runtime/gvisor"
	"github.com/spore-run/spore/internal/runtime/runtimetest"
	"github.com/spore-run/spore/internal/testenv"
)

// otherBuild copies the runsc binary with bytes appended: another build by
// content (another hash), which runs as the original does.
func otherBuild(t *testing.T, runsc string) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "runsc")
	b, err := os.ReadFile(runsc)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, append(b, []byte("\nanother spore test build\n")...), 0o755); err != nil {
		t.Fatal(err)
	}
	if v, err := os.ReadFile(runsc + ".version"); err == nil {
		os.WriteFile(dst+".version", v, 0o644)
	}
	return dst
}

func exeOf(t *testing.T, d *gvisor.Driver, id string) string {
	t.Helper()
	info, err := d.State(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	exe, err := os.Readlink("/proc/" + strconv.Itoa(info.PID) + "/exe")
	if err != nil {
		t.Fatal(err)
	}
	return exe
}

// TestRestoreOverKeptTree is what versions kept across upgrades rest on,
// proved with real runsc: an image taken over a root filesystem tree
// restores over that same tree moved to another path (where a node keeps
// a build its name no longer holds: runsc leaves the root's path out of
// the restore spec's validation), and with the runsc build that wrote it
// after the driver's runsc was replaced by another build (here a copy
// with bytes appended: another content, another build), while new
// instances run the new build. Each instance's processes run its own
// build's binary, and a build an instance runs with cannot be removed.
func TestRestoreOverKeptTree(t *testing.T) {
	testenv.RequireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	runsc := testenv.Runsc(t)
	work := t.TempDir()
	tree := filepath.Join(work, "base")
	if out, err := exec.Command("cp", "-al", testenv.BaseRootFS(t), tree).CombinedOutput(); err != nil {
		t.Fatalf("hard-link the base root filesystem: %v: %s", err, out)
	}
	state, builds := filepath.Join(work, "state"), filepath.Join(work, "builds")
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	old, err := gvisor.New(ctx, gvisor.Config{Runsc: runsc, StateDir: state, BuildsDir: builds, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { old.Purge(context.Background()) }) // an early failure's
	src := ids.New('t')
	if err := old.Start(ctx, runtime.Spec{ID: src, RootFS: tree, Args: runtimetest.CounterArgs}); err != nil {
		t.Fatal(err)
	}
	c0, err := runtimetest.Bump(ctx, execer(old, src))
	if err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(work, "img")
	os.Mkdir(img, 0o700)
	if err := old.Checkpoint(ctx, src, img, runtime.CheckpointOptions{}); err != nil {
		t.Fatal(err)
	}

	// The upgrade: the tree moves (the node keeps it by its build ID), and
	// the driver opens again on the same directories with another runsc.
	kept := filepath.Join(work, ".kept", "r-old-build")
	os.MkdirAll(filepath.Dir(kept), 0o755)
	if err := os.Rename(tree, kept); err != nil {
		t.Fatal(err)
	}
	d, err := gvisor.New(ctx, gvisor.Config{Runsc: otherBuild(t, runsc), StateDir: state, BuildsDir: builds, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // before old's (which can no longer run the build it had)
		if err := d.Purge(context.Background()); err != nil {
			t.Errorf("purge: %v", err)
		}
	})
	if d.Build() == old.Build() {
		t.Fatal("the copy with bytes appended is the same build")
	}
	oldBin := filepath.Join(gvisor.BuildDir(builds, old.Build()), "runsc")
	newBin := filepath.Join(gvisor.BuildDir(builds, d.Build()), "runsc")

	clone := ids.New('t')
	if err := d.Restore(ctx, runtime.Spec{ID: clone, RootFS: kept, Args: runtimetest.CounterArgs, Build: old.Build()}, img); err != nil {
		t.Fatalf("restore over the moved tree with the build that wrote the image: %v", err)
	}
	c, err := runtimetest.Bump(ctx, execer(d, clone))
	if err != nil {
		t.Fatal(err)
	}
	if c.Token != c0.Token || c.N != c0.N+1 {
		t.Fatalf("restored counter %+v, want %s %d", c, c0.Token, c0.N+1)
	}
	if exe := exeOf(t, d, clone); exe != oldBin {
		t.Fatalf("the restored sandbox runs %s, want the old build %s", exe, oldBin)
	}
	if err := d.RemoveBuild(ctx, old.Build()); !errdefs.IsConflict(err) {
		t.Fatalf("removing the build a sandbox runs with: %v", err)
	}

	fresh := ids.New('t')
	if err := d.Start(ctx, runtime.Spec{ID: fresh, RootFS: kept, Args: runtimetest.CounterArgs}); err != nil {
		t.Fatal(err)
	}
	if exe := exeOf(t, d, fresh); exe != newBin {
		t.Fatalf("a new sandbox runs %s, want the new build %s", exe, newBin)
	}

	// A pre-created instance of one build takes no image of another.
	pre := runtime.Spec{ID: ids.New('p'), RootFS: kept, Args: runtimetest.CounterArgs}
	if err := d.Precreate(ctx, pre); err != nil {
		t.Fatal(err)
	}
	pre.Build = old.Build()
	if err := d.Restore(ctx, pre, img); !errdefs.IsConflict(err) {
		t.Fatalf("restore of an old build's image into a target of the new build: %v", err)
	}

	for _, id := range []string{clone, fresh, pre.ID} {
		if err := d.Kill(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.RemoveBuild(ctx, old.Build()); err != nil {
		t.Fatalf("removing the old build once nothing runs it: %v", err)
	}
	if _, err := d.HasBuild(old.Build()); !errdefs.IsNotFound(err) {
		t.Fatalf("removed build: %v", err)
	}
}

func execer(d *gvisor.Driver, id string) runtimetest.Execer {
	return func(ctx context.Context, args ...string) (string, int, error) {
		var out bytes.Buffer
		code, err := d.Exec(ctx, id, runtime.ExecSpec{Args: args, Stdout: &out})
		return out.String(), code, err
	}
}
