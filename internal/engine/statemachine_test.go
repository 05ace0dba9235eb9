package engine_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/control/controltest"
	"github.com/spore-run/spore/internal/engine"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/runtime"
	"github.com/spore-run/spore/internal/runtime/fake"
	"github.com/spore-run/spore/internal/snapshot"
)

// Fast tier: the engine's state machine over the fake runtime.

func wantConflict(t *testing.T, what string, err error) {
	t.Helper()
	if !errdefs.IsConflict(err) {
		t.Fatalf("%s = %v, want a conflict (409)", what, err)
	}
}

func (f *fenv) state(id string) engine.State {
	f.t.Helper()
	sb, err := f.eng.Get(fctx(f.t), id)
	if err != nil {
		f.t.Fatalf("get %s: %v", id, err)
	}
	return sb.State
}

// Every operation moves a sandbox between the states it documents, and one
// in the wrong state is refused with a conflict, changing nothing.
func TestFakeTransitions(t *testing.T) {
	f := newFake(t)
	ctx := fctx(t)
	sb := f.create()
	if sb.State != engine.StateRunning || sb.Instance == "" {
		t.Fatalf("created %+v", sb)
	}
	f.set(sb.ID, "x", "1")
	snap, err := f.eng.Snapshot(ctx, sb.ID, engine.SnapshotOptions{Names: []string{"one"}})
	if err != nil || f.state(sb.ID) != engine.StateRunning {
		t.Fatalf("snapshot: %v, state %s", err, f.state(sb.ID))
	}
	f.set(sb.ID, "x", "2")

	// running -> paused -> running
	if err := f.eng.Pause(ctx, sb.ID); err != nil || f.state(sb.ID) != engine.StatePaused {
		t.Fatalf("pause: %v, state %s", err, f.state(sb.ID))
	}
	if info, _ := f.rt.State(ctx, sb.Instance); info.State != runtime.StatePaused {
		t.Fatalf("instance is %s while the sandbox is paused", info.State)
	}
	wantConflict(t, "pause of a paused sandbox", f.eng.Pause(ctx, sb.ID))
	_, err = f.eng.Exec(ctx, sb.ID, runtime.ExecSpec{Args: []string{"true"}})
	wantConflict(t, "exec in a paused sandbox", err)
	if _, err := f.eng.Snapshot(ctx, sb.ID, engine.SnapshotOptions{}); err != nil || f.state(sb.ID) != engine.StatePaused {
		t.Fatalf("snapshot of a paused sandbox: %v, state %s", err, f.state(sb.ID))
	}
	if err := f.eng.Resume(ctx, sb.ID); err != nil || f.state(sb.ID) != engine.StateRunning {
		t.Fatalf("resume: %v, state %s", err, f.state(sb.ID))
	}
	wantConflict(t, "resume of a running sandbox", f.eng.Resume(ctx, sb.ID))

	// rollback: same ID, the snapshot's memory, a new instance, the old freed
	rb, err := f.eng.Rollback(ctx, sb.ID, "one")
	if err != nil {
		t.Fatal(err)
	}
	f.eng.Settle()
	if rb.ID != sb.ID || rb.Instance == sb.Instance || rb.Parent != snap.Manifest.ID || f.get(sb.ID, "x") != "1" {
		t.Fatalf("rollback = %+v, x = %s", rb, f.get(sb.ID, "x"))
	}
	if slices.Contains(f.rt.Instances(), sb.Instance) {
		t.Fatalf("replaced instance %s not freed", sb.Instance)
	}

	// fork: independent children with the parent's memory
	children := f.fork(sb.ID, engine.ForkOptions{Count: 3})
	for _, c := range children {
		if f.get(c.Sandbox.ID, "x") != "1" {
			t.Fatalf("child %s has x = %s", c.Sandbox.ID, f.get(c.Sandbox.ID, "x"))
		}
		f.set(c.Sandbox.ID, "x", c.Sandbox.ID)
	}
	if f.get(sb.ID, "x") != "1" {
		t.Fatal("a child's write reached the parent")
	}

	// running -> hibernated -> running
	if err := f.eng.Hibernate(ctx, sb.ID); err != nil || f.state(sb.ID) != engine.StateHibernated {
		t.Fatalf("hibernate: %v, state %s", err, f.state(sb.ID))
	}
	if slices.Contains(f.rt.Instances(), rb.Instance) {
		t.Fatal("hibernated sandbox still holds its instance")
	}
	hib := hibernations(f)
	if len(hib) != 1 {
		t.Fatalf("hibernation snapshots: %v", hib)
	}
	for what, err := range map[string]error{
		"pause":     f.eng.Pause(ctx, sb.ID),
		"hibernate": f.eng.Hibernate(ctx, sb.ID),
		"snapshot":  second(f.eng.Snapshot(ctx, sb.ID, engine.SnapshotOptions{})),
		"fork":      second(f.eng.Fork(ctx, sb.ID, engine.ForkOptions{Count: 1})),
		"rollback":  second(f.eng.Rollback(ctx, sb.ID, "one")),
		"exec":      second(f.eng.Exec(ctx, sb.ID, runtime.ExecSpec{Args: []string{"true"}})),
	} {
		wantConflict(t, what+" of a hibernated sandbox", err)
	}
	wantConflict(t, "delete of a hibernation snapshot in use", f.eng.DeleteSnapshot(ctx, hib[0]))
	if err := f.eng.Resume(ctx, sb.ID); err != nil || f.state(sb.ID) != engine.StateRunning {
		t.Fatalf("wake: %v, state %s", err, f.state(sb.ID))
	}
	if f.get(sb.ID, "x") != "1" || len(hibernations(f)) != 0 {
		t.Fatalf("after wake: x = %s, hibernation snapshots %v", f.get(sb.ID, "x"), hibernations(f))
	}

	// an instance dying on its own: dead, refused, killable
	cur, _ := f.eng.Get(ctx, sb.ID)
	if err := f.rt.Die(cur.Instance, runtime.ExitOOM, "test"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the sandbox to be dead", func() bool { return f.state(sb.ID) == engine.StateDead })
	wantConflict(t, "pause of a dead sandbox", f.eng.Pause(ctx, sb.ID))
	wantConflict(t, "resume of a dead sandbox", f.eng.Resume(ctx, sb.ID))

	// kill: gone, everything freed
	for _, id := range append([]string{sb.ID}, childIDs(children)...) {
		if err := f.eng.Kill(ctx, id); err != nil {
			t.Fatalf("kill %s: %v", id, err)
		}
		if _, err := f.eng.Get(ctx, id); !errdefs.IsNotFound(err) {
			t.Fatalf("get after kill = %v", err)
		}
		if err := f.eng.Kill(ctx, id); !errdefs.IsNotFound(err) {
			t.Fatalf("second kill = %v", err)
		}
	}
	if got := f.rt.Instances(); len(got) != 0 {
		t.Fatalf("instances left: %v", got)
	}
}

func second[T any](_ T, err error) error { return err }

func childIDs(children []engine.ForkChild) []string {
	var out []string
	for _, c := range children {
		out = append(out, c.Sandbox.ID)
	}
	return out
}

func hibernations(f *fenv) []string {
	var out []string
	for _, m := range f.eng.Snapshots().List() {
		if m.Kind == snapshot.KindHibernation {
			out = append(out, m.ID)
		}
	}
	return out
}

// A rollback whose restore fails leaves the sandbox exactly as it was:
// same instance, same memory, same state, nothing left in the runtime.
func TestFakeRollbackRestoreFails(t *testing.T) {
	f := newFake(t)
	ctx := fctx(t)
	sb := f.create()
	f.set(sb.ID, "x", "1")
	if _, err := f.eng.Snapshot(ctx, sb.ID, engine.SnapshotOptions{Names: []string{"one"}}); err != nil {
		t.Fatal(err)
	}
	f.set(sb.ID, "x", "2")
	for _, paused := range []bool{false, true} {
		if paused {
			if err := f.eng.Pause(ctx, sb.ID); err != nil {
				t.Fatal(err)
			}
		}
		before, _ := f.eng.Get(ctx, sb.ID)
		instances := f.rt.Instances()
		f.rt.Fail(fake.OpRestore, "", 1, errors.New("damaged image"))
		if _, err := f.eng.Rollback(ctx, sb.ID, "one"); err == nil || !strings.Contains(err.Error(), "sandbox unchanged") {
			t.Fatalf("rollback with a failing restore = %v", err)
		}
		f.eng.Settle()
		after, _ := f.eng.Get(ctx, sb.ID)
		if fmt.Sprint(after) != fmt.Sprint(before) {
			t.Fatalf("sandbox changed:\n before %+v\n after  %+v", before, after)
		}
		if got := f.rt.Instances(); !slices.Equal(got, instances) {
			t.Fatalf("instances %v, want %v", got, instances)
		}
		if paused {
			if err := f.eng.Resume(ctx, sb.ID); err != nil {
				t.Fatal(err)
			}
		}
		if f.get(sb.ID, "x") != "2" {
			t.Fatal("memory changed")
		}
	}
	// And the next rollback works.
	if _, err := f.eng.Rollback(ctx, sb.ID, "one"); err != nil {
		t.Fatal(err)
	}
	if f.get(sb.ID, "x") != "1" {
		t.Fatal("rollback after a failed one did not restore x")
	}
}

// seed returns the seed of a test's random choices: SPORE_TEST_SEED or
// the clock, logged so a failure can be replayed.
func seed(t *testing.T) uint64 {
	s := uint64(time.Now().UnixNano())
	if v := os.Getenv("SPORE_TEST_SEED"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("SPORE_TEST_SEED: %v", err)
		}
		s = n
	}
	t.Logf("seed %d (SPORE_TEST_SEED=%d reproduces)", s, s)
	return s
}

