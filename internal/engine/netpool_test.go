package engine_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"sync"
	"testing"

	"github.com/spore-run/spore/internal/engine"
	"github.com/spore-run/spore/internal/netns"
)

// fakeNet is an in-memory engine.Network: it keeps each instance's network
// (reserved or claimed, owner, policy) and counts the calls.
type fakeNet struct {
	mu        sync.Mutex
	nets      map[string]netns.Net
	next      int
	setups    []string // instances Setup was called for
	failClaim int      // Claims to fail
	failRes   int      // Reserves to fail
}

func newFakeNet() *fakeNet { return &fakeNet{nets: map[string]netns.Net{}} }

func (n *fakeNet) add(instance string, p netns.Policy, reserved bool) (netns.Net, error) {
	if _, ok := n.nets[instance]; ok {
		return netns.Net{}, fmt.Errorf("network of %s exists", instance)
	}
	n.next++
	net := netns.Net{Instance: instance, Slot: n.next, NetNS: "/run/netns/fake-" + instance,
		Addr: netip.AddrFrom4([4]byte{10, 9, byte(n.next >> 8), byte(n.next)}), Policy: p, Reserved: reserved}
	n.nets[instance] = net
	return net, nil
}

func (n *fakeNet) Setup(_ context.Context, instance string, p netns.Policy) (netns.Net, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.setups = append(n.setups, instance)
	return n.add(instance, p, false)
}

func (n *fakeNet) Reserve(_ context.Context, instance string) (netns.Net, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.failRes > 0 {
		n.failRes--
		return netns.Net{}, errors.New("injected reserve failure")
	}
	return n.add(instance, netns.Policy{}, true)
}

func (n *fakeNet) Claim(_ context.Context, instance, sandbox string, p netns.Policy) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	net, ok := n.nets[instance]
	if !ok || !net.Reserved {
		return fmt.Errorf("network of %s: not reserved", instance)
	}
	if n.failClaim > 0 {
		n.failClaim--
		return errors.New("injected claim failure")
	}
	net.Reserved, net.Owner, net.Policy = false, sandbox, p
	n.nets[instance] = net
	return nil
}

func (n *fakeNet) Teardown(_ context.Context, instance string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.nets, instance)
	return nil
}

func (n *fakeNet) SetPolicy(_ context.Context, instance string, p netns.Policy) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	net, ok := n.nets[instance]
	if !ok {
		return fmt.Errorf("network of %s: none", instance)
	}
	net.Policy = p
	n.nets[instance] = net
	return nil
}

func (n *fakeNet) Sweep(_ context.Context, keep map[string]bool) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	for id := range n.nets {
		if !keep[id] {
			delete(n.nets, id)
		}
	}
	return nil
}

// clone is the network's state as a crash leaves it (it outlives the
// process).
func (n *fakeNet) clone() *fakeNet {
	n.mu.Lock()
	defer n.mu.Unlock()
	c := &fakeNet{nets: map[string]netns.Net{}, next: n.next}
	for id, net := range n.nets {
		c.nets[id] = net
	}
	return c
}

func (n *fakeNet) get(instance string) (netns.Net, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	net, ok := n.nets[instance]
	return net, ok
}

// reserved lists the instances whose networks are reserved, sorted.
func (n *fakeNet) reserved() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []string
	for id, net := range n.nets {
		if net.Reserved {
			out = append(out, id)
		}
	}
	sort.Strings(out)
	return out
}

func (n *fakeNet) setupCount() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.setups)
}

func sorted(s []string) []string { s = slices.Clone(s); sort.Strings(s); return s }

