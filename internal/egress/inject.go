package egress

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/spore-run/spore/internal/errdefs"
)

// Injection adds or replaces headers on a sandbox's HTTPS requests to the
// names Pattern matches (E2B's network rules with a transform). The
// values are resolved (secrets included): they live in the node's memory
// only, never in a file and never in the sandbox.
type Injection struct {
	Pattern string // ParseDomain form: "api.example.com" or "*.example.com"
	Headers []Header
}

// Header is one header an injection sets.
type Header struct{ Name, Value string }

// injectionFor picks the injection for a name as E2B does: an exact
// pattern first, else the longest matching wildcard; rule sets are not
// merged.
func injectionFor(list []Injection, name string) *Injection {
	var best *Injection
	for i := range list {
		in := &list[i]
		if !Match(in.Pattern, name) {
			continue
		}
		if in.Pattern == name {
			return in
		}
		if best == nil || len(in.Pattern) > len(best.Pattern) {
			best = in
		}
	}
	return best
}

// CA is a sandbox's egress certificate authority: the proxy signs the
// certificates it shows the sandbox for the HTTPS connections it opens
// to inject headers with it, and only that sandbox trusts it (its trust
// store gets CertPEM at create; the key never enters it).
type CA struct {
	CertPEM []byte
	KeyPEM  []byte

	once sync.Once
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	err  error
}

// NewCA mints a CA for a sandbox (ECDSA P-256, valid for 10 years, able
// to sign server certificates only); sandboxID, when known, names it.
func NewCA(sandboxID string) (*CA, error) {
	cn := "Spore egress CA"
	if sandboxID != "" {
		cn += " for sandbox " + sandboxID
	}
	key, serial, err := newKey()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{Organization: []string{"Spore"}, CommonName: cn},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.AddDate(10, 0, 0),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	return &CA{CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM: pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})}, nil
}

// newKey is a certificate's key (ECDSA P-256) and a random serial.
func newKey() (*ecdsa.PrivateKey, *big.Int, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
	return key, serial, err
}

// Equal says whether two CAs are the same certificate.
func (ca *CA) Equal(o *CA) bool {
	if ca == nil || o == nil {
		return ca == o
	}
	return bytes.Equal(ca.CertPEM, o.CertPEM)
}

func (ca *CA) parse() error {
	ca.once.Do(func() {
		cb, _ := pem.Decode(ca.CertPEM)
		kb, _ := pem.Decode(ca.KeyPEM)
		if cb == nil || kb == nil {
			ca.err = errors.New("egress CA: malformed PEM")
			return
		}
		if ca.cert, ca.err = x509.ParseCertificate(cb.Bytes); ca.err != nil {
			return
		}
		ca.key, ca.err = x509.ParseECPrivateKey(kb.Bytes)
	})
	return ca.err
}

// Validate checks that CertPEM and KeyPEM are a CA certificate and its
// key.
func (ca *CA) Validate() error {
	if err := ca.parse(); err != nil {
		return fmt.Errorf("egress CA: %w", err)
	}
	if !ca.cert.IsCA {
		return errors.New("egress CA: the certificate is not a CA")
	}
	pub, ok := ca.cert.PublicKey.(*ecdsa.PublicKey)
	if !ok || !pub.Equal(&ca.key.PublicKey) {
		return errors.New("egress CA: the key is not the certificate's")
	}
	return nil
}

// leaf signs a server certificate for name, valid for a week.
func (ca *CA) leaf(name string) (*tls.Certificate, error) {
	if err := ca.parse(); err != nil {
		return nil, err
	}
	key, serial, err := newKey()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: name},
		DNSNames:     []string{name},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(7 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, err
	}
	leaf, _ := x509.ParseCertificate(der)
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}

// leaves caches a sandbox's signed certificates by name.
type leaves struct {
	mu    sync.Mutex
	ca    *CA
	certs map[string]*tls.Certificate
}

