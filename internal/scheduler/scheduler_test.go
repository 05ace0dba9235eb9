package scheduler_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/scheduler"
)

// node returns a ready node with memMB of memory, 8 vCPUs and slots
// sandbox slots, nothing used or reserved; options adjust it.
func node(id string, memMB int64, slots int, opts ...func(*scheduler.NodeView)) scheduler.NodeView {
	n := scheduler.NodeView{
		ID:          id,
		Capacity:    scheduler.Resources{MemoryMB: memMB, VCPUs: 8, Sandboxes: slots},
		RunscBuild:  "release-20250101.0",
		CPUFeatures: []string{"sse4_2", "avx2"},
	}
	for _, o := range opts {
		o(&n)
	}
	return n
}

func used(memMB int64, vcpus float64, sandboxes int) func(*scheduler.NodeView) {
	return func(n *scheduler.NodeView) {
		n.Used = scheduler.Resources{MemoryMB: memMB, VCPUs: vcpus, Sandboxes: sandboxes}
	}
}

func reserved(memMB int64) func(*scheduler.NodeView) {
	return func(n *scheduler.NodeView) { n.Reserved.MemoryMB = memMB }
}

func vcpus(v float64) func(*scheduler.NodeView) {
	return func(n *scheduler.NodeView) { n.Capacity.VCPUs = v }
}

func overcommit(mem, cpu float64) func(*scheduler.NodeView) {
	return func(n *scheduler.NodeView) { n.Overcommit = scheduler.Overcommit{Memory: mem, VCPUs: cpu} }
}

func isDraining(n *scheduler.NodeView) { n.Draining = true }
func isBusy(n *scheduler.NodeView)     { n.Busy = true }
func durable(n *scheduler.NodeView)    { n.Durable = true }
func isLost(n *scheduler.NodeView)     { n.Lost = true }

func labels(kv ...string) func(*scheduler.NodeView) {
	return func(n *scheduler.NodeView) {
		n.Labels = map[string]string{}
		for i := 0; i < len(kv); i += 2 {
			n.Labels[kv[i]] = kv[i+1]
		}
	}
}

func build(b string) func(*scheduler.NodeView) {
	return func(n *scheduler.NodeView) { n.RunscBuild = b }
}

func features(f ...string) func(*scheduler.NodeView) {
	return func(n *scheduler.NodeView) { n.CPUFeatures = f }
}

func caches(names ...string) func(*scheduler.NodeView) {
	return func(n *scheduler.NodeView) {
		n.Cached = map[string]bool{}
		for _, s := range names {
			n.Cached[s] = true
		}
	}
}

// req is a create of one sandbox of memMB and one vCPU.
func req(memMB int64, opts ...func(*scheduler.Request)) scheduler.Request {
	r := scheduler.Request{Count: 1, Each: scheduler.Resources{MemoryMB: memMB, VCPUs: 1}}
	for _, o := range opts {
		o(&r)
	}
	return r
}

func count(n int) func(*scheduler.Request) { return func(r *scheduler.Request) { r.Count = n } }
func source(s string) func(*scheduler.Request) {
	return func(r *scheduler.Request) { r.Source = s }
}
func origin(s string) func(*scheduler.Request) { return func(r *scheduler.Request) { r.Origin = s } }
func hint(s string) func(*scheduler.Request)   { return func(r *scheduler.Request) { r.Hint = s } }
func each(memMB int64, v float64) func(*scheduler.Request) {
	return func(r *scheduler.Request) { r.Each = scheduler.Resources{MemoryMB: memMB, VCPUs: v} }
}
func selector(kv ...string) func(*scheduler.Request) {
	return func(r *scheduler.Request) {
		r.Selector = map[string]string{}
		for i := 0; i < len(kv); i += 2 {
			r.Selector[kv[i]] = kv[i+1]
		}
	}
}
func needBuild(b string) func(*scheduler.Request) {
	return func(r *scheduler.Request) { r.RunscBuild = b }
}
func needFeatures(f ...string) func(*scheduler.Request) {
	return func(r *scheduler.Request) { r.CPUFeatures = f }
}

func nodes(n ...scheduler.NodeView) scheduler.View { return scheduler.View{Nodes: n} }

// rep returns id n times (expected placements).
func rep(id string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = id
	}
	return out
}

type placeCase struct {
	name string
	view scheduler.View
	req  scheduler.Request
	want []string // nodes, in order; nil when an error is expected
	kind error    // expected error kind
	msg  []string // substrings the error message must hold
}

