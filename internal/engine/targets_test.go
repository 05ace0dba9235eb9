package engine_test

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/engine"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/runtime/fake"
)

// Restore targets (fast tier): a restore loads its image into a target of
// its shape, made in the background after the previous restore of that
// shape; memory is the image's; a failed fill leaves nothing and restores
// go on without one; shapes do not mix; Close frees the targets.
func TestRestoreTargets(t *testing.T) {
	f := newFakeTargets(t, 1)
	ctx := fctx(t)
	a := f.create() // the shape's first restore: no target yet
	f.eng.Settle()
	targets := f.eng.RestoreTargets()
	if len(targets) != 1 {
		t.Fatalf("after a restore of a shape, restore targets %v, want 1", targets)
	}
	if slices.Contains(targets, a.Instance) {
		t.Fatalf("the first sandbox's instance %s is listed as a target", a.Instance)
	}
	b := f.create()
	if b.Instance != targets[0] {
		t.Fatalf("a create of the same shape ran in %s, not in the target %s", b.Instance, targets[0])
	}
	if got, want := f.get(b.ID, "boot"), f.get(a.ID, "boot"); got != want || got == "" {
		t.Fatalf("a sandbox restored into a target has boot=%q, want the template's %q", got, want)
	}
	f.eng.Settle()
	next := f.eng.RestoreTargets()
	if len(next) != 1 || next[0] == targets[0] {
		t.Fatalf("targets after the claim %v, want one new one", next)
	}

	// A rollback restores into a target too, with the snapshot's memory.
	f.set(b.ID, "x", "1")
	if _, err := f.eng.Snapshot(ctx, b.ID, engine.SnapshotOptions{Names: []string{"b1"}}); err != nil {
		t.Fatal(err)
	}
	f.set(b.ID, "x", "2")
	f.eng.Settle()
	tg := f.eng.RestoreTargets()[0]
	sb, err := f.eng.Rollback(ctx, b.ID, "b1")
	if err != nil {
		t.Fatal(err)
	}
	if sb.Instance != tg || f.get(b.ID, "x") != "1" {
		t.Fatalf("rollback: instance %s (target %s), x=%s", sb.Instance, tg, f.get(b.ID, "x"))
	}

	// Another shape does not take this shape's target.
	f.eng.Settle()
	tg = f.eng.RestoreTargets()[0]
	c, err := f.eng.Create(ctx, engine.CreateOptions{Template: "tpl", MemoryMB: 512})
	if err != nil {
		t.Fatal(err)
	}
	if c.Instance == tg {
		t.Fatal("a create with other limits took another shape's target")
	}
	f.eng.Settle()
	if got := f.eng.RestoreTargets(); len(got) != 2 || !slices.Contains(got, tg) {
		t.Fatalf("targets of two shapes %v, want 2 including %s", got, tg)
	}

	// A fill that fails leaves nothing, and the next restore of the shape
	// boots as without targets.
	f.rt.Fail(fake.OpPrecreate, "", 1, errors.New("no room"))
	d := f.create() // takes the ready target; the fill after it fails
	if d.Instance != tg {
		t.Fatalf("create ran in %s, not in the target %s", d.Instance, tg)
	}
	f.eng.Settle()
	if got := f.eng.RestoreTargets(); len(got) != 1 {
		t.Fatalf("after a failed fill, targets %v, want the other shape's alone", got)
	}
	e := f.create()
	if slices.Contains(f.eng.RestoreTargets(), e.Instance) {
		t.Fatalf("instance %s is both a sandbox's and a target", e.Instance)
	}
	if f.get(e.ID, "boot") == "" {
		t.Fatal("a create after a failed fill has no template memory")
	}
	checkAgree(t, f)

	// Close frees the targets: the runtime keeps only sandboxes' instances.
	f.eng.Settle()
	if len(f.eng.RestoreTargets()) == 0 {
		t.Fatal("no targets before Close")
	}
	held := map[string]bool{}
	for _, sb := range f.eng.List(ctx) {
		held[sb.Instance] = true
	}
	f.close()
	for _, id := range f.rt.Instances() {
		if !held[id] {
			t.Fatalf("instance %s left after Close (not a sandbox's)", id)
		}
	}
}

