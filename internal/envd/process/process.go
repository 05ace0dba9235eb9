// Package process implements the envd process service: start commands
// (optionally in a PTY, with stdin kept open), stream their output to any
// number of subscribers, send input and signals, resize, list.
package process

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	processpb "github.com/spore-run/spore/proto/gen/process"
)

// subBuffer is how many output events (each at most 32 KiB) wait for one
// subscriber before the output pump waits for it (backpressure).
const subBuffer = 64

// proc is one started process.
//
// Locking: mu guards the fields below it and is only ever held for
// bookkeeping, never across a pipe write, a channel send or any other call
// that can block: a process that does not read its stdin, or a subscriber
// that does not read its stream, must not stop signals, kill, other
// subscribers or the output pump.
type proc struct {
	pid    int
	tag    string
	config *processpb.ProcessConfig
	// slow is how long the output pump waits for a subscriber whose buffer
	// is full before cutting that subscriber off with an error.
	slow time.Duration
	// refill starts the next warm shell once the process has exited (nil
	// for a process no warm shell could have run).
	refill func()

	mu      sync.Mutex
	stdin   *os.File // nil when stdin was not kept open (or was closed)
	pty     *os.File // PTY master (non-blocking), nil without a PTY
	subs    map[*subscriber]struct{}
	end     *processpb.ProcessEvent_EndEvent // set once it ended
	done    chan struct{}                    // closed once end is set
	outputs sync.WaitGroup
	// progress counts the pumps' reads and publishes, and publishing the
	// pumps inside a publish: after the process exited, output is waited
	// for as long as it still flows (see Service.await).
	progress   atomic.Int64
	publishing atomic.Int32
}

// subscriber is one stream following the process's output.
type subscriber struct {
	ch   chan *processpb.ProcessEvent // data events, in order
	left chan struct{}                // closed when the subscriber goes away
	cut  chan struct{}                // closed when it fell behind and output was dropped for it
	once sync.Once
}

// errTooSlow ends the stream of a subscriber that was cut off: it must see
// an error, never a clean end, because output was dropped for it.
var errTooSlow = errors.New("output subscriber too slow: output was dropped for it and its stream cut (the process keeps running; Connect again to follow it)")

// subscribe follows the process's events from now on. The end event is not
// queued: once done is closed, every data event published before the end is
// already in ch (the pumps have returned), so the reader drains ch and then
// reports p.end (see Service.forward).
func (p *proc) subscribe() (*subscriber, func()) {
	s := &subscriber{ch: make(chan *processpb.ProcessEvent, subBuffer), left: make(chan struct{}), cut: make(chan struct{})}
	p.mu.Lock()
	if p.end == nil {
		p.subs[s] = struct{}{}
	}
	p.mu.Unlock()
	return s, func() {
		p.mu.Lock()
		delete(p.subs, s)
		p.mu.Unlock()
		s.once.Do(func() { close(s.left) })
	}
}

// publish hands one output event to every subscriber, waiting (without
// holding mu) while a subscriber's buffer is full: the pump stops reading,
// so a fast writer is slowed down to the pace of its readers rather than
// having output dropped. A subscriber that takes no event for p.slow is cut
// off with an error, so it cannot stall the process for the others forever.
func (p *proc) publish(ev *processpb.ProcessEvent) {
	p.mu.Lock()
	subs := make([]*subscriber, 0, len(p.subs))
	for s := range p.subs {
		subs = append(subs, s)
	}
	p.mu.Unlock()
	for _, s := range subs {
		select {
		case s.ch <- ev:
			continue
		case <-s.cut:
			continue
		case <-s.left:
			continue
		default:
		}
		t := time.NewTimer(p.slow)
		select {
		case s.ch <- ev:
		case <-s.cut:
		case <-s.left:
		case <-t.C:
			p.cutOff(s)
		}
		t.Stop()
	}
}

// cutOff drops a subscriber that fell behind. After the end, output of
// background children still holding the pipes is not owed to anyone, so
// nobody is cut then.
func (p *proc) cutOff(s *subscriber) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.end != nil {
		return
	}
	delete(p.subs, s)
	close(s.cut) // only publishers cut, under mu, and only while subscribed
}

func (p *proc) finish(end *processpb.ProcessEvent_EndEvent) {
	p.mu.Lock()
	p.end = end
	clear(p.subs) // their readers see done and drain what they have
	stdin, tty := p.stdin, p.pty
	p.stdin, p.pty = nil, nil
	p.mu.Unlock()
	close(p.done)
	// Closing wakes a write blocked on them with an error (both are
	// non-blocking descriptors served by Go's poller).
	if stdin != nil {
		stdin.Close()
	}
	if tty != nil {
		tty.Close()
	}
}

func endEvent(e *processpb.ProcessEvent_EndEvent) *processpb.ProcessEvent {
	return &processpb.ProcessEvent{Event: &processpb.ProcessEvent_End{End: e}}
}