// Concurrent operations on one sandbox are serialized: no two runtime
// calls for it overlap (the fake's hook holds each one open for a random
// moment and flags an overlap), each operation either succeeds or is
// refused with a conflict, and the sandbox ends in a state that matches
// its instance.
func TestFakeSerialized(t *testing.T) {
	f := newFake(t)
	ctx := fctx(t)
	sb := f.create()
	if _, err := f.eng.Snapshot(ctx, sb.ID, engine.SnapshotOptions{Names: []string{"one"}}); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(seed(t), 1))
	var mu sync.Mutex
	delays := make([]time.Duration, 4096)
	for i := range delays {
		delays[i] = time.Duration(rng.IntN(300)) * time.Microsecond
	}
	next := 0
	busy := false
	var overlaps []string
	f.rt.Hook(func(op fake.Op, id string) error {
		if op == fake.OpExec || !strings.HasPrefix(id, sb.ID+"-") {
			return nil
		}
		mu.Lock()
		if busy {
			overlaps = append(overlaps, string(op)+" "+id)
		}
		busy = true
		d := delays[next%len(delays)]
		next++
		mu.Unlock()
		time.Sleep(d)
		mu.Lock()
		busy = false
		mu.Unlock()
		return nil
	})
	ops := []func() error{
		func() error { return f.eng.Pause(ctx, sb.ID) },
		func() error { return f.eng.Resume(ctx, sb.ID) },
		func() error { return second(f.eng.Snapshot(ctx, sb.ID, engine.SnapshotOptions{})) },
		func() error { return f.eng.Hibernate(ctx, sb.ID) },
		func() error { return second(f.eng.Rollback(ctx, sb.ID, "one")) },
	}
	plan := make([][]int, 6)
	for w := range plan {
		for range 15 {
			plan[w] = append(plan[w], rng.IntN(len(ops)))
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, 6*15)
	for w := range plan {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, i := range plan[w] {
				if err := ops[i](); err != nil && !errdefs.IsConflict(err) {
					errs <- fmt.Errorf("op %d: %w", i, err)
				}
			}
		}()
	}
	wg.Wait()
	f.eng.Settle()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	f.rt.Hook(nil)
	if len(overlaps) > 0 {
		t.Fatalf("runtime calls for one sandbox overlapped: %v", overlaps)
	}
	if next < 20 {
		t.Fatalf("only %d runtime calls: the test exercised little", next)
	}
	checkAgree(t, f)
}

