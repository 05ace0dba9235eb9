package netns

import (
	"log/slog"
	"os"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// forward6 switches on IPv6 forwarding and keeps router advertisements
// accepted on the interfaces that took them (accept_ra 1 becomes 2), not
// on those that did not, and not for interfaces made later ("default").
// Run in a namespace of the test's own.
func TestForward6KeepsRouterAdvertisements(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("network tests need root")
	}
	ns, err := newNamed("spt-fwd6")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { ns.Close(); netns.DeleteNamed("spt-fwd6") }()
	read := func(f string) string {
		b, err := os.ReadFile("/proc/sys/net/ipv6/conf/" + f)
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	write := func(f, v string) {
		if err := os.WriteFile("/proc/sys/net/ipv6/conf/"+f, []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := inNS(ns, func() error {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "fwda"}, PeerName: "fwdb"}); err != nil {
			return err
		}
		write("fwda/accept_ra", "1")
		write("fwdb/accept_ra", "0")
		write("default/accept_ra", "1")
		write("all/forwarding", "0")
		if err := forward6(slog.New(slog.DiscardHandler)); err != nil {
			return err
		}
		for f, want := range map[string]string{"all/forwarding": "1", "fwda/accept_ra": "2", "fwdb/accept_ra": "0", "default/accept_ra": "1"} {
			if got := read(f); got != want {
				t.Errorf("%s = %s, want %s", f, got, want)
			}
		}
		// Already forwarding: nothing is touched.
		write("fwdb/accept_ra", "1")
		if err := forward6(slog.New(slog.DiscardHandler)); err != nil {
			return err
		}
		if got := read("fwdb/accept_ra"); got != "1" {
			t.Errorf("a host already forwarding had accept_ra changed to %s", got)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
