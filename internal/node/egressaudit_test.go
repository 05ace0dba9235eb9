package node_test

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/engine"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/netaudit"
	"github.com/spore-run/spore/internal/netns"
	"github.com/spore-run/spore/internal/node"
)

// The egress audit in a real sandbox on the test internet: a connection
// the CIDR rules let through (with its bytes), one they drop (with the
// rule), and under domain rules one the egress proxy lets through and one
// it refuses (with the names) are all journaled; a connection left open
// is listed as open, and written with its bytes when the sandbox is
// killed; the journal is still read after the kill.
func TestEgressAudit(t *testing.T) {
	testInternet(t)
	e := newEnvTuned(t, func(c *node.Config) {
		c.NetPrefix = "spy"
		c.DNSUpstreams = []netip.AddrPort{netip.AddrPortFrom(allowedIP, 53)}
	})
	ctx := ctxFor(t)
	deny := netns.Policy{Internet: true, Deny: []netip.Prefix{netip.PrefixFrom(deniedIP, 32)}}
	sb := e.create(ctx, engine.CreateOptions{Template: node.TemplateBase, Policy: &deny})
	c := e.client(sb)
	get := func(args string) string {
		r, _ := c.run(ctx, `curl -sk -m 3 `+args+` || echo blocked`)
		return strings.TrimSpace(r.stdout)
	}
	if got := get("http://" + allowedIP.String() + ":8080/"); !strings.HasPrefix(got, "allowed") {
		t.Fatalf("allowed by the CIDR rules: %q", got)
	}
	if got := get("http://" + deniedIP.String() + ":8080/"); got != "blocked" {
		t.Fatalf("denied by the CIDR rules: %q", got)
	}
	// A connection held open (python connects and sleeps).
	c.run(ctx, `nohup python3 -c 'import socket, time; s = socket.create_connection(("`+allowedIP.String()+`", 8080)); s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"); s.recv(4096); time.sleep(600)' >/dev/null 2>&1 &`)
	// Connected before the rules below shut that address out.
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		es, _ := e.n.EgressAudit(ctx, sb.ID, time.Time{}, 0)
		if slices.ContainsFunc(es, func(x netaudit.Entry) bool { return x.Open && x.Dst == allowedIP.String()+":8080" }) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the held connection never showed as open: %+v", es)
		}
	}
	only := netns.Policy{Internet: true, Deny: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}, AllowDomains: []string{"allowed.test"}}
	if err := e.n.Engine.SetPolicy(ctx, sb.ID, only); err != nil {
		t.Fatal(err)
	}
	if got := get("https://allowed.test/"); !strings.HasPrefix(got, "allowed") {
		t.Fatalf("allowed by name: %q", got)
	}
	if got := get("https://denied.test/"); got != "blocked" {
		t.Fatalf("denied by name: %q", got)
	}

	type want struct {
		name string
		ok   func(netaudit.Entry) bool
	}
	wants := []want{
		{"allowed by the CIDR rules, with bytes", func(x netaudit.Entry) bool {
			return x.Allowed && !x.Open && x.Proto == "tcp" && x.Dst == allowedIP.String()+":8080" && x.End != nil && x.BytesIn > 0 && x.BytesOut > 0
		}},
		{"denied by the CIDR rules, with the rule", func(x netaudit.Entry) bool {
			return !x.Allowed && x.Proto == "tcp" && x.Dst == deniedIP.String()+":8080" && x.Rule == "deny"
		}},
		{"allowed by name through the proxy", func(x netaudit.Entry) bool {
			return x.Allowed && x.Domain == "allowed.test" && x.BytesIn > 0 && x.End != nil
		}},
		{"denied by name through the proxy", func(x netaudit.Entry) bool {
			return !x.Allowed && x.Domain == "denied.test" && strings.HasPrefix(x.Dst, deniedIP.String()+":")
		}},
		{"held open", func(x netaudit.Entry) bool { return x.Open && x.Dst == allowedIP.String()+":8080" }},
	}
	var got []netaudit.Entry
	missing := func() []string {
		var out []string
		for _, w := range wants {
			found := false
			for _, x := range got {
				found = found || w.ok(x)
			}
			if !found {
				out = append(out, w.name)
			}
		}
		return out
	}
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		got, _ = e.n.EgressAudit(ctx, sb.ID, time.Time{}, 0)
		if len(missing()) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("egress audit lacks %v: %+v", missing(), got)
		}
	}
	denials := 0
	for _, x := range got {
		if x.Allowed && strings.HasPrefix(x.Dst, deniedIP.String()+":") {
			t.Errorf("an attempt on the denied server journaled as allowed: %+v", x)
		}
		if x.Dst == deniedIP.String()+":8080" {
			denials++
		}
		if strings.HasPrefix(x.Dst, netns.GatewayIP.String()+":") {
			t.Errorf("traffic to the sandbox's own gateway journaled as egress: %+v", x)
		}
	}
	if denials != 1 {
		t.Errorf("one curl to the denied address (its SYN retransmitted for 3 s) journaled %d times, want once", denials)
	}

	// Killed: the held connection is written with its bytes, and the
	// journal is still there.
	if err := e.n.Engine.Kill(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	// (The network may go just after the kill answers: wait for it, up
	// to 30 s, as a teardown on a loaded host takes seconds.)
	var err error
	held, open := 0, 0
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		got, err = e.n.EgressAudit(ctx, sb.ID, time.Time{}, 0)
		if err != nil {
			t.Fatalf("after the kill: %v", err)
		}
		held, open = 0, 0
		for _, x := range got {
			if x.Open {
				open++
			}
			if x.Dst == allowedIP.String()+":8080" && x.Reason == "open when the sandbox's network went" && x.BytesIn > 0 {
				held++
			}
		}
		if held == 1 && open == 0 || time.Now().After(deadline) {
			break
		}
	}
	if held != 1 || open != 0 {
		t.Errorf("after the kill, want the held connection once with its bytes and nothing open: %+v", got)
	}
	if _, err := e.n.EgressAudit(context.Background(), "inever0000000000001", time.Time{}, 0); !errdefs.IsNotFound(err) {
		t.Errorf("a sandbox never seen: %v", err)
	}
}
