package engine

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/runtime"
)

// Memory admission.
//
// Every new instance (a create, a fork's child, a rollback, a resume from
// hibernation) is admitted against the memory the host really has: its
// MemAvailable, less the floor the operator keeps for the host
// (Config.MemoryReserve, `--memory-floor`), less what the launches admitted
// before it will still take. What a launch takes is known before it
// starts: every restore loads its image's whole memory into a private copy
// (nothing is shared between fork children: docs/engine.md, "Limits"), so
// it takes the image's memory (imageMemory: the checkpoint's pages file)
// plus the instance's own (Config.InstanceOverhead: sentry, gofer, stubs).
//
// An admitted launch holds its figure in the ledger from its admission
// until its memory shows up in MemAvailable: all of it while it launches;
// once launched, the instance's own processes exist and only its image's
// memory may still be loading (a large image loads in the background after
// the restore returned), so the hold shrinks to that and goes once the
// instance's memory, read from the host side (runtime.StatsReader), covers
// it, or the instance is gone (settleMax at the latest). So launches
// admitted together, or one after another while the first still load,
// never pass on the same free memory.
//
// A fork admits its children together once the source is captured (its
// image's size is then known): the first that fit are admitted, each with
// its hold; the rest are refused at once, each with its own error naming
// memory (admitChildren).

// DefaultInstanceOverhead is the memory a gVisor sandbox holds beyond its
// image's (the sentry's own, the gofer, the stubs of its processes): an
// idle `base` sandbox costs ~23 MB of MemAvailable in all
// (docs/benchmarks.md, "Density").
const DefaultInstanceOverhead int64 = 24 << 20

// settleMax is how long a launched instance's hold waits at most for its
// memory to show. Background loads are slow when many run at once
// (measured: 17 children of a 1 GiB image loaded at ~100 MB/s in all,
// their memory arriving for three minutes after their fork answered: a
// hold that assumed 100 MiB/s per child went after 10 s, and the next
// fork was admitted on memory they were about to take). Only an instance
// whose memory never shows (a runtime without stats) waits this long.
const settleMax = 5 * time.Minute

// memory is the engine's view of the host's memory: the floor, the
// ledger of admitted launches, and (pressure.go) the sandboxes' activity
// and the relief of pressure.
type memory struct {
	read     func() (int64, error)
	floor    atomic.Int64 // bytes of MemAvailable kept for the host; negative: no admission, no relief
	overhead int64        // memory of an instance beyond its image's
	margin   int64        // relief stops at floor + margin

	mu    sync.Mutex
	holds map[*memHold]struct{}
	pre   map[string]*memHold // admitted with their fork, by child sandbox ID

	act      activity
	hist     history      // resource samples per sandbox (history.go)
	stuckLog atomic.Int64 // reliefs that found nothing left to hibernate (pressure.go)
	// relieved are called after each sandbox the relief hibernated.
	relievedMu sync.Mutex
	relieved   []func(Sandbox, string)
}

// memHold is the memory one admitted launch still takes.
type memHold struct {
	bytes int64
	image int64 // of bytes, the image's memory (what may load after the launch)
	// Set once launched: the hold shrinks as the instance's own memory
	// (shown) grows, and goes at settleBy at the latest.
	instance string
	settleBy time.Time
	shown    int64
}

func (h *memHold) outstanding() int64 { return max(0, h.bytes-h.shown) }

func newMemory(cfg Config) *memory {
	m := &memory{read: cfg.MemAvailable, overhead: cfg.InstanceOverhead, margin: cfg.MemoryMargin,
		holds: map[*memHold]struct{}{}, pre: map[string]*memHold{}}
	if m.read == nil {
		m.read = MemAvailable
	}
	floor := cfg.MemoryReserve
	if floor == 0 {
		floor = DefaultMemoryReserve
	}
	m.floor.Store(floor)
	if m.overhead == 0 {
		m.overhead = DefaultInstanceOverhead
	}
	m.overhead = max(m.overhead, 0)
	if m.margin <= 0 {
		m.margin = defaultMargin(floor)
	}
	m.act.last = map[string]uint64{}
	m.hist.per = map[string]*ring{}
	m.act.cpu = map[string]time.Duration{}
	return m
}

// SetMemoryFloor changes the memory floor (bytes of MemAvailable kept for
// the host) of a running engine: admissions and the pressure relief use it
// from the next call on. Negative turns both off; 0 is the default.
func (e *Engine) SetMemoryFloor(bytes int64) {
	if bytes == 0 {
		bytes = DefaultMemoryReserve
	}
	e.mem.floor.Store(bytes)
	e.log.Info("memory floor set", "floor_mib", bytes>>20)
}

// MemoryFree is the memory the host has for new instances now, in bytes:
// MemAvailable less the floor and less what admitted launches still take
// (negative when under the floor). ok is false when the engine admits by
// nothing (no floor) or cannot read the host's memory.
func (e *Engine) MemoryFree(ctx context.Context) (free int64, ok bool) {
	floor := e.mem.floor.Load()
	if floor < 0 {
		return 0, false
	}
	e.refreshHolds(ctx)
	m := e.mem
	m.mu.Lock()
	defer m.mu.Unlock()
	avail, err := m.read()
	if err != nil {
		return 0, false
	}
	return avail - floor - m.heldLocked(time.Now()), true
}

