package node_test

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/engine"
	"github.com/spore-run/spore/internal/netaudit"
	"github.com/spore-run/spore/internal/netns"
	"github.com/spore-run/spore/internal/node"
)

// Restore targets in real gVisor: the second create of a shape loads its
// image into the sandbox booted ahead for it (one per shape here), and is
// a whole sandbox: its daemon took the sandbox's identity
// (token, environment), its egress policy holds, its egress audit is
// journaled under the sandbox (not the target's instance), and a rollback,
// into the next target, brings back its memory, files and processes.
func TestRestoreTargetsInTheSandbox(t *testing.T) {
	testInternet(t)
	e := newEnvTuned(t, func(c *node.Config) {
		c.NetPrefix = "spq"
		c.RestoreTargets = 1 // the rollback below takes the next one made
		c.DNSUpstreams = []netip.AddrPort{netip.AddrPortFrom(allowedIP, 53)}
	})
	ctx := ctxFor(t)
	e.create(ctx, engine.CreateOptions{Template: node.TemplateBase}) // the shape's first restore
	e.n.Engine.Settle()
	targets := e.n.Engine.RestoreTargets()
	if len(targets) != 1 {
		t.Fatalf("restore targets %v after a create, want 1", targets)
	}
	deny := netns.Policy{Internet: true, Deny: []netip.Prefix{netip.PrefixFrom(deniedIP, 32)}}
	sb := e.create(ctx, engine.CreateOptions{Template: node.TemplateBase, Policy: &deny, Env: []string{"MARK=restored-into-a-target"}})
	if sb.Instance != targets[0] {
		t.Fatalf("the create ran in instance %s, not in the target %s", sb.Instance, targets[0])
	}
	c := e.client(sb)
	if got := strings.TrimSpace(c.sh(ctx, "echo $MARK")); got != "restored-into-a-target" {
		t.Fatalf("the daemon's environment: MARK=%q", got)
	}
	get := func(c *client, ip netip.Addr) string { return fetchFrom(ctx, c, ip) }
	if got := get(c, allowedIP); !strings.HasPrefix(got, "allowed") {
		t.Fatalf("allowed address: %q", got)
	}
	if got := get(c, deniedIP); got != "blocked" {
		t.Fatalf("denied address: %q", got)
	}
	waitFor(t, func() bool {
		es, _ := e.n.EgressAudit(ctx, sb.ID, time.Time{}, 0)
		return slices.ContainsFunc(es, func(x netaudit.Entry) bool { return x.Allowed && x.Dst == allowedIP.String()+":8080" }) &&
			slices.ContainsFunc(es, func(x netaudit.Entry) bool { return !x.Allowed && x.Dst == deniedIP.String()+":8080" })
	})
	if es, _ := e.n.EgressAudit(ctx, sb.Instance, time.Time{}, 0); len(es) > 0 {
		t.Fatalf("entries journaled under the target's instance %s: %+v", sb.Instance, es)
	}

	// Rollback, into the next target.
	c.sh(ctx, "echo kept > /home/user/f; nohup sleep 1000 >/dev/null 2>&1 & echo $! > /home/user/pid")
	snap, err := e.n.Engine.Snapshot(ctx, sb.ID, engine.SnapshotOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c.sh(ctx, "echo broken > /home/user/f; kill $(cat /home/user/pid)")
	e.n.Engine.Settle()
	next := e.n.Engine.RestoreTargets()
	rb, err := e.n.Engine.Rollback(ctx, sb.ID, snap.Manifest.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(next) != 1 || rb.Instance != next[0] {
		t.Fatalf("the rollback ran in %s, not in the target %v", rb.Instance, next)
	}
	c = e.client(rb)
	if got := c.sh(ctx, "cat /home/user/f; kill -0 $(cat /home/user/pid) && echo alive"); got != "kept\nalive\n" {
		t.Fatalf("after the rollback: %q", got)
	}
	if got := get(c, deniedIP); got != "blocked" {
		t.Fatalf("the rolled-back sandbox's policy: %q", got)
	}
}

// fetchFrom is what the sandbox behind c gets from ip's test web server:
// its answer, or "blocked".
func fetchFrom(ctx context.Context, c *client, ip netip.Addr) string {
	r, _ := c.run(ctx, `curl -s -m 3 http://`+ip.String()+`:8080/ || echo blocked`)
	return strings.TrimSpace(r.stdout)
}

// Reserved networks in real gVisor and real network namespaces: with no
// restore targets, a create takes a network set up ahead of time, claimed
// with its policy (egress allowed and denied as asked, its audit journaled
// under the sandbox); a fork's children take the rest and set up what the
// pool lacks, each with the source's policy; the pool is made again.
func TestReservedNetworksInTheSandbox(t *testing.T) {
	testInternet(t)
	e := newEnvTuned(t, func(c *node.Config) {
		c.NetPrefix = "spv"
		c.RestoreTargets, c.ReservedNetworks = -1, 2
		c.DNSUpstreams = []netip.AddrPort{netip.AddrPortFrom(allowedIP, 53)}
	})
	ctx := ctxFor(t)
	e.create(ctx, engine.CreateOptions{Template: node.TemplateBase}) // the first restore: the pool fills after it
	e.n.Engine.Settle()
	pool := e.n.Engine.ReservedNetworks()
	if len(pool) != 2 || len(e.n.Engine.RestoreTargets()) != 0 {
		t.Fatalf("reserved networks %v, restore targets %v; want 2 and none", pool, e.n.Engine.RestoreTargets())
	}
	deny := netns.Policy{Internet: true, Deny: []netip.Prefix{netip.PrefixFrom(deniedIP, 32)}}
	sb := e.create(ctx, engine.CreateOptions{Template: node.TemplateBase, Policy: &deny, Env: []string{"MARK=in-a-reserved-network"}})
	if !slices.Contains(pool, sb.Instance) {
		t.Fatalf("the create ran in instance %s, not in a reserved network %v", sb.Instance, pool)
	}
	c := e.client(sb)
	if got := strings.TrimSpace(c.sh(ctx, "echo $MARK")); got != "in-a-reserved-network" {
		t.Fatalf("the daemon's environment: MARK=%q", got)
	}
	if got := fetchFrom(ctx, c, allowedIP); !strings.HasPrefix(got, "allowed") {
		t.Fatalf("allowed address: %q", got)
	}
	if got := fetchFrom(ctx, c, deniedIP); got != "blocked" {
		t.Fatalf("denied address: %q", got)
	}
	waitFor(t, func() bool {
		es, _ := e.n.EgressAudit(ctx, sb.ID, time.Time{}, 0)
		return slices.ContainsFunc(es, func(x netaudit.Entry) bool { return x.Allowed && x.Dst == allowedIP.String()+":8080" }) &&
			slices.ContainsFunc(es, func(x netaudit.Entry) bool { return !x.Allowed && x.Dst == deniedIP.String()+":8080" })
	})

	// A fork of 3: two take reserved networks, one sets its own up.
	e.n.Engine.Settle()
	pool = e.n.Engine.ReservedNetworks()
	fr, err := e.n.Engine.Fork(ctx, sb.ID, engine.ForkOptions{Count: 3})
	if err != nil {
		t.Fatal(err)
	}
	taken := 0
	for _, ch := range fr.Children {
		if ch.Err != nil {
			t.Fatal(ch.Err)
		}
		if slices.Contains(pool, ch.Sandbox.Instance) {
			taken++
		}
		cc := e.client(ch.Sandbox)
		if got := fetchFrom(ctx, cc, allowedIP); !strings.HasPrefix(got, "allowed") {
			t.Fatalf("child %s, allowed address: %q", ch.Sandbox.ID, got)
		}
		if got := fetchFrom(ctx, cc, deniedIP); got != "blocked" {
			t.Fatalf("child %s, denied address: %q", ch.Sandbox.ID, got)
		}
	}
	if taken != 2 {
		t.Fatalf("the fork's children took %d of the 2 reserved networks", taken)
	}
	e.n.Engine.Settle()
	if next := e.n.Engine.ReservedNetworks(); len(next) != 2 || slices.ContainsFunc(next, func(id string) bool { return slices.Contains(pool, id) }) {
		t.Fatalf("reserved networks after the fork %v, want 2 new ones (before: %v)", next, pool)
	}
}

// A fork grows its shape's restore targets to the fork's size (up to
// RestoreTargetsBurst), and the next fork of that size runs wholly in
// targets, in real gVisor: every child has the source's memory (a process
// still running), files, its own identity (ID, token) and its own network
// address.
func TestRestoreTargetsGrowInTheSandbox(t *testing.T) {
	e := newEnvTuned(t, func(c *node.Config) {
		c.NetPrefix = "spg"
		c.RestoreTargets, c.RestoreTargetsBurst = 1, 3
	})
	ctx := ctxFor(t)
	src := e.create(ctx, engine.CreateOptions{Template: node.TemplateBase})
	c := e.client(src)
	c.sh(ctx, "echo kept > /home/user/f; nohup sleep 1000 >/dev/null 2>&1 & echo $! > /home/user/pid")
	fork := func() []engine.Sandbox {
		t.Helper()
		fr, err := e.n.Engine.Fork(ctx, src.ID, engine.ForkOptions{Count: 3, Concurrency: 3})
		if err != nil {
			t.Fatal(err)
		}
		var out []engine.Sandbox
		for _, ch := range fr.Children {
			if ch.Err != nil {
				t.Fatal(ch.Err)
			}
			out = append(out, ch.Sandbox)
		}
		return out
	}
	fork()
	e.n.Engine.Settle()
	targets := e.n.Engine.RestoreTargets()
	if len(targets) != 3 {
		t.Fatalf("restore targets %v after a fork of 3, want 3", targets)
	}
	tokens, addrs := map[string]bool{src.Run.AccessToken: true}, map[netip.Addr]bool{}
	for _, kid := range fork() {
		if !slices.Contains(targets, kid.Instance) {
			t.Fatalf("child %s ran in %s, not in one of the targets %v", kid.ID, kid.Instance, targets)
		}
		if tokens[kid.Run.AccessToken] {
			t.Fatalf("child %s shares an access token", kid.ID)
		}
		tokens[kid.Run.AccessToken] = true
		k := e.client(kid)
		if got := k.sh(ctx, "cat /home/user/f; kill -0 $(cat /home/user/pid) && echo alive"); got != "kept\nalive\n" {
			t.Fatalf("child %s: %q, want the source's file and process", kid.ID, got)
		}
		if got := k.sh(ctx, "echo $E2B_SANDBOX_ID"); got != kid.ID+"\n" {
			t.Fatalf("child identity = %q, want %s", got, kid.ID)
		}
		// The client reached the child's daemon at this address.
		if !kid.Addr.IsValid() || addrs[kid.Addr] {
			t.Fatalf("child %s address %v: none or another child's", kid.ID, kid.Addr)
		}
		addrs[kid.Addr] = true
	}
}
