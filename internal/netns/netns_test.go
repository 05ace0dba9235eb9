package netns_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	vnetns "github.com/vishvananda/netns"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/netns"
	"github.com/spore-run/spore/internal/testenv"
)

// These tests check the topology with ordinary Linux processes placed in
// the namespaces (the engine tests run gVisor sandboxes on it).

func newManager(t *testing.T) *netns.Manager { return newManagerWith(t, netns.Config{}) }

// newManagerWith is newManager with more of the manager's configuration.
func newManagerWith(t *testing.T, cfg netns.Config) *netns.Manager {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("network tests need root")
	}
	cfg.Prefix = "spt"
	if cfg.StateDir == "" {
		cfg.StateDir = t.TempDir()
	}
	m, err := netns.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Sweep(context.Background(), nil); err != nil {
			t.Errorf("sweep: %v", err)
		}
		m.RemoveHostRules()
		if ents, _ := os.ReadDir("/var/run/netns"); len(ents) > 0 {
			for _, e := range ents {
				if strings.HasPrefix(e.Name(), "spt-") {
					t.Errorf("namespace left: %s", e.Name())
				}
			}
		}
	})
	return m
}

// serve runs an HTTP server answering name on addr inside namespace ns.
func serve(t *testing.T, ns, addr, name string) {
	t.Helper()
	dir := t.TempDir()
	os.WriteFile(dir+"/who", []byte(name), 0o644)
	host, port, _ := strings.Cut(addr, ":")
	// http.server's own bind looks the address up in DNS before it
	// listens, which stalls in a namespace without DNS: skip that.
	script := `import functools, http.server, socketserver, sys
class S(http.server.HTTPServer):
    def server_bind(self):
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = "test", int(sys.argv[2])
h = functools.partial(http.server.SimpleHTTPRequestHandler, directory=sys.argv[3])
S((sys.argv[1], int(sys.argv[2])), h).serve_forever()`
	args := []string{"/usr/bin/python3", "-c", script, host, port, dir}
	if ns != "" {
		args = append([]string{"ip", "netns", "exec", ns}, args...)
	}
	cmd := exec.Command(args[0], args[1:]...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
}

// get fetches http://addr/who from inside namespace ns ("" = the host).
func get(ns, addr string) (string, error) {
	args := []string{"/usr/bin/python3", "-c", fmt.Sprintf("import urllib.request;print(urllib.request.urlopen('http://%s/who', timeout=1).read().decode(), end='')", addr)}
	if ns != "" {
		args = append([]string{"ip", "netns", "exec", ns}, args...)
	}
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%v: %s", err, out)
	}
	return string(out), nil
}

