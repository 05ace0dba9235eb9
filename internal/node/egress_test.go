package node_test

import (
	"context"
	"crypto/tls"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/dnsfwd/dnstest"
	"github.com/spore-run/spore/internal/egress"
	"github.com/spore-run/spore/internal/engine"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/netns"
	"github.com/spore-run/spore/internal/node"
	"github.com/spore-run/spore/internal/testenv"
)

// The test internet: web servers on their own addresses in
// 198.18.0.0/15, each answering HTTP on 80 and HTTPS on 443 (a
// self-signed certificate: the sandbox's curl runs with -k) with its
// name, the Host and the SNI it was asked for; a DNS server (on the
// allowed host) the node uses as its upstream.
var (
	allowedIP = netip.MustParseAddr("198.19.41.2")
	deniedIP  = netip.MustParseAddr("198.19.42.2")
	wildIP    = netip.MustParseAddr("198.19.43.2")
)

type webHost struct {
	name string
	hits atomic.Int64
}

func (w *webHost) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	w.hits.Add(1)
	sni := ""
	if r.TLS != nil {
		sni = r.TLS.ServerName
	}
	fmt.Fprintf(rw, "%s host=%s sni=%s", w.name, r.Host, sni)
}

func testInternet(t *testing.T) (hosts map[string]*webHost) {
	cert := testenv.SelfSignedCert(t)
	hosts = map[string]*webHost{}
	for i, ip := range []netip.Addr{allowedIP, deniedIP, wildIP} {
		name := []string{"allowed", "denied", "wild"}[i]
		a := ip.As4()
		h := testenv.NewTestHost(t, "spyt-"+name, ip, netip.AddrFrom4([4]byte{a[0], a[1], a[2], 1}), false)
		w := &webHost{name: name}
		hosts[name] = w
		plain := &http.Server{Handler: w}
		go plain.Serve(h.Listen(t, "tcp4", ip.String()+":80"))
		tl := &http.Server{Handler: w, TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}}}
		go tl.ServeTLS(h.Listen(t, "tcp4", ip.String()+":443"), "", "")
		// Another port: not the proxy's, judged by the CIDR rules.
		other := &http.Server{Handler: w}
		go other.Serve(h.Listen(t, "tcp4", ip.String()+":8080"))
		t.Cleanup(func() { plain.Close(); tl.Close(); other.Close() })
		if name == "allowed" {
			dns := dnstest.Serve(h.ListenPacket(t, "udp4", ip.String()+":53"), h.Listen(t, "tcp4", ip.String()+":53"), map[string]netip.Addr{
				"allowed.test": allowedIP, "denied.test": deniedIP, "wild.test": wildIP, "a.wild.test": wildIP, "b.c.wild.test": wildIP,
			})
			t.Cleanup(dns.Close)
		}
	}
	return hosts
}

