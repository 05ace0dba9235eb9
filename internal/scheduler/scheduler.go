// Package scheduler decides which node runs each new sandbox.
//
// [Place] is a pure function of a view of the fleet and a request: no I/O,
// no clock, no randomness, nothing that depends on map iteration order or
// on the order of the nodes in the view. The same input gives the same
// placement on every API replica, and tests can state the policy exactly.
// Place reserves nothing: it answers for the view it is given, and the
// caller records the placement (the node's own admission check stays the
// last word when two replicas place at once on stale views).
//
// The policy, applied to every item of a request:
//
//  1. Exclude nodes that cannot run the sandbox at all: lost nodes,
//     draining nodes, nodes whose labels do not match every pair of the
//     selector, nodes that neither have nor can get the runsc build the
//     request names (a snapshot restores only with the build that took
//     it: a node has it when it runs it, holds Source or is Origin, since
//     a node keeps the builds of what it holds and runs; it can get it when
//     it reaches the blob store, which keeps every build a durable
//     snapshot needs), and nodes that lack a requested CPU feature (a checkpoint taken where AVX-512 was
//     used cannot resume without it).
//  2. Fit: a node takes an item only when capacity × overcommit − reserved
//     − used covers the item's memory and vCPUs and one sandbox slot.
//     Capacity is the host's real memory and CPUs; Overcommit is the
//     operator's ratio per dimension (a sandbox's limits are caps, not
//     reservations, so a node may promise more than it has); Reserved is
//     the node's admission reserve (memory the host keeps for itself).
//     Every dimension is a hard limit; sandbox slots are never overcommitted.
//     A node that reports the memory it really has free (MemoryFree: its
//     MemAvailable less its memory floor and what its admissions hold)
//     also takes an item only while that covers what the item really
//     takes (Request.Takes: a restore loads its image's whole memory):
//     limits are a bet on what sandboxes will use, MemoryFree is what
//     the host has now.
//  3. Fork: children go to Origin (the source sandbox's node, which holds
//     its memory image) while it fits; the rest spill by the rules below.
//  4. Locality: a node that caches Source (a template name or snapshot ID)
//     beats one that does not: restoring from local disk avoids a download.
//  5. Idle: a node with no launches waiting for its launch slots beats a
//     Busy one (one team's burst of restores there: another team's create
//     would queue behind it; the node's own launch gate then serves teams
//     in turn, this only keeps new work off a busy node while an idle one
//     fits).
//  6. Spread: the node whose allocated fraction of memory after taking the
//     item is lowest, then the lowest fraction of sandbox slots.
//  7. Tie: the smaller node ID.
//
// The items of one request are placed one after another with Used updated,
// so the 100 children of a fork spread instead of piling onto the node that
// was emptiest before the first. A request is all or nothing: when some
// item fits nowhere Place returns an [errdefs.ErrResourceLimit] saying why
// (how many items fit, and for each kind of reason how many nodes were
// ruled out by it), and no placement; with Partial, the items that fit
// are placed and Placement.Short says why the others are not.
//
// Hint is an operator-only override for tests and maintenance: every item
// goes to that node or Place fails; the rules of 1 and 2 still hold there
// (a hint does not place on a draining node).
//
// Cost: one pass over the nodes for a single item (no sorting; the one
// allocation is the result); a request of n items selects the n best nodes in the same
// pass (only those can be used: a node's rank only worsens as it takes
// items) and places from a heap of them, O(nodes·log n + n·log n).
// Node IDs are unique in a view (they are the store's key); Place does not
// check it.
package scheduler

import (
	"math"
	"slices"

	"github.com/spore-run/spore/internal/errdefs"
)

// MaxCount bounds the items of one request (the API's fork limit is far
// below it); it keeps a malformed request from costing unbounded work.
const MaxCount = 1000

// Bounds on the figures of a node or a request. Beyond them a figure is a
// bug (or an attack) upstream; bounding them keeps every sum below
// overflow. 2^40 MB is an exabyte, 2^30 sandboxes and 2^20 vCPUs are far
// past any host.
const (
	maxMemoryMB  = 1 << 40
	maxVCPUs     = 1 << 20
	maxSandboxes = 1 << 30
	// MaxOvercommit bounds a node's overcommit ratio (capacity × ratio
	// stays far below overflow).
	MaxOvercommit = 1000
)

// epsilon absorbs float rounding in vCPU sums (0.1+0.2 > 0.3), so a node
// filled by fractional vCPUs exactly to its capacity still counts as fitting.
const epsilon = 1e-9

