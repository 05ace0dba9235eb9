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
		// link-local, multicast, site-local, IPv4-mapped, -translated and
		// -compatible, the private IPv4 ranges under NAT64 and 6to4, Teredo
		// (ways around the IPv4 floor), local-use NAT64, discard.
		"fd00:ec2::254", "::1", "::", "fe80::1", "ff02::1", "fec0::1", "::ffff:10.0.0.1", "::ffff:0:a00:1", "::a00:1", "64:ff9b::a9fe:a9fe",
		"64:ff9b::c0a8:101", "2002:a9fe:a9fe::1", "2002:a00:1::1", "2001:0:4136:e378:8000:63bf:3fff:fdd2", "64:ff9b:1::a00:1", "100::1"} {
		if !covered(netip.MustParseAddr(a)) {
			t.Errorf("default floor lets %s through: %v", a, floor)
		}
	}
	for _, a := range []string{"198.18.0.2", "1.1.1.1", "2001:2::1", "2606:4700:4700::1111", "64:ff9b::101:101", "2002:101:101::1", "2001:db8::1"} {
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
	// An operator's IPv4 entries are floored under NAT64 and 6to4 too.
	if f := fmt.Sprint(custom.Floor()); !strings.Contains(f, "203.0.113.0/24") || strings.Contains(f, "10.0.0.0/8") ||
		!strings.Contains(f, "64:ff9b::cb00:7100/120") || !strings.Contains(f, "2002:cb00:7100::/40") {
		t.Errorf("operator floor %v", f)
	}
}

// Every IPv4 prefix of the default floor is floored in the IPv6 forms
// that reach it: under NAT64's well-known prefix (RFC 6052), as 6to4
// (2002:aabb:ccdd::/16+n, RFC 3056) and IPv4-mapped; so are Teredo and
// IPv4-compatible addresses. A public IPv4 address stays reachable by
// NAT64 and 6to4 (an IPv6-only host's way to the IPv4 internet). Each
// form is computed here from its text notation, apart from floor.go.
func TestDefaultFloorIPv6Forms(t *testing.T) {
	floor := netns.DefaultFloor()
	coversPrefix := func(p netip.Prefix) bool {
		for _, q := range floor {
			if q.Bits() <= p.Bits() && q.Contains(p.Addr()) {
				return true
			}
		}
		return false
	}
	forms := func(p netip.Prefix) map[string]netip.Prefix {
		a := p.Addr().As4()
		return map[string]netip.Prefix{
			"NAT64":  netip.MustParsePrefix(fmt.Sprintf("64:ff9b::%s/%d", p.Addr(), 96+p.Bits())),
			"6to4":   netip.MustParsePrefix(fmt.Sprintf("2002:%02x%02x:%02x%02x::/%d", a[0], a[1], a[2], a[3], 16+p.Bits())),
			"mapped": netip.MustParsePrefix(fmt.Sprintf("::ffff:%s/%d", p.Addr(), 96+p.Bits())),
		}
	}
	var v4 []netip.Prefix
	for _, p := range floor {
		if p.Addr().Is4() {
			v4 = append(v4, p)
		}
	}
	if len(v4) < 10 {
		t.Fatalf("the default floor has %d IPv4 prefixes: %v", len(v4), floor)
	}
	for _, p := range v4 {
		for kind, f := range forms(p) {
			if !coversPrefix(f) {
				t.Errorf("%s form %v of floor prefix %v not covered", kind, f, p)
			}
		}
	}
	for _, p := range []string{"2001::/32", "::/96", "64:ff9b::a00:0/104", "2002:a00::/24", "2002:e000::/20", "64:ff9b::f000:0/100"} {
		if !coversPrefix(netip.MustParsePrefix(p)) {
			t.Errorf("%s not covered", p)
		}
	}

	// Addresses: random ones inside each IPv4 floor prefix, and random
	// IPv4 addresses anywhere, in each IPv6 form (random low bits under
	// 6to4 and Teredo).
	rng := testenv.Rand(t)
	inFloor4 := func(a netip.Addr) bool {
		for _, p := range v4 {
			if p.Contains(a) {
				return true
			}
		}
		return false
	}
	covered := func(a netip.Addr) bool { return coversPrefix(netip.PrefixFrom(a, 128)) }
	random4 := func(p netip.Prefix) netip.Addr {
		b := p.Addr().As4()
		r := rng.Uint32() >> p.Bits()
		n := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3]) | r
		return netip.AddrFrom4([4]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)})
	}
	six := func(a netip.Addr) map[string]netip.Addr {
		b := a.As4()
		return map[string]netip.Addr{
			"NAT64":      netip.MustParseAddr("64:ff9b::" + a.String()),
			"6to4":       netip.MustParseAddr(fmt.Sprintf("2002:%02x%02x:%02x%02x:%x:%x:%x:%x:%x", b[0], b[1], b[2], b[3], rng.IntN(1<<16), rng.IntN(1<<16), rng.IntN(1<<16), rng.IntN(1<<16), rng.IntN(1<<16))),
			"mapped":     netip.MustParseAddr("::ffff:" + a.String()),
			"compatible": netip.MustParseAddr("::" + a.String()),
			"Teredo":     netip.MustParseAddr(fmt.Sprintf("2001:0:%02x%02x:%02x%02x:%x:%x:%x:%x", b[0], b[1], b[2], b[3], rng.IntN(1<<16), rng.IntN(1<<16), rng.IntN(1<<16), rng.IntN(1<<16))),
		}
	}
	public := 0
	for i := 0; i < 2000; i++ {
		var a netip.Addr
		if i%2 == 0 {
			a = random4(v4[rng.IntN(len(v4))])
		} else {
			a = random4(netip.MustParsePrefix("0.0.0.0/0"))
		}
		floored := inFloor4(a)
		for kind, x := range six(a) {
			switch always := kind == "mapped" || kind == "compatible" || kind == "Teredo"; {
			case (floored || always) && !covered(x):
				t.Fatalf("%s form %s of %s (IPv4 floored: %v) not covered", kind, x, a, floored)
			case !floored && !always && covered(x):
				t.Fatalf("%s form %s of the public %s covered: NAT64 and 6to4 to the internet must pass", kind, x, a)
			}
		}
		if !floored {
			public++
		}
	}
	if public < 500 {
		t.Fatalf("only %d public addresses drawn", public)
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
