package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/netns"
	"github.com/spore-run/spore/internal/runtime"
	"github.com/spore-run/spore/internal/snapshot"
	"github.com/spore-run/spore/internal/timing"
)

// Restore targets: instances pre-created ahead of time (runtime.Precreator)
// with their networks, waiting for an image. A restore (a create from a
// template or a snapshot, a rollback, a resume from hibernation, a fork's
// child) that finds one of its shape loads its image into it, and so pays
// neither the sandbox's boot nor the network's setup: both were paid off
// the request's path, while the host was idle.
//
// A target is keyed by its shape (runtime.RestoreShape): the root
// filesystem, mounts, limits and process the runtime fixes at creation. A shape gets targets once a
// restore has asked for it; the engine keeps targets for the
// maxTargetShapes shapes asked for last and drops the others' targets.
//
// A shape that sees a burst of restores (a fork's children, creates that
// overlap) keeps as many targets as the burst had restores, up to the
// pool's burst, so that the next burst of that size pays only the images'
// loads; after the pool's idle time (Config.TargetBurstIdle) without a
// restore of the shape it goes back to per. The extra targets are made
// only while the engine is quiet (targetQuiet). A target costs ~20 MB of
// memory while it waits; each is admitted like a sandbox (Engine.admit)
// when it is made, and a launch the host refuses frees the extra ones
// first (freeBurstTargets).
//
// A target's instance ID is its own (it is named before any sandbox claims
// it): a sandbox's record names it like any instance, and its network is
// claimed for the sandbox (netns.Manager.Claim: its policy, and its egress
// audit journaled under the sandbox).
type targetPool struct {
	per   int           // targets kept per shape at rest
	burst int           // most kept for a shape after a burst of restores (≥ per)
	idle  time.Duration // a shape back to per after this long without a restore

	mu      sync.Mutex
	shapes  map[string]*targetShape
	claimed map[string]*target // by instance ID, between claim and launch
	closed  bool
	fill    sync.Mutex // one fill at a time: each costs a sandbox boot's CPU
	fills   sync.WaitGroup
}

// maxTargetShapes bounds the shapes targets are kept for: each target holds
// a booted sandbox (~20 MB) and a network slot.
const maxTargetShapes = 4

type targetShape struct {
	spec  runtime.Spec // runtime.RestoreShape's
	queue []*target    // ready or filling, oldest first
	used  time.Time
	// busy counts the restores of this shape in flight (claimTarget to
	// release), with or without a target.
	busy int
	// run counts the restores of the burst in flight: those claimed since
	// busy last rose from 0.
	run int
	// want is how many targets the shape keeps: per, or the size of its
	// largest burst up to the pool's burst until the shape goes idle.
	want int
	// idleGen tells a shrink timer whether a restore came after it was
	// armed.
	idleGen int
	shrink  *time.Timer
}

type target struct {
	id    string
	trees string        // treeIdent of its spec when it was made
	ready chan struct{} // closed once the fill ended; err says how
	err   error
	net   netns.Net // its network (when the engine has one)
	// netOnly: a reserved network (netpool.go), no pre-created instance.
	netOnly bool
	// extra: made beyond the shape's resting number, for a burst. Its
	// fill waits until the engine has been quiet for targetQuiet (a boot
	// takes CPU from whatever runs beside it), unless a restore claimed
	// it first.
	extra   bool
	started atomic.Bool // its fill got past the wait: the boot is under way
	claimed atomic.Bool
	// dropped: nobody will use it; a fill not yet begun makes nothing.
	dropped atomic.Bool
}

// errTargetDropped ends the fill of a target dropped before it began (the
// engine closing, its shape evicted or gone back to its resting number).
var errTargetDropped = errors.New("restore target dropped before it was made")

// targetQuiet is how long the engine must have run no operation before a
// burst's extra target is made.
const targetQuiet = 200 * time.Millisecond

// treeIdent identifies the directories a target's sandbox holds open from
// its creation: its root filesystem and mount sources. One made again at
// the same path (a template's root filesystem unpacked anew) is another
// tree, which a target made over the old one would not see.
func treeIdent(spec runtime.Spec) string {
	var b strings.Builder
	paths := []string{spec.RootFS}
	for _, m := range spec.Mounts {
		paths = append(paths, m.Source)
	}
	for _, p := range paths {
		var st unix.Stat_t
		if err := unix.Stat(p, &st); err != nil {
			b.WriteString("?;")
			continue
		}
		fmt.Fprintf(&b, "%d:%d;", st.Dev, st.Ino)
	}
	return b.String()
}

