package egress

import (
	"net/netip"
	"slices"
)

// Rules is what a sandbox's connections are judged by.
type Rules struct {
	Internet     bool           // allowed when nothing matches
	Allow, Deny  []netip.Prefix // CIDR entries
	AllowDomains []string       // parsed domain entries (ParseDomain)
	DenyDomains  []string
	Floor        []netip.Prefix // the operator floor: never reached
	// Inject are the headers set on HTTPS requests to matching names,
	// signed for with CA (both needed: without CA nothing is injected).
	Inject []Injection
	CA     *CA
}

// HasDomains says whether the rules need the proxy at all.
func (r Rules) HasDomains() bool { return len(r.AllowDomains)+len(r.DenyDomains) > 0 }

// Decision is a verdict on one connection.
type Decision struct {
	Allow bool
	// ByDomain: allowed by a domain entry, so the proxy connects to an
	// address it resolved for the name itself, not to whatever address
	// the sandbox chose (an SNI is the sandbox's word, not a fact).
	ByDomain bool
	Rule     string // the entry that decided ("" for the default)
	Reason   string // "allow", "deny", "default", "floor", "no-internet"
}

// Decide judges a connection to dst that asks for name ("" when the
// sandbox sent none) with E2B's precedence: an allow entry that matches
// (a domain on the name, a CIDR on the address) wins; else a deny entry
// that matches denies; else the default (Internet). The floor comes
// first. A connection without a name is judged on its address only, so
// a domain rule is no way around a CIDR deny.
func (r Rules) Decide(dst netip.Addr, name string) Decision {
	dst = dst.Unmap()
	if inAny(r.Floor, dst) {
		return Decision{Reason: "floor"}
	}
	if e, ok := matchAny(r.AllowDomains, name); ok {
		return Decision{Allow: true, ByDomain: true, Rule: e, Reason: "allow"}
	}
	if i := slices.IndexFunc(r.Allow, func(p netip.Prefix) bool { return p.Contains(dst) }); i >= 0 {
		return Decision{Allow: true, Rule: r.Allow[i].String(), Reason: "allow"}
	}
	if e, ok := matchAny(r.DenyDomains, name); ok {
		return Decision{Rule: e, Reason: "deny"}
	}
	if i := slices.IndexFunc(r.Deny, func(p netip.Prefix) bool { return p.Contains(dst) }); i >= 0 {
		return Decision{Rule: r.Deny[i].String(), Reason: "deny"}
	}
	if !r.Internet {
		return Decision{Reason: "no-internet"}
	}
	return Decision{Allow: true, Reason: "default"}
}

func inAny(list []netip.Prefix, a netip.Addr) bool {
	return slices.ContainsFunc(list, func(p netip.Prefix) bool { return p.Contains(a) })
}
