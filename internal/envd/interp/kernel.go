package interp

import (
	"bufio"
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"syscall"
	"time"

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
	token    string        // in the kernel's sync markers (raw.go)
	requests *os.File      // fd 4 of the kernel
	events   chan message  // from fd 3, and stdout/stderr of child processes
	exited   chan struct{} // closed when the process is gone and its readers done
	abandon  chan struct{} // closed when readers must stop waiting for a reader of events
	run      sync.Mutex    // one execution at a time

	// Guarded by run:
	seq   uint64  // executions requested; the kernel counts the same
	carry []Event // raw output that came after a sync marker, for the next execution
}

// message is one event on the events channel.
type message struct {
	ev  Event
	raw string // "stdout" or "stderr" when read from that raw pipe, else ""
}

// orphanGrace is how long the readers of a dead kernel's pipes may go on
// after it died: long enough for what it wrote to be read (that takes no
// waiting), bounded because a child it left running may hold the pipes
// open for ever.
const orphanGrace = 2 * time.Second

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
	tok := make([]byte, 16)
	rand.Read(tok)
	token := hex.EncodeToString(tok)
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
		Env:   append(env, "SPORE_KERNEL_CWD="+cwd, "SPORE_KERNEL_SYNC="+token, "PYTHONUNBUFFERED=1", "PYTHONDONTWRITEBYTECODE=1"),
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
	k := &kernel{pid: pid, token: token, requests: reqW, events: make(chan message, 256),
		exited: make(chan struct{}), abandon: make(chan struct{})}
	var readers sync.WaitGroup
	readers.Add(3)
	go func() { defer readers.Done(); defer evR.Close(); k.readEvents(evR) }()
	go func() { defer readers.Done(); defer outR.Close(); k.readRaw(outR, "stdout") }()
	go func() { defer readers.Done(); defer errR.Close(); k.readRaw(errR, "stderr") }()
	go func() {
		<-done
		reqW.Close()
		finished := make(chan struct{})
		go func() { readers.Wait(); close(finished) }()
		select {
		case <-finished:
		case <-time.After(orphanGrace):
			close(k.abandon)
			for _, f := range []*os.File{evR, outR, errR} {
				f.SetReadDeadline(time.Now()) // fails harmlessly on a closed file
			}
			<-finished
		}
		close(k.exited)
	}()
	// Wait for the kernel's ready event.
	select {
	case m := <-k.events:
		if m.ev["type"] != "ready" {
			k.kill()
			return nil, fmt.Errorf("python kernel sent %v before ready", m.ev)
		}
	case <-k.exited:
		return nil, errors.New("python kernel exited at start")
	}
	return k, nil
}

func (k *kernel) readEvents(r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 64<<20)
	for sc.Scan() {
		var ev Event
		if json.Unmarshal(sc.Bytes(), &ev) == nil {
			k.send(message{ev: ev})
		}
	}
}

// send queues m for the execution that reads events; once the kernel died
// and nobody did within orphanGrace, it drops m so the reader can end.
func (k *kernel) send(m message) {
	select {
	case k.events <- m:
	case <-k.abandon:
	}
}

// execute sends one request and streams its events to emit until the end
// of the execution. When ctx ends first the kernel is interrupted (SIGINT)
// and the execution finishes with a KeyboardInterrupt error.
//
// The end is a barrier on all three streams: the kernel's end_of_execution
// (on fd 3) names the raw streams it wrote a sync marker to, and execute
// finishes once each of those has delivered its marker, so output that child
// processes wrote during the cell is all forwarded. Raw output read after a
// stream's marker (a background child still writing) is the next
// execution's: the marker is the boundary, never a read's chunking.
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
	interrupt := func() {
		clientGone = true
		if !interrupted {
			interrupted = true
			syscall.Kill(k.pid, syscall.SIGINT)
		}
	}
	forward := func(ev Event) {
		if !clientGone && emit(ev) != nil {
			interrupt()
		}
	}
	k.seq++
	end := barrier{n: k.seq}
	for _, ev := range k.carry {
		forward(ev)
	}
	k.carry = nil
	take := func(m message) (done bool) {
		switch {
		case end.take(m.ev):
			return end.done()
		case m.raw != "" && end.past(m.raw):
			k.carry = append(k.carry, m.ev)
		default:
			forward(m.ev)
		}
		return false
	}
	finish := func() error {
		if end.count != nil {
			forward(end.count) // the count stays the last event, after all output
		}
		return nil
	}
	ctxDone := ctx.Done()
	for {
		select {
		case m := <-k.events:
			if take(m) {
				return finish()
			}
		case <-k.exited:
			// Every reader has ended: what they queued is all there is.
			for {
				select {
				case m := <-k.events:
					if take(m) {
						return finish()
					}
				default:
					return errors.New("python kernel exited during execution")
				}
			}
		case <-ctxDone:
			ctxDone = nil
			interrupt()
		}
	}
}

// barrier follows the end of one execution (see execute).
type barrier struct {
	ended  bool
	n      uint64            // the execution's count (end_of_execution has it too)
	want   []string          // raw streams the kernel wrote a marker to
	synced map[string]uint64 // the last marker's count on each stream
	count  Event             // number_of_executions, held until the end
}

// take consumes ev if it is one of the barrier's own events.
func (b *barrier) take(ev Event) bool {
	switch ev["type"] {
	case syncEvent:
		if b.synced == nil {
			b.synced = map[string]uint64{}
		}
		stream, _ := ev["stream"].(string)
		n, _ := ev["count"].(uint64)
		b.synced[stream] = max(b.synced[stream], n)
	case "end_of_execution":
		b.ended = true
		n, _ := ev["execution_count"].(float64)
		b.n = uint64(n)
		list, _ := ev["synced"].([]any)
		for _, s := range list {
			if s, ok := s.(string); ok {
				b.want = append(b.want, s)
			}
		}
	case "number_of_executions":
		b.count = ev
	default:
		return false
	}
	return true
}

// past reports whether stream delivered this execution's marker.
func (b *barrier) past(stream string) bool {
	return b.synced[stream] >= b.n
}

// done reports whether the execution ended and every marked stream caught
// up with it. Markers of earlier executions (counts below n) do not count.
func (b *barrier) done() bool {
	if !b.ended {
		return false
	}
	for _, s := range b.want {
		if b.synced[s] < b.n {
			return false
		}
	}
	return true
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
