package engine_test

import (
	"context"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/spore-run/spore/internal/engine"
	"github.com/spore-run/spore/internal/envd"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/runtime"
	"github.com/spore-run/spore/internal/runtime/fake"
	"github.com/spore-run/spore/internal/snapshot"
)

// fakeImages is an in-memory engine.VolumeImages: an image's content is
// a string; paused, when set, says whether the sandbox is paused at each
// capture.
type fakeImages struct {
	root    string // where Clone makes each image's "mount" (the fake runtime checks sources)
	mu      sync.Mutex
	imgs    map[string]string
	paused  func() bool
	pausedC []bool // paused() at each capture
	fail    string // an image whose Clone fails
	// before, when set, runs before each call (its error fails the call).
	before func(op string) error
}

func (f *fakeImages) enter(op string) error {
	f.mu.Lock()
	fn := f.before
	f.mu.Unlock()
	if fn != nil {
		return fn(op)
	}
	return nil
}

// clone copies the images as a crash leaves them (a new root too: the
// "mounts" are directories the fake runtime checks).
func (f *fakeImages) clone(t *testing.T) *fakeImages {
	f.mu.Lock()
	defer f.mu.Unlock()
	g := newFakeImages(t.TempDir())
	for n, c := range f.imgs {
		g.imgs[n] = c
		os.MkdirAll(g.mountOf(n), 0o755)
	}
	os.MkdirAll(g.mountOf("empty"), 0o755)
	return g
}

func newFakeImages(root string) *fakeImages {
	return &fakeImages{root: root, imgs: map[string]string{}}
}

func (f *fakeImages) mountOf(img string) string { return filepath.Join(f.root, img) }

func (f *fakeImages) Capture(ctx context.Context, image, copy string) error {
	if err := f.enter("capture"); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.imgs[image]; !ok {
		return errdefs.NotFoundf("image %s", image)
	}
	if f.paused != nil {
		f.pausedC = append(f.pausedC, f.paused())
	}
	f.imgs[copy] = f.imgs[image]
	return nil
}

func (f *fakeImages) Flush(ctx context.Context, image string) error { return nil }

func (f *fakeImages) Clone(ctx context.Context, src, dst string) (string, error) {
	if err := f.enter("clone"); err != nil {
		return "", err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	c, ok := f.imgs[src]
	if !ok || dst == f.fail {
		return "", errdefs.NotFoundf("image %s", src)
	}
	f.imgs[dst] = c
	return f.mountOf(dst), os.MkdirAll(f.mountOf(dst), 0o755)
}

func (f *fakeImages) Remove(ctx context.Context, image string) error {
	if err := f.enter("remove"); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.imgs, image)
	return nil
}

func (f *fakeImages) Settle(ctx context.Context, image, volume string) error {
	if err := f.enter("settle"); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	c, ok := f.imgs[image]
	if !ok {
		return nil
	}
	f.imgs[volume] = c
	delete(f.imgs, image)
	return nil
}

func (f *fakeImages) Images(ctx context.Context) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Sorted(maps.Keys(f.imgs)), nil
}

func (f *fakeImages) get(img string) (string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, ok := f.imgs[img]
	return c, ok
}

func (f *fakeImages) set(img, c string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.imgs[img] = c
}

