package engine_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/engine"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/testenv"
)

// The helper process: an engine running snapshots or forks in a loop until
// the test SIGKILLs it. It runs only when the crash test starts it.
func TestEngineHelperProcess(t *testing.T) {
	mode := os.Getenv("SPORE_CRASH_HELPER")
	if mode == "" {
		return // not started as a helper: nothing to do
	}
	e := &env{t: t, dir: os.Getenv("SPORE_CRASH_DIR"), cgroup: os.Getenv("SPORE_CRASH_CGROUP"), rootfs: os.Getenv("SPORE_CRASH_ROOTFS"), logger: logger()}
	e.open()
	ctx := context.Background()
	src := os.Getenv("SPORE_CRASH_SANDBOX")
	for i := 0; ; i++ {
		fmt.Printf("start %d\n", i)
		var err error
		switch mode {
		case "snapshot":
			_, err = e.eng.Snapshot(ctx, src, engine.SnapshotOptions{Names: []string{fmt.Sprintf("crash-%d-%d", os.Getpid(), i)}})
		case "fork":
			var fr engine.ForkResult
			fr, err = e.eng.Fork(ctx, src, engine.ForkOptions{Count: 3, Concurrency: 3})
			for _, c := range fr.Children {
				if c.Err == nil {
					_ = e.eng.Kill(ctx, c.Sandbox.ID)
				}
			}
		}
		if err != nil {
			fmt.Printf("error %v\n", err)
			os.Exit(3)
		}
		fmt.Printf("done %d\n", i)
	}
}

// SIGKILL the engine in the middle of snapshots and forks, restart it, and
// check: no partial snapshot is visible, no runsc sandbox or process is
// orphaned, every recorded sandbox really exists, and the source continues.
func TestCrashRecovery(t *testing.T) {
	for _, mode := range []string{"snapshot", "fork"} {
		t.Run(mode, func(t *testing.T) { crashRounds(t, mode, 6) })
	}
}

func crashRounds(t *testing.T, mode string, rounds int) {
	e := newEnv(t)
	rng := testenv.Rand(t) // the kill delays
	ctx := ctxFor(t)
	src := e.create(ctx, e.counter)
	c := e.bump(ctx, src.ID)
	committed := 0
	for round := range rounds {
		e.eng.Close() // hand the directory to the helper
		e.eng = nil
		cmd := exec.Command(os.Args[0], "-test.run=^TestEngineHelperProcess$", "-test.v=false")
		cmd.Env = append(os.Environ(), "SPORE_CRASH_HELPER="+mode, "SPORE_CRASH_DIR="+e.dir,
			"SPORE_CRASH_CGROUP="+e.cgroup, "SPORE_CRASH_ROOTFS="+e.rootfs, "SPORE_CRASH_SANDBOX="+src.ID)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// Let it finish some operations, then kill it in the middle of one:
		// a random delay after an operation started.
		sc := bufio.NewScanner(out)
		target := 1 + round%3
		dones := 0
		for sc.Scan() {
			line := sc.Text()
			if strings.HasPrefix(line, "error") {
				t.Fatalf("helper: %s", line)
			}
			if strings.HasPrefix(line, "done") {
				dones++
			}
			if strings.HasPrefix(line, "start") && dones >= target {
				break
			}
		}
		time.Sleep(time.Duration(rng.IntN(250)) * time.Millisecond)
		cmd.Process.Signal(syscall.SIGKILL)
		cmd.Wait()
		committed += dones

		e.reopen()
		checkConsistent(t, e, ctx)
		c = e.wantContinues(ctx, src.ID, c)
	}
	snaps := 0
	for _, m := range e.eng.Snapshots().List() {
		if strings.HasPrefix(m.Names[0], "crash-") {
			snaps++
		}
	}
	if mode == "snapshot" && snaps < committed {
		t.Fatalf("%d snapshots listed, but helpers reported %d committed", snaps, committed)
	}
	t.Logf("%s: %d rounds, %d operations completed before the kills, %d snapshots kept", mode, rounds, committed, snaps)
}

// checkConsistent asserts the invariants a restarted engine guarantees.
func checkConsistent(t *testing.T, e *env, ctx context.Context) {
	t.Helper()
	// No partial snapshot: nothing staged, and every listed snapshot has a
	// whole image; the newest one restores.
	staged, _ := os.ReadDir(filepath.Join(e.dir, "snapshots", ".staging"))
	if len(staged) != 0 {
		t.Fatalf("staging not emptied: %v", staged)
	}
	list := e.eng.Snapshots().List()
	for _, m := range list {
		if _, err := os.Stat(filepath.Join(e.eng.Snapshots().ImageDir(m.ID), "checkpoint.img")); err != nil {
			t.Fatalf("listed snapshot %s has no image: %v", m.ID, err)
		}
	}
	if last := list[len(list)-1]; last.Kind == "snapshot" {
		sb, err := e.eng.Create(ctx, engine.CreateOptions{Template: last.ID})
		if err != nil {
			t.Fatalf("newest committed snapshot %s does not restore: %v", last.ID, err)
		}
		if err := e.eng.Kill(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
	}
	// Every recorded sandbox exists and answers; no instance is unclaimed.
	claimed := map[string]bool{}
	for _, sb := range e.eng.List(ctx) {
		if sb.State != engine.StateRunning {
			t.Fatalf("sandbox %s is %s after recovery", sb.ID, sb.State)
		}
		claimed[sb.Instance] = true
		e.sh(ctx, sb.ID, "true")
	}
	insts, err := e.drv.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range insts {
		if !claimed[i.ID] {
			t.Fatalf("orphaned instance %s after recovery", i.ID)
		}
	}
	if len(insts) != len(claimed) {
		t.Fatalf("%d instances for %d sandboxes", len(insts), len(claimed))
	}
	// No runsc process outside the instances the runtime knows.
	for _, pid := range runscProcesses(e.dir) {
		args, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		known := false
		for id := range claimed {
			if strings.Contains(string(args), "/inst/"+id+"/") {
				known = true
			}
		}
		if !known {
			t.Fatalf("stray runsc process %d: %q", pid, strings.ReplaceAll(string(args), "\x00", " "))
		}
	}
	// No instance directory without an instance.
	dirs, _ := os.ReadDir(filepath.Join(e.dir, "runtime", "inst"))
	if len(dirs) != len(claimed) {
		t.Fatalf("%d instance directories for %d instances", len(dirs), len(claimed))
	}
	if _, err := e.eng.Get(ctx, "i0000000000000000000"); !errdefs.IsNotFound(err) {
		t.Fatal(err)
	}
}

func runscProcesses(dir string) []int {
	var pids []int
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		var pid int
		if _, err := fmt.Sscanf(p.Name(), "%d", &pid); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", p.Name(), "cmdline"))
		if err == nil && strings.HasPrefix(filepath.Base(strings.Split(string(b), "\x00")[0]), "runsc") &&
			strings.Contains(string(b), "--root="+filepath.Join(dir, "runtime", "root")) {
			pids = append(pids, pid)
		}
	}
	return pids
}
