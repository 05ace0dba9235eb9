package engine

import (
	"context"
	"fmt"
	goruntime "runtime"
	"sort"
	"sync"
	"time"

	"github.com/spore-run/spore/internal/runtime"
)

// Memory pressure relief.
//
// Admission (admission.go) keeps new instances above the memory floor, but
// the sandboxes already running grow. When the host's MemAvailable falls
// under the floor, RelievePressure hibernates the coldest sandboxes, one
// at a time, until MemAvailable is back above the floor plus a margin:
// their memory goes to disk (their state is kept whole, and a connect
// resumes them) before the host thrashes or its OOM killer picks a
// sandbox's kernel. The node runs it every 250 ms (node.Config
// .MemoryPressureEvery).
//
// Coldest means least recently active. Activity is what the engine can
// measure for every sandbox: an operation that launched it or ran a
// command in it through the engine (touch), and its CPU time read from the
// host side (runtime.StatsReader): a sandbox whose CPU time grew by at
// least activeCPU of the time between two samples (SampleActivity, every
// few seconds) was active in between. Traffic through the proxy runs
// processes in the sandbox, so it shows as CPU. Recency is a sequence
// number, not a clock, so the order is exact. Sandboxes not seen active
// since the engine started rank first, oldest first.

// activeCPU is the share of a core a sandbox must have used between two
// samples to count as active then. An idle sandbox uses none (measured:
// 0 ns of CPU in 4 s), but its daemon's OOM watchdog polls more often as
// its memory nears its limit, ~1.7 ms of host CPU per poll: ~0.5 % of a
// core for a sandbox holding half its limit (envd/oomwatch), 2 % only
// within ~85 MiB of the watchdog's threshold. A command costs ~20 ms
// (an `echo` through runsc exec), a code cell far more.
const activeCPU = 0.02

// defaultMargin is how far above the floor the relief brings MemAvailable
// back by default: a quarter of the floor, at least 256 MiB, so that one
// relief is not followed at once by the next.
func defaultMargin(floor int64) int64 { return max(256<<20, floor/4) }

// activity is when each sandbox was last active, as a sequence number.
type activity struct {
	mu   sync.Mutex
	seq  uint64
	last map[string]uint64        // sandbox ID -> sequence of its last activity
	cpu  map[string]time.Duration // instance -> CPU time at the last sample
	at   time.Time                // of the last sample
}

// touch notes that sandbox id was active now.
func (e *Engine) touch(id string) {
	a := &e.mem.act
	a.mu.Lock()
	a.seq++
	a.last[id] = a.seq
	a.mu.Unlock()
}

// launched ends the admission hold of a launch (admission.go) and, when
// the instance runs, counts the launch as the sandbox's activity.
func (e *Engine) launched(h *memHold, sandbox, instance string, ok bool) {
	e.settle(h, instance, ok)
	if ok {
		e.touch(sandbox)
	}
}

// SampleActivity reads every running sandbox's CPU time from the host side
// and marks those that used at least activeCPU since the last sample as
// active now; it keeps the samples' resource use as the sandboxes'
// history too (history.go). Runtimes that report no stats leave only the
// operations as activity, and no history.
func (e *Engine) SampleActivity(ctx context.Context) {
	sr, ok := e.rt.(runtime.StatsReader)
	if !ok {
		return
	}
	type inst struct {
		sandbox, instance string
		vcpus             float64
	}
	var running []inst
	e.mu.Lock()
	for _, r := range e.records {
		if r.State == StateRunning && r.Pending == nil && r.Instance != "" {
			vcpus := r.Run.Limits.VCPUs
			if vcpus <= 0 {
				vcpus = float64(goruntime.NumCPU()) // no limit: the host's
			}
			running = append(running, inst{r.ID, r.Instance, vcpus})
		}
	}
	ids := make(map[string]bool, len(e.records))
	for id := range e.records {
		ids[id] = true
	}
	e.mu.Unlock()
	e.mem.hist.prune(func(id string) bool { return ids[id] })
	sort.Slice(running, func(i, j int) bool { return running[i].sandbox < running[j].sandbox })
	a := &e.mem.act
	now := time.Now()
	a.mu.Lock()
	since := now.Sub(a.at)
	a.mu.Unlock()
	seen := make(map[string]time.Duration, len(running))
	for _, r := range running {
		sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		st, err := sr.Stats(sctx, r.instance)
		cancel()
		if err != nil {
			continue
		}
		seen[r.instance] = st.CPUUsage
		a.mu.Lock()
		prev, had := a.cpu[r.instance]
		a.mu.Unlock()
		if had && float64(st.CPUUsage-prev) >= activeCPU*float64(since) {
			e.touch(r.sandbox)
		}
		if had && since > 0 {
			hs := StatsSample{At: st.At, VCPUs: r.vcpus, MemoryBytes: st.MemoryBytes, MemoryLimit: st.MemoryLimit, DiskBytes: st.DiskBytes}
			if hs.At.IsZero() {
				hs.At = now
			}
			hs.CPUPct = min(100, max(0, 100*float64(st.CPUUsage-prev)/float64(since)/r.vcpus))
			e.mem.hist.record(r.sandbox, hs)
		}
	}
	a.mu.Lock()
	a.cpu, a.at = seen, now
	a.mu.Unlock()
}

