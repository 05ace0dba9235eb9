// Package egress enforces a sandbox's domain rules: its gateway redirects
// the sandbox's new TCP connections to ports 80 and 443 to a listener of
// this package (in the gateway's namespace), which reads the name the
// sandbox asks for (the TLS ClientHello's SNI, the HTTP Host header)
// without consuming it, decides with E2B's precedence and, when allowed,
// replays the bytes upstream and relays both ways.
package egress

import (
	"net/netip"
	"strings"

	"github.com/spore-run/spore/internal/errdefs"
)

// MaxDomainLen is the longest name an entry may hold (a DNS name's
// limit; "*." is counted too).
const MaxDomainLen = 253

// ParseDomain normalizes and checks a domain entry: a DNS name of two
// labels or more ("api.example.com") or "*." and one ("*.example.com": any deeper name,
// not the apex, as E2B documents). Upper case is folded, one trailing dot
// dropped. Anything else (an address, a bare "*", "a.*.b", empty labels)
// is refused with errdefs.ErrInvalidArgument.
func ParseDomain(s string) (string, error) {
	d := strings.TrimSuffix(strings.ToLower(strings.TrimSpace(s)), ".")
	if len(d) == 0 || len(d) > MaxDomainLen {
		return "", errdefs.Invalidf("%q is not a domain (1-%d characters)", s, MaxDomainLen)
	}
	name := strings.TrimPrefix(d, "*.")
	if _, err := netip.ParseAddr(name); err == nil {
		return "", errdefs.Invalidf("%q is not a domain", s)
	}
	labels := strings.Split(name, ".")
	if len(labels) < 2 && name == d {
		// "localhost", "not-a-cidr": no public name is one label, and
		// such an entry is likelier a mistyped address than a rule.
		return "", errdefs.Invalidf("%q is not a domain (one label; names like \"example.com\")", s)
	}
	for _, l := range labels {
		if !validLabel(l) {
			return "", errdefs.Invalidf("%q is not a domain (label %q)", s, l)
		}
	}
	if allDigits(labels[len(labels)-1]) {
		// "1.2.3" or "10": no top-level domain is numeric; an address
		// typo is not silently a name.
		return "", errdefs.Invalidf("%q is not a domain (numeric top-level label)", s)
	}
	return d, nil
}

func validLabel(l string) bool {
	if len(l) == 0 || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
		return false
	}
	for i := 0; i < len(l); i++ {
		c := l[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

func allDigits(l string) bool {
	for i := 0; i < len(l); i++ {
		if l[i] < '0' || l[i] > '9' {
			return false
		}
	}
	return true
}

// IsDomain says whether an entry is meant as a domain rather than an
// address or CIDR: it has a letter or a '*' (addresses and CIDRs have
// neither, IPv6 hex digits aside, which have a ':').
func IsDomain(s string) bool {
	if strings.ContainsAny(s, ":/") {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i] | 0x20
		if c >= 'a' && c <= 'z' || s[i] == '*' || s[i] == '_' {
			return true
		}
	}
	return false
}

// NormalizeHost lower-cases a name a client sent (SNI or Host) and drops a
// trailing dot and, for a Host header, the port.
func NormalizeHost(h string) string {
	h = strings.ToLower(strings.TrimSpace(h))
	if strings.HasPrefix(h, "[") { // an IPv6 literal: "[::1]:80"
		if i := strings.IndexByte(h, ']'); i > 0 {
			return h[1:i]
		}
		return h
	}
	if i := strings.LastIndexByte(h, ':'); i >= 0 && strings.Count(h, ":") == 1 {
		h = h[:i]
	}
	return strings.TrimSuffix(h, ".")
}

// Match says whether a parsed entry matches a normalized name: an exact
// name itself only, "*.x" any name ending in ".x" (not x itself).
func Match(entry, name string) bool {
	if name == "" {
		return false
	}
	if suffix, ok := strings.CutPrefix(entry, "*"); ok {
		return len(name) > len(suffix) && strings.HasSuffix(name, suffix)
	}
	return entry == name
}

func matchAny(entries []string, name string) (string, bool) {
	for _, e := range entries {
		if Match(e, name) {
			return e, true
		}
	}
	return "", false
}
