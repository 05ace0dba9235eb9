package node_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/engine"
	"github.com/spore-run/spore/internal/node"
	"github.com/spore-run/spore/internal/runtime"
)

// TestMemoryHogKillsOnlyTheHog: in a default sandbox, a process that
// allocates far more than the sandbox's memory is killed (exit 137 from
// its shell, or MemoryError), while a bystander holding memory, envd and
// the sandbox live on, as Linux's OOM killer does in a VM.
func TestMemoryHogKillsOnlyTheHog(t *testing.T) {
	e := newEnv(t)
	ctx := ctxFor(t)
	sb := e.create(ctx, engine.CreateOptions{Template: node.TemplateBase})
	c := e.client(sb)
	pid := strings.TrimSpace(c.sh(ctx, `nohup python3 -c "
import time
x = bytearray(100 << 20)
open('/tmp/held', 'w').close()
time.sleep(10**6)" >/dev/null 2>&1 & echo $!`))
	// The bystander holds its 100 MiB before the hog starts: waited for,
	// not a fixed second (on a loaded host python3 may not have allocated
	// by then, and its allocation would race the hog's).
	for deadline := time.Now().Add(30 * time.Second); c.sh(ctx, "test -f /tmp/held && echo held || true") != "held\n"; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the bystander did not hold its memory within 30 s")
		}
	}
	start := time.Now()
	r, err := c.run(ctx, `python3 -c "x = bytearray(64 * 1024**3)"`)
	took := time.Since(start)
	if err != nil {
		t.Fatalf("hog's command stream: %v", err)
	}
	// Who killed it: envd's watchdog leaves the host's OOM kill count at
	// 0; the backstop (a stub at oom_score_adj 1000) raises it.
	oc, _ := os.ReadFile(filepath.Join("/sys/fs/cgroup/memory", e.cgroup, sb.Instance, "memory.oom_control"))
	t.Logf("hog: exit %d status %q after %v; stderr %q; host cgroup: %q", r.exit, r.status, took, r.stderr,
		strings.Join(strings.Fields(string(oc)), " "))
	if r.exit != 137 && !strings.Contains(r.stderr, "MemoryError") && r.status != "signal: killed" {
		t.Errorf("hog ended with exit %d (%s), want 137 or MemoryError", r.exit, r.status)
	}
	if !strings.Contains(string(oc), "oom_kill 0") {
		t.Errorf("the host's OOM killer acted (%q): envd's watchdog (alerted by the runtime as memory rose) should have killed the hog first", oc)
	}
	if got := c.sh(ctx, "kill -0 "+pid+" && echo alive"); got != "alive\n" {
		t.Errorf("bystander %s: %q", pid, got)
	}
	got, err := e.n.Engine.Get(ctx, sb.ID)
	if err != nil || got.State != engine.StateRunning {
		t.Errorf("sandbox after the hog: %+v %v", got.State, err)
	}
}

// TestSandboxDeathNoticed: when a sandbox's kernel dies (SIGKILL from the
// host here; the memory cgroup's OOM killer in real life), the engine sees
// it at once, records the sandbox as dead with a reason, frees its
// instance and tells its listeners.
func TestSandboxDeathNoticed(t *testing.T) {
	e := newEnv(t)
	ctx := ctxFor(t)
	told := make(chan engine.Sandbox, 1)
	e.n.Engine.OnDeath(func(sb engine.Sandbox) { told <- sb })
	sb := e.create(ctx, engine.CreateOptions{Template: node.TemplateBase})
	info, err := e.n.Runtime.State(ctx, sb.Instance)
	if err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	if err := syscall.Kill(info.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case dead := <-told:
		t.Logf("noticed and recorded %v after the SIGKILL: %+v", time.Since(killed), dead.Death)
		if dead.ID != sb.ID || dead.State != engine.StateDead || dead.Death == nil || dead.Death.Reason != runtime.ExitCrashed {
			t.Errorf("death report %+v", dead)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the engine did not notice the sandbox's death within 30 s")
	}
	got, err := e.n.Engine.Get(ctx, sb.ID)
	if err != nil || got.State != engine.StateDead || got.Death == nil || got.Death.Reason != runtime.ExitCrashed {
		t.Fatalf("sandbox after death: %+v %v", got, err)
	}
	if _, err := e.n.Runtime.State(ctx, sb.Instance); err == nil {
		t.Errorf("instance %s of the dead sandbox not freed", sb.Instance)
	}
	if _, err := e.n.Engine.Exec(ctx, sb.ID, runtime.ExecSpec{Args: []string{"true"}}); err == nil {
		t.Error("exec in a dead sandbox succeeded")
	}
	if err := e.n.Engine.Kill(ctx, sb.ID); err != nil {
		t.Fatalf("kill of a dead sandbox: %v", err)
	}
	_ = context.Background
}

// TestMoreMemoryThanTheTemplate: a sandbox created from a template with
// more memory than the template was built with holds what its own limit
// allows: envd's watchdog follows the restored limit (it used to keep the
// template's and killed 1.2 GB in a 2 GB sandbox), and still kills a hog
// past it.
func TestMoreMemoryThanTheTemplate(t *testing.T) {
	e := newEnv(t)
	ctx := ctxFor(t)
	sb := e.create(ctx, engine.CreateOptions{Template: node.TemplateBase, MemoryMB: 2048})
	c := e.client(sb)
	r, err := c.run(ctx, `python3 -c "x = bytearray(1200 << 20); print(len(x))"`)
	if err != nil || r.exit != 0 {
		t.Fatalf("1.2 GB in a 2 GB sandbox of a 1 GB template: exit %d (%s) %v; stderr %q", r.exit, r.status, err, r.stderr)
	}
	r, err = c.run(ctx, `python3 -c "x = bytearray(3000 << 20)"`)
	if err != nil || (r.exit != 137 && !strings.Contains(r.stderr, "MemoryError") && r.status != "signal: killed") {
		t.Fatalf("a 3 GB hog in a 2 GB sandbox: exit %d (%s) %v", r.exit, r.status, err)
	}
}
