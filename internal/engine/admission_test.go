package engine_test

import (
	"bytes"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/spore-run/spore/internal/engine"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/runtime/fake"
	"github.com/spore-run/spore/internal/snapshot"
)

// memFloor is the memory floor of the admission tests' engines.
const memFloor = 1 << 30

// blob is the size of the value that makes a test's sandbox (and so its
// image) hold memory: with no instance overhead, a launch from its image
// takes ~blob (the fake's image is its memory as JSON, a few hundred bytes
// more).
const blob = 1 << 20

// newMemFake is a fake engine (fenv) whose admission reads avail (given
// the fake runtime) as the host's MemAvailable, with the floor memFloor,
// no instance overhead (a launch takes its image's memory) and the
// relief's margin margin.
func newMemFake(t *testing.T, avail func(*fake.Runtime) (int64, error), margin int64) *fenv {
	t.Helper()
	f := &fenv{t: t, dir: t.TempDir(), rt: fake.New(), logs: &bytes.Buffer{}, logMu: make(chan struct{}, 1)}
	rootfs := filepath.Join(f.dir, "rootfs")
	if err := os.MkdirAll(filepath.Join(rootfs, "base"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(rootfs, "base.json"), []byte(`{"id":"fake-base-1","suite":"fake"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	repo, err := snapshot.Open(filepath.Join(f.dir, "snapshots"))
	if err != nil {
		t.Fatal(err)
	}
	f.eng, err = engine.Open(fctx(t), engine.Config{
		Dir: filepath.Join(f.dir, "engine"), RootFSDir: rootfs, Runtime: f.rt, Snapshots: repo,
		MemoryReserve: memFloor, MemAvailable: func() (int64, error) { return avail(f.rt) }, InstanceOverhead: -1, MemoryMargin: margin,
		Logger: slog.New(slog.NewTextHandler(lockedWriter{mu: f.logMu, w: f.logs}, &slog.HandlerOptions{Level: slog.LevelInfo})),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.close)
	if _, err := f.eng.BuildTemplate(fctx(t), engine.TemplateSpec{Name: "tpl", Run: snapshot.RunConfig{Args: []string{"init"}}}); err != nil {
		t.Fatal(err)
	}
	return f
}

// fixed is a MemAvailable that reads v.
func fixed(v *atomic.Int64) func(*fake.Runtime) (int64, error) {
	return func(*fake.Runtime) (int64, error) { return v.Load(), nil }
}

// A fork of 5 children of a sandbox holding ~1 MiB, on a host with room
// for 3.5 of them above the floor: the first 3 are made (each with the
// parent's memory), the last 2 are refused at once with a resource-limit
// error naming memory, and nothing of them is left. With room for none,
// the fork fails as a whole and nothing changes. Before, admission only
// asked whether MemAvailable was above the floor, so all 5 were made.
func TestForkTrimmedToTheHostsMemory(t *testing.T) {
	var avail atomic.Int64
	avail.Store(8 << 30)
	f := newMemFake(t, fixed(&avail), 0)
	src := f.create()
	f.set(src.ID, "blob", strings.Repeat("m", blob))
	avail.Store(memFloor + 7*blob/2)
	fr, err := f.eng.Fork(fctx(t), src.ID, engine.ForkOptions{Count: 5})
	if err != nil {
		t.Fatalf("fork: %v", err)
	}
	for i, c := range fr.Children {
		if i < 3 {
			if c.Err != nil {
				t.Fatalf("child %d: %v, want made (3 fit)", i, c.Err)
			}
			if got := f.get(c.Sandbox.ID, "blob"); len(got) != blob {
				t.Fatalf("child %d holds %d bytes of the parent's memory, want %d", i, len(got), blob)
			}
			continue
		}
		if !errors.Is(c.Err, errdefs.ErrResourceLimit) || !strings.Contains(c.Err.Error(), "memory") {
			t.Fatalf("child %d: %v, want a resource limit naming memory", i, c.Err)
		}
		if c.Sandbox.ID != "" {
			t.Fatalf("refused child %d came with a sandbox: %+v", i, c.Sandbox)
		}
	}
	if got := len(f.eng.List(fctx(t))); got != 4 {
		t.Fatalf("%d sandboxes after the trimmed fork, want the source and 3 children", got)
	}
	if !strings.Contains(f.logged(), "fork trimmed to the host's memory") {
		t.Fatalf("the trim is not logged:\n%s", f.logged())
	}

	// Room for half a child: nothing fits, the fork fails as a whole.
	f.eng.Settle()
	avail.Store(memFloor + blob/2)
	before := len(f.rt.Instances())
	if _, err := f.eng.Fork(fctx(t), src.ID, engine.ForkOptions{Count: 2}); !errors.Is(err, errdefs.ErrResourceLimit) {
		t.Fatalf("fork with room for no child: %v, want a resource limit", err)
	}
	if got := len(f.eng.List(fctx(t))); got != 4 {
		t.Fatalf("%d sandboxes after a refused fork, want 4", got)
	}
	if after := len(f.rt.Instances()); after != before {
		t.Fatalf("a refused fork left %d instances, had %d", after, before)
	}
	// Under the floor: refused before the source is even captured.
	avail.Store(memFloor - 1)
	checkpoints := f.rt.Calls(fake.OpCheckpoint)
	if _, err := f.eng.Fork(fctx(t), src.ID, engine.ForkOptions{Count: 1}); !errors.Is(err, errdefs.ErrResourceLimit) {
		t.Fatalf("fork under the floor: %v, want a resource limit", err)
	}
	if got := f.rt.Calls(fake.OpCheckpoint); got != checkpoints {
		t.Fatal("a fork refused under the floor captured its source")
	}
}

// Concurrent creates from an image of ~1 MiB on a host with room for 3.5:
// while the admitted ones still restore, the others are refused; exactly 3
// restore, whatever the interleaving. Before, each create only compared
// MemAvailable (unchanged while they restore) with the floor: all 6 were
// admitted on the same free memory.
func TestConcurrentCreatesShareTheFreeMemory(t *testing.T) {
	var avail atomic.Int64
	avail.Store(8 << 30)
	f := newMemFake(t, fixed(&avail), 0)
	src := f.create()
	f.set(src.ID, "blob", strings.Repeat("m", blob))
	if _, err := f.eng.Snapshot(fctx(t), src.ID, engine.SnapshotOptions{Names: []string{"big"}}); err != nil {
		t.Fatal(err)
	}
	if err := f.eng.Kill(fctx(t), src.ID); err != nil {
		t.Fatal(err)
	}
	f.eng.Settle()
	avail.Store(memFloor + 7*blob/2)
	var restoring atomic.Int32
	release := make(chan struct{})
	f.rt.Hook(func(op fake.Op, _ string) error {
		if op == fake.OpRestore {
			restoring.Add(1)
			<-release
		}
		return nil
	})
	const n = 6
	var refused atomic.Int32
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = f.eng.Create(fctx(t), engine.CreateOptions{Template: "big"})
			if errors.Is(errs[i], errdefs.ErrResourceLimit) {
				refused.Add(1)
			}
		}()
	}
	waitFor(t, "every create admitted (restoring) or refused", func() bool { return int(restoring.Load()+refused.Load()) == n })
	if r, a := refused.Load(), restoring.Load(); r != 3 || a != 3 {
		close(release)
		wg.Wait()
		t.Fatalf("%d creates restoring at once and %d refused, want 3 and 3 (room for 3.5 images)", a, r)
	}
	close(release)
	wg.Wait()
	f.rt.Hook(nil)
	made := 0
	for _, err := range errs {
		switch {
		case err == nil:
			made++
		case !errors.Is(err, errdefs.ErrResourceLimit) || !strings.Contains(err.Error(), "memory"):
			t.Fatalf("create: %v, want made or a resource limit naming memory", err)
		}
	}
	if made != 3 {
		t.Fatalf("%d creates made, want 3", made)
	}
	if mem, tasks := f.eng.Refusals(); mem != 3 || tasks != 0 {
		t.Fatalf("refusals counted: %d for memory, %d for tasks; want the 3 creates for memory", mem, tasks)
	}
}

// A launch that fails gives back what it was admitted with at once: with
// room for 1.5 images, a create whose restore fails is followed by one that
// is admitted.
func TestFailedLaunchGivesItsMemoryBack(t *testing.T) {
	var avail atomic.Int64
	avail.Store(8 << 30)
	f := newMemFake(t, fixed(&avail), 0)
	src := f.create()
	f.set(src.ID, "blob", strings.Repeat("m", blob))
	if _, err := f.eng.Snapshot(fctx(t), src.ID, engine.SnapshotOptions{Names: []string{"big"}}); err != nil {
		t.Fatal(err)
	}
	avail.Store(memFloor + 3*blob/2)
	f.rt.Fail(fake.OpRestore, "", 1, errdefs.ErrUnavailable)
	if _, err := f.eng.Create(fctx(t), engine.CreateOptions{Template: "big"}); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("create with a failing restore: %v", err)
	}
	if _, err := f.eng.Create(fctx(t), engine.CreateOptions{Template: "big"}); err != nil {
		t.Fatalf("create after a failed one: %v (its memory was not given back)", err)
	}
}

// Under memory pressure the relief hibernates the least recently active
// sandboxes first and stops once MemAvailable is back above the floor plus
// the margin. Each running instance holds 200 MiB here; the host is 50 MiB
// under the floor with 4 running, the margin is 200 MiB: the two coldest go
// (the first brings it to floor + 150 MiB, the second to floor + 350 MiB),
// each logged with the reason and reported, and a hibernated one resumes.
func TestPressureHibernatesTheColdestFirst(t *testing.T) {
	const each = 200 << 20
	var base atomic.Int64
	base.Store(16 << 30)
	avail := func(rt *fake.Runtime) (int64, error) { return base.Load() - each*int64(len(rt.Instances())), nil }
	f := newMemFake(t, avail, 200<<20)
	var sbs []string
	for range 4 {
		sbs = append(sbs, f.create().ID)
	}
	f.run(sbs[0], "true") // the oldest is now the most recently active
	var reported []string
	f.eng.OnRelieved(func(sb engine.Sandbox, detail string) {
		if sb.State != engine.StateHibernated || !strings.Contains(detail, "floor") {
			t.Errorf("reported %s as %s (%q)", sb.ID, sb.State, detail)
		}
		reported = append(reported, sb.ID)
	})
	if got := f.eng.RelievePressure(fctx(t)); len(got) != 0 {
		t.Fatalf("relief above the floor hibernated %v", got)
	}
	base.Store(memFloor - 50<<20 + 4*each)
	got := f.eng.RelievePressure(fctx(t))
	want := []string{sbs[1], sbs[2]}
	if !slices.Equal(got, want) || !slices.Equal(reported, want) {
		t.Fatalf("relief hibernated %v (reported %v), want the two coldest %v", got, reported, want)
	}
	for i, id := range sbs {
		sb, err := f.eng.Get(fctx(t), id)
		if err != nil {
			t.Fatal(err)
		}
		wantState := engine.StateRunning
		if i == 1 || i == 2 {
			wantState = engine.StateHibernated
		}
		if sb.State != wantState {
			t.Fatalf("sandbox %d is %s, want %s", i, sb.State, wantState)
		}
	}
	logs := f.logged()
	for _, id := range want {
		if !strings.Contains(logs, `hibernating the coldest sandbox" sandbox_id=`+id+" reason=memory-pressure") {
			t.Fatalf("hibernation of %s under pressure not logged with its reason:\n%s", id, logs)
		}
	}
	if got := f.eng.RelievePressure(fctx(t)); len(got) != 0 {
		t.Fatalf("relief above the floor again hibernated %v", got)
	}
	base.Store(16 << 30)
	if err := f.eng.Resume(fctx(t), sbs[1]); err != nil {
		t.Fatalf("resume a sandbox the relief hibernated: %v", err)
	}
}