// A fill failing leaves no instance behind, and a restore whose target's
// fill failed runs under the target's ID as a plain restore.
func TestRestoreTargetFillFails(t *testing.T) {
	f := newFakeTargets(t, 1)
	f.rt.Fail(fake.OpPrecreate, "", 1, errors.New("no room"))
	a := f.create() // registers the shape; the fill after it fails
	f.eng.Settle()
	if got := f.eng.RestoreTargets(); len(got) != 0 {
		t.Fatalf("a failed fill is listed: %v", got)
	}
	if n := f.rt.Calls(fake.OpPrecreate); n != 1 {
		t.Fatalf("precreate called %d times, want 1", n)
	}
	b := f.create() // no target: plain restore; the fill after it works
	if f.get(b.ID, "boot") != f.get(a.ID, "boot") {
		t.Fatal("plain restore lost the template's memory")
	}
	f.eng.Settle()
	if got := f.eng.RestoreTargets(); len(got) != 1 {
		t.Fatalf("targets %v after a good fill, want 1", got)
	}
	checkAgree(t, f)
}

// Targets are kept for the four shapes asked for last: a fifth shape's
// restore frees the targets of the one asked for least recently.
func TestRestoreTargetShapesEvicted(t *testing.T) {
	f := newFakeTargets(t, 1)
	ctx := fctx(t)
	var first []string
	for i, mb := range []int64{256, 384, 512, 640, 768} {
		if _, err := f.eng.Create(ctx, engine.CreateOptions{Template: "tpl", MemoryMB: mb}); err != nil {
			t.Fatal(err)
		}
		f.eng.Settle()
		if i == 0 {
			first = f.eng.RestoreTargets()
		}
	}
	got := f.eng.RestoreTargets()
	if len(got) != 4 || len(first) != 1 || slices.Contains(got, first[0]) {
		t.Fatalf("targets %v after five shapes (the first's was %v), want four, without the first's", got, first)
	}
	if slices.Contains(f.rt.Instances(), first[0]) {
		t.Fatalf("the evicted target %s still exists", first[0])
	}
	checkAgree(t, f)
}

// A target holds the root filesystem it was made over: when that tree is
// made again at the same path (a fresh unpack, new inodes, same identity),
// the target is dropped and the restore boots over the new tree.
func TestRestoreTargetOverAReplacedTree(t *testing.T) {
	f := newFakeTargets(t, 1)
	f.create()
	f.eng.Settle()
	old := f.eng.RestoreTargets()
	if len(old) != 1 {
		t.Fatalf("targets %v, want 1", old)
	}
	base := filepath.Join(f.dir, "rootfs", "base")
	if err := os.Rename(base, base+".old"); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(base, 0o755); err != nil {
		t.Fatal(err)
	}
	sb := f.create()
	if sb.Instance == old[0] {
		t.Fatalf("a restore over the re-made tree took the target %s made over the old one", old[0])
	}
	f.eng.Settle()
	if slices.Contains(f.rt.Instances(), old[0]) {
		t.Fatalf("the stale target %s was not freed", old[0])
	}
	if got := f.eng.RestoreTargets(); len(got) != 1 || got[0] == old[0] {
		t.Fatalf("targets %v after the restore, want one new one", got)
	}
	checkAgree(t, f)
}

