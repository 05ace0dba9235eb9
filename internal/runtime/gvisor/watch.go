package gvisor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/runtime"
)

var _ runtime.Waiter = (*Driver)(nil)

// Wait implements runtime.Waiter. It waits on a pidfd of the instance's
// sandbox process (the gVisor kernel) in the driver's epoll (pidWatcher):
// no polling, and the death is seen as soon as the process has exited.
// pidfds work for processes that are not our children (the sandbox process
// is re-parented away from runsc when run/restore -detach returns).
func (d *Driver) Wait(ctx context.Context, id string) (runtime.Exit, error) {
	if err := d.mustExist(id); err != nil {
		return runtime.Exit{}, err
	}
	// The PID from runsc's state file, not `runsc state`: that starts a
	// process per watch and can hang on a sandbox that just died.
	var info runtime.Info
	if info.PID = d.sandboxPID(id); info.PID <= 0 {
		return runtime.Exit{}, fmt.Errorf("wait for instance %s: no sandbox process in its state: %w", id, errdefs.ErrInternal)
	}
	// Where to look for an OOM kill afterwards, read while the process is
	// alive (its /proc entry goes with it).
	memcg := cgroupDirOf(info.PID, "memory")
	oomBefore := oomKills(memcg)
	logMark := d.oomLog.mark()
	fd, err := unix.PidfdOpen(info.PID, unix.PIDFD_NONBLOCK)
	if errors.Is(err, unix.ESRCH) {
		return d.exitOf(id, info.PID, -1, nil, 0), nil
	}
	if err != nil {
		return runtime.Exit{}, fmt.Errorf("wait for instance %s: pidfd_open: %w: %v", id, errdefs.ErrInternal, err)
	}
	defer unix.Close(fd)
	for !pidfdReadable(fd) {
		ready, err := d.pids.add(fd)
		if err != nil {
			return runtime.Exit{}, fmt.Errorf("wait for instance %s: %w: %v", id, errdefs.ErrInternal, err)
		}
		select {
		case <-ready:
		case <-ctx.Done():
			d.pids.remove(fd)
			return runtime.Exit{}, fmt.Errorf("wait for instance %s: %w", id, ctx.Err())
		}
	}
	return d.exitOf(id, info.PID, logMark, &memcg, oomBefore), nil
}

// pidfdReadable reports whether the process behind a pidfd has exited.
func pidfdReadable(fd int) bool {
	p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(p, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		return n > 0
	}
}

// pidWatcher waits for many pidfds with one epoll instance and one
// goroutine (one OS thread for every instance of the host). Go's own
// poller cannot take them: pidfs inodes look like regular files to it.
type pidWatcher struct {
	once    sync.Once
	epfd    int
	initErr error
	mu      sync.Mutex
	waiters map[int32]chan struct{}
}

// add registers a pidfd; the channel closes when it may have become
// readable (the caller checks: a descriptor number can be reused).
func (w *pidWatcher) add(fd int) (<-chan struct{}, error) {
	w.once.Do(func() {
		w.epfd, w.initErr = unix.EpollCreate1(unix.EPOLL_CLOEXEC)
		if w.initErr == nil {
			w.waiters = map[int32]chan struct{}{}
			go w.loop()
		}
	})
	if w.initErr != nil {
		return nil, w.initErr
	}
	ch := make(chan struct{})
	w.mu.Lock()
	defer w.mu.Unlock()
	w.waiters[int32(fd)] = ch
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLONESHOT, Fd: int32(fd)}
	if err := unix.EpollCtl(w.epfd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
		delete(w.waiters, int32(fd))
		return nil, err
	}
	return ch, nil
}

// remove unregisters a pidfd before it is closed.
func (w *pidWatcher) remove(fd int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.waiters, int32(fd))
	_ = unix.EpollCtl(w.epfd, unix.EPOLL_CTL_DEL, fd, nil)
}

func (w *pidWatcher) loop() {
	events := make([]unix.EpollEvent, 64)
	for {
		n, err := unix.EpollWait(w.epfd, events, -1)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return
		}
		w.mu.Lock()
		for _, ev := range events[:n] {
			if ch, ok := w.waiters[ev.Fd]; ok {
				delete(w.waiters, ev.Fd)
				_ = unix.EpollCtl(w.epfd, unix.EPOLL_CTL_DEL, int(ev.Fd), nil)
				close(ch)
			}
		}
		w.mu.Unlock()
	}
}

// exitOf explains the death of instance id's sandbox process pid: an OOM
// kill if the host kernel logged one for that process after logMark (its
// log's last record when the watch began, -1: any) or the instance's
// memory cgroup counted a new one, a crash otherwise.
func (d *Driver) exitOf(id string, pid int, logMark int64, memcg *string, oomBefore int64) runtime.Exit {
	// Detail reaches API clients: plain words, no host PIDs or paths (those
	// go to the log).
	ex := runtime.Exit{ID: id, Reason: runtime.ExitCrashed, At: time.Now(),
		Detail: "the sandbox kernel exited on its own or was killed from outside"}
	oomBy := ""
	if pid > 0 && d.oomLog.killedAfter(pid, logMark) {
		ex.Reason, oomBy = runtime.ExitOOM, "kernel log"
		ex.Detail = "the host's OOM killer killed the sandbox kernel: the sandbox reached its memory limit"
	} else if memcg != nil && *memcg != "" {
		if n := oomKills(*memcg); n > oomBefore && underOOMRecently(*memcg) {
			ex.Reason, oomBy = runtime.ExitOOM, fmt.Sprintf("memory cgroup OOM kills %d -> %d", oomBefore, n)
			ex.Detail = "the sandbox reached its memory limit"
		}
	}
	// Every exit passes here, kills included; the engine logs the deaths
	// it did not cause.
	d.log.Debug("instance exited", "instance", id, "pid", pid, "reason", ex.Reason, "oom_evidence", oomBy)
	return ex
}

