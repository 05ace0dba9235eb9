package control_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/spore-run/spore/internal/control"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/netns"
)

// allowOut and denyOut take domains as E2B does ("api.openai.com",
// "*.github.com"), normalized to lower case, beside addresses; what the
// API accepts the node accepts; malformed domains and lists over the cap
// are refused (a 400 at the edge).
func TestParsePolicyDomains(t *testing.T) {
	p, err := control.ParsePolicy(nil, []string{"API.OpenAI.com", "*.github.com", "1.1.1.1"}, []string{"0.0.0.0/0", "denied.test."})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(p.AllowDomains, []string{"api.openai.com", "*.github.com"}) || !slices.Equal(p.DenyDomains, []string{"denied.test"}) ||
		len(p.Allow) != 1 || len(p.Deny) != 1 {
		t.Fatalf("parsed %+v", p)
	}
	np := netns.Policy{Internet: p.Internet, Allow: p.Allow, Deny: p.Deny, AllowDomains: p.AllowDomains, DenyDomains: p.DenyDomains}
	if err := np.Validate(); err != nil {
		t.Fatalf("the node's check refuses what the API accepted: %v", err)
	}
	for _, bad := range []string{"a..b", "*", "*.", "a.*.b", "-a.test", "a b.test", "1.2.3", "x.test:443", strings.Repeat("a.", 150) + "test"} {
		if _, err := control.ParsePolicy(nil, []string{bad}, nil); !errdefs.IsInvalidArgument(err) {
			t.Errorf("allowOut %q: %v, want invalid", bad, err)
		}
		if _, err := control.ParsePolicy(nil, nil, []string{bad}); !errdefs.IsInvalidArgument(err) {
			t.Errorf("denyOut %q: %v, want invalid", bad, err)
		}
	}
	huge := make([]string, netns.MaxPolicyEntries+1)
	for i := range huge {
		huge[i] = fmt.Sprintf("h%d.test", i)
	}
	if _, err := control.ParsePolicy(nil, huge, nil); !errdefs.IsInvalidArgument(err) {
		t.Errorf("%d domains: %v, want invalid", len(huge), err)
	}
}