func runCases(t *testing.T, cases []placeCase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p, err := scheduler.Place(c.view, c.req)
			if c.kind != nil {
				if !errors.Is(err, c.kind) {
					t.Fatalf("Place = %v, %v; want error of kind %v", p.Nodes, err, c.kind)
				}
				for _, m := range c.msg {
					if !strings.Contains(err.Error(), m) {
						t.Errorf("error %q does not say %q", err, m)
					}
				}
				if p.Nodes != nil {
					t.Errorf("failed Place returned nodes %v", p.Nodes)
				}
				return
			}
			if err != nil {
				t.Fatalf("Place: %v", err)
			}
			if !slices.Equal(p.Nodes, c.want) {
				t.Fatalf("Place = %v, want %v", p.Nodes, c.want)
			}
		})
	}
}

// tenths adds 0.1 n times at run time (constant arithmetic would be exact),
// the way vCPU sums of fractional sandboxes come out: 3 gives 0.30000000000000004.
func tenths(n int) float64 {
	v := 0.0
	for range n {
		v += 0.1
	}
	return v
}

// Capacity: memory, vCPUs and sandbox slots are hard limits, and the
// node's admission reserve is never handed out.
func TestCapacity(t *testing.T) {
	if 0.4-tenths(3) >= 0.1 {
		t.Fatal("0.4 - tenths(3) is exact: the rounding case below tests nothing")
	}
	runCases(t, []placeCase{
		{name: "memory fits exactly", view: nodes(node("a", 4096, 10, reserved(1024), used(2560, 0, 3))),
			req: req(512), want: []string{"a"}},
		{name: "one MB short", view: nodes(node("a", 4096, 10, reserved(1024), used(2561, 0, 3))),
			req: req(512), kind: errdefs.ErrResourceLimit, msg: []string{"1 lacks 512 MB free beyond its reserve"}},
		{name: "reserve is not handed out", view: nodes(node("a", 2048, 10, reserved(1024))),
			req: req(1536), kind: errdefs.ErrResourceLimit, msg: []string{"reserve"}},
		{name: "reserve decides between nodes", view: nodes(
			node("a", 8192, 10, reserved(7000)), // emptier by capacity, but only 1192 MB allocatable
			node("b", 8192, 10, reserved(1024), used(4096, 0, 4))),
			req: req(2048), want: []string{"b"}},
		{name: "count limit", view: nodes(node("a", 65536, 3, used(1024, 0, 3))),
			req: req(512), kind: errdefs.ErrResourceLimit, msg: []string{"1 has no sandbox slot free"}},
		{name: "count limit skips to the next node", view: nodes(
			node("a", 65536, 3, used(0, 0, 3)), node("b", 65536, 100, used(60000, 0, 50))),
			req: req(512), want: []string{"b"}},
		{name: "vCPU short", view: nodes(node("a", 8192, 10, vcpus(4), used(0, 3.5, 2))),
			req: req(512), kind: errdefs.ErrResourceLimit, msg: []string{"1 lacks 1 vCPU free"}},
		{name: "vCPU filled exactly by fractions", view: nodes(node("a", 8192, 10, vcpus(0.4), used(0, tenths(3), 3))),
			req: req(512, each(512, 0.1)), want: []string{"a"}},
		{name: "zero vCPU request fits a full CPU", view: nodes(node("a", 8192, 10, vcpus(2), used(0, 2, 2))),
			req: req(512, each(512, 0)), want: []string{"a"}},
		{name: "node with invalid figures takes nothing", view: nodes(node("a", 8192, 10, used(-4096, 0, 0))),
			req: req(512), kind: errdefs.ErrResourceLimit, msg: []string{"1 reports invalid capacity figures"}},
	})
}