// eventually waits for f to hold: a hang guard, not a time limit (the
// batched conntrack flush runs 2 s after a teardown, then dumps the
// host's whole table, which the fleet tests beside this package fill: it
// took over 5 s on two busy cores).
func eventually(t *testing.T, f func() error) {
	t.Helper()
	var err error
	for range 300 {
		if err = f(); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatal(err)
}

func TestTopologyIsolationAndEgress(t *testing.T) {
	m := newManager(t)
	ctx := context.Background()
	a, err := m.Setup(ctx, "inst-a", netns.Policy{Internet: true})
	if err != nil {
		t.Fatal(err)
	}
	b, err := m.Setup(ctx, "inst-b", netns.Policy{Internet: true})
	if err != nil {
		t.Fatal(err)
	}
	if a.Addr == b.Addr || a.Slot == b.Slot {
		t.Fatalf("two instances share an address: %+v %+v", a, b)
	}
	if _, err := m.Setup(ctx, "inst-a", netns.Policy{}); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("second Setup of one instance = %v", err)
	}
	// Both sandboxes listen on the same inside address; the host reaches
	// each through its own address.
	serve(t, "spt-sb-inst-a", "10.0.0.2:8000", "a")
	serve(t, "spt-sb-inst-b", "10.0.0.2:8000", "b")
	for n, want := range map[netip.Addr]string{a.Addr: "a", b.Addr: "b"} {
		eventually(t, func() error {
			got, err := get("", n.String()+":8000")
			if err == nil && got != want {
				err = fmt.Errorf("got %q from %s, want %q", got, n, want)
			}
			return err
		})
	}
	// A sandbox cannot reach a host service, nor another sandbox.
	serve(t, "", "0.0.0.0:8001", "host")
	eventually(t, func() error { _, err := get("", "127.0.0.1:8001"); return err })
	for _, target := range []string{a.HostAddr.String() + ":8001", b.HostAddr.String() + ":8001", b.Addr.String() + ":8000"} {
		if got, err := get("spt-sb-inst-a", target); err == nil {
			t.Fatalf("sandbox a reached %s: %q", target, got)
		}
	}

	// Egress to an outside test host (a namespace of this test, on the
	// benchmarking range 198.18.0.0/15): allowed, then denied by a deny
	// list, then with internet off, then allowed again by an allow list.
	peer := exec.Command("sh", "-c", `ip netns add spt-peer && ip link add sptpeer0 type veth peer name sptpeer1 netns spt-peer &&
		ip addr add 198.18.0.1/30 dev sptpeer0 && ip link set sptpeer0 up &&
		ip -n spt-peer addr add 198.18.0.2/30 dev sptpeer1 && ip -n spt-peer link set sptpeer1 up && ip -n spt-peer link set lo up &&
		ip -n spt-peer route add default via 198.18.0.1`)
	if out, err := peer.CombinedOutput(); err != nil {
		t.Fatalf("peer: %v %s", err, out)
	}
	t.Cleanup(func() {
		exec.Command("ip", "link", "del", "sptpeer0").Run()
		exec.Command("ip", "netns", "del", "spt-peer").Run()
	})
	serve(t, "spt-peer", "198.18.0.2:8002", "outside")
	out := "198.18.0.2:8002"
	eventually(t, func() error {
		_, err := get("spt-sb-inst-a", out)
		if err != nil {
			ss, _ := exec.Command("ip", "netns", "exec", "spt-peer", "ss", "-ltn").CombinedOutput()
			_, herr := get("", out)
			err = fmt.Errorf("%.200s\npeer listening: %s\nfrom host: %v", err, ss, herr)
		}
		return err
	})
	deny := netns.Policy{Internet: true, Deny: []netip.Prefix{netip.MustParsePrefix("198.18.0.0/30")}}
	if err := m.SetPolicy(ctx, "inst-a", deny); err != nil {
		t.Fatal(err)
	}
	if _, err := get("spt-sb-inst-a", out); err == nil {
		t.Fatal("deny list not enforced")
	}
	if _, err := get("spt-sb-inst-b", out); err != nil {
		t.Fatalf("b's policy changed with a's: %v", err)
	}
	if err := m.SetPolicy(ctx, "inst-a", netns.Policy{Internet: false}); err != nil {
		t.Fatal(err)
	}
	if _, err := get("spt-sb-inst-a", out); err == nil {
		t.Fatal("internet off not enforced")
	}
	if err := m.SetPolicy(ctx, "inst-a", netns.Policy{Internet: false, Allow: []netip.Prefix{netip.MustParsePrefix("198.18.0.2/32")}}); err != nil {
		t.Fatal(err)
	}
	if _, err := get("spt-sb-inst-a", out); err != nil {
		t.Fatalf("allow list not honoured: %v", err)
	}
	if got, _ := m.Get("inst-a"); got.Policy.Internet || len(got.Policy.Allow) != 1 {
		t.Fatalf("recorded policy %+v", got.Policy)
	}
	// The host can still reach the sandbox whatever its egress policy.
	if _, err := get("", a.Addr.String()+":8000"); err != nil {
		t.Fatalf("host to sandbox after policy change: %v", err)
	}

	if err := m.Teardown(ctx, "inst-a"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat("/var/run/netns/spt-sb-inst-a"); !os.IsNotExist(err) {
		t.Fatal("namespace left after teardown")
	}
	if err := m.Teardown(ctx, "inst-a"); err != nil {
		t.Fatalf("second teardown: %v", err)
	}
	// A freed slot is not reused at once (round-robin).
	c, err := m.Setup(ctx, "inst-c", netns.Policy{})
	if err != nil || c.Slot == a.Slot || c.Slot == b.Slot {
		t.Fatalf("slot after teardown: %+v %v", c, err)
	}
}

// Two managers on one host (two servers, or tests in parallel) never hand
// out the same addresses: the 10.200.0.0/16 space is shared.
func TestTwoManagersShareTheHost(t *testing.T) {
	m1 := newManager(t)
	m2, err := netns.New(context.Background(), netns.Config{Prefix: "spu", StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m2.Sweep(context.Background(), nil); m2.RemoveHostRules() })
	ctx := context.Background()
	seen := map[netip.Addr]string{}
	errs := make(chan error, 8)
	nets := make(chan netns.Net, 8)
	for i := range 4 {
		for _, m := range []*netns.Manager{m1, m2} {
			go func() {
				n, err := m.Setup(ctx, fmt.Sprintf("two-%d-%p", i, m), netns.Policy{})
				errs <- err
				nets <- n
			}()
		}
	}
	for range 8 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
		n := <-nets
		if other, dup := seen[n.Addr]; dup {
			t.Fatalf("%s and %s both got %s", other, n.Instance, n.Addr)
		}
		seen[n.Addr] = n.Instance
	}
}