// Resources is an amount of node capacity.
type Resources struct {
	MemoryMB  int64
	VCPUs     float64
	Sandboxes int
}

// Overcommit is how many times its real memory and CPUs a node lets
// placement promise to sandboxes' limits. A ratio of 0 means 1 (no
// overcommit: what nodes that predate the setting advertised was already
// multiplied); a negative, NaN or above-MaxOvercommit ratio is invalid.
type Overcommit struct {
	Memory, VCPUs float64
}

// NodeView is what the scheduler knows of one node.
type NodeView struct {
	ID     string
	Labels map[string]string
	// Capacity is the host's real memory, CPUs and sandbox slots; Reserved
	// is its admission reserve; Used is the sum of the sandboxes placed on
	// it. What may be placed is Capacity × Overcommit − Reserved − Used.
	Capacity, Used, Reserved Resources
	Overcommit               Overcommit
	Draining, Lost           bool
	RunscBuild               string
	CPUFeatures              []string
	// Cached holds the template names and snapshot IDs stored locally.
	Cached map[string]bool
	// Durable: the node reaches the blob store, and fetches from it the
	// runsc builds (and root filesystem trees) the snapshots it restores
	// need and it lacks.
	Durable bool
	// MemoryFree, when set, is the memory in MB the host really has for
	// new sandboxes now, as the node last reported it: its MemAvailable
	// less its memory floor and what its admissions hold (negative under
	// the floor). nil: the node reports none, and only limits bind.
	MemoryFree *int64
	// Busy: the node had launches waiting for its launch slots when it
	// last reported (rule 5).
	Busy bool
}

// View is the fleet as the control plane sees it.
type View struct {
	Nodes []NodeView
}

// Request asks for Count sandboxes of size Each.
type Request struct {
	// Count is 1 for a create, n for the children of a fork (1..MaxCount).
	Count int
	// Each is one item's size. Each.Sandboxes must be 0 or 1: an item is
	// always one sandbox slot.
	Each Resources
	// Source is the template name or snapshot ID (locality).
	Source string
	// Origin is a fork source's node: children go there first. A node not
	// in the view, or one ruled out, is skipped.
	Origin string
	// Hint names the node every item must go to (operator only).
	Hint string
	// Selector lists labels a node must carry, all of them.
	Selector map[string]string
	// Avoid lists nodes that must take nothing (one that just refused the
	// item, such as a full node a hibernated sandbox moves away from).
	Avoid []string
	// RunscBuild, when set, admits only nodes that have or can get that
	// build (hasBuild).
	RunscBuild string
	// CPUFeatures must all be present on the node.
	CPUFeatures []string
	// Takes is the memory in MB one item really takes on a node (a
	// restore loads its image's whole memory: a fork child takes about
	// what its source holds), checked against the MemoryFree of the
	// nodes that report it. 0: only a node under its floor is ruled out.
	Takes int64
	// Partial places the items that fit, in order, when not all do:
	// Placement.Nodes is then shorter than Count and Placement.Short says
	// why the others did not fit. With none placed, Place still fails.
	Partial bool
}

// Placement names a node for each requested item, in order.
type Placement struct {
	Nodes []string
	// Short, for a Partial request whose items did not all fit, is the
	// ErrResourceLimit saying why the items past Nodes were not placed.
	Short error
}

// Place decides where the items of req go. Errors: ErrInvalidArgument for
// a malformed request, ErrNotFound for a Hint that names no node in the
// view, ErrResourceLimit when the items do not all fit.
func Place(view View, req Request) (Placement, error) {
	need, err := check(req)
	if err != nil {
		return Placement{}, err
	}
	if req.Hint != "" {
		return placeHint(view, req, need)
	}
	p := planner{view: view, req: req, need: need}
	return p.place()
}

// item is what one item of a request needs: its size in the limits'
// terms, and the memory it really takes.
type item struct {
	Resources
	takes int64 // MB, against MemoryFree
}