// Overcommit: a node advertises its real memory and CPUs and the
// operator's ratios; placement may hand out capacity × ratio − reserved
// (the reserve is real memory, never multiplied), slots are never
// overcommitted, and a ratio of 0 (a node from before the setting) is 1.
func TestOvercommit(t *testing.T) {
	runCases(t, []placeCase{
		{name: "memory ratio multiplies capacity before the reserve", view: nodes(node("a", 4096, 100, reserved(1024), overcommit(10, 1), used(38912, 0, 3))),
			req: req(1024), want: []string{"a"}}, // 4096×10 − 1024 − 38912 = 1024
		{name: "one MB past capacity × ratio − reserve", view: nodes(node("a", 4096, 100, reserved(1024), overcommit(10, 1), used(38913, 0, 3))),
			req: req(1024), kind: errdefs.ErrResourceLimit, msg: []string{"1 lacks 1024 MB free beyond its reserve"}},
		{name: "without a ratio the same node is full", view: nodes(node("a", 4096, 100, reserved(1024), used(3072, 0, 3))),
			req: req(1024), kind: errdefs.ErrResourceLimit},
		{name: "ratio 0 reads as 1", view: nodes(node("a", 4096, 100, reserved(1024), overcommit(0, 0), used(2048, 0, 2))),
			req: req(1024), want: []string{"a"}},
		{name: "vCPU ratio", view: nodes(node("a", 65536, 100, vcpus(2), overcommit(1, 80), used(0, 158, 79))),
			req: req(512, each(512, 2)), want: []string{"a"}}, // 2×80 = 160 vCPUs
		{name: "vCPU ratio exhausted", view: nodes(node("a", 65536, 100, vcpus(2), overcommit(1, 80), used(0, 160, 80))),
			req: req(512, each(512, 2)), kind: errdefs.ErrResourceLimit, msg: []string{"1 lacks 2 vCPU free"}},
		{name: "slots are not overcommitted", view: nodes(node("a", 65536, 3, overcommit(100, 100), used(0, 0, 3))),
			req: req(512), kind: errdefs.ErrResourceLimit, msg: []string{"1 has no sandbox slot free"}},
		{name: "spread by the overcommitted figure", view: nodes(
			node("a", 8192, 100, overcommit(10, 10), used(40960, 0, 40)), // 41984/81920 = 51 % after the item
			node("b", 16384, 100, overcommit(1, 10), used(4096, 0, 4))),  // 5120/16384 = 31 %
			req: req(1024), want: []string{"b"}},
		{name: "the higher ratio takes more", view: nodes(
			node("a", 8192, 100, overcommit(10, 10), used(16384, 0, 16)), // 17408/81920 = 21 % after the item
			node("b", 16384, 100, overcommit(1, 10), used(4096, 0, 4))),  // 5120/16384 = 31 %
			req: req(1024), want: []string{"a"}},
		{name: "negative ratio is invalid", view: nodes(node("a", 8192, 10, overcommit(-1, 1))),
			req: req(512), kind: errdefs.ErrResourceLimit, msg: []string{"1 reports invalid capacity figures"}},
		{name: "NaN ratio is invalid", view: nodes(node("a", 8192, 10, overcommit(1, nan()))),
			req: req(512), kind: errdefs.ErrResourceLimit, msg: []string{"invalid capacity figures"}},
		{name: "ratio above the bound is invalid", view: nodes(node("a", 8192, 10, overcommit(scheduler.MaxOvercommit+1, 1))),
			req: req(512), kind: errdefs.ErrResourceLimit, msg: []string{"invalid capacity figures"}},
		{name: "hint honours the ratio", view: nodes(node("a", 4096, 100, overcommit(4, 8), used(15360, 0, 15)), node("b", 65536, 100)),
			req: req(1024, hint("a"), count(2)), kind: errdefs.ErrResourceLimit, msg: []string{"only 1 of 2"}},
	})
}

func nan() float64 { z := 0.0; return z / z }

