package control_test

import (
	"fmt"
	"testing"

	"github.com/spore-run/spore/internal/control"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/netns"
)

// Allow and deny lists are capped (a larger list is a 400 at the API).
func TestParsePolicyCapsLists(t *testing.T) {
	list := func(n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = fmt.Sprintf("203.0.%d.%d", i>>8, i&0xff)
		}
		return out
	}
	if p, err := control.ParsePolicy(nil, list(netns.MaxPolicyEntries), list(netns.MaxPolicyEntries)); err != nil || len(p.Allow) != netns.MaxPolicyEntries {
		t.Fatalf("at the cap: %v", err)
	}
	for _, c := range [][2][]string{{list(netns.MaxPolicyEntries + 1), nil}, {nil, list(netns.MaxPolicyEntries + 1)}} {
		if _, err := control.ParsePolicy(nil, c[0], c[1]); !errdefs.IsInvalidArgument(err) {
			t.Fatalf("over the cap (%d allow, %d deny): %v", len(c[0]), len(c[1]), err)
		}
		if err := control.Validate(control.CreateRequest{AllowOut: c[0], DenyOut: c[1]}); !errdefs.IsInvalidArgument(err) {
			t.Fatalf("Validate over the cap: %v", err)
		}
	}
}

// Entries are IPv4 or IPv6 addresses or CIDRs, as E2B takes them; anything
// else (names, IPv4-mapped IPv6, zones, bad prefixes) is invalid.
func TestParsePolicyAddressForms(t *testing.T) {
	p, err := control.ParsePolicy(nil, []string{"1.1.1.1", "2001:db8::1", "2001:db8:1::/48", " 10.1.2.3/8 "}, []string{"0.0.0.0/0", "::/0"})
	if err != nil {
		t.Fatal(err)
	}
	got := fmt.Sprint(p.Allow, p.Deny)
	if want := "[1.1.1.1/32 2001:db8::1/128 2001:db8:1::/48 10.0.0.0/8] [0.0.0.0/0 ::/0]"; got != want {
		t.Fatalf("parsed %s, want %s", got, want)
	}
	if err := (netns.Policy{Internet: p.Internet, Allow: p.Allow, Deny: p.Deny}).Validate(); err != nil {
		t.Fatalf("the node's check refuses what the API accepted: %v", err)
	}
	for _, bad := range []string{"api..openai.com", "*", "::ffff:1.2.3.4", "fe80::1%eth0", "1.2.3.4/33", "300.1.1.1", ""} {
		if _, err := control.ParsePolicy(nil, []string{bad}, nil); !errdefs.IsInvalidArgument(err) {
			t.Errorf("allowOut %q: %v, want invalid", bad, err)
		}
	}
}