// checkAgree asserts the engine and the runtime agree: every sandbox
// is in a stable state backed by what it names, and nothing in the runtime
// or the snapshot repository is unaccounted for.
func checkAgree(t *testing.T, f *fenv) {
	t.Helper()
	ctx := fctx(t)
	f.eng.Settle()
	waitFor(t, "pending cleanups to finish", func() bool { return len(f.eng.PendingCleanups()) == 0 })
	claimed := map[string]bool{}
	hib := map[string]bool{}
	for _, sb := range f.eng.List(ctx) {
		switch sb.State {
		case engine.StateRunning, engine.StatePaused:
			info, err := f.rt.State(ctx, sb.Instance)
			if err != nil {
				t.Fatalf("%s is %s but its instance %q: %v", sb.ID, sb.State, sb.Instance, err)
			}
			if string(info.State) != string(sb.State) {
				t.Fatalf("%s is %s but its instance is %s", sb.ID, sb.State, info.State)
			}
			claimed[sb.Instance] = true
			if sb.State == engine.StateRunning {
				if _, err := f.run(sb.ID, "true"); err != nil {
					t.Fatalf("%s does not answer: %v", sb.ID, err)
				}
			}
		case engine.StateHibernated:
			if sb.Instance != "" {
				t.Fatalf("hibernated %s names instance %s", sb.ID, sb.Instance)
			}
		case engine.StateDead:
		default:
			t.Fatalf("%s is in transitional state %s", sb.ID, sb.State)
		}
	}
	for _, m := range f.eng.Snapshots().List() {
		if m.Kind == snapshot.KindHibernation {
			hib[m.ID] = true
		}
	}
	targets := f.eng.RestoreTargets()
	if len(targets) > 4*f.targets { // at most 4 shapes keep targets
		t.Fatalf("%d restore targets kept, want at most %d per shape: %v", len(targets), f.targets, targets)
	}
	for _, id := range targets {
		if claimed[id] {
			t.Fatalf("restore target %s is also a sandbox's instance", id)
		}
		claimed[id] = true
	}
	for _, id := range f.rt.Instances() {
		if !claimed[id] {
			t.Fatalf("instance %s is claimed by no sandbox and is no restore target", id)
		}
	}
	checkNetworks(t, f, claimed, targets)
	n := 0
	for _, sb := range f.eng.List(ctx) {
		if sb.State == engine.StateHibernated {
			n++
		}
	}
	if n != len(hib) {
		t.Fatalf("%d hibernated sandboxes but %d hibernation snapshots", n, len(hib))
	}
}

