// Package reaper starts child processes and collects their exit statuses.
//
// When envd is a sandbox's init (PID 1) it must reap every zombie,
// including orphans re-parented to it. A single wait4(-1) loop then owns
// all children and hands each exit status to whoever started that child;
// nothing else in the process may wait for children (os/exec's Wait would
// race it). Outside PID 1 (tests on a host) the reaper waits only for its
// own children.
package reaper

import (
	"errors"
	"os"
	"os/signal"
	"sync"
	"syscall"
)

// Exit is how a child ended.
type Exit struct {
	Status syscall.WaitStatus
	Err    error
}

// Reaper starts children and reports their exits.
type Reaper struct {
	all bool // reap every child, orphans included

	mu      sync.Mutex
	waiters map[int]chan Exit
}

// New returns a reaper. With all set it takes over every child of the
// process (use it only when this process is PID 1 or a subreaper).
func New(all bool) *Reaper {
	r := &Reaper{all: all, waiters: map[int]chan Exit{}}
	if all {
		sigs := make(chan os.Signal, 16)
		signal.Notify(sigs, syscall.SIGCHLD)
		go func() {
			for range sigs {
				r.reapAll()
			}
		}()
	}
	return r
}

// Start starts a process and returns its PID and a channel that receives
// its exit once.
func (r *Reaper) Start(path string, argv []string, attr *os.ProcAttr) (int, <-chan Exit, error) {
	done := make(chan Exit, 1)
	r.mu.Lock()
	p, err := os.StartProcess(path, argv, attr)
	if err != nil {
		r.mu.Unlock()
		return 0, nil, err
	}
	pid := p.Pid
	r.waiters[pid] = done
	r.mu.Unlock()
	p.Release()
	if r.all {
		r.reapAll() // it may have exited before we registered it
	} else {
		go r.wait(pid)
	}
	return pid, done, nil
}

func (r *Reaper) wait(pid int) {
	var ws syscall.WaitStatus
	for {
		_, err := syscall.Wait4(pid, &ws, 0, nil)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		r.deliver(pid, Exit{Status: ws, Err: err})
		return
	}
}

func (r *Reaper) reapAll() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil || pid <= 0 {
			return
		}
		r.deliver(pid, Exit{Status: ws})
	}
}

func (r *Reaper) deliver(pid int, e Exit) {
	r.mu.Lock()
	ch, ok := r.waiters[pid]
	delete(r.waiters, pid)
	r.mu.Unlock()
	if ok {
		ch <- e
	}
}
