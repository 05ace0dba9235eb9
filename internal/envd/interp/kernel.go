package interp

import (
	"bufio"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"

	"github.com/spore-run/spore/internal/envd/identity"
	"github.com/spore-run/spore/internal/envd/reaper"
)

//go:embed kernel.py
var kernelSource string

// Event is one line of an execution's output, as the SDKs read it.
type Event map[string]any

// kernel is one Python process holding a context's state.
type kernel struct {
	pid      int
	requests *os.File      // fd 4 of the kernel
	events   chan Event    // from fd 3, and stdout/stderr of child processes
	exited   chan struct{} // closed when the process is gone
	run      sync.Mutex    // one execution at a time
}

// startKernel starts a kernel as user u in cwd.
func startKernel(r *reaper.Reaper, python string, u identity.User, cwd string, env []string, script string) (*kernel, error) {
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return nil, err
	}
	defer devnull.Close()
	var toClose []*os.File
	pipe := func() (*os.File, *os.File, error) {
		r, w, err := os.Pipe()
		if err == nil {
			toClose = append(toClose, r, w)
		}
		return r, w, err
	}
	closeAll := func() {
		for _, f := range toClose {
			f.Close()
		}
	}
	outR, outW, err1 := pipe()
	errR, errW, err2 := pipe()
	evR, evW, err3 := pipe()
	reqR, reqW, err4 := pipe()
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		closeAll()
		return nil, err
	}
	attr := &os.ProcAttr{
		Dir:   cwd,
		Env:   append(env, "SPORE_KERNEL_CWD="+cwd, "PYTHONUNBUFFERED=1", "PYTHONDONTWRITEBYTECODE=1"),
		Files: []*os.File{devnull, outW, errW, evW, reqR},
		Sys:   &syscall.SysProcAttr{Setpgid: true},
	}
	if u.UID != uint32(os.Getuid()) {
		attr.Sys.Credential = &syscall.Credential{Uid: u.UID, Gid: u.GID, Groups: u.Groups}
	}
	pid, done, err := r.Start(python, []string{python, "-u", "-c", script}, attr)
	for _, f := range []*os.File{outW, errW, evW, reqR} {
		f.Close()
	}
	if err != nil {
		for _, f := range []*os.File{outR, errR, evR, reqW} {
			f.Close()
		}
		return nil, fmt.Errorf("start python kernel: %w", err)
	}
	k := &kernel{pid: pid, requests: reqW, events: make(chan Event, 256), exited: make(chan struct{})}
	var readers sync.WaitGroup
	readers.Add(3)
	go func() { defer readers.Done(); k.readEvents(evR) }()
	go func() { defer readers.Done(); k.readRaw(outR, "stdout") }()
	go func() { defer readers.Done(); k.readRaw(errR, "stderr") }()
	go func() {
		<-done
		reqW.Close()
		readers.Wait()
		close(k.exited)
	}()
	// Wait for the kernel's ready event.
	select {
	case ev := <-k.events:
		if ev["type"] != "ready" {
			k.kill()
			return nil, fmt.Errorf("python kernel sent %v before ready", ev)
		}
	case <-k.exited:
		return nil, errors.New("python kernel exited at start")
	}
	return k, nil
}

func (k *kernel) readEvents(f *os.File) {
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 64<<20)
	for sc.Scan() {
		var ev Event
		if json.Unmarshal(sc.Bytes(), &ev) == nil {
			k.events <- ev
		}
	}
}

// readRaw forwards output written to the kernel's real file descriptors
// (by child processes, os.system, C extensions) as stdout/stderr events.
func (k *kernel) readRaw(f *os.File, kind string) {
	defer f.Close()
	buf := make([]byte, 32*1024)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			k.events <- Event{"type": kind, "text": string(buf[:n])}
		}
		if err != nil {
			return
		}
	}
}

// execute sends one request and streams its events to emit until the end
// of the execution. When ctx ends first the kernel is interrupted (SIGINT)
// and the execution finishes with a KeyboardInterrupt error.
func (k *kernel) execute(ctx context.Context, req map[string]any, emit func(Event) error) error {
	if err := lockCtx(ctx, &k.run); err != nil {
		return err
	}
	defer k.run.Unlock()
	b, _ := json.Marshal(req)
	if _, err := k.requests.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("kernel is gone: %w", err)
	}
	interrupted := false
	clientGone := false
	ctxDone := ctx.Done()
	for {
		select {
		case ev := <-k.events:
			if ev["type"] == "end_of_execution" {
				return nil
			}
			if !clientGone {
				if err := emit(ev); err != nil {
					clientGone = true
					if !interrupted {
						interrupted = true
						syscall.Kill(k.pid, syscall.SIGINT)
					}
				}
			}
		case <-k.exited:
			return errors.New("python kernel exited during execution")
		case <-ctxDone:
			ctxDone = nil
			clientGone = true
			if !interrupted {
				interrupted = true
				syscall.Kill(k.pid, syscall.SIGINT)
			}
		}
	}
}

func lockCtx(ctx context.Context, m *sync.Mutex) error {
	if m.TryLock() {
		return nil
	}
	done := make(chan struct{})
	go func() { m.Lock(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		go func() { <-done; m.Unlock() }()
		return ctx.Err()
	}
}

func (k *kernel) kill() {
	syscall.Kill(-k.pid, syscall.SIGKILL)
	syscall.Kill(k.pid, syscall.SIGKILL)
}