func (l *leaves) get(ca *CA, name string) (*tls.Certificate, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.ca.Equal(ca) {
		l.ca, l.certs = ca, map[string]*tls.Certificate{}
	}
	if c := l.certs[name]; c != nil && time.Until(c.Leaf.NotAfter) > 24*time.Hour {
		return c, nil
	}
	c, err := ca.leaf(name)
	if err != nil {
		return nil, err
	}
	if len(l.certs) > 1024 {
		clear(l.certs)
	}
	l.certs[name] = c
	return c, nil
}

// countConn is the sandbox's side of an intercepted connection: the
// peeked bytes first, then the socket, with the bytes counted each way.
type countConn struct {
	net.Conn
	r        io.Reader
	in, out  *atomic.Int64 // read from the sandbox, written to it
	closed   chan struct{}
	closeOne sync.Once
}

func (c *countConn) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	c.in.Add(int64(n))
	return n, err
}

func (c *countConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.out.Add(int64(n))
	return n, err
}

func (c *countConn) Close() error {
	c.closeOne.Do(func() { close(c.closed) })
	return c.Conn.Close()
}

// trackedConn is an upstream connection of an intercepted one: the
// sandbox's stop closes it, and it leaves the sandbox's set when closed.
type trackedConn struct {
	net.Conn
	once    sync.Once
	untrack func()
}

func (t *trackedConn) Close() error {
	t.once.Do(t.untrack)
	return t.Conn.Close()
}

// oneConn is a listener that hands out one connection, then waits for it
// to close.
type oneConn struct {
	c    net.Conn
	once sync.Once
	done chan struct{}
}

func (l *oneConn) Accept() (net.Conn, error) {
	var c net.Conn
	l.once.Do(func() { c = l.c })
	if c != nil {
		return c, nil
	}
	<-l.done
	return nil, net.ErrClosed
}

func (l *oneConn) Close() error   { return nil }
func (l *oneConn) Addr() net.Addr { return l.c.LocalAddr() }

// intercept serves an allowed HTTPS connection to port whose name has an
// injection: TLS with the sandbox (a certificate for name signed by its
// CA; HTTP/1.1), each request for name (misdirected ones refused:
// checkAuthority) passed to name's server at up over TLS that verifies
// name against the proxy's roots, with the injection's headers set and
// Host set to name. It returns the bytes read from and written to the
// sandbox, and why it failed when it did ("tls" when the sandbox refused
// the certificate or spoke no TLS, "host-mismatch", "upstream-tls",
// "limit", "idle").
func (p *Proxy) intercept(sb *sandbox, c *net.TCPConn, head []byte, name string, port uint16, up netip.AddrPort, in *Injection, ca *CA) (bytesOut, bytesIn int64, reason string) {
	var rd, wr atomic.Int64
	cc := &countConn{Conn: c, r: io.MultiReader(bytes.NewReader(head), c), in: &rd, out: &wr, closed: make(chan struct{})}
	defer cc.Close()
	idle := watchIdle(p.cfg.IdleTimeout, func() int64 { return rd.Load() + wr.Load() }, func() { cc.Close() })
	defer idle.stop()
	cert, err := sb.leaves.get(ca, name)
	if err != nil {
		p.cfg.Logger.Warn("egress proxy: sign a certificate", "instance", sb.instance, "name", name, "err", err)
		return rd.Load(), wr.Load(), "tls"
	}
	tc := tls.Server(cc, &tls.Config{Certificates: []tls.Certificate{*cert}, NextProtos: []string{"http/1.1"}, MinVersion: tls.VersionTLS12})
	hctx, cancel := context.WithTimeout(context.Background(), p.cfg.PeekTimeout)
	err = tc.HandshakeContext(hctx)
	cancel()
	if err != nil {
		return rd.Load(), wr.Load(), "tls"
	}
	tr := p.upstreamTransport(sb, name, up)
	defer tr.CloseIdleConnections()
	var failed outcome
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host = "https", name
			pr.Out.Host = authority(name, port)
			for _, h := range in.Headers {
				pr.Out.Header.Set(h.Name, h.Value)
			}
		},
		Transport:     tr,
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			msg, code := "upstream unreachable", http.StatusBadGateway
			var ce *tls.CertificateVerificationError
			switch {
			case errors.As(err, &ce):
				msg = "upstream certificate not trusted"
				failed.set("upstream-tls", false)
			case errors.Is(err, errLimit):
				msg, code = "too many connections from this sandbox", http.StatusServiceUnavailable
				failed.set("limit", false)
			}
			p.cfg.Logger.Warn("egress proxy: upstream", "instance", sb.instance, "name", name, "upstream", up, "err", err)
			http.Error(w, "spore egress proxy: "+msg+" ("+name+")", code)
		},
		ErrorLog: log.New(io.Discard, "", 0),
	}
	l := &oneConn{c: tc, done: cc.closed}
	srv := &http.Server{Handler: checkAuthority(name, port, rp, &failed), ReadHeaderTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute,
		ErrorLog: log.New(io.Discard, "", 0),
		ConnState: func(_ net.Conn, st http.ConnState) {
			if st == http.StateClosed {
				cc.Close()
			}
		}}
	srv.Serve(l)
	reason = failed.get()
	if idle.stop() && reason == "" {
		reason = "idle"
	}
	return rd.Load(), wr.Load(), reason
}