func dataEvent(kind int, b []byte) *processpb.ProcessEvent {
	d := &processpb.ProcessEvent_DataEvent{}
	switch kind {
	case 1:
		d.Output = &processpb.ProcessEvent_DataEvent_Stdout{Stdout: b}
	case 2:
		d.Output = &processpb.ProcessEvent_DataEvent_Stderr{Stderr: b}
	default:
		d.Output = &processpb.ProcessEvent_DataEvent_Pty{Pty: b}
	}
	return &processpb.ProcessEvent{Event: &processpb.ProcessEvent_Data{Data: d}}
}

// pump copies one output stream of the process to its subscribers.
func (p *proc) pump(f *os.File, kind int) {
	defer p.outputs.Done()
	defer f.Close()
	buf := make([]byte, 32*1024)
	for {
		n, err := f.Read(buf)
		p.progress.Add(1)
		if n > 0 {
			b := make([]byte, n)
			copy(b, buf[:n])
			p.publishing.Add(1)
			p.publish(dataEvent(kind, b))
			p.publishing.Add(-1)
			p.progress.Add(1)
		}
		if err != nil {
			return // EOF, or EIO on a PTY whose last writer is gone
		}
	}
}

// writeInput sends bytes to the process's stdin or PTY. The write happens
// without mu: it blocks for as long as the process does not read, and the
// output pump (which needs mu to publish), signals and kill must go on
// meanwhile. Closing the descriptor (CloseStdin, the process's end) wakes a
// blocked write with an error.
func (p *proc) writeInput(b []byte, toPTY bool) error {
	p.mu.Lock()
	if p.end != nil {
		p.mu.Unlock()
		return errEnded
	}
	w := p.stdin
	if toPTY || p.pty != nil {
		w = p.pty
	}
	p.mu.Unlock()
	if w == nil {
		return errNoStdin
	}
	_, err := w.Write(b)
	return p.writeErr(err)
}

// writeErr names why a write to the process's input failed.
func (p *proc) writeErr(err error) error {
	if err == nil {
		return nil
	}
	p.mu.Lock()
	ended := p.end != nil
	p.mu.Unlock()
	switch {
	case ended:
		return errEnded
	case errors.Is(err, os.ErrClosed):
		return fmt.Errorf("%w: %w", errStdinGone, err)
	case errors.Is(err, syscall.EPIPE), errors.Is(err, syscall.EIO):
		return fmt.Errorf("%w: %w", errStdinGone, err)
	}
	return err
}

func (p *proc) closeStdin() error {
	p.mu.Lock()
	if p.end != nil {
		p.mu.Unlock()
		return errEnded
	}
	if tty := p.pty; tty != nil {
		p.mu.Unlock()
		// A terminal has no separate stdin to close: send end-of-file.
		_, err := tty.Write([]byte{4})
		return p.writeErr(err)
	}
	stdin := p.stdin
	p.stdin = nil
	p.mu.Unlock()
	if stdin == nil {
		return errNoStdin
	}
	return stdin.Close() // wakes a write blocked on it
}

func (p *proc) resize(cols, rows uint32) error {
	p.mu.Lock()
	tty := p.pty
	p.mu.Unlock()
	if tty == nil {
		return errNoPTY
	}
	return setSize(tty, cols, rows)
}

// setSize sets a PTY's window size through SyscallConn: File.Fd (which
// pty.Setsize uses) would switch the master back to blocking mode, and a
// blocked write could then no longer be woken by closing it.
func setSize(tty *os.File, cols, rows uint32) error {
	rc, err := tty.SyscallConn()
	if err != nil {
		return err
	}
	var ioErr error
	if err := rc.Control(func(fd uintptr) {
		ioErr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Col: uint16(cols), Row: uint16(rows)})
	}); err != nil {
		return err
	}
	return ioErr
}

// signal signals the process's whole process group (it leads one), so a
// shell's children go with it.
func (p *proc) signal(sig syscall.Signal) error {
	p.mu.Lock()
	ended := p.end != nil
	p.mu.Unlock()
	if ended {
		return errEnded
	}
	if err := syscall.Kill(-p.pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return err
	}
	return nil
}

var (
	errEnded     = errors.New("process has ended")
	errNoStdin   = errors.New("process was started without stdin (start it with stdin: true)")
	errNoPTY     = errors.New("process has no PTY")
	errStdinGone = errors.New("process no longer reads its input (stdin closed or process exiting)")
)

// status renders an exit like Go's os.ProcessState does.
func status(ws syscall.WaitStatus) (code int32, exited bool, s string) {
	switch {
	case ws.Exited():
		return int32(ws.ExitStatus()), true, fmt.Sprintf("exit status %d", ws.ExitStatus())
	case ws.Signaled():
		return -1, false, "signal: " + ws.Signal().String()
	default:
		return -1, false, "unknown"
	}
}
