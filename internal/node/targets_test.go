package node_test

import (
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
// image into the sandbox booted ahead for it (the node's default, one per
// shape), and is a whole sandbox: its daemon took the sandbox's identity
// (token, environment), its egress policy holds, its egress audit is
// journaled under the sandbox (not the target's instance), and a rollback,
// into the next target, brings back its memory, files and processes.
func TestRestoreTargetsInTheSandbox(t *testing.T) {
	testInternet(t)
	e := newEnvTuned(t, func(c *node.Config) {
		c.NetPrefix = "spq"
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
	get := func(c *client, ip netip.Addr) string {
		r, _ := c.run(ctx, `curl -s -m 3 http://`+ip.String()+`:8080/ || echo blocked`)
		return strings.TrimSpace(r.stdout)
	}
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
