package egress

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"

	"github.com/spore-run/spore/internal/testenv"
)

func TestInjectionFor(t *testing.T) {
	list := []Injection{{Pattern: "*.example.com"}, {Pattern: "*.api.example.com"}, {Pattern: "api.example.com"}, {Pattern: "*.com"}}
	for name, want := range map[string]string{
		"api.example.com": "api.example.com", "v1.api.example.com": "*.api.example.com", "www.example.com": "*.example.com",
		"other.com": "*.com", "example.com": "*.com", "example.org": "",
	} {
		got := injectionFor(list, name)
		if (got == nil) != (want == "") || got != nil && got.Pattern != want {
			t.Errorf("injectionFor(%q) = %+v, want %q", name, got, want)
		}
	}
}

func TestCA(t *testing.T) {
	ca, err := NewCA("isandbox")
	if err != nil {
		t.Fatal(err)
	}
	if err := ca.Validate(); err != nil {
		t.Fatal(err)
	}
	other, _ := NewCA("iother")
	if err := (&CA{CertPEM: ca.CertPEM, KeyPEM: other.KeyPEM}).Validate(); err == nil {
		t.Fatal("a CA with another's key validated")
	}
	if err := (&CA{CertPEM: []byte("junk"), KeyPEM: ca.KeyPEM}).Validate(); err == nil {
		t.Fatal("junk validated")
	}
	leaf, err := ca.leaf("api.test")
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.CertPEM)
	if _, err := leaf.Leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: "api.test"}); err != nil {
		t.Fatalf("leaf does not verify under its CA: %v", err)
	}
	oroots := x509.NewCertPool()
	oroots.AppendCertsFromPEM(other.CertPEM)
	if _, err := leaf.Leaf.Verify(x509.VerifyOptions{Roots: oroots, DNSName: "api.test"}); err == nil {
		t.Fatal("leaf verifies under another sandbox's CA")
	}
}

// interceptHarness runs intercept on one side of a loopback connection
// and returns the other (the sandbox's), and the outcome once done.
func interceptHarness(t *testing.T, p *Proxy, up netip.AddrPort, in *Injection, ca *CA) (net.Conn, *sandbox, func() (int64, int64, string)) {
	t.Helper()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	client, err := net.Dial("tcp4", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	server, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	sb := &sandbox{instance: "i-test", conns: map[net.Conn]struct{}{}}
	var out, inb int64
	var reason string
	var wg sync.WaitGroup
	wg.Go(func() { out, inb, reason = p.intercept(sb, server.(*net.TCPConn), nil, "api.test", up, in, ca) })
	return client, sb, func() (int64, int64, string) { wg.Wait(); return out, inb, reason }
}

// An intercepted HTTPS connection: the sandbox sees a certificate for the
// name signed by its CA, each request reaches the upstream (verified
// against the proxy's roots) with the injection's headers set (a header
// of the same name from the sandbox replaced), the Host the sandbox sent
// kept, several requests on one connection; the answer comes back
// untouched and the bytes are counted.
func TestIntercept(t *testing.T) {
	cert := testenv.SelfSignedCert(t, "api.test")
	var mu sync.Mutex
	var seen []http.Header
	var hosts []string
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen, hosts = append(seen, r.Header.Clone()), append(hosts, r.Host)
		mu.Unlock()
		fmt.Fprintf(w, "hello %s", r.URL.Path)
	}))
	up.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	up.StartTLS()
	defer up.Close()
	roots := x509.NewCertPool()
	roots.AddCert(mustParse(t, cert.Certificate[0]))
	p := New(Config{RootCAs: roots})
	ca, _ := NewCA("i-test")
	in := &Injection{Pattern: "api.test", Headers: []Header{{"Authorization", "Bearer sk-secret"}, {"X-Team", "ml"}}}
	conn, sb, wait := interceptHarness(t, p, netip.MustParseAddrPort(up.Listener.Addr().String()), in, ca)

	sroots := x509.NewCertPool()
	sroots.AppendCertsFromPEM(ca.CertPEM)
	tc := tls.Client(conn, &tls.Config{ServerName: "api.test", RootCAs: sroots, NextProtos: []string{"h2", "http/1.1"}})
	if err := tc.Handshake(); err != nil {
		t.Fatalf("the sandbox's handshake under its CA: %v", err)
	}
	if st := tc.ConnectionState(); st.NegotiatedProtocol != "http/1.1" || st.PeerCertificates[0].Subject.CommonName != "api.test" {
		t.Fatalf("state: %q %v", st.NegotiatedProtocol, st.PeerCertificates[0].Subject)
	}
	br := bufio.NewReader(tc)
	for i, path := range []string{"/one", "/two"} {
		req, _ := http.NewRequest("GET", "https://api.test"+path, nil)
		req.Host = "api.test:443"
		req.Header.Set("Authorization", "Bearer from-the-sandbox")
		if err := req.Write(tc); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(br, req)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(b) != "hello "+path {
			t.Fatalf("request %d: %d %q", i, resp.StatusCode, b)
		}
	}
	tc.Close()
	out, inb, reason := wait()
	sb.mu.Lock()
	left := len(sb.conns)
	sb.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d upstream connections left in the sandbox's set after the connection ended", left)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 2 {
		t.Fatalf("upstream saw %d requests", len(seen))
	}
	for i, h := range seen {
		if h.Get("Authorization") != "Bearer sk-secret" || len(h.Values("Authorization")) != 1 || h.Get("X-Team") != "ml" || hosts[i] != "api.test:443" {
			t.Fatalf("upstream request %d: %v host %q", i, h, hosts[i])
		}
		if h.Get("X-Forwarded-For") != "" {
			t.Fatalf("the proxy announced itself: %v", h)
		}
	}
	if reason != "" || out == 0 || inb == 0 {
		t.Fatalf("outcome: out %d in %d reason %q", out, inb, reason)
	}
}

