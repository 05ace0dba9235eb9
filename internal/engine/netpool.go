package engine

import (
	"context"
	"sync"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/netns"
	"github.com/spore-run/spore/internal/runtime"
	"github.com/spore-run/spore/internal/timing"
)

// Reserved networks: sandbox networks set up ahead of time
// (Network.Reserve), for the restores that find no restore target of their
// shape: the second and later children of a fork, concurrent creates, the
// first restore of a new shape. Such a restore still boots its sandbox,
// but its network's namespaces, links and addresses (~5 ms of the host's
// CPU, under a host-wide lock that serializes a burst's networks) were
// made while the host was idle; it pays only the claim, which writes its
// policy's rules (Network.Claim, as for a target's network).
//
// A reserved network is named like a target, with an instance ID of its
// own, which the restore takes (claimTarget sets spec.ID): the sandbox's
// record names it like any instance. The pool fills once a restore has
// asked for one, and tops up when no restore is in flight, one network at
// a time. Nothing leaves a reserved network until it is claimed, and Close
// frees those left.
type netPool struct {
	size int // networks kept

	mu      sync.Mutex
	free    []*target // ready or filling, oldest first; net only (netOnly)
	claimed map[string]*target
	busy    int  // restores in flight that asked for one
	asked   bool // a restore has asked: the pool is kept full from then on
	closed  bool
	fill    sync.Mutex
	fills   sync.WaitGroup
}

func newNetPool(size int, net Network) *netPool {
	if size <= 0 || net == nil {
		return nil
	}
	return &netPool{size: size, claimed: map[string]*target{}}
}

// claimNet gives spec the instance ID of a ready reserved network, when
// there is one. The returned release, called when the operation ends,
// frees a claimed network no launch took and tops the pool up.
func (e *Engine) claimNet(spec *runtime.Spec) (release func()) {
	p := e.nets
	if p == nil {
		return func() {}
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return func() {}
	}
	p.asked = true
	var claimed *target
	for i, t := range p.free {
		// One still being made is not waited for: the network would be
		// made on the request's path as soon as the fill's.
		if isReady(t) && t.err == nil {
			p.free = append(p.free[:i:i], p.free[i+1:]...)
			claimed = t
			p.claimed[t.id] = t
			spec.ID = t.id
			break
		}
	}
	p.busy++
	p.mu.Unlock()
	return func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		p.busy--
		if claimed != nil {
			if t, ok := p.claimed[claimed.id]; ok {
				delete(p.claimed, claimed.id)
				e.dropTarget(t)
			}
		}
		if !p.closed && p.busy == 0 {
			e.topUpNetsLocked()
		}
	}
}

// takeNet hands launch the reserved network it was claimed for, if
// instance is one.
func (e *Engine) takeNet(instance string) *target {
	if e.nets == nil {
		return nil
	}
	return takeClaimed(&e.nets.mu, e.nets.claimed, instance)
}

// ReservedNetworks lists the instance IDs of the networks kept reserved
// (made or being made), which no sandbox holds.
func (e *Engine) ReservedNetworks() []string {
	p := e.nets
	if p == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]string, 0, len(p.free))
	for _, t := range p.free {
		out = append(out, t.id)
	}
	return out
}

// topUpNetsLocked starts the fills that bring the pool to its size.
func (e *Engine) topUpNetsLocked() {
	p := e.nets
	if !p.asked {
		return
	}
	for len(p.free) < p.size {
		t := &target{id: ids.New('p'), ready: make(chan struct{}), netOnly: true}
		p.free = append(p.free, t)
		p.fills.Add(1)
		go func() {
			defer p.fills.Done()
			e.fillNet(t)
			if t.err != nil {
				e.log.Warn("reserved network not made: restores set theirs up on their path", "instance", t.id, "err", t.err)
				p.mu.Lock()
				for i, q := range p.free {
					if q == t {
						p.free = append(p.free[:i:i], p.free[i+1:]...)
						break
					}
				}
				p.mu.Unlock()
			}
		}()
	}
}

// fillNet reserves a network; on failure nothing of it is left.
func (e *Engine) fillNet(t *target) {
	defer close(t.ready)
	p := e.nets
	p.fill.Lock()
	defer p.fill.Unlock()
	if t.err = e.life.Err(); t.err != nil {
		return
	}
	t.net, t.err = e.net.Reserve(e.life, t.id)
}

// networkFor gives a launch its network: t's, claimed with the sandbox's
// policy, when t is a reserved network, else one set up now. A claim that
// failed left nothing, so the network is then set up under the same ID
// as if it had never been reserved (a policy the node refuses is refused
// by either).
func (e *Engine) networkFor(ctx context.Context, sandbox, instance string, t *target, policy netns.Policy) (netns.Net, error) {
	if t != nil && t.netOnly && t.err == nil {
		done := timing.Track(ctx, "net")
		err := e.net.Claim(ctx, t.id, sandbox, policy)
		done()
		if err == nil {
			return t.net, nil
		}
		cctx, cancel := cleanupCtx()
		if terr := e.net.Teardown(cctx, t.id); terr != nil {
			e.log.Warn("free a reserved network", "instance", t.id, "err", terr)
		}
		cancel()
		if errdefs.IsInvalidArgument(err) || ctx.Err() != nil {
			return netns.Net{}, err
		}
		e.log.Warn("claim of a reserved network failed: setting one up", "sandbox_id", sandbox, "instance", instance, "err", err)
	}
	done := timing.Track(ctx, "net")
	defer done()
	return e.net.Setup(ctx, instance, policy)
}

// closeNets frees the reserved networks (Close): no later engine knows
// them (it would remove them as orphans).
func (e *Engine) closeNets() {
	p := e.nets
	if p == nil {
		return
	}
	p.mu.Lock()
	p.closed = true
	all := p.free
	p.free = nil
	// Claimed ones belong to operations in flight, which free them.
	p.mu.Unlock()
	p.fills.Wait()
	for _, t := range all {
		e.freeTarget(t)
	}
}