// cgroupDirOf returns the v1 cgroup directory of pid in the hierarchy
// holding controller, or "" (v2 hosts, a gone process).
func cgroupDirOf(pid int, controller string) string {
	b, err := readBounded(filepath.Join("/proc", strconv.Itoa(pid), "cgroup"), 16<<10)
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			if c == controller {
				dir := filepath.Join(cgroupRoot, parts[1], parts[2])
				if _, err := os.Stat(dir); err == nil {
					return dir
				}
				return filepath.Join(cgroupRoot, controller, parts[2])
			}
		}
	}
	return ""
}

// oomKills is the memory cgroup's count of OOM kills (-1 if unknown).
func oomKills(memcg string) int64 {
	if memcg == "" {
		return -1
	}
	b, err := readBounded(filepath.Join(memcg, "memory.oom_control"), 4<<10)
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "oom_kill "); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err == nil {
				return n
			}
		}
	}
	return -1
}

// underOOMRecently reports whether the cgroup hit its limit: its peak usage
// reached the limit. A stub killed long ago also counts as an OOM kill, so
// the counter alone would blame a later crash on memory.
func underOOMRecently(memcg string) bool {
	limit := readInt(filepath.Join(memcg, "memory.limit_in_bytes"))
	peak := readInt(filepath.Join(memcg, "memory.max_usage_in_bytes"))
	return limit > 0 && peak >= limit-(4<<20)
}

func readBounded(path string, max int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, max))
}

func readInt(path string) int64 {
	b, err := readBounded(path, 64)
	if err != nil {
		return -1
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return -1
	}
	return n
}

// protectSandbox makes the host's OOM killer pick a guest process instead
// of the whole sandbox when the instance reaches its memory limit: every
// systrap stub (the host process a guest process runs in) gets
// oom_score_adj 1000. Killing a stub ends only its guest process (measured:
// the sentry kills that process and lives on); killing the sentry or the
// gofer ends the sandbox. New stubs are forked from existing ones and
// inherit the value. Raising oom_score_adj needs no privilege; lowering
// the sentry's would need CAP_SYS_RESOURCE.
func (d *Driver) protectSandbox(id string, sandboxPID int) {
	stubs := stubsOf(sandboxPID)
	for _, pid := range stubs {
		p := filepath.Join("/proc", strconv.Itoa(pid), "oom_score_adj")
		if err := os.WriteFile(p, []byte("1000"), 0o644); err != nil && !errors.Is(err, os.ErrNotExist) {
			d.log.Warn("raise stub oom_score_adj", "instance", id, "pid", pid, "err", err)
		}
	}
	if len(stubs) == 0 {
		d.log.Warn("no systrap stubs found: a memory limit kills the whole sandbox", "instance", id, "pid", sandboxPID)
	}
}

// stubsOf returns the systrap stub processes of a sandbox: the processes
// of its memory cgroup that descend from the sandbox process. The sentry's
// own threads are tasks of the sandbox process, not children; the gofer is
// the sandbox's sibling (runsc starts both). Only the instance's cgroup is
// read, not all of /proc: a dense host runs tens of thousands of
// processes.
func stubsOf(sandboxPID int) []int {
	memcg := cgroupDirOf(sandboxPID, "memory")
	if memcg == "" {
		return nil
	}
	b, err := readBounded(filepath.Join(memcg, "cgroup.procs"), 1<<20)
	if err != nil {
		return nil
	}
	parent := map[int]int{}
	for _, f := range strings.Fields(string(b)) {
		pid, err := strconv.Atoi(f)
		if err != nil || pid == sandboxPID {
			continue
		}
		if pp := ppidOf(pid); pp > 0 {
			parent[pid] = pp
		}
	}
	var out []int
	for pid := range parent {
		// Walk up within the cgroup until the sandbox process or a
		// process outside it.
		for p, hops := pid, 0; hops < 64; hops++ {
			pp, ok := parent[p]
			if !ok {
				break
			}
			if pp == sandboxPID {
				out = append(out, pid)
				break
			}
			p = pp
		}
	}
	return out
}

// ppidOf reads a process's parent from /proc/<pid>/stat (0 if gone).
func ppidOf(pid int) int {
	b, err := readBounded(filepath.Join("/proc", strconv.Itoa(pid), "stat"), 4096)
	if err != nil {
		return 0
	}
	// "pid (comm) state ppid ...": comm may hold spaces and parentheses.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 {
		return 0
	}
	n, _ := strconv.Atoi(f[1])
	return n
}
