package engine

import (
	"context"
	"runtime"
	"sync"
)

// Fair launches.
//
// A launch (the boot or restore of a new instance: the CPU- and I/O-heavy
// part of a create, a fork child, a resume from hibernation, a rollback)
// runs holding one of the engine's launch slots (Config.Launches). The
// launches waiting for one queue per team (the team the call acts for,
// tenant.Of: the control plane sends it with each node call); when a slot
// frees, it goes to the waiting team with the fewest launches running,
// and between those to the one served longest ago; within a team, first
// come first served. One team's burst (two forks of 100, each launching
// four children at a time) fills the slots only while no other team
// waits: another team's create waits for one launch to end, not for the
// burst, and then runs beside at most Launches-1 others instead of beside
// every launch of the burst. Launches of no team (pool fills, template
// builds) queue as a team of their own.
//
// The slots bound what runs at once; the memory admission (admission.go)
// still decides what may run at all, and is asked once the slot is held,
// so a launch waiting for a slot holds no memory.

// DefaultLaunches is the launch slots of an engine whose Config.Launches
// is 0: twice the host's CPUs, at least 4 (a restore spends part of its
// time waiting on the disk and on runsc's own processes, and one fork
// launches 4 children at a time: one fork alone is never slowed).
func DefaultLaunches() int { return max(4, 2*runtime.NumCPU()) }

// launchSlots is the slots of Config.Launches n.
func launchSlots(n int) int {
	switch {
	case n == 0:
		return DefaultLaunches()
	case n < 0:
		return 0
	}
	return n
}

// LaunchLoad is what the launch slots hold now (Slots 0: no bound).
func (e *Engine) LaunchLoad() LaunchLoad { return e.gate.load() }

type launchGate struct {
	mu      sync.Mutex
	slots   int // 0: no gate
	running int
	queued  int
	teams   map[string]*teamLaunches
	served  uint64 // a clock: bumped at each grant
	arrived uint64 // a clock: bumped at each wait
}

// teamLaunches is one team's running and waiting launches.
type teamLaunches struct {
	running int
	waiting []*launchWaiter
	last    uint64 // the gate's clock when it was last granted a slot
}

type launchWaiter struct {
	ready   chan struct{}
	granted bool
	seq     uint64 // arrival order
}

func newLaunchGate(slots int) *launchGate {
	if slots < 0 {
		slots = 0
	}
	return &launchGate{slots: slots, teams: map[string]*teamLaunches{}}
}

// acquire waits for a launch slot for team, and returns what gives it
// back. With no gate it returns at once. Canceling ctx ends the wait
// (ctx's error; no slot is held).
func (g *launchGate) acquire(ctx context.Context, team string) (release func(), err error) {
	if g.slots == 0 {
		return func() {}, nil
	}
	g.mu.Lock()
	t := g.teams[team]
	if t == nil {
		t = &teamLaunches{}
		g.teams[team] = t
	}
	if g.running < g.slots && g.queued == 0 {
		g.grantLocked(t)
		g.mu.Unlock()
		return g.releaser(team), nil
	}
	g.arrived++
	w := &launchWaiter{ready: make(chan struct{}), seq: g.arrived}
	t.waiting = append(t.waiting, w)
	g.queued++
	g.mu.Unlock()
	select {
	case <-w.ready:
		return g.releaser(team), nil
	case <-ctx.Done():
		g.mu.Lock()
		if w.granted { // granted as ctx ended: give it on
			g.mu.Unlock()
			g.releaser(team)()
			return nil, ctx.Err()
		}
		for i, x := range t.waiting {
			if x == w {
				t.waiting = append(t.waiting[:i:i], t.waiting[i+1:]...)
				break
			}
		}
		g.queued--
		g.dropLocked(team, t)
		g.mu.Unlock()
		return nil, ctx.Err()
	}
}

// grantLocked gives t a slot.
func (g *launchGate) grantLocked(t *teamLaunches) {
	g.running++
	t.running++
	g.served++
	t.last = g.served
}

func (g *launchGate) releaser(team string) func() {
	var once sync.Once
	return func() { once.Do(func() { g.release(team) }) }
}

func (g *launchGate) release(team string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.running--
	if t := g.teams[team]; t != nil {
		t.running--
		g.dropLocked(team, t)
	}
	for g.running < g.slots && g.queued > 0 {
		next := g.nextLocked()
		w := next.waiting[0]
		next.waiting = next.waiting[1:]
		g.queued--
		g.grantLocked(next)
		w.granted = true
		close(w.ready)
	}
}

// nextLocked is the waiting team the next slot goes to: the fewest
// running, then the longest since it was served, then the one waiting
// longest. Teams are few (those with launches in flight on this host), so
// a scan costs nothing.
func (g *launchGate) nextLocked() *teamLaunches {
	var best *teamLaunches
	for _, t := range g.teams {
		if len(t.waiting) > 0 && (best == nil || t.before(best)) {
			best = t
		}
	}
	return best
}

func (t *teamLaunches) before(u *teamLaunches) bool {
	if t.running != u.running {
		return t.running < u.running
	}
	if t.last != u.last {
		return t.last < u.last
	}
	return t.waiting[0].seq < u.waiting[0].seq
}

// dropLocked forgets a team with nothing running or waiting.
func (g *launchGate) dropLocked(team string, t *teamLaunches) {
	if t.running == 0 && len(t.waiting) == 0 {
		delete(g.teams, team)
	}
}

// LaunchLoad is what an engine's launch slots hold now.
type LaunchLoad struct {
	Slots   int // 0: no gate
	Running int
	Queued  int
}

func (g *launchGate) load() LaunchLoad {
	g.mu.Lock()
	defer g.mu.Unlock()
	return LaunchLoad{Slots: g.slots, Running: g.running, Queued: g.queued}
}
