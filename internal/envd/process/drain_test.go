package process

import (
	"log/slog"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/envd/reaper"
)

// drainClock drives await's clock so the test does not depend on the
// host's scheduling (with real timers a loaded CI host delayed the pump
// past a whole interval: "ended while output still flowed"). Every drain
// interval is one tick; onTick runs just before the tick fires, standing
// for what the output pumps did during that interval. The limit fires
// once limitAt ticks have gone by (never when 0).
type drainClock struct {
	max     time.Duration
	ticks   int
	limitAt int
	onTick  func(tick int)
	limit   chan time.Time
}

func newDrainClock(max time.Duration, limitAt int, onTick func(int)) *drainClock {
	return &drainClock{max: max, limitAt: limitAt, onTick: onTick, limit: make(chan time.Time)}
}

func (c *drainClock) after(d time.Duration) <-chan time.Time {
	if d == c.max {
		return c.limit
	}
	c.ticks++
	c.onTick(c.ticks)
	if c.ticks == c.limitAt {
		close(c.limit)
	}
	fired := make(chan time.Time, 1)
	fired <- time.Time{}
	return fired
}

// awaitWith runs await for a process whose output pumps are simulated by
// onTick, and returns the clock once the end was set.
func awaitWith(t *testing.T, p *proc, limitAt int, onTick func(int)) *drainClock {
	t.Helper()
	s := &Service{drain: 30 * time.Millisecond, drainMax: time.Second, log: slog.New(slog.DiscardHandler), procs: map[int]*proc{}}
	c := newDrainClock(s.drainMax, limitAt, onTick)
	s.after = c.after
	exited := make(chan reaper.Exit, 1)
	exited <- reaper.Exit{}
	s.await(p, exited)
	if p.end == nil {
		t.Fatal("await returned without an end")
	}
	return c
}

func newProc() *proc {
	return &proc{done: make(chan struct{}), subs: map[*subscriber]struct{}{}}
}

// The end of a process is sent only after its output stopped flowing:
// output still coming in after one drain interval is waited for (before,
// the end went out 200 ms after the exit, over truncated output: 64 KiB
// lost under load, a clean end), up to drainMax for a writer that never
// stops (a background child).
func TestEndWaitsForOutputStillFlowing(t *testing.T) {
	t.Run("flowing then done", func(t *testing.T) {
		p := newProc()
		p.outputs.Add(1)
		c := awaitWith(t, p, 1000, func(tick int) {
			switch {
			case tick < 20:
				p.progress.Add(1)
			case tick == 20:
				p.progress.Add(1)
				p.outputs.Done()
			}
		})
		if got := p.progress.Load(); got != 20 {
			t.Fatalf("the end was set after %d of the 20 reads: output was still flowing", got)
		}
		if c.ticks > 21 {
			t.Fatalf("waited %d intervals after the output was done", c.ticks)
		}
	})
	t.Run("quiet with the pipes held open", func(t *testing.T) {
		p := newProc()
		p.outputs.Add(1) // a background child holds the pipes and writes nothing
		defer p.outputs.Done()
		c := awaitWith(t, p, 1000, func(int) {})
		if c.ticks != 1 {
			t.Fatalf("ended after %d intervals of no output, want 1", c.ticks)
		}
	})
	t.Run("a publish in progress", func(t *testing.T) {
		p := newProc()
		p.outputs.Add(1)
		defer p.outputs.Done()
		p.publishing.Add(1) // a slow subscriber: no progress counted while it takes
		c := awaitWith(t, p, 1000, func(tick int) {
			if tick == 5 { // as the pump does: the publish ends, a step of progress
				p.publishing.Add(-1)
				p.progress.Add(1)
			}
		})
		if c.ticks != 6 {
			t.Fatalf("ended after %d intervals, want 6 (the publish ended in the 5th)", c.ticks)
		}
	})
	t.Run("flowing for ever", func(t *testing.T) {
		p := newProc()
		p.outputs.Add(1)
		defer p.outputs.Done()
		c := awaitWith(t, p, 50, func(int) { p.progress.Add(1) })
		if c.ticks < 50 {
			t.Fatalf("ended after %d intervals, before drainMax (50), while output still flowed", c.ticks)
		}
	})
}
