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