// upstreamTransport reaches name's server at up for an intercepted
// connection: TLS verifying name against the proxy's roots, each
// connection in the sandbox's set before its handshake (stop closes it;
// at most Config.MaxConnsPerSandbox of them, errLimit past it).
func (p *Proxy) upstreamTransport(sb *sandbox, name string, up netip.AddrPort) *http.Transport {
	return &http.Transport{
		DialTLSContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			d := net.Dialer{Timeout: 10 * time.Second}
			u, err := d.DialContext(ctx, "tcp", up.String())
			if err != nil {
				return nil, err
			}
			if err := sb.track(u, true, p.cfg.MaxConnsPerSandbox); err != nil {
				u.Close()
				return nil, err
			}
			tc := tls.Client(u, &tls.Config{ServerName: name, RootCAs: p.cfg.RootCAs, NextProtos: []string{"http/1.1"}, MinVersion: tls.VersionTLS12})
			if err := tc.HandshakeContext(ctx); err != nil {
				u.Close()
				sb.untrack(u)
				return nil, err
			}
			return &trackedConn{Conn: tc, untrack: func() { sb.untrack(u) }}, nil
		},
		MaxIdleConnsPerHost:   4,
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: 5 * time.Minute,
	}
}

// outcome is why an intercepted connection failed: a misdirected
// request's refusal outranks an upstream's failure, else the first one
// stays.
type outcome struct {
	mu     sync.Mutex
	reason string
}

func (o *outcome) set(reason string, overrides bool) {
	o.mu.Lock()
	if o.reason == "" || overrides {
		o.reason = reason
	}
	o.mu.Unlock()
}

func (o *outcome) get() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.reason
}

// checkAuthority passes to next only the requests an intercepted
// connection for name (to port) may carry: HTTP/1.x (the proxy offers
// nothing else; an HTTP/2 preface without ALPN, "PRI * HTTP/2.0", is
// refused, so no :authority can arrive) whose Host, and the host of an
// absolute-form target, name name (sameAuthority). The credentials were
// chosen by the TLS server name: a request for another Host would carry
// them to whatever site a shared CDN or load balancer serves for that
// Host. A misdirected request gets a 421 naming both names, reaches no
// upstream, and closes the connection; it is the connection's outcome
// ("host-mismatch"). A request without Host (HTTP/1.0) goes to name.
func checkAuthority(name string, port uint16, next http.Handler, failed *outcome) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor != 1 {
			w.Header().Set("Connection", "close")
			http.Error(w, "spore egress proxy: HTTP/1.1 only on intercepted connections", http.StatusHTTPVersionNotSupported)
			return
		}
		for _, host := range []string{r.Host, r.URL.Host} {
			if host != "" && !sameAuthority(host, name, port) {
				failed.set("host-mismatch", true)
				w.Header().Set("Connection", "close")
				http.Error(w, fmt.Sprintf("spore egress proxy: misdirected request: Host %q is not %q, the TLS server name of this connection "+
					"(its credentials are sent to that name only); open a connection for %q", host, name, host), http.StatusMisdirectedRequest)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// sameAuthority says whether a request's host[:port] names the TLS
// server name name on a connection to port: the names equal without
// regard to ASCII case and one trailing dot each, and the port absent
// (or empty) or port.
func sameAuthority(host, name string, port uint16) bool {
	h, p, err := net.SplitHostPort(host)
	if err != nil { // no port
		h, p = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]"), ""
	}
	if p != "" {
		if n, err := strconv.ParseUint(p, 10, 16); err != nil || uint16(n) != port {
			return false
		}
	}
	return asciiEqualFold(strings.TrimSuffix(h, "."), strings.TrimSuffix(name, "."))
}

// asciiEqualFold is strings.EqualFold for ASCII only: the long s (U+017F)
// is not "s" in a host name, nor the Kelvin sign "k".
func asciiEqualFold(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		if lower(a[i]) != lower(b[i]) {
			return false
		}
	}
	return true
}