// DefaultTargetBurstIdle is how long a shape keeps the targets a burst
// grew it to after its last restore.
const DefaultTargetBurstIdle = 5 * time.Minute

func newTargetPool(per, burst int, idle time.Duration) *targetPool {
	if per <= 0 {
		return nil
	}
	if idle <= 0 {
		idle = DefaultTargetBurstIdle
	}
	return &targetPool{per: per, burst: max(per, burst), idle: idle, shapes: map[string]*targetShape{}, claimed: map[string]*target{}}
}

// shapeKey is what a target must match (runtime.RestoreShape).
func shapeKey(spec runtime.Spec) string {
	b, _ := json.Marshal(runtime.RestoreShape(spec))
	return string(b)
}

// claimTarget gives spec the ID of a target of its shape, when there is
// one (ready or still filling), else that of a reserved network
// (netpool.go), when there is one. The returned release, called when the
// operation ends, frees a claimed target or network that no launch took
// (the operation failed before it) and tops the pools up in the
// background.
//
// A sandbox with volumes gets no pre-created instance, and leaves none:
// a target holds its mount sources open from its creation, and one made
// with a volume behind a slot would keep the volume mounted (and its
// content undeletable) for as long as it waits.
func (e *Engine) claimTarget(spec *runtime.Spec, volumes []snapshot.VolumeMount) (release func()) {
	if len(volumes) > 0 {
		return e.claimNet(spec)
	}
	releaseTarget, ok := e.claimInstance(spec)
	if ok {
		return releaseTarget
	}
	releaseNet := e.claimNet(spec)
	return func() {
		releaseNet()
		releaseTarget()
	}
}

// claimInstance is claimTarget's pre-created instance: ok says spec got
// one.
func (e *Engine) claimInstance(spec *runtime.Spec) (release func(), ok bool) {
	p := e.targets
	if p == nil {
		return func() {}, false
	}
	if _, ok := e.rt.(runtime.Precreator); !ok {
		return func() {}, false
	}
	key, trees := shapeKey(*spec), treeIdent(*spec)
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return func() {}, false
	}
	sh := p.shapes[key]
	if sh == nil {
		sh = &targetShape{spec: runtime.RestoreShape(*spec), want: p.per}
		p.shapes[key] = sh
	}
	sh.used = time.Now()
	if sh.busy == 0 {
		sh.run = 0
	}
	sh.run++
	sh.idleGen++
	e.evictShapesLocked()
	// Targets made over a tree made again since are of no use.
	for i := 0; i < len(sh.queue); {
		if t := sh.queue[i]; t.trees != trees {
			sh.queue = slices.Delete(sh.queue, i, i+1)
			e.log.Info("restore target dropped: its root filesystem or a mount was made again since", "instance", t.id)
			e.dropTarget(t)
			continue
		}
		i++
	}
	// A ready target first. Else one still being made is worth waiting
	// for when this restore is its shape's only one: the boot is further
	// along than a new one would be. In a burst (a fork, concurrent
	// creates) the fills, one at a time, would serialize the restores that
	// wait for them: those boot their own, side by side. An extra target
	// whose boot has not begun (it waits for the engine to be quiet) is no
	// further along than a new one either.
	pick := slices.IndexFunc(sh.queue, isReady)
	if pick < 0 && sh.busy == 0 {
		pick = slices.IndexFunc(sh.queue, func(t *target) bool { return !t.extra || t.started.Load() })
	}
	var claimed *target
	if pick >= 0 {
		claimed = sh.queue[pick]
		sh.queue = slices.Delete(sh.queue, pick, pick+1)
		claimed.claimed.Store(true)
		p.claimed[claimed.id] = claimed
		spec.ID = claimed.id
	}
	sh.busy++
	p.mu.Unlock()
	return func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		sh.busy--
		if claimed != nil {
			if t, ok := p.claimed[claimed.id]; ok {
				delete(p.claimed, claimed.id)
				e.dropTarget(t)
			}
		}
		// Top up once the shape's restores are over: a fill is a
		// sandbox's boot, which would take CPU from the restores it is
		// meant to spare. A burst grows the shape's pool to its size.
		if !p.closed && p.shapes[key] == sh && sh.busy == 0 {
			sh.want = max(sh.want, min(sh.run, p.burst))
			e.topUpLocked(sh)
			if sh.want > p.per {
				e.armShrinkLocked(key, sh)
			}
		}
	}, claimed != nil
}

// isReady reports whether a target's fill has ended.
func isReady(t *target) bool {
	select {
	case <-t.ready:
		return true
	default:
		return false
	}
}

