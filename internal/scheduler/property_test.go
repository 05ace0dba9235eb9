package scheduler_test

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/scheduler"
	"github.com/spore-run/spore/internal/testenv"
)

// Property tests: random fleets and requests from a seeded source (the
// seed is logged; SPORE_TEST_SEED=N replays it).

const vcpuSlack = 1e-6 // float rounding allowed when checking vCPU sums

// randomView makes n nodes with a mix of sizes, loads (some already over
// capacity), exclusions, labels, builds, CPU features and caches.
func randomView(r *rand.Rand, n int) scheduler.View {
	pick := func(s ...string) string { return s[r.IntN(len(s))] }
	v := scheduler.View{Nodes: make([]scheduler.NodeView, n)}
	// A third of the fleets are uniform and nearly empty, where spreading
	// decides every item; the rest are mixed and loaded.
	uniform := r.IntN(3) == 0
	for i := range v.Nodes {
		capMem := []int64{2048, 4096, 16384, 65536, 262144}[r.IntN(5)]
		capCPU := []float64{1, 2, 7.5, 32}[r.IntN(4)]
		slots := 1 + r.IntN(200)
		if uniform {
			capMem, capCPU, slots = 65536, 32, 100
		}
		nv := scheduler.NodeView{
			ID:         fmt.Sprintf("node-%04d", i),
			Capacity:   scheduler.Resources{MemoryMB: capMem, VCPUs: capCPU, Sandboxes: slots},
			Reserved:   scheduler.Resources{MemoryMB: int64(r.IntN(3)) * 1024},
			Used:       scheduler.Resources{MemoryMB: r.Int64N(capMem + capMem/10), VCPUs: math.Round(r.Float64()*capCPU*1.1*4) / 4, Sandboxes: r.IntN(slots + 2)},
			Draining:   r.IntN(10) == 0,
			Lost:       r.IntN(10) == 0,
			RunscBuild: pick("b1", "b2"),
			Labels:     map[string]string{"zone": pick("a", "b", "c")},
			Durable:    r.IntN(3) == 0,
		}
		if r.IntN(3) == 0 {
			nv.Labels["pool"] = "rl"
		}
		for _, f := range []string{"sse4_2", "avx2", "avx512f"} {
			if r.IntN(3) > 0 {
				nv.CPUFeatures = append(nv.CPUFeatures, f)
			}
		}
		if r.IntN(2) == 0 {
			nv.Cached = map[string]bool{}
			for _, s := range []string{"tpl", "snap-1", "snap-2"} {
				if r.IntN(2) == 0 {
					nv.Cached[s] = true
				}
			}
		}
		// Most nodes overcommit (their Used may then exceed Capacity
		// legitimately); ratio 0 is a node from before the setting.
		if r.IntN(4) > 0 {
			oc := []float64{0, 0.5, 1, 1.5, 10, 80}
			nv.Overcommit = scheduler.Overcommit{Memory: oc[r.IntN(len(oc))], VCPUs: oc[r.IntN(len(oc))]}
			if nv.Overcommit.Memory > 1 {
				nv.Used.MemoryMB = r.Int64N(int64(float64(capMem)*nv.Overcommit.Memory) + 1)
			}
		}
		if uniform {
			nv.Used = scheduler.Resources{MemoryMB: int64(r.IntN(2)) * 512, Sandboxes: r.IntN(2)}
			nv.Reserved = scheduler.Resources{}
		}
		if r.IntN(50) == 0 {
			nv.Used.MemoryMB = -1 // a node reporting nonsense
		}
		v.Nodes[i] = nv
	}
	r.Shuffle(len(v.Nodes), func(i, j int) { v.Nodes[i], v.Nodes[j] = v.Nodes[j], v.Nodes[i] })
	return v
}

func randomRequest(r *rand.Rand, v scheduler.View) scheduler.Request {
	req := scheduler.Request{
		Count: 1,
		Each: scheduler.Resources{
			MemoryMB: []int64{0, 256, 512, 1024, 4096}[r.IntN(5)],
			VCPUs:    []float64{0, 0.25, 0.5, 1, 2}[r.IntN(5)],
		},
		Source: []string{"", "tpl", "snap-1"}[r.IntN(3)],
	}
	if r.IntN(2) == 0 {
		req.Count = 1 + r.IntN(120)
	}
	someNode := func() string {
		if len(v.Nodes) == 0 || r.IntN(8) == 0 {
			return "not-a-node"
		}
		return v.Nodes[r.IntN(len(v.Nodes))].ID
	}
	if r.IntN(2) == 0 {
		req.Origin = someNode()
	}
	if r.IntN(15) == 0 {
		req.Hint = someNode()
	}
	if r.IntN(3) == 0 {
		req.Selector = map[string]string{"zone": []string{"a", "b"}[r.IntN(2)]}
		if r.IntN(2) == 0 {
			req.Selector["pool"] = "rl"
		}
	}
	if r.IntN(3) == 0 {
		req.RunscBuild = "b1"
	}
	if r.IntN(3) == 0 {
		req.CPUFeatures = []string{"avx2"}
		if r.IntN(2) == 0 {
			req.CPUFeatures = append(req.CPUFeatures, "avx512f")
		}
	}
	return req
}

