// Package progress shows the progress of long work (setup, template builds,
// large forks): a live bar on a terminal, plain lines elsewhere (CI logs).
package progress

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
)

// Bar reports progress through a known number of steps, with a detail line
// for what the current step is doing.
type Bar struct {
	out   io.Writer
	bar   *progressbar.ProgressBar // nil when not a terminal
	total int
	done  int
	step  string
	last  time.Time
}

// New starts a bar of total steps on out (os.Stderr when nil).
func New(out io.Writer, total int, title string) *Bar {
	if out == nil {
		out = os.Stderr
	}
	b := &Bar{out: out, total: total}
	if f, ok := out.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		b.bar = progressbar.NewOptions(total,
			progressbar.OptionSetWriter(out),
			progressbar.OptionSetDescription(title),
			progressbar.OptionShowCount(),
			progressbar.OptionSetElapsedTime(true),
			progressbar.OptionSetPredictTime(false),
			progressbar.OptionFullWidth(),
			progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionOnCompletion(func() { fmt.Fprintln(out) }),
		)
	} else {
		fmt.Fprintf(out, "%s (%d steps)\n", title, total)
	}
	return b
}

// Step starts the next step.
func (b *Bar) Step(name string) {
	b.step = name
	if b.bar != nil {
		b.bar.Describe(fmt.Sprintf("[%d/%d] %s", b.done+1, b.total, name))
		return
	}
	fmt.Fprintf(b.out, "[%d/%d] %s\n", b.done+1, b.total, name)
}

// Detail shows what the current step is doing (throttled in plain mode).
func (b *Bar) Detail(line string) {
	line = strings.TrimSpace(line)
	if line == "" {
		return
	}
	if b.bar != nil {
		if len(line) > 60 {
			line = line[:60]
		}
		b.bar.Describe(fmt.Sprintf("[%d/%d] %s: %s", b.done+1, b.total, b.step, line))
		return
	}
	if time.Since(b.last) > 2*time.Second {
		b.last = time.Now()
		fmt.Fprintf(b.out, "      %s\n", line)
	}
}

// StepDone finishes the current step with a result note.
func (b *Bar) StepDone(note string) {
	b.done++
	if b.bar != nil {
		b.bar.Add(1)
		return
	}
	fmt.Fprintf(b.out, "      %s: %s\n", b.step, note)
}

// Writer returns an io.Writer whose lines become Detail calls.
func (b *Bar) Writer() io.Writer { return detailWriter{b} }

type detailWriter struct{ b *Bar }

func (w detailWriter) Write(p []byte) (int, error) {
	for _, l := range strings.Split(string(p), "\n") {
		w.b.Detail(l)
	}
	return len(p), nil
}
