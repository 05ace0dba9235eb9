package server

import (
	"context"
	"log/slog"
	"net/netip"
	"net/url"
	"sync"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/nodeapi"
	"github.com/spore-run/spore/internal/proxy"
)

// nodeResolver finds sandboxes on this node for the node's proxy (the
// API replica in front resolved presigned URLs and traffic tokens
// already), and ends the streams to an instance when it goes away.
//
// An API replica's stream to a sandbox on a remote node is a hop through
// this proxy. The replica only learns of its own operations, so a kill,
// hibernate or rollback through another replica would leave its streams
// open on a network that no longer answers. The node sees every instance
// go, whoever asked: each target's gone channel here is closed when the
// sandbox's instance behind that address is no longer there (killed,
// hibernated, died, replaced by a rollback), which ends this hop and,
// with it, the replica's stream. The node's events say when to look;
// a periodic sweep over List catches what a lagging subscriber missed.
type nodeResolver struct {
	n   nodeapi.Node
	log *slog.Logger

	mu      sync.Mutex
	targets map[string]*nodeTarget // by sandbox ID
	seq     uint64                 // targets made so far
}

type nodeTarget struct {
	addr netip.Addr
	gone chan struct{}
	seq  uint64 // when it was made (a sweep judges only older ones)
}

// nodeSweepEvery is how often targets are checked against the node's
// List, whatever the events said.
const nodeSweepEvery = 2 * time.Second

// newNodeResolver returns the resolver; it follows n's events until ctx
// ends.
func newNodeResolver(ctx context.Context, n nodeapi.Node, log *slog.Logger) *nodeResolver {
	r := &nodeResolver{n: n, log: log, targets: map[string]*nodeTarget{}}
	events, err := n.Events(ctx)
	if err != nil {
		log.Warn("node proxy: follow the node's events (streams end by the sweep only)", "err", err)
	}
	go r.run(ctx, events)
	return r
}

func (r *nodeResolver) run(ctx context.Context, events <-chan nodeapi.Event) {
	t := time.NewTicker(nodeSweepEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-events:
			if !ok {
				events = nil // ended: the sweep goes on
				continue
			}
			r.check(ctx, ev.SandboxID)
		case <-t.C:
			r.sweep(ctx)
		}
	}
}

// Lookup implements proxy.Resolver.
func (r *nodeResolver) Lookup(id string) (netip.Addr, bool, bool, <-chan struct{}) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	sb, err := r.n.Get(ctx, id)
	if err != nil {
		if !errdefs.IsNotFound(err) {
			r.log.Warn("node proxy: look up the sandbox", "sandbox_id", id, "err", err)
		}
		return netip.Addr{}, false, false, nil
	}
	a, err := netip.ParseAddr(sb.Addr)
	if err != nil || sb.State != nodeapi.StateRunning {
		return a, false, true, nil
	}
	return a, true, true, r.target(id, a)
}

func (*nodeResolver) SignedBy(context.Context, url.Values, string) (string, error) {
	return "", errdefs.NotFoundf("presigned URLs are resolved by the API replicas")
}

func (*nodeResolver) TrafficAllowed(context.Context, string, string) (string, bool) { return "", false }

// target returns the gone channel of the sandbox's instance at addr; a
// target for another address (an instance since replaced) is closed.
func (r *nodeResolver) target(id string, addr netip.Addr) <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	if t, ok := r.targets[id]; ok {
		if t.addr == addr {
			return t.gone
		}
		close(t.gone)
	}
	r.seq++
	t := &nodeTarget{addr: addr, gone: make(chan struct{}), seq: r.seq}
	r.targets[id] = t
	return t.gone
}

// alive reports whether the node's view of a sandbox still has the
// instance a target was opened on.
func alive(sb nodeapi.Sandbox, t *nodeTarget) bool {
	return sb.State != nodeapi.StateHibernated && sb.State != nodeapi.StateDead && sb.Addr == t.addr.String()
}

// end closes t if it is still the sandbox's target.
func (r *nodeResolver) end(id string, t *nodeTarget) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.targets[id] == t {
		close(t.gone)
		delete(r.targets, id)
	}
}

// check looks at one sandbox after an event about it.
func (r *nodeResolver) check(ctx context.Context, id string) {
	r.mu.Lock()
	t, ok := r.targets[id]
	r.mu.Unlock()
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	sb, err := r.n.Get(ctx, id)
	switch {
	case errdefs.IsNotFound(err):
		r.end(id, t)
	case err != nil:
		return // unknown: the sweep looks again
	case !alive(sb, t):
		r.end(id, t)
	}
}

// sweep checks every target made before one List against it.
func (r *nodeResolver) sweep(ctx context.Context) {
	r.mu.Lock()
	n, before := len(r.targets), r.seq
	r.mu.Unlock()
	if n == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	list, err := r.n.List(ctx)
	if err != nil {
		r.log.Warn("node proxy: list sandboxes", "err", err)
		return
	}
	now := map[string]nodeapi.Sandbox{}
	for _, sb := range list {
		now[sb.ID] = sb
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for id, t := range r.targets {
		if t.seq > before {
			continue // made after the List: it may not be in it yet
		}
		if sb, ok := now[id]; !ok || !alive(sb, t) {
			close(t.gone)
			delete(r.targets, id)
		}
	}
}

// gatedNode is a node agent's node as its RPC serves it: Quiesce marks
// and waits on the node's proxy, in front of its sandboxes; the next
// Hibernate, Pause, Resume or Kill of the sandbox lifts the mark (its
// instance is gone or new, or it was not hibernated after all).
type gatedNode struct {
	nodeapi.Node
	px *proxy.Proxy
}

func (g gatedNode) Quiesce(ctx context.Context, id string, grace time.Duration) (int, error) {
	if _, err := g.Node.Get(ctx, id); err != nil {
		return 0, err
	}
	return g.px.Quiesce(ctx, id, grace), nil
}

func (g gatedNode) Hibernate(ctx context.Context, id string) error {
	defer g.px.Unquiesce(id)
	return g.Node.Hibernate(ctx, id)
}

func (g gatedNode) Pause(ctx context.Context, id string) error {
	defer g.px.Unquiesce(id)
	return g.Node.Pause(ctx, id)
}

func (g gatedNode) Resume(ctx context.Context, id string) (nodeapi.Sandbox, error) {
	defer g.px.Unquiesce(id)
	return g.Node.Resume(ctx, id)
}

func (g gatedNode) Kill(ctx context.Context, id string) error {
	defer g.px.Unquiesce(id)
	return g.Node.Kill(ctx, id)
}