// Exclusions: draining and lost nodes, label mismatches, and nodes that
// fail the compatibility gate (runsc build, CPU features) never get a
// sandbox, however empty they are.
func TestExclusions(t *testing.T) {
	full := used(60000, 0, 50) // b is the busy one in every case
	runCases(t, []placeCase{
		{name: "draining excluded", view: nodes(node("a", 65536, 100, isDraining), node("b", 65536, 100, full)),
			req: req(512), want: []string{"b"}},
		{name: "lost excluded", view: nodes(node("a", 65536, 100, isLost), node("b", 65536, 100, full)),
			req: req(512), want: []string{"b"}},
		{name: "selector matches all pairs", view: nodes(
			node("a", 65536, 100, labels("zone", "b")),
			node("b", 65536, 100, full, labels("zone", "b", "gpu", "a100")),
			node("c", 65536, 100, labels("gpu", "a100"))),
			req: req(512, selector("gpu", "a100", "zone", "b")), want: []string{"b"}},
		{name: "selector mismatch everywhere", view: nodes(node("a", 65536, 100, labels("zone", "a")), node("b", 65536, 100)),
			req: req(512, selector("zone", "b")), kind: errdefs.ErrResourceLimit,
			msg: []string{"2 do not match the selector zone=b"}},
		{name: "empty selector matches a node without labels", view: nodes(node("a", 65536, 100)),
			req: req(512), want: []string{"a"}},
		{name: "runsc build gate", view: nodes(node("a", 65536, 100, build("old")), node("b", 65536, 100, full, build("new"))),
			req: req(512, needBuild("new")), want: []string{"b"}},
		{name: "no build asked: any build", view: nodes(node("a", 65536, 100, build("old")), node("b", 65536, 100, full, build("new"))),
			req: req(512), want: []string{"a"}},
		{name: "runsc build gate refuses", view: nodes(node("a", 65536, 100, build("old"))),
			req: req(512, needBuild("new")), kind: errdefs.ErrResourceLimit,
			msg: []string{`1 neither runs nor can get runsc build "new" (no blob store)`}},
		// A node has the build a snapshot needs when it runs it, holds the
		// snapshot (it keeps the builds of what it holds) or is the fork's
		// origin (its source runs there); it can get it from the blob store.
		{name: "runsc build: a durable node gets it", view: nodes(node("a", 65536, 100, build("new")), node("b", 65536, 100, durable, build("new"))),
			req: req(512, needBuild("old")), want: []string{"b"}},
		{name: "runsc build: a holder of the source keeps it", view: nodes(node("a", 65536, 100, build("new")), node("b", 65536, 100, build("new"), caches("snap-1"))),
			req: req(512, needBuild("old"), source("snap-1")), want: []string{"b"}},
		{name: "runsc build: the fork's origin runs it", view: nodes(node("a", 65536, 100, build("new")), node("b", 65536, 100, build("new"))),
			req: req(512, needBuild("old"), origin("b"), count(2)), want: []string{"b", "b"}},
		{name: "runsc build: holding another source is not enough", view: nodes(node("a", 65536, 100, build("new"), caches("snap-2"))),
			req: req(512, needBuild("old"), source("snap-1")), kind: errdefs.ErrResourceLimit,
			msg: []string{`1 neither runs nor can get runsc build "old"`}},
		{name: "CPU features gate", view: nodes(
			node("a", 65536, 100, features("avx2")),
			node("b", 65536, 100, full, features("sse4_2", "avx2", "avx512f"))),
			req: req(512, needFeatures("avx512f", "avx2")), want: []string{"b"}},
		{name: "CPU features gate refuses", view: nodes(node("a", 65536, 100, features("avx2"))),
			req: req(512, needFeatures("avx512f")), kind: errdefs.ErrResourceLimit,
			msg: []string{"1 lacks CPU features of avx512f"}},
		{name: "everything excluded", view: nodes(node("a", 65536, 100, isDraining), node("b", 65536, 100, isLost)),
			req: req(512), kind: errdefs.ErrResourceLimit, msg: []string{"1 is draining", "1 is lost"}},
		{name: "empty fleet", view: nodes(),
			req: req(512), kind: errdefs.ErrResourceLimit, msg: []string{"the fleet has no nodes"}},
	})
}

