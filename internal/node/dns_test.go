package node_test

import (
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/dnsfwd/dnstest"
	"github.com/spore-run/spore/internal/engine"
	"github.com/spore-run/spore/internal/netns"
	"github.com/spore-run/spore/internal/node"
	"github.com/spore-run/spore/internal/testenv"
)

// ownPrefix keeps these tests' networks apart from other node tests that
// may run at the same time in another process (a node sweeps every
// namespace of its prefix that it has no record of).
const ownPrefix = "spq"

var (
	privHost = netip.MustParseAddr("192.168.250.2")
	metaHost = netip.MustParseAddr("169.254.169.254")
	nameAddr = netip.MustParseAddr("198.18.0.9") // what myname.test resolves to
)

// A test host on a private address (the host's LAN, as it were) serving
// a page and DNS; the node uses it as its upstream resolver.
func privateHost(t *testing.T) (page string, dns *dnstest.Server) {
	h := testenv.NewTestHost(t, "spx-priv", privHost, netip.MustParseAddr("192.168.250.1"), false)
	page = h.ServeText(t, 18780, "private")
	dns = dnstest.Serve(h.ListenPacket(t, "udp4", privHost.String()+":53"), h.Listen(t, "tcp4", privHost.String()+":53"),
		map[string]netip.Addr{"myname.test": nameAddr})
	t.Cleanup(dns.Close)
	return page, dns
}

// Names resolve inside sandboxes: localhost and the sandbox's own name
// from its /etc/hosts, others through the node's forwarder (and only for
// sandboxes with internet access); forks keep it; a web server started
// the way a new user would answers at once (it looks its address up
// first: 10.5 s without a resolver it can reach).
func TestSandboxNameResolution(t *testing.T) {
	_, dns := privateHost(t)
	e := newEnvTuned(t, func(c *node.Config) {
		c.NetPrefix = ownPrefix
		c.DNSUpstreams = []netip.AddrPort{netip.AddrPortFrom(privHost, 53)}
	})
	ctx := ctxFor(t)
	open := e.create(ctx, engine.CreateOptions{Template: node.TemplateBase})
	c := e.client(open)

	if got := c.sh(ctx, `getent hosts localhost`); !strings.Contains(got, "localhost") {
		t.Fatalf("getent hosts localhost: %q", got)
	}
	if got := strings.TrimSpace(c.sh(ctx, `python3 -c "import socket; print(socket.gethostbyname('localhost'))"`)); got != "127.0.0.1" {
		t.Fatalf("gethostbyname(localhost) = %q", got)
	}
	if got := c.sh(ctx, `getent hosts "$(hostname)"`); !strings.HasPrefix(got, netns.SandboxIP.String()) {
		t.Fatalf("the sandbox's own name: %q", got)
	}
	if got := c.sh(ctx, `getent hosts myname.test`); !strings.HasPrefix(got, nameAddr.String()) {
		t.Fatalf("getent hosts myname.test: %q", got)
	}

	// The web server, started as the README's first steps would.
	c.sh(ctx, `cd /tmp && (nohup python3 -m http.server 8000 >/tmp/http.log 2>&1 &)`)
	hc := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(5 * time.Second) // readiness: ~0.2 s measured, 10.5 s before the fix
	for {
		resp, err := hc.Get(c.url(8000) + "/")
		if err == nil {
			resp.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("python3 -m http.server not answering: %v; log: %s", err, c.sh(ctx, `cat /tmp/http.log`))
		}
		time.Sleep(50 * time.Millisecond)
	}

	// A fork resolves names too (same addresses, its own gateway).
	fr, err := e.n.Engine.Fork(ctx, open.ID, engine.ForkOptions{Count: 1})
	if err != nil || fr.Children[0].Err != nil {
		t.Fatalf("fork: %v %v", err, fr.Children)
	}
	if got := e.client(fr.Children[0].Sandbox).sh(ctx, `getent hosts myname.test`); !strings.HasPrefix(got, nameAddr.String()) {
		t.Fatalf("fork: getent hosts myname.test: %q", got)
	}

	// Internet off: no name service (a lookup is a way out), and it fails
	// at once; localhost still resolves.
	closed := e.create(ctx, engine.CreateOptions{Template: node.TemplateBase, Policy: &netns.Policy{Internet: false}})
	cc := e.client(closed)
	before := dns.Queries()
	r, err := cc.run(ctx, `getent hosts myname.test`)
	if err != nil || r.exit == 0 {
		t.Fatalf("internet off resolved a name: %+v %v", r, err)
	}
	if dns.Queries() != before {
		t.Fatal("a query of a sandbox without internet reached the upstream")
	}
	if got := cc.sh(ctx, `getent hosts localhost`); !strings.Contains(got, "localhost") {
		t.Fatalf("internet off: getent hosts localhost: %q", got)
	}
	// Turned on at run time, names resolve.
	if err := e.n.Engine.SetPolicy(ctx, closed.ID, netns.Policy{Internet: true}); err != nil {
		t.Fatal(err)
	}
	if got := cc.sh(ctx, `getent hosts myname.test`); !strings.HasPrefix(got, nameAddr.String()) {
		t.Fatalf("after internet on: %q", got)
	}
}

// The operator floor holds in real sandboxes: a test host on a private
// address and one on the metadata address stay out of reach whatever the
// allow list (with the old order, allowOut opened both).
func TestEgressFloorInSandbox(t *testing.T) {
	page, _ := privateHost(t)
	meta := testenv.NewTestHost(t, "spx-meta", metaHost, netip.MustParseAddr("169.254.169.253"), true).ServeText(t, 18781, "metadata")
	e := newEnvTuned(t, func(c *node.Config) { c.NetPrefix = ownPrefix })
	ctx := ctxFor(t)
	// The private test host is up (the node itself reaches it).
	if resp, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + page + "/"); err != nil {
		t.Fatalf("test host: %v", err)
	} else {
		resp.Body.Close()
	}
	sb := e.create(ctx, engine.CreateOptions{Template: node.TemplateBase})
	c := e.client(sb)
	get := func(target string) string {
		r, err := c.run(ctx, `curl -s -m 2 http://`+target+`/ || echo blocked`)
		if err != nil {
			t.Fatalf("run curl: %v", err)
		}
		return strings.TrimSpace(r.stdout)
	}
	check := func(what string, targets ...string) {
		t.Helper()
		for _, target := range targets {
			if got := get(target); got != "blocked" {
				t.Errorf("%s: sandbox reached %s: %q", what, target, got)
			}
		}
	}
	check("default policy", page)
	for _, p := range []netns.Policy{
		{Internet: true, Allow: []netip.Prefix{netip.PrefixFrom(privHost, 32)}},
		{Internet: true, Allow: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}},
	} {
		if err := e.n.Engine.SetPolicy(ctx, sb.ID, p); err != nil {
			t.Fatal(err)
		}
		check("allow "+p.Allow[0].String(), page, meta)
	}
	if err := e.n.Engine.SetPolicy(ctx, sb.ID, netns.Policy{Internet: false, Allow: []netip.Prefix{netip.PrefixFrom(metaHost, 32)}}); err != nil {
		t.Fatal(err)
	}
	check("allow the metadata address", meta)
}
