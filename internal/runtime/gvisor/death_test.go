package gvisor_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/runtime"
	"github.com/spore-run/spore/internal/runtime/gvisor"
	"github.com/spore-run/spore/internal/testenv"
)

func newDriver(t *testing.T) *gvisor.Driver {
	t.Helper()
	return newDriverWith(t, gvisor.Config{CgroupParent: "/spore-deathtest-" + ids.New('g')})
}

// newDriverWith returns a driver of the installed runsc with cfg (its
// Runsc and StateDir filled in), purged when t ends.
func newDriverWith(t *testing.T, cfg gvisor.Config) *gvisor.Driver {
	t.Helper()
	testenv.RequireRoot(t)
	cfg.Runsc, cfg.StateDir = testenv.Runsc(t), t.TempDir()
	d, err := gvisor.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.Purge(context.Background()); err != nil {
			t.Errorf("purge: %v", err)
		}
	})
	return d
}

// execOut runs args in instance id and returns its trimmed output and
// exit code.
func execOut(t *testing.T, d *gvisor.Driver, id string, args ...string) (string, int) {
	t.Helper()
	var b bytes.Buffer
	code, err := d.Exec(context.Background(), id, runtime.ExecSpec{Args: args, Stdout: &b})
	if err != nil {
		t.Fatalf("exec %v in %s: %v", args, id, err)
	}
	return strings.TrimSpace(b.String()), code
}

func start(t *testing.T, d *gvisor.Driver, memMB int64, script string) (string, runtime.Info) {
	t.Helper()
	ctx := context.Background()
	id := ids.New('t')
	if err := d.Start(ctx, runtime.Spec{ID: id, RootFS: testenv.BaseRootFS(t), Args: []string{"/bin/sh", "-c", script},
		Limits: runtime.Limits{VCPUs: 1, MemoryMB: memMB, MaxProcs: 64, DiskMB: 256}}); err != nil {
		t.Fatal(err)
	}
	info, err := d.State(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	return id, info
}

func procField(pid int, file string) string {
	b, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), file))
	return strings.TrimSpace(string(b))
}

// TestStubsFirstForHostOOM: after a start, every host process of the
// sandbox except the sandbox kernel (sentry) and the gofer has
// oom_score_adj 1000, so the host's OOM killer ends one guest process
// instead of the whole sandbox; processes started later inherit it.
func TestStubsFirstForHostOOM(t *testing.T) {
	d := newDriver(t)
	id, info := start(t, d, 384, "sleep 1000000")
	// A process started after the start gets a new stub.
	if code, err := d.Exec(context.Background(), id, runtime.ExecSpec{Args: []string{"/bin/sh", "-c", "sleep 1000000 >/dev/null 2>&1 &"}}); err != nil || code != 0 {
		t.Fatalf("exec: %d %v", code, err)
	}
	memcg := ""
	for _, line := range strings.Split(procField(info.PID, "cgroup"), "\n") {
		if p := strings.SplitN(line, ":", 3); len(p) == 3 && p[1] == "memory" {
			memcg = filepath.Join("/sys/fs/cgroup/memory", p[2])
		}
	}
	procs, err := os.ReadFile(filepath.Join(memcg, "cgroup.procs"))
	if err != nil {
		t.Fatal(err)
	}
	stubs := 0
	for _, f := range strings.Fields(string(procs)) {
		pid, _ := strconv.Atoi(f)
		adj := procField(pid, "oom_score_adj")
		stat := procField(pid, "stat")
		isStub := pid != info.PID && strings.Contains(stat, ") S "+strconv.Itoa(info.PID)+" ") || ancestorIs(pid, info.PID)
		t.Logf("pid %d adj %s stub %v cmd %q", pid, adj, isStub, procField(pid, "cmdline"))
		switch {
		case pid == info.PID && adj == "1000":
			t.Errorf("the sandbox kernel (pid %d) has oom_score_adj 1000: the host OOM killer would end the sandbox", pid)
		case isStub && adj != "1000":
			t.Errorf("stub %d has oom_score_adj %s, want 1000", pid, adj)
		case isStub:
			stubs++
		}
	}
	if stubs < 2 {
		t.Errorf("%d stubs with oom_score_adj 1000, want at least 2 (init and the exec'd sleep)", stubs)
	}
}