// RestoreTargets lists the instances kept as restore targets (made or
// being made), which no sandbox holds.
func (e *Engine) RestoreTargets() []string {
	p := e.targets
	if p == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for _, sh := range p.shapes {
		for _, t := range sh.queue {
			out = append(out, t.id)
		}
	}
	return out
}

// takeTarget hands launch the target it was claimed for, if instance is
// one.
func (e *Engine) takeTarget(instance string) *target {
	if e.targets == nil {
		return nil
	}
	return takeClaimed(&e.targets.mu, e.targets.claimed, instance)
}

// evictShapesLocked drops the targets of the shapes asked for least
// recently, beyond maxTargetShapes.
func (e *Engine) evictShapesLocked() {
	p := e.targets
	for len(p.shapes) > maxTargetShapes {
		var oldest string
		for k, sh := range p.shapes {
			if oldest == "" || sh.used.Before(p.shapes[oldest].used) {
				oldest = k
			}
		}
		for _, t := range p.shapes[oldest].queue {
			e.dropTarget(t)
		}
		if p.shapes[oldest].shrink != nil {
			p.shapes[oldest].shrink.Stop()
		}
		delete(p.shapes, oldest)
	}
}

// armShrinkLocked (re)starts the timer that takes a shape grown by a
// burst back to per targets once no restore of it came for the pool's idle
// time.
func (e *Engine) armShrinkLocked(key string, sh *targetShape) {
	p := e.targets
	gen := sh.idleGen
	if sh.shrink != nil {
		sh.shrink.Stop()
	}
	sh.shrink = time.AfterFunc(p.idle, func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.closed || p.shapes[key] != sh || sh.busy > 0 || sh.idleGen != gen {
			return // closed, evicted, or a restore came since: it re-arms
		}
		for _, t := range p.shrinkLocked(sh) {
			e.dropTarget(t)
		}
		e.log.Info("restore targets back to their resting number: no restore of their shape for a while", "targets", sh.want, "idle", p.idle)
	})
}

// shrinkLocked takes sh back to the resting number of targets and returns
// the ones beyond it (the newest), out of its queue, for the caller to free.
func (p *targetPool) shrinkLocked(sh *targetShape) []*target {
	sh.want = p.per
	var out []*target
	for len(sh.queue) > sh.want {
		out = append(out, sh.queue[len(sh.queue)-1])
		sh.queue = sh.queue[:len(sh.queue)-1]
	}
	return out
}

// freeBurstTargets takes every shape back to its resting number of targets
// at once, freeing the extra ones a burst added, and returns how many made
// targets it freed: a launch the host's memory (or task table) refused
// tries again with what they held.
func (e *Engine) freeBurstTargets() int {
	p := e.targets
	if p == nil {
		return 0
	}
	var extra []*target
	p.mu.Lock()
	for _, sh := range p.shapes {
		extra = append(extra, p.shrinkLocked(sh)...)
		if sh.shrink != nil {
			sh.shrink.Stop()
		}
	}
	p.mu.Unlock()
	freed := 0
	for _, t := range extra {
		t.dropped.Store(true)
		e.freeTarget(t) // waits for a fill under way
		if t.err == nil {
			freed++
		}
	}
	if len(extra) > 0 {
		e.log.Warn("host resources low: freed the restore targets bursts added", "targets", len(extra), "made", freed)
	}
	return freed
}

// topUpLocked starts fills until the shape has its targets.
func (e *Engine) topUpLocked(sh *targetShape) {
	p := e.targets
	for len(sh.queue) < sh.want {
		regular := 0
		for _, q := range sh.queue {
			if !q.extra {
				regular++
			}
		}
		t := &target{id: ids.New('p'), trees: treeIdent(sh.spec), ready: make(chan struct{}), extra: regular >= p.per}
		sh.queue = append(sh.queue, t)
		spec := sh.spec
		p.fills.Add(1)
		go func() {
			defer p.fills.Done()
			e.fillTarget(t, spec)
			if t.err != nil {
				if errors.Is(t.err, errTargetDropped) {
					return // no longer wanted: nothing to say, nothing was made
				}
				e.log.Warn("restore target not made: restores of its shape pay the sandbox's boot", "instance", t.id, "err", t.err)
				p.mu.Lock()
				for _, s := range p.shapes {
					for i, q := range s.queue {
						if q == t {
							s.queue = append(s.queue[:i:i], s.queue[i+1:]...)
							break
						}
					}
				}
				p.mu.Unlock()
			}
		}()
	}
}

