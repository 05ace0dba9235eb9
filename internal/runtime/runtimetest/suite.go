// Package runtimetest is the conformance suite every runtime.Runtime
// implementation must pass. It has two parts:
//
//   - RunContract checks the contract itself (states, IDs, error kinds,
//     checkpoint and restore bookkeeping) and runs nothing inside a guest:
//     every runtime passes it, the in-memory fake (internal/runtime/fake)
//     included.
//   - Run adds the guest checks (memory and files surviving a checkpoint,
//     exec options, limits, mounts): it runs real sandboxes, and the root
//     filesystem it is given must hold python3, sh, cat, kill, id and dd
//     (the `base` root filesystem that `make setup` builds does).
package runtimetest

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/runtime"
)

// Run runs the whole suite (contract and guest checks) against rt.
func Run(t *testing.T, rt runtime.Runtime, rootfs string) {
	t.Run("Contract", func(t *testing.T) { RunContract(t, rt, rootfs) })
	s := &suite{rt: rt, rootfs: rootfs}
	t.Run("StartExecKill", s.testStartExecKill)
	t.Run("ExecUserEnvCwdStdin", s.testExecOptions)
	t.Run("PauseResume", s.testPauseResume)
	t.Run("CheckpointRestore", s.testCheckpointRestore)
	t.Run("RestoreIntoPrecreated", s.testRestoreIntoPrecreated)
	t.Run("CheckpointStop", s.testCheckpointStop)
	t.Run("ListAndRecover", s.testListRecover)
	t.Run("Limits", s.testLimits)
	t.Run("Mounts", s.testMounts)
}

type suite struct {
	rt     runtime.Runtime
	rootfs string
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// start boots a counter instance and registers its cleanup.
func (s *suite) start(t *testing.T, ctx context.Context, lim runtime.Limits) string {
	t.Helper()
	spec := s.spec(ids.New('t'), lim)
	if err := s.rt.Start(ctx, spec); err != nil {
		t.Fatalf("Start: %v", err)
	}
	s.cleanup(t, spec.ID)
	return spec.ID
}

func (s *suite) spec(id string, lim runtime.Limits) runtime.Spec {
	return runtime.Spec{ID: id, RootFS: s.rootfs, Args: CounterArgs, Limits: lim}
}

func (s *suite) cleanup(t *testing.T, id string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := s.rt.Kill(ctx, id); err != nil && !errdefs.IsNotFound(err) {
			t.Errorf("cleanup: kill %s: %v", id, err)
		}
	})
}

func (s *suite) execer(id string) Execer {
	return func(ctx context.Context, args ...string) (string, int, error) {
		var out bytes.Buffer
		code, err := s.rt.Exec(ctx, id, runtime.ExecSpec{Args: args, Stdout: &out})
		return out.String(), code, err
	}
}

func (s *suite) sh(t *testing.T, ctx context.Context, id, script string) (string, int) {
	t.Helper()
	var out bytes.Buffer
	code, err := s.rt.Exec(ctx, id, runtime.ExecSpec{Args: []string{"/bin/sh", "-c", script}, Stdout: &out, Stderr: &out})
	if err != nil {
		t.Fatalf("exec %q in %s: %v", script, id, err)
	}
	return out.String(), code
}

func (s *suite) wantState(t *testing.T, ctx context.Context, id string, want runtime.State) {
	t.Helper()
	info, err := s.rt.State(ctx, id)
	if err != nil {
		t.Fatalf("State(%s): %v", id, err)
	}
	if info.State != want || info.ID != id {
		t.Fatalf("State(%s) = %+v, want %s", id, info, want)
	}
}

func (s *suite) testStartExecKill(t *testing.T) {
	ctx := ctxFor(t)
	id := s.start(t, ctx, runtime.Limits{})
	s.wantState(t, ctx, id, runtime.StateRunning)
	if _, err := ReadCounter(ctx, s.execer(id)); err != nil {
		t.Fatal(err)
	}
	if out, code := s.sh(t, ctx, id, "echo out; echo err >&2; exit 7"); code != 7 || out != "out\nerr\n" {
		t.Fatalf("exec = %q, %d; want out+err, 7", out, code)
	}
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
}