// OnRelieved registers fn to be called with each sandbox the pressure
// relief hibernated (after its record is saved) and the figures that made
// it (the reason is PressureReason): the node reports it to the control
// plane, which records the hibernation.
func (e *Engine) OnRelieved(fn func(sb Sandbox, detail string)) {
	m := e.mem
	m.relievedMu.Lock()
	m.relieved = append(m.relieved, fn)
	m.relievedMu.Unlock()
}

// coldest lists the sandboxes the relief may hibernate (running or
// paused, no operation in flight), least recently active first.
func (e *Engine) coldest() []Sandbox {
	var out []Sandbox
	e.mu.Lock()
	for _, r := range e.records {
		if (r.State == StateRunning || r.State == StatePaused) && r.Pending == nil && r.Instance != "" {
			out = append(out, r.view())
		}
	}
	e.mu.Unlock()
	a := &e.mem.act
	a.mu.Lock()
	last := make(map[string]uint64, len(out))
	for _, sb := range out {
		last[sb.ID] = a.last[sb.ID]
	}
	a.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if li, lj := last[out[i].ID], last[out[j].ID]; li != lj {
			return li < lj
		}
		if !out[i].CreatedAt.Equal(out[j].CreatedAt) {
			return out[i].CreatedAt.Before(out[j].CreatedAt)
		}
		return out[i].ID < out[j].ID
	})
	return out
}

// Coldest lists the IDs of the sandboxes the pressure relief may
// hibernate, in the order it would (least recently active first).
func (e *Engine) Coldest() []string {
	var ids []string
	for _, sb := range e.coldest() {
		ids = append(ids, sb.ID)
	}
	return ids
}

// PressureReason is the reason the relief gives for its hibernations.
const PressureReason = "memory-pressure"

// RelievePressure hibernates the coldest sandboxes, one at a time, while
// the host's MemAvailable is under the floor, until it is back above the
// floor plus the margin (or nothing is left to hibernate). It returns the
// sandboxes it hibernated, in order. Each is logged with the reason and
// the figures, and reported to OnRelieved's functions.
func (e *Engine) RelievePressure(ctx context.Context) []string {
	m := e.mem
	floor := m.floor.Load()
	if floor < 0 {
		return nil
	}
	avail, err := m.read()
	if err != nil || avail >= floor {
		return nil
	}
	target := floor + m.margin
	var done []string
	for _, sb := range e.coldest() {
		if avail >= target || ctx.Err() != nil {
			break
		}
		e.log.Warn("memory pressure: hibernating the coldest sandbox", "sandbox_id", sb.ID, "reason", PressureReason,
			"mem_available_mib", mib(avail), "floor_mib", mib(floor), "target_mib", mib(target), "state", sb.State)
		hctx, cancel := context.WithTimeout(ctx, reliefTimeout)
		err := e.Hibernate(hctx, sb.ID)
		cancel()
		if err != nil {
			e.log.Warn("memory pressure: hibernation failed; trying the next", "sandbox_id", sb.ID, "err", err)
			continue
		}
		done = append(done, sb.ID)
		e.relievedOne(ctx, sb.ID, fmt.Sprintf("host MemAvailable %d MiB under the memory floor %d MiB: hibernated as the least recently active sandbox",
			mib(avail), mib(floor)))
		if avail, err = m.read(); err != nil {
			break
		}
	}
	if avail < floor && ctx.Err() == nil && m.stuckLog.Add(1)%stuckLogEvery == 1 {
		e.log.Error("memory pressure: MemAvailable still under the floor with nothing left to hibernate",
			"mem_available_mib", mib(avail), "floor_mib", mib(floor), "hibernated", len(done))
	}
	return done
}

// reliefTimeout bounds one hibernation of the relief (the sandbox's lock
// included: an operation in flight on it is waited for): a large sandbox
// writes its whole memory to disk.
const reliefTimeout = 5 * time.Minute

// stuckLogEvery: while nothing is left to hibernate under the floor, one
// relief in this many logs it (every ~minute at 250 ms).
const stuckLogEvery = 240

// relievedOne reports one hibernation of the relief to OnRelieved's
// functions.
func (e *Engine) relievedOne(ctx context.Context, id, detail string) {
	sb, err := e.Get(ctx, id)
	if err != nil {
		return // killed meanwhile
	}
	m := e.mem
	m.relievedMu.Lock()
	fns := append([]func(Sandbox, string){}, m.relieved...)
	m.relievedMu.Unlock()
	for _, fn := range fns {
		fn(sb, detail)
	}
}
