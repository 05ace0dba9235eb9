package runtimetest

import (
	"path/filepath"
	"slices"
	"testing"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/runtime"
)

// RunContract runs the checks of the runtime contract that need nothing
// from inside a guest: instance states through start, pause, resume,
// checkpoint, restore and kill; taken and unknown IDs; listing and
// re-attaching; refused input. rootfs must be an existing directory the
// runtime can boot (for a real runtime, a root filesystem with python3).
func RunContract(t *testing.T, rt runtime.Runtime, rootfs string) {
	s := &suite{rt: rt, rootfs: rootfs}
	t.Run("Lifecycle", s.testLifecycle)
	t.Run("PauseResumeStates", s.testPauseResumeStates)
	t.Run("CheckpointRestoreIDs", s.testCheckpointRestoreIDs)
	t.Run("ListAndRecoverIDs", s.testListRecoverIDs)
	t.Run("BadInput", s.testBadInput)
	t.Run("PrecreateIDs", s.testPrecreateIDs)
}

// testPrecreateIDs: a pre-created instance (runtime.Precreator) exists
// and is listed; a restore with another spec is refused and leaves it as
// it was; the right spec fills it once; an unused one is freed by Kill; a
// restore from an empty directory leaves it usable. (Every runtime Spore
// ships has the capability; one without it has nothing to check here.)
func (s *suite) testPrecreateIDs(t *testing.T) {
	pc, ok := s.rt.(runtime.Precreator)
	if !ok {
		return
	}
	ctx := ctxFor(t)
	src := s.start(t, ctx, runtime.Limits{MemoryMB: 256})
	img := t.TempDir()
	if err := s.rt.Checkpoint(ctx, src, img, runtime.CheckpointOptions{LeaveRunning: true}); err != nil {
		t.Fatalf("Checkpoint: %v", err)
	}
	var pre []runtime.Spec
	for range 3 {
		spec := s.spec(ids.New('t'), runtime.Limits{MemoryMB: 256})
		if err := pc.Precreate(ctx, spec); err != nil {
			t.Fatalf("Precreate: %v", err)
		}
		s.cleanup(t, spec.ID)
		s.wantState(t, ctx, spec.ID, runtime.StateRunning)
		pre = append(pre, spec)
	}
	list, err := s.rt.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, spec := range pre {
		if !slices.ContainsFunc(list, func(i runtime.Info) bool { return i.ID == spec.ID }) {
			t.Fatalf("List does not include pre-created %s: %+v", spec.ID, list)
		}
	}
	if err := pc.Precreate(ctx, pre[0]); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("Precreate of a taken ID = %v, want already exists", err)
	}
	a, b, c := pre[0], pre[1], pre[2]
	other := s.spec(a.ID, runtime.Limits{MemoryMB: 512})
	if err := s.rt.Restore(ctx, other, img); !errdefs.IsConflict(err) {
		t.Fatalf("Restore with another spec = %v, want conflict", err)
	}
	s.wantState(t, ctx, a.ID, runtime.StateRunning)
	// Env and Hostname are a boot's: a restore may bring others.
	withEnv := a
	withEnv.Env, withEnv.Hostname = []string{"OTHER=1"}, "other"
	if err := s.rt.Restore(ctx, withEnv, img); err != nil {
		t.Fatalf("Restore into the pre-created instance: %v", err)
	}
	s.wantState(t, ctx, a.ID, runtime.StateRunning)
	if err := s.rt.Restore(ctx, a, img); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("a second Restore into it = %v, want already exists", err)
	}
	if err := s.rt.Kill(ctx, b.ID); err != nil {
		t.Fatalf("Kill of an unused pre-created instance: %v", err)
	}
	if _, err := s.rt.State(ctx, b.ID); !errdefs.IsNotFound(err) {
		t.Fatalf("State after Kill = %v, want not found", err)
	}
	if err := s.rt.Restore(ctx, c, t.TempDir()); !errdefs.IsNotFound(err) {
		t.Fatalf("Restore from an empty dir = %v, want not found", err)
	}
	if err := s.rt.Restore(ctx, c, img); err != nil {
		t.Fatalf("Restore after a refused one: %v", err)
	}
}

