package egress

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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
// (for api.test, as if to port 443) and returns the other (the
// sandbox's), and the outcome once done.
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
	sb := &sandbox{instance: "i-test", conns: map[net.Conn]bool{}}
	var out, inb int64
	var reason string
	var wg sync.WaitGroup
	wg.Go(func() { out, inb, reason = p.intercept(sb, server.(*net.TCPConn), nil, "api.test", 443, up, in, ca) })
	return client, sb, func() (int64, int64, string) { wg.Wait(); return out, inb, reason }
}

// An intercepted HTTPS connection: the sandbox sees a certificate for the
// name signed by its CA, each request reaches the upstream (verified
// against the proxy's roots) with the injection's headers set (a header
// of the same name from the sandbox replaced) and Host set to the TLS
// server name (the sandbox's "api.test:443" is the same authority),
// several requests on one connection; the answer comes back untouched
// and the bytes are counted.
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
		if h.Get("Authorization") != "Bearer sk-secret" || len(h.Values("Authorization")) != 1 || h.Get("X-Team") != "ml" || hosts[i] != "api.test" {
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

// A request on an intercepted connection must name the connection's TLS
// server name, which chose the credentials: Host (port absent or the
// connection's, any case, one trailing dot) and an absolute-form target
// alike. One that names another site (a shared CDN or load balancer
// would serve that site with the credentials) gets a 421 naming both
// names, reaches no upstream and ends the connection (reason
// host-mismatch); one that matches is forwarded with Host set to the
// name. HTTP/2 cannot arrive: its preface without ALPN is refused.
func TestInterceptMisdirected(t *testing.T) {
	ca, _ := NewCA("i-test")
	in := &Injection{Pattern: "api.test", Headers: []Header{{"Authorization", "Bearer sk-secret"}}}
	cert := testenv.SelfSignedCert(t, "api.test")
	var mu sync.Mutex
	var hosts []string
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		hosts = append(hosts, r.Host+" "+r.Header.Get("Authorization"))
		mu.Unlock()
		fmt.Fprint(w, "served")
	}))
	up.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	up.StartTLS()
	defer up.Close()
	roots := x509.NewCertPool()
	roots.AddCert(mustParse(t, cert.Certificate[0]))
	p := New(Config{RootCAs: roots})
	addr := netip.MustParseAddrPort(up.Listener.Addr().String())
	sroots := x509.NewCertPool()
	sroots.AppendCertsFromPEM(ca.CertPEM)

	get := func(host string) string { return "GET /p HTTP/1.1\r\nHost: " + host + "\r\n\r\n" }
	const served = "api.test Bearer sk-secret"
	cases := []struct {
		name     string
		reqs     []string // written one after another on one connection
		status   []int
		upstream []string // Host and credentials of what the upstream got
		reason   string
		refused  string // the host a 421 names beside api.test
	}{
		{"Host with the connection's port", []string{get("api.test:443")}, []int{200}, []string{served}, "", ""},
		{"Host in upper case with a trailing dot", []string{get("API.Test.")}, []int{200}, []string{served}, "", ""},
		{"Host with an empty port", []string{get("api.test:")}, []int{200}, []string{served}, "", ""},
		{"HTTP/1.0 without Host", []string{"GET /p HTTP/1.0\r\n\r\n"}, []int{200}, []string{served}, "", ""},
		{"absolute-form target of the name", []string{"GET https://api.test/p HTTP/1.1\r\nHost: api.test\r\n\r\n"}, []int{200}, []string{served}, "", ""},
		{"another Host", []string{get("attacker.test")}, []int{421}, nil, "host-mismatch", "attacker.test"},
		{"a Host ending in the name", []string{get("evil-api.test")}, []int{421}, nil, "host-mismatch", "evil-api.test"},
		{"two trailing dots", []string{get("api.test..")}, []int{421}, nil, "host-mismatch", "api.test.."},
		{"another port", []string{get("api.test:8443")}, []int{421}, nil, "host-mismatch", "api.test:8443"},
		{"absolute-form target of another host", []string{"GET https://attacker.test/p HTTP/1.1\r\nHost: api.test\r\n\r\n"}, []int{421}, nil, "host-mismatch", "attacker.test"},
		{"absolute-form target with a long s (Unicode folds it to s)", []string{"GET https://api.te%C5%BFt/p HTTP/1.1\r\nHost: api.test\r\n\r\n"}, []int{421}, nil, "host-mismatch", "api.te\u017ft"},
		{"keep-alive switching Host", []string{get("api.test"), get("attacker.test")}, []int{200, 421}, []string{served}, "host-mismatch", "attacker.test"},
		{"HTTP/2 preface", []string{"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"}, []int{505}, nil, "", ""},
	}
	for _, c := range cases {
		mu.Lock()
		hosts = nil
		mu.Unlock()
		conn, _, wait := interceptHarness(t, p, addr, in, ca)
		tc := tls.Client(conn, &tls.Config{ServerName: "api.test", RootCAs: sroots})
		br := bufio.NewReader(tc)
		for i, raw := range c.reqs {
			if _, err := io.WriteString(tc, raw); err != nil {
				t.Fatalf("%s: request %d: %v", c.name, i, err)
			}
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("%s: request %d: %v", c.name, i, err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != c.status[i] {
				t.Errorf("%s: request %d: %d %q, want %d", c.name, i, resp.StatusCode, b, c.status[i])
			}
			if strings.Contains(string(b), "sk-secret") || strings.Contains(fmt.Sprint(resp.Header), "sk-secret") {
				t.Errorf("%s: request %d: the credentials came back to the sandbox: %v %q", c.name, i, resp.Header, b)
			}
			if resp.StatusCode == http.StatusMisdirectedRequest && !(strings.Contains(string(b), `"api.test"`) && strings.Contains(string(b), fmt.Sprintf("%q", c.refused))) {
				t.Errorf("%s: the refusal does not name %q and api.test: %q", c.name, c.refused, b)
			}
		}
		tc.Close()
		_, _, reason := wait()
		if reason != c.reason {
			t.Errorf("%s: reason %q, want %q", c.name, reason, c.reason)
		}
		mu.Lock()
		if fmt.Sprint(hosts) != fmt.Sprint(c.upstream) {
			t.Errorf("%s: the upstream got %q, want %q", c.name, hosts, c.upstream)
		}
		mu.Unlock()
	}
}