// A sandbox that does not trust the certificate gets nothing through
// (reason tls); an upstream whose certificate does not verify gets no
// request, and the sandbox a 502 (reason upstream-tls).
func TestInterceptRefusals(t *testing.T) {
	ca, _ := NewCA("i-test")
	in := &Injection{Pattern: "api.test", Headers: []Header{{"Authorization", "Bearer sk-secret"}}}
	var hits int
	var mu sync.Mutex
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		hits++
		mu.Unlock()
	}))
	up.TLS = &tls.Config{Certificates: []tls.Certificate{testenv.SelfSignedCert(t, "api.test")}}
	up.StartTLS()
	defer up.Close()
	addr := netip.MustParseAddrPort(up.Listener.Addr().String())

	// The proxy's roots do not hold the upstream's certificate.
	conn, _, wait := interceptHarness(t, New(Config{RootCAs: x509.NewCertPool()}), addr, in, ca)
	sroots := x509.NewCertPool()
	sroots.AppendCertsFromPEM(ca.CertPEM)
	tc := tls.Client(conn, &tls.Config{ServerName: "api.test", RootCAs: sroots})
	req, _ := http.NewRequest("GET", "https://api.test/", nil)
	if err := req.Write(tc); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(tc), req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusBadGateway || !strings.Contains(string(b), "not trusted") {
		t.Fatalf("untrusted upstream: %d %s", resp.StatusCode, b)
	}
	tc.Close()
	if _, _, reason := wait(); reason != "upstream-tls" {
		t.Fatalf("reason %q", reason)
	}

	// The sandbox does not trust the proxy's certificate.
	conn, _, wait = interceptHarness(t, New(Config{}), addr, in, ca)
	tc = tls.Client(conn, &tls.Config{ServerName: "api.test", RootCAs: x509.NewCertPool()})
	if err := tc.Handshake(); err == nil {
		t.Fatal("handshake with an untrusted certificate succeeded")
	}
	tc.Close()
	if _, _, reason := wait(); reason != "tls" {
		t.Fatalf("reason %q", reason)
	}
	mu.Lock()
	defer mu.Unlock()
	if hits != 0 {
		t.Fatalf("the upstream got %d requests", hits)
	}
}

func mustParse(t *testing.T, der []byte) *x509.Certificate {
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
