package control

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/nodeapi"
	"github.com/spore-run/spore/internal/scheduler"
	"github.com/spore-run/spore/internal/store"
)

// Registry finds the nodes this control plane drives.
type Registry interface {
	// Node returns the node with this ID.
	Node(id string) (nodeapi.Node, bool)
	// IDs lists the nodes, sorted.
	IDs() []string
}

// Nodes is a fixed registry (`spore up`: one in-process node).
type Nodes map[string]nodeapi.Node

// Node implements Registry.
func (n Nodes) Node(id string) (nodeapi.Node, bool) { x, ok := n[id]; return x, ok }

// IDs implements Registry.
func (n Nodes) IDs() []string {
	out := make([]string, 0, len(n))
	for id := range n {
		out = append(out, id)
	}
	sort.Strings(out)
	return out
}

// node returns a node by ID. Rows written before nodes had IDs (""),
// belong to the only node when there is one.
func (s *Service) node(id string) (nodeapi.Node, error) {
	if n, ok := s.nodes.Node(id); ok {
		return n, nil
	}
	if ids := s.nodes.IDs(); id == "" && len(ids) == 1 {
		n, _ := s.nodes.Node(ids[0])
		return n, nil
	}
	return nil, fmt.Errorf("node %q is not reachable from this control plane: %w", id, errdefs.ErrUnavailable)
}

func (s *Service) nodeOf(rec store.Sandbox) (nodeapi.Node, error) { return s.node(rec.NodeID) }

// follow subscribes to a node's events: a sandbox that died on its own
// gets state error with the reason; one the node hibernated under memory
// pressure is recorded hibernated (memory.go). Subscribed before New returns, so no
// death after it is missed.
func (s *Service) follow(ctx context.Context, id string, n nodeapi.Node) {
	s.followMu.Lock()
	if s.following[id] {
		s.followMu.Unlock()
		return
	}
	s.following[id] = true
	s.followMu.Unlock()
	unfollow := func() {
		s.followMu.Lock()
		delete(s.following, id)
		s.followMu.Unlock()
	}
	ch, err := n.Events(ctx)
	if err != nil {
		unfollow()
		s.log.Error("follow node events (deaths are found by reconcile)", "node_id", id, "err", err)
		return
	}
	go func() {
		defer unfollow()
		for ev := range ch {
			switch ev.Kind {
			case nodeapi.EventDied:
				s.sandboxDied(ev)
			case nodeapi.EventHibernated:
				s.sandboxHibernated(id, ev)
			}
		}
	}()
}

// RegisterNodes records every node of the registry in the store (what
// it offers, a heartbeat), so placement sees it.
func (s *Service) RegisterNodes(ctx context.Context) error {
	for _, id := range s.nodes.IDs() {
		n, _ := s.nodes.Node(id)
		if err := s.register(ctx, id, n); err != nil {
			return err
		}
	}
	return nil
}

func (s *Service) register(ctx context.Context, id string, n nodeapi.Node) error {
	info, err := n.Info(ctx)
	if err != nil {
		return fmt.Errorf("node %s: %w", id, err)
	}
	_, err = s.st.UpsertNode(ctx, store.Node{ID: id, Addr: info.Addr, Labels: info.Labels,
		Capacity: storeRes(info.Capacity), Reserved: storeRes(info.Reserved), Overcommit: store.Overcommit(info.Overcommit), RunscBuild: info.RunscBuild,
		CPUFeatures: info.CPUFeatures, Durable: info.Durable, MemoryFreeMB: info.MemoryFreeMB, LaunchesQueued: info.LaunchesQueued, Heartbeat: s.now(), State: store.NodeReady})
	return err
}

func storeRes(r nodeapi.Resources) store.Resources {
	return store.Resources{MemoryMB: r.MemoryMB, VCPUs: r.VCPUs, Sandboxes: r.Sandboxes}
}

func schedRes(r store.Resources) scheduler.Resources {
	return scheduler.Resources{MemoryMB: r.MemoryMB, VCPUs: r.VCPUs, Sandboxes: r.Sandboxes}
}

// Default size of a sandbox whose request names none (the default
// templates' limits), for placement.
const (
	defaultMemoryMB = store.DefaultMemoryMB
	defaultVCPUs    = store.DefaultVCPUs
)

// The placement view is cached: reading every node and summing every
// sandbox per create would cost more than the create itself. Placements
// made from it are added to it; the node's admission check stays the
// last word. While this instance places (a placement in the last
// viewIdle), the view is refreshed in the background every viewTTL, so
// it is about that old and no create waits for the read; a view found
// older than viewTTL starts a refresh too; one older than viewMaxAge, or
// invalidated (a drain, a node lost), is rebuilt before the placement.
const (
	viewTTL            = time.Second
	viewMaxAge         = 5 * time.Second
	viewIdle           = time.Minute
	viewRefreshTimeout = 30 * time.Second
)