// heldLocked sums what admitted launches still take, dropping the holds
// past their settle time. Callers hold m.mu.
func (m *memory) heldLocked(now time.Time) int64 {
	var n int64
	for h := range m.holds {
		if h.instance != "" && now.After(h.settleBy) {
			delete(m.holds, h)
			continue
		}
		n += h.outstanding()
	}
	return n
}

// room is what the host has above its floor for new launches: its
// MemAvailable less the floor and the holds. Callers hold m.mu.
func (m *memory) roomLocked() (room, avail, held int64, err error) {
	avail, err = m.read()
	if err != nil {
		return 0, 0, 0, err
	}
	held = m.heldLocked(time.Now())
	return avail - m.floor.Load() - held, avail, held, nil
}

// refusal is the error for what, taking need bytes, that does not fit.
func (m *memory) refusal(what string, need, avail, held int64) error {
	return fmt.Errorf("not enough host memory: %s takes ~%d MiB (its image's memory and the sandbox's own), "+
		"and MemAvailable is %d MiB, of which %d MiB are the floor kept for the host and %d MiB are held for launches in flight; "+
		"hibernate or kill sandboxes, or add hosts: %w",
		what, mib(need), mib(avail), mib(m.floor.Load()), mib(held), errdefs.ErrResourceLimit)
}

func mib(b int64) int64 { return b >> 20 }

// reserve admits need bytes for what, holding them until settled. A nil
// hold with a nil error means "admitted, nothing held" (no floor, or the
// host's memory could not be read: admitted, as the check cannot tell).
func (e *Engine) reserve(ctx context.Context, need, image int64, what string) (*memHold, error) {
	m := e.mem
	if m.floor.Load() < 0 {
		return nil, nil
	}
	e.refreshHolds(ctx)
	m.mu.Lock()
	defer m.mu.Unlock()
	room, avail, held, err := m.roomLocked()
	if err != nil {
		e.log.Warn("read available memory; admitting", "err", err)
		return nil, nil
	}
	if need > room {
		return nil, m.refusal(what, need, avail, held)
	}
	h := &memHold{bytes: need, image: image}
	m.holds[h] = struct{}{}
	return h, nil
}

// checkRoom refuses when the host has less than need above its floor,
// holding nothing (a restore target's boot, a fork before its capture).
func (e *Engine) checkRoom(ctx context.Context, need int64, what string) error {
	h, err := e.reserve(ctx, need, 0, what)
	e.settle(h, "", false)
	if errors.Is(err, errdefs.ErrResourceLimit) {
		e.refusals.memory.Add(1)
	}
	return err
}

// refusalCounts are the launches the engine refused, by what the host
// lacked (Refusals).
type refusalCounts struct{ memory, tasks atomic.Int64 }

// Refusals are the launches (creates, restores, fork children, restore
// targets) this engine refused since it started: for memory (below the
// floor) and for the host's task table.
func (e *Engine) Refusals() (memory, tasks int64) {
	return e.refusals.memory.Load(), e.refusals.tasks.Load()
}

// admitLaunch admits the launch of sandbox's new instance from image (""
// for a boot): a fork's child takes the hold its fork admitted it with;
// anything else is admitted now, after the restore targets a burst added
// were freed if they held what it lacks. It also checks the host's task
// table.
func (e *Engine) admitLaunch(ctx context.Context, sandbox, image string) (*memHold, error) {
	m := e.mem
	m.mu.Lock()
	h, ok := m.pre[sandbox]
	delete(m.pre, sandbox)
	m.mu.Unlock()
	if ok {
		return h, nil
	}
	if err := e.admitTasks(); err != nil {
		return nil, err
	}
	need, img := e.launchNeed(image)
	const what = "the new instance" // the callers name the sandbox
	h, err := e.reserve(ctx, need, img, what)
	if errors.Is(err, errdefs.ErrResourceLimit) && e.freeBurstTargets() > 0 {
		h, err = e.reserve(ctx, need, img, what) // the targets a burst added were holding what it lacked
	}
	if errors.Is(err, errdefs.ErrResourceLimit) {
		e.refusals.memory.Add(1)
	}
	return h, err
}

// settle ends a hold's launch: a failed one gives its memory back at once;
// a launched one keeps holding its image's memory until the instance's
// memory shows it (refreshHolds) or its settle time passes.
func (e *Engine) settle(h *memHold, instance string, launched bool) {
	if h == nil {
		return
	}
	m := e.mem
	m.mu.Lock()
	defer m.mu.Unlock()
	if !launched || instance == "" {
		delete(m.holds, h)
		return
	}
	h.instance, h.bytes = instance, h.image
	h.settleBy = time.Now().Add(settleMax)
}