func (s *suite) testLifecycle(t *testing.T) {
	ctx := ctxFor(t)
	id := s.start(t, ctx, runtime.Limits{})
	s.wantState(t, ctx, id, runtime.StateRunning)
	if err := s.rt.Start(ctx, s.spec(id, runtime.Limits{})); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("Start with a taken ID = %v, want already exists", err)
	}
	if err := s.rt.Kill(ctx, id); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	if _, err := s.rt.State(ctx, id); !errdefs.IsNotFound(err) {
		t.Fatalf("State after Kill = %v, want not found", err)
	}
	if err := s.rt.Kill(ctx, id); !errdefs.IsNotFound(err) {
		t.Fatalf("second Kill = %v, want not found", err)
	}
	if _, err := s.rt.Exec(ctx, id, runtime.ExecSpec{Args: []string{"true"}}); !errdefs.IsNotFound(err) {
		t.Fatalf("Exec after Kill = %v, want not found", err)
	}
	if err := s.rt.Pause(ctx, id); !errdefs.IsNotFound(err) {
		t.Fatalf("Pause after Kill = %v, want not found", err)
	}
	// The ID is free again.
	if err := s.rt.Start(ctx, s.spec(id, runtime.Limits{})); err != nil {
		t.Fatalf("Start with a freed ID: %v", err)
	}
	s.wantState(t, ctx, id, runtime.StateRunning)
}

func (s *suite) testPauseResumeStates(t *testing.T) {
	ctx := ctxFor(t)
	id := s.start(t, ctx, runtime.Limits{})
	if err := s.rt.Pause(ctx, id); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	s.wantState(t, ctx, id, runtime.StatePaused)
	if err := s.rt.Resume(ctx, id); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	s.wantState(t, ctx, id, runtime.StateRunning)
	// A paused instance can be checkpointed live and killed.
	if err := s.rt.Pause(ctx, id); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	if err := s.rt.Checkpoint(ctx, id, t.TempDir(), runtime.CheckpointOptions{LeaveRunning: true}); err != nil {
		t.Fatalf("Checkpoint of a paused instance: %v", err)
	}
	if err := s.rt.Kill(ctx, id); err != nil {
		t.Fatalf("Kill of a paused instance: %v", err)
	}
}

func (s *suite) testCheckpointRestoreIDs(t *testing.T) {
	ctx := ctxFor(t)
	src := s.start(t, ctx, runtime.Limits{})
	img := t.TempDir()
	if err := s.rt.Checkpoint(ctx, src, img, runtime.CheckpointOptions{LeaveRunning: true}); err != nil {
		t.Fatalf("Checkpoint: %v", err)
	}
	s.wantState(t, ctx, src, runtime.StateRunning)
	clone := s.spec(ids.New('t'), runtime.Limits{})
	if err := s.rt.Restore(ctx, clone, img); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	s.cleanup(t, clone.ID)
	s.wantState(t, ctx, clone.ID, runtime.StateRunning)
	if err := s.rt.Restore(ctx, s.spec(clone.ID, runtime.Limits{}), img); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("Restore into a taken ID = %v, want already exists", err)
	}
	if err := s.rt.Restore(ctx, s.spec(ids.New('t'), runtime.Limits{}), t.TempDir()); !errdefs.IsNotFound(err) {
		t.Fatalf("Restore from an empty dir = %v, want not found", err)
	}
	// A checkpoint that does not leave the instance running frees its ID.
	img2 := t.TempDir()
	if err := s.rt.Checkpoint(ctx, src, img2, runtime.CheckpointOptions{}); err != nil {
		t.Fatalf("Checkpoint: %v", err)
	}
	if _, err := s.rt.State(ctx, src); !errdefs.IsNotFound(err) {
		t.Fatalf("State after stopping checkpoint = %v, want not found", err)
	}
	if err := s.rt.Restore(ctx, s.spec(src, runtime.Limits{}), img2); err != nil {
		t.Fatalf("Restore under the old ID: %v", err)
	}
	s.wantState(t, ctx, src, runtime.StateRunning)
}

