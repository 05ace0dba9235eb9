package gvisor

import (
	"context"
	"path/filepath"
	"syscall"
	"time"
)

// runsc pause asks the sandbox to stop its kernel, then records "paused"
// in the instance's state file; runsc resume does the same the other way.
// A caller killed between the two (the engine SIGKILLed during a
// hibernate, which pauses first) left a sandbox whose kernel was stopped
// while its state said running: the restarted engine saw "running",
// left it, and the sandbox never answered again (TestCrashRounds, once in
// five CI runs). runsc cannot resume it then (it resumes only what its
// state says is paused), and a second pause nests (the kernel needs as
// many resumes as pauses). A killed resume is the mirror case: a kernel
// running under a "paused" state, whose recovery resume would unpause a
// kernel not paused (which gVisor may answer with a panic).
//
// So pause and resume outlive their caller: they run in their own process
// group without the parent-death signal, and finish (they take
// milliseconds). Recover first waits for such calls of a previous engine
// on the instance to end, so the state it reads is the kernel's.

// outlivesCaller reports whether a runsc verb is left to finish when the
// engine dies.
func outlivesCaller(verb string) bool { return verb == "pause" || verb == "resume" }

// detachedWait bounds how long Recover waits for a previous engine's pause
// or resume; one still running after it is killed (runsc hung).
const detachedWait = 30 * time.Second

// awaitDetached waits for runsc pause and resume calls on instance id that
// a previous engine started, killing any still running after detachedWait.
func (d *Driver) awaitDetached(ctx context.Context, id string) {
	deadline := time.Now().Add(detachedWait)
	for {
		pids := d.detachedCallsOf(id)
		if len(pids) == 0 {
			return
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			for _, pid := range pids {
				d.log.Warn("killing a runsc pause or resume that did not end", "pid", pid, "instance", id)
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// detachedCallsOf lists the live processes of this driver's runsc pause or
// resume calls on instance id: their command line names the driver's
// --root, then the verb and the instance as the last two arguments
// (runsc's own process, or the shell that joins its cgroups first).
func (d *Driver) detachedCallsOf(id string) []int {
	var out []int
	for _, p := range processesNaming([]byte("--root=" + filepath.Join(d.cfg.StateDir, "root"))) {
		if n := len(p.args); n >= 2 && p.args[n-1] == id && outlivesCaller(p.args[n-2]) && running(p.pid) {
			out = append(out, p.pid)
		}
	}
	return out
}
