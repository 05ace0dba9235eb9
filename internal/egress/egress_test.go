package egress

import (
	"bytes"
	"crypto/tls"
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
)

func TestParseDomain(t *testing.T) {
	for in, want := range map[string]string{
		"api.example.com": "api.example.com", "API.Example.COM.": "api.example.com", "*.github.com": "*.github.com",
		"*.com": "*.com", "*.COM.": "*.com", "x_y.test": "x_y.test", " a-b.test ": "a-b.test",
	} {
		if got, err := ParseDomain(in); err != nil || got != want {
			t.Errorf("ParseDomain(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	long := strings.Repeat("a", 63) + "." + strings.Repeat("b", 63) + "." + strings.Repeat("c", 63) + "." + strings.Repeat("d", 61)
	for _, in := range []string{"", "*", "*.", "localhost", "not-a-cidr", "a..b", ".a", "a.*.b", "**.a", "*a.b", "-a.b", "a-.b", "a b.c", "1.2.3", "10", "1.2.3.4",
		"a/b", "ä.test", strings.Repeat("a", 64) + ".test", long + ".e", "a.b:443", "*.*.a"} {
		if got, err := ParseDomain(in); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("ParseDomain(%q) = %q, %v; want ErrInvalidArgument", in, got, err)
		}
	}
	if _, err := ParseDomain(long); err != nil {
		t.Errorf("a 253-character name refused: %v", err)
	}
}

func TestIsDomain(t *testing.T) {
	for s, want := range map[string]bool{"a.test": true, "*.x": true, "1.2.3.4": false, "10.0.0.0/8": false, "::1": false,
		"2001:db8::/32": false, "1.2.3": false, "*": true, "x": true} {
		if IsDomain(s) != want {
			t.Errorf("IsDomain(%q) = %v", s, !want)
		}
	}
}

func TestMatch(t *testing.T) {
	cases := []struct {
		entry, name string
		want        bool
	}{
		{"allowed.test", "allowed.test", true},
		{"allowed.test", "a.allowed.test", false},
		{"allowed.test", "xallowed.test", false},
		{"*.wild.test", "a.wild.test", true},
		{"*.wild.test", "b.a.wild.test", true},
		{"*.wild.test", "wild.test", false},
		{"*.wild.test", "notwild.test", false},
		{"*.wild.test", "", false},
		{"allowed.test", "", false},
	}
	for _, c := range cases {
		if got := Match(c.entry, c.name); got != c.want {
			t.Errorf("Match(%q, %q) = %v", c.entry, c.name, got)
		}
	}
}

func TestNormalizeHost(t *testing.T) {
	for in, want := range map[string]string{"Example.COM:8080": "example.com", "a.test.": "a.test", "[::1]:80": "::1", "::1": "::1", " x ": "x"} {
		if got := NormalizeHost(in); got != want {
			t.Errorf("NormalizeHost(%q) = %q, want %q", in, got, want)
		}
	}
}

// clientHello returns the first bytes a Go TLS client sends for name.
func clientHello(t testing.TB, name string, cfg *tls.Config) []byte {
	t.Helper()
	a, b := net.Pipe()
	if cfg == nil {
		cfg = &tls.Config{}
	}
	cfg = cfg.Clone()
	cfg.ServerName, cfg.InsecureSkipVerify = name, true
	go func() {
		tls.Client(a, cfg).Handshake()
		a.Close()
	}()
	var buf bytes.Buffer
	b.SetReadDeadline(time.Now().Add(5 * time.Second))
	chunk := make([]byte, 64<<10)
	for {
		n, err := b.Read(chunk)
		buf.Write(chunk[:n])
		if _, perr := ServerName(buf.Bytes()); !errors.Is(perr, ErrNeedMore) || err != nil {
			break
		}
	}
	b.Close()
	return buf.Bytes()
}

func TestServerName(t *testing.T) {
	for _, name := range []string{"allowed.test", "a.wild.test", ""} {
		h := clientHello(t, name, nil)
		got, err := ServerName(h)
		if err != nil || got != name {
			t.Fatalf("ServerName(hello for %q) = %q, %v", name, got, err)
		}
		// Every strict prefix asks for more.
		for i := 0; i < len(h); i += 7 {
			if _, err := ServerName(h[:i]); !errors.Is(err, ErrNeedMore) {
				t.Fatalf("prefix %d of %d: %v, want ErrNeedMore", i, len(h), err)
			}
		}
	}
	// TLS 1.2 only hello, upper case name.
	if got, _ := ServerName(clientHello(t, "UPPER.Test", &tls.Config{MaxVersion: tls.VersionTLS12})); got != "upper.test" {
		t.Fatalf("upper-case SNI: %q", got)
	}
	// The hello split over several records (allowed by TLS, used by
	// some clients to dodge naive SNI filters).
	h := clientHello(t, "split.test", nil)
	body := h[5:]
	var frag []byte
	for i := 0; i < len(body); i += 50 {
		part := body[i:min(i+50, len(body))]
		frag = append(frag, 22, 3, 1, byte(len(part)>>8), byte(len(part)))
		frag = append(frag, part...)
	}
	if got, err := ServerName(frag); err != nil || got != "split.test" {
		t.Fatalf("fragmented hello: %q %v", got, err)
	}
	for _, junk := range [][]byte{[]byte("GET / HTTP/1.1\r\n"), {22, 3, 1, 0, 0}, {23, 3, 3, 0, 5, 1, 2, 3, 4, 5}, {22, 3, 1, 0, 4, 2, 0, 0, 0}} {
		if _, err := ServerName(junk); !errors.Is(err, ErrNotTLS) {
			t.Errorf("ServerName(%q) = %v, want ErrNotTLS", junk, err)
		}
	}
}

func FuzzServerName(f *testing.F) {
	f.Add(clientHello(f, "allowed.test", nil))
	f.Add(clientHello(f, "", nil))
	f.Add(clientHello(f, "x.test", &tls.Config{MaxVersion: tls.VersionTLS12}))
	f.Add([]byte{22, 3, 1, 0, 4, 1, 0, 0, 0})
	f.Add([]byte("GET / HTTP/1.1\r\nHost: a\r\n\r\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		name, err := ServerName(b)
		if err != nil && name != "" {
			t.Fatalf("a name with an error: %q %v", name, err)
		}
		if err == nil && name != NormalizeHost(name) {
			t.Fatalf("name not normalized: %q", name)
		}
	})
}

func TestHTTPHost(t *testing.T) {
	ok := map[string]string{
		"GET / HTTP/1.1\r\nHost: Allowed.Test\r\nAccept: */*\r\n\r\n":   "allowed.test",
		"GET / HTTP/1.1\r\nhost: a.test:8080\r\n\r\nbody":               "a.test",
		"GET http://abs.test/x HTTP/1.1\r\nUser-Agent: x\r\n\r\n":       "abs.test",
		"GET / HTTP/1.0\r\n\r\n":                                        "",
		"POST /p HTTP/1.1\r\nContent-Length: 0\r\nHOST: x.test\r\n\r\n": "x.test",
	}
	for in, want := range ok {
		if got, err := HTTPHost([]byte(in)); err != nil || got != want {
			t.Errorf("HTTPHost(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"GET / HTTP/1.1\r\nHost: a", "GE", "GET / HTTP/1.1\r\n"} {
		if _, err := HTTPHost([]byte(in)); !errors.Is(err, ErrNeedMore) {
			t.Errorf("HTTPHost(%q) = %v, want ErrNeedMore", in, err)
		}
	}
	for _, in := range []string{"GET / HTTP/1.1\r\nHost: a.test\r\nHost: b.test\r\n\r\n", "\x16\x03\x01\x02\x00\x01" + strings.Repeat("x", 40),
		"GET / SPDY/3\r\n\r\n", "GET / HTTP/1.1\r\nbroken header\r\n\r\n", "GET /" + strings.Repeat("a", maxHead)} {
		if _, err := HTTPHost([]byte(in)); !errors.Is(err, ErrNotHTTP) {
			t.Errorf("HTTPHost(%.40q) = %v, want ErrNotHTTP", in, err)
		}
	}
}

func TestDecidePrecedence(t *testing.T) {
	pfx := netip.MustParsePrefix
	allowedIP, deniedIP, other := netip.MustParseAddr("198.18.1.2"), netip.MustParseAddr("198.18.2.2"), netip.MustParseAddr("198.18.3.2")
	floor := []netip.Prefix{pfx("10.0.0.0/8")}
	only := Rules{Internet: true, Deny: []netip.Prefix{pfx("0.0.0.0/0")}, AllowDomains: []string{"allowed.test", "*.wild.test"}, Floor: floor}
	cases := []struct {
		name  string
		r     Rules
		dst   netip.Addr
		host  string
		allow bool
		by    bool
	}{
		{"allowed name", only, allowedIP, "allowed.test", true, true},
		{"allowed name at any address (the proxy resolves it)", only, deniedIP, "allowed.test", true, true},
		{"other name", only, allowedIP, "denied.test", false, false},
		{"no name: the address decides", only, allowedIP, "", false, false},
		{"wildcard", only, other, "a.wild.test", true, true},
		{"wildcard not the apex", only, other, "wild.test", false, false},
		{"floor beats an allowed name", only, netip.MustParseAddr("10.1.2.3"), "allowed.test", false, false},
		{"deny a name, rest open", Rules{Internet: true, DenyDomains: []string{"denied.test"}}, deniedIP, "denied.test", false, false},
		{"deny a name, others pass", Rules{Internet: true, DenyDomains: []string{"denied.test"}}, deniedIP, "other.test", true, false},
		{"deny a name, no name passes (address not denied)", Rules{Internet: true, DenyDomains: []string{"denied.test"}}, deniedIP, "", true, false},
		{"allow CIDR beats deny name", Rules{Internet: true, Allow: []netip.Prefix{pfx("198.18.2.0/24")}, DenyDomains: []string{"denied.test"}}, deniedIP, "denied.test", true, false},
		{"allow name beats deny CIDR", Rules{Internet: true, Deny: []netip.Prefix{pfx("198.18.1.2/32")}, AllowDomains: []string{"allowed.test"}}, allowedIP, "allowed.test", true, true},
		{"allow name beats deny name", Rules{AllowDomains: []string{"a.wild.test"}, DenyDomains: []string{"*.wild.test"}}, other, "a.wild.test", true, true},
		{"deny wildcard", Rules{Internet: true, AllowDomains: []string{"a.wild.test"}, DenyDomains: []string{"*.wild.test"}}, other, "b.wild.test", false, false},
		{"internet off, nothing matches", Rules{AllowDomains: []string{"allowed.test"}}, other, "x.test", false, false},
	}
	for _, c := range cases {
		d := c.r.Decide(c.dst, c.host)
		if d.Allow != c.allow || d.ByDomain != c.by {
			t.Errorf("%s: %+v, want allow=%v byDomain=%v", c.name, d, c.allow, c.by)
		}
	}
}

func TestRing(t *testing.T) {
	var g ring
	first := g.add(Record{Domain: "first"})
	for i := 1; i < RingSize+10; i++ {
		g.add(Record{BytesIn: int64(i)})
	}
	g.update(first, func(r *Record) { r.Domain = "overwritten?" })
	l := g.list()
	if len(l) != RingSize || l[0].BytesIn != 10 || l[len(l)-1].BytesIn != RingSize+9 {
		t.Fatalf("ring: %d records, first %d, last %d", len(l), l[0].BytesIn, l[len(l)-1].BytesIn)
	}
	for _, r := range l {
		if r.Domain != "" {
			t.Fatal("an update reached a record's overwritten slot")
		}
	}
}
