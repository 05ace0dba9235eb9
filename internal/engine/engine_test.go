package engine_test

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/spore-run/spore/internal/engine"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/runtime"
	"github.com/spore-run/spore/internal/snapshot"
)

// The counter process's memory continues through every operation.
func TestMemoryContinues(t *testing.T) {
	e := newEnv(t)
	ctx := ctxFor(t)
	sb := e.create(ctx, e.counter)
	c := e.bump(ctx, sb.ID)
	atSnap := c

	// snapshot -> restore into a new sandbox
	snap, err := e.eng.Snapshot(ctx, sb.ID, engine.SnapshotOptions{Names: []string{"mem-test"}})
	if err != nil {
		t.Fatal(err)
	}
	if snap.Paused <= 0 || snap.Manifest.Origin != sb.ID || snap.Manifest.Kind != snapshot.KindSnapshot {
		t.Fatalf("snapshot result %+v", snap)
	}
	restored := e.create(ctx, "mem-test")
	if restored.ID == sb.ID || restored.Parent != snap.Manifest.ID {
		t.Fatalf("restored sandbox %+v", restored)
	}
	e.wantContinues(ctx, restored.ID, c)
	c = e.wantContinues(ctx, sb.ID, c) // the source kept running

	// fork
	fr, err := e.eng.Fork(ctx, sb.ID, engine.ForkOptions{Count: 2})
	if err != nil {
		t.Fatal(err)
	}
	for _, ch := range fr.Children {
		if ch.Err != nil {
			t.Fatalf("fork child: %v", ch.Err)
		}
		e.wantContinues(ctx, ch.Sandbox.ID, c)
	}
	c = e.wantContinues(ctx, sb.ID, c)

	// pause / resume
	if err := e.eng.Pause(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if got, _ := e.eng.Get(ctx, sb.ID); got.State != engine.StatePaused {
		t.Fatalf("state after pause: %s", got.State)
	}
	if _, err := e.eng.Exec(ctx, sb.ID, runtime.ExecSpec{Args: []string{"true"}}); !errdefs.IsConflict(err) {
		t.Fatalf("exec in a paused sandbox = %v, want conflict", err)
	}
	if err := e.eng.Pause(ctx, sb.ID); !errdefs.IsConflict(err) {
		t.Fatalf("second pause = %v, want conflict", err)
	}
	if err := e.eng.Resume(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	c = e.wantContinues(ctx, sb.ID, c)

	// hibernate / resume: the instance is gone while hibernated.
	before, _ := e.eng.Get(ctx, sb.ID)
	if err := e.eng.Hibernate(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	got, _ := e.eng.Get(ctx, sb.ID)
	if got.State != engine.StateHibernated || got.Instance != "" {
		t.Fatalf("after hibernate: %+v", got)
	}
	if _, err := e.drv.State(ctx, before.Instance); !errdefs.IsNotFound(err) {
		t.Fatalf("hibernated sandbox's instance still exists: %v", err)
	}
	hib := hibernationSnapshots(e)
	if len(hib) != 1 {
		t.Fatalf("hibernation snapshots: %v", hib)
	}
	if err := e.eng.Resume(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	e.wantContinues(ctx, sb.ID, c)
	if hib := hibernationSnapshots(e); len(hib) != 0 {
		t.Fatalf("hibernation snapshot kept after resume: %v", hib)
	}

	// rollback to the first snapshot: the counter is back at its value then.
	rb, err := e.eng.Rollback(ctx, sb.ID, snap.Manifest.ID)
	if err != nil {
		t.Fatal(err)
	}
	if rb.ID != sb.ID || rb.State != engine.StateRunning {
		t.Fatalf("after rollback: %+v", rb)
	}
	e.wantContinues(ctx, sb.ID, atSnap)
}

func hibernationSnapshots(e *env) []string {
	var out []string
	for _, m := range e.eng.Snapshots().List() {
		if m.Kind == snapshot.KindHibernation {
			out = append(out, m.ID)
		}
	}
	return out
}

// Forks see the files written before the fork; what each writes after
// stays its own.
func TestForkIsolation(t *testing.T) {
	e := newEnv(t)
	ctx := ctxFor(t)
	src := e.create(ctx, e.counter)
	e.sh(ctx, src.ID, "echo shared > /root/before && mkdir -p /home/user/work && echo w > /home/user/work/f")
	fr, err := e.eng.Fork(ctx, src.ID, engine.ForkOptions{Count: 3, Concurrency: 2})
	if err != nil {
		t.Fatal(err)
	}
	all := []string{src.ID}
	for _, ch := range fr.Children {
		if ch.Err != nil {
			t.Fatal(ch.Err)
		}
		all = append(all, ch.Sandbox.ID)
	}
	for _, id := range all {
		if got := e.sh(ctx, id, "cat /root/before /home/user/work/f"); got != "shared\nw\n" {
			t.Fatalf("%s: pre-fork files = %q", id, got)
		}
		e.sh(ctx, id, "echo "+id+" > /root/mine && echo "+id+" >> /home/user/work/f")
	}
	for _, id := range all {
		if got := e.sh(ctx, id, "cat /root/mine"); got != id+"\n" {
			t.Fatalf("%s sees %q in /root/mine", id, got)
		}
		if got := e.sh(ctx, id, "cat /home/user/work/f"); got != "w\n"+id+"\n" {
			t.Fatalf("%s sees %q in /home/user/work/f", id, got)
		}
	}
	// A file written only in the first child is absent elsewhere.
	e.sh(ctx, all[1], "echo only > /root/only-in-child")
	for _, id := range []string{all[0], all[2], all[3]} {
		if got := e.sh(ctx, id, "test -e /root/only-in-child && echo present || echo absent"); got != "absent\n" {
			t.Fatalf("%s: child's file is %s", id, got)
		}
	}
}

// Rollback restores files and memory and keeps the ID; a rollback whose
// restore fails leaves the sandbox running unchanged.
func TestRollback(t *testing.T) {
	e := newEnv(t)
	ctx := ctxFor(t)
	sb := e.create(ctx, e.counter)
	e.sh(ctx, sb.ID, "echo good > /root/state")
	c1 := e.bump(ctx, sb.ID)
	snap, err := e.eng.Snapshot(ctx, sb.ID, engine.SnapshotOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The agent breaks things.
	e.sh(ctx, sb.ID, "echo broken > /root/state; rm -rf /usr/bin/python3*; echo junk > /root/junk")
	e.bump(ctx, sb.ID)
	e.bump(ctx, sb.ID)

	// A rollback that fails (its snapshot's image is damaged): nothing changes.
	bad, err := e.eng.Snapshot(ctx, sb.ID, engine.SnapshotOptions{})
	if err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(e.eng.Snapshots().ImageDir(bad.Manifest.ID), "checkpoint.img")
	if err := os.Truncate(img, 100); err != nil {
		t.Fatal(err)
	}
	beforeFail, _ := e.eng.Get(ctx, sb.ID)
	cBefore, _ := e.eng.Snapshots().Get(bad.Manifest.ID)
	if _, err := e.eng.Rollback(ctx, sb.ID, bad.Manifest.ID); err == nil {
		t.Fatal("rollback to a damaged image succeeded")
	}
	afterFail, _ := e.eng.Get(ctx, sb.ID)
	if afterFail.Instance != beforeFail.Instance || afterFail.State != engine.StateRunning || afterFail.Parent != beforeFail.Parent {
		t.Fatalf("failed rollback changed the sandbox: %+v -> %+v", beforeFail, afterFail)
	}
	if got := e.sh(ctx, sb.ID, "cat /root/state; test -e /root/junk && echo junk"); got != "broken\njunk\n" {
		t.Fatalf("after failed rollback files = %q", got)
	}
	c3 := e.bump(ctx, sb.ID)
	if c3.Token != c1.Token || c3.N != c1.N+3 {
		t.Fatalf("after failed rollback counter %+v, want %d", c3, c1.N+3)
	}
	if _, err := e.eng.Snapshots().Get(cBefore.ID); err != nil {
		t.Fatalf("failed rollback lost the snapshot: %v", err)
	}
	insts, _ := e.drv.List(ctx)
	if n := countPrefix(insts, sb.ID); n != 1 {
		t.Fatalf("after failed rollback %d instances of %s", n, sb.ID)
	}

	// The real rollback.
	rb, err := e.eng.Rollback(ctx, sb.ID, snap.Manifest.ID)
	if err != nil {
		t.Fatal(err)
	}
	if rb.ID != sb.ID || rb.Instance == beforeFail.Instance || rb.Parent != snap.Manifest.ID {
		t.Fatalf("after rollback %+v", rb)
	}
	if got := e.sh(ctx, sb.ID, "cat /root/state; test -e /root/junk && echo junk; test -x /usr/bin/python3 && echo python"); got != "good\npython\n" {
		t.Fatalf("after rollback files = %q", got)
	}
	e.wantContinues(ctx, sb.ID, c1)
	e.eng.Settle() // the replaced instance is freed after Rollback answers
	insts, _ = e.drv.List(ctx)
	if n := countPrefix(insts, sb.ID); n != 1 {
		t.Fatalf("after rollback %d instances of %s, want the old one gone", n, sb.ID)
	}
	// Rolled back twice in a row works too (the snapshot is reusable).
	if _, err := e.eng.Rollback(ctx, sb.ID, snap.Manifest.ID); err != nil {
		t.Fatal(err)
	}
	e.wantContinues(ctx, sb.ID, c1)
}

func countPrefix(list []runtime.Info, id string) int {
	n := 0
	for _, i := range list {
		if strings.HasPrefix(i.ID, id+"-") {
			n++
		}
	}
	return n
}

// Snapshots outlive their sandbox and survive an engine restart; a
// restarted engine re-attaches to running and paused sandboxes.
func TestRestartReattaches(t *testing.T) {
	e := newEnv(t)
	ctx := ctxFor(t)
	run := e.create(ctx, e.counter)
	paused := e.create(ctx, e.counter)
	hib := e.create(ctx, e.counter)
	cRun := e.bump(ctx, run.ID)
	cPaused := e.bump(ctx, paused.ID)
	cHib := e.bump(ctx, hib.ID)
	snap, err := e.eng.Snapshot(ctx, run.ID, engine.SnapshotOptions{Names: []string{"keep"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.eng.Pause(ctx, paused.ID); err != nil {
		t.Fatal(err)
	}
	if err := e.eng.Hibernate(ctx, hib.ID); err != nil {
		t.Fatal(err)
	}
	e.reopen()
	for id, want := range map[string]engine.State{run.ID: engine.StateRunning, paused.ID: engine.StatePaused, hib.ID: engine.StateHibernated} {
		got, err := e.eng.Get(ctx, id)
		if err != nil || got.State != want {
			t.Fatalf("after restart %s = %+v, %v; want %s", id, got, err, want)
		}
	}
	cRun = e.wantContinues(ctx, run.ID, cRun)
	if err := e.eng.Resume(ctx, paused.ID); err != nil {
		t.Fatal(err)
	}
	e.wantContinues(ctx, paused.ID, cPaused)
	if err := e.eng.Resume(ctx, hib.ID); err != nil {
		t.Fatal(err)
	}
	e.wantContinues(ctx, hib.ID, cHib)

	// The snapshot outlives its sandbox.
	if err := e.eng.Kill(ctx, run.ID); err != nil {
		t.Fatal(err)
	}
	e.reopen()
	again := e.create(ctx, "keep")
	c := e.bump(ctx, again.ID)
	if c.Token != cRun.Token || c.N != cRun.N {
		t.Fatalf("restored from kept snapshot: %+v, want %s %d", c, cRun.Token, cRun.N)
	}
	if err := e.eng.DeleteSnapshot(ctx, snap.Manifest.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := e.eng.Create(ctx, engine.CreateOptions{Template: "keep"}); !errdefs.IsNotFound(err) {
		t.Fatalf("create from a deleted snapshot = %v, want not found", err)
	}
}

// Kill frees the instance, its directories and its cgroups.
func TestKillFreesEverything(t *testing.T) {
	e := newEnv(t)
	ctx := ctxFor(t)
	sb := e.create(ctx, e.counter)
	if err := e.eng.Hibernate(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if err := e.eng.Resume(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	got, _ := e.eng.Get(ctx, sb.ID)
	cgs, _ := filepath.Glob("/sys/fs/cgroup/*" + e.cgroup + "/" + got.Instance)
	if len(cgs) == 0 {
		t.Fatalf("no cgroup found for a running instance")
	}
	if err := e.eng.Kill(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := e.eng.Get(ctx, sb.ID); !errdefs.IsNotFound(err) {
		t.Fatalf("Get after kill = %v", err)
	}
	if err := e.eng.Kill(ctx, sb.ID); !errdefs.IsNotFound(err) {
		t.Fatalf("second kill = %v", err)
	}
	insts, _ := e.drv.List(ctx)
	if n := countPrefix(insts, sb.ID); n != 0 {
		t.Fatalf("%d instances left", n)
	}
	if m, _ := filepath.Glob(filepath.Join(e.dir, "runtime", "inst", sb.ID+"*")); len(m) != 0 {
		t.Fatalf("instance directories left: %v", m)
	}
	for _, cg := range cgs {
		if _, err := os.Stat(cg); !os.IsNotExist(err) {
			t.Fatalf("cgroup left: %s", cg)
		}
	}
	if hib := hibernationSnapshots(e); len(hib) != 0 {
		t.Fatalf("snapshots left: %v", hib)
	}
}

// Concurrent operations on one sandbox are serialized or refused; the
// sandbox ends consistent and its memory intact.
func TestConcurrentOperations(t *testing.T) {
	e := newEnv(t)
	ctx := ctxFor(t)
	sb := e.create(ctx, e.counter)
	c := e.bump(ctx, sb.ID)
	base, err := e.eng.Snapshot(ctx, sb.ID, engine.SnapshotOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 40)
	for range 4 {
		wg.Add(5)
		go func() { defer wg.Done(); _, err := e.eng.Snapshot(ctx, sb.ID, engine.SnapshotOptions{}); errs <- err }()
		go func() { defer wg.Done(); _, err := e.eng.Rollback(ctx, sb.ID, base.Manifest.ID); errs <- err }()
		go func() { defer wg.Done(); errs <- e.eng.Pause(ctx, sb.ID) }()
		go func() { defer wg.Done(); errs <- e.eng.Resume(ctx, sb.ID) }()
		go func() {
			defer wg.Done()
			_, err := e.eng.Fork(ctx, sb.ID, engine.ForkOptions{Count: 1})
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil && !errdefs.IsConflict(err) {
			t.Errorf("concurrent op: %v (want success or conflict)", err)
		}
	}
	got, _ := e.eng.Get(ctx, sb.ID)
	if got.State == engine.StatePaused {
		if err := e.eng.Resume(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
	}
	// Whatever the order, the sandbox runs the counter from the base
	// snapshot (same token) and has exactly one instance.
	now := e.bump(ctx, sb.ID)
	if now.Token != c.Token {
		t.Fatalf("counter token changed: %+v vs %+v", now, c)
	}
	insts, _ := e.drv.List(ctx)
	if n := countPrefix(insts, sb.ID); n != 1 {
		t.Fatalf("%d instances of %s", n, sb.ID)
	}
}

// Bad input gets a typed error and changes nothing on disk.
func TestBadInput(t *testing.T) {
	e := newEnv(t)
	ctx := ctxFor(t)
	sb := e.create(ctx, e.counter)
	before := tree(t, e.dir)
	bad := []string{"../x", "a/b", "/etc/passwd", "..", "", ".hidden", "x y", "-rf"}
	for _, id := range bad {
		checks := map[string]error{
			"Get":       func() error { _, err := e.eng.Get(ctx, id); return err }(),
			"Snapshot":  func() error { _, err := e.eng.Snapshot(ctx, id, engine.SnapshotOptions{}); return err }(),
			"Fork":      func() error { _, err := e.eng.Fork(ctx, id, engine.ForkOptions{Count: 1}); return err }(),
			"Pause":     e.eng.Pause(ctx, id),
			"Resume":    e.eng.Resume(ctx, id),
			"Hibernate": e.eng.Hibernate(ctx, id),
			"Kill":      e.eng.Kill(ctx, id),
			"Rollback":  func() error { _, err := e.eng.Rollback(ctx, sb.ID, id); return err }(),
			"Create":    func() error { _, err := e.eng.Create(ctx, engine.CreateOptions{Template: id}); return err }(),
			"Delete":    e.eng.DeleteSnapshot(ctx, id),
		}
		for name, err := range checks {
			if !errdefs.IsInvalidArgument(err) {
				t.Errorf("%s(%q) = %v, want invalid argument", name, id, err)
			}
		}
	}
	unknown := "i0000000000000000000"
	for name, err := range map[string]error{
		"Get":               func() error { _, err := e.eng.Get(ctx, unknown); return err }(),
		"Snapshot":          func() error { _, err := e.eng.Snapshot(ctx, unknown, engine.SnapshotOptions{}); return err }(),
		"Fork":              func() error { _, err := e.eng.Fork(ctx, unknown, engine.ForkOptions{Count: 2}); return err }(),
		"Pause":             e.eng.Pause(ctx, unknown),
		"Kill":              e.eng.Kill(ctx, unknown),
		"Rollback":          func() error { _, err := e.eng.Rollback(ctx, unknown, e.counter); return err }(),
		"RollbackToUnknown": func() error { _, err := e.eng.Rollback(ctx, sb.ID, "s0000000000000000000"); return err }(),
		"MissingTemplate": func() error {
			_, err := e.eng.Create(ctx, engine.CreateOptions{Template: "no-such-template"})
			return err
		}(),
		"Exec": func() error {
			_, err := e.eng.Exec(ctx, unknown, runtime.ExecSpec{Args: []string{"true"}})
			return err
		}(),
	} {
		if !errdefs.IsNotFound(err) {
			t.Errorf("%s(unknown) = %v, want not found", name, err)
		}
	}
	for _, n := range []int{0, -1, 101, 1000} {
		if _, err := e.eng.Fork(ctx, sb.ID, engine.ForkOptions{Count: n}); !errdefs.IsInvalidArgument(err) {
			t.Errorf("Fork(n=%d) = %v, want invalid argument", n, err)
		}
	}
	if _, err := e.eng.Fork(ctx, sb.ID, engine.ForkOptions{Count: 2, Concurrency: -1}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("Fork(concurrency=-1) = %v", err)
	}
	if _, err := e.eng.Snapshot(ctx, sb.ID, engine.SnapshotOptions{Names: []string{"../../etc"}}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("Snapshot(name=../../etc) = %v", err)
	}
	if _, err := e.eng.Snapshot(ctx, sb.ID, engine.SnapshotOptions{Names: []string{"counter"}}); !errdefs.IsAlreadyExists(err) {
		t.Errorf("Snapshot(name taken) = %v, want already exists", err)
	}
	if _, err := e.eng.BuildTemplate(ctx, engine.TemplateSpec{Name: "../t", Run: snapshot.RunConfig{Args: []string{"sleep", "1"}}}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("BuildTemplate(../t) = %v", err)
	}
	if _, err := e.eng.BuildTemplate(ctx, engine.TemplateSpec{Name: "t", RootFS: "nope", Run: snapshot.RunConfig{Args: []string{"sleep", "1"}}}); !errdefs.IsNotFound(err) {
		t.Errorf("BuildTemplate(rootfs nope) = %v, want not found", err)
	}
	if err := e.eng.Resume(ctx, sb.ID); !errdefs.IsConflict(err) {
		t.Errorf("Resume(running) = %v, want conflict", err)
	}
	if after := tree(t, e.dir); after != before {
		t.Fatalf("bad input changed the data directory:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if got, _ := e.eng.Get(ctx, sb.ID); got.State != engine.StateRunning {
		t.Fatalf("sandbox state %s after bad input", got.State)
	}
}

// A template over a rebuilt root filesystem is stale: creating from it is
// refused with a clear conflict, and EnsureTemplate rebuilds it.
func TestStaleTemplateRebuilt(t *testing.T) {
	e := newEnv(t)
	ctx := ctxFor(t)
	spec := engine.TemplateSpec{Name: "stale", Run: snapshot.RunConfig{Args: []string{"/usr/bin/sleep", "infinity"}}}
	m1, built, err := e.eng.EnsureTemplate(ctx, spec)
	if err != nil || !built {
		t.Fatalf("first EnsureTemplate = %v, built %v", err, built)
	}
	if m, built, err := e.eng.EnsureTemplate(ctx, spec); err != nil || built || m.ID != m1.ID {
		t.Fatalf("second EnsureTemplate rebuilt: %v %v", built, err)
	}
	// Pretend the root filesystem was rebuilt: a copy of the test rootfs
	// stamps with a new identity.
	m1.RootFSID = "rsomeotherbuild00000"
	path := filepath.Join(e.eng.Snapshots().Dir(), m1.ID, "manifest.json")
	b, _ := os.ReadFile(path)
	var raw map[string]any
	json.Unmarshal(b, &raw)
	raw["rootfs_id"] = m1.RootFSID
	b, _ = json.Marshal(raw)
	os.WriteFile(path, b, 0o600)
	e.reopen()
	if _, err := e.eng.Create(ctx, engine.CreateOptions{Template: "stale"}); !errdefs.IsConflict(err) || !strings.Contains(err.Error(), "rebuild the template") {
		t.Fatalf("create from a stale template = %v, want a conflict naming the rebuild", err)
	}
	m2, built, err := e.eng.EnsureTemplate(ctx, spec)
	if err != nil || !built || m2.ID == m1.ID {
		t.Fatalf("EnsureTemplate over a stale template = %+v, %v, %v", m2, built, err)
	}
	if _, err := e.eng.Snapshots().Get(m1.ID); !errdefs.IsNotFound(err) {
		t.Fatalf("stale template kept: %v", err)
	}
	sb := e.create(ctx, "stale")
	e.sh(ctx, sb.ID, "true")
}

// TestMemoryAdmission: when the host's available memory is below the
// reserve, new instances are refused with a resource-limit error and
// nothing changes; running sandboxes are untouched and work resumes once
// memory is back.
func TestMemoryAdmission(t *testing.T) {
	e := newEnv(t)
	ctx := ctxFor(t)
	sb := e.create(ctx, e.counter)
	c := e.bump(ctx, sb.ID)
	snap, err := e.eng.Snapshot(ctx, sb.ID, engine.SnapshotOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Reopen with a host that has 100 MiB available (reserve 1 GiB).
	e.avail = new(atomic.Int64)
	e.avail.Store(100 << 20)
	e.reopen()
	before := tree(t, e.dir)
	if _, err := e.eng.Create(ctx, engine.CreateOptions{Template: e.counter}); !errors.Is(err, errdefs.ErrResourceLimit) {
		t.Fatalf("create on a full host = %v, want resource limit", err)
	}
	if _, err := e.eng.Rollback(ctx, sb.ID, snap.Manifest.ID); !errors.Is(err, errdefs.ErrResourceLimit) {
		t.Fatalf("rollback on a full host = %v, want resource limit", err)
	}
	fr, err := e.eng.Fork(ctx, sb.ID, engine.ForkOptions{Count: 2})
	if err == nil {
		for _, ch := range fr.Children {
			if !errors.Is(ch.Err, errdefs.ErrResourceLimit) {
				t.Fatalf("fork child on a full host = %+v, want resource limit", ch)
			}
		}
	} else if !errors.Is(err, errdefs.ErrResourceLimit) {
		t.Fatalf("fork on a full host = %v", err)
	}
	// The refused fork took and dropped its image; everything else is as it was.
	if after := tree(t, e.dir); after != before {
		t.Fatalf("refused operations changed the data directory:\nbefore %s\nafter  %s", before, after)
	}
	if got := len(e.eng.List(ctx)); got != 1 {
		t.Fatalf("%d sandboxes after refusals, want 1", got)
	}
	e.wantContinues(ctx, sb.ID, c)
	e.avail.Store(8 << 30)
	nb, err := e.eng.Create(ctx, engine.CreateOptions{Template: e.counter})
	if err != nil {
		t.Fatalf("create once memory is back: %v", err)
	}
	if err := e.eng.Kill(ctx, nb.ID); err != nil {
		t.Fatal(err)
	}
}

func TestSandboxOf(t *testing.T) {
	for in, want := range map[string]string{"iabc-1": "iabc", "iabc-12": "iabc", "iabc": "iabc", "iabc-": "iabc-", "b-x": "b-x"} {
		if got := engine.SandboxOf(in); got != want {
			t.Errorf("SandboxOf(%q) = %q, want %q", in, got, want)
		}
	}
}