func ancestorIs(pid, anc int) bool {
	for i := 0; i < 64 && pid > 1; i++ {
		st := procField(pid, "stat")
		j := strings.LastIndexByte(st, ')')
		if j < 0 {
			return false
		}
		f := strings.Fields(st[j+1:])
		if len(f) < 2 {
			return false
		}
		pid, _ = strconv.Atoi(f[1])
		if pid == anc {
			return true
		}
	}
	return false
}

// TestWaitSeesCrash: SIGKILL of the sandbox kernel from the host ends Wait
// with reason crashed.
func TestWaitSeesCrash(t *testing.T) {
	d := newDriver(t)
	id, info := start(t, d, 384, "sleep 1000000")
	got := make(chan runtime.Exit, 1)
	go func() {
		ex, err := d.Wait(context.Background(), id)
		if err != nil {
			t.Errorf("wait: %v", err)
		}
		got <- ex
	}()
	time.Sleep(200 * time.Millisecond) // let Wait take its pidfd
	killed := time.Now()
	if err := syscall.Kill(info.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case ex := <-got:
		t.Logf("noticed %v after the SIGKILL: %+v", time.Since(killed), ex)
		if ex.Reason != runtime.ExitCrashed || ex.ID != id {
			t.Errorf("exit %+v, want reason crashed", ex)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Wait did not return 30 s after the sandbox kernel was killed")
	}
	// Wait ends with its context too.
	id2, _ := start(t, d, 384, "sleep 1000000")
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if _, err := d.Wait(ctx, id2); err == nil {
		t.Error("Wait on a live instance returned without error when its context ended")
	}
}

// TestWaitSeesOOM: a sandbox whose memory the guest fills with what
// killing processes cannot free (files in /dev/shm, a tmpfs) dies at its
// memory limit, and Wait says oom.
func TestWaitSeesOOM(t *testing.T) {
	d := newDriver(t)
	// Each writer that the host OOM killer ends is replaced by the next.
	id, _ := start(t, d, 192, `i=0; while :; do i=$((i+1)); head -c 16M /dev/zero > /dev/shm/f$i 2>/dev/null; done`)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ex, err := d.Wait(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("exit: %+v", ex)
	if ex.Reason != runtime.ExitOOM {
		t.Errorf("exit %+v, want reason oom", ex)
	}
}

// TestStatsFromHost: Stats reflects memory the guest holds and a file it
// writes, read from the host.
func TestStatsFromHost(t *testing.T) {
	d := newDriver(t)
	ctx := context.Background()
	id, _ := start(t, d, 512, "sleep 1000000")
	before, err := d.Stats(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	script := `python3 -c "
import time
x = bytearray(200 * 1024 * 1024)
open('/big', 'wb').write(b'y' * (64 * 1024 * 1024))
open('/ready', 'w').write('1')
time.sleep(1000)
" > /dev/null 2>&1 &
while [ ! -e /ready ]; do sleep 0.1; done`
	if code, err := d.Exec(ctx, id, runtime.ExecSpec{Args: []string{"/bin/sh", "-c", script}}); err != nil || code != 0 {
		t.Fatalf("exec: %d %v", code, err)
	}
	after, err := d.Stats(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("before %+v after %+v", before, after)
	if after.MemoryBytes-before.MemoryBytes < 150<<20 {
		t.Errorf("memory grew %d bytes after a 200 MiB allocation", after.MemoryBytes-before.MemoryBytes)
	}
	if after.MemoryLimit != 512<<20 {
		t.Errorf("memory limit %d, want %d", after.MemoryLimit, 512<<20)
	}
	if after.DiskBytes-before.DiskBytes < 48<<20 {
		t.Errorf("disk grew %d bytes after a 64 MiB file", after.DiskBytes-before.DiskBytes)
	}
	if after.CPUUsage <= before.CPUUsage {
		t.Errorf("CPU time did not grow: %v -> %v", before.CPUUsage, after.CPUUsage)
	}
}