// excludedWhy says why n may not run req's sandboxes at all, or "".
// Written apart from the scheduler's code, as the specification.
func excludedWhy(n *scheduler.NodeView, req scheduler.Request) string {
	switch {
	case n.Used.MemoryMB < 0 || n.Used.VCPUs < 0 || n.Used.Sandboxes < 0 ||
		n.Capacity.MemoryMB < 0 || n.Capacity.VCPUs < 0 || n.Capacity.Sandboxes < 0 ||
		n.Reserved.MemoryMB < 0 || n.Reserved.VCPUs < 0 || n.Reserved.Sandboxes < 0 ||
		!(n.Overcommit.Memory >= 0 && n.Overcommit.Memory <= scheduler.MaxOvercommit) ||
		!(n.Overcommit.VCPUs >= 0 && n.Overcommit.VCPUs <= scheduler.MaxOvercommit):
		return "invalid figures"
	case n.Lost:
		return "lost"
	case n.Draining:
		return "draining"
	case req.RunscBuild != "" && n.RunscBuild != req.RunscBuild && !n.Durable &&
		!(req.Source != "" && n.Cached[req.Source]) && !(req.Origin != "" && n.ID == req.Origin):
		return "runsc build"
	}
	for k, want := range req.Selector {
		if n.Labels[k] != want {
			return "selector"
		}
	}
	for _, f := range req.CPUFeatures {
		if !slices.Contains(n.CPUFeatures, f) {
			return "cpu feature"
		}
	}
	return ""
}

// alloc is what may be placed on n: capacity × overcommit (0 = 1) −
// reserved, slots not multiplied. The specification's own arithmetic.
func alloc(n *scheduler.NodeView) scheduler.Resources {
	mr, cr := n.Overcommit.Memory, n.Overcommit.VCPUs
	if mr == 0 {
		mr = 1
	}
	if cr == 0 {
		cr = 1
	}
	return scheduler.Resources{
		MemoryMB:  int64(float64(n.Capacity.MemoryMB)*mr) - n.Reserved.MemoryMB,
		VCPUs:     n.Capacity.VCPUs*cr - n.Reserved.VCPUs,
		Sandboxes: n.Capacity.Sandboxes - n.Reserved.Sandboxes,
	}
}

// checkPlacement asserts the safety properties of a successful placement:
// the right number of items, only eligible nodes, nobody over capacity.
func checkPlacement(t *testing.T, v scheduler.View, req scheduler.Request, p scheduler.Placement) {
	t.Helper()
	if len(p.Nodes) != req.Count {
		t.Fatalf("placed %d items, asked %d", len(p.Nodes), req.Count)
	}
	byID := map[string]*scheduler.NodeView{}
	for i := range v.Nodes {
		byID[v.Nodes[i].ID] = &v.Nodes[i]
	}
	per := map[string]int{}
	for _, id := range p.Nodes {
		n, ok := byID[id]
		if !ok {
			t.Fatalf("placed on %q, not in the view", id)
		}
		if why := excludedWhy(n, req); why != "" {
			t.Fatalf("placed on excluded node %s (%s)", id, why)
		}
		if req.Hint != "" && id != req.Hint {
			t.Fatalf("placed on %s, hint was %s", id, req.Hint)
		}
		per[id]++
	}
	for id, k := range per {
		n := byID[id]
		mem := n.Used.MemoryMB + int64(k)*req.Each.MemoryMB
		cpu := n.Used.VCPUs + float64(k)*req.Each.VCPUs
		slots := n.Used.Sandboxes + k
		a := alloc(n)
		if mem > a.MemoryMB || cpu > a.VCPUs+vcpuSlack || slots > a.Sandboxes {
			t.Fatalf("node %s over capacity after %d items: used %d MB %g vCPU %d slots; capacity %+v overcommit %+v reserved %+v",
				id, k, mem, cpu, slots, n.Capacity, n.Overcommit, n.Reserved)
		}
	}
}

