package scheduler

import (
	"fmt"
	"slices"
	"strings"

	"github.com/spore-run/spore/internal/errdefs"
)

// Explaining a refusal runs only on the failure path, so it may walk the
// nodes again and allocate: the fast path stays a bare scan.

// reason is why a node takes no (more) items of a request, in the order
// they are checked: the first that applies is the one reported.
type reason int

const (
	fitsOK reason = iota
	badFigures
	lost
	draining
	avoided
	selectorMismatch
	otherBuild
	missingCPU
	noMemory
	noVCPUs
	noSlot
	noFreeMemory
	nReasons
)

// reasonOf says why n takes no item of size need once placed items of
// this request sit on it.
func reasonOf(n *NodeView, req *Request, need item, placed int) reason {
	switch {
	case !sane(n):
		return badFigures
	case n.Lost:
		return lost
	case n.Draining:
		return draining
	case slices.Contains(req.Avoid, n.ID):
		return avoided
	case !matches(n.Labels, req.Selector):
		return selectorMismatch
	case !hasBuild(n, req):
		return otherBuild
	case !hasAll(n.CPUFeatures, req.CPUFeatures):
		return missingCPU
	}
	c := cand{alloc: allocatable(n), used: n.Used, free: noFreeFigure}
	if n.MemoryFree != nil {
		c.free = *n.MemoryFree
	}
	for range placed {
		c.take(need)
	}
	switch free := sub(c.alloc, c.used); {
	case free.MemoryMB < need.MemoryMB:
		return noMemory
	case free.VCPUs+epsilon < need.VCPUs:
		return noVCPUs
	case free.Sandboxes < need.Sandboxes:
		return noSlot
	case c.free < need.takes:
		return noFreeMemory
	}
	return fitsOK
}

// phrase says reason r for count nodes ("2 lack 512 MB free ...").
func phrase(r reason, count int, req *Request, need item) string {
	one := count == 1
	pick := func(singular, plural string) string {
		if one {
			return singular
		}
		return plural
	}
	var s string
	switch r {
	case badFigures:
		s = pick("reports", "report") + " invalid capacity figures"
	case lost:
		s = pick("is", "are") + " lost"
	case draining:
		s = pick("is", "are") + " draining"
	case avoided:
		s = pick("was", "were") + " ruled out by the request"
	case selectorMismatch:
		s = pick("does", "do") + " not match the selector " + selectorString(req.Selector)
	case otherBuild:
		s = fmt.Sprintf("neither %s nor can get runsc build %q (no blob store)", pick("runs", "run"), req.RunscBuild)
	case missingCPU:
		s = pick("lacks", "lack") + " CPU features of " + strings.Join(req.CPUFeatures, ",")
	case noMemory:
		s = fmt.Sprintf("%s %d MB free beyond %s reserve", pick("lacks", "lack"), need.MemoryMB, pick("its", "their"))
	case noVCPUs:
		s = fmt.Sprintf("%s %g vCPU free", pick("lacks", "lack"), need.VCPUs)
	case noSlot:
		s = pick("has", "have") + " no sandbox slot free"
	case noFreeMemory:
		s = fmt.Sprintf("%s %d MB of memory free now (MemAvailable beyond %s floor)", pick("lacks", "lack"), need.takes, pick("its", "their"))
	}
	return fmt.Sprintf("%d %s", count, s)
}

func selectorString(sel map[string]string) string {
	keys := make([]string, 0, len(sel))
	for k := range sel {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for i, k := range keys {
		keys[i] = k + "=" + sel[k]
	}
	return strings.Join(keys, ",")
}

func sizeString(need item) string {
	return fmt.Sprintf("%d MB, %g vCPU", need.MemoryMB, need.VCPUs)
}

// lead opens a refusal: what was asked and how much of it fit.
func lead(req *Request, need item, placed int) string {
	if req.Count == 1 {
		return fmt.Sprintf("no node can take a sandbox of %s", sizeString(need))
	}
	return fmt.Sprintf("only %d of %d sandboxes of %s each fit", placed, req.Count, sizeString(need))
}

// exhausted builds the ErrResourceLimit for a request whose items did not
// all fit, out being those that did: how many nodes each reason ruled out.
func (p *planner) exhausted(out []string) error {
	req, need := &p.req, p.need
	nodes := p.view.Nodes
	if len(nodes) == 0 {
		return fmt.Errorf("%w: %s: the fleet has no nodes", errdefs.ErrResourceLimit, lead(req, need, 0))
	}
	placed := make(map[string]int, len(out))
	for _, id := range out {
		placed[id]++
	}
	var counts [nReasons]int
	for i := range nodes {
		counts[reasonOf(&nodes[i], req, need, placed[nodes[i].ID])]++
	}
	parts := make([]string, 0, nReasons)
	// Capacity first (the usual answer), then the exclusions.
	for _, r := range []reason{noMemory, noFreeMemory, noVCPUs, noSlot, draining, lost, avoided, selectorMismatch, otherBuild, missingCPU, badFigures} {
		if counts[r] > 0 {
			parts = append(parts, phrase(r, counts[r], req, need))
		}
	}
	of := fmt.Sprintf("of %d nodes", len(nodes))
	if len(nodes) == 1 {
		of = "of 1 node"
	}
	return fmt.Errorf("%w: %s: %s, %s", errdefs.ErrResourceLimit, lead(req, need, len(out)), of, strings.Join(parts, ", "))
}

// placeHint puts every item on the node req.Hint names, or says why not.
func placeHint(view View, req Request, need item) (Placement, error) {
	i := slices.IndexFunc(view.Nodes, func(n NodeView) bool { return n.ID == req.Hint })
	if i < 0 {
		return Placement{}, errdefs.NotFoundf("hinted node %q is not in the fleet", req.Hint)
	}
	n := &view.Nodes[i]
	out := make([]string, 0, req.Count)
	if eligible(n, &req) {
		c := candAt(view.Nodes, i)
		for len(out) < req.Count && c.fits(need) {
			c.take(need)
			out = append(out, n.ID)
		}
		if len(out) == req.Count {
			return Placement{Nodes: out}, nil
		}
	}
	r := reasonOf(n, &req, need, len(out))
	what := strings.TrimPrefix(phrase(r, 1, &req, need), "1 ")
	if r == missingCPU {
		what = "lacks CPU features " + strings.Join(missing(n.CPUFeatures, req.CPUFeatures), ",")
	}
	if r == otherBuild {
		what = fmt.Sprintf("runs runsc build %q, not %q, and has no blob store to get it from", n.RunscBuild, req.RunscBuild)
	}
	err := fmt.Errorf("%w: %s: hinted node %s %s", errdefs.ErrResourceLimit, lead(&req, need, len(out)), n.ID, what)
	if req.Partial && len(out) > 0 {
		return Placement{Nodes: out, Short: err}, nil
	}
	return Placement{}, err
}

func missing(have, want []string) []string {
	var m []string
	for _, w := range want {
		if !slices.Contains(have, w) {
			m = append(m, w)
		}
	}
	return m
}