// In a burst (a fork's children restored side by side) one child takes the
// ready target and the others boot their own: none waits for a target
// still being made, and the shape is topped up once, after the burst.
func TestRestoreTargetsInABurst(t *testing.T) {
	f := newFakeTargets(t, 1)
	sb := f.create()
	f.eng.Settle()
	ready := f.eng.RestoreTargets()
	fills := f.rt.Calls(fake.OpPrecreate)
	undo := holdRestores(f, 4) // each child's restore until all four are in flight
	children := f.fork(sb.ID, engine.ForkOptions{Count: 4, Concurrency: 4})
	undo()
	used := 0
	for _, c := range children {
		if slices.Contains(ready, c.Sandbox.Instance) {
			used++
		}
	}
	if used != 1 {
		t.Fatalf("%d children ran in the ready target %v, want 1", used, ready)
	}
	f.eng.Settle()
	if n := f.rt.Calls(fake.OpPrecreate) - fills; n != 1 {
		t.Fatalf("%d targets made for a burst of 4 restores, want 1 (after it)", n)
	}
	checkAgree(t, f)
}

// While restores of a shape are in flight, none waits for a target still
// being made and none is made: a restore that starts while another runs
// boots its own at once, and the shape is topped up when the last ends.
func TestRestoreTargetsNotAwaitedWhileBusy(t *testing.T) {
	f := newFakeTargets(t, 1)
	f.create()
	f.eng.Settle()
	fills := f.rt.Calls(fake.OpPrecreate)
	var mu sync.Mutex
	var gates []chan struct{}
	arrived := make(chan int, 8)
	f.rt.Hook(func(op fake.Op, _ string) error {
		if op != fake.OpRestore {
			return nil
		}
		mu.Lock()
		g := make(chan struct{})
		gates = append(gates, g)
		arrived <- len(gates) - 1
		mu.Unlock()
		<-g
		return nil
	})
	open := func(i int) {
		mu.Lock()
		close(gates[i])
		mu.Unlock()
	}
	done := make(chan engine.Sandbox, 3)
	create := func() {
		sb, err := f.eng.Create(fctx(t), engine.CreateOptions{Template: "tpl"})
		if err != nil {
			t.Error(err)
		}
		done <- sb
	}
	go create() // takes the ready target
	<-arrived
	go create() // boots its own
	<-arrived
	open(0) // the first ends while the second still runs: no target is made now
	<-done
	go create() // starts while the second runs: boots at once
	select {
	case <-arrived:
	case <-time.After(10 * time.Second):
		t.Fatal("a restore started while another ran waited (for a target being made?)")
	}
	if n := f.rt.Calls(fake.OpPrecreate) - fills; n != 0 {
		t.Fatalf("%d targets made while restores of the shape ran", n)
	}
	open(1)
	open(2)
	<-done
	<-done
	f.rt.Hook(nil)
	f.eng.Settle()
	if n := f.rt.Calls(fake.OpPrecreate) - fills; n != 1 {
		t.Fatalf("%d targets made after the restores, want 1", n)
	}
	checkAgree(t, f)
}

// holdRestores makes the fake runtime hold each restore until n have
// arrived, so that n restores are in flight at once (a burst), and returns
// the undo.
func holdRestores(f *fenv, n int) func() {
	gate := arrivals(n)
	f.rt.Hook(func(op fake.Op, _ string) error {
		if op == fake.OpRestore {
			gate()
		}
		return nil
	})
	return func() { f.rt.Hook(nil) }
}

// arrivals returns a function that blocks its callers until n calls have
// arrived (or 10 s have passed).
func arrivals(n int) func() {
	var mu sync.Mutex
	arrived, all := 0, make(chan struct{})
	return func() {
		mu.Lock()
		if arrived++; arrived == n {
			close(all)
		}
		mu.Unlock()
		select {
		case <-all:
		case <-time.After(10 * time.Second):
		}
	}
}