// reference is the policy written the slow, obvious way: for every item,
// the origin if it fits, else sort every fitting node by the ranking and
// take the first. Place must agree with it exactly.
func reference(v scheduler.View, req scheduler.Request) ([]string, error) {
	need := req.Each
	need.Sandboxes = 1
	type st struct {
		n    *scheduler.NodeView
		used scheduler.Resources
	}
	nodes := make([]*st, 0, len(v.Nodes))
	for i := range v.Nodes {
		n := &v.Nodes[i]
		if req.Hint != "" && n.ID != req.Hint {
			continue
		}
		if excludedWhy(n, req) == "" {
			nodes = append(nodes, &st{n: n, used: n.Used})
		}
	}
	fits := func(s *st) bool {
		a := alloc(s.n)
		return a.Sandboxes-s.used.Sandboxes >= 1 &&
			a.MemoryMB-s.used.MemoryMB >= need.MemoryMB &&
			a.VCPUs-s.used.VCPUs+1e-9 >= need.VCPUs
	}
	frac := func(u, a float64) float64 {
		if a <= 0 {
			return 1
		}
		return u / a
	}
	cached := func(s *st) bool { return req.Source != "" && s.n.Cached[req.Source] }
	var out []string
	for range req.Count {
		var fit []*st
		var orig *st
		for _, s := range nodes {
			if fits(s) {
				fit = append(fit, s)
				if req.Origin != "" && s.n.ID == req.Origin {
					orig = s
				}
			}
		}
		if len(fit) == 0 {
			return nil, errdefs.ErrResourceLimit
		}
		best := orig
		if best == nil {
			slices.SortFunc(fit, func(a, b *st) int {
				if c := cmp.Compare(btoi(cached(b)), btoi(cached(a))); c != 0 {
					return c
				}
				fa := frac(float64(a.used.MemoryMB+need.MemoryMB), float64(alloc(a.n).MemoryMB))
				fb := frac(float64(b.used.MemoryMB+need.MemoryMB), float64(alloc(b.n).MemoryMB))
				if c := cmp.Compare(fa, fb); c != 0 {
					return c
				}
				fa = frac(float64(a.used.Sandboxes+1), float64(alloc(a.n).Sandboxes))
				fb = frac(float64(b.used.Sandboxes+1), float64(alloc(b.n).Sandboxes))
				if c := cmp.Compare(fa, fb); c != 0 {
					return c
				}
				return cmp.Compare(a.n.ID, b.n.ID)
			})
			best = fit[0]
		}
		best.used.MemoryMB += need.MemoryMB
		best.used.VCPUs += need.VCPUs
		best.used.Sandboxes++
		out = append(out, best.n.ID)
	}
	return out, nil
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Random fleets and requests: every placement is safe (never over
// capacity, never on an excluded node), agrees with the reference policy,
// and is the same on a second call and with the nodes in another order.
func TestPlaceProperties(t *testing.T) {
	r := testenv.Rand(t)
	var placed, multi, spilled, refused, unknown int
	for i := range 3000 {
		v := randomView(r, []int{0, 1, 3, 40, 40, 200}[r.IntN(6)])
		req := randomRequest(r, v)
		p, err := scheduler.Place(v, req)
		label := fmt.Sprintf("case %d: %d nodes, request %+v", i, len(v.Nodes), req)

		again, err2 := scheduler.Place(v, req)
		shuffled := scheduler.View{Nodes: slices.Clone(v.Nodes)}
		r.Shuffle(len(shuffled.Nodes), func(i, j int) {
			shuffled.Nodes[i], shuffled.Nodes[j] = shuffled.Nodes[j], shuffled.Nodes[i]
		})
		other, err3 := scheduler.Place(shuffled, req)
		if fmt.Sprint(err) != fmt.Sprint(err2) || fmt.Sprint(err) != fmt.Sprint(err3) ||
			!slices.Equal(p.Nodes, again.Nodes) || !slices.Equal(p.Nodes, other.Nodes) {
			t.Fatalf("%s: not deterministic: %v %v / %v %v / shuffled %v %v", label, p.Nodes, err, again.Nodes, err2, other.Nodes, err3)
		}

		want, werr := reference(v, req)
		if req.Hint != "" && !slices.ContainsFunc(v.Nodes, func(n scheduler.NodeView) bool { return n.ID == req.Hint }) {
			if !errors.Is(err, errdefs.ErrNotFound) {
				t.Fatalf("%s: unknown hint gave %v, %v", label, p.Nodes, err)
			}
			unknown++
			continue
		}
		if werr != nil {
			if !errors.Is(err, errdefs.ErrResourceLimit) {
				t.Fatalf("%s: reference finds no room, Place gave %v, %v", label, p.Nodes, err)
			}
			refused++
			continue
		}
		if err != nil {
			t.Fatalf("%s: reference places %v, Place failed: %v", label, want, err)
		}
		checkPlacement(t, v, req, p)
		if !slices.Equal(p.Nodes, want) {
			t.Fatalf("%s:\nPlace     %v\nreference %v", label, p.Nodes, want)
		}
		placed++
		if req.Count > 1 {
			multi++
		}
		if req.Origin != "" && p.Nodes[0] == req.Origin && p.Nodes[len(p.Nodes)-1] != req.Origin {
			spilled++
		}
	}
	t.Logf("placed %d (%d of several items, %d forks that spilled off their origin), refused %d, unknown hint %d",
		placed, multi, spilled, refused, unknown)
	// The generator must exercise every path, or the properties prove little.
	if placed < 500 || multi < 200 || spilled < 10 || refused < 200 || unknown < 3 {
		t.Fatal("the random cases did not cover every outcome; adjust the generator")
	}
}

// bytes decodes fuzz input into figures, zeros when it runs out.
type bytesReader struct{ b []byte }

func (d *bytesReader) u64() uint64 {
	if len(d.b) < 8 {
		d.b = nil
		return 0
	}
	v := binary.LittleEndian.Uint64(d.b)
	d.b = d.b[8:]
	return v
}

func (d *bytesReader) byte() byte {
	if len(d.b) == 0 {
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

// small is a figure that is usually modest but may be negative or huge.
func (d *bytesReader) small() int64 {
	switch c := d.byte(); c % 8 {
	case 0:
		return int64(d.u64()) // anything, overflow bait
	case 1:
		return -int64(d.byte())
	default:
		return int64(c) * 64
	}
}

func (d *bytesReader) float() float64 {
	if d.byte()%4 == 0 {
		return math.Float64frombits(d.u64()) // NaN, Inf, denormals
	}
	return float64(d.byte()) / 8
}

func (d *bytesReader) res() scheduler.Resources {
	return scheduler.Resources{MemoryMB: d.small(), VCPUs: d.float(), Sandboxes: int(d.small())}
}

// Fuzz: arbitrary figures (negative, NaN, huge) must never panic, never
// place over capacity or on an excluded node, and return only the
// documented error kinds.
func FuzzPlace(f *testing.F) {
	f.Add([]byte{3, 1, 8, 2, 8, 8, 4, 16, 8, 2, 0, 8, 2, 0, 0})
	f.Add([]byte{9, 4, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25})
	f.Add([]byte{2, 200, 0, 255, 255, 255, 255, 255, 255, 255, 127, 4, 0, 0, 0, 0, 0, 0, 248, 127})
	f.Fuzz(func(t *testing.T, data []byte) {
		d := &bytesReader{b: data}
		n := int(d.byte() % 12)
		v := scheduler.View{Nodes: make([]scheduler.NodeView, n)}
		for i := range v.Nodes {
			flags := d.byte()
			v.Nodes[i] = scheduler.NodeView{
				ID:       fmt.Sprintf("n%d", i),
				Capacity: d.res(), Used: d.res(), Reserved: d.res(),
				Overcommit: scheduler.Overcommit{Memory: d.float(), VCPUs: d.float()},
				Draining:   flags&1 != 0, Lost: flags&2 != 0,
				RunscBuild:  []string{"", "b1"}[flags>>2&1],
				CPUFeatures: []string{"avx2", "avx512f"}[:flags>>3&1+flags>>4&1],
				Labels:      map[string]string{"zone": []string{"a", "b"}[flags>>5&1]},
				Cached:      map[string]bool{"tpl": flags>>6&1 != 0},
			}
		}
		flags := d.byte()
		req := scheduler.Request{
			Count: int(d.small()),
			Each:  scheduler.Resources{MemoryMB: d.small(), VCPUs: d.float(), Sandboxes: int(d.byte() % 3)},
		}
		if flags&1 != 0 {
			req.Source = "tpl"
		}
		if flags&2 != 0 && n > 0 {
			req.Origin = v.Nodes[int(d.byte())%n].ID
		}
		if flags&4 != 0 {
			req.Hint = fmt.Sprintf("n%d", d.byte()%16)
		}
		if flags&8 != 0 {
			req.Selector = map[string]string{"zone": "b"}
		}
		if flags&16 != 0 {
			req.RunscBuild = "b1"
		}
		if flags&32 != 0 {
			req.CPUFeatures = []string{"avx512f"}
		}
		p, err := scheduler.Place(v, req)
		again, err2 := scheduler.Place(v, req)
		if fmt.Sprint(err) != fmt.Sprint(err2) || !slices.Equal(p.Nodes, again.Nodes) {
			t.Fatalf("not deterministic: %v %v / %v %v", p.Nodes, err, again.Nodes, err2)
		}
		if err != nil {
			if !errors.Is(err, errdefs.ErrResourceLimit) && !errors.Is(err, errdefs.ErrInvalidArgument) && !errors.Is(err, errdefs.ErrNotFound) {
				t.Fatalf("undocumented error kind: %v", err)
			}
			return
		}
		checkPlacement(t, v, req, p)
	})
}