func (s *suite) testListRecoverIDs(t *testing.T) {
	ctx := ctxFor(t)
	a := s.start(t, ctx, runtime.Limits{})
	b := s.start(t, ctx, runtime.Limits{})
	if err := s.rt.Pause(ctx, b); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	list, err := s.rt.List(ctx)
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	got := map[string]runtime.State{}
	for _, i := range list {
		got[i.ID] = i.State
	}
	if got[a] != runtime.StateRunning || got[b] != runtime.StatePaused {
		t.Fatalf("List = %v, want %s running and %s paused", got, a, b)
	}
	for _, want := range []struct {
		id string
		st runtime.State
	}{{a, runtime.StateRunning}, {b, runtime.StatePaused}} {
		info, err := s.rt.Recover(ctx, want.id)
		if err != nil || info.State != want.st || info.PID <= 0 || info.ID != want.id {
			t.Fatalf("Recover(%s) = %+v, %v; want %s", want.id, info, err, want.st)
		}
	}
	if _, err := s.rt.Recover(ctx, ids.New('t')); !errdefs.IsNotFound(err) {
		t.Fatalf("Recover(unknown) = %v, want not found", err)
	}
	if err := s.rt.Kill(ctx, a); err != nil {
		t.Fatal(err)
	}
	list, err = s.rt.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if slices.ContainsFunc(list, func(i runtime.Info) bool { return i.ID == a }) {
		t.Fatalf("List after Kill still has %s", a)
	}
}

func (s *suite) testBadInput(t *testing.T) {
	ctx := ctxFor(t)
	for _, id := range []string{"", "../x", "a/b", "..", "UPPER"} {
		spec := s.spec(id, runtime.Limits{})
		if err := s.rt.Start(ctx, spec); !errdefs.IsInvalidArgument(err) {
			t.Errorf("Start(%q) = %v, want invalid argument", id, err)
		}
		if err := s.rt.Kill(ctx, id); !errdefs.IsInvalidArgument(err) {
			t.Errorf("Kill(%q) = %v, want invalid argument", id, err)
		}
		if _, err := s.rt.State(ctx, id); !errdefs.IsInvalidArgument(err) {
			t.Errorf("State(%q) = %v, want invalid argument", id, err)
		}
	}
	for _, id := range []string{ids.New('t')} {
		if err := s.rt.Pause(ctx, id); !errdefs.IsNotFound(err) {
			t.Errorf("Pause(unknown) = %v, want not found", err)
		}
		if err := s.rt.Checkpoint(ctx, id, t.TempDir(), runtime.CheckpointOptions{}); !errdefs.IsNotFound(err) {
			t.Errorf("Checkpoint(unknown) = %v, want not found", err)
		}
	}
	spec := s.spec(ids.New('t'), runtime.Limits{})
	spec.RootFS = filepath.Join(t.TempDir(), "missing")
	if err := s.rt.Start(ctx, spec); !errdefs.IsNotFound(err) {
		t.Errorf("Start with a missing root filesystem = %v, want not found", err)
	}
	dir := t.TempDir()
	bad := s.spec(ids.New('t'), runtime.Limits{})
	bad.Mounts = []runtime.Mount{{Source: "relative", Destination: "/x"}}
	if err := s.rt.Start(ctx, bad); !errdefs.IsInvalidArgument(err) {
		t.Errorf("relative mount source = %v, want invalid argument", err)
	}
	bad.Mounts = []runtime.Mount{{Source: filepath.Join(dir, "missing"), Destination: "/x"}}
	if err := s.rt.Start(ctx, bad); !errdefs.IsNotFound(err) {
		t.Errorf("missing mount source = %v, want not found", err)
	}
	spec = s.spec(ids.New('t'), runtime.Limits{MemoryMB: -1})
	if err := s.rt.Start(ctx, spec); !errdefs.IsInvalidArgument(err) {
		t.Errorf("Start with a negative limit = %v, want invalid argument", err)
	}
	// Nothing was left behind by the refused calls.
	list, err := s.rt.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range list {
		if i.ID == spec.ID || i.ID == bad.ID {
			t.Errorf("refused Start left instance %s", i.ID)
		}
	}
}
