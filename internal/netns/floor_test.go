package netns_test

import (
	"context"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/dnsfwd"
	"github.com/spore-run/spore/internal/dnsfwd/dnstest"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/netns"
	"github.com/spore-run/spore/internal/testenv"
)

var (
	privAddr = netip.MustParseAddr("192.168.250.2")
	metaAddr = netip.MustParseAddr("169.254.169.254")
)

// floorHosts starts two test hosts: one on a private address (as the
// host's LAN would be) and one on the cloud metadata address (reached
// only from sandboxes, so the host's own metadata traffic is untouched).
func floorHosts(t *testing.T) (priv, meta string) {
	p := testenv.NewTestHost(t, "spf-priv", privAddr, netip.MustParseAddr("192.168.250.1"), false)
	m := testenv.NewTestHost(t, "spf-meta", metaAddr, netip.MustParseAddr("169.254.169.253"), true)
	return p.ServeText(t, 18780, "private"), m.ServeText(t, 18781, "metadata")
}

// The operator floor: no user policy reaches the host's LAN or the
// metadata address. The same test hosts are reachable from a sandbox of
// a manager whose floor is empty, so the refusals are the floor's.
func TestEgressFloor(t *testing.T) {
	priv, meta := floorHosts(t)
	m := newManager(t)
	ctx := context.Background()
	if _, err := m.Setup(ctx, "fl-a", netns.Policy{Internet: true}); err != nil {
		t.Fatal(err)
	}
	ns := "spt-sb-fl-a"
	blocked := func(what string, targets ...string) {
		t.Helper()
		for _, target := range targets {
			if got, err := get(ns, target); err == nil {
				t.Errorf("%s: sandbox reached %s: %q", what, target, got)
			}
		}
	}
	blocked("default policy", priv, meta)
	for _, p := range []netns.Policy{
		{Internet: true, Allow: []netip.Prefix{netip.PrefixFrom(privAddr, 32)}},
		{Internet: false, Allow: []netip.Prefix{netip.PrefixFrom(privAddr, 32)}},
		{Internet: true, Allow: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}},
		{Internet: false, Allow: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}},
		{Internet: false, Allow: []netip.Prefix{netip.PrefixFrom(metaAddr, 32)}},
	} {
		if err := m.SetPolicy(ctx, "fl-a", p); err != nil {
			t.Fatal(err)
		}
		blocked(fmt.Sprintf("policy %+v", p), priv, meta)
	}
	// A new sandbox with the widest allow list is held by the floor from
	// its first packet.
	if _, err := m.Setup(ctx, "fl-b", netns.Policy{Allow: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}}); err != nil {
		t.Fatal(err)
	}
	ns = "spt-sb-fl-b"
	blocked("created with allow 0.0.0.0/0", priv, meta)

	// Control: without a floor the same allow lists reach both hosts.
	open, err := netns.New(ctx, netns.Config{Prefix: "spv", StateDir: t.TempDir(), Floor: []netip.Prefix{}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { open.Sweep(context.Background(), nil); open.RemoveHostRules() })
	if _, err := open.Setup(ctx, "ctl", netns.Policy{Allow: []netip.Prefix{netip.PrefixFrom(privAddr, 32), netip.PrefixFrom(metaAddr, 32)}}); err != nil {
		t.Fatal(err)
	}
	for _, target := range []string{priv, meta} {
		eventually(t, func() error { _, err := get("spv-sb-ctl", target); return err })
	}
}