// Domain rules, enforced on the TLS SNI (443) and the HTTP Host (80) by
// the egress proxy outside the sandbox: only the allowed names pass under
// "deny everything"; an IP without a name is judged by the CIDR rules; a
// wildcard takes deeper names, not the apex; an allowed SNI sent to
// another address reaches the name's own server; a deny-by-name with the
// rest open; run-time updates; forks inherit; bad rules are refused with
// nothing changed; each decision is in the node's log.
func TestEgressDomainRules(t *testing.T) {
	hosts := testInternet(t)
	e := newEnvTuned(t, func(c *node.Config) {
		c.NetPrefix = "spy"
		c.DNSUpstreams = []netip.AddrPort{netip.AddrPortFrom(allowedIP, 53)}
	})
	ctx := ctxFor(t)
	only := netns.Policy{Internet: true, Deny: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}, AllowDomains: []string{"allowed.test", "*.wild.test"}}
	sb := e.create(ctx, engine.CreateOptions{Template: node.TemplateBase, Policy: &only})
	get := func(sb engine.Sandbox, args string) string {
		r, _ := e.client(sb).run(ctx, `curl -sk -m 3 `+args+` || echo blocked`)
		return strings.TrimSpace(r.stdout)
	}
	check := func(sb engine.Sandbox, args, want string) {
		t.Helper()
		if got := get(sb, args); got != want {
			t.Errorf("curl %s = %q, want %q", args, got, want)
		}
	}
	checkOnly := func(sb engine.Sandbox) {
		t.Helper()
		check(sb, "https://allowed.test/", "allowed host=allowed.test sni=allowed.test")
		check(sb, "http://allowed.test/", "allowed host=allowed.test sni=")
		check(sb, "https://denied.test/", "blocked")
		check(sb, "http://denied.test/", "blocked")
		// The allowed server's address without its name: judged by the
		// address (denied), whatever names it serves.
		check(sb, "https://"+allowedIP.String()+"/", "blocked")
		check(sb, "http://"+allowedIP.String()+"/", "blocked")
		// Other ports: the CIDR rules only.
		check(sb, "http://allowed.test:8080/", "blocked")
		check(sb, "https://a.wild.test/", "wild host=a.wild.test sni=a.wild.test")
		check(sb, "https://b.c.wild.test/", "wild host=b.c.wild.test sni=b.c.wild.test")
		check(sb, "https://wild.test/", "blocked")
	}
	checkOnly(sb)

	// An allowed name sent to the denied server's address: the proxy
	// connects where the name resolves, never to the denied server.
	before := hosts["denied"].hits.Load()
	check(sb, "--resolve allowed.test:443:"+deniedIP.String()+" https://allowed.test/", "allowed host=allowed.test sni=allowed.test")
	check(sb, "-H 'Host: allowed.test' http://"+deniedIP.String()+"/", "allowed host=allowed.test sni=")
	if n := hosts["denied"].hits.Load(); n != before {
		t.Errorf("the denied server got %d requests", n-before)
	}

	// The node's log has both kinds of decision.
	log, err := e.n.EgressLog(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	var allowedSeen, deniedSeen bool
	for _, r := range log {
		allowedSeen = allowedSeen || r.Allowed && r.Domain == "allowed.test" && r.BytesIn > 0 && r.BytesOut > 0 && r.Upstream.Addr() == allowedIP
		deniedSeen = deniedSeen || !r.Allowed && r.Domain == "denied.test" && r.Dst.Addr() == deniedIP
	}
	if !allowedSeen || !deniedSeen {
		t.Errorf("egress log lacks an allowed or a denied entry: %+v", log)
	}

	// A fork inherits the rules.
	fr, err := e.n.Engine.Fork(ctx, sb.ID, engine.ForkOptions{Count: 1})
	if err != nil || fr.Children[0].Err != nil {
		t.Fatalf("fork: %v %v", err, fr.Children)
	}
	checkOnly(fr.Children[0].Sandbox)

	// Bad rules: refused, nothing changed.
	huge := make([]string, netns.MaxPolicyEntries+1)
	for i := range huge {
		huge[i] = fmt.Sprintf("h%d.test", i)
	}
	for _, bad := range []netns.Policy{
		{Internet: true, AllowDomains: []string{"bad..test"}},
		{Internet: true, DenyDomains: []string{"*"}},
		{Internet: true, AllowDomains: []string{"UPPER.test"}}, // not normalized
		{Internet: true, AllowDomains: huge},
	} {
		if err := e.n.Engine.SetPolicy(ctx, sb.ID, bad); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("SetPolicy(%.80v) = %v, want ErrInvalidArgument", bad, err)
		}
	}
	if got, _ := e.n.Engine.Get(ctx, sb.ID); !slices.Equal(got.Policy.AllowDomains, only.AllowDomains) {
		t.Errorf("policy after refused updates: %+v", got.Policy)
	}
	check(sb, "https://denied.test/", "blocked")
	check(sb, "https://allowed.test/", "allowed host=allowed.test sni=allowed.test")

	// Deny a name, everything else open (at run time: the decision on
	// the denied server's address flips).
	if err := e.n.Engine.SetPolicy(ctx, sb.ID, netns.Policy{Internet: true, DenyDomains: []string{"denied.test"}}); err != nil {
		t.Fatal(err)
	}
	check(sb, "https://denied.test/", "blocked")
	check(sb, "http://denied.test/", "blocked")
	check(sb, "https://allowed.test/", "allowed host=allowed.test sni=allowed.test")
	check(sb, "https://wild.test/", "wild host=wild.test sni=wild.test")
	check(sb, "https://"+deniedIP.String()+"/", "denied host="+deniedIP.String()+" sni=")
	// No domain rules: the proxy is out of the way, everything passes.
	if err := e.n.Engine.SetPolicy(ctx, sb.ID, netns.Policy{Internet: true}); err != nil {
		t.Fatal(err)
	}
	check(sb, "https://denied.test/", "denied host=denied.test sni=denied.test")

	// Internet off with an allowed name: names resolve (the sandbox must
	// look the name up) and only that name is reached.
	if err := e.n.Engine.SetPolicy(ctx, sb.ID, netns.Policy{Internet: false, AllowDomains: []string{"allowed.test"}}); err != nil {
		t.Fatal(err)
	}
	check(sb, "https://allowed.test/", "allowed host=allowed.test sni=allowed.test")
	check(sb, "https://a.wild.test/", "blocked")

	// The node stopped: redirected connections fail closed; restarted,
	// it serves the running sandbox's gateway again.
	if err := e.n.Engine.SetPolicy(ctx, sb.ID, only); err != nil {
		t.Fatal(err)
	}
	e.n.Close()
	if got := get(sb, "https://allowed.test/"); got != "blocked" {
		t.Errorf("with the node down: %q, want blocked", got)
	}
	e.open()
	checkOnly(sb)
}