// check validates req and returns one item's need.
func check(req Request) (item, error) {
	switch {
	case req.Count < 1 || req.Count > MaxCount:
		return item{}, errdefs.Invalidf("placement count %d is outside 1..%d", req.Count, MaxCount)
	case req.Each.MemoryMB < 0:
		return item{}, errdefs.Invalidf("placement memory %d MB is negative", req.Each.MemoryMB)
	case math.IsNaN(req.Each.VCPUs) || math.IsInf(req.Each.VCPUs, 0) || req.Each.VCPUs < 0:
		return item{}, errdefs.Invalidf("placement vCPUs %v is not a finite non-negative number", req.Each.VCPUs)
	case req.Each.MemoryMB > maxMemoryMB || req.Each.VCPUs > maxVCPUs:
		return item{}, errdefs.Invalidf("placement item of %d MB, %v vCPUs is larger than any node", req.Each.MemoryMB, req.Each.VCPUs)
	case req.Each.Sandboxes != 0 && req.Each.Sandboxes != 1:
		return item{}, errdefs.Invalidf("placement item of %d sandboxes: an item is one sandbox", req.Each.Sandboxes)
	case req.Takes < 0 || req.Takes > maxMemoryMB:
		return item{}, errdefs.Invalidf("placement item taking %d MB of memory is out of range", req.Takes)
	}
	need := item{Resources: req.Each, takes: req.Takes}
	need.Sandboxes = 1
	return need, nil
}

// cand is a node that may take items, with what this request placed on it
// so far folded into used.
//
// It holds the node's index, not its ID: a cand has no pointers, so the
// heaps that move cands around cost no GC write barriers.
type cand struct {
	at          int       // index in View.Nodes
	alloc, used Resources // alloc = capacity − reserved
	free        int64     // MemoryFree less what this request placed on it (noFreeFigure: none reported)
	cached      bool
	// memKey and slotKey are the node's allocated fractions of memory and
	// of slots once it takes the next item: the spreading keys, computed
	// once per node and per placed item rather than per comparison.
	memKey, slotKey float64
}

// newCand makes node i a candidate for items of size need when it fits. Its
// locality is left to the caller (see planner.beats).
func newCand(nodes []NodeView, i int, need item) (cand, bool) {
	c := candAt(nodes, i)
	if !c.fits(need) {
		return c, false
	}
	c.rank(need)
	return c, true
}

func candAt(nodes []NodeView, i int) cand {
	n := &nodes[i]
	c := cand{at: i, alloc: allocatable(n), used: n.Used, free: noFreeFigure}
	if n.MemoryFree != nil {
		c.free = *n.MemoryFree
	}
	return c
}

// noFreeFigure is the free memory of a node that reports none: more than
// any request takes (MaxCount items of maxMemoryMB stay below it).
const noFreeFigure = math.MaxInt64 / 2

// allocatable is what placement may hand out on n: its capacity times its
// overcommit, less its reserve. Only for a sane n (ratios in bounds).
func allocatable(n *NodeView) Resources {
	c := n.Capacity
	c.MemoryMB = int64(float64(c.MemoryMB) * ratio(n.Overcommit.Memory))
	c.VCPUs *= ratio(n.Overcommit.VCPUs)
	return sub(c, n.Reserved)
}

// ratio is an overcommit ratio with 0 read as 1.
func ratio(r float64) float64 {
	if r == 0 {
		return 1
	}
	return r
}

func (c *cand) rank(need item) {
	c.memKey = fraction(float64(c.used.MemoryMB+need.MemoryMB), float64(c.alloc.MemoryMB))
	c.slotKey = fraction(float64(c.used.Sandboxes+need.Sandboxes), float64(c.alloc.Sandboxes))
}

// fits reports whether c can take one more item of size need. Written so
// that a NaN anywhere in the node's figures means "does not fit".
func (c *cand) fits(need item) bool {
	return c.alloc.Sandboxes-c.used.Sandboxes >= need.Sandboxes &&
		c.alloc.MemoryMB-c.used.MemoryMB >= need.MemoryMB &&
		c.alloc.VCPUs-c.used.VCPUs+epsilon >= need.VCPUs &&
		c.free >= need.takes
}

// take places one item on c and re-ranks it for the next.
func (c *cand) take(need item) {
	c.used = add(c.used, need.Resources)
	c.free -= need.takes
	c.rank(need)
}

// better reports whether a ranks before b: locality, then idle before
// busy, then least allocated memory fraction after placement, then least
// allocated slot fraction, then ID.
func better(a, b *cand, nodes []NodeView) bool {
	if a.cached != b.cached {
		return a.cached
	}
	return betterLoad(a, b, nodes)
}

// betterLoad is better without locality.
func betterLoad(a, b *cand, nodes []NodeView) bool {
	if ba, bb := nodes[a.at].Busy, nodes[b.at].Busy; ba != bb {
		return bb
	}
	if a.memKey != b.memKey {
		return a.memKey < b.memKey
	}
	if a.slotKey != b.slotKey {
		return a.slotKey < b.slotKey
	}
	return nodes[a.at].ID < nodes[b.at].ID
}

