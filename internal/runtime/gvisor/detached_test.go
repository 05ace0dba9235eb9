package gvisor_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/runtime"
	"github.com/spore-run/spore/internal/runtime/gvisor"
	"github.com/spore-run/spore/internal/testenv"
)

// helperEnv makes this test binary, run again, a caller of one driver
// call that the test SIGKILLs mid-call ("verb state-dir cgroup-parent id
// returned-marker").
const helperEnv = "SPORE_GVISOR_KILLED_CALLER"

// An engine SIGKILLed during a pause or a resume (a hibernate pauses
// first) must find, once restarted, the instance in the state its kernel
// is in. Before, runsc died with the engine, possibly between stopping
// the sandbox's kernel and recording "paused": the restarted engine read
// "running" and left a sandbox that never answered again
// (TestCrashRounds, flaky-crash-hibernate-recovery). Now the call
// finishes on its own and Recover waits for it: after a killed pause the
// instance is paused, after a killed resume it runs and answers.
func TestPauseAndResumeOutliveTheirCaller(t *testing.T) {
	if h := os.Getenv(helperEnv); h != "" {
		killedCaller(t, h)
		return
	}
	testenv.RequireRoot(t)
	ctx := context.Background()
	cfg := gvisor.Config{Runsc: testenv.Runsc(t), StateDir: t.TempDir(), CgroupParent: "/spore-detachtest-" + ids.New('g')}
	d, err := gvisor.New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.Purge(context.Background()); err != nil {
			t.Errorf("purge: %v", err)
		}
	})
	id, _ := start(t, d, 256, "sleep 1000")
	for _, tc := range []struct {
		verb string
		want runtime.State
	}{{"pause", runtime.StatePaused}, {"resume", runtime.StateRunning}} {
		// The caller: this binary again, killed as soon as its runsc
		// call is under way.
		returned := filepath.Join(t.TempDir(), "returned") // made by the caller after its call
		cmd := exec.Command(os.Args[0], "-test.run=^TestPauseAndResumeOutliveTheirCaller$")
		cmd.Env = append(os.Environ(), helperEnv+"="+strings.Join([]string{tc.verb, cfg.StateDir, cfg.CgroupParent, id, returned}, " "))
		out, err := os.Create(filepath.Join(t.TempDir(), "out"))
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// Killed as soon as its runsc call shows (almost always: the call
		// takes tens of milliseconds), or once it returned.
		midCall := false
		for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			if len(d.DetachedCallsOf(id)) > 0 {
				midCall = true
				break
			}
			if _, err := os.Stat(returned); err == nil {
				break
			}
		}
		cmd.Process.Kill()
		cmd.Wait()
		if _, err := os.Stat(returned); !midCall && err != nil {
			b, _ := os.ReadFile(out.Name())
			t.Fatalf("%s: the caller's runsc call never showed: %s", tc.verb, b)
		}
		t.Logf("%s: caller killed mid-call: %v", tc.verb, midCall)
		info, err := d.Recover(ctx, id)
		if err != nil {
			t.Fatalf("recover after a killed %s: %v", tc.verb, err)
		}
		if info.State != tc.want {
			t.Fatalf("after a caller killed during its %s, Recover says %s, want %s", tc.verb, info.State, tc.want)
		}
	}
	// The kernel runs: the sandbox answers (a kernel left stopped would
	// never answer this exec).
	ectx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var b strings.Builder
	if code, err := d.Exec(ectx, id, runtime.ExecSpec{Args: []string{"/bin/echo", "alive"}, Stdout: &b}); err != nil || code != 0 || strings.TrimSpace(b.String()) != "alive" {
		t.Fatalf("exec after the killed pause and resume: %d %v %q", code, err, b.String())
	}
}

// killedCaller is the helper's side: it makes the call and waits to be
// killed.
func killedCaller(t *testing.T, spec string) {
	f := strings.Fields(spec)
	if len(f) != 5 {
		t.Fatalf("%s=%q", helperEnv, spec)
	}
	d, err := gvisor.New(context.Background(), gvisor.Config{Runsc: testenv.Runsc(t), StateDir: f[1], CgroupParent: f[2]})
	if err != nil {
		t.Fatal(err)
	}
	call := d.Pause
	if f[0] == "resume" {
		call = d.Resume
	}
	if err := call(context.Background(), f[3]); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(f[4], nil, 0o644); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Hour) // killed by the test
}
