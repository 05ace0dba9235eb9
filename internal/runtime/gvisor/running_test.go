package gvisor

import (
	"os/exec"
	"testing"
	"time"
)

// running: a live process runs; one that exited runs no more, whether
// its parent has reaped it yet (a zombie) or not (gone); no PID runs.
func TestRunning(t *testing.T) {
	live := exec.Command("sleep", "60")
	if err := live.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { live.Process.Kill(); live.Wait() })
	if !running(live.Process.Pid) {
		t.Fatalf("a live sleep (%d) is not running", live.Process.Pid)
	}

	done := exec.Command("true")
	if err := done.Start(); err != nil {
		t.Fatal(err)
	}
	pid := done.Process.Pid
	// Not waited for: it turns into a zombie.
	for deadline := time.Now().Add(10 * time.Second); procState(pid) != 'Z'; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("process %d never became a zombie (state %q)", pid, procState(pid))
		}
	}
	if running(pid) {
		t.Fatalf("a zombie (%d) is taken for running", pid)
	}
	if err := done.Wait(); err != nil {
		t.Fatal(err)
	}
	if running(pid) {
		t.Fatalf("a reaped process (%d) is taken for running", pid)
	}
	for _, pid := range []int{0, -1} {
		if running(pid) {
			t.Fatalf("pid %d is taken for running", pid)
		}
	}
}
