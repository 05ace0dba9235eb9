package node_test

import (
	"crypto/tls"
	"encoding/pem"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/dnsfwd/dnstest"
	"github.com/spore-run/spore/internal/egress"
	"github.com/spore-run/spore/internal/engine"
	"github.com/spore-run/spore/internal/netaudit"
	"github.com/spore-run/spore/internal/netns"
	"github.com/spore-run/spore/internal/node"
	"github.com/spore-run/spore/internal/testenv"
)

// The IPv6 test host: one machine with an IPv4 address and two IPv6 ones
// ("six" at ::2, "other" at ::3), each answering HTTP on 80 and 8080 and
// HTTPS on 443 with its name, the Host, the SNI and the address family
// it was reached over; its DNS server names six.test (A and AAAA),
// six-only.test (AAAA) and other.test (AAAA of ::3).
var (
	sixIP4   = netip.MustParseAddr("198.19.46.2")
	sixIP6   = netip.MustParseAddr("2001:2:0:46::2")
	otherIP6 = netip.MustParseAddr("2001:2:0:46::3")
)

func ipv6Internet(t *testing.T) (*testenv.TestHost, tls.Certificate) {
	h := testenv.NewTestHost(t, "spyt-six", sixIP4, netip.MustParseAddr("198.19.46.1"), false)
	h.AddIPv6(t, sixIP6, netip.MustParseAddr("2001:2:0:46::1"))
	if out, err := exec.Command("ip", "-n", h.NS, "-6", "addr", "add", otherIP6.String()+"/64", "dev", h.NS+"1", "nodad").CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	cert := testenv.SelfSignedCert(t)
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		local := r.Context().Value(http.LocalAddrContextKey).(net.Addr).(*net.TCPAddr).AddrPort().Addr().Unmap()
		name, fam := "six", "4"
		if local.Is6() {
			fam = "6"
		}
		if local == otherIP6 {
			name = "other"
		}
		sni := ""
		if r.TLS != nil {
			sni = r.TLS.ServerName
		}
		fmt.Fprintf(w, "%s host=%s sni=%s via=%s", name, r.Host, sni, fam)
		if a := r.Header.Get("Authorization"); a != "" {
			fmt.Fprintf(w, " auth=%s", a)
		}
		fmt.Fprintf(w, " from=%s", r.RemoteAddr)
	})
	for _, addr := range []string{sixIP4.String(), "::"} {
		network := "tcp4"
		if addr == "::" {
			network = "tcp6"
		}
		plain := &http.Server{Handler: handler}
		go plain.Serve(h.Listen(t, network, net.JoinHostPort(addr, "80")))
		other := &http.Server{Handler: handler}
		go other.Serve(h.Listen(t, network, net.JoinHostPort(addr, "8080")))
		tl := &http.Server{Handler: handler, TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}}}
		go tl.ServeTLS(h.Listen(t, network, net.JoinHostPort(addr, "443")), "", "")
		t.Cleanup(func() { plain.Close(); other.Close(); tl.Close() })
	}
	dns := dnstest.Serve(h.ListenPacket(t, "udp4", sixIP4.String()+":53"), h.Listen(t, "tcp4", sixIP4.String()+":53"),
		map[string]netip.Addr{"six.test": sixIP4, "six-only.test": sixIP6, "other.test": otherIP6})
	dns.Add("six.test", sixIP6)
	t.Cleanup(dns.Close)
	return h, cert
}

