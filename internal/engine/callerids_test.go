package engine_test

import (
	"sync"
	"testing"

	"github.com/spore-run/spore/internal/engine"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/runtime/fake"
	"github.com/spore-run/spore/internal/snapshot"
)

// Fast tier: IDs minted by the caller (the control plane) make creates,
// snapshots and forks idempotent: a replay returns what the first call
// made, never a second instance or image.

func TestCreateWithCallerIDIsIdempotent(t *testing.T) {
	f := newFake(t)
	ctx := fctx(t)
	opts := engine.CreateOptions{ID: "sb-replay-1", Template: "tpl", AccessToken: "tok-1"}
	first, err := f.eng.Create(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	if first.ID != opts.ID || first.Run.AccessToken != "tok-1" {
		t.Fatalf("created %s with token %q, want the caller's ID and token", first.ID, first.Run.AccessToken)
	}
	restores := f.rt.Calls(fake.OpRestore)
	again, err := f.eng.Create(ctx, opts)
	if err != nil {
		t.Fatalf("replay: %v", err)
	}
	if again.ID != first.ID || again.Instance != first.Instance {
		t.Fatalf("replay gave %s/%s, want %s/%s", again.ID, again.Instance, first.ID, first.Instance)
	}
	if n := f.rt.Calls(fake.OpRestore); n != restores {
		t.Fatalf("replay restored again (%d restores, want %d)", n, restores)
	}
	// The same ID from another source is not a replay.
	snap, err := f.eng.Snapshot(ctx, first.ID, engine.SnapshotOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.eng.Create(ctx, engine.CreateOptions{ID: opts.ID, Template: snap.Manifest.ID})
	if !errdefs.IsAlreadyExists(err) {
		t.Fatalf("same ID, other source = %v, want already exists", err)
	}
	// A malformed ID never reaches a path.
	if _, err := f.eng.Create(ctx, engine.CreateOptions{ID: "../x", Template: "tpl"}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("create with ID ../x = %v, want invalid argument", err)
	}
	// Across an engine restart too.
	f.reopen()
	again, err = f.eng.Create(ctx, opts)
	if err != nil || again.Instance != first.Instance {
		t.Fatalf("replay after restart: %v (instance %s, want %s)", err, again.Instance, first.Instance)
	}
	if got := len(f.eng.List(ctx)); got != 1 {
		t.Fatalf("%d sandboxes, want 1", got)
	}
}

// Replays racing the first create wait for it and get its sandbox.
func TestConcurrentCreatesWithOneIDMakeOne(t *testing.T) {
	f := newFake(t)
	ctx := fctx(t)
	const n = 8
	got := make([]engine.Sandbox, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i], errs[i] = f.eng.Create(ctx, engine.CreateOptions{ID: "sb-race", Template: "tpl", AccessToken: "tok"})
		}()
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("create %d: %v", i, errs[i])
		}
		if got[i].Instance != got[0].Instance {
			t.Fatalf("create %d got instance %s, create 0 got %s", i, got[i].Instance, got[0].Instance)
		}
	}
	if len(f.rt.Instances()) != 1 || f.rt.Calls(fake.OpRestore) != 1 {
		t.Fatalf("%d instances after %d restores, want 1 and 1", len(f.rt.Instances()), f.rt.Calls(fake.OpRestore))
	}
}

// A create that failed leaves nothing, and its retry under the same ID
// makes the sandbox.
func TestCreateRetryAfterFailure(t *testing.T) {
	f := newFake(t)
	ctx := fctx(t)
	f.rt.Fail(fake.OpRestore, "", 1, errdefs.ErrUnavailable)
	if _, err := f.eng.Create(ctx, engine.CreateOptions{ID: "sb-retry", Template: "tpl"}); err == nil {
		t.Fatal("create with a failing restore succeeded")
	}
	if _, err := f.eng.Get(ctx, "sb-retry"); !errdefs.IsNotFound(err) {
		t.Fatalf("after a failed create: get = %v, want not found", err)
	}
	sb, err := f.eng.Create(ctx, engine.CreateOptions{ID: "sb-retry", Template: "tpl"})
	if err != nil || sb.State != engine.StateRunning {
		t.Fatalf("retry: %v (%s)", err, sb.State)
	}
}

