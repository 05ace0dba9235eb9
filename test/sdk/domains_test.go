package sdk

import (
	"crypto/tls"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/dnsfwd/dnstest"
	"github.com/spore-run/spore/internal/testenv"
)

// Domain rules through the stock SDK, unchanged (domains.mjs): E2B's
// allowOut/denyOut take names and wildcards at create and in
// updateNetwork; under "deny everything" only the named hosts answer, on
// HTTP (the Host) and HTTPS (the SNI); a name's server cannot be reached
// by its address, nor another server by sending an allowed name to it;
// a bad name is a 400 that changes nothing. The test internet: two web
// servers in 198.19.0.0/16 (HTTP 80, HTTPS 443, each answering its own
// name) and a DNS server the Spore server uses as its upstream.
func TestDomainRulesThroughTheSDK(t *testing.T) {
	allowed, other := netip.MustParseAddr("198.19.61.2"), netip.MustParseAddr("198.19.62.2")
	cert := testenv.SelfSignedCert(t, "*.test", "*.wild.test")
	for _, h := range []struct {
		name string
		ip   netip.Addr
	}{{"allowed", allowed}, {"other", other}} {
		a := h.ip.As4()
		th := testenv.NewTestHost(t, "spsdk-"+h.name, h.ip, netip.AddrFrom4([4]byte{a[0], a[1], a[2], 1}), false)
		name := h.name
		hd := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, name) })
		plain := &http.Server{Handler: hd, ReadHeaderTimeout: 10 * time.Second}
		go plain.Serve(th.Listen(t, "tcp4", h.ip.String()+":80"))
		tl := &http.Server{Handler: hd, ReadHeaderTimeout: 10 * time.Second, TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}}}
		go tl.ServeTLS(th.Listen(t, "tcp4", h.ip.String()+":443"), "", "")
		t.Cleanup(func() { plain.Close(); tl.Close() })
		if name == "allowed" {
			dns := dnstest.Serve(th.ListenPacket(t, "udp4", h.ip.String()+":53"), th.Listen(t, "tcp4", h.ip.String()+":53"), map[string]netip.Addr{
				"allowed.test": allowed, "other.test": other, "a.wild.test": other,
			})
			t.Cleanup(dns.Close)
		}
	}
	s := newServer(t, "--dns-upstream", allowed.String()+":53")
	out := s.node("domains.mjs", "OTHER_IP="+other.String())
	t.Log(out)
	if !strings.Contains(out, "4 passed, 0 failed") {
		t.Fatal("domain rules through the SDK did not pass")
	}
}
