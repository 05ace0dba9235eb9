// Package process implements the envd process service: start commands
// (optionally in a PTY, with stdin kept open), stream their output to any
// number of subscribers, send input and signals, resize, list.
package process

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"

	"github.com/creack/pty"

	processpb "github.com/spore-run/spore/proto/gen/process"
)

// proc is one started process.
type proc struct {
	pid    int
	tag    string
	config *processpb.ProcessConfig

	mu      sync.Mutex
	stdin   *os.File // nil when stdin was not kept open (or was closed)
	pty     *os.File // PTY master, nil without a PTY
	subs    map[chan *processpb.ProcessEvent]struct{}
	end     *processpb.ProcessEvent_EndEvent // set once it ended
	done    chan struct{}                    // closed once it ended and output is drained
	outputs sync.WaitGroup
}

// subscribe returns a channel of the process's events from now on. The
// channel is closed after the end event, or when the subscriber falls too
// far behind (so a slow reader never stalls the process).
func (p *proc) subscribe() (chan *processpb.ProcessEvent, func()) {
	ch := make(chan *processpb.ProcessEvent, 1024)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.end != nil {
		ch <- endEvent(p.end)
		close(ch)
		return ch, func() {}
	}
	p.subs[ch] = struct{}{}
	return ch, func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if _, ok := p.subs[ch]; ok {
			delete(p.subs, ch)
			close(ch)
		}
	}
}

func (p *proc) publish(ev *processpb.ProcessEvent) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for ch := range p.subs {
		select {
		case ch <- ev:
		default: // too slow: drop the subscriber rather than block output
			delete(p.subs, ch)
			close(ch)
		}
	}
}

func (p *proc) finish(end *processpb.ProcessEvent_EndEvent) {
	p.mu.Lock()
	p.end = end
	ev := endEvent(end)
	for ch := range p.subs {
		select {
		case ch <- ev:
		default:
		}
		close(ch)
		delete(p.subs, ch)
	}
	if p.stdin != nil {
		p.stdin.Close()
		p.stdin = nil
	}
	if p.pty != nil {
		p.pty.Close()
		p.pty = nil
	}
	p.mu.Unlock()
	close(p.done)
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
		if n > 0 {
			b := make([]byte, n)
			copy(b, buf[:n])
			p.publish(dataEvent(kind, b))
		}
		if err != nil {
			return // EOF, or EIO on a PTY whose last writer is gone
		}
	}
}

// writeInput sends bytes to the process's stdin or PTY.
func (p *proc) writeInput(b []byte, toPTY bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.end != nil {
		return errEnded
	}
	w := p.stdin
	if toPTY || p.pty != nil {
		w = p.pty
	}
	if w == nil {
		return errNoStdin
	}
	_, err := w.Write(b)
	return err
}

func (p *proc) closeStdin() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.end != nil {
		return errEnded
	}
	if p.pty != nil {
		// A terminal has no separate stdin to close: send end-of-file.
		_, err := p.pty.Write([]byte{4})
		return err
	}
	if p.stdin == nil {
		return errNoStdin
	}
	err := p.stdin.Close()
	p.stdin = nil
	return err
}

func (p *proc) resize(cols, rows uint32) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pty == nil {
		return errNoPTY
	}
	return pty.Setsize(p.pty, &pty.Winsize{Cols: uint16(cols), Rows: uint16(rows)})
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
	errEnded   = errors.New("process has ended")
	errNoStdin = errors.New("process was started without stdin (start it with stdin: true)")
	errNoPTY   = errors.New("process has no PTY")
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