// Locality, then spreading by least allocated fraction, then ID.
func TestRanking(t *testing.T) {
	runCases(t, []placeCase{
		{name: "locality beats spreading", view: nodes(
			node("a", 65536, 100),
			node("b", 65536, 100, used(50000, 0, 40), caches("snap-1"))),
			req: req(512, source("snap-1")), want: []string{"b"}},
		{name: "locality among several cachers spreads", view: nodes(
			node("a", 65536, 100),
			node("b", 65536, 100, used(50000, 0, 40), caches("tpl")),
			node("c", 65536, 100, used(30000, 0, 40), caches("tpl", "other"))),
			req: req(512, source("tpl")), want: []string{"c"}},
		{name: "cacher that is full spills to a non-cacher", view: nodes(
			node("a", 65536, 100, used(10000, 0, 5)),
			node("b", 65536, 100, used(65536, 0, 40), caches("tpl"))),
			req: req(512, source("tpl")), want: []string{"a"}},
		{name: "no source: cache ignored", view: nodes(
			node("a", 65536, 100),
			node("b", 65536, 100, used(50000, 0, 40), caches(""))),
			req: req(512), want: []string{"a"}},
		{name: "least allocated memory fraction, not most free MB", view: nodes(
			node("big", 102400, 1000, used(40960, 0, 10)),  // 40% + 0.5% after
			node("small", 10240, 1000, used(5120, 0, 10))), // 50% + 5% after
			req: req(512), want: []string{"big"}},
		{name: "fraction after placement favours the node the item fills less", view: nodes(
			node("tiny", 1024, 100),                      // 0% now, 100% after
			node("big", 65536, 100, used(16384, 0, 10))), // 25% now, ~26% after
			req: req(1024), want: []string{"big"}},
		{name: "memory tie: slot fraction decides", view: nodes(
			node("a", 65536, 100, used(8192, 0, 50)),
			node("b", 65536, 100, used(8192, 0, 10))),
			req: req(512), want: []string{"b"}},
		{name: "full tie: smaller ID", view: nodes(
			node("n2", 65536, 100), node("n10", 65536, 100), node("n1", 65536, 100)),
			req: req(512), want: []string{"n1"}},
		{name: "an idle node beats a busy one, however full", view: nodes(
			node("busy", 65536, 100, isBusy),
			node("idle", 65536, 100, used(60000, 0, 90))),
			req: req(512), want: []string{"idle"}},
		{name: "busy nodes only: spread among them", view: nodes(
			node("a", 65536, 100, isBusy, used(30000, 0, 10)),
			node("b", 65536, 100, isBusy)),
			req: req(512), want: []string{"b"}},
		{name: "an idle node that does not fit leaves the busy one", view: nodes(
			node("busy", 65536, 100, isBusy),
			node("idle", 65536, 100, used(65536, 0, 90))),
			req: req(512), want: []string{"busy"}},
		{name: "locality beats idleness", view: nodes(
			node("idle", 65536, 100),
			node("busy", 65536, 100, isBusy, caches("snap-1"))),
			req: req(512, source("snap-1")), want: []string{"busy"}},
	})
}

// The operator hint pins every item to one node or fails, saying why.
func TestHint(t *testing.T) {
	runCases(t, []placeCase{
		{name: "hint overrides ranking", view: nodes(node("a", 65536, 100), node("b", 65536, 100, used(60000, 0, 50))),
			req: req(512, hint("b")), want: []string{"b"}},
		{name: "hint for several items", view: nodes(node("a", 65536, 100), node("b", 65536, 100)),
			req: req(512, hint("b"), count(3)), want: rep("b", 3)},
		{name: "hint beats origin", view: nodes(node("a", 65536, 100), node("b", 65536, 100)),
			req: req(512, hint("b"), origin("a"), count(2)), want: rep("b", 2)},
		{name: "unknown node", view: nodes(node("a", 65536, 100)),
			req: req(512, hint("zz")), kind: errdefs.ErrNotFound, msg: []string{`"zz"`}},
		{name: "draining node", view: nodes(node("a", 65536, 100, isDraining)),
			req: req(512, hint("a")), kind: errdefs.ErrResourceLimit, msg: []string{"hinted node a is draining"}},
		{name: "lost node", view: nodes(node("a", 65536, 100, isLost)),
			req: req(512, hint("a")), kind: errdefs.ErrResourceLimit, msg: []string{"hinted node a is lost"}},
		{name: "full node", view: nodes(node("a", 4096, 100, used(4000, 0, 3)), node("b", 65536, 100)),
			req: req(512, hint("a")), kind: errdefs.ErrResourceLimit, msg: []string{"hinted node a lacks 512 MB free beyond its reserve"}},
		{name: "node fits only some", view: nodes(node("a", 65536, 3), node("b", 65536, 100)),
			req: req(512, hint("a"), count(5)), kind: errdefs.ErrResourceLimit,
			msg: []string{"only 3 of 5 sandboxes", "hinted node a has no sandbox slot free"}},
		{name: "selector still applies", view: nodes(node("a", 65536, 100, labels("zone", "a"))),
			req: req(512, hint("a"), selector("zone", "b")), kind: errdefs.ErrResourceLimit,
			msg: []string{"hinted node a does not match the selector zone=b"}},
		{name: "build gate names both builds", view: nodes(node("a", 65536, 100, build("old"))),
			req: req(512, hint("a"), needBuild("new")), kind: errdefs.ErrResourceLimit,
			msg: []string{`hinted node a runs runsc build "old", not "new", and has no blob store to get it from`}},
		{name: "build gate: a hinted durable node gets it", view: nodes(node("a", 65536, 100, build("old"), durable)),
			req: req(512, hint("a"), needBuild("new")), want: []string{"a"}},
		{name: "CPU gate names the missing features", view: nodes(node("a", 65536, 100, features("avx2", "sse4_2"))),
			req: req(512, hint("a"), needFeatures("sse4_2", "avx512f", "amx")), kind: errdefs.ErrResourceLimit,
			msg: []string{"hinted node a lacks CPU features avx512f,amx"}},
	})
}