// A burst of restores of a shape grows its targets to the burst's size, up
// to RestoreTargetsBurst: the next burst of that size runs wholly in
// targets. Restores one at a time do not shrink it.
func TestRestoreTargetsGrowWithABurst(t *testing.T) {
	f := newFakeWith(t, &fenv{targets: 1, burst: 3, burstIdle: time.Hour})
	sb := f.create()
	f.eng.Settle()
	if got := f.eng.RestoreTargets(); len(got) != 1 {
		t.Fatalf("targets after one restore %v, want 1", got)
	}
	undo := holdRestores(f, 5)
	f.fork(sb.ID, engine.ForkOptions{Count: 5, Concurrency: 5})
	undo()
	f.eng.Settle()
	ready := f.eng.RestoreTargets()
	if len(ready) != 3 {
		t.Fatalf("targets after a burst of 5 restores %v, want 3 (the burst's size, capped)", ready)
	}
	children := f.fork(sb.ID, engine.ForkOptions{Count: 3, Concurrency: 3})
	for _, c := range children {
		if !slices.Contains(ready, c.Sandbox.Instance) {
			t.Fatalf("fork child ran in %s, not in one of the targets %v", c.Sandbox.Instance, ready)
		}
		if f.get(c.Sandbox.ID, "boot") == "" {
			t.Fatalf("fork child %s restored into a target has no memory", c.Sandbox.ID)
		}
	}
	f.create()
	f.eng.Settle()
	if got := f.eng.RestoreTargets(); len(got) != 3 {
		t.Fatalf("targets after another burst and a single create %v, want 3", got)
	}
	checkAgree(t, f)
}

// A shape grown by a burst goes back to RestoreTargets once no restore of
// it came for TargetBurstIdle: the extra targets' instances are freed.
func TestRestoreTargetsShrinkWhenIdle(t *testing.T) {
	f := newFakeWith(t, &fenv{targets: 1, burst: 4, burstIdle: 3 * time.Second})
	sb := f.create()
	f.eng.Settle()
	fills := f.rt.Calls(fake.OpPrecreate)
	undo := holdRestores(f, 4)
	if _, err := f.eng.Fork(fctx(t), sb.ID, engine.ForkOptions{Count: 4, Concurrency: 4}); err != nil {
		t.Fatal(err)
	}
	undo()
	f.eng.Settle() // the extra targets are made once the engine is quiet
	if got := f.eng.RestoreTargets(); len(got) != 4 {
		t.Fatalf("targets after a burst of 4 %v, want 4", got)
	}
	held := func() map[string]bool {
		h := map[string]bool{}
		for _, s := range f.eng.List(fctx(t)) {
			h[s.Instance] = true
		}
		return h
	}
	waitFor(t, "the burst's extra targets freed", func() bool {
		f.eng.Settle()
		return len(f.eng.RestoreTargets()) == 1
	})
	if n := f.rt.Calls(fake.OpPrecreate) - fills; n < 4 {
		t.Fatalf("%d targets made after a burst of 4 restores, want 4 (the pool grown to the burst)", n)
	}
	f.eng.Settle()
	h := held()
	var extra []string
	for _, id := range f.rt.Instances() {
		if !h[id] {
			extra = append(extra, id)
		}
	}
	if len(extra) != 1 {
		t.Fatalf("instances held by no sandbox %v, want the one resting target", extra)
	}
	if !strings.Contains(f.logged(), "restore targets back to their resting number") {
		t.Fatal("the shrink is not logged")
	}
	checkAgree(t, f)
}