// Sandboxes have IPv6 beside IPv4 (gVisor takes both from the sandbox's
// namespace): they reach an IPv6 host, by address and by a name with an
// AAAA record, masqueraded (the host sees the node's address); the
// policy's IPv6 entries work as the IPv4 ones do (allow over deny, at run
// time), domain rules are enforced on IPv6 connections too (the egress
// proxy takes them on its IPv6 listener) and so are network rules (a
// header injected into an HTTPS request over IPv6), both kinds of decision are in
// the egress audit, and a fork (a restore into new namespaces) has IPv6
// with the policy it inherited.
func TestIPv6InTheSandbox(t *testing.T) {
	_, cert := ipv6Internet(t)
	caFile := filepath.Join(t.TempDir(), "upstream.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Certificate[0]}), 0o644); err != nil {
		t.Fatal(err)
	}
	e := newEnvTuned(t, func(c *node.Config) {
		c.NetPrefix = "sp6"
		c.DNSUpstreams = []netip.AddrPort{netip.AddrPortFrom(sixIP4, 53)}
		c.EgressCAFiles = []string{caFile} // the proxy verifies it when it injects headers
	})
	ctx := ctxFor(t)
	open := netns.Policy{Internet: true}
	sb := e.create(ctx, engine.CreateOptions{Template: node.TemplateBase, Policy: &open})
	get := func(sb engine.Sandbox, args string) string {
		r, _ := e.client(sb).run(ctx, `curl -sk -m 3 `+args+` || echo blocked`)
		return strings.TrimSpace(r.stdout)
	}
	check := func(sb engine.Sandbox, args, want string) {
		t.Helper()
		got := get(sb, args)
		if i := strings.Index(got, " from="); i >= 0 {
			got = got[:i]
		}
		if got != want {
			t.Errorf("curl %s = %q, want %q", args, got, want)
		}
	}
	six := "http://[" + sixIP6.String() + "]/"
	check(sb, six, "six host=["+sixIP6.String()+"] sni= via=6")
	check(sb, "-6 https://six.test/", "six host=six.test sni=six.test via=6")
	check(sb, "https://six-only.test/", "six host=six-only.test sni=six-only.test via=6")
	check(sb, "-4 https://six.test/", "six host=six.test sni=six.test via=4")
	if got := get(sb, six); !strings.Contains(got, "from=[2001:2:0:46::1]:") {
		t.Errorf("the outside host saw %q, want the node's address 2001:2:0:46::1", got)
	}

	// IPv6 entries: a deny, then E2B's "only this address" pattern.
	if err := e.n.Engine.SetPolicy(ctx, sb.ID, netns.Policy{Internet: true, Deny: []netip.Prefix{netip.MustParsePrefix("::/0")}}); err != nil {
		t.Fatal(err)
	}
	check(sb, six, "blocked")
	check(sb, "-4 https://six.test/", "six host=six.test sni=six.test via=4")
	only := netns.Policy{Internet: true, Deny: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")},
		Allow: []netip.Prefix{netip.PrefixFrom(sixIP6, 128)}}
	if err := e.n.Engine.SetPolicy(ctx, sb.ID, only); err != nil {
		t.Fatal(err)
	}
	check(sb, six, "six host=["+sixIP6.String()+"] sni= via=6")
	check(sb, "http://["+otherIP6.String()+"]:8080/", "blocked")
	check(sb, "http://"+sixIP4.String()+":8080/", "blocked")

	// Domain rules on IPv6 connections: the allowed name passes; sent to
	// another address, it reaches the name's own server; an address
	// without a name and another name do not pass.
	names := netns.Policy{Internet: true, Deny: only.Deny, AllowDomains: []string{"six.test"}}
	if err := e.n.Engine.SetPolicy(ctx, sb.ID, names); err != nil {
		t.Fatal(err)
	}
	checkNames := func(sb engine.Sandbox) {
		t.Helper()
		check(sb, "-6 https://six.test/", "six host=six.test sni=six.test via=6")
		check(sb, "-6 http://six.test/", "six host=six.test sni= via=6")
		check(sb, "--resolve six.test:443:["+otherIP6.String()+"] https://six.test/", "six host=six.test sni=six.test via=6")
		check(sb, "https://["+sixIP6.String()+"]/", "blocked")
		check(sb, "https://other.test/", "blocked")
		check(sb, "-H 'Host: other.test' http://["+otherIP6.String()+"]/", "blocked")
	}
	checkNames(sb)
	log, err := e.n.EgressLog(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(log, func(r egress.Record) bool {
		return r.Allowed && r.Domain == "six.test" && r.Dst.Addr() == otherIP6 && r.Upstream.Addr() == sixIP6
	}) {
		t.Errorf("the proxy's log lacks the redirected IPv6 connection: %+v", log)
	}

	// A network rule: the proxy terminates the sandbox's TLS (curl -k:
	// the sandbox's trust store is envd's business, tested with it) and
	// sets the header, over IPv6 both ways.
	ca, err := egress.NewCA("six")
	if err != nil {
		t.Fatal(err)
	}
	inject := names
	inject.CA, inject.Inject = ca, []egress.Injection{{Pattern: "six.test", Headers: []egress.Header{{Name: "Authorization", Value: "Bearer sk-six"}}}}
	if err := e.n.Engine.SetPolicy(ctx, sb.ID, inject); err != nil {
		t.Fatal(err)
	}
	check(sb, "-6 https://six.test/", "six host=six.test sni=six.test via=6 auth=Bearer sk-six")
	check(sb, "--resolve six.test:443:["+otherIP6.String()+"] https://six.test/", "six host=six.test sni=six.test via=6 auth=Bearer sk-six")
	check(sb, "-6 http://six.test/", "six host=six.test sni= via=6")
	if err := e.n.Engine.SetPolicy(ctx, sb.ID, names); err != nil {
		t.Fatal(err)
	}

	// The audit journal has IPv6 decisions of both kinds.
	wants := map[string]func(netaudit.Entry) bool{
		"allowed by address": func(x netaudit.Entry) bool {
			return x.Allowed && x.Dst == "["+sixIP6.String()+"]:80" && x.BytesIn > 0
		},
		"denied by the CIDR rules": func(x netaudit.Entry) bool {
			return !x.Allowed && x.Dst == "["+otherIP6.String()+"]:8080" && x.Rule == "deny"
		},
		"denied by name": func(x netaudit.Entry) bool {
			return !x.Allowed && x.Domain == "other.test" && strings.HasPrefix(x.Dst, "["+otherIP6.String()+"]:")
		},
	}
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		es, _ := e.n.EgressAudit(ctx, sb.ID, time.Time{}, 0)
		for name, ok := range wants {
			if slices.ContainsFunc(es, ok) {
				delete(wants, name)
			}
		}
		if len(wants) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the egress audit lacks %v: %+v", slices.Collect(maps.Keys(wants)), es)
		}
	}

	// A fork: restored into namespaces of its own, with IPv6 and the
	// rules it inherited.
	fr, err := e.n.Engine.Fork(ctx, sb.ID, engine.ForkOptions{Count: 1})
	if err != nil || fr.Children[0].Err != nil {
		t.Fatalf("fork: %v %v", err, fr.Children)
	}
	checkNames(fr.Children[0].Sandbox)
	if err := e.n.Engine.SetPolicy(ctx, fr.Children[0].Sandbox.ID, open); err != nil {
		t.Fatal(err)
	}
	check(fr.Children[0].Sandbox, six, "six host=["+sixIP6.String()+"] sni= via=6")
}
