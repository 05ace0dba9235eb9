package netns_test

import (
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"strings"
	"sync"
	"testing"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/netns"
	"github.com/spore-run/spore/internal/testenv"
)

// recAuditor records which collectors were started, under which owner.
type recAuditor struct {
	mu      sync.Mutex
	started map[string]string // instance -> owner
}

func (a *recAuditor) Start(instance, owner string, _ int) (func(bool), error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.started[instance] = owner
	return func(bool) {}, nil
}

func (a *recAuditor) owner(instance string) (string, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	o, ok := a.started[instance]
	return o, ok
}

// A reserved network (a restore target's) lets nothing out and has no
// egress audit; Claim gives it the sandbox's policy, which then holds as
// with Setup, and starts the audit under the sandbox; a network that is
// not reserved, or claimed already, is refused and left as it was.
func TestReserveAndClaim(t *testing.T) {
	aud := &recAuditor{started: map[string]string{}}
	m := newManagerWith(t, netns.Config{Audit: aud})
	ctx := context.Background()
	r, err := m.Reserve(ctx, "inst-r")
	if err != nil {
		t.Fatal(err)
	}
	if !r.Reserved {
		t.Fatal("Reserve returned a network not marked reserved")
	}
	plain, err := m.Setup(ctx, "inst-p", netns.Policy{Internet: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := aud.owner("inst-r"); ok {
		t.Fatal("a reserved network's audit started before its claim")
	}
	// An outside host on the benchmarking range, answering "outside".
	h := testenv.NewTestHost(t, "spt-rpeer", netip.MustParseAddr("198.18.4.2"), netip.MustParseAddr("198.18.4.1"), false)
	out := h.ServeText(t, 8002, "outside")
	eventually(t, func() error { _, err := get("spt-sb-inst-p", out); return err })
	if got, err := get("spt-sb-inst-r", out); err == nil {
		t.Fatalf("a reserved network let a connection out: %q", got)
	}
	if f := gwForwarding(t, "inst-r"); f != "0" {
		t.Fatalf("a reserved gateway forwards (ip_forward %s)", f)
	}
	// The host cannot reach into it either until it is claimed.
	serve(t, "spt-sb-inst-r", "10.0.0.2:8000", "r")
	if got, err := get("", r.Addr.String()+":8000"); err == nil {
		t.Fatalf("the host reached a reserved network's sandbox: %q", got)
	}

	deny := netns.Policy{Internet: true, Deny: []netip.Prefix{netip.MustParsePrefix("198.18.4.0/30")}}
	if err := m.Claim(ctx, "inst-r", "sandbox-1", netns.Policy{Internet: true, Allow: []netip.Prefix{netip.MustParsePrefix("198.18.4.2/32")}, Deny: deny.Deny}); err != nil {
		t.Fatal(err)
	}
	if o, ok := aud.owner("inst-r"); !ok || o != "sandbox-1" {
		t.Fatalf("audit after the claim: started %v under %q, want sandbox-1", ok, o)
	}
	eventually(t, func() error {
		got, err := get("spt-sb-inst-r", out)
		if err == nil && got != "outside" {
			err = fmt.Errorf("got %q", got)
		}
		return err
	})
	eventually(t, func() error { _, err := get("", r.Addr.String()+":8000"); return err })
	if f := gwForwarding(t, "inst-r"); f != "1" {
		t.Fatalf("a claimed gateway does not forward (ip_forward %s)", f)
	}
	n, err := m.Get("inst-r")
	if err != nil || n.Reserved || n.Owner != "sandbox-1" || len(n.Policy.Allow) != 1 {
		t.Fatalf("claimed network's record %+v (%v)", n, err)
	}
	// The policy changes at run time as any sandbox's does.
	if err := m.SetPolicy(ctx, "inst-r", deny); err != nil {
		t.Fatal(err)
	}
	if _, err := get("spt-sb-inst-r", out); err == nil {
		t.Fatal("deny list not enforced on a claimed network")
	}
	for _, id := range []string{"inst-r", "inst-p"} {
		if err := m.Claim(ctx, id, "sandbox-2", netns.Policy{Internet: true}); !errdefs.IsConflict(err) {
			t.Fatalf("Claim of %s = %v, want conflict", id, err)
		}
	}
	if n, _ := m.Get("inst-r"); n.Owner != "sandbox-1" || len(n.Policy.Deny) != 1 {
		t.Fatalf("a refused claim changed the network: %+v", n)
	}
	if err := m.Claim(ctx, "inst-none", "sandbox-2", netns.Policy{}); !errdefs.IsNotFound(err) {
		t.Fatalf("Claim of an unknown network = %v, want not found", err)
	}
	_ = plain
	for _, id := range []string{"inst-r", "inst-p"} {
		if err := m.Teardown(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
}

// gwForwarding reads an instance's gateway's IPv4 forwarding switch.
func gwForwarding(t *testing.T, instance string) string {
	t.Helper()
	out, err := exec.Command("ip", "netns", "exec", "spt-gw-"+instance, "cat", "/proc/sys/net/ipv4/ip_forward").CombinedOutput()
	if err != nil {
		t.Fatalf("read forwarding: %v %s", err, out)
	}
	return strings.TrimSpace(string(out))
}
