package engine_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/spore-run/spore/internal/engine"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/rootfs"
	"github.com/spore-run/spore/internal/runtime"
	"github.com/spore-run/spore/internal/runtime/fake"
	"github.com/spore-run/spore/internal/snapshot"
)

// buildsRuntime is the fake runtime with runtime.Builds: it holds builds
// by name, refuses an instance of a build it does not hold, and records
// the build and root filesystem every instance was launched with.
type buildsRuntime struct {
	*fake.Runtime
	mu       sync.Mutex
	current  string
	kept     map[string]bool
	launched map[string]runtime.Spec // instance -> its spec (build and root filesystem)
}

var _ runtime.Builds = (*buildsRuntime)(nil)

// launch checks spec's build and records it, unless the instance was
// launched already (a restore into a pre-created one runs the build it was
// pre-created with).
func (b *buildsRuntime) launch(spec runtime.Spec) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if spec.Build == "" {
		spec.Build = b.current
	}
	if !b.kept[spec.Build] {
		return fmt.Errorf("build %s: %w", spec.Build, errdefs.ErrNotFound)
	}
	if _, ok := b.launched[spec.ID]; !ok {
		b.launched[spec.ID] = spec
	}
	return nil
}

func (b *buildsRuntime) Start(ctx context.Context, spec runtime.Spec) error {
	if err := b.launch(spec); err != nil {
		return err
	}
	return b.Runtime.Start(ctx, spec)
}

func (b *buildsRuntime) Restore(ctx context.Context, spec runtime.Spec, image string) error {
	if err := b.launch(spec); err != nil {
		return err
	}
	return b.Runtime.Restore(ctx, spec, image)
}

func (b *buildsRuntime) Precreate(ctx context.Context, spec runtime.Spec) error {
	if err := b.launch(spec); err != nil {
		return err
	}
	return b.Runtime.Precreate(ctx, spec)
}

func (b *buildsRuntime) Build() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.current
}

func (b *buildsRuntime) HasBuild(build string) (string, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.kept[build] {
		return "", fmt.Errorf("build %s: %w", build, errdefs.ErrNotFound)
	}
	return "fake/" + build, nil
}

func (b *buildsRuntime) KeptBuilds() ([]string, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []string
	for k := range b.kept {
		out = append(out, k)
	}
	slices.Sort(out)
	return out, nil
}

func (b *buildsRuntime) RemoveBuild(ctx context.Context, build string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.kept, build)
	return nil
}

// upgrade installs a new build of the runtime, keeping the old ones.
func (b *buildsRuntime) upgrade(build string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.current, b.kept[build] = build, true
}

// spec is the spec instance was launched with.
func (b *buildsRuntime) spec(t testing.TB, instance string) runtime.Spec {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	s, ok := b.launched[instance]
	if !ok {
		t.Fatalf("instance %s was never launched", instance)
	}
	return s
}

// versionsEnv is an engine over buildsRuntime with restore targets, on a
// root filesystem directory whose "base" the test rebuilds.
type versionsEnv struct {
	t      testing.TB
	dir    string
	rootfs string
	rt     *buildsRuntime
	eng    *engine.Engine
	logs   lockedWriter
	buf    *strings.Builder
}

func newVersionsEnv(t *testing.T) *versionsEnv {
	v := &versionsEnv{t: t, dir: t.TempDir(), buf: &strings.Builder{}}
	v.logs = lockedWriter{mu: make(chan struct{}, 1), w: v.buf}
	v.rootfs = filepath.Join(v.dir, "rootfs")
	v.rt = &buildsRuntime{Runtime: fake.New(), current: "b1", kept: map[string]bool{"b1": true}, launched: map[string]runtime.Spec{}}
	v.rebuildBase("rone", "one")
	v.open()
	t.Cleanup(func() { v.eng.Close() })
	return v
}

// rebuildBase installs a new build of root filesystem base (a file "m"
// holding marker): what `make setup` does after the tree's revision or
// package list changed.
func (v *versionsEnv) rebuildBase(id, marker string) {
	v.t.Helper()
	tree, err := os.MkdirTemp(v.dir, "build-")
	if err == nil {
		err = os.WriteFile(filepath.Join(tree, "m"), []byte(marker), 0o644)
	}
	if err == nil {
		err = os.MkdirAll(v.rootfs, 0o755)
	}
	if err == nil {
		err = rootfs.Install(context.Background(), v.rootfs, "base", tree, rootfs.Stamp{ID: id, Suite: "fake"})
	}
	if err != nil {
		v.t.Fatal(err)
	}
}

