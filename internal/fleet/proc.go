package fleet

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// start starts cmd detached from the caller (a session of its own, output
// to logPath, no parent-death signal: the fleet outlives `spore fleet up`)
// and returns its identity. With netnsName set, the process starts in that
// named network namespace and nothing else changes (its mount namespace,
// /sys and /etc stay the host's, unlike `ip netns exec`, which gives the
// child a mount namespace of its own: a node agent's sandbox namespaces
// would then be invisible to its own restart).
func start(cmd *exec.Cmd, logPath, netnsName string) (Proc, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return Proc{}, err
	}
	defer logf.Close()
	cmd.Stdin, cmd.Stdout, cmd.Stderr = nil, logf, logf
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setsid = true
	cmd.SysProcAttr.Pdeathsig = 0
	if netnsName == "" {
		err = cmd.Start()
	} else {
		err = startInNetns(cmd, netnsName)
	}
	if err != nil {
		return Proc{}, fmt.Errorf("start %s: %w", filepath.Base(cmd.Path), err)
	}
	// Reap it if it ends while we live (tests); `up` exits long before.
	go cmd.Wait()
	st, err := startTime(cmd.Process.Pid)
	if err != nil {
		cmd.Process.Kill()
		return Proc{}, fmt.Errorf("read the start time of %s (pid %d): %w", filepath.Base(cmd.Path), cmd.Process.Pid, err)
	}
	return Proc{PID: cmd.Process.Pid, StartTime: st, Netns: netnsName, Args: cmd.Args, Log: logPath}, nil
}

// gone returns a channel closed once p no longer runs (watched until ctx
// ends).
func (p Proc) gone(ctx context.Context) <-chan struct{} {
	c := make(chan struct{})
	go func() {
		for p.alive() && ctx.Err() == nil {
			time.Sleep(50 * time.Millisecond)
		}
		if ctx.Err() == nil {
			close(c)
		}
	}()
	return c
}

// startInNetns forks cmd from a thread that joined the namespace: the
// child inherits the thread's network namespace. The thread stays locked
// and is discarded with its goroutine, so no other goroutine ever runs in
// the namespace.
func startInNetns(cmd *exec.Cmd, name string) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with this goroutine
		fd, err := unix.Open(filepath.Join(netnsRunDir, name), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			errc <- fmt.Errorf("open network namespace %s: %w", name, err)
			return
		}
		defer unix.Close(fd)
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("enter network namespace %s: %w", name, err)
			return
		}
		errc <- cmd.Start()
	}()
	return <-errc
}

// startTime is field 22 of /proc/PID/stat: when the process started, in
// clock ticks after boot. A PID with another start time is another process.
func startTime(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	st, _, err := parseStat(b)
	return st, err
}

// parseStat returns the start time and state letter of a /proc/PID/stat
// line. The command name (field 2) may hold spaces and parentheses: the
// fields after it start after its last ')'.
func parseStat(b []byte) (uint64, byte, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, errors.New("malformed stat: no ')'")
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state), so field 22 is f[19].
	if len(f) < 20 {
		return 0, 0, fmt.Errorf("malformed stat: %d fields after the name", len(f))
	}
	st, err := strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("malformed stat start time %q: %w", f[19], err)
	}
	return st, f[0][0], nil
}

// alive reports whether p still runs: its PID exists, with p's start time,
// and is not a zombie.
func (p Proc) alive() bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(p.PID) + "/stat")
	if err != nil {
		return false
	}
	st, state, err := parseStat(b)
	return err == nil && st == p.StartTime && state != 'Z' && state != 'X'
}

// stop ends p: sig (SIGTERM; SIGINT for PostgreSQL's fast shutdown), then
// SIGKILL after grace, and waits until it is gone. A process that is gone
// already, or whose PID now belongs to another process, is left alone.
func (p Proc) stop(ctx context.Context, sig syscall.Signal, grace time.Duration) error {
	if !p.alive() {
		return nil
	}
	if err := syscall.Kill(p.PID, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("signal %s (pid %d): %w", p.Name, p.PID, err)
	}
	if waitGone(ctx, p, grace) {
		return nil
	}
	if p.alive() {
		syscall.Kill(p.PID, syscall.SIGKILL)
	}
	if waitGone(ctx, p, 30*time.Second) {
		return nil
	}
	return fmt.Errorf("%s (pid %d) still runs after SIGKILL", p.Name, p.PID)
}

func waitGone(ctx context.Context, p Proc, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for p.alive() {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}