func (s *suite) testExecOptions(t *testing.T) {
	ctx := ctxFor(t)
	id := s.start(t, ctx, runtime.Limits{})
	var out bytes.Buffer
	code, err := s.rt.Exec(ctx, id, runtime.ExecSpec{
		Args:   []string{"/bin/sh", "-c", `echo "$(id -u):$(id -g) $PWD $GREETING"; cat`},
		Env:    []string{"GREETING=hello"},
		Cwd:    "/tmp",
		User:   runtime.User{UID: 1000, GID: 1000},
		Stdin:  strings.NewReader("from stdin\n"),
		Stdout: &out,
	})
	if err != nil || code != 0 {
		t.Fatalf("exec = %d, %v", code, err)
	}
	if want := "1000:1000 /tmp hello\nfrom stdin\n"; out.String() != want {
		t.Fatalf("exec output %q, want %q", out.String(), want)
	}
}

func (s *suite) testPauseResume(t *testing.T) {
	ctx := ctxFor(t)
	id := s.start(t, ctx, runtime.Limits{})
	ex := s.execer(id)
	before, err := Bump(ctx, ex)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.rt.Pause(ctx, id); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	s.wantState(t, ctx, id, runtime.StatePaused)
	if err := s.rt.Resume(ctx, id); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	s.wantState(t, ctx, id, runtime.StateRunning)
	after, err := Bump(ctx, ex)
	if err != nil {
		t.Fatal(err)
	}
	if after.Token != before.Token || after.N != before.N+1 {
		t.Fatalf("counter after pause/resume = %+v, want %s %d", after, before.Token, before.N+1)
	}
}

// checkpointed starts a counter instance with lim, writes "before" to
// /root/f, bumps the counter and checkpoints it (left running) into img.
func (s *suite) checkpointed(t *testing.T, ctx context.Context, lim runtime.Limits) (src string, c0 Counter, img string) {
	t.Helper()
	src = s.start(t, ctx, lim)
	if out, code := s.sh(t, ctx, src, "echo before > /root/f"); code != 0 {
		t.Fatalf("write: %s", out)
	}
	c0, err := Bump(ctx, s.execer(src))
	if err != nil {
		t.Fatal(err)
	}
	img = t.TempDir()
	if err := s.rt.Checkpoint(ctx, src, img, runtime.CheckpointOptions{LeaveRunning: true}); err != nil {
		t.Fatalf("Checkpoint: %v", err)
	}
	s.wantState(t, ctx, src, runtime.StateRunning)
	return src, c0, img
}

func (s *suite) testCheckpointRestore(t *testing.T) {
	ctx := ctxFor(t)
	src, c0, img := s.checkpointed(t, ctx, runtime.Limits{DiskMB: 256})

	// Two restores of one image: each continues the source's memory and
	// files, and neither sees the other's (or the source's) later writes.
	var clones []string
	for range 2 {
		spec := s.spec(ids.New('t'), runtime.Limits{DiskMB: 256})
		if err := s.rt.Restore(ctx, spec, img); err != nil {
			t.Fatalf("Restore: %v", err)
		}
		s.cleanup(t, spec.ID)
		clones = append(clones, spec.ID)
	}
	for _, id := range append([]string{src}, clones...) {
		c, err := Bump(ctx, s.execer(id))
		if err != nil {
			t.Fatal(err)
		}
		if c.Token != c0.Token || c.N != c0.N+1 {
			t.Fatalf("%s: counter %+v, want %s %d", id, c, c0.Token, c0.N+1)
		}
		if out, _ := s.sh(t, ctx, id, "cat /root/f; echo mine-"+id+" > /root/own"); out != "before\n" {
			t.Fatalf("%s: /root/f = %q", id, out)
		}
	}
	for _, id := range append([]string{src}, clones...) {
		out, _ := s.sh(t, ctx, id, "cat /root/own")
		if out != "mine-"+id+"\n" {
			t.Fatalf("%s sees %q in /root/own, want its own write", id, out)
		}
	}
	if err := s.rt.Restore(ctx, s.spec(clones[0], runtime.Limits{}), img); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("Restore into a taken ID = %v, want already exists", err)
	}
	if err := s.rt.Restore(ctx, s.spec(ids.New('t'), runtime.Limits{}), t.TempDir()); !errdefs.IsNotFound(err) {
		t.Fatalf("Restore from an empty dir = %v, want not found", err)
	}
}