func TestSnapshotWithCallerIDIsIdempotent(t *testing.T) {
	f := newFake(t)
	ctx := fctx(t)
	a, b := f.create(), f.create()
	opts := engine.SnapshotOptions{ID: "snap-replay", Names: []string{"named"}}
	first, err := f.eng.Snapshot(ctx, a.ID, opts)
	if err != nil {
		t.Fatal(err)
	}
	if first.Manifest.ID != opts.ID {
		t.Fatalf("snapshot ID %s, want %s", first.Manifest.ID, opts.ID)
	}
	checkpoints := f.rt.Calls(fake.OpCheckpoint)
	count := len(f.eng.Snapshots().List())
	again, err := f.eng.Snapshot(ctx, a.ID, opts) // its name is taken, by itself
	if err != nil {
		t.Fatalf("replay: %v", err)
	}
	if again.Manifest.ID != first.Manifest.ID || f.rt.Calls(fake.OpCheckpoint) != checkpoints || len(f.eng.Snapshots().List()) != count {
		t.Fatalf("replay captured again (%s; %d checkpoints, want %d)", again.Manifest.ID, f.rt.Calls(fake.OpCheckpoint), checkpoints)
	}
	if _, err := f.eng.Snapshot(ctx, b.ID, engine.SnapshotOptions{ID: opts.ID}); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("another sandbox's snapshot under the ID = %v, want already exists", err)
	}
	if _, err := f.eng.Snapshot(ctx, a.ID, engine.SnapshotOptions{ID: "Bad/ID"}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("malformed snapshot ID = %v, want invalid argument", err)
	}
	if m, err := f.eng.Snapshots().Get("named"); err != nil || m.Kind != snapshot.KindSnapshot {
		t.Fatalf("named snapshot: %v", err)
	}
}

func TestForkWithCallerIDsIsIdempotent(t *testing.T) {
	f := newFake(t)
	ctx := fctx(t)
	src, other := f.create(), f.create()
	opts := engine.ForkOptions{Children: []engine.ForkChildSpec{{ID: "child-a", AccessToken: "ta"}, {ID: "child-b", AccessToken: "tb"}}}
	first, err := f.eng.Fork(ctx, src.ID, opts)
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range first.Children {
		if c.Err != nil || c.Sandbox.ID != opts.Children[i].ID || c.Sandbox.Run.AccessToken != opts.Children[i].AccessToken {
			t.Fatalf("child %d: %+v (%v)", i, c.Sandbox.ID, c.Err)
		}
	}
	checkpoints, restores := f.rt.Calls(fake.OpCheckpoint), f.rt.Calls(fake.OpRestore)
	again, err := f.eng.Fork(ctx, src.ID, opts)
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range again.Children {
		if c.Err != nil || c.Sandbox.Instance != first.Children[i].Sandbox.Instance {
			t.Fatalf("replayed child %d: %s (%v), want %s", i, c.Sandbox.Instance, c.Err, first.Children[i].Sandbox.Instance)
		}
	}
	if f.rt.Calls(fake.OpCheckpoint) != checkpoints || f.rt.Calls(fake.OpRestore) != restores {
		t.Fatal("a replay of a finished fork captured or restored again")
	}
	// One child lost: the replay makes only that one.
	if err := f.eng.Kill(ctx, "child-b"); err != nil {
		t.Fatal(err)
	}
	again, err = f.eng.Fork(ctx, src.ID, opts)
	if err != nil {
		t.Fatal(err)
	}
	if again.Children[0].Sandbox.Instance != first.Children[0].Sandbox.Instance || again.Children[1].Err != nil {
		t.Fatalf("partial replay: %+v", again.Children)
	}
	if n := f.rt.Calls(fake.OpRestore); n != restores+1 {
		t.Fatalf("partial replay restored %d children, want 1", n-restores)
	}
	// A child ID that names an unrelated sandbox fails that child only.
	res, err := f.eng.Fork(ctx, src.ID, engine.ForkOptions{Children: []engine.ForkChildSpec{{ID: other.ID}, {ID: "child-c"}}})
	if err != nil {
		t.Fatal(err)
	}
	if !errdefs.IsAlreadyExists(res.Children[0].Err) || res.Children[1].Err != nil {
		t.Fatalf("fork naming an unrelated sandbox: %v, %v", res.Children[0].Err, res.Children[1].Err)
	}
	if _, err := f.eng.Fork(ctx, src.ID, engine.ForkOptions{Children: []engine.ForkChildSpec{{ID: "x"}, {ID: "x"}}}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("fork naming one child twice = %v, want invalid argument", err)
	}
}
