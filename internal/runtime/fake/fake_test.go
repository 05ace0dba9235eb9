package fake_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/runtime"
	"github.com/spore-run/spore/internal/runtime/fake"
	"github.com/spore-run/spore/internal/runtime/runtimetest"
)

// The fake passes the contract part of the conformance suite, like every
// runtime; the guest part needs a real sandbox.
func TestContract(t *testing.T) {
	runtimetest.RunContract(t, fake.New(), t.TempDir())
}

func start(t *testing.T, rt *fake.Runtime, id string) {
	t.Helper()
	if err := rt.Start(context.Background(), runtime.Spec{ID: id, RootFS: t.TempDir(), Args: []string{"init"}}); err != nil {
		t.Fatal(err)
	}
}

func run(t *testing.T, rt *fake.Runtime, id string, args ...string) (string, int) {
	t.Helper()
	var out bytes.Buffer
	code, err := rt.Exec(context.Background(), id, runtime.ExecSpec{Args: args, Stdout: &out})
	if err != nil {
		t.Fatalf("exec %v: %v", args, err)
	}
	return out.String(), code
}

// Memory survives a checkpoint into a restore; the two diverge afterwards.
func TestCheckpointCarriesMemory(t *testing.T) {
	ctx := context.Background()
	rt := fake.New()
	root := t.TempDir()
	if err := rt.Start(ctx, runtime.Spec{ID: "a", RootFS: root, Args: []string{"init"}}); err != nil {
		t.Fatal(err)
	}
	run(t, rt, "a", "set", "x", "1")
	img := t.TempDir()
	if err := rt.Checkpoint(ctx, "a", img, runtime.CheckpointOptions{LeaveRunning: true}); err != nil {
		t.Fatal(err)
	}
	run(t, rt, "a", "set", "x", "2")
	if err := rt.Restore(ctx, runtime.Spec{ID: "b", RootFS: root, Args: []string{"init"}}, img); err != nil {
		t.Fatal(err)
	}
	if out, _ := run(t, rt, "b", "get", "x"); out != "1\n" {
		t.Fatalf("restored x = %q, want 1", out)
	}
	if out, _ := run(t, rt, "a", "get", "x"); out != "2\n" {
		t.Fatalf("source x = %q, want 2", out)
	}
	if _, code := run(t, rt, "a", "no-such-command"); code != 127 {
		t.Fatalf("unknown command exited %d, want 127", code)
	}
}

func TestFaults(t *testing.T) {
	ctx := context.Background()
	rt := fake.New()
	start(t, rt, "a")
	boom := errors.New("boom")
	rt.Fail(fake.OpKill, "a", 1, boom)
	if err := rt.Kill(ctx, "a"); !errors.Is(err, boom) {
		t.Fatalf("first Kill = %v, want the injected error", err)
	}
	if _, err := rt.State(ctx, "a"); err != nil {
		t.Fatalf("a failed Kill changed nothing, but State = %v", err)
	}
	if err := rt.Kill(ctx, "a"); err != nil {
		t.Fatalf("second Kill = %v", err)
	}
	if got := rt.Calls(fake.OpKill); got != 2 {
		t.Fatalf("Calls(kill) = %d, want 2", got)
	}

	// Die: Wait returns, the instance is stopped, Recover frees it.
	start(t, rt, "b")
	waited := make(chan runtime.Exit, 1)
	go func() {
		ex, err := rt.Wait(ctx, "b")
		if err != nil {
			t.Errorf("Wait: %v", err)
		}
		waited <- ex
	}()
	if err := rt.Die("b", runtime.ExitOOM, "test"); err != nil {
		t.Fatal(err)
	}
	select {
	case ex := <-waited:
		if ex.Reason != runtime.ExitOOM || ex.ID != "b" {
			t.Fatalf("Wait = %+v", ex)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Wait did not return after Die")
	}
	if info, err := rt.State(ctx, "b"); err != nil || info.State != runtime.StateStopped {
		t.Fatalf("State after Die = %+v, %v", info, err)
	}
	if _, err := rt.Recover(ctx, "b"); !errdefs.IsNotFound(err) {
		t.Fatalf("Recover after Die = %v, want not found", err)
	}
	if got := rt.Instances(); len(got) != 0 {
		t.Fatalf("instances left: %v", got)
	}
}