// testRestoreIntoPrecreated: an image loaded into a pre-created instance
// (runtime.Precreator) continues the source's memory and files, with the
// limits the instance was created with, like a plain restore.
func (s *suite) testRestoreIntoPrecreated(t *testing.T) {
	pc, ok := s.rt.(runtime.Precreator)
	if !ok {
		return // see testPrecreateIDs
	}
	ctx := ctxFor(t)
	lim := runtime.Limits{MemoryMB: 384, DiskMB: 256}
	src, c0, img := s.checkpointed(t, ctx, lim)
	spec := s.spec(ids.New('t'), lim)
	if err := pc.Precreate(ctx, spec); err != nil {
		t.Fatalf("Precreate: %v", err)
	}
	s.cleanup(t, spec.ID)
	if err := s.rt.Restore(ctx, spec, img); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	c, err := Bump(ctx, s.execer(spec.ID))
	if err != nil {
		t.Fatal(err)
	}
	if c.Token != c0.Token || c.N != c0.N+1 {
		t.Fatalf("counter %+v after the restore, want %s %d", c, c0.Token, c0.N+1)
	}
	if out, _ := s.sh(t, ctx, spec.ID, "cat /root/f; echo mine > /root/f"); out != "before\n" {
		t.Fatalf("/root/f = %q", out)
	}
	if out, _ := s.sh(t, ctx, src, "cat /root/f"); out != "before\n" {
		t.Fatalf("the source sees the restored instance's write: %q", out)
	}
}

func (s *suite) testCheckpointStop(t *testing.T) {
	ctx := ctxFor(t)
	id := s.start(t, ctx, runtime.Limits{})
	c0, err := Bump(ctx, s.execer(id))
	if err != nil {
		t.Fatal(err)
	}
	img := t.TempDir()
	if err := s.rt.Checkpoint(ctx, id, img, runtime.CheckpointOptions{}); err != nil {
		t.Fatalf("Checkpoint: %v", err)
	}
	if _, err := s.rt.State(ctx, id); !errdefs.IsNotFound(err) {
		t.Fatalf("State after stopping checkpoint = %v, want not found", err)
	}
	// The ID is free again: restore the instance under its old name.
	if err := s.rt.Restore(ctx, s.spec(id, runtime.Limits{}), img); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	c, err := Bump(ctx, s.execer(id))
	if err != nil {
		t.Fatal(err)
	}
	if c.Token != c0.Token || c.N != c0.N+1 {
		t.Fatalf("counter %+v, want %s %d", c, c0.Token, c0.N+1)
	}
}