// fillTarget pre-creates a target's instance and network; on failure
// nothing of it is left.
func (e *Engine) fillTarget(t *target, spec runtime.Spec) {
	defer close(t.ready)
	p := e.targets
	ctx := e.life
	for {
		if t.extra {
			if t.err = e.awaitQuiet(ctx, t); t.err != nil {
				return
			}
		}
		p.fill.Lock()
		if !t.extra || t.claimed.Load() || e.quietFor(targetQuiet) {
			break
		}
		p.fill.Unlock() // an operation came while it waited for the fill before it
	}
	defer p.fill.Unlock()
	if t.err = ctx.Err(); t.err != nil {
		return
	}
	if t.dropped.Load() {
		t.err = errTargetDropped
		return
	}
	t.started.Store(true)
	if t.err = e.admit(); t.err != nil {
		return
	}
	spec.ID = t.id
	if e.net != nil {
		// Nothing leaves it until a sandbox claims it with its policy.
		if t.net, t.err = e.net.Reserve(ctx, t.id); t.err != nil {
			return
		}
		spec.NetNS = t.net.NetNS
	}
	if t.err = e.rt.(runtime.Precreator).Precreate(ctx, spec); t.err != nil {
		cctx, cancel := cleanupCtx()
		defer cancel()
		_ = e.killInstance(cctx, t.id)
	}
}

// awaitQuiet waits until the engine has run no operation for targetQuiet,
// a restore has claimed t (it waits for t), or the engine closes.
func (e *Engine) awaitQuiet(ctx context.Context, t *target) error {
	for !t.claimed.Load() && !e.quietFor(targetQuiet) {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(targetQuiet / 10):
		}
		e.targets.mu.Lock()
		closed := e.targets.closed
		e.targets.mu.Unlock()
		if closed || t.dropped.Load() {
			return errTargetDropped
		}
	}
	return nil
}

// dropTarget frees a target nobody will use in the background.
func (e *Engine) dropTarget(t *target) {
	t.dropped.Store(true)
	e.background(func() { e.freeTarget(t) })
}

// freeTarget frees a target nobody will use, once its fill is over: its
// instance and network, or a reserved network alone.
func (e *Engine) freeTarget(t *target) {
	<-t.ready
	if t.err != nil {
		return
	}
	ctx, cancel := cleanupCtx()
	defer cancel()
	var err error
	if t.netOnly {
		err = e.net.Teardown(ctx, t.id)
	} else {
		err = e.killInstance(ctx, t.id)
	}
	if err != nil {
		e.log.Warn("free a restore target", "instance", t.id, "reserved_network", t.netOnly, "err", err)
	}
}

// takeClaimed removes and returns instance's entry of claimed, if any.
func takeClaimed(mu *sync.Mutex, claimed map[string]*target, instance string) *target {
	mu.Lock()
	defer mu.Unlock()
	t := claimed[instance]
	delete(claimed, instance)
	return t
}

// launchInto restores image into a claimed target: the network is the
// target's, given the sandbox's policy; the runtime loads the image into
// the instance it pre-created. On failure nothing of the target is left.
func (e *Engine) launchInto(ctx context.Context, sandbox string, t *target, spec runtime.Spec, image string, policy netns.Policy) (netip.Addr, error) {
	fail := func(err error) (netip.Addr, error) {
		cctx, cancel := cleanupCtx()
		defer cancel()
		if kerr := e.killInstance(cctx, t.id); kerr != nil {
			e.log.Warn("free a restore target", "instance", t.id, "err", kerr)
		}
		return netip.Addr{}, launchErr(err)
	}
	if e.net != nil {
		done := timing.Track(ctx, "net")
		err := e.net.Claim(ctx, t.id, sandbox, policy)
		done()
		if err != nil {
			return fail(err)
		}
		spec.NetNS = t.net.NetNS
	}
	done := timing.Track(ctx, "restore")
	err := e.rt.Restore(ctx, spec, image)
	done()
	if err != nil {
		return fail(err)
	}
	e.watch(sandbox, spec.ID)
	return t.net.Addr, nil
}

// closeTargets frees every target (Close): they hold booted sandboxes and
// network slots, and no later engine knows them (it would remove them as
// orphans).
func (e *Engine) closeTargets() {
	p := e.targets
	if p == nil {
		return
	}
	p.mu.Lock()
	p.closed = true
	var all []*target
	for _, sh := range p.shapes {
		all = append(all, sh.queue...)
		if sh.shrink != nil {
			sh.shrink.Stop()
		}
	}
	// Claimed ones belong to operations in flight, which free them.
	p.shapes = map[string]*targetShape{}
	p.mu.Unlock()
	p.fills.Wait()
	for _, t := range all {
		e.freeTarget(t)
	}
}