// A sandbox has IPv6 beside IPv4 when the host has it: it reaches an
// outside IPv6 host (masqueraded: the host sees the node's address, not
// the sandbox's), and the policy's IPv6 entries, the floor and the host's
// isolation hold as they do in IPv4.
func TestIPv6Egress(t *testing.T) {
	m := newManager(t)
	ctx := context.Background()
	a, err := m.Setup(ctx, "inst-6a", netns.Policy{Internet: true})
	if err != nil {
		t.Fatal(err)
	}
	b, err := m.Setup(ctx, "inst-6b", netns.Policy{Internet: true})
	if err != nil {
		t.Fatal(err)
	}
	if !a.Addr6.IsValid() || a.Addr6 == b.Addr6 {
		t.Fatalf("IPv6 addresses: %v %v", a.Addr6, b.Addr6)
	}
	out, err := exec.Command("ip", "netns", "exec", "spt-sb-inst-6a", "ip", "-6", "route", "show", "default").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "via "+netns.GatewayIP6.String()) {
		t.Fatalf("sandbox's IPv6 default route: %s %v", out, err)
	}

	peer := testenv.NewTestHost(t, "spt-peer6", netip.MustParseAddr("198.18.6.2"), netip.MustParseAddr("198.18.6.1"), false)
	peer.AddIPv6(t, netip.MustParseAddr("2001:2:0:6::2"), netip.MustParseAddr("2001:2:0:6::1"))
	seen := make(chan string, 16)
	l := peer.Listen(t, "tcp6", "[2001:2:0:6::2]:8006")
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case seen <- r.RemoteAddr:
		default:
		}
		fmt.Fprint(w, "outside6")
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	out6 := "[2001:2:0:6::2]:8006"
	eventually(t, func() error {
		got, err := get("spt-sb-inst-6a", out6)
		if err == nil && got != "outside6" {
			err = fmt.Errorf("got %q", got)
		}
		return err
	})
	if from := <-seen; !strings.HasPrefix(from, "[2001:2:0:6::1]:") {
		t.Fatalf("the outside host saw %s, want the node's address 2001:2:0:6::1", from)
	}

	// Deny an IPv6 prefix: that host is gone over IPv6 alone.
	v4 := peer.ServeText(t, 8007, "outside4")
	deny := netns.Policy{Internet: true, Deny: []netip.Prefix{netip.MustParsePrefix("2001:2:0:6::/64")}}
	if err := m.SetPolicy(ctx, "inst-6a", deny); err != nil {
		t.Fatal(err)
	}
	if _, err := get("spt-sb-inst-6a", out6); err == nil {
		t.Fatal("IPv6 deny entry not enforced")
	}
	if got, err := get("spt-sb-inst-6a", v4); err != nil || got != "outside4" {
		t.Fatalf("an IPv6 deny entry closed IPv4: %q %v", got, err)
	}
	if _, err := get("spt-sb-inst-6b", out6); err != nil {
		t.Fatalf("b's policy changed with a's: %v", err)
	}
	// Everything off but one IPv6 address: allow wins over deny.
	only := netns.Policy{Internet: true, Deny: []netip.Prefix{netip.MustParsePrefix("::/0"), netip.MustParsePrefix("0.0.0.0/0")},
		Allow: []netip.Prefix{netip.MustParsePrefix("2001:2:0:6::2/128")}}
	if err := m.SetPolicy(ctx, "inst-6a", only); err != nil {
		t.Fatal(err)
	}
	if _, err := get("spt-sb-inst-6a", out6); err != nil {
		t.Fatalf("IPv6 allow entry not honoured: %v", err)
	}
	if _, err := get("spt-sb-inst-6a", v4); err == nil {
		t.Fatal("deny 0.0.0.0/0 not enforced beside an IPv6 allow entry")
	}
	if err := m.SetPolicy(ctx, "inst-6a", netns.Policy{Internet: false}); err != nil {
		t.Fatal(err)
	}
	if _, err := get("spt-sb-inst-6a", out6); err == nil {
		t.Fatal("internet off not enforced over IPv6")
	}

	// The host and other sandboxes stay out of reach over IPv6, whatever
	// the policy allows: the host's own addresses (the floor), its end of
	// the sandbox's link and another sandbox (the root namespace's rules).
	if err := m.SetPolicy(ctx, "inst-6a", netns.Policy{Internet: true, Allow: []netip.Prefix{netip.MustParsePrefix("::/0")}}); err != nil {
		t.Fatal(err)
	}
	hl, err := net.Listen("tcp6", "[::]:0")
	if err != nil {
		t.Fatal(err)
	}
	hsrv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "host6") })}
	go hsrv.Serve(hl)
	t.Cleanup(func() { hsrv.Close() })
	port := strconv.Itoa(hl.Addr().(*net.TCPAddr).Port)
	targets := []string{net.JoinHostPort(a.HostAddr6.String(), port), net.JoinHostPort(peer.Gateway6.String(), port), "[::1]:" + port,
		net.JoinHostPort(b.Addr6.String(), port)}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, ad := range addrs {
		if ip := ad.(*net.IPNet).IP; ip.To4() == nil && !ip.IsLinkLocalUnicast() {
			targets = append(targets, net.JoinHostPort(ip.String(), port))
		}
	}
	if got, err := get("", "[::1]:"+port); err != nil || got != "host6" {
		t.Fatalf("the host's own service: %q %v", got, err)
	}
	for _, target := range targets {
		if got, err := get("spt-sb-inst-6a", target); err == nil {
			t.Errorf("sandbox reached the host at %s: %q", target, got)
		}
	}
	if got, err := get("spt-sb-inst-6a", out6); err != nil || got != "outside6" {
		t.Fatalf("outside host after the isolation checks: %q %v", got, err)
	}
}

