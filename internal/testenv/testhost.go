package testenv

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// TestHost stands for a machine outside the sandboxes: a network
// namespace the test creates, joined to the root namespace by a veth.
// Test traffic goes only there (never to a real address on the host's
// networks).
type TestHost struct {
	NS      string     // namespace name
	Addr    netip.Addr // the test host's address
	Gateway netip.Addr // the root namespace's end of the link
	// Addr6 and Gateway6 are their IPv6 twins, after AddIPv6.
	Addr6, Gateway6 netip.Addr
	ns              netns.NsHandle
}

// NewTestHost creates a test host named name (at most 13 characters) at
// addr, whose root-namespace end is gw (both in one /30). With
// sandboxOnly the host's own routing is left alone: only sandbox traffic
// (10.200.0.0/16) and traffic from gw reach addr, through a routing rule.
// Use it for addresses the host may use itself, such as the cloud
// metadata address. Tests that use the same address on one machine run
// one after another (a host-wide lock per address); everything is
// removed at the end of the test.
func NewTestHost(t testing.TB, name string, addr, gw netip.Addr, sandboxOnly bool) *TestHost {
	t.Helper()
	RequireRoot(t)
	lock, err := os.OpenFile(fmt.Sprintf("/run/spore-testhost-%s.lock", addr), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	h := &TestHost{NS: name, Addr: addr, Gateway: gw}
	a4 := addr.As4()
	table := fmt.Sprint(20000 + (int(a4[2])<<8|int(a4[3]))%10000)
	var rules [][]string
	if sandboxOnly {
		rules = [][]string{
			{"from", "10.200.0.0/16", "to", addr.String() + "/32", "lookup", table, "pref", "1500"},
			{"from", gw.String() + "/32", "to", addr.String() + "/32", "lookup", table, "pref", "1500"},
		}
	}
	t.Cleanup(func() {
		for _, r := range rules {
			exec.Command("ip", append([]string{"rule", "del"}, r...)...).Run()
		}
		exec.Command("ip", "link", "del", name+"0").Run()
		exec.Command("ip", "netns", "del", name).Run()
		if h.ns.IsOpen() {
			h.ns.Close()
		}
		lock.Close()
	})
	rootAddr := gw.String() + "/30"
	if sandboxOnly {
		rootAddr += " noprefixroute"
	}
	script := fmt.Sprintf(`set -e
ip netns add %[1]s
ip link add %[1]s0 type veth peer name %[1]s1 netns %[1]s
ip addr add %[2]s dev %[1]s0
ip link set %[1]s0 up
ip -n %[1]s addr add %[3]s/30 dev %[1]s1
ip -n %[1]s link set %[1]s1 up
ip -n %[1]s link set lo up
ip -n %[1]s route add default via %[4]s
`, name, rootAddr, addr, gw)
	if sandboxOnly {
		script += fmt.Sprintf("ip route add %s/32 dev %s0 table %s\n", addr, name, table)
		for _, r := range rules {
			script += "ip rule add " + strings.Join(r, " ") + "\n"
		}
	}
	if out, err := exec.Command("sh", "-c", script).CombinedOutput(); err != nil {
		t.Fatalf("test host %s: %v: %s", name, err, out)
	}
	if h.ns, err = netns.GetFromName(name); err != nil {
		t.Fatal(err)
	}
	return h
}

// AddIPv6 gives the test host the IPv6 address addr (a /64 shared with
// gw, the root namespace's end) and a default route via gw; both go with
// the host. Use the benchmarking range 2001:2::/48, outside the egress
// floor.
func (h *TestHost) AddIPv6(t testing.TB, addr, gw netip.Addr) {
	t.Helper()
	script := fmt.Sprintf(`set -e
ip -6 addr add %[2]s/64 dev %[1]s0 nodad
ip -n %[1]s -6 addr add %[3]s/64 dev %[1]s1 nodad
ip -n %[1]s -6 route add default via %[2]s
`, h.NS, gw, addr)
	if out, err := exec.Command("sh", "-c", script).CombinedOutput(); err != nil {
		t.Fatalf("test host %s IPv6: %v: %s", h.NS, err, out)
	}
	h.Addr6, h.Gateway6 = addr, gw
}

// in runs fn with the calling thread in the test host's namespace
// (sockets made there stay there).
func (h *TestHost) in(fn func() error) error { return InNetNS(h.ns, fn) }

// InNetNS runs fn with the calling goroutine's thread in network
// namespace ns, and puts the thread back where it was.
func InNetNS(ns netns.NsHandle, fn func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		return err
	}
	defer orig.Close()
	if err := netns.Set(ns); err != nil {
		return err
	}
	defer netns.Set(orig)
	return fn()
}

// Listen opens a listener inside the test host, closed at the end of
// the test.
func (h *TestHost) Listen(t testing.TB, network, addr string) net.Listener {
	t.Helper()
	var l net.Listener
	if err := h.in(func() (err error) { l, err = net.Listen(network, addr); return }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// ListenPacket opens a packet socket inside the test host, closed at the
// end of the test.
func (h *TestHost) ListenPacket(t testing.TB, network, addr string) net.PacketConn {
	t.Helper()
	var c net.PacketConn
	if err := h.in(func() (err error) { c, err = net.ListenPacket(network, addr); return }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// Dial connects from inside the test host.
func (h *TestHost) Dial(network, addr string, timeout time.Duration) (net.Conn, error) {
	var c net.Conn
	err := h.in(func() (err error) { c, err = net.DialTimeout(network, addr, timeout); return })
	return c, err
}

// ServeText serves body over HTTP on port of the test host.
func (h *TestHost) ServeText(t testing.TB, port int, body string) string {
	t.Helper()
	addr := netip.AddrPortFrom(h.Addr, uint16(port)).String()
	l := h.Listen(t, "tcp", addr)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, body) })}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return addr
}