// The floor holds the defaults and the host's own addresses; an
// operator's floor replaces the defaults.
func TestFloorContents(t *testing.T) {
	m := newManager(t)
	floor := m.Floor()
	covered := func(a netip.Addr) bool {
		for _, p := range floor {
			if p.Contains(a) {
				return true
			}
		}
		return false
	}
	for _, a := range []string{"10.1.2.3", "172.20.0.1", "192.168.1.1", "169.254.169.254", "127.0.0.1", "100.64.0.1", "0.0.0.0", "224.0.0.1", "255.255.255.255",
		// IPv6: cloud metadata (unique local), loopback, unspecified,
		// link-local, multicast, site-local, IPv4-mapped and -translated
		// (a way around the IPv4 floor), local-use NAT64, discard.
		"fd00:ec2::254", "::1", "::", "fe80::1", "ff02::1", "fec0::1", "::ffff:10.0.0.1", "::ffff:0:a00:1", "64:ff9b:1::a00:1", "100::1"} {
		if !covered(netip.MustParseAddr(a)) {
			t.Errorf("default floor lets %s through: %v", a, floor)
		}
	}
	for _, a := range []string{"198.18.0.2", "1.1.1.1", "2001:2::1", "2606:4700:4700::1111", "64:ff9b::101:101"} {
		if covered(netip.MustParseAddr(a)) {
			t.Errorf("default floor blocks public or benchmarking space (%s): %v", a, floor)
		}
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.(*net.IPNet).IP)
		if ip = ip.Unmap(); ok && !covered(ip) {
			t.Errorf("host address %s not in the floor %v", ip, floor)
		}
	}
	custom, err := netns.New(context.Background(), netns.Config{Prefix: "spw", StateDir: t.TempDir(), Floor: []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24")}})
	if err != nil {
		t.Fatal(err)
	}
	defer custom.RemoveHostRules()
	if f := custom.Floor(); !strings.Contains(fmt.Sprint(f), "203.0.113.0/24") || strings.Contains(fmt.Sprint(f), "10.0.0.0/8") {
		t.Errorf("operator floor %v", f)
	}
}

// User lists are capped and hold IPv4 or IPv6 prefixes (not IPv4-mapped
// IPv6 or zoned ones): anything else is an invalid-input error, and
// nothing is set up.
func TestPolicyLimits(t *testing.T) {
	m := newManager(t)
	ctx := context.Background()
	list := func(n int) []netip.Prefix {
		out := make([]netip.Prefix, n)
		for i := range out {
			out[i] = netip.PrefixFrom(netip.AddrFrom4([4]byte{203, 0, byte(i >> 8), byte(i)}), 32)
		}
		return out
	}
	for _, p := range []netns.Policy{
		{Allow: list(netns.MaxPolicyEntries + 1)},
		{Deny: list(netns.MaxPolicyEntries + 1)},
		{Allow: []netip.Prefix{netip.MustParsePrefix("::ffff:1.2.3.4/128")}},
		{Deny: []netip.Prefix{{}}},
	} {
		if _, err := m.Setup(ctx, "lim", p); !errdefs.IsInvalidArgument(err) {
			t.Fatalf("Setup with %d/%d entries: %v", len(p.Allow), len(p.Deny), err)
		}
		if _, err := m.Get("lim"); !errdefs.IsNotFound(err) {
			t.Fatalf("refused setup left a record: %v", err)
		}
	}
	if _, err := m.Setup(ctx, "lim", netns.Policy{Allow: list(netns.MaxPolicyEntries), Deny: list(netns.MaxPolicyEntries)}); err != nil {
		t.Fatal(err)
	}
	if err := m.SetPolicy(ctx, "lim", netns.Policy{Deny: list(netns.MaxPolicyEntries + 1)}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("SetPolicy over the cap: %v", err)
	}
	if n, _ := m.Get("lim"); len(n.Policy.Allow) != netns.MaxPolicyEntries {
		t.Fatalf("refused SetPolicy changed the record: %d entries", len(n.Policy.Allow))
	}
}

// query sends a DNS query from inside namespace ns to 10.0.0.1:53 over
// UDP or TCP and returns the answer.
func query(ns, proto string, q []byte) ([]byte, error) {
	script := `import socket, sys, struct
q = bytes.fromhex(sys.argv[2])
if sys.argv[1] == "udp":
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(3)
    s.sendto(q, ("10.0.0.1", 53)); print(s.recv(65535).hex())
else:
    s = socket.create_connection(("10.0.0.1", 53), timeout=3)
    s.sendall(struct.pack("!H", len(q)) + q); n = struct.unpack("!H", s.recv(2))[0]
    b = b""
    while len(b) < n: b += s.recv(n - len(b))
    print(b.hex())`
	out, err := exec.Command("ip", "netns", "exec", ns, "/usr/bin/python3", "-c", script, proto, hex.EncodeToString(q)).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("%v: %s", err, out)
	}
	return hex.DecodeString(strings.TrimSpace(string(out)))
}

