package engine_test

import (
	"net/netip"
	"slices"
	"sort"
	"testing"

	"github.com/spore-run/spore/internal/control/controltest"
	"github.com/spore-run/spore/internal/engine"
	"github.com/spore-run/spore/internal/netns"
)

func sorted(s []string) []string { s = slices.Clone(s); sort.Strings(s); return s }

// Reserved networks (fast tier): the pool fills after the first restore;
// a fork's children that find no restore target take reserved networks,
// claimed with the sandbox's owner and policy, and set none up on their
// path; the pool refills with new ones; a child beyond the pool sets its
// own up; a failed claim or fill leaves nothing and the restore goes on;
// Close frees what is left reserved, not the sandboxes' networks.
func TestReservedNetworks(t *testing.T) {
	fn := controltest.NewNetwork()
	f := newFakeWith(t, &fenv{net: fn, nets: 3})
	ctx := fctx(t)
	src := f.create() // the first restore: the pool is empty
	if n, ok := fn.Get(src.Instance); !ok || n.Reserved {
		t.Fatalf("the first create's network: %+v (%v), want one set up for it", n, ok)
	}
	f.eng.Settle()
	pool := sorted(f.eng.ReservedNetworks())
	if len(pool) != 3 || !slices.Equal(pool, fn.Reserved()) {
		t.Fatalf("reserved networks %v, the network's reserved %v; want the same 3", pool, fn.Reserved())
	}
	f.set(src.ID, "k", "v")
	policy := netns.Policy{Internet: true, Deny: []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")}}
	if err := f.eng.SetPolicy(ctx, src.ID, policy); err != nil {
		t.Fatal(err)
	}

	setups := fn.Setups()
	children := f.fork(src.ID, engine.ForkOptions{Count: 2})
	for _, c := range children {
		if !slices.Contains(pool, c.Sandbox.Instance) {
			t.Fatalf("child %s runs in %s, not in a reserved network %v", c.Sandbox.ID, c.Sandbox.Instance, pool)
		}
		n, _ := fn.Get(c.Sandbox.Instance)
		if n.Reserved || n.Owner != c.Sandbox.ID || !slices.Equal(n.Policy.Deny, policy.Deny) {
			t.Fatalf("child %s's network: %+v, want claimed by it with the source's policy", c.Sandbox.ID, n)
		}
		if got := f.get(c.Sandbox.ID, "k"); got != "v" {
			t.Fatalf("child %s: k=%q, want the source's v", c.Sandbox.ID, got)
		}
	}
	if fn.Setups() != setups {
		t.Fatalf("the fork set up %d networks on its path, want 0", fn.Setups()-setups)
	}
	f.eng.Settle()
	next := f.eng.ReservedNetworks()
	if len(next) != 3 || !slices.Equal(sorted(next), fn.Reserved()) {
		t.Fatalf("after the fork: reserved %v, the network's %v; want 3", next, fn.Reserved())
	}
	for _, c := range children {
		if slices.Contains(next, c.Sandbox.Instance) {
			t.Fatalf("child %s's network %s is still listed as reserved", c.Sandbox.ID, c.Sandbox.Instance)
		}
	}

	// A fork of more children than the pool: the rest set up their own.
	// (A child that ends while none is in flight lets the pool refill,
	// and a later child may take a network made meanwhile.)
	setups, pool = fn.Setups(), f.eng.ReservedNetworks()
	children = f.fork(src.ID, engine.ForkOptions{Count: 5, Concurrency: 5})
	taken := 0
	for _, c := range children {
		if n, ok := fn.Get(c.Sandbox.Instance); !ok || n.Reserved || !slices.Equal(n.Policy.Deny, policy.Deny) {
			t.Fatalf("child %s's network: %+v (%v)", c.Sandbox.ID, n, ok)
		}
		if slices.Contains(pool, c.Sandbox.Instance) {
			taken++
		}
	}
	if taken != 3 {
		t.Fatalf("a fork of 5 took %d of the 3 reserved networks", taken)
	}
	if got := fn.Setups() - setups; got > 2 {
		t.Fatalf("a fork of 5 with 3 reserved networks set up %d on its path, want at most 2", got)
	}

	// A failed claim: the network is freed and the restore sets one up.
	f.eng.Settle()
	pool = f.eng.ReservedNetworks()
	fn.FailClaims = 1
	setups = fn.Setups()
	b := f.create()
	if n, ok := fn.Get(b.Instance); !ok || n.Reserved || fn.Setups() != setups+1 {
		t.Fatalf("after a failed claim: %+v (%v), %d setups, want one set up for %s", n, ok, fn.Setups()-setups, b.Instance)
	}
	if got := f.get(b.ID, "boot"); got == "" {
		t.Fatal("the create after a failed claim has no memory")
	}
	f.eng.Settle()
	if got := sorted(f.eng.ReservedNetworks()); len(got) != 3 || !slices.Equal(got, fn.Reserved()) {
		t.Fatalf("after a failed claim: reserved %v, the network's %v (was %v)", got, fn.Reserved(), pool)
	}

	// A failed fill leaves nothing, and the pool says so.
	fn.FailReserves = 1
	f.create()
	f.eng.Settle()
	if got := sorted(f.eng.ReservedNetworks()); len(got) != 2 || !slices.Equal(got, fn.Reserved()) {
		t.Fatalf("after a failed fill: reserved %v, the network's %v; want the 2 made", got, fn.Reserved())
	}

	// Close frees the reserved networks, not the sandboxes'.
	f.close()
	if r := fn.Reserved(); len(r) != 0 {
		t.Fatalf("after Close, reserved networks left: %v", r)
	}
	if _, ok := fn.Get(src.Instance); !ok {
		t.Fatalf("Close freed the network of running sandbox %s", src.ID)
	}
}