func (v *versionsEnv) open() {
	v.t.Helper()
	repo, err := snapshot.Open(filepath.Join(v.dir, "snapshots"))
	if err != nil {
		v.t.Fatal(err)
	}
	v.eng, err = engine.Open(fctx(v.t), engine.Config{
		Dir: filepath.Join(v.dir, "engine"), RootFSDir: v.rootfs, Runtime: v.rt, Snapshots: repo,
		MemoryReserve: -1, RestoreTargets: 1,
		Logger: slog.New(slog.NewTextHandler(v.logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
	})
	if err != nil {
		v.t.Fatal(err)
	}
}

// launchedWith checks the build and root filesystem tree (by its marker
// file) sandbox id's instance was launched with.
func (v *versionsEnv) launchedWith(id, build, marker string) {
	v.t.Helper()
	sb, err := v.eng.Get(fctx(v.t), id)
	if err != nil {
		v.t.Fatal(err)
	}
	spec := v.rt.spec(v.t, sb.Instance)
	got, _ := os.ReadFile(filepath.Join(spec.RootFS, "m"))
	if spec.Build != build || string(got) != marker || sb.RuntimeBuild != build {
		v.t.Fatalf("sandbox %s runs build %q (record %q) over a tree holding %q, want %s over %q",
			id, spec.Build, sb.RuntimeBuild, got, build, marker)
	}
}

func (v *versionsEnv) memory(id, key string) string {
	v.t.Helper()
	sb, err := v.eng.Get(fctx(v.t), id)
	if err != nil {
		v.t.Fatal(err)
	}
	mem, err := v.rt.Memory(sb.Instance)
	if err != nil {
		v.t.Fatal(err)
	}
	return mem[key]
}

var tplSpec = engine.TemplateSpec{Name: "tpl", Run: snapshot.RunConfig{Args: []string{"init"}}}

// After an upgrade of the root filesystem (a new build of "base") and of
// the runtime (a new build), everything made before restores over the
// tree it was made over, with the build that wrote it: a snapshot, a
// template, a hibernated sandbox, a fork of a sandbox still running the
// old build, a rollback; new templates and sandboxes get the new ones.
// Restore targets are kept per build. What the engine reports it needs
// (Uses) is exactly what its snapshots and sandboxes name, so a version
// goes once nothing names it. Today's engine refuses the old snapshot.
func TestUpgradeKeepsOldVersionsRestorable(t *testing.T) {
	v := newVersionsEnv(t)
	ctx := fctx(t)
	tpl, err := v.eng.BuildTemplate(ctx, tplSpec)
	if err != nil {
		t.Fatal(err)
	}
	if tpl.RuntimeBuild != "b1" || tpl.RootFSID != "rone" {
		t.Fatalf("template made with %q over %q", tpl.RuntimeBuild, tpl.RootFSID)
	}
	running, err := v.eng.Create(ctx, engine.CreateOptions{Template: "tpl"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.rt.Exec(ctx, running.Instance, runtime.ExecSpec{Args: []string{"set", "k", "before-upgrade"}}); err != nil {
		t.Fatal(err)
	}
	snap, err := v.eng.Snapshot(ctx, running.ID, engine.SnapshotOptions{Names: []string{"old-snap"}})
	if err != nil {
		t.Fatal(err)
	}
	sleeper, err := v.eng.Create(ctx, engine.CreateOptions{Template: "tpl"})
	if err != nil {
		t.Fatal(err)
	}
	if err := v.eng.Hibernate(ctx, sleeper.ID); err != nil {
		t.Fatal(err)
	}

	// The upgrade, then the engine restarts on it.
	v.eng.Close()
	v.rebuildBase("rtwo", "two")
	v.rt.upgrade("b2")
	v.open()

	restored, err := v.eng.Create(ctx, engine.CreateOptions{Template: "old-snap"})
	if err != nil {
		t.Fatalf("create from a snapshot taken before the upgrade: %v", err)
	}
	v.launchedWith(restored.ID, "b1", "one")
	if got := v.memory(restored.ID, "k"); got != "before-upgrade" {
		t.Fatalf("restored memory k = %q", got)
	}
	if err := v.eng.Resume(ctx, sleeper.ID); err != nil {
		t.Fatalf("resume a sandbox hibernated before the upgrade: %v", err)
	}
	v.launchedWith(sleeper.ID, "b1", "one")
	fr, err := v.eng.Fork(ctx, running.ID, engine.ForkOptions{Count: 2})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range fr.Children {
		if c.Err != nil {
			t.Fatalf("fork of a sandbox running the old build: %v", c.Err)
		}
		v.launchedWith(c.Sandbox.ID, "b1", "one")
	}
	if _, err := v.eng.Rollback(ctx, restored.ID, snap.Manifest.ID); err != nil {
		t.Fatal(err)
	}
	v.launchedWith(restored.ID, "b1", "one")
	for range 2 { // the second takes a restore target of the old build
		sb, err := v.eng.Create(ctx, engine.CreateOptions{Template: tpl.ID})
		if err != nil {
			t.Fatalf("create from the template built before the upgrade: %v", err)
		}
		v.launchedWith(sb.ID, "b1", "one")
		v.eng.Settle()
	}
	// A snapshot of a sandbox on the old versions stays on them.
	again, err := v.eng.Snapshot(ctx, restored.ID, engine.SnapshotOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if m := again.Manifest; m.RuntimeBuild != "b1" || m.RootFSID != "rone" || m.Runtime != "fake/b1" {
		t.Fatalf("snapshot of an old-build sandbox: %q %q %q", m.RuntimeBuild, m.RootFSID, m.Runtime)
	}

	// The template is stale: EnsureTemplate makes it anew on the new
	// versions; sandboxes of it get them (targets of the new build).
	fresh, built, err := v.eng.EnsureTemplate(ctx, tplSpec)
	if err != nil || !built || fresh.RuntimeBuild != "b2" || fresh.RootFSID != "rtwo" {
		t.Fatalf("EnsureTemplate after the upgrade: built %v, %q %q, %v", built, fresh.RuntimeBuild, fresh.RootFSID, err)
	}
	for range 2 {
		sb, err := v.eng.Create(ctx, engine.CreateOptions{Template: "tpl"})
		if err != nil {
			t.Fatal(err)
		}
		v.launchedWith(sb.ID, "b2", "two")
		v.eng.Settle()
	}
	if v.rt.Calls(fake.OpPrecreate) < 2 {
		t.Fatalf("restore targets were not used (%d made)", v.rt.Calls(fake.OpPrecreate))
	}
	v.logs.mu <- struct{}{}
	logged := v.buf.String()
	<-v.logs.mu
	if strings.Contains(logged, "restore into a restore target failed") {
		t.Fatalf("a restore target of one build was given an image of another:\n%s", logged)
	}

	uses := v.eng.Uses()
	if !uses.Trees["rone"] || !uses.Trees["rtwo"] || !uses.Builds["b1"] || !uses.Builds["b2"] {
		t.Fatalf("Uses = %+v", uses)
	}
	// Once nothing made on the old versions is left, they are not needed.
	for _, sb := range v.eng.List(ctx) {
		if sb.RuntimeBuild == "b1" {
			if err := v.eng.Kill(ctx, sb.ID); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, m := range v.eng.Snapshots().List() {
		if m.RuntimeBuild == "b1" {
			if err := v.eng.DeleteSnapshot(ctx, m.ID); err != nil {
				t.Fatal(err)
			}
		}
	}
	uses = v.eng.Uses()
	if uses.Trees["rone"] || uses.Builds["b1"] || !uses.Trees["rtwo"] || !uses.Builds["b2"] {
		t.Fatalf("Uses after the old versions' snapshots and sandboxes went = %+v", uses)
	}
}

// A snapshot whose runtime build or root filesystem build the node does
// not hold is refused with a conflict naming what is missing, and leaves
// nothing behind.
func TestRestoreRefusesMissingVersions(t *testing.T) {
	v := newVersionsEnv(t)
	ctx := fctx(t)
	if _, err := v.eng.BuildTemplate(ctx, tplSpec); err != nil {
		t.Fatal(err)
	}
	v.rt.upgrade("b2")
	if err := v.rt.RemoveBuild(ctx, "b1"); err != nil {
		t.Fatal(err)
	}
	_, err := v.eng.Create(ctx, engine.CreateOptions{Template: "tpl"})
	if !errdefs.IsConflict(err) || !strings.Contains(err.Error(), "runtime build b1, which this node does not hold") {
		t.Fatalf("create from an image of a build not held: %v", err)
	}
	v.rt.upgrade("b1")
	v.rebuildBase("rtwo", "two")
	if _, err := rootfs.Prune(ctx, v.rootfs, func(string) bool { return false }); err != nil {
		t.Fatal(err)
	}
	_, err = v.eng.Create(ctx, engine.CreateOptions{Template: "tpl"})
	if !errdefs.IsConflict(err) || !strings.Contains(err.Error(), "root filesystem base build rone, which this node does not hold") {
		t.Fatalf("create from an image over a tree not held: %v", err)
	}
	if len(v.eng.List(ctx)) != 0 {
		t.Fatal("a refused create left a sandbox")
	}
}