// fraction is used/alloc, with a node that offers none of a dimension
// counted as full (it can fit only zero-sized needs there).
func fraction(used, alloc float64) float64 {
	if !(alloc > 0) {
		return 1
	}
	return used / alloc
}

// eligible reports whether n may run the request's sandboxes at all
// (rule 1); explain.go says why not.
func eligible(n *NodeView, req *Request) bool {
	return sane(n) && !n.Lost && !n.Draining && !slices.Contains(req.Avoid, n.ID) && matches(n.Labels, req.Selector) &&
		hasBuild(n, req) &&
		hasAll(n.CPUFeatures, req.CPUFeatures)
}

// hasBuild reports whether n has, or can get, the runsc build req names:
// it runs it; it holds Source, or is Origin (a node keeps the builds of
// the snapshots it holds and of the sandboxes it runs); or it reaches the
// blob store, which keeps the builds durable snapshots need.
func hasBuild(n *NodeView, req *Request) bool {
	return req.RunscBuild == "" || n.RunscBuild == req.RunscBuild || n.Durable ||
		(req.Source != "" && n.Cached[req.Source]) || (req.Origin != "" && n.ID == req.Origin)
}

// sane reports whether every figure of n is within bounds (none negative,
// NaN or huge). A node reporting nonsense takes nothing rather than
// risking an overflow that would make it look free.
func sane(n *NodeView) bool {
	return inBounds(n.Capacity) && inBounds(n.Used) && inBounds(n.Reserved) &&
		ratioOK(n.Overcommit.Memory) && ratioOK(n.Overcommit.VCPUs) &&
		(n.MemoryFree == nil || *n.MemoryFree >= -maxMemoryMB && *n.MemoryFree <= maxMemoryMB)
}

func ratioOK(r float64) bool { return r >= 0 && r <= MaxOvercommit } // false for NaN

func inBounds(r Resources) bool {
	return r.MemoryMB >= 0 && r.MemoryMB <= maxMemoryMB &&
		r.VCPUs >= 0 && r.VCPUs <= maxVCPUs && // false for NaN
		r.Sandboxes >= 0 && r.Sandboxes <= maxSandboxes
}

