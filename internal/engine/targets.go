package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/netns"
	"github.com/spore-run/spore/internal/runtime"
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
// A target's instance ID is its own (it is named before any sandbox claims
// it): a sandbox's record names it like any instance, and its network is
// claimed for the sandbox (netns.Manager.Claim: its policy, and its egress
// audit journaled under the sandbox).
type targetPool struct {
	per int // targets kept per shape

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
}

type target struct {
	id    string
	trees string        // treeIdent of its spec when it was made
	ready chan struct{} // closed once the fill ended; err says how
	err   error
	net   netns.Net // its network (when the engine has one)
	// netOnly: a reserved network (netpool.go), no pre-created instance.
	netOnly bool
}

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

func newTargetPool(per int) *targetPool {
	if per <= 0 {
		return nil
	}
	return &targetPool{per: per, shapes: map[string]*targetShape{}, claimed: map[string]*target{}}
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
func (e *Engine) claimTarget(spec *runtime.Spec) (release func()) {
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
		sh = &targetShape{spec: runtime.RestoreShape(*spec)}
		p.shapes[key] = sh
	}
	sh.used = time.Now()
	e.evictShapesLocked()
	var claimed *target
	for claimed == nil && len(sh.queue) > 0 {
		t := sh.queue[0]
		if t.trees != trees {
			sh.queue = sh.queue[1:]
			e.log.Info("restore target dropped: its root filesystem or a mount was made again since", "instance", t.id)
			e.dropTarget(t)
			continue
		}
		// A target still being made is worth waiting for when this
		// restore is its shape's only one: the boot is further along than
		// a new one would be. In a burst (a fork, concurrent creates) the
		// fills, one at a time, would serialize the restores that wait
		// for them: those boot their own, side by side.
		if !isReady(t) && sh.busy > 0 {
			break
		}
		sh.queue = sh.queue[1:]
		claimed = t
		p.claimed[t.id] = t
		spec.ID = t.id
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
		// meant to spare.
		if !p.closed && p.shapes[key] == sh && sh.busy == 0 {
			e.topUpLocked(sh)
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
		delete(p.shapes, oldest)
	}
}

// topUpLocked starts fills until the shape has its targets.
func (e *Engine) topUpLocked(sh *targetShape) {
	p := e.targets
	for len(sh.queue) < p.per {
		t := &target{id: ids.New('p'), trees: treeIdent(sh.spec), ready: make(chan struct{})}
		sh.queue = append(sh.queue, t)
		spec := sh.spec
		p.fills.Add(1)
		go func() {
			defer p.fills.Done()
			e.fillTarget(t, spec)
			if t.err != nil {
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
	p.fill.Lock()
	defer p.fill.Unlock()
	ctx := e.life
	if t.err = ctx.Err(); t.err != nil {
		return
	}
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

// dropTarget frees a target nobody will use in the background.
func (e *Engine) dropTarget(t *target) {
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
	}
	// Claimed ones belong to operations in flight, which free them.
	p.shapes = map[string]*targetShape{}
	p.mu.Unlock()
	p.fills.Wait()
	for _, t := range all {
		e.freeTarget(t)
	}
}
