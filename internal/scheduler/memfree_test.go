package scheduler_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/scheduler"
)

func free(mb int64) func(*scheduler.NodeView) {
	return func(n *scheduler.NodeView) { n.MemoryFree = &mb }
}

func takes(mb int64) func(*scheduler.Request) { return func(r *scheduler.Request) { r.Takes = mb } }

func partial(r *scheduler.Request) { r.Partial = true }

// A node that reports the memory it really has free (MemAvailable beyond
// its floor) takes an item only while that covers what the item really
// takes, beside its limits: a fork's children fill the origin as far as
// its free memory goes and spill to nodes that have it; a node reporting
// nothing binds by its limits alone; a node under its floor takes nothing.
// Before, only limits (10x overcommitted) bound, and all went to the origin.
func TestRealFreeMemoryBinds(t *testing.T) {
	big := int64(1 << 20) // limits never bind here
	runCases(t, []placeCase{
		{name: "create goes where the memory is", view: nodes(node("a", big, 100, free(500)), node("b", big, 100, free(4000))),
			req: req(1024, takes(1000)), want: []string{"b"}},
		{name: "fork fills the origin's free memory, then spills", view: nodes(node("o", big, 100, free(2500)), node("x", big, 100, free(10000))),
			req: req(1024, count(5), origin("o"), takes(1000)), want: []string{"o", "o", "x", "x", "x"}},
		{name: "spill skips a node short of memory", view: nodes(node("o", big, 100, free(1000)), node("a", big, 100, free(900)), node("b", big, 100, free(3000))),
			req: req(1024, count(3), origin("o"), takes(1000)), want: []string{"o", "b", "b"}},
		{name: "a node reporting none binds by limits", view: nodes(node("o", 4096, 100, free(1000)), node("x", 4096, 100)),
			req: req(1024, count(5), origin("o"), takes(1000)), want: []string{"o", "x", "x", "x", "x"}},
		{name: "a node under its floor takes no create", view: nodes(node("a", big, 100, free(-100)), node("b", big, 100, used(512000, 0, 90))),
			req: req(1024), want: []string{"b"}},
		{name: "all or nothing names the memory", view: nodes(node("o", big, 100, free(2500)), node("x", big, 100, free(1500))),
			req: req(1024, count(5), origin("o"), takes(1000)), kind: errdefs.ErrResourceLimit,
			msg: []string{"only 3 of 5 sandboxes", "2 lack 1000 MB of memory free now (MemAvailable beyond their floor)"}},
		{name: "negative takes", view: nodes(node("a", big, 100)), req: req(1024, takes(-1)), kind: errdefs.ErrInvalidArgument},
		{name: "absurd free figure rules the node out", view: nodes(node("a", big, 100, free(1<<50)), node("b", big, 100)),
			req: req(1024), want: []string{"b"}},
	})
}

// A Partial request places what fits, in order, and says why the rest did
// not; with nothing placed it fails as any request; a hint too.
func TestPartialPlacement(t *testing.T) {
	big := int64(1 << 20)
	v := nodes(node("o", big, 100, free(3000)), node("x", big, 100, free(1500)))
	p, err := scheduler.Place(v, req(1024, count(10), origin("o"), takes(1000), partial))
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"o", "o", "o", "x"}; !slices.Equal(p.Nodes, want) {
		t.Fatalf("partial placement %v, want %v", p.Nodes, want)
	}
	if !errors.Is(p.Short, errdefs.ErrResourceLimit) || !strings.Contains(p.Short.Error(), "only 4 of 10") ||
		!strings.Contains(p.Short.Error(), "memory free now") {
		t.Fatalf("why the rest did not fit: %v", p.Short)
	}
	if p, err = scheduler.Place(v, req(1024, count(2), origin("o"), takes(1000), partial)); err != nil || p.Short != nil || len(p.Nodes) != 2 {
		t.Fatalf("partial request that fits: %v %v %v", p.Nodes, p.Short, err)
	}
	if _, err := scheduler.Place(v, req(1024, count(3), takes(4000), partial)); !errors.Is(err, errdefs.ErrResourceLimit) {
		t.Fatalf("partial request of which nothing fits: %v, want a resource limit", err)
	}
	p, err = scheduler.Place(v, req(1024, count(3), takes(1000), hint("x"), partial))
	if err != nil || !slices.Equal(p.Nodes, []string{"x"}) || !strings.Contains(p.Short.Error(), "hinted node x lacks 1000 MB of memory free now") {
		t.Fatalf("partial hint: %v %v %v", p.Nodes, p.Short, err)
	}
}