type viewCache struct {
	mu   sync.Mutex
	at   time.Time
	view scheduler.View
	fleetRows
	gen        uint64 // bumped by invalidateView: a refresh begun before is dropped
	refreshing bool
	ticking    bool      // the periodic refresh runs
	lastUse    time.Time // of the last placement (wall clock: the refresh's ticker is)
}

// fleetRows is what the view keeps beside the scheduler's: the node rows
// (a source's origin: can it share, its address) and how many pooled
// sandboxes of each template each node held.
type fleetRows struct {
	nodes  map[string]store.Node
	pooled map[poolKey]int
}

type poolKey struct{ node, template string }

// viewLocked returns the view to place from (s.view.mu held): rebuilt
// now when missing or too old, refreshed in the background when stale.
func (s *Service) viewLocked(ctx context.Context) (*viewCache, error) {
	c := &s.view
	now := s.now()
	age := now.Sub(c.at)
	if c.view.Nodes == nil || age > viewMaxAge || now.Before(c.at) {
		v, rows, err := s.buildView(ctx)
		if err != nil {
			return nil, err
		}
		c.view, c.fleetRows, c.at = v, rows, now
		return c, nil
	}
	if age > viewTTL {
		s.refreshViewLocked()
	}
	return c, nil
}

// refreshViewLocked starts a background refresh of the view unless one
// runs (s.view.mu held).
func (s *Service) refreshViewLocked() {
	c := &s.view
	if c.refreshing || s.ctx.Err() != nil {
		return
	}
	c.refreshing = true
	gen := c.gen
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		// Dated when its reads began: a drain committed during them may
		// be missing, so its age counts from then. Bounded: a store or
		// node (registering) that hangs would leave refreshing set, and
		// the view unrefreshed, for good.
		began := s.now()
		ctx, cancel := context.WithTimeout(s.ctx, viewRefreshTimeout)
		defer cancel()
		v, rows, err := s.buildView(ctx)
		c.mu.Lock()
		defer c.mu.Unlock()
		c.refreshing = false
		if err != nil {
			if s.ctx.Err() == nil {
				s.log.Warn("refresh the placement view", "err", err)
			}
			return
		}
		if c.gen == gen {
			c.view, c.fleetRows, c.at = v, rows, began
		}
	}()
}

// viewInUse notes a placement (s.view.mu held) and keeps the periodic
// refresh running while placements go on.
func (s *Service) viewInUse() {
	c := &s.view
	c.lastUse = time.Now()
	if c.ticking || s.ctx.Err() != nil {
		return
	}
	c.ticking = true
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		t := time.NewTicker(viewTTL)
		defer t.Stop()
		for {
			select {
			case <-s.ctx.Done():
				return
			case <-t.C:
			}
			c.mu.Lock()
			if time.Since(c.lastUse) > viewIdle {
				c.ticking = false
				c.mu.Unlock()
				return
			}
			s.refreshViewLocked()
			c.mu.Unlock()
		}
	}()
}

// mayHavePooled says whether the view saw a pooled sandbox of template on
// node (or this process added one since): when not, a create does not
// look for one.
func (s *Service) mayHavePooled(node, template string) bool {
	s.view.mu.Lock()
	defer s.view.mu.Unlock()
	return s.view.pooled == nil || s.view.pooled[poolKey{node, template}] > 0
}

// notePooled counts a pooled sandbox this process added in the view.
func (s *Service) notePooled(node, template string) {
	s.view.mu.Lock()
	defer s.view.mu.Unlock()
	if s.view.pooled != nil {
		s.view.pooled[poolKey{node, template}]++
	}
}

// place picks the node for a create from src (nil: a template every
// node builds).
func (s *Service) place(ctx context.Context, r CreateRequest, src *sourceInfo) (string, nodeapi.Node, error) {
	req := scheduler.Request{Count: 1, Source: src.sourceID(r.TemplateID), Each: sizeOf(r.MemoryMB, r.CPUCount), Hint: r.NodeID}
	nodes, err := s.placeN(ctx, req, src)
	if err != nil {
		return "", nil, err
	}
	n, err := s.node(nodes[0])
	return nodes[0], n, err
}

