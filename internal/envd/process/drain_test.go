package process

import (
	"log/slog"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/envd/reaper"
)

// slowPump stands for an output pump still passing on what a process
// wrote before it exited, on a loaded host: it makes progress every step
// for steps, then ends (forever: it never ends on its own).
func slowPump(p *proc, step time.Duration, steps int, forever bool, stop <-chan struct{}) {
	p.outputs.Add(1)
	go func() {
		defer p.outputs.Done()
		for i := 0; forever || i < steps; i++ {
			select {
			case <-stop:
				return
			case <-time.After(step):
			}
			p.progress.Add(1)
		}
	}()
}

// The end of a process is sent only after its output stopped flowing:
// output still coming in after one drain interval is waited for (before,
// the end went out 200 ms after the exit, over truncated output: 64 KiB
// lost under load, a clean end), up to drainMax for a writer that never
// stops (a background child).
func TestEndWaitsForOutputStillFlowing(t *testing.T) {
	s := &Service{drain: 30 * time.Millisecond, drainMax: time.Second, log: slog.New(slog.DiscardHandler), procs: map[int]*proc{}}
	p := &proc{done: make(chan struct{}), subs: map[*subscriber]struct{}{}}
	slowPump(p, 10*time.Millisecond, 20, false, nil) // 200 ms of output, > 6 intervals
	exited := make(chan reaper.Exit, 1)
	exited <- reaper.Exit{}
	s.await(p, exited)
	if got := p.progress.Load(); got != 20 {
		t.Fatalf("the end was set after %d of the 20 reads: output was still flowing", got)
	}

	q := &proc{done: make(chan struct{}), subs: map[*subscriber]struct{}{}}
	stop := make(chan struct{})
	defer close(stop)
	slowPump(q, 10*time.Millisecond, 0, true, stop)
	exited <- reaper.Exit{}
	start := time.Now()
	s.await(q, exited)
	if q.end == nil {
		t.Fatal("no end for a process whose background child writes for ever")
	}
	if waited := time.Since(start); waited < s.drainMax {
		t.Fatalf("ended after %v, before drainMax %v, while output still flowed", waited, s.drainMax)
	}
}
