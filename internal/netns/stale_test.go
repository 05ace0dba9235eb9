package netns

import (
	"net"
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink"
)

// The filter of New's crash cleanup deletes entries of free slots only:
// never those of a sandbox that holds its slot (its host address is
// configured), nor addresses outside the sandbox space.
func TestStaleFilter(t *testing.T) {
	m := &Manager{base: netip.MustParseAddr("10.200.0.0")}
	if s, ok := m.slotOf(netip.MustParseAddr("10.200.1.6")); !ok || s != 65 {
		t.Fatalf("slotOf(10.200.1.6) = %d %v, want 65", s, ok)
	}
	for _, a := range []string{"10.199.255.255", "10.201.0.0", "192.168.1.1"} {
		if _, ok := m.slotOf(netip.MustParseAddr(a)); ok {
			t.Errorf("slotOf(%s) claims a slot", a)
		}
	}
	live := map[netip.Addr]bool{m.slotAddr(3, 1): true}
	f := slotFilter{m: m, match: func(s int) bool { return !live[m.slotAddr(s, 1)] }}
	flow := func(src, dst string) *netlink.ConntrackFlow {
		fl := &netlink.ConntrackFlow{}
		fl.Forward.SrcIP, fl.Forward.DstIP = net.ParseIP(src), net.ParseIP(dst)
		fl.Reverse.SrcIP, fl.Reverse.DstIP = net.ParseIP(dst), net.ParseIP(src)
		return fl
	}
	cases := []struct {
		src, dst string
		want     bool
	}{
		{"10.200.0.13", "1.1.1.1", false}, // slot 3, live
		{"10.200.0.14", "1.1.1.1", false}, // slot 3, live
		{"10.200.0.21", "8.8.8.8", true},  // slot 5, free
		{"127.0.0.1", "8.8.8.8", false},   // outside the space
		{"10.0.0.1", "10.200.0.6", true},  // host to a free slot's sandbox
		// IPv6: a slot's /64 in fd53:7071::/48.
		{"fd53:7071:0:3::2", "2001:2::1", false}, // slot 3, live
		{"fd53:7071:0:5::2", "2001:2::1", true},  // slot 5, free
		{"2001:2::1", "fd53:7071:0:5::1", true},  // to a free slot's host end
		{"fd53:7071:1:5::2", "2001:2::1", false}, // outside the space
		{"fd00::2", "2001:2::1", false},          // outside the space
	}
	if a := slotAddr6(65, 2); a != netip.MustParseAddr("fd53:7071:0:41::2") {
		t.Errorf("slotAddr6(65, 2) = %v", a)
	}
	if s, ok := m.slotOf(slotAddr6(maxSlots-1, 1)); !ok || s != maxSlots-1 {
		t.Errorf("slotOf(last IPv6 slot) = %d %v", s, ok)
	}
	for _, c := range cases {
		if got := f.MatchConntrackFlow(flow(c.src, c.dst)); got != c.want {
			t.Errorf("match %s -> %s = %v, want %v", c.src, c.dst, got, c.want)
		}
	}
}