// The targets a burst adds are made only once the engine has run no
// operation for a while: a sandbox's boot beside an operation slows it.
func TestRestoreTargetsExtraWaitForQuiet(t *testing.T) {
	f := newFakeWith(t, &fenv{targets: 1, burst: 3, burstIdle: time.Hour})
	sb, other := f.create(), f.create()
	f.eng.Settle()
	// An operation in flight across the burst's end: a snapshot of another
	// sandbox, held in its checkpoint.
	// The fork's three restores are held until all are in flight (a burst).
	release, inCheckpoint := make(chan struct{}), make(chan struct{})
	gate := arrivals(3)
	f.rt.Hook(func(op fake.Op, instance string) error {
		switch {
		case op == fake.OpCheckpoint && instance == other.Instance:
			close(inCheckpoint)
			<-release
		case op == fake.OpRestore:
			gate()
		}
		return nil
	})
	snapped := make(chan error, 1)
	go func() {
		_, err := f.eng.Snapshot(fctx(t), other.ID, engine.SnapshotOptions{})
		snapped <- err
	}()
	<-inCheckpoint
	f.fork(sb.ID, engine.ForkOptions{Count: 3, Concurrency: 3})
	time.Sleep(600 * time.Millisecond) // three times the quiet it waits for
	// A restore does not wait for an extra target whose boot has not
	// begun: the first create takes the resting one, the second boots its
	// own.
	queued := f.eng.RestoreTargets()
	first, second := f.create(), f.create()
	if !slices.Contains(queued, first.Instance) || slices.Contains(queued, second.Instance) {
		t.Fatalf("creates ran in %s and %s; targets were %v (the first made, the others waiting for quiet)", first.Instance, second.Instance, queued)
	}
	// The two extra targets (queued after the resting one) were not made
	// while operations ran.
	insts := f.rt.Instances()
	for _, id := range queued[1:] {
		if slices.Contains(insts, id) {
			t.Fatalf("extra target %s made while operations ran (targets %v)", id, queued)
		}
	}
	close(release)
	if err := <-snapped; err != nil {
		t.Fatal(err)
	}
	f.rt.Hook(nil)
	f.eng.Settle()
	if got := f.eng.RestoreTargets(); len(got) != 3 {
		t.Fatalf("targets once the engine was quiet %v, want 3", got)
	}
	checkAgree(t, f)
}

// A launch the host's memory refuses first frees the targets bursts added
// (idle sandboxes holding memory), and goes ahead if that was enough;
// without any to free it is refused as before, and nothing is left.
func TestRestoreTargetsFreedForAdmission(t *testing.T) {
	var avail atomic.Int64
	avail.Store(8 << 30)
	f := newFakeWith(t, &fenv{targets: 1, burst: 3, burstIdle: time.Hour, avail: &avail})
	sb := f.create()
	f.eng.Settle()
	undo := holdRestores(f, 3)
	if _, err := f.eng.Fork(fctx(t), sb.ID, engine.ForkOptions{Count: 3, Concurrency: 3}); err != nil {
		t.Fatal(err)
	}
	undo()
	f.eng.Settle()
	if got := f.eng.RestoreTargets(); len(got) != 3 {
		t.Fatalf("targets after a burst of 3 %v, want 3", got)
	}
	// Below the reserve (1 GiB); each instance killed gives back 200 MiB.
	avail.Store(900 << 20)
	f.rt.Hook(func(op fake.Op, _ string) error {
		if op == fake.OpKill {
			avail.Add(200 << 20)
		}
		return nil
	})
	if _, err := f.eng.Create(fctx(t), engine.CreateOptions{Template: "tpl"}); err != nil {
		t.Fatalf("create with burst targets to free: %v", err)
	}
	f.eng.Settle()
	if got := f.eng.RestoreTargets(); len(got) != 1 {
		t.Fatalf("targets after freeing for admission %v, want the resting 1", got)
	}
	if !strings.Contains(f.logged(), "freed the restore targets bursts added") {
		t.Fatal("freeing the targets for admission is not logged")
	}
	avail.Store(500 << 20)
	before := len(f.eng.List(fctx(t)))
	_, err := f.eng.Create(fctx(t), engine.CreateOptions{Template: "tpl"})
	if !errors.Is(err, errdefs.ErrResourceLimit) {
		t.Fatalf("create with no burst target to free, memory low: %v, want a resource limit", err)
	}
	f.rt.Hook(nil)
	if after := len(f.eng.List(fctx(t))); after != before {
		t.Fatalf("a refused create left %d sandboxes, had %d", after, before)
	}
	checkAgree(t, f)
}