// BenchmarkEgressProxyHTTPS: the added latency of the egress proxy per
// HTTPS request (a new connection each: curl in the sandbox), through the
// proxy (allowOut a name under denyOut 0.0.0.0/0) and direct (no domain
// rule).
//
//	go test -run '^$' -bench EgressProxy -benchtime 50x ./internal/node/
func BenchmarkEgressProxyHTTPS(b *testing.B) {
	var withAuth atomic.Int64
	e, sb, c, ctx := egressBench(b, "spyt-bench", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") == "Bearer sk-bench" {
			withAuth.Add(1)
		}
		fmt.Fprint(w, "ok")
	}))
	run := func(p netns.Policy) []time.Duration {
		if err := e.n.Engine.SetPolicy(ctx, sb.ID, p); err != nil {
			b.Fatal(err)
		}
		out := c.sh(ctx, fmt.Sprintf(`curl -sk -o /dev/null https://allowed.test/; for i in $(seq %d); do curl -sk -o /dev/null -w '%%{time_total}\n' https://allowed.test/; done`, b.N))
		var ds []time.Duration
		for _, f := range strings.Fields(out) {
			var s float64
			fmt.Sscan(f, &s)
			ds = append(ds, time.Duration(s*float64(time.Second)))
		}
		if len(ds) != b.N {
			b.Fatalf("curl output: %q", out)
		}
		return ds
	}
	direct := run(netns.Policy{Internet: true})
	proxied := run(netns.Policy{Internet: true, Deny: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}, AllowDomains: []string{"allowed.test"}})
	injected := run(injectPolicy(b))
	if n := withAuth.Load(); n < int64(b.N) {
		b.Fatalf("%d requests carried the injected header, want %d", n, b.N)
	}
	quantiles(b, direct, "direct")
	quantiles(b, proxied, "proxied")
	quantiles(b, injected, "injected")
}

// injectPolicy has a network rule for allowed.test: the proxy terminates
// the sandbox's TLS and sets a header on each request.
func injectPolicy(b *testing.B) netns.Policy {
	ca, err := egress.NewCA("bench")
	if err != nil {
		b.Fatal(err)
	}
	return netns.Policy{Internet: true, CA: ca,
		Inject: []egress.Injection{{Pattern: "allowed.test", Headers: []egress.Header{{Name: "Authorization", Value: "Bearer sk-bench"}}}}}
}

// A 100 MB HTTPS download through the egress proxy (a domain rule in
// force) beside the same with CIDR rules only (no proxy): MB/s at p50
// over b.N downloads each, by curl in the sandbox.
func BenchmarkEgressProxyThroughput(b *testing.B) {
	const size = 100 << 20
	chunk := make([]byte, 1<<20)
	e, sb, c, ctx := egressBench(b, "spyt-thru", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Length", fmt.Sprint(size))
		for range size / len(chunk) {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	}))
	run := func(p netns.Policy) float64 {
		if err := e.n.Engine.SetPolicy(ctx, sb.ID, p); err != nil {
			b.Fatal(err)
		}
		out := c.sh(ctx, fmt.Sprintf(`for i in $(seq %d); do curl -sk -o /dev/null -w '%%{size_download} %%{speed_download}\n' https://allowed.test/; done`, b.N))
		var speeds []float64
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			var n, bps float64
			if _, err := fmt.Sscan(line, &n, &bps); err != nil || n != size {
				b.Fatalf("curl: %q (want %d bytes)", line, size)
			}
			speeds = append(speeds, bps/(1<<20))
		}
		slices.Sort(speeds)
		return speeds[len(speeds)/2]
	}
	direct := run(netns.Policy{Internet: true})
	proxied := run(netns.Policy{Internet: true, Deny: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}, AllowDomains: []string{"allowed.test"}})
	injected := run(injectPolicy(b))
	b.ReportMetric(direct, "MB/s-direct")
	b.ReportMetric(proxied, "MB/s-proxied")
	b.ReportMetric(injected, "MB/s-injected")
}

// egressBench serves h over HTTPS as allowed.test on a test host named
// name (with a DNS server the node uses) and returns a node and a
// sandbox on it, for the egress proxy's benchmarks.
func egressBench(b *testing.B, name string, h http.Handler) (*env, engine.Sandbox, *client, context.Context) {
	th := testenv.NewTestHost(b, name, allowedIP, netip.MustParseAddr("198.19.41.1"), false)
	cert := testenv.SelfSignedCert(b)
	caFile := filepath.Join(b.TempDir(), "upstream.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Certificate[0]}), 0o644); err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{Handler: h, TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}}}
	go srv.ServeTLS(th.Listen(b, "tcp4", allowedIP.String()+":443"), "", "")
	dns := dnstest.Serve(th.ListenPacket(b, "udp4", allowedIP.String()+":53"), nil, map[string]netip.Addr{"allowed.test": allowedIP})
	b.Cleanup(func() { srv.Close(); dns.Close() })
	e := newEnvTuned(b, func(c *node.Config) {
		c.NetPrefix = "spy"
		c.DNSUpstreams = []netip.AddrPort{netip.AddrPortFrom(allowedIP, 53)}
		c.EgressCAFiles = []string{caFile} // the proxy verifies it when it injects headers
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	b.Cleanup(cancel)
	sb := e.create(ctx, engine.CreateOptions{Template: node.TemplateBase})
	return e, sb, e.client(sb), ctx
}