// sizeOf is a sandbox's size for placement (0s: the defaults).
func sizeOf(memoryMB, cpus int) scheduler.Resources {
	each := scheduler.Resources{MemoryMB: int64(memoryMB), VCPUs: float64(cpus)}
	if each.MemoryMB == 0 {
		each.MemoryMB = defaultMemoryMB
	}
	if each.VCPUs == 0 {
		each.VCPUs = defaultVCPUs
	}
	return each
}

// placeN places req's items from the cached view and counts them in it.
// A source (a user snapshot or template) adds what its row knows: one
// only on its node's disk pins the items there (refused while that node
// drains); one durable, or whose node has a blob store and can serve it,
// admits only nodes that can restore it (the runtime build and CPU
// features it was taken with) and prefers the nodes that hold a copy. It
// sets src.peers to the origin's address when the origin is ready.
func (s *Service) placeN(ctx context.Context, req scheduler.Request, src *sourceInfo) ([]string, error) {
	p, err := s.placeAll(ctx, req, src)
	return p.Nodes, err
}

// placeAll is placeN answering the whole placement (a Partial request's
// Short too).
func (s *Service) placeAll(ctx context.Context, req scheduler.Request, src *sourceInfo) (scheduler.Placement, error) {
	s.view.mu.Lock()
	defer s.view.mu.Unlock()
	c, err := s.viewLocked(ctx)
	if err != nil {
		return scheduler.Placement{}, err
	}
	var holders []string
	if src != nil && src.origin != "" {
		origin, known := c.nodes[src.origin]
		if known && origin.Addr != "" && origin.State == store.NodeReady {
			src.peers = []string{origin.Addr}
		}
		// Another node gets it from the blob store once durable, else
		// from its origin as a peer: a ready node with a blob store and an
		// address (a draining one too: that is how work leaves it).
		shared := src.durable || (known && origin.Durable && origin.State == store.NodeReady && origin.Addr != "")
		if !shared {
			if known && origin.Draining {
				return scheduler.Placement{}, pinnedToDraining(src, origin)
			}
			if req.Hint != "" && req.Hint != src.origin {
				return scheduler.Placement{}, errdefs.Conflictf("snapshot %s is only on node %s, which cannot share it, not on %s", src.id, src.origin, req.Hint)
			}
			req.Hint = src.origin // its bytes are on that node only
		} else {
			req.RunscBuild, req.CPUFeatures = src.runsc, src.cpu
			holders = src.holders
		}
	}
	for i := range c.view.Nodes {
		if nv := &c.view.Nodes[i]; slices.Contains(holders, nv.ID) {
			if nv.Cached == nil {
				nv.Cached = map[string]bool{}
			}
			nv.Cached[req.Source] = true
		}
	}
	s.viewInUse()
	p, err := scheduler.Place(c.view, req)
	if err != nil {
		return scheduler.Placement{}, err
	}
	for _, id := range p.Nodes {
		for i := range c.view.Nodes {
			if nv := &c.view.Nodes[i]; nv.ID == id {
				nv.Used.MemoryMB += req.Each.MemoryMB
				nv.Used.VCPUs += req.Each.VCPUs
				nv.Used.Sandboxes++
				nv.MemoryFree = lessFree(nv.MemoryFree, req.Takes)
			}
		}
	}
	return p, nil
}

// buildView reads the fleet from the store: nodes, and what their
// sandboxes (running, paused, being created) hold. A node of the
// registry the store does not know yet is registered first; a node the
// registry cannot reach counts as lost.
func (s *Service) buildView(ctx context.Context) (scheduler.View, fleetRows, error) {
	nodes, err := s.st.ListNodes(ctx)
	if err != nil {
		return scheduler.View{}, fleetRows{}, err
	}
	known := map[string]bool{}
	for _, n := range nodes {
		known[n.ID] = true
	}
	added := false
	for _, id := range s.nodes.IDs() {
		if !known[id] {
			n, _ := s.nodes.Node(id)
			if err := s.register(ctx, id, n); err != nil {
				return scheduler.View{}, fleetRows{}, err
			}
			added = true
		}
	}
	if added {
		if nodes, err = s.st.ListNodes(ctx); err != nil {
			return scheduler.View{}, fleetRows{}, err
		}
	}
	used, pooled, err := s.usedByNode(ctx)
	if err != nil {
		return scheduler.View{}, fleetRows{}, err
	}
	v := scheduler.View{Nodes: make([]scheduler.NodeView, 0, len(nodes))}
	rows := fleetRows{nodes: make(map[string]store.Node, len(nodes)), pooled: pooled}
	for _, n := range nodes {
		rows.nodes[n.ID] = n
		_, reachable := s.nodes.Node(n.ID)
		v.Nodes = append(v.Nodes, scheduler.NodeView{ID: n.ID, Labels: n.Labels, Capacity: schedRes(n.Capacity),
			Reserved: schedRes(n.Reserved), Overcommit: scheduler.Overcommit(n.Overcommit), Used: used[n.ID], Draining: n.Draining,
			Lost:       n.State != store.NodeReady || !reachable, // joining: not until reconciled
			RunscBuild: n.RunscBuild, CPUFeatures: n.CPUFeatures, Durable: n.Durable, MemoryFree: s.freshFree(n), Busy: s.busy(n)})
	}
	return v, rows, nil
}