func (f *fakeImages) names(prefix string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for n := range f.imgs {
		if strings.HasPrefix(n, prefix) {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}

const slot0 = envd.SlotPrefix + "0"

// newVolumeFake is newFake with volume images and a template "vtpl" with
// a volume slot; it returns a sandbox holding the exclusive volume
// "vol1" (content "v1") at /work.
func newVolumeFake(t *testing.T) (*fenv, *fakeImages, engine.Sandbox) {
	t.Helper()
	fi := newFakeImages(t.TempDir())
	f := newFakeWith(t, &fenv{vols: fi})
	ctx := fctx(t)
	for _, d := range []string{"empty", "vol1"} {
		if err := os.MkdirAll(fi.mountOf(d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := f.eng.BuildTemplate(ctx, engine.TemplateSpec{Name: "vtpl",
		Run: snapshot.RunConfig{Args: []string{"init"}, Mounts: []runtime.Mount{{Source: fi.mountOf("empty"), Destination: slot0}}}}); err != nil {
		t.Fatal(err)
	}
	fi.set("vol1", "v1")
	sb, err := f.eng.Create(ctx, engine.CreateOptions{Template: "vtpl", Volumes: []engine.Volume{{Source: fi.mountOf("vol1"),
		VolumeMount: snapshot.VolumeMount{Volume: "vol1", Slot: slot0, Path: "/work", Exclusive: true}}}})
	if err != nil {
		t.Fatal(err)
	}
	return f, fi, sb
}

func slotSource(t *testing.T, sb engine.Sandbox) string {
	t.Helper()
	for _, m := range sb.Run.Mounts {
		if m.Destination == slot0 {
			return m.Source
		}
	}
	t.Fatalf("sandbox %s has no slot %s: %+v", sb.ID, slot0, sb.Run.Mounts)
	return ""
}

// An exclusive volume through the engine's operations, over a fake pool:
// a snapshot copies it with the sandbox paused, before the checkpoint;
// a rollback gives the sandbox a new image of its own volume from the
// copy, and the image it replaced goes; fork children and a create from
// the snapshot get volumes of their own (ids.Derive), the fork's copies
// go; the sandbox's last image becomes the volume's when it is killed;
// a deleted snapshot's copy goes.
func TestExclusiveVolumeThroughTheEngine(t *testing.T) {
	f, fi, sb := newVolumeFake(t)
	ctx := fctx(t)
	var order []string
	var mu sync.Mutex
	f.rt.Hook(func(op fake.Op, id string) error {
		mu.Lock()
		defer mu.Unlock()
		if op == fake.OpPause || op == fake.OpResume || op == fake.OpCheckpoint {
			order = append(order, string(op))
		}
		return nil
	})
	fi.paused = func() bool {
		mu.Lock()
		defer mu.Unlock()
		order = append(order, "capture")
		return len(order) > 1 && order[len(order)-2] == string(fake.OpPause)
	}
	snap, err := f.eng.Snapshot(ctx, sb.ID, engine.SnapshotOptions{})
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	got := strings.Join(order, ",")
	mu.Unlock()
	if got != "pause,capture,checkpoint,resume" {
		t.Fatalf("a snapshot of a running sandbox with an exclusive volume did %s: want pause,capture,checkpoint,resume", got)
	}
	cp := snap.Manifest.Run.Volumes[0].Copy
	if c, ok := fi.get(cp); cp != "c-"+snap.Manifest.ID+"-vol1" || !ok || c != "v1" {
		t.Fatalf("the snapshot's copy %q holds %q (%v)", cp, c, ok)
	}
	if live, _ := f.eng.Get(ctx, sb.ID); live.State != engine.StateRunning || live.Run.Volumes[0].Copy != "" {
		t.Fatalf("after the snapshot the sandbox is %s with volumes %+v", live.State, live.Run.Volumes)
	}

	// Rolled back twice: each time a new image from the copy; the first
	// goes with the instance the second replaced; the volume's own image
	// is kept until the sandbox goes.
	fi.set("vol1", "v2")
	var rimgs []string
	for range 2 {
		rb, err := f.eng.Rollback(ctx, sb.ID, snap.Manifest.ID)
		if err != nil {
			t.Fatal(err)
		}
		v := rb.Run.Volumes[0]
		if v.Volume != "vol1" || !strings.HasPrefix(v.Image, "r-") || slotSource(t, rb) != fi.mountOf(v.Image) {
			t.Fatalf("after the rollback the sandbox shows %+v behind %s", v, slotSource(t, rb))
		}
		if c, _ := fi.get(v.Image); c != "v1" {
			t.Fatalf("the rollback's image holds %q", c)
		}
		rimgs = append(rimgs, v.Image)
		fi.set(v.Image, "written-after-rollback")
	}
	f.eng.Settle()
	if got := fi.names("r-"); !slices.Equal(got, rimgs[1:]) {
		t.Fatalf("rollback images after two rollbacks: %v, want the last alone %v", got, rimgs[1:])
	}

	// Fork 2: each child a volume of its own with the content at the fork.
	fork, err := f.eng.Fork(ctx, sb.ID, engine.ForkOptions{Count: 2})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range fork.Children {
		if c.Err != nil {
			t.Fatal(c.Err)
		}
		want := ids.Derive('v', c.Sandbox.ID, "vol1")
		v := c.Sandbox.Run.Volumes[0]
		if v.Volume != want || v.Image != "" || v.Copy != "" || !v.Exclusive || slotSource(t, c.Sandbox) != fi.mountOf(want) {
			t.Fatalf("fork child %s shows %+v behind %s: want its own volume %s", c.Sandbox.ID, v, slotSource(t, c.Sandbox), want)
		}
		if got, _ := fi.get(want); got != "written-after-rollback" {
			t.Fatalf("the child's volume holds %q", got)
		}
	}
	if left := fi.names("c-f"); len(left) != 0 {
		t.Fatalf("the fork's copies are left: %v", left)
	}

	// A create from the snapshot: a volume of its own at the snapshot's
	// instant.
	c, err := f.eng.Create(ctx, engine.CreateOptions{Template: snap.Manifest.ID})
	if err != nil {
		t.Fatal(err)
	}
	if v := c.Run.Volumes[0]; v.Volume != ids.Derive('v', c.ID, "vol1") {
		t.Fatalf("a create from the snapshot shows %+v", v)
	} else if got, _ := fi.get(v.Volume); got != "v1" {
		t.Fatalf("its volume holds %q", got)
	}

	// Killed: its last image becomes the volume's.
	if err := f.eng.Kill(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if got, _ := fi.get("vol1"); got != "written-after-rollback" || len(fi.names("r-")) != 0 {
		t.Fatalf("after the kill the volume holds %q, rollback images %v", got, fi.names("r-"))
	}
	if err := f.eng.DeleteSnapshot(ctx, snap.Manifest.ID); err != nil {
		t.Fatal(err)
	}
	if _, ok := fi.get(cp); ok {
		t.Fatal("the deleted snapshot's copy is left")
	}
}

// A capture that fails leaves no copy and the sandbox running; a create
// whose volume cannot be made leaves neither sandbox nor image; a
// rollback to a snapshot whose exclusive volume the sandbox does not hold
// is refused and changes nothing; without volume images a sandbox with an
// exclusive volume cannot be snapshotted.
func TestExclusiveVolumeFailuresLeaveNothing(t *testing.T) {
	f, fi, sb := newVolumeFake(t)
	ctx := fctx(t)
	f.rt.Fail(fake.OpCheckpoint, "", 1, errdefs.ErrInternal)
	if _, err := f.eng.Snapshot(ctx, sb.ID, engine.SnapshotOptions{}); err == nil {
		t.Fatal("a snapshot whose checkpoint failed succeeded")
	}
	if left := fi.names("c-"); len(left) != 0 {
		t.Fatalf("a failed snapshot left copies %v", left)
	}
	if got, _ := f.eng.Get(ctx, sb.ID); got.State != engine.StateRunning {
		t.Fatalf("after a failed snapshot the sandbox is %s", got.State)
	}
	if info, err := f.rt.State(ctx, got(t, f, sb.ID).Instance); err != nil || info.State != runtime.StateRunning {
		t.Fatalf("its instance is %+v (%v): want running", info, err)
	}
	snap, err := f.eng.Snapshot(ctx, sb.ID, engine.SnapshotOptions{})
	if err != nil {
		t.Fatal(err)
	}
	id := "inewsandbox00000001"
	fi.fail = ids.Derive('v', id, "vol1")
	if _, err := f.eng.Create(ctx, engine.CreateOptions{ID: id, Template: snap.Manifest.ID}); err == nil {
		t.Fatal("a create whose volume could not be made succeeded")
	}
	if _, err := f.eng.Get(ctx, id); !errdefs.IsNotFound(err) {
		t.Fatalf("the failed create left its sandbox: %v", err)
	}
	if _, ok := fi.get(fi.fail); ok {
		t.Fatal("the failed create left its volume's image")
	}
	// Another sandbox on the template, with no volume: the snapshot's
	// volume is not its to roll back to.
	other, err := f.eng.Create(ctx, engine.CreateOptions{Template: "vtpl"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.eng.Rollback(ctx, other.ID, snap.Manifest.ID); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("a rollback to another sandbox's exclusive volume: %v", err)
	}
	if got := got(t, f, other.ID); got.Instance != other.Instance || len(got.Run.Volumes) != 0 || len(fi.names("r-")) != 0 {
		t.Fatalf("the refused rollback changed the sandbox (%+v) or left images %v", got.Run.Volumes, fi.names("r-"))
	}

	// No volume images: refused, nothing changed.
	f.close()
	f.vols = nil
	f.open()
	if _, err := f.eng.Snapshot(ctx, sb.ID, engine.SnapshotOptions{}); !errdefs.IsUnavailable(err) {
		t.Fatalf("a snapshot without volume images: %v", err)
	}
	if got, _ := f.eng.Get(ctx, sb.ID); got.State != engine.StateRunning {
		t.Fatalf("after the refused snapshot the sandbox is %s", got.State)
	}
}

func got(t *testing.T, f *fenv, id string) engine.Sandbox {
	t.Helper()
	sb, err := f.eng.Get(fctx(t), id)
	if err != nil {
		t.Fatal(err)
	}
	return sb
}

// At Open the copies and rollback images nothing names are removed (what
// a crash during a capture or a rollback leaves); those a snapshot, a
// sandbox or the cleanup journal names, and volumes' own images, stay.
func TestStrayVolumeImagesRemovedAtOpen(t *testing.T) {
	f, fi, sb := newVolumeFake(t)
	ctx := fctx(t)
	snap, err := f.eng.Snapshot(ctx, sb.ID, engine.SnapshotOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rb, err := f.eng.Rollback(ctx, sb.ID, snap.Manifest.ID)
	if err != nil {
		t.Fatal(err)
	}
	f.eng.Settle()
	fi.set("c-sdeadsnapshot00000-vol1", "stray")
	fi.set("r-ideadsandbox00000-3-vol1", "stray")
	fi.set("vother", "a volume")
	f.close()
	f.open()
	want := []string{snap.Manifest.Run.Volumes[0].Copy, rb.Run.Volumes[0].Image, "vol1", "vother"}
	slices.Sort(want)
	if got, _ := fi.Images(ctx); !slices.Equal(got, want) {
		t.Fatalf("after Open the images are %v, want %v", got, want)
	}
}

// A crash (the data directory, the runtime's instances and the pool
// copied at that moment, a new engine opened on the copies) before each
// runtime and pool call of a snapshot, fork, rollback, hibernate and kill
// of a sandbox holding an exclusive volume it rolled back: after the
// start no copy or rollback image is left that nothing names (no half
// captured volume is visible), and the volume's content is never lost:
// the sandbox's image (or, once it is gone, the volume's own) holds what
// it had, or the snapshot's content when the rollback committed.
func TestExclusiveVolumeCrashAtEachStep(t *testing.T) {
	ops := map[string]func(f *fenv, id string) error{
		"snapshot": func(f *fenv, id string) error { return second(f.eng.Snapshot(fctx(f.t), id, engine.SnapshotOptions{})) },
		"fork": func(f *fenv, id string) error {
			return second(f.eng.Fork(fctx(f.t), id, engine.ForkOptions{Count: 2, Concurrency: 1}))
		},
		"rollback":  func(f *fenv, id string) error { return second(f.eng.Rollback(fctx(f.t), id, "one")) },
		"hibernate": func(f *fenv, id string) error { return f.eng.Hibernate(fctx(f.t), id) },
		"kill":      func(f *fenv, id string) error { return f.eng.Kill(fctx(f.t), id) },
	}
	for _, name := range []string{"snapshot", "fork", "rollback", "hibernate", "kill"} {
		t.Run(name, func(t *testing.T) {
			steps := 0
			for k := 1; ; k++ {
				f, fi, sb := newVolumeFake(t)
				ctx := fctx(t)
				if _, err := f.eng.Snapshot(ctx, sb.ID, engine.SnapshotOptions{Names: []string{"one"}}); err != nil {
					t.Fatal(err)
				}
				rb, err := f.eng.Rollback(ctx, sb.ID, "one")
				if err != nil {
					t.Fatal(err)
				}
				f.eng.Settle()
				fi.set(rb.Run.Volumes[0].Image, "live")
				var mu sync.Mutex
				n, hit := 0, false
				var crashDir string
				var crashRT *fake.Runtime
				var crashImgs *fakeImages
				step := func() error {
					mu.Lock()
					defer mu.Unlock()
					n++
					if n == k {
						hit = true
						crashDir = t.TempDir()
						copyTree(t, f.dir, crashDir)
						crashRT = f.rt.Clone()
						crashImgs = fi.clone(t)
					}
					return nil
				}
				f.rt.Hook(func(op fake.Op, _ string) error {
					if op == fake.OpExec || op == fake.OpPrecreate {
						return nil
					}
					return step()
				})
				fi.mu.Lock()
				fi.before = func(string) error { return step() }
				fi.mu.Unlock()
				opErr := ops[name](f, sb.ID)
				f.eng.Settle()
				f.rt.Hook(nil)
				if !hit {
					if opErr != nil {
						t.Fatalf("the operation failed with no crash: %v", opErr)
					}
					break
				}
				steps++
				f.close()
				g := &fenv{t: t, dir: crashDir, rt: crashRT, logs: f.logs, logMu: f.logMu, retry: f.retry, vols: crashImgs}
				g.open()
				checkAgree(t, g)
				named := map[string]bool{}
				for _, m := range g.eng.Snapshots().List() {
					for _, v := range m.Run.Volumes {
						named[v.Copy] = true
					}
				}
				var holder *engine.Sandbox
				for _, s := range g.eng.List(ctx) {
					for _, v := range s.Run.Volumes {
						named[v.Image] = true
						if s.ID == sb.ID {
							holder = &s
						}
					}
				}
				imgs, _ := crashImgs.Images(ctx)
				for _, img := range imgs {
					if (strings.HasPrefix(img, "c-") || strings.HasPrefix(img, "r-")) && !named[img] {
						t.Fatalf("step %d: image %s is left and nothing names it (images %v)", k, img, imgs)
					}
				}
				want, where := "live", "vol1"
				if holder != nil {
					where = holder.Run.Volumes[0].ImageName()
				}
				got, ok := crashImgs.get(where)
				if !ok || got != want && !(name == "rollback" && got == "v1") {
					t.Fatalf("step %d: the volume's content, in %s, is %q (%v): want %q", k, where, got, ok, want)
				}
				g.close()
			}
			if steps == 0 {
				t.Fatal("the operation made no call")
			}
			t.Logf("%s: crashed before each of %d calls", name, steps)
		})
	}
}