// checkNetworks asserts, when the engine has a fake network, that every
// network is a live instance's (claimed), a restore target's or a reserved
// one (both reserved, nothing let out), and that each live instance has
// one.
func checkNetworks(t *testing.T, f *fenv, live map[string]bool, targets []string) {
	t.Helper()
	fn, ok := f.net.(*controltest.Network)
	if !ok {
		return
	}
	pool := f.eng.ReservedNetworks()
	if len(pool) > f.nets {
		t.Fatalf("%d reserved networks kept, want at most %d: %v", len(pool), f.nets, pool)
	}
	ahead := map[string]bool{}
	for _, id := range append(slices.Clone(targets), pool...) {
		ahead[id] = true
	}
	nets := fn.All()
	for id, n := range nets {
		switch {
		case ahead[id] && !n.Reserved:
			t.Fatalf("network %s, kept ahead, is not reserved: %+v", id, n)
		case !ahead[id] && !live[id]:
			t.Fatalf("network %s belongs to no live instance, target or reserved network: %+v", id, n)
		case live[id] && !ahead[id] && n.Reserved:
			t.Fatalf("network %s of a live instance was never claimed: %+v", id, n)
		}
	}
	for id := range live {
		if _, ok := nets[id]; !ok && !ahead[id] {
			t.Fatalf("live instance %s has no network", id)
		}
	}
}