// refreshHolds shrinks the holds of launched instances by the memory each
// instance shows now (read from the host side, outside the ledger's lock),
// and drops those covered or whose instance is gone.
func (e *Engine) refreshHolds(ctx context.Context) {
	sr, ok := e.rt.(runtime.StatsReader)
	if !ok {
		return
	}
	m := e.mem
	m.mu.Lock()
	var launched []*memHold
	for h := range m.holds {
		if h.instance != "" {
			launched = append(launched, h)
		}
	}
	m.mu.Unlock()
	for _, h := range launched {
		sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		st, err := sr.Stats(sctx, h.instance)
		cancel()
		m.mu.Lock()
		switch {
		case errdefs.IsNotFound(err):
			delete(m.holds, h)
		case err == nil:
			h.shown = st.MemoryBytes
			if h.outstanding() == 0 {
				delete(m.holds, h)
			}
		}
		m.mu.Unlock()
	}
}

// launchNeed is what launching an instance from image takes (need: the
// image's memory and the instance's own) and, of that, the image's.
func (e *Engine) launchNeed(image string) (need, img int64) {
	if image != "" {
		img = imageMemory(image)
	}
	return img + e.mem.overhead, img
}

// imageMemory is the guest memory a restore of the image in dir loads:
// the size of its pages file (gVisor's pages.img; a restore copies all of
// it into the instance's memory file), or, for an image without one, of
// all its files.
func imageMemory(dir string) int64 {
	if fi, err := os.Stat(filepath.Join(dir, "pages.img")); err == nil {
		return fi.Size()
	}
	var n int64
	filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}

// forkRoom is the admission of a fork's children.
type forkRoom struct {
	e        *Engine
	admitted map[string]bool // child sandbox ID -> admitted (with a hold in the ledger's pre)
	each     int64           // what a child takes
	image    int64           // of each, its image's memory
	fit      int             // how many were admitted
	asked    int             // how many needed a restore (the others are replays)
	total    int             // how many the fork names
	err      error           // why the others were refused (nil when all fit)
}

// admitChildren admits the children of a fork of source whose image is
// img: those in specs that do not exist yet (the others are replays and
// take nothing), in order, as many as the host's room holds. Each
// admitted child's hold waits in the ledger for its launch; release drops
// the holds no launch took.
func (e *Engine) admitChildren(ctx context.Context, source, img string, specs []ForkChildSpec) *forkRoom {
	r := &forkRoom{e: e, admitted: map[string]bool{}, total: len(specs)}
	r.each, r.image = e.launchNeed(img)
	var want []string
	for _, s := range specs {
		if _, err := e.load(s.ID); err != nil {
			want = append(want, s.ID)
		}
	}
	r.asked = len(want)
	m := e.mem
	if m.floor.Load() < 0 || len(want) == 0 {
		for _, id := range want {
			r.admitted[id] = true
		}
		r.fit = len(want)
		return r
	}
	if err := e.admitTasks(); err != nil {
		r.err = err
		return r
	}
	e.refreshHolds(ctx)
	m.mu.Lock()
	defer m.mu.Unlock()
	room, avail, held, err := m.roomLocked()
	if err != nil {
		e.log.Warn("read available memory; admitting", "err", err)
		room = int64(len(want)) * r.each
	}
	for _, id := range want {
		if room < r.each {
			break
		}
		room -= r.each
		h := &memHold{bytes: r.each, image: r.image}
		m.holds[h] = struct{}{}
		m.pre[id] = h
		r.admitted[id] = true
		r.fit++
	}
	if r.fit < len(want) {
		e.refusals.memory.Add(int64(len(want) - r.fit))
		r.err = fmt.Errorf("fork of %s: %d of %d children fit: %w", source, r.fit, len(want),
			m.refusal("each child", r.each, avail, held))
		e.log.Warn("fork trimmed to the host's memory", "sandbox_id", source, "children", len(want), "admitted", r.fit,
			"each_mib", mib(r.each), "mem_available_mib", mib(avail), "floor_mib", mib(m.floor.Load()), "held_mib", mib(held))
	}
	return r
}

// refused is the error for child id, or nil when it was admitted (or is
// a replay).
func (r *forkRoom) refused(id string) error {
	if r.admitted[id] || r.err == nil {
		return nil
	}
	if _, err := r.e.load(id); err == nil {
		return nil // a replay: it exists
	}
	return fmt.Errorf("sandbox %s: %w", id, r.err)
}

// none says whether the fork fails as a whole: every child needed a
// restore and none fit.
func (r *forkRoom) none() bool { return r.asked == r.total && r.fit == 0 && r.err != nil }

// release drops the holds of admitted children whose launch never took
// them (they failed before).
func (r *forkRoom) release() {
	m := r.e.mem
	m.mu.Lock()
	defer m.mu.Unlock()
	for id := range r.admitted {
		if h, ok := m.pre[id]; ok {
			delete(m.pre, id)
			delete(m.holds, h)
		}
	}
}

// forkSpecs names every child of a fork: the caller's names, or new IDs.
func forkSpecs(opts ForkOptions) []ForkChildSpec {
	if len(opts.Children) > 0 {
		return opts.Children
	}
	specs := make([]ForkChildSpec, opts.Count)
	for i := range specs {
		specs[i].ID = ids.New('i')
	}
	return specs
}
