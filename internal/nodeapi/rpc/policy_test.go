package rpc

import (
	"net/netip"
	"reflect"
	"testing"

	"github.com/spore-run/spore/internal/nodeapi"
)

// A policy's domain entries cross the wire in the same lists as its
// prefixes and come back as domains.
func TestPolicyDomainsRoundTrip(t *testing.T) {
	in := nodeapi.Policy{Internet: true, Allow: []netip.Prefix{netip.MustParsePrefix("1.1.1.1/32")}, Deny: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")},
		AllowDomains: []string{"allowed.test", "*.wild.test"}, DenyDomains: []string{"denied.test"}}
	out, err := policy(policyPB(in))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(*out, in) {
		t.Fatalf("round trip: %+v, want %+v", *out, in)
	}
}
