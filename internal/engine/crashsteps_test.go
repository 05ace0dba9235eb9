package engine_test

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/spore-run/spore/internal/control/controltest"
	"github.com/spore-run/spore/internal/engine"
	"github.com/spore-run/spore/internal/runtime/fake"
)

// Fast tier: every operation, interrupted before each of its runtime calls
// in turn, by a crash (the data directory and the runtime's instances
// copied at that moment, then a new engine opened on the copy) or by a
// failure of that call, leaves records that agree with the runtime.

type stepScenario struct {
	name  string
	setup func(f *fenv, id string) // after the common setup
	op    func(f *fenv, id string) error
}

var stepScenarios = []stepScenario{
	{name: "create", op: func(f *fenv, _ string) error {
		_, err := f.eng.Create(fctx(f.t), engine.CreateOptions{Template: "tpl"})
		return err
	}},
	{name: "snapshot", op: func(f *fenv, id string) error {
		return second(f.eng.Snapshot(fctx(f.t), id, engine.SnapshotOptions{Names: []string{"two"}}))
	}},
	{name: "fork", op: func(f *fenv, id string) error {
		return second(f.eng.Fork(fctx(f.t), id, engine.ForkOptions{Count: 2, Concurrency: 1}))
	}},
	{name: "rollback", op: func(f *fenv, id string) error {
		return second(f.eng.Rollback(fctx(f.t), id, "one"))
	}},
	{name: "pause", op: func(f *fenv, id string) error { return f.eng.Pause(fctx(f.t), id) }},
	{name: "resume", setup: func(f *fenv, id string) {
		if err := f.eng.Pause(fctx(f.t), id); err != nil {
			f.t.Fatal(err)
		}
	}, op: func(f *fenv, id string) error { return f.eng.Resume(fctx(f.t), id) }},
	{name: "hibernate", op: func(f *fenv, id string) error { return f.eng.Hibernate(fctx(f.t), id) }},
	{name: "wake", setup: func(f *fenv, id string) {
		if err := f.eng.Hibernate(fctx(f.t), id); err != nil {
			f.t.Fatal(err)
		}
	}, op: func(f *fenv, id string) error { return f.eng.Resume(fctx(f.t), id) }},
	{name: "kill", op: func(f *fenv, id string) error { return f.eng.Kill(fctx(f.t), id) }},
}

// prepare makes the common starting point: a sandbox with x=2 and a
// snapshot "one" taken when x was 1.
func prepare(t *testing.T, s stepScenario, v variant) (*fenv, string) {
	f := newFakeWith(t, v.env())
	sb := f.create()
	f.set(sb.ID, "x", "1")
	if _, err := f.eng.Snapshot(fctx(t), sb.ID, engine.SnapshotOptions{Names: []string{"one"}}); err != nil {
		t.Fatal(err)
	}
	f.set(sb.ID, "x", "2")
	if s.setup != nil {
		s.setup(f, sb.ID)
	}
	return f, sb.ID
}

// atStep runs s's operation with fn called before its k-th runtime call
// (exec excluded); it reports whether the operation made k calls.
func atStep(t *testing.T, f *fenv, s stepScenario, id string, k int, fn func() error) bool {
	var mu sync.Mutex
	n, hit := 0, false
	f.eng.Settle() // restore targets made before the operation
	f.rt.Hook(func(op fake.Op, _ string) error {
		// Restore targets are made in the background after an
		// operation: their calls are not its steps.
		if op == fake.OpExec || op == fake.OpPrecreate {
			return nil
		}
		mu.Lock()
		n++
		now := n == k
		if now {
			hit = true
		}
		mu.Unlock()
		if now {
			return fn()
		}
		return nil
	})
	err := s.op(f, id)
	f.eng.Settle()
	f.rt.Hook(nil)
	t.Logf("step %d: operation returned %v", k, err)
	mu.Lock()
	defer mu.Unlock()
	return hit
}

// variant is what a scenario's engine keeps ahead of its restores.
type variant struct {
	targets int // restore targets per shape
	nets    int // reserved networks (with a fake network)
}