func lower(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

// authority is the Host of a request forwarded for name to port.
func authority(name string, port uint16) string {
	if port == 443 {
		return name
	}
	return net.JoinHostPort(name, strconv.Itoa(int(port)))
}

// isHTTPS reports whether a peeked connection to port looks like TLS (it
// is judged on its SNI).
func isHTTPS(port uint16, head []byte) bool {
	return port != 80 && len(head) > 0 && head[0] == 0x16 // a TLS handshake record
}

// Limits of a sandbox's injections.
const (
	MaxInjections        = 64 // domain patterns
	MaxInjectionHeaders  = 32 // headers per pattern
	MaxHeaderValueLength = 8192
)

// forbiddenHeaders are headers an injection may not set: they frame the
// request or the connection, which the proxy owns.
var forbiddenHeaders = map[string]bool{"Host": true, "Content-Length": true, "Transfer-Encoding": true, "Connection": true,
	"Upgrade": true, "Te": true, "Trailer": true, "Keep-Alive": true, "Proxy-Connection": true, "Proxy-Authorization": true,
	"Proxy-Authenticate": true}

// ValidateInjections checks injections: patterns in ParseDomain form, at
// most one per pattern, header names HTTP tokens that do not frame the
// request, values without CR, LF or NUL; within the limits.
func ValidateInjections(list []Injection) error {
	if len(list) > MaxInjections {
		return errdefs.Invalidf("network rules: %d domains, at most %d", len(list), MaxInjections)
	}
	seen := map[string]bool{}
	for _, in := range list {
		if got, err := ParseDomain(in.Pattern); err != nil || got != in.Pattern {
			return errdefs.Invalidf("network rules: %q is not a domain (an exact name or *.name)", in.Pattern)
		}
		if seen[in.Pattern] {
			return errdefs.Invalidf("network rules: %q given twice", in.Pattern)
		}
		seen[in.Pattern] = true
		if len(in.Headers) > MaxInjectionHeaders {
			return errdefs.Invalidf("network rules for %s: %d headers, at most %d", in.Pattern, len(in.Headers), MaxInjectionHeaders)
		}
		for _, h := range in.Headers {
			if !httpguts.ValidHeaderFieldName(h.Name) {
				return errdefs.Invalidf("network rules for %s: %q is not a header name", in.Pattern, h.Name)
			}
			if forbiddenHeaders[http.CanonicalHeaderKey(h.Name)] {
				return errdefs.Invalidf("network rules for %s: header %s cannot be set (the proxy owns it)", in.Pattern, h.Name)
			}
			if len(h.Value) > MaxHeaderValueLength || !httpguts.ValidHeaderFieldValue(h.Value) {
				return errdefs.Invalidf("network rules for %s: the value of %s is not a header value (up to %d bytes, no CR, LF or NUL)", in.Pattern, h.Name, MaxHeaderValueLength)
			}
		}
	}
	return nil
}