func (s *suite) testListRecover(t *testing.T) {
	ctx := ctxFor(t)
	a := s.start(t, ctx, runtime.Limits{})
	b := s.start(t, ctx, runtime.Limits{})
	list, err := s.rt.List(ctx)
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	var got []string
	for _, i := range list {
		got = append(got, i.ID)
	}
	if !slices.Contains(got, a) || !slices.Contains(got, b) {
		t.Fatalf("List = %v, want %s and %s", got, a, b)
	}
	info, err := s.rt.Recover(ctx, a)
	if err != nil || info.State != runtime.StateRunning || info.PID <= 0 {
		t.Fatalf("Recover(%s) = %+v, %v", a, info, err)
	}
	if _, err := s.rt.Recover(ctx, ids.New('t')); !errdefs.IsNotFound(err) {
		t.Fatalf("Recover(unknown) = %v, want not found", err)
	}
	// An instance whose init exited is freed by Recover.
	if _, code := s.sh(t, ctx, b, "kill -9 1"); code != 0 && code != 137 {
		t.Logf("kill -9 1 exited %d", code)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := s.rt.Recover(ctx, b)
		if errdefs.IsNotFound(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Recover after init died = %v, want not found", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (s *suite) testLimits(t *testing.T) {
	ctx := ctxFor(t)
	caps := s.rt.Capabilities()
	id := s.start(t, ctx, runtime.Limits{VCPUs: 1, MemoryMB: 512, MaxProcs: 40, DiskMB: 32})
	// Processes: forking past 40 processes fails with EAGAIN inside the
	// sandbox, and the sandbox survives the attempt.
	out, code := s.sh(t, ctx, id, "python3 -c '"+forkScript+"'")
	if code != 0 || !strings.HasPrefix(out, "forked ") || !strings.Contains(out, "errno 11") {
		t.Fatalf("fork past the limit: exit %d, %q; want EAGAIN", code, out)
	}
	if n := atoi(strings.Fields(out)[1]); n < 20 || n >= 40 {
		t.Fatalf("forked %d children under a 40-process limit", n)
	}
	if caps.DiskLimit {
		out, code := s.sh(t, ctx, id, "dd if=/dev/urandom of=/root/big bs=1M count=64 2>&1")
		if code == 0 || !strings.Contains(out, "No space left on device") {
			t.Fatalf("writing 64 MB past a 32 MB disk = %d %q, want ENOSPC", code, out)
		}
	}
	s.wantState(t, ctx, id, runtime.StateRunning)
}

// forkScript forks sleeping children until fork fails, reports how many it
// got and the error, then kills them.
const forkScript = `
import os, signal, time
kids = []
err = None
for i in range(100):
    try:
        pid = os.fork()
    except OSError as e:
        err = e
        break
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    kids.append(pid)
print("forked", len(kids), "errno", err.errno if err else None)
for k in kids:
    os.kill(k, signal.SIGKILL)
    os.waitpid(k, 0)
`

func (s *suite) testMounts(t *testing.T) {
	ctx := ctxFor(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "hello"), []byte("from host\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	spec := s.spec(ids.New('t'), runtime.Limits{})
	spec.Mounts = []runtime.Mount{{Source: dir, Destination: "/opt/host", ReadOnly: true}}
	if err := s.rt.Start(ctx, spec); err != nil {
		t.Fatalf("Start with a mount: %v", err)
	}
	s.cleanup(t, spec.ID)
	if out, code := s.sh(t, ctx, spec.ID, "cat /opt/host/hello"); code != 0 || out != "from host\n" {
		t.Fatalf("read through the mount: %d %q", code, out)
	}
	if _, code := s.sh(t, ctx, spec.ID, "echo x > /opt/host/new"); code == 0 {
		t.Fatal("wrote through a read-only mount")
	}
	if _, err := os.Stat(filepath.Join(dir, "new")); !os.IsNotExist(err) {
		t.Fatal("a file appeared on the host")
	}
	// A checkpoint restores with the same mount.
	img := t.TempDir()
	if err := s.rt.Checkpoint(ctx, spec.ID, img, runtime.CheckpointOptions{LeaveRunning: true}); err != nil {
		t.Fatal(err)
	}
	clone := spec
	clone.ID = ids.New('t')
	if err := s.rt.Restore(ctx, clone, img); err != nil {
		t.Fatalf("Restore with the mount: %v", err)
	}
	s.cleanup(t, clone.ID)
	if out, _ := s.sh(t, ctx, clone.ID, "cat /opt/host/hello"); out != "from host\n" {
		t.Fatalf("clone reads %q", out)
	}
	bad := s.spec(ids.New('t'), runtime.Limits{})
	bad.Mounts = []runtime.Mount{{Source: "relative", Destination: "/x"}}
	if err := s.rt.Start(ctx, bad); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("relative mount source = %v", err)
	}
	bad.Mounts = []runtime.Mount{{Source: filepath.Join(dir, "missing"), Destination: "/x"}}
	if err := s.rt.Start(ctx, bad); !errdefs.IsNotFound(err) {
		t.Fatalf("missing mount source = %v", err)
	}
}

func atoi(s string) int {
	n := 0
	for _, c := range strings.TrimSpace(s) {
		if c < '0' || c > '9' {
			return 1 << 30
		}
		n = n*10 + int(c-'0')
	}
	return n
}