// The upstream connections of an intercepted one count against the
// sandbox's cap: past it a request gets a 503 and reaches no upstream
// (reason limit).
func TestInterceptUpstreamLimit(t *testing.T) {
	ca, _ := NewCA("i-test")
	in := &Injection{Pattern: "api.test", Headers: []Header{{"Authorization", "Bearer sk-secret"}}}
	var hits atomic.Int64
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1) }))
	up.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused connection's handshake
	cert := testenv.SelfSignedCert(t, "api.test")
	up.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	up.StartTLS()
	defer up.Close()
	roots := x509.NewCertPool()
	roots.AddCert(mustParse(t, cert.Certificate[0]))
	p := New(Config{RootCAs: roots, MaxConnsPerSandbox: 1})
	conn, sb, wait := interceptHarness(t, p, netip.MustParseAddrPort(up.Listener.Addr().String()), in, ca)
	other, _ := net.Pipe()
	defer other.Close()
	if err := sb.track(other, true, 1); err != nil { // another connection's upstream holds the one place
		t.Fatal(err)
	}
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
	resp.Body.Close()
	tc.Close()
	if _, _, reason := wait(); resp.StatusCode != http.StatusServiceUnavailable || reason != "limit" || hits.Load() != 0 {
		t.Fatalf("over the cap: %d, reason %q, %d upstream requests", resp.StatusCode, reason, hits.Load())
	}
}

// An intercepted connection that moves no byte for the idle timeout is
// closed (reason idle).
func TestInterceptIdle(t *testing.T) {
	ca, _ := NewCA("i-test")
	in := &Injection{Pattern: "api.test", Headers: []Header{{"Authorization", "Bearer sk-secret"}}}
	p := New(Config{IdleTimeout: 200 * time.Millisecond})
	conn, _, wait := interceptHarness(t, p, netip.MustParseAddrPort("127.0.0.1:9"), in, ca)
	sroots := x509.NewCertPool()
	sroots.AppendCertsFromPEM(ca.CertPEM)
	tc := tls.Client(conn, &tls.Config{ServerName: "api.test", RootCAs: sroots})
	if err := tc.Handshake(); err != nil {
		t.Fatal(err)
	}
	tc.SetReadDeadline(time.Now().Add(20 * time.Second))
	if _, err := tc.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("an idle intercepted connection: %v", err)
	}
	if _, _, reason := wait(); reason != "idle" {
		t.Fatalf("reason %q", reason)
	}
}