// Fork: children fill the origin while it fits, then spill by the same
// rules, with Used updated as each child is placed.
func TestFork(t *testing.T) {
	// origin has room for 4 children of 1 GiB beyond its reserve.
	orig := node("o", 8192, 100, reserved(1024), used(3072, 0, 3))
	three := nodes(orig, node("x", 65536, 100), node("y", 65536, 100), node("z", 65536, 100))
	runCases(t, []placeCase{
		{name: "origin first, then spread", view: three, req: req(1024, count(10), origin("o")),
			want: append(rep("o", 4), "x", "y", "z", "x", "y", "z")},
		{name: "all on origin when it fits", view: three, req: req(1024, count(3), origin("o")),
			want: rep("o", 3)},
		{name: "one child spills", view: nodes(node("o", 8192, 100, used(8000, 0, 3)), node("b", 65536, 100, used(60000, 0, 50)), node("a", 65536, 100, used(60000, 0, 50))),
			req: req(512, origin("o")), want: []string{"a"}},
		{name: "origin not first in the view", view: nodes(node("x", 65536, 100), node("y", 65536, 100), orig),
			req: req(1024, count(6), origin("o")), want: append(rep("o", 4), "x", "y")},
		{name: "draining origin gets none", view: nodes(node("o", 65536, 100, isDraining), node("x", 65536, 100)),
			req: req(1024, count(2), origin("o")), want: rep("x", 2)},
		{name: "origin outside the selector gets none", view: nodes(node("o", 65536, 100), node("x", 65536, 100, labels("pool", "rl"))),
			req: req(1024, count(2), origin("o"), selector("pool", "rl")), want: rep("x", 2)},
		{name: "a busy origin still takes its children", view: nodes(node("o", 65536, 100, isBusy), node("x", 65536, 100)),
			req: req(1024, count(3), origin("o")), want: rep("o", 3)},
		{name: "spill goes to idle nodes first", view: nodes(orig, node("x", 65536, 100, isBusy), node("y", 65536, 100, used(30000, 0, 30))),
			req: req(1024, count(6), origin("o")), want: append(rep("o", 4), "y", "y")},
		{name: "origin not in the view: plain spread", view: nodes(node("x", 65536, 100), node("y", 65536, 100)),
			req: req(1024, count(4), origin("gone")), want: []string{"x", "y", "x", "y"}},
		{name: "spill prefers nodes caching the snapshot", view: nodes(orig, node("x", 65536, 100), node("y", 65536, 100, used(30000, 0, 30), caches("snap"))),
			req: req(1024, count(6), origin("o"), source("snap")), want: append(rep("o", 4), "y", "y")},
		{name: "all or nothing", view: nodes(node("o", 4096, 100), node("x", 4096, 2)),
			req: req(1024, count(10), origin("o")), kind: errdefs.ErrResourceLimit,
			msg: []string{"only 6 of 10 sandboxes of 1024 MB, 1 vCPU each fit: of 2 nodes, 1 lacks 1024 MB free beyond its reserve, 1 has no sandbox slot free"}},
	})
}

// A fork of 100 children over 10 empty nodes spreads them evenly (Used is
// updated per child, so they do not all go to the first best node).
func TestForkSpreads(t *testing.T) {
	var v scheduler.View
	for _, id := range []string{"n0", "n1", "n2", "n3", "n4", "n5", "n6", "n7", "n8", "n9"} {
		v.Nodes = append(v.Nodes, node(id, 65536, 100))
	}
	p, err := scheduler.Place(v, req(512, count(100), origin("n3"), each(512, 0)))
	if err != nil {
		t.Fatal(err)
	}
	per := map[string]int{}
	for _, id := range p.Nodes {
		per[id]++
	}
	// The origin (n3) fits all 100 by capacity: origin first wins.
	if per["n3"] != 100 {
		t.Fatalf("origin got %d of 100 (%v)", per["n3"], per)
	}
	// 5 children over the 10 empty nodes: one each, on the smallest IDs.
	p, err = scheduler.Place(v, req(512, count(5), each(512, 0)))
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"n0", "n1", "n2", "n3", "n4"}; !slices.Equal(p.Nodes, want) {
		t.Fatalf("5 children over 10 empty nodes: %v, want %v", p.Nodes, want)
	}
	p, err = scheduler.Place(v, req(512, count(100), each(512, 0)))
	if err != nil {
		t.Fatal(err)
	}
	clear(per)
	for _, id := range p.Nodes {
		per[id]++
	}
	for _, n := range v.Nodes {
		if per[n.ID] != 10 {
			t.Fatalf("without an origin, 100 children over 10 empty nodes: %v, want 10 each", per)
		}
	}
}