func (v variant) env() *fenv {
	f := &fenv{targets: v.targets, nets: v.nets}
	if v.nets > 0 {
		f.net = controltest.NewNetwork()
	}
	return f
}

// withTargets runs a scenario test without restore targets, with one per
// shape (restores then load into pre-created instances), and with
// reserved networks instead (restores then claim networks made ahead).
func withTargets(t *testing.T, name string, fn func(t *testing.T, v variant)) {
	for _, v := range []variant{{}, {targets: 1}, {nets: 2}} {
		t.Run(fmt.Sprintf("%s/targets=%d,nets=%d", name, v.targets, v.nets), func(t *testing.T) { fn(t, v) })
	}
}

func TestFakeCrashAtEachStep(t *testing.T) {
	for _, s := range stepScenarios {
		withTargets(t, s.name, func(t *testing.T, v variant) {
			steps := 0
			for k := 1; ; k++ {
				f, id := prepare(t, s, v)
				var crashDir string
				var crashRT *fake.Runtime
				var crashNet engine.Network
				hit := atStep(t, f, s, id, k, func() error {
					crashDir = t.TempDir()
					copyTree(t, f.dir, crashDir)
					crashRT = f.rt.Clone()
					if fn, ok := f.net.(*controltest.Network); ok {
						crashNet = fn.Clone()
					}
					return nil
				})
				if !hit {
					break
				}
				steps++
				f.close()
				g := &fenv{t: t, dir: crashDir, rt: crashRT, logs: f.logs, logMu: f.logMu, retry: f.retry, targets: v.targets, net: crashNet, nets: v.nets}
				g.open()
				checkRecovered(t, g, id)
				g.close()
			}
			if steps == 0 {
				t.Fatal("the operation made no runtime call")
			}
			t.Logf("%s: crashed before each of %d runtime calls", s.name, steps)
		})
	}
}

func TestFakeFailAtEachStep(t *testing.T) {
	for _, s := range stepScenarios {
		withTargets(t, s.name, func(t *testing.T, v variant) {
			steps := 0
			for k := 1; ; k++ {
				f, id := prepare(t, s, v)
				hit := atStep(t, f, s, id, k, func() error { return errors.New("injected failure") })
				if !hit {
					break
				}
				steps++
				checkAgree(t, f)
				f.reopen()
				checkRecovered(t, f, id)
			}
			if steps == 0 {
				t.Fatal("the operation made no runtime call")
			}
			t.Logf("%s: failed each of %d runtime calls", s.name, steps)
		})
	}
}

// checkRecovered: after an Open, the engine and runtime agree, scratch
// space is empty, and the sandbox, if it is still running, holds x as it
// was or as the snapshot had it.
func checkRecovered(t *testing.T, f *fenv, id string) {
	t.Helper()
	checkAgree(t, f)
	for _, d := range []string{filepath.Join(f.dir, "engine", "tmp"), filepath.Join(f.dir, "snapshots", ".staging")} {
		ents, err := os.ReadDir(d)
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		if len(ents) > 0 {
			t.Fatalf("%s not emptied: %v", d, ents)
		}
	}
	if sb, err := f.eng.Get(fctx(t), id); err == nil && sb.State == engine.StateRunning {
		if x := f.get(id, "x"); x != "1" && x != "2" {
			t.Fatalf("x = %q after recovery", x)
		}
	}
}

// copyTree copies a directory as a crash would leave it on disk.
func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.Walk(src, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			if os.IsNotExist(err) {
				return nil // removed while we walk
			}
			return err
		}
		rel, _ := filepath.Rel(src, p)
		to := filepath.Join(dst, rel)
		if info.IsDir() {
			return os.MkdirAll(to, info.Mode().Perm()|0o700)
		}
		if !info.Mode().IsRegular() {
			return nil
		}
		in, err := os.Open(p)
		if err != nil {
			if os.IsNotExist(err) {
				return nil
			}
			return err
		}
		defer in.Close()
		out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, info.Mode().Perm())
		if err != nil {
			return err
		}
		if _, err := io.Copy(out, in); err != nil {
			out.Close()
			return err
		}
		return out.Close()
	})
	if err != nil {
		t.Fatalf("copy %s: %v", src, err)
	}
}