// BenchmarkSetup: one sandbox network's Setup and Teardown (namespaces,
// links, addresses, rules), IPv4 alone and with IPv6 beside it.
func BenchmarkSetup(b *testing.B) {
	for _, c := range []struct {
		name   string
		noIPv6 bool
	}{{"ipv4", true}, {"ipv4+ipv6", false}} {
		b.Run(c.name, func(b *testing.B) {
			m, err := netns.New(context.Background(), netns.Config{Prefix: "spb", StateDir: b.TempDir(), NoIPv6: c.noIPv6})
			if err != nil {
				b.Fatal(err)
			}
			defer m.RemoveHostRules()
			ctx := context.Background()
			var setup, teardown time.Duration
			for i := 0; b.Loop(); i++ {
				id := fmt.Sprintf("bench-%d", i)
				t0 := time.Now()
				if _, err := m.Setup(ctx, id, netns.Policy{Internet: true}); err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				if err := m.Teardown(ctx, id); err != nil {
					b.Fatal(err)
				}
				setup, teardown = setup+t1.Sub(t0), teardown+time.Since(t1)
			}
			b.ReportMetric(float64(setup.Microseconds())/float64(b.N)/1000, "setup-ms/op")
			b.ReportMetric(float64(teardown.Microseconds())/float64(b.N)/1000, "teardown-ms/op")
		})
	}
}

// NoIPv6 keeps sandboxes on IPv4: no IPv6 address or route in the
// sandbox, no IPv6 table in the gateway.
func TestNoIPv6(t *testing.T) {
	m, err := netns.New(context.Background(), netns.Config{Prefix: "spn", StateDir: t.TempDir(), NoIPv6: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Sweep(context.Background(), nil); m.RemoveHostRules() })
	n, err := m.Setup(context.Background(), "v4only", netns.Policy{Internet: true})
	if err != nil {
		t.Fatal(err)
	}
	if n.Addr6.IsValid() || n.HostAddr6.IsValid() {
		t.Fatalf("IPv6 addresses with NoIPv6: %v %v", n.Addr6, n.HostAddr6)
	}
	out, err := exec.Command("ip", "netns", "exec", "spn-sb-v4only", "ip", "-6", "addr", "show", "scope", "global").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "" {
		t.Fatalf("sandbox's global IPv6 addresses: %q %v", out, err)
	}
	gw, err := vnetns.GetFromName("spn-gw-v4only")
	if err != nil {
		t.Fatal(err)
	}
	defer gw.Close()
	c, err := nftables.New(nftables.WithNetNSFd(int(gw)))
	if err != nil {
		t.Fatal(err)
	}
	tables, err := c.ListTables()
	if err != nil {
		t.Fatal(err)
	}
	var fams []nftables.TableFamily
	for _, tb := range tables {
		fams = append(fams, tb.Family)
	}
	if !slices.Equal(fams, []nftables.TableFamily{nftables.TableFamilyIPv4}) {
		t.Fatalf("gateway's table families: %v, want IPv4 alone", fams)
	}
}