// Reserved networks (fast tier): the pool fills after the first restore;
// a fork's children that find no restore target take reserved networks,
// claimed with the sandbox's owner and policy, and set none up on their
// path; the pool refills with new ones; a child beyond the pool sets its
// own up; a failed claim or fill leaves nothing and the restore goes on;
// Close frees what is left reserved, not the sandboxes' networks.
func TestReservedNetworks(t *testing.T) {
	fn := newFakeNet()
	f := newFakeWith(t, &fenv{net: fn, nets: 3})
	ctx := fctx(t)
	src := f.create() // the first restore: the pool is empty
	if n, ok := fn.get(src.Instance); !ok || n.Reserved {
		t.Fatalf("the first create's network: %+v (%v), want one set up for it", n, ok)
	}
	f.eng.Settle()
	pool := sorted(f.eng.ReservedNetworks())
	if len(pool) != 3 || !slices.Equal(pool, fn.reserved()) {
		t.Fatalf("reserved networks %v, the network's reserved %v; want the same 3", pool, fn.reserved())
	}
	f.set(src.ID, "k", "v")
	policy := netns.Policy{Internet: true, Deny: []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")}}
	if err := f.eng.SetPolicy(ctx, src.ID, policy); err != nil {
		t.Fatal(err)
	}

	setups := fn.setupCount()
	fr, err := f.eng.Fork(ctx, src.ID, engine.ForkOptions{Count: 2})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range fr.Children {
		if c.Err != nil {
			t.Fatal(c.Err)
		}
		if !slices.Contains(pool, c.Sandbox.Instance) {
			t.Fatalf("child %s runs in %s, not in a reserved network %v", c.Sandbox.ID, c.Sandbox.Instance, pool)
		}
		n, _ := fn.get(c.Sandbox.Instance)
		if n.Reserved || n.Owner != c.Sandbox.ID || !slices.Equal(n.Policy.Deny, policy.Deny) {
			t.Fatalf("child %s's network: %+v, want claimed by it with the source's policy", c.Sandbox.ID, n)
		}
		if got := f.get(c.Sandbox.ID, "k"); got != "v" {
			t.Fatalf("child %s: k=%q, want the source's v", c.Sandbox.ID, got)
		}
	}
	if fn.setupCount() != setups {
		t.Fatalf("the fork set up %d networks on its path, want 0", fn.setupCount()-setups)
	}
	f.eng.Settle()
	next := f.eng.ReservedNetworks()
	if len(next) != 3 || !slices.Equal(sorted(next), fn.reserved()) {
		t.Fatalf("after the fork: reserved %v, the network's %v; want 3", next, fn.reserved())
	}
	for _, c := range fr.Children {
		if slices.Contains(next, c.Sandbox.Instance) {
			t.Fatalf("child %s's network %s is still listed as reserved", c.Sandbox.ID, c.Sandbox.Instance)
		}
	}

	// A fork of more children than the pool: the rest set up their own.
	// (A child that ends while none is in flight lets the pool refill,
	// and a later child may take a network made meanwhile.)
	setups, pool = fn.setupCount(), f.eng.ReservedNetworks()
	fr, err = f.eng.Fork(ctx, src.ID, engine.ForkOptions{Count: 5, Concurrency: 5})
	if err != nil {
		t.Fatal(err)
	}
	taken := 0
	for _, c := range fr.Children {
		if c.Err != nil {
			t.Fatal(c.Err)
		}
		if n, ok := fn.get(c.Sandbox.Instance); !ok || n.Reserved || !slices.Equal(n.Policy.Deny, policy.Deny) {
			t.Fatalf("child %s's network: %+v (%v)", c.Sandbox.ID, n, ok)
		}
		if slices.Contains(pool, c.Sandbox.Instance) {
			taken++
		}
	}
	if taken != 3 {
		t.Fatalf("a fork of 5 took %d of the 3 reserved networks", taken)
	}
	if got := fn.setupCount() - setups; got > 2 {
		t.Fatalf("a fork of 5 with 3 reserved networks set up %d on its path, want at most 2", got)
	}

	// A failed claim: the network is freed and the restore sets one up.
	f.eng.Settle()
	pool = f.eng.ReservedNetworks()
	fn.mu.Lock()
	fn.failClaim = 1
	fn.mu.Unlock()
	setups = fn.setupCount()
	b := f.create()
	if n, ok := fn.get(b.Instance); !ok || n.Reserved || fn.setupCount() != setups+1 {
		t.Fatalf("after a failed claim: %+v (%v), %d setups, want one set up for %s", n, ok, fn.setupCount()-setups, b.Instance)
	}
	if got := f.get(b.ID, "boot"); got == "" {
		t.Fatal("the create after a failed claim has no memory")
	}
	f.eng.Settle()
	if got := sorted(f.eng.ReservedNetworks()); len(got) != 3 || !slices.Equal(got, fn.reserved()) {
		t.Fatalf("after a failed claim: reserved %v, the network's %v (was %v)", got, fn.reserved(), pool)
	}

	// A failed fill leaves nothing, and the pool says so.
	fn.mu.Lock()
	fn.failRes = 1
	fn.mu.Unlock()
	f.create()
	f.eng.Settle()
	if got := sorted(f.eng.ReservedNetworks()); len(got) != 2 || !slices.Equal(got, fn.reserved()) {
		t.Fatalf("after a failed fill: reserved %v, the network's %v; want the 2 made", got, fn.reserved())
	}

	// Close frees the reserved networks, not the sandboxes'.
	f.close()
	if r := fn.reserved(); len(r) != 0 {
		t.Fatalf("after Close, reserved networks left: %v", r)
	}
	if _, ok := fn.get(src.Instance); !ok {
		t.Fatalf("Close freed the network of running sandbox %s", src.ID)
	}
}