func matches(labels, selector map[string]string) bool {
	if len(selector) == 0 {
		return true // skips starting a map iteration, per node
	}
	for k, v := range selector {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// hasAll reports whether have contains every entry of want. Both lists
// are short (a few dozen CPU flags), so a nested loop beats building a set.
func hasAll(have, want []string) bool {
outer:
	for _, w := range want {
		for _, h := range have {
			if h == w {
				continue outer
			}
		}
		return false
	}
	return true
}

type planner struct {
	view View
	req  Request // by value: a pointer to Place's argument would move it to the heap
	need item
}

func (p *planner) place() (Placement, error) {
	req, need := &p.req, p.need
	out := make([]string, 0, req.Count)
	// Fork: fill the origin first. It is then left out of the spill: it
	// no longer fits, or it was ruled out.
	originAt := -1
	if req.Origin != "" {
		originAt = slices.IndexFunc(p.view.Nodes, func(n NodeView) bool { return n.ID == req.Origin })
	}
	if originAt >= 0 && eligible(&p.view.Nodes[originAt], req) {
		o := candAt(p.view.Nodes, originAt)
		for len(out) < req.Count && o.fits(need) {
			o.take(need)
			out = append(out, req.Origin)
		}
	}
	left := req.Count - len(out)
	if left == 0 {
		return Placement{Nodes: out}, nil
	}
	if left == 1 {
		best, ok := p.best(originAt)
		if !ok {
			return p.short(out)
		}
		return Placement{Nodes: append(out, p.view.Nodes[best.at].ID)}, nil
	}
	// Several items: only the best `left` nodes can be used. A node's
	// ranking only worsens as it takes items, so the k-th item goes to a
	// node that was among the first k before any was placed. Select those
	// (memory O(left), not O(nodes)), then place from a heap of them.
	h := candHeap{c: p.top(originAt, left), nodes: p.view.Nodes}
	h.init()
	for len(out) < req.Count {
		if len(h.c) == 0 {
			return p.short(out)
		}
		top := &h.c[0]
		top.take(need)
		out = append(out, p.view.Nodes[top.at].ID)
		if top.fits(need) {
			h.down(0)
		} else {
			h.pop()
		}
	}
	return Placement{Nodes: out}, nil
}

// short answers a request whose items did not all fit, out being those
// that did: with Partial and some placed, those and why the rest did not
// fit; else the refusal.
func (p *planner) short(out []string) (Placement, error) {
	err := p.exhausted(out)
	if p.req.Partial && len(out) > 0 {
		return Placement{Nodes: out, Short: err}, nil
	}
	return Placement{}, err
}

// caches reports whether n holds the request's source locally.
func (p *planner) caches(n *NodeView) bool {
	return p.req.Source != "" && n.Cached[p.req.Source]
}

// beats reports whether c (node n) ranks before o, setting c.cached. The
// map lookup for locality is the dearest step of a scan, so it is skipped
// when it cannot change the answer: o is local and c is no less loaded.
// When beats is false c.cached may be unset; c is then dropped.
func (p *planner) beats(c *cand, n *NodeView, o *cand) bool {
	if o.cached && !betterLoad(c, o, p.view.Nodes) {
		return false
	}
	c.cached = p.caches(n)
	return better(c, o, p.view.Nodes)
}

// best is the single best node for one item (skipping index skip): one
// scan, no allocation.
func (p *planner) best(skip int) (cand, bool) {
	var best cand
	found := false
	for i := range p.view.Nodes {
		n := &p.view.Nodes[i]
		if i == skip || !eligible(n, &p.req) {
			continue
		}
		c, ok := newCand(p.view.Nodes, i, p.need)
		switch {
		case !ok:
		case !found:
			c.cached = p.caches(n)
			best, found = c, true
		case p.beats(&c, n, &best):
			best = c
		}
	}
	return best, found
}

// top returns the k best nodes for an item (skipping index skip), in no
// particular order: a bounded heap with the worst kept at its root, so
// most nodes cost one comparison.
func (p *planner) top(skip, k int) []cand {
	w := candHeap{c: make([]cand, 0, min(k, len(p.view.Nodes))), nodes: p.view.Nodes, worstFirst: true}
	for i := range p.view.Nodes {
		n := &p.view.Nodes[i]
		if i == skip || !eligible(n, &p.req) {
			continue
		}
		c, ok := newCand(p.view.Nodes, i, p.need)
		switch {
		case !ok:
		case len(w.c) < k:
			c.cached = p.caches(n)
			w.push(c)
		case p.beats(&c, n, &w.c[0]):
			w.c[0] = c
			w.down(0)
		}
	}
	return w.c
}

// candHeap orders candidates by better, the best at the root (or the
// worst, with worstFirst). Written out rather than through container/heap
// to avoid an interface call per comparison.
type candHeap struct {
	c          []cand
	nodes      []NodeView // for the ID tie-break
	worstFirst bool
}

func (h *candHeap) less(i, j int) bool {
	if h.worstFirst {
		return better(&h.c[j], &h.c[i], h.nodes)
	}
	return better(&h.c[i], &h.c[j], h.nodes)
}

func (h *candHeap) init() {
	for i := len(h.c)/2 - 1; i >= 0; i-- {
		h.down(i)
	}
}

func (h *candHeap) push(c cand) {
	h.c = append(h.c, c)
	for i := len(h.c) - 1; i > 0; {
		parent := (i - 1) / 2
		if !h.less(i, parent) {
			return
		}
		h.c[i], h.c[parent] = h.c[parent], h.c[i]
		i = parent
	}
}

func (h *candHeap) down(i int) {
	n := len(h.c)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		m := l
		if r := l + 1; r < n && h.less(r, l) {
			m = r
		}
		if !h.less(m, i) {
			return
		}
		h.c[i], h.c[m] = h.c[m], h.c[i]
		i = m
	}
}

func (h *candHeap) pop() {
	last := len(h.c) - 1
	h.c[0] = h.c[last]
	h.c = h.c[:last]
	if last > 0 {
		h.down(0)
	}
}

func add(a, b Resources) Resources {
	return Resources{MemoryMB: a.MemoryMB + b.MemoryMB, VCPUs: a.VCPUs + b.VCPUs, Sandboxes: a.Sandboxes + b.Sandboxes}
}

func sub(a, b Resources) Resources {
	return Resources{MemoryMB: a.MemoryMB - b.MemoryMB, VCPUs: a.VCPUs - b.VCPUs, Sandboxes: a.Sandboxes - b.Sandboxes}
}