// The exact wording of a refusal, so an operator reading a 429 learns why.
func TestRefusalMessage(t *testing.T) {
	v := nodes(
		node("a", 4096, 100, reserved(1024), used(3000, 0, 2)),
		node("b", 4096, 100, used(3800, 0, 2)),
		node("c", 65536, 100, isDraining),
		node("d", 65536, 100, isLost),
		node("e", 65536, 2, used(0, 0, 2)),
	)
	_, err := scheduler.Place(v, req(512))
	want := "resource exhausted: no node can take a sandbox of 512 MB, 1 vCPU: of 5 nodes, " +
		"2 lack 512 MB free beyond their reserve, 1 has no sandbox slot free, 1 is draining, 1 is lost"
	if err == nil || err.Error() != want {
		t.Fatalf("got  %v\nwant %s", err, want)
	}
}

func TestInvalidRequest(t *testing.T) {
	v := nodes(node("a", 65536, 100))
	nan := 0.0
	nan /= nan
	runCases(t, []placeCase{
		{name: "count 0", view: v, req: req(512, count(0)), kind: errdefs.ErrInvalidArgument, msg: []string{"count 0"}},
		{name: "count over max", view: v, req: req(512, count(scheduler.MaxCount+1)), kind: errdefs.ErrInvalidArgument},
		{name: "negative memory", view: v, req: req(-1), kind: errdefs.ErrInvalidArgument, msg: []string{"negative"}},
		{name: "NaN vCPUs", view: v, req: req(512, each(512, nan)), kind: errdefs.ErrInvalidArgument},
		{name: "negative vCPUs", view: v, req: req(512, each(512, -1)), kind: errdefs.ErrInvalidArgument},
		{name: "huge memory", view: v, req: req(1 << 50), kind: errdefs.ErrInvalidArgument},
		{name: "item of two sandboxes", view: v, req: func() scheduler.Request {
			r := req(512)
			r.Each.Sandboxes = 2
			return r
		}(), kind: errdefs.ErrInvalidArgument},
	})
}

// Place never writes to the view it is given.
func TestViewUnchanged(t *testing.T) {
	v := nodes(node("a", 65536, 100, used(100, 1, 1)), node("b", 4096, 100))
	before := slices.Clone(v.Nodes)
	if _, err := scheduler.Place(v, req(1024, count(10), origin("b"), each(1024, 0.5))); err != nil {
		t.Fatal(err)
	}
	for i := range v.Nodes {
		if v.Nodes[i].Used != before[i].Used {
			t.Fatalf("node %s Used changed: %+v -> %+v", v.Nodes[i].ID, before[i].Used, v.Nodes[i].Used)
		}
	}
}

// Avoid rules nodes out: the items go elsewhere, and with every node
// avoided the refusal says so.
func TestAvoid(t *testing.T) {
	v := scheduler.View{Nodes: []scheduler.NodeView{node("a", 8192, 10), node("b", 8192, 10, used(4096, 2, 2))}}
	p, err := scheduler.Place(v, scheduler.Request{Count: 2, Each: scheduler.Resources{MemoryMB: 1024, VCPUs: 1}, Avoid: []string{"a"}})
	if err != nil || p.Nodes[0] != "b" || p.Nodes[1] != "b" {
		t.Fatalf("avoiding a: %v %v", p, err)
	}
	_, err = scheduler.Place(v, scheduler.Request{Count: 1, Each: scheduler.Resources{MemoryMB: 1024, VCPUs: 1}, Avoid: []string{"a", "b"}})
	if err == nil || !strings.Contains(err.Error(), "ruled out by the request") {
		t.Fatalf("avoiding both: %v", err)
	}
}