// A sandbox's resolver is 10.0.0.1:53, which its gateway sends to the
// node's forwarder; the forwarder answers according to the sandbox's
// policy and nobody else can use it.
func TestDNSThroughGateway(t *testing.T) {
	// The upstream: a test DNS server on loopback (the node itself is not
	// under the floor).
	uu, ut, err := dnsfwd.Listen(netip.AddrFrom4([4]byte{127, 0, 0, 1}), 0)
	if err != nil {
		t.Fatal(err)
	}
	up := dnstest.Serve(uu, ut, map[string]netip.Addr{"myname.test": netip.MustParseAddr("198.18.0.9")})
	defer up.Close()
	// The forwarder on a free port of the root namespace.
	fu, ft, err := dnsfwd.Listen(netip.IPv4Unspecified(), 0)
	if err != nil {
		t.Fatal(err)
	}
	port := fu.LocalAddr().(*net.UDPAddr).Port
	m, err := netns.New(context.Background(), netns.Config{Prefix: "spd", StateDir: t.TempDir(), DNSPort: uint16(port)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Sweep(context.Background(), nil); m.RemoveHostRules() })
	policy := func(src netip.Addr) dnsfwd.Verdict {
		switch m.DNSVerdictFor(src) {
		case netns.DNSForward:
			return dnsfwd.Forward
		case netns.DNSRefuse:
			return dnsfwd.Refuse
		}
		return dnsfwd.Drop
	}
	fwd, err := dnsfwd.Serve(dnsfwd.Config{Upstreams: []netip.AddrPort{uu.LocalAddr().(*net.UDPAddr).AddrPort()}, Policy: policy}, fu, ft)
	if err != nil {
		t.Fatal(err)
	}
	defer fwd.Close()

	ctx := context.Background()
	open, err := m.Setup(ctx, "dns-open", netns.Policy{Internet: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Setup(ctx, "dns-closed", netns.Policy{Internet: false, Allow: []netip.Prefix{netip.MustParsePrefix("198.18.0.0/15")}}); err != nil {
		t.Fatal(err)
	}
	q := dnsfwd.Query(77, "myname.test", 1)
	for _, proto := range []string{"udp", "tcp"} {
		resp, err := query("spd-sb-dns-open", proto, q)
		if err != nil {
			t.Fatalf("%s query from an open sandbox: %v", proto, err)
		}
		if a, ok := dnstest.AnswerAddr(resp); !ok || a.String() != "198.18.0.9" {
			t.Fatalf("%s answer %x", proto, resp)
		}
		resp, err = query("spd-sb-dns-closed", proto, q)
		if err != nil || dnsfwd.Rcode(resp) != dnsfwd.RcodeRefused {
			t.Fatalf("%s query from a closed sandbox: rcode %d, %v", proto, dnsfwd.Rcode(resp), err)
		}
	}
	before := up.Queries()
	// Policy changes apply to the next query.
	if err := m.SetPolicy(ctx, "dns-open", netns.Policy{}); err != nil {
		t.Fatal(err)
	}
	if resp, err := query("spd-sb-dns-open", "udp", q); err != nil || dnsfwd.Rcode(resp) != dnsfwd.RcodeRefused {
		t.Fatalf("after internet off: rcode %d, %v", dnsfwd.Rcode(resp), err)
	}
	if up.Queries() != before {
		t.Fatal("a refused query reached the upstream")
	}
	// The forwarder's port is closed to everything but sandboxes: a test
	// host on the LAN side gets no answer.
	lan := testenv.NewTestHost(t, "spd-lan", netip.MustParseAddr("192.168.250.6"), netip.MustParseAddr("192.168.250.5"), false)
	if c, err := lan.Dial("tcp4", fmt.Sprintf("192.168.250.5:%d", port), time.Second); err == nil {
		c.Close()
		t.Fatal("a host on the LAN connected to the forwarder")
	}
	c := lan.ListenPacket(t, "udp4", "192.168.250.6:0")
	c.SetDeadline(time.Now().Add(time.Second))
	c.WriteTo(q, &net.UDPAddr{IP: net.IPv4(192, 168, 250, 5), Port: port})
	if _, _, err := c.ReadFrom(make([]byte, 512)); err == nil {
		t.Fatal("the forwarder answered a host on the LAN")
	}
	// Teardown forgets the sandbox's address.
	if err := m.Teardown(ctx, "dns-open"); err != nil {
		t.Fatal(err)
	}
	if v := m.DNSVerdictFor(open.Addr); v != netns.DNSDrop {
		t.Fatalf("verdict for a torn down sandbox: %v", v)
	}
}