// usedByNode sums, per node, the limits of its running, paused,
// creating and pooled (warm-pool) sandboxes, and counts the pooled ones
// per node and template.
func (s *Service) usedByNode(ctx context.Context) (map[string]scheduler.Resources, map[poolKey]int, error) {
	used := map[string]scheduler.Resources{}
	pooled := map[poolKey]int{}
	cursor := ""
	for {
		page, next, err := s.st.ListSandboxes(ctx, store.SandboxFilter{
			States: []string{store.StateRunning, store.StatePaused, store.StateCreating, store.StatePooled}, Limit: 1000, Cursor: cursor})
		if err != nil {
			return nil, nil, err
		}
		for _, sb := range page {
			if sb.State == store.StatePooled {
				pooled[poolKey{sb.NodeID, sb.TemplateID}]++
			}
			u := used[sb.NodeID]
			mem, cpu := int64(sb.MemoryMB), float64(sb.CPUCount)
			if mem == 0 {
				mem = defaultMemoryMB
			}
			if cpu == 0 {
				cpu = defaultVCPUs
			}
			u.MemoryMB, u.VCPUs, u.Sandboxes = u.MemoryMB+mem, u.VCPUs+cpu, u.Sandboxes+1
			used[sb.NodeID] = u
		}
		if next == "" {
			return used, pooled, nil
		}
		cursor = next
	}
}

// Lease names and how long a holder keeps one without renewing.
const (
	leaseReaper = "reaper"
	leasePool   = "pool"
	// leaseReconcile + node ID: the periodic reconcile of that node.
	leaseReconcile = "reconcile/"
	leaseTTL       = 15 * time.Second
)

// lease takes (or renews) a store lease for this process; false when
// another control plane instance holds it.
func (s *Service) lease(ctx context.Context, name string) bool {
	return s.leaseFor(ctx, name, s.cfg.LeaseTTL)
}

// leaseFor is lease with its own TTL.
func (s *Service) leaseFor(ctx context.Context, name string, ttl time.Duration) bool {
	ok, err := s.st.AcquireLease(ctx, name, s.cfg.Holder, ttl)
	if err != nil {
		s.log.Warn("acquire lease", "lease", name, "err", err)
		return false
	}
	return ok
}

// holdLease keeps a lease this process took (asked for at began) while the
// work it guards runs, and returns the work's context and its stop (which
// waits for the renewals to end). The lease is renewed every ttl/3; the
// context ends when stop is called or ctx ends, when another holder has
// the lease, or when no renewal succeeded in time: a tenth of the ttl
// before the lease, as last renewed, may expire. That time is counted on
// this process's monotonic clock from before each renewal was asked for,
// so the store (which dates the renewal when it gets it, by its own clock)
// never lets the lease go earlier. A failed renewal is tried again until
// then; work that outlives its lease would run beside the next holder's.
func (s *Service) holdLease(ctx context.Context, name string, ttl time.Duration, began time.Time) (context.Context, func()) {
	work, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	margin := ttl / 10
	go func() {
		defer close(done)
		validUntil := began.Add(ttl - margin)
		for {
			t := time.NewTimer(min(ttl/3, time.Until(validUntil)))
			select {
			case <-work.Done():
				t.Stop()
				return
			case <-t.C:
			}
			if !time.Now().Before(validUntil) {
				s.log.Warn("lease not renewed in time: its work stops", "lease", name)
				cancel()
				return
			}
			asked := time.Now()
			rctx, rcancel := context.WithDeadline(work, validUntil)
			ok, err := s.st.AcquireLease(rctx, name, s.cfg.Holder, ttl)
			rcancel()
			switch {
			case err == nil && ok:
				validUntil = asked.Add(ttl - margin)
			case err == nil:
				s.log.Warn("lease taken by another instance: its work stops", "lease", name)
				cancel()
				return
			case work.Err() != nil:
				return
			default:
				s.log.Warn("renew lease (tried again until it may expire)", "lease", name, "err", err)
			}
		}
	}()
	return work, func() { cancel(); <-done }
}
